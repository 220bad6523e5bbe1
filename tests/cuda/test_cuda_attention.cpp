// flash_attention on the GPU: the shared case list (tests/ops/attention_cases.h) in bf16 and f16 against the
// float64 reference and central differences; CUDA against the CPU kernel on larger shapes (several tiles, GQA,
// causal and not, a KV-cache offset, T not a multiple of 64); the same result twice (no atomics); and the
// errors for what the kernels do not take.
#include <gtest/gtest.h>

#include <cmath>

#include "attention_cases.h"
#include "cuda_test_util.h"

namespace retort::test {
namespace {

class CudaAttention : public CudaTest {};

TEST_F(CudaAttention, EveryCaseBF16AndF16) {
  for (const AttentionShape& s : attention_shapes()) {
    EXPECT_TRUE(run_case(attention_case(s, DType::BF16), &cuda_backend())) << s.name << " bf16";
    EXPECT_TRUE(run_case(attention_case(s, DType::F16), &cuda_backend())) << s.name << " f16";
  }
}

// Head dim 64 has two forward kernels on Hopper: wgmma (the default there) and the mma.sync one every other
// device runs. Both take the case list, and agree with each other within their roundings.
TEST_F(CudaAttention, BothForwardKernelsAtHeadDim64) {
  // The softmax-epilogue GEMM's condition (an sm_90a build, a compute-capability-9.0 device) is this one's.
  const bool hopper = cuda_softmax_epilogue_stats(cuda_backend()).supported;
  EXPECT_EQ(cuda_hopper_attention(cuda_backend()), hopper);
  std::printf("[ info ] wgmma attention forward %s here\n", hopper ? "runs" : "does not run");
  CudaOptions portable;
  portable.hopper_attention = false;
  auto mma_sync = make_cuda_backend(0, portable);
  for (const AttentionShape& s : attention_shapes()) {
    if (s.D != 64) continue;
    for (DType dt : {DType::BF16, DType::F16}) {
      EXPECT_TRUE(run_case(attention_case(s, dt), mma_sync.get())) << s.name << " mma.sync";
      EXPECT_TRUE(run_case(attention_case(s, dt), &cuda_backend())) << s.name;
    }
  }
}

CompareCase compare_case(const AttentionShape& s, DType dt) {
  CompareCase c;
  c.name = "cuda_attention_" + s.name + "_" + dtype_name(dt);
  c.inputs = {{{s.B, s.Tq, s.H, s.D}, dt}, {{s.B, s.Tk, s.KV, s.D}, dt}, {{s.B, s.Tk, s.KV, s.D}, dt}};
  const float scale = 1.0f / std::sqrt(float(s.D));
  c.build = [s, scale](Context& ctx, const std::vector<Tensor*>& x) {
    return flash_attention(ctx, x[0], x[1], x[2], scale, s.causal, s.n_past);
  };
  // Both compute in f32 from the same 16-bit inputs; they differ in summation order and in where the
  // probabilities are rounded to 16 bits (the tensor-core products take them so), so a few roundings apart.
  c.tol = dt == DType::BF16 ? 2e-5 : 1e-6;
  c.grad_tol = dt == DType::BF16 ? 1e-4 : 4e-6;
  return c;
}

TEST_F(CudaAttention, MatchesTheCpuOnLargerShapes) {
  const std::vector<AttentionShape> shapes = {
      {"t300_gqa3_d64", 2, 300, 300, 6, 2, 64},
      {"t257_mha_d128", 1, 257, 257, 4, 4, 128},
      {"t200_noncausal_d32", 2, 200, 150, 4, 1, 32},
      {"kv_cache_d64", 2, 40, 333, 8, 1, 64, true, 293},
      {"t130_gqa8_d96", 1, 130, 130, 8, 1, 96},
  };
  for (const AttentionShape& s : shapes)
    for (DType dt : {DType::BF16, DType::F16}) EXPECT_TRUE(compare_with_cpu(compare_case(s, dt))) << s.name;
}

TEST_F(CudaAttention, RunsTwiceToTheSameBits) {
  const CompareCase c = compare_case({"twice", 2, 190, 190, 4, 2, 64}, DType::BF16);
  const GraphResult a = run_graph(cuda_backend(), c), b = run_graph(cuda_backend(), c);
  EXPECT_EQ(a.out, b.out);
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i) EXPECT_EQ(a.grads[i], b.grads[i]) << "gradient " << i;
}

TEST_F(CudaAttention, RefusesWhatTheKernelsDoNotTake) {
  for (auto [dt, d, what] : {std::tuple{DType::F32, int64_t(64), "bf16 or f16"},
                             std::tuple{DType::BF16, int64_t(48), "head dim D must be"}}) {
    Context ctx(cuda_backend());
    Tensor* q = ctx.input(dt, {1, 4, 2, d}, "q");
    Tensor* k = ctx.input(dt, {1, 4, 1, d}, "k");
    Graph g(ctx);
    g.forward(flash_attention(ctx, q, k, k, 0.125f));
    const std::string m = error_of([&] { g.compute(); });
    EXPECT_NE(m.find("flash_attention"), std::string::npos) << m;
    EXPECT_NE(m.find(what), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace retort::test
