// fused_linear_topk_logprobs on CUDA (the chunk GEMM, then the top-K row pass of cuda_topk.cu with the row's
// LSE and target nll): every case of tests/ops/topk_head_cases.h against the float64 reference (1e-5 of the
// logits' size, as on the CPU), against the CPU backend and against the unfused composition on CUDA
// (1e-5 of the logits' size: cuBLASLt sums in another order, and the kernel sums its exp2 terms in f32 where
// the CPU sums in double; near ties may break either way, and where the logits are exact integers the ids
// must be the CPU's exactly). Outputs are poisoned before each run. Also: NaN and bad targets reported at the
// synchronize with the op and the row, K above the kernel's limit, and the peak device memory of a
// SmolLM2-sized vocabulary within the budget instead of the [N, V] logits. Without a usable device every test
// skips with the reason.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "cuda_test_util.h"
#include "topk_head_cases.h"

namespace retort::test {
namespace {

class CudaTopKHead : public CudaTest, public ::testing::WithParamInterface<HeadCase> {};
class CudaTopKHeadOps : public CudaTest {};

TEST_P(CudaTopKHead, MatchesReferenceCpuAndUnfused) {
  const HeadCase& c = GetParam();
  const HeadInput in = make_head_input(c);
  const HeadResult gpu = run_head(cuda_backend(), c, in);
  expect_matches_reference(c, gpu, head_reference(c, in), 1e-5, c.fill == HeadFill::Integers);
  const HeadResult cpu = run_head(default_cpu_backend(), c, in);
  if (c.fill == HeadFill::Integers) {
    EXPECT_EQ(gpu.ids, cpu.ids);
  }
  expect_close(c, gpu, cpu, 1e-5);
  expect_close(c, gpu, run_unfused(cuda_backend(), c, in), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaTopKHead, ::testing::ValuesIn(head_cases()),
                         [](const ::testing::TestParamInfo<HeadCase>& i) { return i.param.name; });

// A graph whose hidden, weight and targets are set by the caller, chunks of 2 rows.
struct Head {
  Context ctx{cuda_backend()};
  Tensor* h = ctx.input(DType::F32, {6, 8}, "hidden");
  Tensor* w = ctx.input(DType::F32, {10, 8}, "weight");
  Tensor* t = ctx.input(DType::I32, {6}, "targets");
  TopKLogprobsOutputs o;
  explicit Head(int64_t k) {
    FusedLinearOptions f;
    f.chunk_rows = 2;
    o = fused_linear_topk_logprobs(ctx, h, w, k, t, {}, f);
  }
};

TEST_F(CudaTopKHeadOps, NanAndBadTargetsAreReportedAtTheSynchronize) {
  std::vector<float> hv(48, 0.25f), wv(80, 0.5f);
  {
    Head m(3);
    hv[3 * 8 + 5] = std::numeric_limits<float>::quiet_NaN();
    set_data(m.h, hv);
    set_data(m.w, wv);
    set_data_int(m.t, {1, -100, 3, 9, 0, 0});
    Graph g(m.ctx);
    g.forward(m.o.logprobs);
    const std::string msg = error_of([&] {
      g.compute();
      cuda_backend().synchronize();
    });
    EXPECT_NE(msg.find("fused_linear_topk_logprobs"), std::string::npos) << msg;
    EXPECT_NE(msg.find("row 3"), std::string::npos) << msg;  // of all rows, not of the chunk
    EXPECT_NE(msg.find("NaN or +inf"), std::string::npos) << msg;
  }
  {
    Head m(3);
    hv[3 * 8 + 5] = 0.25f;
    set_data(m.h, hv);
    set_data(m.w, wv);
    set_data_int(m.t, {1, -100, 3, 10, 0, 0});
    Graph g(m.ctx);
    g.forward(m.o.logprobs);
    const std::string msg = error_of([&] {
      g.compute();
      cuda_backend().synchronize();
    });
    EXPECT_NE(msg.find("fused_linear_topk_logprobs"), std::string::npos) << msg;
    EXPECT_NE(msg.find("label 10 is outside [0, 10)"), std::string::npos) << msg;
    // The record was cleared: the same graph runs again with good targets, every row log(10) with equal
    // logits and the two ignored ones adding nothing.
    set_data_int(m.t, {1, -100, 3, 9, -100, 0});
    g.compute();
    EXPECT_NEAR(get_data(m.o.nll_sum)[0], 4 * std::log(10.0), 1e-5);
  }
}

TEST_F(CudaTopKHeadOps, KAboveTheKernelLimitThrows) {
  Context ctx(cuda_backend());
  Tensor* h = ctx.input(DType::F32, {2, 8}, "hidden");
  Tensor* w = ctx.input(DType::F32, {5000, 8}, "weight");
  const TopKLogprobsOutputs o = fused_linear_topk_logprobs(ctx, h, w, 2049, nullptr);
  Graph g(ctx);
  g.forward(o.logprobs);
  const std::string msg = error_of([&] { g.compute(); });
  EXPECT_NE(msg.find("fused_linear_topk_logprobs"), std::string::npos) << msg;
  EXPECT_NE(msg.find("K = 2049"), std::string::npos) << msg;
  EXPECT_NE(msg.find("2048"), std::string::npos) << msg;
}

TEST_F(CudaTopKHeadOps, PeakMemoryWithinTheBudget) {
  // SmolLM2's vocabulary: the [N, V] f32 logits would take 768 MiB; a 64 MiB budget holds 341 rows.
  const int64_t n = 4096, h = 576, v = 49152, k = 64;
  const size_t budget = size_t(64) << 20;
  auto be = make_cuda_backend(0);
  Context ctx(*be);
  Tensor* x = ctx.input(DType::BF16, {n, h}, "hidden");
  Tensor* w = ctx.input(DType::BF16, {v, h}, "weight");
  Tensor* t = ctx.input(DType::I32, {n}, "targets");
  reseed("topk_head_peak");
  const Vec xv = random_vec(n * h, -1, 1), wv = random_vec(v * h, -0.1, 0.1);
  set_data(x, std::vector<float>(xv.begin(), xv.end()));
  set_data(w, std::vector<float>(wv.begin(), wv.end()));
  set_data_int(t, random_ints(n, 0, v));
  FusedLinearOptions f;
  f.logits_budget = budget;
  const TopKLogprobsOutputs o = fused_linear_topk_logprobs(ctx, x, w, k, t, {}, f);
  Graph g(ctx);
  g.forward(o.logprobs);
  g.compute();  // first run: the arena and the allocator's cache
  be->synchronize();
  const CudaMemoryStats before = cuda_memory_stats(*be);
  cuda_reset_peak(*be);
  g.compute();
  be->synchronize();
  const size_t extra = cuda_memory_stats(*be).peak_bytes - before.bytes_in_use;
  // The budget, W's zero-padded copy (V is a multiple of 128 here: none), per-row vectors and slack.
  EXPECT_LE(extra, budget + (size_t(8) << 20)) << "peak extra " << extra << " bytes";
  EXPECT_TRUE(std::isfinite(get_data(o.nll_sum)[0]));
}

}  // namespace
}  // namespace retort::test
