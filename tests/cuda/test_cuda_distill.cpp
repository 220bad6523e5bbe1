// The distillation losses on CUDA: topk_kd, topk_kl_gathered and distill, forward and gradient, against the
// CPU backend and the float64 references (cuda_loss_check.h; tolerances: kCpuTol = 1e-9 against the CPU for
// every dtype, forward 1e-10 and central differences 1e-8 against float64, looser only where stated beside a
// case). Without a usable device every test skips with the reason.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <limits>
#include <utility>

#include "cuda/loss/distill_rows.h"  // kMaxTopKSlots (a host-only header)
#include "cuda_loss_check.h"

namespace retort::test {
namespace {

class CudaDistill : public CudaTest {};

constexpr double kInf = std::numeric_limits<double>::infinity();

// ---- topk_kd ------------------------------------------------------------------------------------------

struct TopKCfg {
  TopKRef r;
  bool labels = true;
  bool mask = true;
  int64_t n = 5, v = 9, k = 4;
  DType dt = DType::F32, lp_dt = DType::F32, id_dt = DType::I32, mask_dt = DType::I32;
  double lo = -3, hi = 3;
  Out what = Out::Loss;
  bool transposed = false;  // logits read through a transposed view
};

// Inputs: logits [n, v], ids [n, k] in [0, v) (repeats happen), logprobs [n, k] in [-4, -0.1), mask [n, k]
// in {0, 1}, labels [n] in [-1, v) with ignore_index -1. Optional inputs left out are passed as null.
LossCase topk_case(const std::string& name, TopKCfg cfg) {
  cfg.r.ignore = -1;
  LossCase c;
  c.name = name;
  const Shape xs = cfg.transposed ? Shape{cfg.v, cfg.n} : Shape{cfg.n, cfg.v};
  c.inputs = {LossInput(xs, cfg.dt, true, cfg.lo, cfg.hi),
              LossInput({cfg.n, cfg.k}, cfg.id_dt, false, 0, double(cfg.v)),
              LossInput({cfg.n, cfg.k}, cfg.lp_dt, false, -4, -0.1),
              LossInput({cfg.n, cfg.k}, cfg.mask_dt, false, 0, 2),
              LossInput({cfg.n}, DType::I32, false, -1, double(cfg.v))};
  if (is_float(cfg.mask_dt)) {  // a float mask: exactly 0 or 1
    Vec m;
    for (int64_t i = 0; i < cfg.n * cfg.k; ++i) m.push_back(double((i * 7 + 3) % 5 != 0));
    c.inputs[3].values = m;
  }
  c.build = [cfg](Context& ctx, const std::vector<Tensor*>& in) {
    TopKDistillOptions o;
    o.divergence = cfg.r.div;
    o.beta = float(cfg.r.beta);
    o.skew_alpha = float(cfg.r.alpha);
    o.temperature = float(cfg.r.t);
    o.normalize_topk = cfg.r.normalize;
    o.w_hard = float(cfg.r.w_hard);
    o.w_soft = float(cfg.r.w_soft);
    o.ignore_index = cfg.r.ignore;
    o.reduction = cfg.r.red;
    o.return_per_row = cfg.what == Out::PerRow;
    o.return_lse = cfg.what == Out::Lse;
    o.return_parts = cfg.what == Out::Hard || cfg.what == Out::Soft;
    Tensor* x = cfg.transposed ? transpose(ctx, in[0]) : in[0];
    return pick(topk_kd(ctx, x, in[1], in[2], cfg.mask ? in[3] : nullptr, cfg.labels ? in[4] : nullptr, o),
                cfg.what);
  };
  c.reference = [cfg](const std::vector<Ref>& in) {
    return topk_ref(cfg.transposed ? mat_t(in[0]) : mat(in[0]), ints(in[1]), mat(in[2]),
                    cfg.mask ? in[3].v : Vec{}, cfg.labels ? ints(in[4]) : std::vector<int64_t>{}, cfg.r,
                    cfg.what);
  };
  c.check_grad = cfg.what == Out::Loss;
  return c;
}

std::string topk_name(const TopKRef& r, bool labels) {
  return "cuda_topk_b" + std::to_string(int(r.beta * 10)) + "_t" + std::to_string(int(r.t)) +
         (r.normalize ? "_norm" : "") + (r.w_hard > 0 ? "_hard" : "") + (labels ? "_labels" : "") + "_" +
         red_name(r.red);
}

TEST_F(CudaDistill, TopKGrid) {
  int i = 0;
  for (double beta : {0.0, 0.5, 1.0})
    for (double t : {1.0, 2.0})
      for (bool norm : {false, true})
        for (double w_hard : {0.0, 0.7})
          for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
            TopKCfg cfg;
            cfg.r.beta = beta;
            cfg.r.t = t;
            cfg.r.normalize = norm;
            cfg.r.w_hard = w_hard;
            cfg.r.w_soft = 0.8;
            cfg.r.red = red;
            cfg.labels = w_hard > 0 || (i++ % 2 == 0);  // without labels every row counts
            EXPECT_TRUE(check_cuda(topk_case(topk_name(cfg.r, cfg.labels), cfg)));
          }
  for (double beta : {0.0, 0.5, 1.0}) {  // no mask; i64 ids
    TopKCfg cfg;
    cfg.r.beta = beta;
    cfg.r.t = 2;
    cfg.mask = false;
    cfg.id_dt = DType::I64;
    EXPECT_TRUE(check_cuda(topk_case("cuda_topk_nomask_b" + std::to_string(int(beta * 10)), cfg)));
  }
}

// TVD and the skew KLs: every kernel path of the KL family (the general kernel, the cross-entropy rows with
// a slot fixup at T = 1 with labels and normalize_topk, long rows) against the float64 reference and the CPU.
TEST_F(CudaDistill, TopKDivergences) {
  int i = 0;
  for (const DivCase& d : div_cases())
    for (double t : {1.0, 2.0})
      for (bool norm : {false, true})
        for (double w_hard : {0.0, 0.7}) {
          TopKCfg cfg;
          cfg.r.div = d.div;
          cfg.r.alpha = d.alpha;
          cfg.r.t = t;
          cfg.r.normalize = norm;
          cfg.r.w_hard = w_hard;
          cfg.r.w_soft = 0.8;
          cfg.r.red = std::array{Reduction::Mean, Reduction::Sum, Reduction::None}[size_t(i++ % 3)];
          cfg.labels = w_hard > 0 || i % 2 == 0;
          EXPECT_TRUE(check_cuda(topk_case(std::string(d.name) + "_" + topk_name(cfg.r, cfg.labels), cfg)));
        }
  for (const DivCase& d : div_cases()) {
    TopKCfg cfg;
    cfg.r.div = d.div;
    cfg.r.alpha = d.alpha;
    cfg.r.normalize = true;
    cfg.r.w_hard = 0.3;
    cfg.n = 3;
    cfg.v = 3000;
    cfg.k = 40;
    EXPECT_TRUE(check_cuda(topk_case(std::string("cuda_topk_long_") + d.name, cfg)));
  }
}

TEST_F(CudaDistill, TopKOutputs) {
  for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None})
    for (Out what : {Out::PerRow, Out::Lse, Out::Hard, Out::Soft}) {
      TopKCfg cfg;
      cfg.r.beta = 0.5;
      cfg.r.t = 2;
      cfg.r.w_hard = 0.3;
      cfg.r.red = red;
      cfg.what = what;
      EXPECT_TRUE(check_cuda(topk_case("cuda_topk_out" + std::to_string(int(what)) + red_name(red), cfg)));
    }
  // The hard part with w_hard = 0, and the lse on the normalize_topk path (which otherwise skips the row).
  TopKCfg cfg;
  cfg.r.normalize = true;
  cfg.what = Out::Hard;
  EXPECT_TRUE(check_cuda(topk_case("cuda_topk_hard_unweighted", cfg)));
  cfg.what = Out::Lse;
  cfg.r.t = 2;
  EXPECT_TRUE(check_cuda(topk_case("cuda_topk_norm_lse", cfg)));
}

TEST_F(CudaDistill, TopKShapes) {
  for (double beta : {0.0, 0.5, 1.0})
    for (bool norm : {false, true}) {
      TopKCfg cfg;
      cfg.r.beta = beta;
      cfg.r.normalize = norm;
      cfg.r.t = 2;
      cfg.r.w_hard = 0.5;
      cfg.k = 1;
      const std::string tag = std::to_string(int(beta * 10)) + (norm ? "n" : "");
      EXPECT_TRUE(check_cuda(topk_case("cuda_topk_k1_" + tag, cfg)));
      cfg.k = cfg.v = 6;  // K = V, each id once per row
      cfg.mask = false;
      LossCase c = topk_case("cuda_topk_kv_" + tag, cfg);
      Vec ids;
      for (int64_t r = 0; r < cfg.n; ++r)
        for (int64_t k = 0; k < cfg.k; ++k) ids.push_back(double((k * 5 + r) % cfg.k));
      c.inputs[1].values = ids;
      EXPECT_TRUE(check_cuda(c));
    }
  for (int64_t v = 1; v <= 7; ++v) {
    TopKCfg cfg;
    cfg.r.beta = v % 2 ? 0.5 : 1.0;
    cfg.r.w_hard = 0.5;
    cfg.r.t = 2;
    cfg.v = v;
    cfg.k = std::min<int64_t>(3, v);
    EXPECT_TRUE(check_cuda(topk_case("cuda_topk_v" + std::to_string(v), cfg)));
  }
  for (bool norm : {false, true}) {
    TopKCfg cfg;
    cfg.r.beta = 0.5;
    cfg.r.w_hard = 0.5;
    cfg.r.normalize = norm;
    cfg.r.t = norm ? 2 : 1;
    cfg.n = 2;
    cfg.v = 1000;
    cfg.k = 16;
    EXPECT_TRUE(check_cuda(topk_case(std::string("cuda_topk_v1000") + (norm ? "_norm" : ""), cfg)));
  }
  // K in the thousands: the per-slot values and the duplicate-id sort take > 48 KB of shared memory, and with
  // 3000 random ids out of 5000 most rows repeat some. Too big for central differences.
  for (bool norm : {false, true}) {
    TopKCfg cfg;
    cfg.r.beta = 0.5;
    cfg.r.t = 2;
    cfg.r.w_hard = 0.2;
    cfg.r.normalize = norm;
    cfg.n = 4;
    cfg.v = 5000;
    cfg.k = 3000;
    cfg.dt = DType::BF16;
    EXPECT_TRUE(check_cuda(topk_case(std::string("cuda_topk_k3000") + (norm ? "_norm" : ""), cfg),
                           {kCpuTol, kCpuTol, false}));
  }
  // Many rows over a vocabulary that takes the 8-wide loads.
  TopKCfg big;
  big.r.beta = 0.0;
  big.r.w_hard = 0.5;
  big.n = 300;
  big.v = 4096;
  big.k = 64;
  EXPECT_TRUE(check_cuda(topk_case("cuda_topk_rows300", big), {kCpuTol, kCpuTol, false}));
  // Long rows (a 60 KB bf16 row, a 400 KB f32 row), more rows than CTAs: the two-pass kernel at the sizes
  // of real vocabularies, where the second pass re-reads rows from L2 or HBM.
  for (DType dt : {DType::BF16, DType::F32}) {
    TopKCfg cfg;
    cfg.r.beta = 0.5;
    cfg.r.t = dt == DType::F32 ? 2 : 1;
    cfg.r.w_hard = 0.5;
    cfg.n = 300;
    cfg.v = dt == DType::F32 ? 100000 : 30000;
    cfg.k = 64;
    cfg.dt = dt;
    EXPECT_TRUE(check_cuda(topk_case(std::string("cuda_topk_long_") + dtype_name(dt), cfg),
                           {kCpuTol, kCpuTol, false}));
  }
}

TEST_F(CudaDistill, TopKDtypesLayoutsAndHugeLogits) {
  for (DType dt : {DType::BF16, DType::F16})
    for (bool transposed : {false, true}) {
      TopKCfg cfg;
      cfg.r.beta = transposed ? 1.0 : 0.5;
      cfg.r.t = 2;
      cfg.r.w_hard = 0.5;
      cfg.r.normalize = transposed;
      cfg.dt = dt;
      cfg.lp_dt = dt;  // teacher logprobs in the same storage
      cfg.mask_dt = DType::F32;
      cfg.transposed = transposed;
      EXPECT_TRUE(
          check_cuda(topk_case(std::string("cuda_topk_") + dtype_name(dt) + (transposed ? "_t" : ""), cfg)));
    }
  for (double beta : {0.0, 0.5, 1.0})
    for (bool norm : {false, true}) {
      TopKCfg cfg;
      cfg.r.beta = beta;
      cfg.r.normalize = norm;
      cfg.r.w_hard = 0.5;
      cfg.r.t = 2;
      cfg.lo = -1e4;
      cfg.hi = 1e4;
      LossCase c = topk_case("cuda_topk_huge_" + std::to_string(int(beta * 10)) + (norm ? "n" : ""), cfg);
      c.fwd_tol = 1e-9;
      c.grad_tol = 1e-6;  // the CPU test's: central differences with steps of 1e-2 at |z| ~ 1e4
      EXPECT_TRUE(check_cuda(c));
    }
}

// Row 0 pads two slots with −inf (and id −1, never to be read), row 1 is fully masked, row 2 pads by mask
// only (with an out-of-range id), row 3 repeats id 3.
LossCase padded_case(const std::string& name, const TopKRef& r, bool use_labels) {
  TopKCfg cfg;
  cfg.r = r;
  cfg.n = 4;
  cfg.v = 7;
  cfg.k = 3;
  cfg.labels = use_labels;
  LossCase c = topk_case(name, cfg);
  c.inputs[1].values = {1, -1, -1, 0, 2, 4, 6, 99, 5, 3, 3, 1};
  c.inputs[2].values = {-0.5, -kInf, -kInf, -1, -2, -3, -0.2, -1.7, -kInf, -0.3, -2.5, -1.2};
  c.inputs[3].values = {1, 1, 1, 0, 0, 0, 1, 0, 1, 1, 1, 1};
  c.inputs[4].values = {2, 6, -1, 0};
  return c;
}

TEST_F(CudaDistill, TopKPaddingIgnoredRowsAndSinglePass) {
  for (double beta : {0.0, 0.5, 1.0})
    for (double t : {1.0, 2.0})
      for (bool norm : {false, true}) {
        TopKRef r;
        r.beta = beta;
        r.t = t;
        r.normalize = norm;
        r.w_hard = 0.4;
        const std::string nm =
            "cuda_topk_pad_" + std::to_string(int(beta * 10)) + std::to_string(int(t)) + (norm ? "n" : "");
        EXPECT_TRUE(check_cuda(padded_case(nm, r, true)));
        r.w_hard = 0;
        r.red = Reduction::None;
        EXPECT_TRUE(check_cuda(padded_case(nm + "_none", r, false)));
      }
  for (int valid_row : {-1, 1}) {  // all rows ignored: loss 0 and a zero gradient; one valid row
    TopKCfg cfg;
    cfg.r.beta = 0.5;
    cfg.r.w_hard = 0.5;
    LossCase c = topk_case(valid_row < 0 ? "cuda_topk_all_ignored" : "cuda_topk_one_valid", cfg);
    Vec labels(size_t(cfg.n), -1.0);
    if (valid_row >= 0) labels[size_t(valid_row)] = 4;
    c.inputs[4].values = labels;
    c.unit_seed = true;
    EXPECT_TRUE(check_cuda(c));
  }
  for (bool norm : {false, true}) {
    TopKCfg cfg;
    cfg.r.beta = 0.5;
    cfg.r.t = 2;
    cfg.r.normalize = norm;
    cfg.r.w_hard = 0.3;
    LossCase c = topk_case(norm ? "cuda_topk_single_norm" : "cuda_topk_single", cfg);
    c.unit_seed = true;
    EXPECT_TRUE(check_cuda(c));
  }
}

TEST_F(CudaDistill, TopKTooManySlotsThrows) {
  Context ctx(cuda_backend());
  // One slot more than the kernel keeps in shared memory: a clear error naming the op and K, not a bad
  // launch.
  const int64_t k = cuda::kMaxTopKSlots + 1;
  Tensor* x = ctx.input(DType::F32, {2, k + 5}, "logits");
  Tensor* ids = ctx.input(DType::I32, {2, k}, "ids");
  Tensor* lp = ctx.input(DType::F32, {2, k}, "lp");
  set_data(x, std::vector<float>(size_t(2 * (k + 5)), 0.0f));
  std::vector<int64_t> idv(size_t(2 * k));
  for (size_t i = 0; i < idv.size(); ++i) idv[i] = int64_t(i) % k;
  set_data_int(ids, idv);
  set_data(lp, std::vector<float>(size_t(2 * k), -9.0f));
  Tensor* loss = topk_kd(ctx, x, ids, lp, nullptr, nullptr).loss;
  Graph g(ctx);
  g.forward(loss);
  const std::string msg = error_of([&] { g.compute(); });
  EXPECT_NE(msg.find("topk_kd"), std::string::npos) << msg;
  EXPECT_NE(msg.find("K = " + std::to_string(k)), std::string::npos) << msg;
}

// ---- topk_kl_gathered ---------------------------------------------------------------------------------

LossCase gathered_case(const std::string& name, double t, Reduction red, bool use_mask, Out what = Out::Loss,
                       DType dt = DType::F32) {
  LossCase c;
  c.name = name;
  c.inputs = {LossInput({5, 6}, dt, true, -3, 3), LossInput({5, 6}, DType::F32, false, -4, -0.1),
              LossInput({5, 6}, DType::F32, false, 0, 1)};
  c.build = [=](Context& ctx, const std::vector<Tensor*>& in) {
    TopKKLOptions o;
    o.temperature = float(t);
    o.reduction = red;
    o.return_per_row = what == Out::PerRow;
    o.return_lse = what == Out::Lse;
    // The op sees mask != 0: a random float mask thresholded at 0.4 (relu keeps it a float tensor).
    Tensor* m = use_mask ? relu(ctx, sub(ctx, in[2], fill(ctx, DType::F32, in[2]->ne, 0.4f))) : nullptr;
    return pick(topk_kl_gathered(ctx, in[0], in[1], m, o), what);
  };
  c.reference = [=](const std::vector<Ref>& in) {
    TopKRef r;
    r.t = t;
    r.red = red;
    Vec mask;
    if (use_mask)
      for (double x : in[2].v) mask.push_back(x > 0.4 ? 1.0 : 0.0);
    return topk_ref(mat(in[0]), {}, mat(in[1]), mask, {}, r, what);
  };
  c.check_grad = what == Out::Loss;
  return c;
}

TEST_F(CudaDistill, TopKGathered) {
  for (double t : {1.0, 2.0})
    for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None})
      for (bool use_mask : {false, true})
        EXPECT_TRUE(check_cuda(gathered_case(
            "cuda_gathered_t" + std::to_string(int(t)) + red_name(red) + (use_mask ? "_mask" : ""), t, red,
            use_mask)));
  for (Out what : {Out::PerRow, Out::Lse})
    EXPECT_TRUE(check_cuda(
        gathered_case("cuda_gathered_out" + std::to_string(int(what)), 2, Reduction::Mean, false, what)));
  EXPECT_TRUE(
      check_cuda(gathered_case("cuda_gathered_bf16", 2, Reduction::Mean, true, Out::Loss, DType::BF16)));
  LossCase pad = gathered_case("cuda_gathered_pad", 2, Reduction::None, true);
  pad.inputs[1].values = Vec(30, -1.0);
  pad.inputs[1].values[0] = -kInf;  // −inf padding in a valid-mask slot
  pad.inputs[2].values = Vec(30, 1.0);
  for (int k = 0; k < 6; ++k) pad.inputs[2].values[size_t(6 + k)] = 0;  // row 1 fully masked
  EXPECT_TRUE(check_cuda(pad));
  LossCase single = gathered_case("cuda_gathered_single", 2, Reduction::Mean, false);
  single.unit_seed = true;
  EXPECT_TRUE(check_cuda(single));
}

// ---- distill ------------------------------------------------------------------------------------------

struct DistillCfg {
  DistillRef r;
  bool labels = true;
  int64_t n = 5, v = 9;
  DType dt = DType::F32, teacher_dt = DType::F32;
  double lo = -3, hi = 3;
  Out what = Out::Loss;
  bool transposed = false;  // student and teacher read through transposed views
};

// Inputs: student [n, v] (param), teacher [n, v] (constant), labels [n] in [-1, v) with ignore_index -1.
LossCase distill_case(const std::string& name, DistillCfg cfg) {
  cfg.r.ignore = -1;
  LossCase c;
  c.name = name;
  const Shape xs = cfg.transposed ? Shape{cfg.v, cfg.n} : Shape{cfg.n, cfg.v};
  c.inputs = {LossInput(xs, cfg.dt, true, cfg.lo, cfg.hi),
              LossInput(xs, cfg.teacher_dt, false, cfg.lo, cfg.hi),
              LossInput({cfg.n}, DType::I32, false, -1, double(cfg.v))};
  c.build = [cfg](Context& ctx, const std::vector<Tensor*>& in) {
    DistillOptions o;
    o.divergence = cfg.r.div;
    o.beta = float(cfg.r.beta);
    o.skew_alpha = float(cfg.r.alpha);
    o.temperature = float(cfg.r.t);
    o.w_hard = float(cfg.r.w_hard);
    o.w_soft = float(cfg.r.w_soft);
    o.ignore_index = cfg.r.ignore;
    o.reduction = cfg.r.red;
    o.return_per_row = cfg.what == Out::PerRow;
    o.return_lse = cfg.what == Out::Lse;
    o.return_parts = cfg.what == Out::Hard || cfg.what == Out::Soft;
    auto view = [&](Tensor* t) { return cfg.transposed ? transpose(ctx, t) : t; };
    return pick(distill(ctx, view(in[0]), view(in[1]), cfg.labels ? in[2] : nullptr, o), cfg.what);
  };
  c.reference = [cfg](const std::vector<Ref>& in) {
    auto m = [&](const Ref& r) { return cfg.transposed ? mat_t(r) : mat(r); };
    return distill_ref(m(in[0]), m(in[1]), cfg.labels ? ints(in[2]) : std::vector<int64_t>{}, cfg.r,
                       cfg.what);
  };
  c.check_grad = cfg.what == Out::Loss;
  return c;
}

std::string distill_name(const DistillRef& r, bool labels) {
  return "cuda_distill_b" + std::to_string(int(r.beta * 10)) + "_t" + std::to_string(int(r.t)) +
         (r.w_hard > 0 ? "_hard" : "") + (labels ? "_labels" : "") + "_" + red_name(r.red);
}

TEST_F(CudaDistill, DistillGridAndOutputs) {
  int i = 0;
  for (double beta : {0.0, 0.5, 1.0, 0.1})
    for (double t : {1.0, 2.0})
      for (double w_hard : {0.0, 0.6})
        for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
          DistillCfg cfg;
          cfg.r.beta = beta;
          cfg.r.t = t;
          cfg.r.w_hard = w_hard;
          cfg.r.w_soft = 0.9;
          cfg.r.red = red;
          cfg.labels = w_hard > 0 || (i++ % 2 == 0);
          EXPECT_TRUE(check_cuda(distill_case(distill_name(cfg.r, cfg.labels), cfg)));
        }
  for (Reduction red : {Reduction::Mean, Reduction::None})
    for (Out what : {Out::PerRow, Out::Lse, Out::Hard, Out::Soft}) {
      DistillCfg cfg;
      cfg.r.beta = 0.5;
      cfg.r.t = 2;
      cfg.r.w_hard = 0.4;
      cfg.r.red = red;
      cfg.what = what;
      EXPECT_TRUE(
          check_cuda(distill_case("cuda_distill_out" + std::to_string(int(what)) + red_name(red), cfg)));
    }
}

// TVD and the skew KLs over the full vocabulary: the portable kernel (the Hopper cluster kernel is the KL
// family's), short rows and rows long enough for its 8-wide loads, f32 and bf16.
TEST_F(CudaDistill, DistillDivergences) {
  int i = 0;
  for (const DivCase& d : div_cases())
    for (double t : {1.0, 2.0})
      for (int64_t v : {int64_t(9), int64_t(3001)}) {
        DistillCfg cfg;
        cfg.r.div = d.div;
        cfg.r.alpha = d.alpha;
        cfg.r.t = t;
        cfg.r.w_hard = i % 2 ? 0.6 : 0.0;
        cfg.r.red = std::array{Reduction::Mean, Reduction::Sum, Reduction::None}[size_t(i++ % 3)];
        cfg.labels = cfg.r.w_hard > 0 || i % 2 == 0;
        cfg.v = v;
        cfg.n = v > 100 ? 3 : 5;
        EXPECT_TRUE(check_cuda(distill_case(
            std::string(d.name) + "_v" + std::to_string(v) + "_" + distill_name(cfg.r, cfg.labels), cfg)));
      }
}

TEST_F(CudaDistill, DistillShapesDtypesAndLayouts) {
  for (int64_t v = 1; v <= 7; ++v) {
    DistillCfg cfg;
    cfg.r.beta = v % 3 == 0 ? 0.0 : v % 3 == 1 ? 0.5 : 1.0;
    cfg.r.t = 2;
    cfg.r.w_hard = 0.5;
    cfg.v = v;
    EXPECT_TRUE(check_cuda(distill_case("cuda_distill_v" + std::to_string(v), cfg)));
  }
  for (double beta : {0.0, 0.5}) {
    DistillCfg cfg;
    cfg.r.beta = beta;
    cfg.r.w_hard = 0.5;
    cfg.n = 2;
    cfg.v = 1000;
    EXPECT_TRUE(check_cuda(distill_case("cuda_distill_v1000_" + std::to_string(int(beta * 10)), cfg)));
  }
  for (double beta : {0.0, 1.0}) {  // many rows, too big for central differences
    DistillCfg cfg;
    cfg.r.beta = beta;
    cfg.r.t = 2;
    cfg.r.w_hard = 0.3;
    cfg.n = 200;
    cfg.v = 3000;
    cfg.dt = cfg.teacher_dt = DType::BF16;
    EXPECT_TRUE(check_cuda(distill_case("cuda_distill_rows200_" + std::to_string(int(beta * 10)), cfg),
                           {kCpuTol, kCpuTol, false}));
  }
  // Contiguous rows of odd length: the portable kernel's 8-wide path after each row's scalar head (student
  // and teacher rows share their misalignment), for every mode; f32 also stores the gradient 8-wide.
  for (DType dt : {DType::BF16, DType::F32})
    for (double beta : {0.0, 0.5, 1.0}) {
      DistillCfg cfg;
      cfg.r.beta = beta;
      cfg.r.t = beta == 0.5 ? 2 : 1;
      cfg.r.w_hard = 0.25;
      cfg.n = 64;
      cfg.v = dt == DType::BF16 ? 1001 : 1003;
      cfg.dt = cfg.teacher_dt = dt;
      EXPECT_TRUE(check_cuda(distill_case(std::string("cuda_distill_odd_rows_") + dtype_name(dt) + "_" +
                                              std::to_string(int(beta * 10)),
                                          cfg),
                             {kCpuTol, kCpuTol, false}));
    }
  for (DType dt : {DType::BF16, DType::F16})
    for (bool transposed : {false, true}) {
      DistillCfg cfg;
      cfg.r.beta = transposed ? 1.0 : 0.5;
      cfg.r.t = 2;
      cfg.r.w_hard = 0.5;
      cfg.dt = dt;
      cfg.teacher_dt = transposed ? dt : DType::F32;  // a teacher in another dtype than the student
      cfg.transposed = transposed;
      EXPECT_TRUE(check_cuda(
          distill_case(std::string("cuda_distill_") + dtype_name(dt) + (transposed ? "_t" : ""), cfg)));
    }
}

TEST_F(CudaDistill, DistillEdgeCases) {
  for (double beta : {0.0, 0.5, 1.0}) {
    DistillCfg cfg;
    cfg.r.beta = beta;
    cfg.r.t = 2;
    cfg.r.w_hard = 0.3;
    cfg.lo = -1e4;
    cfg.hi = 1e4;
    LossCase c = distill_case("cuda_distill_huge_" + std::to_string(int(beta * 10)), cfg);
    c.fwd_tol = 1e-9;
    c.grad_tol = 1e-6;  // the CPU test's: central differences with steps of 1e-2 at |z| ~ 1e4
    EXPECT_TRUE(check_cuda(c));
  }
  for (double beta : {0.0, 0.5}) {  // a teacher that rules tokens out with −inf logits
    DistillCfg cfg;
    cfg.r.beta = beta;
    cfg.n = 2;
    cfg.v = 5;
    LossCase c = distill_case("cuda_distill_teacher_inf_" + std::to_string(int(beta * 10)), cfg);
    c.inputs[1].values = {0.5, -kInf, 1.0, -kInf, -0.3, -kInf, 2.0, 0.1, 0.7, -1.0};
    EXPECT_TRUE(check_cuda(c));
  }
  for (int valid_row : {-1, 3}) {
    DistillCfg cfg;
    cfg.r.beta = 0.5;
    cfg.r.w_hard = 0.5;
    LossCase c = distill_case(valid_row < 0 ? "cuda_distill_all_ignored" : "cuda_distill_one_valid", cfg);
    Vec labels(size_t(cfg.n), -1.0);
    if (valid_row >= 0) labels[size_t(valid_row)] = 2;
    c.inputs[2].values = labels;
    c.unit_seed = true;
    EXPECT_TRUE(check_cuda(c));
  }
  for (double beta : {0.0, 0.5, 1.0}) {
    DistillCfg cfg;
    cfg.r.beta = beta;
    cfg.r.t = 2;
    cfg.r.w_hard = 0.2;
    LossCase c = distill_case("cuda_distill_single_" + std::to_string(int(beta * 10)), cfg);
    c.unit_seed = true;
    EXPECT_TRUE(check_cuda(c));
  }
}

}  // namespace
}  // namespace retort::test

namespace retort::test {
namespace {

// Rows that are whole 16-byte vectors in one dtype take the Hopper cluster kernel (rows held in the shared
// memory of up to eight CTAs); V = 60000 in bf16 needs three CTAs per row. Ignored rows, lse and the parts
// are checked there too; on GPUs before Hopper these cases run the portable kernel.
TEST_F(CudaDistill, DistillClusterPath) {
  // (beta, T): JSD at T = 1 keeps q and t between its passes; at T = 2 with the hard loss it keeps t only.
  for (auto [beta, t] : {std::pair{0.0, 2.0}, {0.5, 1.0}, {0.5, 2.0}, {1.0, 2.0}})
    for (Out what : {Out::Loss, Out::Lse, Out::Soft}) {
      DistillCfg cfg;
      cfg.r.beta = beta;
      cfg.r.t = t;
      cfg.r.w_hard = 0.3;
      cfg.n = 6;
      cfg.v = 60000;
      cfg.dt = cfg.teacher_dt = DType::BF16;
      cfg.what = what;
      LossCase c = distill_case("cuda_distill_cluster_" + std::to_string(int(beta * 10)) + "_t" +
                                    std::to_string(int(t)) + "_" + std::to_string(int(what)),
                                cfg);
      c.inputs[2].values = {5, -1, 59999, 0, -1, 31337};  // two ignored rows; labels at both ends
      EXPECT_TRUE(check_cuda(c, {kCpuTol, kCpuTol, false}));
    }
  // Rows that two 512-thread CTAs per SM could hold single-buffered only: three 320-thread CTAs per SM take
  // them, in more segments (bf16 V = 128,256 in 8; f32 V = 60,000 in 7).
  for (auto [v, dt] : {std::pair{int64_t(128256), DType::BF16}, {int64_t(60000), DType::F32}})
    for (auto [beta, t] : {std::pair{0.0, 1.0}, {0.5, 1.0}, {0.5, 2.0}, {1.0, 1.0}}) {
      DistillCfg cfg;
      cfg.r.beta = beta;
      cfg.r.t = t;
      cfg.r.w_hard = 0.3;
      cfg.n = 6;
      cfg.v = v;
      cfg.dt = cfg.teacher_dt = dt;
      LossCase c = distill_case("cuda_distill_cluster3_" + std::string(dtype_name(dt)) + "_" +
                                    std::to_string(int(beta * 10)) + "_t" + std::to_string(int(t)),
                                cfg);
      c.inputs[2].values = {5, -1, double(v - 1), 0, 31337, -1};
      EXPECT_TRUE(check_cuda(c, {kCpuTol, kCpuTol, false}));
    }
  // f32, V = 16: logits of ±1e4 and a teacher ruling tokens out.
  for (auto [beta, t] : {std::pair{0.0, 2.0}, {0.5, 2.0}, {0.5, 1.0}}) {
    DistillCfg cfg;
    cfg.r.beta = beta;
    cfg.r.t = t;
    cfg.r.w_hard = 0.3;
    cfg.n = 2;
    cfg.v = 16;
    cfg.lo = -1e4;
    cfg.hi = 1e4;
    LossCase c = distill_case(
        "cuda_distill_cluster_huge_" + std::to_string(int(beta * 10)) + "_t" + std::to_string(int(t)), cfg);
    Vec teacher(32);
    for (size_t j = 0; j < teacher.size(); ++j)  // spread over ±1e4, every third entry ruled out
      teacher[j] = j % 3 == 1 ? -kInf : 1e4 * std::sin(double(j) * 1.7);
    c.inputs[1].values = teacher;
    c.fwd_tol = 1e-9;
    c.grad_tol = 1e-6;
    EXPECT_TRUE(check_cuda(c));
  }
}

}  // namespace
}  // namespace retort::test
