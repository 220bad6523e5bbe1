// The fused layers on the GPU: the shared case lists (tests/ops/fused_layer_cases.h) against the float64
// reference and central differences; CUDA against the CPU kernels on training-sized rows (the reductions run
// in another order, so agreement is to f32 rounding, or to one 16-bit rounding where the output is 16-bit);
// the same bits twice (no atomics in the weight gradient); a 16-bit transformer's loss and gradients against
// the CPU's.
#include <gtest/gtest.h>

#include "cuda_test_util.h"
#include "fused_layer_cases.h"

namespace retort::test {
namespace {

class CudaFusedLayers : public CudaTest {};

TEST_F(CudaFusedLayers, EveryCase) {
  for (const RowShape& s : fused_layer_shapes()) {
    for (DType out : {DType::F32, DType::BF16, DType::F16}) {
      EXPECT_TRUE(run_case(rms_norm_affine_case(s, out, false), &cuda_backend())) << s.name;
      EXPECT_TRUE(run_case(rms_norm_affine_case(s, out, true), &cuda_backend())) << s.name;
    }
    for (DType in : {DType::F32, DType::BF16, DType::F16})
      for (DType out : {DType::F32, DType::BF16})
        EXPECT_TRUE(run_case(swiglu_case(s, in, out), &cuda_backend())) << s.name;
  }
}

TEST_F(CudaFusedLayers, MatmulLowpWith16BitResult) {
  for (DType dt : {DType::BF16, DType::F16})
    for (DType out : {DType::F32, dt}) {
      EXPECT_TRUE(run_case(matmul_lowp_case(37, 64, 19, dt, out), &cuda_backend()));
      EXPECT_TRUE(run_case(matmul_lowp_case(1, 9, 130, dt, out), &cuda_backend()));
      EXPECT_TRUE(run_case(matmul_lowp_case(96, 256, 160, dt, out), &cuda_backend()));
    }
}

CompareCase norm_case(const Shape& shape, DType out, bool with_delta) {
  CompareCase c;
  c.name = std::string("cuda_add_rms_norm_") + dtype_name(out);
  const int64_t n = shape.back();
  c.inputs = {{shape, DType::F32}, {{n}, DType::F32, true, 0.5, 1.5}};
  if (with_delta) c.inputs.push_back({shape, DType::F32});
  c.build = [out, with_delta](Context& ctx, const std::vector<Tensor*>& x) {
    if (!with_delta) return rms_norm_affine(ctx, x[0], x[1], 1e-5f, out);
    const AddRmsNorm r = add_rms_norm(ctx, x[0], x[2], x[1], 1e-5f, out);
    return mul(ctx, r.sum, r.y);
  };
  // One rounding of a 16-bit output apart at most (the row sums differ in order, so a value near a rounding
  // boundary may round the other way); f32 to summation order.
  c.tol = out == DType::F32 ? 1e-11 : out == DType::BF16 ? 2e-5 : 2e-7;
  c.grad_tol = out == DType::F32 ? 1e-10 : 1e-5;
  return c;
}

CompareCase swiglu_compare(const Shape& shape, DType in, DType out) {
  CompareCase c;
  c.name = std::string("cuda_swiglu_") + dtype_name(in) + "_" + dtype_name(out);
  c.inputs = {{shape, in, true, -4.0, 4.0}, {shape, in}};
  c.build = [out](Context& ctx, const std::vector<Tensor*>& x) { return swiglu(ctx, x[0], x[1], out); };
  // The device's fast exp is a few ulp from the CPU's.
  c.tol = out == DType::F32 ? 1e-11 : out == DType::BF16 ? 2e-5 : 2e-7;
  c.grad_tol = in == DType::F32 ? 1e-10 : in == DType::BF16 ? 2e-5 : 2e-7;
  return c;
}

TEST_F(CudaFusedLayers, MatchesTheCpuOnTrainingShapes) {
  for (const Shape& shape : {Shape{1024, 512}, Shape{300, 384}, Shape{7, 2048}}) {
    for (DType out : {DType::F32, DType::BF16}) {
      EXPECT_TRUE(compare_with_cpu(norm_case(shape, out, true))) << shape[0];
      EXPECT_TRUE(compare_with_cpu(norm_case(shape, out, false))) << shape[0];
    }
    for (DType in : {DType::F32, DType::BF16}) EXPECT_TRUE(compare_with_cpu(swiglu_compare(shape, in, in)));
  }
}

TEST_F(CudaFusedLayers, RunsTwiceToTheSameBits) {
  for (const CompareCase& c : {norm_case({2000, 512}, DType::BF16, true), swiglu_compare({64, 1376}, DType::BF16,
                                                                                         DType::BF16)}) {
    const GraphResult a = run_graph(cuda_backend(), c), b = run_graph(cuda_backend(), c);
    EXPECT_EQ(a.out, b.out) << c.name;
    ASSERT_EQ(a.grads.size(), b.grads.size());
    for (size_t i = 0; i < a.grads.size(); ++i) EXPECT_EQ(a.grads[i], b.grads[i]) << c.name << " gradient " << i;
  }
}

// A 2-layer bf16 transformer (the fused path) on both backends: logits and the loss's gradients agree.
TEST_F(CudaFusedLayers, Bf16TransformerMatchesTheCpu) {
  TransformerConfig cfg;
  cfg.vocab = 97;
  cfg.context = 32;
  cfg.layers = 2;
  cfg.d_model = 64;
  cfg.heads = 4;
  cfg.kv_heads = 2;
  cfg.compute_dtype = DType::BF16;
  auto run = [&](Backend& be) {
    Context ctx(be);
    Transformer model(ctx, cfg, 7);
    Tensor* tokens = ctx.input(DType::I32, {2, 24}, "tokens");
    Tensor* targets = ctx.input(DType::I32, {2, 24}, "targets");
    reseed("cuda_fused_transformer");
    set_data_int(tokens, random_ints(48, 0, cfg.vocab));
    set_data_int(targets, random_ints(48, 0, cfg.vocab));
    Tensor* loss = lm_loss(ctx, model.forward(ctx, tokens), targets);
    loss->flags |= kOutput;
    Graph g(ctx);
    g.backward(loss);
    g.compute();
    std::vector<Vec> r{to_f64(get_data(loss))};
    for (Tensor* p : model.parameters()) r.push_back(to_f64(get_data(g.grad(p))));
    return r;
  };
  const std::vector<Vec> cpu = run(default_cpu_backend()), gpu = run(cuda_backend());
  ASSERT_EQ(cpu.size(), gpu.size());
  EXPECT_NEAR(cpu[0][0], gpu[0][0], 2e-3 * std::abs(cpu[0][0]));
  // bf16 activations on both sides, rounded at different points by different GEMMs: a few bf16 roundings.
  for (size_t i = 1; i < cpu.size(); ++i) EXPECT_LE(nmse(gpu[i], cpu[i]), 1e-3) << "parameter " << i - 1;
}

}  // namespace
}  // namespace retort::test
