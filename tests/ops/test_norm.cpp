// rms_norm and layer_norm over dim 0: forward against float64, gradients against central differences, eps
// that matters, strided and bf16 inputs, rows of one element, constant rows, rows far from zero, a learned
// weight applied with mul, and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <ostream>

#include "harness.h"
#include "expect_error.h"

namespace retort::test {
namespace {

using Build = Tensor* (*)(Context&, Tensor*, float);

Vec per_row(const Ref& x, double eps, void (*f)(const double*, double*, int64_t, double)) {
  Vec out(x.v.size());
  const int64_t n = x.ne[0];
  for (int64_t r = 0; r < x.size() / n; ++r) f(x.v.data() + r * n, out.data() + r * n, n, eps);
  return out;
}

void ref_rms(const double* x, double* y, int64_t n, double eps) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const double r = 1 / std::sqrt(ss / double(n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * r;
}

void ref_layer(const double* x, double* y, int64_t n, double eps) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += x[i];
  const double mu = s / double(n);
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += (x[i] - mu) * (x[i] - mu);
  const double r = 1 / std::sqrt(ss / double(n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - mu) * r;
}

Ref transposed(const Ref& x) {
  Ref t = x;
  std::swap(t.ne[0], t.ne[1]);
  for (int64_t i2 = 0; i2 < x.ne[2]; ++i2)
    for (int64_t i1 = 0; i1 < x.ne[1]; ++i1)
      for (int64_t i0 = 0; i0 < x.ne[0]; ++i0) t.at(i1, i0, i2) = x.at(i0, i1, i2);
  return t;
}

void expect_mentions(const std::string& msg, std::initializer_list<const char*> parts) {
  for (const char* p : parts)
    EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' missing from: " << msg;
}

struct Norm {
  const char* name;
  Build build;
  void (*ref)(const double*, double*, int64_t, double);
};
// Names the case in gtest's failure lines instead of dumping the struct's bytes.
std::ostream& operator<<(std::ostream& os, const Norm& p) {
  return os << p.name;
}
const Norm kNorms[] = {{"rms_norm", rms_norm, ref_rms}, {"layer_norm", layer_norm, ref_layer}};

class NormOps : public ::testing::TestWithParam<Norm> {};

OpCase norm_case(const Norm& p, const std::string& tag, Shape shape, float eps, double lo = -2,
                 double hi = 2) {
  OpCase c;
  c.name = std::string(p.name).append("_").append(tag);
  c.inputs = {{shape, DType::F32, true, lo, hi}};
  c.build = [b = p.build, eps](Context& ctx, const std::vector<Tensor*>& in) { return b(ctx, in[0], eps); };
  c.reference = [f = p.ref, eps](const std::vector<Ref>& in) { return per_row(in[0], double(eps), f); };
  c.fwd_tol = 1e-12;
  c.grad_tol = 1e-8;
  return c;
}

TEST_P(NormOps, MatchesFloat64AndFiniteDifferences) {
  const Norm& p = GetParam();
  EXPECT_TRUE(run_case(norm_case(p, "1d", {16}, 1e-6f)));
  EXPECT_TRUE(run_case(norm_case(p, "2d", {5, 12}, 1e-5f)));
  EXPECT_TRUE(run_case(norm_case(p, "3d", {2, 3, 7}, 1e-5f)));
  EXPECT_TRUE(run_case(norm_case(p, "4d", {2, 2, 3, 9}, 1e-6f)));
  EXPECT_TRUE(run_case(norm_case(p, "wide", {3, 515}, 1e-6f)));
}

TEST_P(NormOps, LargeEpsMatters) {
  // Small inputs with eps = 0.1: the eps term dominates the denominator, so a misplaced eps shows.
  EXPECT_TRUE(run_case(norm_case(GetParam(), "eps", {4, 10}, 0.1f, -0.3, 0.3)));
}

TEST_P(NormOps, TinyEps) {
  // eps itself must be > 0 (IntegerInputAndBadEpsThrow); the smallest normal float leaves the pure norm.
  EXPECT_TRUE(run_case(norm_case(GetParam(), "eps_tiny", {3, 8}, std::numeric_limits<float>::min(), 0.5, 2)));
}

TEST_P(NormOps, RowOfOneElement) {
  // rms_norm: x / sqrt(x^2 + eps); layer_norm: always 0 (the variance is 0), with a zero gradient.
  OpCase c = norm_case(GetParam(), "single", {6, 1}, 1e-2f);
  EXPECT_TRUE(run_case(c));
}

TEST_P(NormOps, TransposedInput) {
  const Norm& p = GetParam();
  OpCase c = norm_case(p, "transposed", {7, 5}, 1e-5f);
  c.build = [b = p.build](Context& ctx, const std::vector<Tensor*>& in) {
    return b(ctx, transpose(ctx, in[0]), 1e-5f);
  };
  c.reference = [f = p.ref](const std::vector<Ref>& in) { return per_row(transposed(in[0]), 1e-5, f); };
  EXPECT_TRUE(run_case(c));
}

TEST_P(NormOps, PermutedAndSlicedInput) {
  // A permuted and then sliced view: rows reached through swapped, non-monotonic strides.
  const Norm& p = GetParam();
  OpCase c = norm_case(p, "permuted", {3, 4, 6}, 1e-5f);
  c.build = [b = p.build](Context& ctx, const std::vector<Tensor*>& in) {
    // [3, 4, 6] -> swap dims 1 and 2 (ggml) -> [4, 3, 6]: rows of 6 in a new order.
    return b(ctx, slice(ctx, permute(ctx, in[0], 0, 2, 1, 3), 1, 1, 2), 1e-5f);
  };
  c.reference = [f = p.ref](const std::vector<Ref>& in) {
    const Ref& x = in[0];  // ne = {6, 4, 3}; the view has ne = {6, 2, 4} picking x(:, i2, 1 + i1)
    Ref v;
    v.ne[0] = 6;
    v.ne[1] = 2;
    v.ne[2] = 4;
    for (int64_t i2 = 0; i2 < 4; ++i2)
      for (int64_t i1 = 0; i1 < 2; ++i1)
        for (int64_t i0 = 0; i0 < 6; ++i0) v.v.push_back(x.at(i0, i2, 1 + i1));
    return per_row(v, 1e-5, f);
  };
  EXPECT_TRUE(run_case(c));
}

TEST_P(NormOps, Bf16Storage) {
  OpCase c = norm_case(GetParam(), "bf16", {4, 24}, 1e-6f);
  c.inputs[0].dtype = DType::BF16;
  c.fwd_tol = 3e-5;   // the output is rounded to bf16
  c.grad_tol = 1e-4;  // the gradient reads the bf16-stored input
  EXPECT_TRUE(run_case(c));
}

TEST_P(NormOps, IntegerInputAndBadEpsThrow) {
  const Norm& p = GetParam();
  Context ctx(default_cpu_backend());
  std::string m = error_of([&] { p.build(ctx, ctx.tensor(DType::I32, {2, 8}), 1e-5f); });
  expect_mentions(m, {p.name, "i32[2, 8]", "float"});
  Tensor* x = ctx.tensor(DType::F32, {2, 8});
  m = error_of([&] { p.build(ctx, x, -1e-5f); });
  expect_mentions(m, {p.name, "eps", "f32[2, 8]"});
  m = error_of([&] { p.build(ctx, x, std::nanf("")); });
  expect_mentions(m, {p.name, "eps"});
  m = error_of([&] { p.build(ctx, x, INFINITY); });
  expect_mentions(m, {p.name, "eps"});
  // eps = 0 would make an all-zero row 0/0 = NaN.
  m = error_of([&] { p.build(ctx, x, 0.0f); });
  expect_mentions(m, {p.name, "eps", "> 0"});
}

TEST_P(NormOps, WithLearnedWeight) {
  // The usual composition: norm(x) * weight, with the weight broadcast over rows; both get gradients.
  const Norm& p = GetParam();
  OpCase c;
  c.name = std::string(p.name) + "_weighted";
  c.inputs = {{Shape{5, 10}}, {Shape{10}, DType::F32, true, 0.5, 1.5}};
  c.build = [b = p.build](Context& ctx, const std::vector<Tensor*>& in) {
    return mul(ctx, b(ctx, in[0], 1e-5f), in[1]);
  };
  c.reference = [f = p.ref](const std::vector<Ref>& in) {
    Vec y = per_row(in[0], 1e-5, f);
    for (size_t i = 0; i < y.size(); ++i) y[i] *= in[1].v[i % 10];
    return y;
  };
  c.fwd_tol = 1e-12;
  c.grad_tol = 1e-8;
  EXPECT_TRUE(run_case(c));
}

INSTANTIATE_TEST_SUITE_P(Ops, NormOps, ::testing::ValuesIn(kNorms),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(LayerNorm, RowsFarFromZero) {
  // Values 1000 +- 1: a one-pass variance (E[x^2] - E[x]^2) would lose most of its digits here.
  Norm p = kNorms[1];
  OpCase c = norm_case(p, "offset", {4, 32}, 1e-5f, 999, 1001);
  c.fwd_tol = 1e-8;  // the mean is rounded to f32 before it is subtracted
  c.grad_tol = 1e-5;
  EXPECT_TRUE(run_case(c));
}

TEST(LayerNorm, ConstantRowGivesZeros) {
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.param(DType::F32, {2, 5}, "x");
  set_data(x, {3, 3, 3, 3, 3, -7, -7, -7, -7, -7});
  Tensor* y = layer_norm(ctx, x, 1e-5f);
  y->flags |= kOutput;
  Graph g(ctx);
  g.backward(sum(ctx, mul(ctx, y, y)));
  g.compute();
  for (float v : get_data(y)) EXPECT_EQ(v, 0.0f);
  for (float v : get_data(g.grad(x))) EXPECT_TRUE(std::isfinite(v));
}

TEST(RmsNorm, ZeroRowStaysZero) {
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.param(DType::F32, {2, 4}, "x");
  set_data(x, {0, 0, 0, 0, 1, -1, 1, -1});
  Tensor* y = rms_norm(ctx, x, 1e-6f);
  y->flags |= kOutput;
  Graph g(ctx);
  g.backward(sum(ctx, y));
  g.compute();
  std::vector<float> v = get_data(y);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(v[size_t(i)], 0.0f);
  for (int i = 4; i < 8; ++i) EXPECT_NEAR(std::abs(v[size_t(i)]), 1.0, 1e-6);
  for (float d : get_data(g.grad(x))) EXPECT_TRUE(std::isfinite(d));
}

TEST(RmsNorm, ScaleInvariant) {
  // rms_norm(c x) = rms_norm(x) for c > 0 when eps is negligible.
  Context ctx(default_cpu_backend());
  reseed("rms_scale");
  Tensor* x = ctx.input(DType::F32, {3, 64}, "x");
  Vec v = random_vec(3 * 64, -1, 1);
  set_data(x, std::vector<float>(v.begin(), v.end()));
  Tensor* a = rms_norm(ctx, x, 1e-12f);
  Tensor* b = rms_norm(ctx, scale(ctx, x, 37.0f), 1e-12f);
  a->flags |= kOutput;
  b->flags |= kOutput;
  Graph g(ctx);
  g.forward(a);
  g.forward(b);
  g.compute();
  EXPECT_LE(nmse(to_f64(get_data(a)), to_f64(get_data(b))), 1e-12);
}

}  // namespace
}  // namespace retort::test
