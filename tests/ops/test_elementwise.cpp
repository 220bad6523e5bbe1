// Elementwise ops: forward against float64, gradients against central differences, broadcasting, strided
// inputs, bf16 storage, and bad input.
#include <gtest/gtest.h>

#include <cmath>

#include "harness.h"

namespace retort::test {
namespace {

using BuildUnary = Tensor* (*)(Context&, Tensor*);
using BuildBinary = Tensor* (*)(Context&, Tensor*, Tensor*);

// Reference for a unary op over every element.
std::function<Vec(const std::vector<Ref>&)> map1(double (*f)(double)) {
  return [f](const std::vector<Ref>& in) {
    Vec out(in[0].v.size());
    for (size_t i = 0; i < out.size(); ++i) out[i] = f(in[0].v[i]);
    return out;
  };
}

// Reference for a binary op with b broadcast over a.
std::function<Vec(const std::vector<Ref>&)> map2(double (*f)(double, double)) {
  return [f](const std::vector<Ref>& in) {
    const Ref& a = in[0];
    const Ref& b = in[1];
    Ref out = a;
    for (int64_t i3 = 0; i3 < a.ne[3]; ++i3)
      for (int64_t i2 = 0; i2 < a.ne[2]; ++i2)
        for (int64_t i1 = 0; i1 < a.ne[1]; ++i1)
          for (int64_t i0 = 0; i0 < a.ne[0]; ++i0)
            out.at(i0, i1, i2, i3) =
                f(a.at(i0, i1, i2, i3), b.at(i0 % b.ne[0], i1 % b.ne[1], i2 % b.ne[2], i3 % b.ne[3]));
    return out.v;
  };
}

struct UnaryParam {
  const char* name;
  BuildUnary build;
  double (*ref)(double);
  double lo, hi;
};

double r_neg(double x) { return -x; }
double r_exp(double x) { return std::exp(x); }
double r_log(double x) { return std::log(x); }
double r_sqrt(double x) { return std::sqrt(x); }
double r_rsqrt(double x) { return 1 / std::sqrt(x); }
double r_tanh(double x) { return std::tanh(x); }
double r_relu(double x) { return x > 0 ? x : 0; }
double r_gelu(double x) {
  return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}
double r_silu(double x) { return x / (1 + std::exp(-x)); }

const UnaryParam kUnary[] = {
    {"neg", neg, r_neg, -2, 2},       {"exp", exp, r_exp, -2, 2},         {"log", log, r_log, 0.2, 3},
    {"sqrt", sqrt, r_sqrt, 0.2, 3},   {"rsqrt", rsqrt, r_rsqrt, 0.2, 3}, {"tanh", tanh, r_tanh, -2, 2},
    {"relu", relu, r_relu, -2, 2},    {"gelu", gelu, r_gelu, -3, 3},     {"silu", silu, r_silu, -3, 3},
};

class Unary : public ::testing::TestWithParam<UnaryParam> {};

TEST_P(Unary, MatchesFloat64AndFiniteDifferences) {
  const UnaryParam& p = GetParam();
  for (Shape s : {Shape{7}, Shape{3, 5}, Shape{2, 3, 4}, Shape{2, 2, 3, 5}}) {
    OpCase c;
    c.name = std::string(p.name) + "_" + std::to_string(s.size());
    c.inputs = {{s, DType::F32, true, p.lo, p.hi}};
    BuildUnary b = p.build;
    c.build = [b](Context& ctx, const std::vector<Tensor*>& in) { return b(ctx, in[0]); };
    c.reference = map1(p.ref);
    c.fwd_tol = 1e-12;
    c.grad_tol = 1e-8;
    EXPECT_TRUE(run_case(c));
  }
}

TEST_P(Unary, Bf16StorageAndStridedInput) {
  const UnaryParam& p = GetParam();
  OpCase c;
  c.name = std::string(p.name) + "_bf16_transposed";
  c.inputs = {{Shape{6, 5}, DType::BF16, true, p.lo, p.hi}};
  BuildUnary b = p.build;
  // The input is read through a transposed view (non-contiguous dim 0); the output is stored as bf16.
  c.build = [b](Context& ctx, const std::vector<Tensor*>& in) { return b(ctx, transpose(ctx, in[0])); };
  c.reference = [&p](const std::vector<Ref>& in) {
    const Ref& x = in[0];  // ne = {5, 6}; the op sees ne = {6, 5}
    Vec out(size_t(x.size()));
    for (int64_t i1 = 0; i1 < x.ne[0]; ++i1)
      for (int64_t i0 = 0; i0 < x.ne[1]; ++i0) out[size_t(i0 + x.ne[1] * i1)] = p.ref(x.at(i1, i0));
    return out;
  };
  c.fwd_tol = 3e-5;   // bf16 output rounding (8 bits of mantissa)
  c.grad_tol = 1e-4;  // gradient flows through bf16-stored activations
  EXPECT_TRUE(run_case(c));
}

INSTANTIATE_TEST_SUITE_P(Ops, Unary, ::testing::ValuesIn(kUnary),
                         [](const auto& info) { return std::string(info.param.name); });

struct BinaryParam {
  const char* name;
  BuildBinary build;
  double (*ref)(double, double);
};
double r_add(double a, double b) { return a + b; }
double r_sub(double a, double b) { return a - b; }
double r_mul(double a, double b) { return a * b; }
double r_div(double a, double b) { return a / b; }
const BinaryParam kBinary[] = {{"add", add, r_add}, {"sub", sub, r_sub}, {"mul", mul, r_mul}, {"div", div, r_div}};

class Binary : public ::testing::TestWithParam<BinaryParam> {};

TEST_P(Binary, BroadcastShapes) {
  const BinaryParam& p = GetParam();
  const std::pair<Shape, Shape> shapes[] = {
      {{4, 6}, {4, 6}}, {{4, 6}, {6}}, {{4, 6}, {4, 1}}, {{3, 4, 5}, {4, 5}}, {{2, 3, 4, 5}, {2, 1, 4, 1}},
      {{5}, {1}}};
  int k = 0;
  for (auto& [sa, sb] : shapes) {
    OpCase c;
    c.name = std::string(p.name) + "_bcast" + std::to_string(k++);
    // Divisors stay away from zero.
    c.inputs = {{sa, DType::F32, true, -1, 1}, {sb, DType::F32, true, 0.5, 2}};
    BuildBinary b = p.build;
    c.build = [b](Context& ctx, const std::vector<Tensor*>& in) { return b(ctx, in[0], in[1]); };
    c.reference = map2(p.ref);
    c.fwd_tol = 1e-12;
    c.grad_tol = 1e-8;
    EXPECT_TRUE(run_case(c));
  }
}

TEST_P(Binary, MismatchedShapesThrow) {
  Context ctx(default_cpu_backend());
  Tensor* a = ctx.tensor(DType::F32, {4, 6});
  Tensor* b = ctx.tensor(DType::F32, {3, 6});
  try {
    GetParam().build(ctx, a, b);
    FAIL() << "expected retort::Error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find(GetParam().name), std::string::npos) << m;
    EXPECT_NE(m.find("[4, 6]"), std::string::npos) << m;
    EXPECT_NE(m.find("[3, 6]"), std::string::npos) << m;
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, Binary, ::testing::ValuesIn(kBinary),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(Elementwise, ScaleMatchesReference) {
  OpCase c;
  c.name = "scale";
  c.inputs = {{Shape{3, 7}}};
  c.build = [](Context& ctx, const std::vector<Tensor*>& in) { return scale(ctx, in[0], -2.5f); };
  c.reference = [](const std::vector<Ref>& in) {
    Vec o = in[0].v;
    for (auto& x : o) x *= -2.5;
    return o;
  };
  EXPECT_TRUE(run_case(c));
}

TEST(Elementwise, IntegerOperandThrows) {
  Context ctx(default_cpu_backend());
  Tensor* a = ctx.tensor(DType::I32, {4});
  EXPECT_THROW(exp(ctx, a), Error);
  EXPECT_THROW(add(ctx, ctx.tensor(DType::F32, {4}), a), Error);
}

}  // namespace
}  // namespace retort::test
