// The fused layers on the CPU: the shared case lists (fused_layer_cases.h) for every output dtype, equality
// with the unfused compositions they replace (f32 forward bit for bit), deterministic weight gradients, and
// bad input.
#include <gtest/gtest.h>

#include <cmath>

#include "expect_error.h"
#include "fused_layer_cases.h"
#include "harness.h"

namespace retort::test {
namespace {

TEST(FusedLayers, RmsNormAffineEveryCase) {
  for (const RowShape& s : fused_layer_shapes())
    for (DType out : {DType::F32, DType::BF16, DType::F16}) {
      EXPECT_TRUE(run_case(rms_norm_affine_case(s, out, false))) << s.name;
      EXPECT_TRUE(run_case(rms_norm_affine_case(s, out, true))) << s.name;
    }
}

TEST(FusedLayers, SwigluEveryCase) {
  for (const RowShape& s : fused_layer_shapes())
    for (DType in : {DType::F32, DType::BF16, DType::F16})
      for (DType out : {DType::F32, DType::BF16, DType::F16})
        EXPECT_TRUE(run_case(swiglu_case(s, in, out))) << s.name;
}

TEST(FusedLayers, MatmulLowpWith16BitResult) {
  for (DType dt : {DType::BF16, DType::F16})
    for (DType out : {DType::F32, dt}) {
      EXPECT_TRUE(run_case(matmul_lowp_case(37, 64, 19, dt, out)));
      EXPECT_TRUE(run_case(matmul_lowp_case(1, 9, 130, dt, out)));
    }
  Context ctx(default_cpu_backend());
  Tensor* a = ctx.input(DType::BF16, {4, 8}, "a");
  expect_error([&] { matmul_lowp(ctx, a, a, false, true, DType::F16); }, {"matmul_lowp", "f32 or the operands"});
}

// Forward outputs and every parameter's gradient of `build` over fresh inputs shaped like `shapes`, with a
// random linear loss on each output.
template <typename F>
std::vector<Vec> run_graph(const std::vector<Shape>& shapes, F&& build) {
  reseed("fused_vs_unfused");
  Context ctx(default_cpu_backend());
  std::vector<Tensor*> in;
  for (size_t i = 0; i < shapes.size(); ++i) {
    Tensor* t = ctx.param(DType::F32, shapes[i], "in" + std::to_string(i));
    Vec x = random_vec(t->nelements(), 0.5, 1.5);
    set_data(t, std::vector<float>(x.begin(), x.end()));
    in.push_back(t);
  }
  std::vector<Tensor*> outs = build(ctx, in);
  Graph g(ctx);
  Tensor* loss = nullptr;
  for (Tensor* o : outs) {
    o->flags |= kOutput;
    g.forward(o);
    Tensor* w = ctx.input(DType::F32, o->shape(), "w");
    Vec wv = random_vec(w->nelements());
    set_data(w, std::vector<float>(wv.begin(), wv.end()));
    Tensor* l = sum(ctx, mul(ctx, o->dtype == DType::F32 ? o : cast(ctx, o, DType::F32), w));
    loss = loss ? add(ctx, loss, l) : l;
  }
  g.backward(loss);
  g.set_poison(true);
  g.compute();
  std::vector<Vec> r;
  for (Tensor* o : outs) r.push_back(to_f64(get_data(o)));
  for (Tensor* t : in) r.push_back(to_f64(get_data(g.grad(t))));
  return r;
}

// add_rms_norm against add, rms_norm and mul: the forward bit for bit in f32 (same arithmetic in the same
// order), the gradients to f32 rounding (the fused backward sums in another order).
TEST(FusedLayers, AddRmsNormEqualsTheUnfusedComposition) {
  const std::vector<Shape> shapes = {{6, 33}, {6, 33}, {33}};
  const float eps = 1e-6f;
  const auto fused = run_graph(shapes, [&](Context& ctx, const std::vector<Tensor*>& x) {
    const AddRmsNorm r = add_rms_norm(ctx, x[0], x[1], x[2], eps, DType::F32);
    return std::vector<Tensor*>{r.y, r.sum};
  });
  const auto plain = run_graph(shapes, [&](Context& ctx, const std::vector<Tensor*>& x) {
    Tensor* s = add(ctx, x[0], x[1]);
    return std::vector<Tensor*>{mul(ctx, rms_norm(ctx, s, eps), x[2]), s};
  });
  ASSERT_EQ(fused.size(), plain.size());
  EXPECT_EQ(fused[0], plain[0]) << "y";
  EXPECT_EQ(fused[1], plain[1]) << "sum";
  for (size_t i = 2; i < fused.size(); ++i) EXPECT_LE(nmse(fused[i], plain[i]), 1e-12) << "gradient " << i - 2;
}

TEST(FusedLayers, SwigluEqualsTheUnfusedComposition) {
  const std::vector<Shape> shapes = {{5, 70}, {5, 70}};
  const auto fused = run_graph(shapes, [&](Context& ctx, const std::vector<Tensor*>& x) {
    return std::vector<Tensor*>{swiglu(ctx, x[0], x[1], DType::F32)};
  });
  const auto plain = run_graph(shapes, [&](Context& ctx, const std::vector<Tensor*>& x) {
    return std::vector<Tensor*>{mul(ctx, silu(ctx, x[0]), x[1])};
  });
  ASSERT_EQ(fused.size(), plain.size());
  for (size_t i = 0; i < fused.size(); ++i) EXPECT_LE(nmse(fused[i], plain[i]), 1e-12) << "output " << i;
}

// The weight's gradient is summed in a fixed order: the same bits on 1 and 2 threads.
TEST(FusedLayers, WeightGradientDoesNotDependOnThreads) {
  auto run = [](int threads) {
    reseed("norm_dw_threads");
    CpuBackend be(threads);
    Context ctx(be);
    Tensor* x = ctx.param(DType::F32, {300, 70}, "x");
    Tensor* w = ctx.param(DType::F32, {70}, "w");
    for (Tensor* t : {x, w}) {
      Vec v = random_vec(t->nelements());
      set_data(t, std::vector<float>(v.begin(), v.end()));
    }
    Graph g(ctx);
    g.backward(sum(ctx, rms_norm_affine(ctx, x, w, 1e-5f, DType::BF16)));
    g.compute();
    return get_data(g.grad(w));
  };
  EXPECT_EQ(run(1), run(2));
}

TEST(FusedLayers, BadInput) {
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.input(DType::F32, {4, 8}, "x");
  Tensor* w = ctx.input(DType::F32, {8}, "w");
  Tensor* w7 = ctx.input(DType::F32, {7}, "w7");
  Tensor* d5 = ctx.input(DType::F32, {5, 8}, "d5");
  Tensor* ids = ctx.input(DType::I32, {4, 8}, "ids");
  Tensor* up = ctx.input(DType::BF16, {4, 9}, "up");
  expect_error([&] { rms_norm_affine(ctx, x, w7, 1e-5f, DType::BF16); },
               {"rms_norm_affine", "f32[7]", "f32[4, 8]", "[8]"});
  expect_error([&] { rms_norm_affine(ctx, ids, w, 1e-5f, DType::BF16); }, {"rms_norm_affine", "float"});
  expect_error([&] { rms_norm_affine(ctx, x, w, 0.0f, DType::BF16); }, {"rms_norm_affine", "eps"});
  expect_error([&] { rms_norm_affine(ctx, x, w, 1e-5f, DType::I32); }, {"rms_norm_affine", "output dtype"});
  expect_error([&] { rms_norm_affine(ctx, x, nullptr, 1e-5f, DType::F32); }, {"rms_norm_affine", "null"});
  expect_error([&] { add_rms_norm(ctx, x, d5, w, 1e-5f, DType::BF16); },
               {"add_rms_norm", "delta", "f32[5, 8]", "shaped like x"});
  expect_error([&] { add_rms_norm(ctx, x, nullptr, w, 1e-5f, DType::BF16); }, {"add_rms_norm", "delta is null"});
  expect_error([&] { swiglu(ctx, x, up, DType::BF16); }, {"swiglu", "same shape", "bf16[4, 9]"});
  expect_error([&] { swiglu(ctx, ids, ids, DType::BF16); }, {"swiglu", "float"});
  expect_error([&] { swiglu(ctx, x, x, DType::I64); }, {"swiglu", "output dtype"});
}

}  // namespace
}  // namespace retort::test
