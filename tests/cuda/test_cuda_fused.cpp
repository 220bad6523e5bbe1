// The fused linear losses on CUDA (src/cuda/loss/cuda_chunk_exec.cu, cuda_fused_ops.cu) beyond their case
// lists (tests/ops/loss_cases_fused_*.cpp, run here by test_cuda_loss_cases.cpp against the CPU and the
// float64 references): which path ran the list's softmax-epilogue cases (its counters), the epilogue's two
// schedules agreeing, bitwise chunk-size independence on the K-sparse top-K path, peak device memory within
// the budget, and bad labels / ids / teacher logprobs raising retort::Error. Every graph runs with poisoned
// memory, so an output element the device never writes shows up as NaN.
#include <gtest/gtest.h>

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
      EXPECT_TRUE(check_cuda(c, false));
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
    return fused_linear_cross_entropy(ctx, in[0], in[1], nullptr, in[2], o, fused_chunks(chunk)).loss;
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

// Top-K forward KL at T = 1 over the full vocabulary takes the softmax-epilogue path too (bf16, rows of 16
// bytes, no bias): the list's epilogue cases (tests/ops/loss_cases_fused_topk.cpp) run there.
TEST_F(CudaFused, SoftmaxEpilogueRunsTheTopKCases) {
  Backend& be = cuda_backend();
  const CudaSoftmaxEpilogueStats before = cuda_softmax_epilogue_stats(be);
  const bool on = epilogue_on(before);
  // 8 label / mask / reduction cases, 4 outputs, the duplicates (3 chunks each), GPT-2's vocabulary (3
  // chunks), and 16-bit logits small and at GPT-2's vocabulary (2 × 3 chunks each).
  EXPECT_EQ(run_named(fused_topk_cases(), "ftopk_epilogue"), 8u + 4 + 1 + 1 + 4);
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
  // Top-K forward KL with a hard part, K = 64 over GPT-2's vocabulary in 3 chunks (the list's case).
  EXPECT_TRUE(check_cuda_same(case_named(fused_topk_cases(), "ftopk_epilogue_gpt2"), *a, *b, 1e-10));
  EXPECT_GE(cuda_softmax_epilogue_stats(*a).chunks - a0.chunks, size_t(3 + 1 + 3));
  EXPECT_GE(cuda_softmax_epilogue_stats(*b).chunks - b0.chunks, size_t(3 + 1 + 3));
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
        return fused_linear_topk_kd(ctx, in[0], in[1], in[2], in[3], in[4], nullptr, in[5], o,
                                    fused_chunks(chunk))
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
