// The fused linear losses on CUDA (src/cuda/loss/cuda_chunk_exec.cu, cuda_fused_ops.cu): every case runs the
// same graph on the CPU and on CUDA from the same inputs (cuda_loss_check.h) and checks the CUDA result
// against the CPU (kCpuTol), against the float64 lm-head + loss reference (forward 1e-10), and its gradients
// of hidden, weight and bias against central differences of the reference (1e-8), with looser numbers only
// where stated: bf16 heads keep the logits gradient in bf16 for the gradient GEMMs (cuda_chunk_exec.h), a
// rounding of 2^-9 relative per element, so their gradients are held to 1e-4 (a wrong gradient is ~1).
// Every graph runs with poisoned memory, so an output element the device never writes shows up as NaN.
// Also: chunk-size independence (bitwise on the K-sparse top-K path), a 50,257-entry vocabulary, strided
// inputs, peak device memory within the budget, and bad labels / ids raising retort::Error.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>

#include "cuda_loss_check.h"
#include "loss_cases.h"

namespace retort::test {
namespace {

class CudaFused : public CudaTest {};

LossInput hidden_in(int64_t n, int64_t h, DType dt = DType::F32, double lo = -1, double hi = 1) {
  return LossInput(Shape{n, h}, dt, true, lo, hi);
}
LossInput weight_in(int64_t v, int64_t h, DType dt = DType::F32) {
  return LossInput(Shape{v, h}, dt, true, -1, 1);
}
LossInput bias_in(int64_t v, DType dt = DType::F32) {
  return LossInput(Shape{v}, dt, true, -0.5, 0.5);
}

// One row, odd sizes, all rows.
std::vector<int64_t> chunk_sizes(int64_t n) {
  return {1, 3, n};
}

// f32 chunk logits whatever the inputs' dtype (the 16-bit default is test_cuda_fused_lowlogits.cpp's).
FusedLinearOptions chunked(int64_t rows) {
  FusedLinearOptions f;
  f.chunk_rows = rows;
  f.logits_dtype = DType::F32;
  return f;
}

// bf16 heads: the gradients see the 16-bit logits gradient (see the header comment).
constexpr double kBf16GradTol = 1e-4;

void loosen_for(DType dt, LossCase& c, CudaTol& tol) {
  if (dt == DType::F32) return;
  c.grad_tol = kBf16GradTol;
  tol.cpu_grad = kBf16GradTol;
}

// ---- cross-entropy: CUDA's paths ----------------------------------------------------------------------

// fused_linear_cross_entropy's values and gradients are the CPU's case list
// (tests/ops/loss_cases_fused_ce.cpp, run here by test_cuda_loss_cases.cpp). What the list cannot say: which
// of CUDA's paths ran them.

// Whether the shared backend (default options: the epilogue on) runs the epilogue: the device can.
bool epilogue_on(const CudaSoftmaxEpilogueStats& s) {
  if (!s.supported) std::printf("softmax epilogue not supported here: the row pass runs these cases\n");
  return s.supported;
}

// Runs the list's cases named prefix* on the shared backend (no central differences: the list's own run has
// them) and returns how many ran.
size_t run_named(const std::vector<LossCase>& list, const std::string& prefix) {
  size_t n = 0;
  for (const LossCase& c : list)
    if (c.name.rfind(prefix, 0) == 0) {
      EXPECT_TRUE(check_cuda(c, {c.backend_tol, c.backend_grad_tol, false}));
      ++n;
    }
  return n;
}

// The softmax-epilogue path (CudaOptions::softmax_epilogue, src/cuda/loss/softmax_chunk.h) runs the list's
// epilogue cases, every chunk; none of the in-range ones falls back to the per-row kernel.
TEST_F(CudaFused, SoftmaxEpilogueRunsTheEpilogueCases) {
  Backend& be = cuda_backend();
  const std::vector<LossCase> cs = fused_ce_cases();
  const CudaSoftmaxEpilogueStats before = cuda_softmax_epilogue_stats(be);
  const bool on = epilogue_on(before);
  // V = 300 in chunks of 1, 4 and 9 rows of 9 (3 reductions each), then GPT-2's vocabulary in 3 chunks.
  const size_t small = run_named(cs, "fce_epilogue_mean") + run_named(cs, "fce_epilogue_sum") +
                       run_named(cs, "fce_epilogue_none");
  const size_t gpt2 = run_named(cs, "fce_epilogue_gpt2");
  EXPECT_EQ(small, 9u);
  EXPECT_EQ(gpt2, 3u);
  const CudaSoftmaxEpilogueStats after = cuda_softmax_epilogue_stats(be);
  if (on) {
    EXPECT_GE(after.chunks - before.chunks, size_t(3 * (9 + 3 + 1) + 3 * 3));
  }
  EXPECT_EQ(after.fallback_rows, before.fallback_rows);  // nothing here is beyond the epilogue's range
}

TEST_F(CudaFused, SoftmaxEpilogueRecomputesRowsBeyondItsRange) {
  // The list's far cases: many rows' losses pass 69 nats at the label's shift and the exact per-row kernel
  // recomputes them; the rest stay on the epilogue.
  Backend& be = cuda_backend();
  const CudaSoftmaxEpilogueStats before = cuda_softmax_epilogue_stats(be);
  const bool on = epilogue_on(before);
  EXPECT_EQ(run_named(fused_ce_cases(), "fce_epilogue_far"), 2u);
  const CudaSoftmaxEpilogueStats after = cuda_softmax_epilogue_stats(be);
  if (on) {
    EXPECT_GT(after.fallback_rows, before.fallback_rows);
    EXPECT_GT(after.chunks, before.chunks);
  }
}

// A case of the epilogue's shape for the schedules test: bf16, no bias, rows of 16 bytes.
LossCase epilogue_case(const std::string& name, int64_t n, int64_t h, int64_t v, int64_t chunk, Reduction red,
                       double z_loss) {
  LossCase c;
  c.name = name;
  c.inputs = {hidden_in(n, h, DType::BF16), weight_in(v, h, DType::BF16),
              LossInput(Shape{n}, DType::I32, false, -1, double(v))};
  c.build = [=](Context& ctx, const std::vector<Tensor*>& in) {
    CrossEntropyOptions o;
    o.ignore_index = -1;
    o.z_loss = float(z_loss);
    o.reduction = red;
    return fused_linear_cross_entropy(ctx, in[0], in[1], nullptr, in[2], o, chunked(chunk)).loss;
  };
  c.reference = [=](const std::vector<Ref>& in) {
    CeRef r;
    r.ignore = -1;
    r.z_loss = z_loss;
    r.red = red;
    return ce_ref(head_ref(in[0], in[1], nullptr), ints(in[2]), r);
  };
  return c;
}

// ---- top-K distillation -------------------------------------------------------------------------------

struct TopKCfg {
  TopKRef r;
  bool bias = true, labels = true, mask = true;
  int64_t n = 7, h = 4, v = 11, k = 4, chunk = 3;
  DType dt = DType::F32;
  Out what = Out::Loss;
  DType logits = DType::F32;  // FusedLinearOptions::logits_dtype
};

// hidden, weight, bias, ids [n, k], logprobs [n, k], mask [n, k] in {0..3} (nonzero = valid), labels [n] in
// [-1, v) with ignore_index -1.
LossCase topk_case(const std::string& name, TopKCfg cfg) {
  cfg.r.ignore = -1;
  LossCase c;
  c.name = name;
  c.inputs = {hidden_in(cfg.n, cfg.h, cfg.dt, -2, 2),
              weight_in(cfg.v, cfg.h, cfg.dt),
              bias_in(cfg.v, cfg.dt),
              LossInput({cfg.n, cfg.k}, DType::I32, false, 0, double(cfg.v)),
              LossInput({cfg.n, cfg.k}, DType::F32, false, -4, -0.1),
              LossInput({cfg.n, cfg.k}, DType::I32, false, 0, 4),
              LossInput({cfg.n}, DType::I32, false, -1, double(cfg.v))};
  c.inputs[2].param = cfg.bias;
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
    FusedLinearOptions f = chunked(cfg.chunk);
    f.logits_dtype = cfg.logits;
    return pick(fused_linear_topk_kd(ctx, in[0], in[1], cfg.bias ? in[2] : nullptr, in[3], in[4],
                                     cfg.mask ? in[5] : nullptr, cfg.labels ? in[6] : nullptr, o, f),
                cfg.what);
  };
  c.reference = [cfg](const std::vector<Ref>& in) {
    return topk_ref(head_ref(in[0], in[1], cfg.bias ? &in[2] : nullptr), ints(in[3]), mat(in[4]),
                    cfg.mask ? in[5].v : Vec{}, cfg.labels ? ints(in[6]) : std::vector<int64_t>{}, cfg.r,
                    cfg.what);
  };
  c.check_grad = cfg.what == Out::Loss;
  return c;
}

// Top-K forward KL at T = 1 with a hard part, bf16 operands, no bias: the epilogue path's options.
TopKCfg epilogue_topk_cfg(int64_t n, int64_t h, int64_t v, int64_t k, int64_t chunk) {
  TopKCfg cfg;
  cfg.dt = DType::BF16;
  cfg.bias = false;
  cfg.n = n;
  cfg.h = h;
  cfg.v = v;
  cfg.k = k;
  cfg.chunk = chunk;
  cfg.r.w_hard = 0.5;
  return cfg;
}

// Top-K forward KL at T = 1 over the full vocabulary takes the softmax-epilogue path too (bf16, rows of 16
// bytes, no bias): the slots and the label are folded into the bf16 exp(z − shift) block per row.
TEST_F(CudaFused, SoftmaxEpilogueTopK) {
  Backend& be = cuda_backend();
  const CudaSoftmaxEpilogueStats before = cuda_softmax_epilogue_stats(be);
  const bool on = epilogue_on(before);
  auto base = [] { return epilogue_topk_cfg(9, 8, 300, 6, 4); };
  auto check = [](const LossCase& c0, bool fd) {
    LossCase c = c0;
    CudaTol tol;
    loosen_for(DType::BF16, c, tol);
    tol.finite_differences = fd;
    EXPECT_TRUE(check_cuda(c, tol));
  };
  // With and without labels (no labels: the shift is the largest z at a valid slot) and a mask; both
  // reductions; central differences.
  for (bool labels : {true, false})
    for (bool mask : {true, false})
      for (Reduction red : {Reduction::Mean, Reduction::None}) {
        TopKCfg cfg = base();
        cfg.labels = labels;
        cfg.mask = mask;
        cfg.r.red = red;
        if (!labels) cfg.r.w_hard = 0.0;  // a hard part needs labels
        check(topk_case(std::string("cflse_topk_") + (labels ? "l" : "") + (mask ? "m" : "") + red_name(red),
                        cfg),
              true);
      }
  // The parts, the LSE and the per-row losses.
  for (Out what : {Out::Hard, Out::Soft, Out::Lse, Out::PerRow}) {
    TopKCfg cfg = base();
    cfg.what = what;
    check(topk_case("cflse_topk_out" + std::to_string(int(what)), cfg), false);
  }
  {  // Ids and labels from [0, 5): duplicate ids in a row, and the label among them.
    TopKCfg cfg = base();
    cfg.r.w_soft = 0.75;
    LossCase c = topk_case("cflse_topk_dup", cfg);
    c.inputs[3] = LossInput({cfg.n, cfg.k}, DType::I32, false, 0, 5);
    c.inputs[6] = LossInput({cfg.n}, DType::I32, false, -1, 5);
    check(c, true);
  }
  {  // K = 64 over GPT-2's vocabulary, 3 chunks (the last short).
    TopKCfg cfg = base();
    cfg.n = 300;
    cfg.h = 64;
    cfg.v = 50257;
    cfg.k = 64;
    cfg.chunk = 128;
    LossCase c = topk_case("cflse_topk_gpt2", cfg);
    c.inputs[0] = hidden_in(cfg.n, cfg.h, DType::BF16, -1, 1);
    check(c, false);
  }
  // 16-bit logits with labels: z at the slots from the bf16 exp block, |error| ≤ 2^-8 (the row pass reads
  // them from bf16 logits, |error| ≤ 2^-9·|z|): the losses to 1e-6 nmse, the gradients as before.
  for (bool big : {false, true}) {
    TopKCfg cfg = base();
    cfg.logits = DType::BF16;
    cfg.what = Out::PerRow;
    if (big) {
      cfg.n = 300;
      cfg.h = 64;
      cfg.v = 50257;
      cfg.k = 64;
      cfg.chunk = 128;
    }
    LossCase c = topk_case(std::string("cflse_topk_low") + (big ? "_gpt2" : ""), cfg);
    c.inputs[0] = hidden_in(cfg.n, cfg.h, DType::BF16, -1, 1);
    c.fwd_tol = 1e-6;
    CudaTol tol;
    loosen_for(DType::BF16, c, tol);
    tol.cpu = 1e-6;
    tol.finite_differences = false;
    EXPECT_TRUE(check_cuda(c, tol));
    cfg.what = Out::Loss;  // and the gradients
    LossCase g = topk_case(std::string("cflse_topk_lowg") + (big ? "_gpt2" : ""), cfg);
    g.inputs[0] = hidden_in(cfg.n, cfg.h, DType::BF16, -1, 1);
    g.fwd_tol = 1e-6;
    EXPECT_TRUE(check_cuda(g, tol));
  }
  const CudaSoftmaxEpilogueStats after = cuda_softmax_epilogue_stats(be);
  if (on) {
    EXPECT_GE(after.chunks - before.chunks, size_t(8 * 3 + 4 * 3 + 3 + 3 + 2 * 3 + 2 * 3));
  }
  EXPECT_EQ(after.fallback_rows, before.fallback_rows);
}

// The epilogue GEMM's two schedules (CudaOptions::softmax_pingpong) compute each E entry and partial sum the
// same way (which warpgroup holds a tile is all that differs): bitwise equal outputs, gradients within the
// GEMM picks' f32 rounding. Shapes with several 64-row tiles, a short last one, and several tiles per CTA
// (V = 50,257: 197 column tiles), so that the ping-pong's warpgroups take turns many times.
TEST_F(CudaFused, SoftmaxEpilogueSchedulesAgree) {
  CudaOptions pp, coop;
  pp.softmax_pingpong = 1;
  coop.softmax_pingpong = 0;
  auto a = make_cuda_backend(0, pp);
  auto b = make_cuda_backend(0, coop);
  const CudaSoftmaxEpilogueStats a0 = cuda_softmax_epilogue_stats(*a), b0 = cuda_softmax_epilogue_stats(*b);
  if (!epilogue_on(a0)) GTEST_SKIP() << "softmax epilogue off or not supported here";
  for (int64_t chunk : {int64_t(128), int64_t(300)})
    EXPECT_TRUE(check_cuda_same(
        epilogue_case("cflse_sched_ce" + std::to_string(chunk), 300, 64, 50257, chunk, Reduction::Mean, 0.01),
        *a, *b, 1e-10));
  const TopKCfg cfg = epilogue_topk_cfg(300, 64, 50257, 64, 300);
  LossCase c = topk_case("cflse_sched_topk", cfg);
  c.inputs[0] = hidden_in(cfg.n, cfg.h, DType::BF16, -1, 1);
  EXPECT_TRUE(check_cuda_same(c, *a, *b, 1e-10));
  EXPECT_GE(cuda_softmax_epilogue_stats(*a).chunks - a0.chunks, size_t(3 + 1 + 1));
  EXPECT_GE(cuda_softmax_epilogue_stats(*b).chunks - b0.chunks, size_t(3 + 1 + 1));
}

TEST_F(CudaFused, TopKDense) {
  // Full-vocabulary GEMMs: a hard loss, or Q over the full vocabulary.
  for (double beta : {0.0, 0.5, 1.0})
    for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
      TopKCfg cfg;
      cfg.r.beta = beta;
      cfg.r.t = 2.0;
      cfg.r.w_hard = 0.5;
      cfg.r.red = red;
      cfg.r.normalize = beta == 0.5;
      EXPECT_TRUE(check_cuda(topk_case("cfltopk_b" + std::to_string(beta) + red_name(red), cfg)));
    }
  for (Out what : {Out::Hard, Out::Soft, Out::Lse}) {
    TopKCfg cfg;
    cfg.r.w_hard = 0.25;
    cfg.what = what;
    EXPECT_TRUE(check_cuda(topk_case("cfltopk_out" + std::to_string(int(what)), cfg)));
  }
}

TEST_F(CudaFused, TopKAsCrossEntropyRows) {
  // T = 1 with beta = 0, or normalize_topk: the chunk's rows run as cross-entropy rows with a per-row
  // coefficient between a slot-gathering and a slot-fixup kernel (distill_rows.cu). Duplicate ids (K = 6 of
  // V = 11), masked and ignored rows, every reduction and output, w_hard or w_soft zero, and a vocabulary of
  // three cluster segments (V = 60,000 bf16 rows on Hopper).
  for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
    TopKCfg cfg;
    cfg.k = 6;
    cfg.r.w_hard = 0.5;
    cfg.r.red = red;
    EXPECT_TRUE(check_cuda(topk_case(std::string("cfltopk_ce_fkl") + red_name(red), cfg)));
  }
  for (double beta : {0.0, 0.5, 1.0}) {
    TopKCfg cfg;
    cfg.k = 6;
    cfg.r.beta = beta;
    cfg.r.normalize = true;
    cfg.r.w_hard = 0.75;
    EXPECT_TRUE(check_cuda(topk_case("cfltopk_ce_norm" + std::to_string(beta), cfg)));
  }
  for (double wh : {0.0, 1.0}) {
    TopKCfg cfg;
    cfg.k = 5;
    cfg.r.w_hard = wh;
    cfg.r.w_soft = 1.0 - wh;
    cfg.chunk = 4;
    EXPECT_TRUE(check_cuda(topk_case("cfltopk_ce_w" + std::to_string(wh), cfg)));
  }
  for (Out what : {Out::PerRow, Out::Hard, Out::Soft, Out::Lse}) {
    TopKCfg cfg;
    cfg.k = 6;
    cfg.r.w_hard = 0.25;
    cfg.what = what;
    EXPECT_TRUE(check_cuda(topk_case("cfltopk_ce_out" + std::to_string(int(what)), cfg)));
  }
  TopKCfg wide;
  wide.n = 5;
  wide.h = 3;
  wide.v = 60000;
  wide.k = 64;
  wide.chunk = 2;
  wide.r.w_hard = 0.5;
  wide.dt = DType::BF16;
  LossCase c = topk_case("cfltopk_ce_wide", wide);
  CudaTol tol;
  loosen_for(wide.dt, c, tol);
  tol.finite_differences = false;               // 180k weight entries
  tol.cpu_grad = std::max(tol.cpu_grad, 2e-6);  // as CrossEntropyGpt2Vocabulary: dhidden's long sums
  EXPECT_TRUE(check_cuda(c, tol));
}

TEST_F(CudaFused, TopKSparse) {
  // normalize_topk, w_hard = 0: K dot products per row and K-sparse gradient updates. beta = 0 (forward KL)
  // takes the one-pass kernel (sparse_forward_kl: logits, loss and dhidden as an online softmax-weighted sum
  // of the weight rows), at T = 1 (the teacher's top-K as given) and T = 2 (renormalized); beta = 0.3 the
  // gather, the gathered row loss and the scatter.
  for (double beta : {0.3, 0.0})
    for (DType dt : {DType::F32, DType::BF16})
      for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None})
        for (int64_t chunk : chunk_sizes(7)) {
          TopKCfg cfg;
          cfg.r.normalize = true;
          cfg.r.beta = beta;
          cfg.r.t = red == Reduction::Sum ? 2.0 : 1.0;
          cfg.r.red = red;
          cfg.dt = dt;
          cfg.chunk = chunk;
          cfg.h = 16;  // vectorized gather for bf16 (H a multiple of 8)
          // No 16-bit logits gradient on this path (gather and scatter work in f32): the default tolerances
          // hold for bf16 storage too.
          EXPECT_TRUE(check_cuda(topk_case(
              std::string("cfltopk_sparse_") + (beta == 0.0 ? "fkl_" : "") + dtype_name(dt) + red_name(red),
              cfg)));
        }
  // H = 5: the unvectorized dhidden and dW kernels.
  TopKCfg odd;
  odd.r.normalize = true;
  odd.r.beta = 0.7;
  odd.h = 5;
  EXPECT_TRUE(check_cuda(topk_case("cfltopk_sparse_h5", odd)));
  // H = 2056: the dW kernel's column tiles (2048 columns per tile for 16-bit rows, 1024 for f32) and a
  // partial last tile.
  for (double beta : {0.5, 0.0})
    for (DType dt : {DType::F32, DType::BF16}) {
      TopKCfg wide;
      wide.r.normalize = true;
      wide.r.beta = beta;
      wide.dt = dt;
      wide.h = 2056;  // the one-pass kernel with 257 column groups (288 threads, the last warp mostly idle)
      EXPECT_TRUE(check_cuda(topk_case(
          std::string("cfltopk_sparse_wide_") + (beta == 0.0 ? "fkl_" : "") + dtype_name(dt), wide)));
    }
}

TEST_F(CudaFused, TopKSparseIsBitwiseChunkIndependent) {
  // dW accumulates per vocabulary entry in row order: the same bits for every chunk size.
  for (int64_t k : {int64_t(3), int64_t(40)}) {  // K = 40 > V / 2: many repeated ids per row and column
    GraphResult first;
    for (int64_t chunk : {int64_t(1), int64_t(3), int64_t(16)}) {
      CompareCase c;
      c.name = "cfltopk_bitwise" + std::to_string(k);  // the same name: the same input values
      c.inputs = {{{16, 24}, DType::F32, true, -2, 2},    {{50, 24}, DType::F32, true},
                  {{50}, DType::F32, true, -0.5, 0.5},    {{16, k}, DType::I32, false, 0, 50},
                  {{16, k}, DType::F32, false, -4, -0.1}, {{16}, DType::I32, false, -1, 50}};
      c.build = [chunk](Context& ctx, const std::vector<Tensor*>& in) {
        TopKDistillOptions o;
        o.normalize_topk = true;
        o.ignore_index = -1;
        return fused_linear_topk_kd(ctx, in[0], in[1], in[2], in[3], in[4], nullptr, in[5], o, chunked(chunk))
            .loss;
      };
      const GraphResult r = run_graph(cuda_backend(), c);
      ASSERT_EQ(r.grads.size(), 3u);
      if (chunk == 1) {
        first = r;
        continue;
      }
      EXPECT_EQ(r.out, first.out) << "K " << k << " chunk " << chunk;
      for (size_t i = 0; i < r.grads.size(); ++i)
        EXPECT_EQ(r.grads[i], first.grads[i]) << "gradient " << i << ", K " << k << " chunk " << chunk;
    }
  }
}

// ---- online distillation, entropy, selective log-softmax ----------------------------------------------

LossCase distill_case(const std::string& name, DistillRef r, DType dt, int64_t chunk, Out what = Out::Loss) {
  const int64_t n = 7, h = 4, ht = 6, v = 11;
  r.ignore = -1;
  LossCase c;
  c.name = name;
  c.inputs = {hidden_in(n, h, dt),
              weight_in(v, h, dt),
              bias_in(v, dt),
              LossInput({n, ht}, dt, false, -1, 1),
              LossInput({v, ht}, dt, false, -1, 1),
              LossInput({v}, dt, false, -0.5, 0.5),
              LossInput({n}, DType::I32, false, -1, double(v))};
  c.build = [r, chunk, what](Context& ctx, const std::vector<Tensor*>& in) {
    DistillOptions o;
    o.divergence = r.div;
    o.beta = float(r.beta);
    o.skew_alpha = float(r.alpha);
    o.temperature = float(r.t);
    o.w_hard = float(r.w_hard);
    o.w_soft = float(r.w_soft);
    o.ignore_index = r.ignore;
    o.reduction = r.red;
    o.return_lse = what == Out::Lse;
    o.return_parts = what == Out::Hard || what == Out::Soft;
    return pick(fused_linear_distill(ctx, in[0], in[1], in[2], in[3], in[4], in[5], in[6], o, chunked(chunk)),
                what);
  };
  c.reference = [r, what](const std::vector<Ref>& in) {
    return distill_ref(head_ref(in[0], in[1], &in[2]), head_ref(in[3], in[4], &in[5]), ints(in[6]), r, what);
  };
  c.check_grad = what == Out::Loss;
  return c;
}

TEST_F(CudaFused, OnlineTeacherDistill) {
  for (DType dt : {DType::F32, DType::BF16})
    for (double beta : {0.0, 0.5})
      for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None})
        for (int64_t chunk : {int64_t(1), int64_t(3), int64_t(7)}) {
          DistillRef r;
          r.beta = beta;
          r.t = 2.0;
          r.w_hard = 0.25;
          r.red = red;
          LossCase c = distill_case(std::string("cfldist_") + dtype_name(dt) + std::to_string(beta) +
                                        red_name(red) + std::to_string(chunk),
                                    r, dt, chunk);
          CudaTol tol;
          loosen_for(dt, c, tol);
          EXPECT_TRUE(check_cuda(c, tol));
        }
  for (Out what : {Out::Hard, Out::Soft, Out::Lse}) {
    DistillRef r;
    r.beta = 0.5;
    r.w_hard = 0.5;
    EXPECT_TRUE(check_cuda(distill_case("cfldist_out" + std::to_string(int(what)), r, DType::F32, 3, what)));
  }
}

// TVD and the skew KLs in both fused distillation losses: top-K dense (Q over V, or a hard loss), top-K
// K-sparse (normalize_topk, no hard loss), and full vocabulary against an online teacher.
TEST_F(CudaFused, Divergences) {
  int i = 0;
  for (const DivCase& d : div_cases()) {
    for (bool normalize : {false, true})
      for (double w_hard : {0.0, 0.5}) {
        TopKCfg cfg;
        cfg.r.div = d.div;
        cfg.r.alpha = d.alpha;
        cfg.r.t = i % 2 ? 2.0 : 1.0;
        cfg.r.normalize = normalize;
        cfg.r.w_hard = w_hard;
        cfg.r.red = std::array{Reduction::Mean, Reduction::Sum, Reduction::None}[size_t(i++ % 3)];
        cfg.labels = w_hard > 0 || i % 2 == 0;
        LossCase c = topk_case(std::string("cfltopk_") + d.name + (normalize ? "_norm" : "") +
                                   (w_hard > 0 ? "_hard" : "") + red_name(cfg.r.red),
                               cfg);
        c.fwd_tol = 1e-8;  // small divergences (see the CPU suite's FusedLinearTopK.Divergences)
        EXPECT_TRUE(check_cuda(c));
      }
    for (DType dt : {DType::F32, DType::BF16}) {
      DistillRef r;
      r.div = d.div;
      r.alpha = d.alpha;
      r.t = 2.0;
      r.w_hard = 0.25;
      r.red = std::array{Reduction::Mean, Reduction::Sum, Reduction::None}[size_t(i++ % 3)];
      LossCase c =
          distill_case(std::string("cfldist_") + d.name + dtype_name(dt) + red_name(r.red), r, dt, 3);
      CudaTol tol;
      loosen_for(dt, c, tol);
      EXPECT_TRUE(check_cuda(c, tol));
    }
  }
}

TEST_F(CudaFused, Entropy) {
  for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
    LossCase c;
    c.name = std::string("cflent_") + red_name(red);
    c.inputs = {hidden_in(7, 5), weight_in(11, 5), bias_in(11)};
    c.build = [red](Context& ctx, const std::vector<Tensor*>& in) {
      return fused_linear_entropy(ctx, in[0], in[1], in[2], 1.5f, red, chunked(3));
    };
    c.reference = [red](const std::vector<Ref>& in) {
      return entropy_ref(head_ref(in[0], in[1], &in[2]), 1.5, red);
    };
    EXPECT_TRUE(check_cuda(c));
  }
}

TEST_F(CudaFused, SelectiveLogSoftmax) {
  // Forward, and the recomputing backward (FusedLinearBack) with a per-element upstream gradient.
  for (DType dt : {DType::F32, DType::BF16}) {
    const int64_t k = 3;
    LossCase c;
    c.name = std::string("cflsel_") + dtype_name(dt);
    c.inputs = {hidden_in(7, 5, dt), weight_in(11, 5, dt), bias_in(11, dt),
                LossInput({7, k}, DType::I64, false, 0, 11)};
    c.build = [](Context& ctx, const std::vector<Tensor*>& in) {
      return fused_linear_selective_log_softmax(ctx, in[0], in[1], in[2], in[3], chunked(3));
    };
    c.reference = [k](const std::vector<Ref>& in) {
      return selective_ref(head_ref(in[0], in[1], &in[2]), ints(in[3]), k);
    };
    CudaTol tol;
    loosen_for(dt, c, tol);
    EXPECT_TRUE(check_cuda(c, tol));
  }
}

// ---- memory and errors --------------------------------------------------------------------------------

TEST_F(CudaFused, PeakMemoryWithinBudget) {
  // N·V f32 logits would be 412 MiB; a 32 MiB budget gives 163-row chunks. What the forward + backward
  // allocates beyond the graph's own buffers (inputs, gradients, the arena) must be the budget plus
  // per-row vectors and the allocator's 2 MiB rounding.
  const int64_t n = 2048, h = 256, v = 50257;
  const size_t budget = size_t(32) << 20;
  const size_t extra = fused_ce_peak_extra(DType::F32, DType::F32, budget, n, h, v, "cfl_peak");
  const size_t bound = budget + size_t(4 * n * h) * sizeof(float) + (size_t(8) << 20);
  EXPECT_LE(extra, bound) << "peak extra " << extra << " bytes, budget " << budget;
  EXPECT_LT(extra, size_t(n * v) * sizeof(float) / 4);
  // The automatic budget (0): an eighth of the free memory, at most 1 GiB; here the whole [N, Vp] f32
  // logits (412 MiB) fit when the device has 3.3 GB or more free.
  const size_t auto_extra = fused_ce_peak_extra(DType::F32, DType::F32, 0, n, h, v, "cfl_peak_auto");
  EXPECT_LE(auto_extra, kFusedLinearAutoMaxGpu + size_t(4 * n * h) * sizeof(float) + (size_t(8) << 20));
  std::printf("automatic budget: peak extra %.1f MiB\n", double(auto_extra) / double(1 << 20));
}

void expect_device_error(Graph& g, const std::vector<std::string>& parts) {
  Backend& be = cuda_backend();
  g.compute();
  const std::string msg = error_of([&] { be.synchronize(); });
  for (const std::string& p : parts)
    EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  EXPECT_NO_THROW(be.synchronize());  // reported once, then cleared
}

TEST_F(CudaFused, BadLabelsAndIdsRaiseErrors) {
  Backend& be = cuda_backend();
  Context ctx(be);
  Tensor* x = ctx.input(DType::F32, {4, 3}, "hidden");
  set_data(x, std::vector<float>(12, 0.25f));
  Tensor* w = ctx.input(DType::F32, {6, 3}, "weight");
  set_data(w, std::vector<float>(18, 0.5f));
  Tensor* y = ctx.input(DType::I32, {4}, "labels");
  {
    Tensor* loss = fused_linear_cross_entropy(ctx, x, w, nullptr, y).loss;
    loss->flags |= kOutput;
    Graph g(ctx);
    g.forward(loss);
    set_data_int(y, {0, 9, 5, 3});
    expect_device_error(g, {"fused_linear_cross_entropy", "label 9", "[0, 6)"});
    set_data_int(y, {0, -100, 5, 3});
    g.compute();
    EXPECT_NEAR(get_data(loss)[0], std::log(6.0), 1e-6);  // equal logits: log V per valid row
  }
  {  // top-K, sparse path: an id out of range in a valid slot
    Tensor* ids = ctx.input(DType::I32, {4, 2}, "ids");
    set_data_int(ids, {0, 1, 2, 3, 4, 6, 5, 5});
    Tensor* lp = ctx.input(DType::F32, {4, 2}, "lp");
    set_data(lp, std::vector<float>(8, -1.0f));
    TopKDistillOptions o;
    o.normalize_topk = true;
    Tensor* loss = fused_linear_topk_kd(ctx, x, w, nullptr, ids, lp, nullptr, nullptr, o).loss;
    loss->flags |= kOutput;
    Graph g(ctx);
    g.forward(loss);
    expect_device_error(g, {"fused_linear_topk_kd", "id 6", "[0, 6)"});
  }
  {
    Tensor* ids = ctx.input(DType::I32, {4, 2}, "sel_ids");
    set_data_int(ids, {0, 1, 2, -2, 4, 5, 5, 5});
    Tensor* out = fused_linear_selective_log_softmax(ctx, x, w, nullptr, ids);
    out->flags |= kOutput;
    Graph g(ctx);
    g.forward(out);
    expect_device_error(g, {"fused_linear_selective_log_softmax", "id -2", "[0, 6)"});
  }
}

TEST_F(CudaFused, NonFiniteTeacherLogprobsRaiseErrors) {
  // The chunk loop checks the slots once before any path runs (the K-sparse kernels read them unchecked):
  // a NaN or +inf in a valid slot is an error on the dense path (normalize_topk off) and the sparse one (on);
  // in a masked slot it is padding.
  Backend& be = cuda_backend();
  Context ctx(be);
  Tensor* x = ctx.input(DType::F32, {4, 3}, "hidden");
  set_data(x, std::vector<float>(12, 0.25f));
  Tensor* w = ctx.input(DType::F32, {6, 3}, "weight");
  set_data(w, std::vector<float>(18, 0.5f));
  Tensor* ids = ctx.input(DType::I32, {4, 2}, "ids");
  set_data_int(ids, {0, 1, 2, 3, 4, 5, 5, 0});
  Tensor* mask = ctx.input(DType::I32, {4, 2}, "mask");
  set_data_int(mask, {1, 1, 1, 1, 1, 0, 1, 1});
  Tensor* lp = ctx.input(DType::F32, {4, 2}, "lp");
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    std::vector<float> lpv(8, -1.0f);
    lpv[5] = bad;  // row 2, slot 1
    set_data(lp, lpv);
    for (bool normalize : {false, true}) {
      SCOPED_TRACE(std::to_string(bad) + (normalize ? " sparse" : " dense"));
      TopKDistillOptions o;
      o.normalize_topk = normalize;
      Tensor* loss = fused_linear_topk_kd(ctx, x, w, nullptr, ids, lp, nullptr, nullptr, o).loss;
      loss->flags |= kOutput;
      Graph g(ctx);
      g.forward(loss);
      expect_device_error(g, {"fused_linear_topk_kd", "teacher logprob", "row 2 slot 1"});
      Tensor* masked = fused_linear_topk_kd(ctx, x, w, nullptr, ids, lp, mask, nullptr, o).loss;
      masked->flags |= kOutput;
      Graph gm(ctx);
      gm.forward(masked);
      gm.compute();
      EXPECT_NO_THROW(be.synchronize());
      EXPECT_TRUE(std::isfinite(get_data(masked)[0]));
    }
  }
}

}  // namespace
}  // namespace retort::test
