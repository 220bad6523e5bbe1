// The fused linear losses with 16-bit chunk logits on CUDA (FusedLinearOptions::logits_dtype = BF16 / F16 on
// inputs of that dtype): the logits GEMM writes 16-bit logits, the row loss reads them in f32 math and writes
// the 16-bit gradient over them, in place.
//
// How the cases are checked (cuda_loss_check.h), and why these tolerances:
//   - Inputs lie on the grid k/64 (exact in bf16 and f16), so every product h·w is a multiple of 2^-12 and
//     every partial sum of the GEMM is exact in f32, in any order: the device's f32 logits are exactly the
//     float64 ones, their 16-bit rounding (round to nearest even, like dtype.h) is the same on both sides,
//     and so is the bias added to it (exact in f32) and rounded again. The forward is therefore checked
//     against the float64 loss of those rounded logits at the usual 1e-10: only the f32 row-kernel math
//     differs. That reference is piecewise constant in the inputs, so there are no central differences here.
//   - Against the CPU's f32 result (the CPU keeps f32 logits): each logit moves by δ ≤ 2·2^-9·max|z| (two
//     roundings), and the logits gradient by at most 2δ relative (softmax: δp_j ≤ 2δ·p_j) plus its own 2^-9
//     rounding. The ranges below keep max|z| ≤ 2, so δ ≤ 2^-7 and the relative change of the gradients is
//     ≤ 2·2^-7 + 2^-9 ≈ 0.018: nmse ≤ 3.1e-4; the losses move by ≤ 2δ per row (LSE and z_y each by ≤ δ; the
//     divergences likewise, scaled by T). kLowLogitsTol = 1e-3 holds those with a margin of ~3 (typical
//     values are ~1e-5, the roundings being independent); a wrong loss or gradient is ≥ 1e-1.
// Also: peak device memory within the budget with 16-bit logits (no 16-bit gradient shadow beside them).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <utility>

#include "cuda_loss_check.h"

namespace retort::test {
namespace {

class CudaFusedLowLogits : public CudaTest {};

constexpr double kLowLogitsTol = 1e-3;

// n values k/64, |k/64| <= range (range a multiple of 1/64), drawn from a generator keyed by `key`.
Vec grid_values(const std::string& key, int64_t n, double range) {
  std::mt19937_64 g(std::hash<std::string>{}(key));
  const int64_t m = int64_t(range * 64);
  std::uniform_int_distribution<int64_t> d(-m, m);
  Vec v(static_cast<size_t>(n));
  for (double& x : v) x = double(d(g)) / 64.0;
  return v;
}

// A float input on the grid (values fixed, so the same on both backends).
LossInput grid_in(const std::string& key, Shape shape, DType dt, bool param, double range) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return LossInput(std::move(shape), dt, param, -range, range, grid_values(key, n, range));
}

double round_to(double x, DType dt) {
  const float f = float(x);  // exact: x is a multiple of 2^-12 well inside f32's range
  return dt == DType::BF16 ? double(bf16_to_f32(f32_to_bf16(f))) : double(f16_to_f32(f32_to_f16(f)));
}

// The logits as the device keeps them: round(hidden · Wᵀ), then round(that + bias) when there is a bias.
Mat head16(const Ref& hidden, const Ref& w, const Ref* bias, DType dt) {
  Mat z = head_ref(hidden, w, nullptr);
  for (int64_t r = 0; r < z.rows; ++r)
    for (int64_t j = 0; j < z.cols; ++j) {
      double& s = z.v[size_t(r * z.cols + j)];
      s = round_to(s, dt);
      if (bias) s = round_to(s + bias->at(j), dt);
    }
  return z;
}

FusedLinearOptions low(int64_t chunk, DType dt) {
  FusedLinearOptions f;
  f.chunk_rows = chunk;
  f.logits_dtype = dt;
  return f;
}

bool check_low(LossCase c) {
  c.fwd_tol = 1e-10;
  CudaTol tol;
  tol.cpu = kLowLogitsTol;
  tol.cpu_grad = kLowLogitsTol;
  tol.finite_differences = false;
  return check_cuda(c, tol);
}

// ---- cross-entropy ------------------------------------------------------------------------------------

struct CeCfg {
  CeRef r;
  int64_t n = 7, h = 5, v = 11, chunk = 3;
  DType dt = DType::BF16;
  bool bias = true;
  bool default_options = false;  // logits_dtype left unset: 16-bit inputs must give 16-bit logits by default
};

// |z| <= h·range² + 0.25 <= 2 for the sizes used (h = 5: range 0.5; h = 16: range 0.328125).
LossCase ce_case(const std::string& name, CeCfg cfg) {
  cfg.r.ignore = -1;
  const double range = cfg.h <= 5 ? 0.5 : 0.328125;
  LossCase c;
  c.name = name;
  c.inputs = {grid_in(name + "h", {cfg.n, cfg.h}, cfg.dt, true, range),
              grid_in(name + "w", {cfg.v, cfg.h}, cfg.dt, true, range),
              grid_in(name + "b", {cfg.v}, cfg.dt, cfg.bias, 0.25),
              LossInput(Shape{cfg.n}, DType::I32, false, -1, double(cfg.v))};
  c.build = [cfg](Context& ctx, const std::vector<Tensor*>& in) {
    CrossEntropyOptions o;
    o.ignore_index = cfg.r.ignore;
    o.label_smoothing = float(cfg.r.eps);
    o.reduction = cfg.r.red;
    FusedLinearOptions f = low(cfg.chunk, cfg.dt);
    if (cfg.default_options) f.logits_dtype.reset();
    return fused_linear_cross_entropy(ctx, in[0], in[1], cfg.bias ? in[2] : nullptr, in[3], o, f).loss;
  };
  c.reference = [cfg](const std::vector<Ref>& in) {
    return ce_ref(head16(in[0], in[1], cfg.bias ? &in[2] : nullptr, cfg.dt), ints(in[3]), cfg.r);
  };
  return c;
}

TEST_F(CudaFusedLowLogits, CrossEntropy) {
  for (DType dt : {DType::BF16, DType::F16})
    for (Reduction red : {Reduction::Mean, Reduction::None})
      for (int64_t chunk : {int64_t(1), int64_t(3), int64_t(7)})
        for (bool bias : {true, false}) {
          CeCfg cfg;
          cfg.dt = dt;
          cfg.r.red = red;
          cfg.r.eps = 0.1;
          cfg.chunk = chunk;
          cfg.bias = bias;
          EXPECT_TRUE(check_low(ce_case(std::string("cfll_ce_") + dtype_name(dt) + red_name(red) +
                                            std::to_string(chunk) + (bias ? "b" : ""),
                                        cfg)));
        }
}

// The default options pick the inputs' 16-bit dtype for the logits: the result is the 16-bit reference's
// (f32 logits would miss it by ~1e-3).
TEST_F(CudaFusedLowLogits, DefaultOptionsKeepTheInputsDtype) {
  for (DType dt : {DType::BF16, DType::F16}) {
    CeCfg cfg;
    cfg.dt = dt;
    cfg.default_options = true;
    EXPECT_TRUE(check_low(ce_case(std::string("cfll_default_") + dtype_name(dt), cfg)));
  }
}

TEST_F(CudaFusedLowLogits, CrossEntropyGpt2Vocabulary) {
  // V = 50,257: padded rows (the pad columns of the 16-bit block are the GEMM's zeros), 8-wide row kernels
  // with a scalar tail, 3 chunks, the last short.
  CeCfg cfg;
  cfg.n = 37;
  cfg.h = 16;
  cfg.v = 50257;
  cfg.chunk = 16;
  EXPECT_TRUE(check_low(ce_case("cfll_ce_gpt2", cfg)));
  // Many rows in one chunk, per-row losses: the gradient overwrites each row in place while (on Hopper) the
  // row's cluster CTAs run; the loss must use z at the label read before any of those stores.
  CeCfg many;
  many.n = 512;
  many.h = 16;
  many.v = 50257;
  many.chunk = 512;
  many.r.red = Reduction::None;
  EXPECT_TRUE(check_low(ce_case("cfll_ce_gpt2_rows", many)));
}

// ---- top-K distillation over the full vocabulary, with a hard loss --------------------------------------

LossCase topk_case(const std::string& name, double beta, double t = 2.0, bool normalize = false) {
  const int64_t n = 7, h = 5, v = 11, k = 4;
  TopKRef r;
  r.ignore = -1;
  r.beta = beta;
  r.t = t;
  r.normalize = normalize;
  r.w_hard = 0.5;
  LossCase c;
  c.name = name;
  c.inputs = {grid_in(name + "h", {n, h}, DType::BF16, true, 0.5),
              grid_in(name + "w", {v, h}, DType::BF16, true, 0.5),
              grid_in(name + "b", {v}, DType::BF16, true, 0.25),
              LossInput({n, k}, DType::I32, false, 0, double(v)),
              LossInput({n, k}, DType::F32, false, -4, -0.1),
              LossInput({n, k}, DType::I32, false, 0, 4),
              LossInput({n}, DType::I32, false, -1, double(v))};
  c.build = [r](Context& ctx, const std::vector<Tensor*>& in) {
    TopKDistillOptions o;
    o.beta = float(r.beta);
    o.temperature = float(r.t);
    o.w_hard = float(r.w_hard);
    o.normalize_topk = r.normalize;
    o.ignore_index = r.ignore;
    return fused_linear_topk_kd(ctx, in[0], in[1], in[2], in[3], in[4], in[5], in[6], o, low(3, DType::BF16))
        .loss;
  };
  c.reference = [r](const std::vector<Ref>& in) {
    return topk_ref(head16(in[0], in[1], &in[2], DType::BF16), ints(in[3]), mat(in[4]), in[5].v, ints(in[6]),
                    r);
  };
  return c;
}

TEST_F(CudaFusedLowLogits, TopKDenseWithHardLoss) {
  for (double beta : {0.0, 0.5}) EXPECT_TRUE(check_low(topk_case("cfll_topk" + std::to_string(beta), beta)));
  // T = 1: as cross-entropy rows (beta = 0, or normalize_topk), 16-bit gradient fixed up at the slot columns.
  EXPECT_TRUE(check_low(topk_case("cfll_topk_ce_fkl", 0.0, 1.0)));
  EXPECT_TRUE(check_low(topk_case("cfll_topk_ce_norm", 0.5, 1.0, true)));
}

// ---- online distillation: student and teacher logits both 16-bit ---------------------------------------

LossCase distill_case(const std::string& name, double beta, Reduction red, int64_t chunk, int64_t n = 7,
                      int64_t v = 11, double t = 2.0) {
  const int64_t h = 4, ht = 6;
  DistillRef r;
  r.ignore = -1;
  r.beta = beta;
  r.t = t;
  r.w_hard = 0.25;
  r.red = red;
  LossCase c;
  c.name = name;
  // |z| <= 4·0.25 + 0.25 (student), 6·0.25 + 0.25 (teacher, ranges 0.5).
  c.inputs = {grid_in(name + "h", {n, h}, DType::BF16, true, 0.5),
              grid_in(name + "w", {v, h}, DType::BF16, true, 0.5),
              grid_in(name + "b", {v}, DType::BF16, true, 0.25),
              grid_in(name + "th", {n, ht}, DType::BF16, false, 0.5),
              grid_in(name + "tw", {v, ht}, DType::BF16, false, 0.5),
              grid_in(name + "tb", {v}, DType::BF16, false, 0.25),
              LossInput({n}, DType::I32, false, -1, double(v))};
  c.build = [r, chunk](Context& ctx, const std::vector<Tensor*>& in) {
    DistillOptions o;
    o.beta = float(r.beta);
    o.temperature = float(r.t);
    o.w_hard = float(r.w_hard);
    o.ignore_index = r.ignore;
    o.reduction = r.red;
    return fused_linear_distill(ctx, in[0], in[1], in[2], in[3], in[4], in[5], in[6], o,
                                low(chunk, DType::BF16))
        .loss;
  };
  c.reference = [r](const std::vector<Ref>& in) {
    return distill_ref(head16(in[0], in[1], &in[2], DType::BF16), head16(in[3], in[4], &in[5], DType::BF16),
                       ints(in[6]), r);
  };
  return c;
}

TEST_F(CudaFusedLowLogits, OnlineTeacherDistill) {
  for (double beta : {0.0, 0.5})
    for (Reduction red : {Reduction::Mean, Reduction::None})
      for (int64_t chunk : {int64_t(1), int64_t(3), int64_t(7)})
        EXPECT_TRUE(check_low(distill_case(
            "cfll_dist" + std::to_string(beta) + red_name(red) + std::to_string(chunk), beta, red, chunk)));
}

// Rows of whole 16-byte vectors take the Hopper cluster kernel with a 16-bit gradient written over the
// logits: JSD at T = 1 then keeps q (as f16) and t in the row's shared-memory slots between its passes, at
// T = 2 (with the hard loss) t only; reverse KL keeps neither. One CTA per row at V = 8,192, three at 60,000.
TEST_F(CudaFusedLowLogits, OnlineTeacherDistillClusterRows) {
  for (auto [beta, t] : {std::pair{0.5, 1.0}, {0.5, 2.0}, {1.0, 1.0}})
    for (auto [n, v] : {std::pair{int64_t(24), int64_t(8192)}, {int64_t(6), int64_t(60000)}})
      for (int64_t chunk : {int64_t(0), int64_t(5)})
        EXPECT_TRUE(check_low(distill_case("cfll_cdist" + std::to_string(beta) + "_" + std::to_string(t) +
                                               "_" + std::to_string(v) + "_" + std::to_string(chunk),
                                           beta, Reduction::Mean, chunk, n, v, t)));
}

// ---- entropy ------------------------------------------------------------------------------------------

TEST_F(CudaFusedLowLogits, Entropy) {
  for (Reduction red : {Reduction::Mean, Reduction::None}) {
    const std::string name = std::string("cfll_ent_") + red_name(red);
    LossCase c;
    c.name = name;
    c.inputs = {grid_in(name + "h", {7, 5}, DType::BF16, true, 0.5),
                grid_in(name + "w", {11, 5}, DType::BF16, true, 0.5),
                grid_in(name + "b", {11}, DType::BF16, true, 0.25)};
    c.build = [red](Context& ctx, const std::vector<Tensor*>& in) {
      return fused_linear_entropy(ctx, in[0], in[1], in[2], 1.5f, red, low(3, DType::BF16));
    };
    c.reference = [red](const std::vector<Ref>& in) {
      return entropy_ref(head16(in[0], in[1], &in[2], DType::BF16), 1.5, red);
    };
    EXPECT_TRUE(check_low(c));
  }
}

// Backends that pick other GEMM algorithms sum in another f32 order: their gradients differ by nmse ~1e-14.
constexpr double kGemmGradTol = 1e-10;

// CudaOptions::gemm_tune: each GEMM shape runs the fastest of cuBLASLt's candidates, timed on its first
// call into the real output. On grid inputs the logits are exact whatever the algorithm, so the losses are
// bitwise those of cuBLASLt's first choice and the gradients differ only in f32 summation order; the timing
// runs must leave nothing behind (the GEMM they precede overwrites C). A backend without it times nothing.
TEST_F(CudaFusedLowLogits, GemmAutotuneAgreesWithFirstChoice) {
  CudaOptions first;
  first.gemm_tune = GemmTune::Off;
  CudaOptions tuned;
  tuned.gemm_tune = GemmTune::All;
  auto a = make_cuda_backend(0, first);
  auto b = make_cuda_backend(0, tuned);
  for (int64_t chunk : {int64_t(0), int64_t(700)}) {  // dW over one chunk, and accumulated over three
    CeCfg cfg;
    cfg.n = 1536;
    cfg.h = 64;
    cfg.v = 50257;
    cfg.chunk = chunk;
    cfg.r.eps = 0.1;
    EXPECT_TRUE(check_cuda_same(ce_case("cfll_tune_ce" + std::to_string(chunk), cfg), *a, *b, kGemmGradTol));
  }
  EXPECT_TRUE(check_cuda_same(distill_case("cfll_tune_dist", 0.5, Reduction::Mean, 500, 1280, 8192), *a, *b,
                              kGemmGradTol));
  EXPECT_EQ(cuda_tuned_gemms(*a), 0u);
  EXPECT_GT(cuda_tuned_gemms(*b), 0u);
}

// CudaOptions::gemm_cache: a backend that times its GEMMs records the picks; a backend made later with the
// same file takes every one of them without timing and agrees with the first (the same algorithms). A file
// recorded under another signature (another GPU or cuBLASLt) holds nothing for this one and is replaced; a
// malformed one is an error naming it.
TEST_F(CudaFusedLowLogits, GemmCacheKeepsPicksAcrossBackends) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("retort_gemm_cache_" + std::to_string(::getpid()) + ".txt"))
          .string();
  std::filesystem::remove(path);
  CudaOptions off;
  off.gemm_tune = GemmTune::Off;
  CudaOptions cached;
  cached.gemm_tune = GemmTune::All;
  cached.gemm_cache = path;
  CeCfg cfg;
  cfg.n = 1536;
  cfg.h = 64;
  cfg.v = 50257;
  cfg.chunk = 700;  // dW accumulated over three chunks: beta 0 and beta 1 picks
  cfg.r.eps = 0.1;
  const LossCase c = ce_case("cfll_cache_ce", cfg);
  auto ref = make_cuda_backend(0, off);
  auto a = make_cuda_backend(0, cached);
  EXPECT_TRUE(check_cuda_same(c, *ref, *a, kGemmGradTol));
  const size_t timed = cuda_tuned_gemms(*a);
  ASSERT_GT(timed, 0u);
  EXPECT_EQ(cuda_cached_gemms(*a), 0u);
  ASSERT_TRUE(std::filesystem::exists(path));
  auto b = make_cuda_backend(0, cached);
  EXPECT_TRUE(check_cuda_same(c, *a, *b, kGemmGradTol));
  EXPECT_EQ(cuda_cached_gemms(*b), timed);
  EXPECT_EQ(cuda_tuned_gemms(*b), timed);
  // The same entries under another signature: timed afresh, and the file rewritten under this one.
  std::string text;
  {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }
  const size_t l2 = text.find('\n') + 1, l3 = text.find('\n', l2) + 1;
  ASSERT_EQ(text.compare(l2, 10, "signature "), 0) << text;
  {
    std::ofstream out(path, std::ios::trunc);
    out << text.substr(0, l2) << "signature another GPU\n" << text.substr(l3);
  }
  auto d = make_cuda_backend(0, cached);
  EXPECT_TRUE(check_cuda_same(c, *a, *d, kGemmGradTol));
  EXPECT_EQ(cuda_cached_gemms(*d), 0u);
  EXPECT_EQ(cuda_tuned_gemms(*d), timed);
  auto e = make_cuda_backend(0, cached);
  EXPECT_TRUE(check_cuda_same(c, *a, *e, kGemmGradTol));
  EXPECT_EQ(cuda_cached_gemms(*e), timed);
  // A malformed file: an error naming it, at the first GEMM that would be timed.
  {
    std::ofstream out(path, std::ios::trunc);
    out << "retort tune cache 1\nsignature x\n1 2 three : 4\n";
  }
  auto f = make_cuda_backend(0, cached);
  try {
    check_cuda_same(c, *a, *f, kGemmGradTol);
    ADD_FAILURE() << "a malformed GEMM cache was accepted";
  } catch (const Error& err) {
    const std::string msg = err.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find("line 3"), std::string::npos) << msg;
  }
  std::filesystem::remove(path);
}

// ---- memory -------------------------------------------------------------------------------------------

TEST_F(CudaFusedLowLogits, PeakMemoryWithinBudget) {
  // bf16 inputs, bf16 logits: a 32 MiB budget gives 333-row chunks of 2-byte logits and no 16-bit gradient
  // shadow beside them. What the forward + backward allocates beyond the graph's own buffers must be the
  // budget plus per-row vectors, O(N·H) and the allocator's 2 MiB rounding, as with f32 logits.
  const int64_t n = 2048, h = 256, v = 50257;
  const size_t budget = size_t(32) << 20;
  const size_t extra = fused_ce_peak_extra(DType::BF16, DType::BF16, budget, n, h, v, "cfll_peak");
  const size_t bound = budget + size_t(4 * n * h) * sizeof(float) + (size_t(8) << 20);
  EXPECT_LE(extra, bound) << "peak extra " << extra << " bytes, budget " << budget;
}

}  // namespace
}  // namespace retort::test
