// rope: both modes against a float64 reference, gradients (the inverse rotation) against central
// differences, position 0 as the identity, large positions, strided and bf16 inputs, and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <ostream>

#include "harness.h"
#include "rope_reference.h"
#include "expect_error.h"

namespace retort::test {
namespace {

void expect_mentions(const std::string& msg, std::initializer_list<const char*> parts) {
  for (const char* p : parts)
    EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' missing from: " << msg;
}

OpCase rope_case(const std::string& name, Shape shape, RopeMode mode, float theta, int64_t max_pos) {
  OpCase c;
  c.name = name;
  const int64_t steps = shape.size() >= 3 ? shape[shape.size() - 3] : 1;
  c.inputs = {{shape}, {Shape{steps}, DType::I32, false, 0, double(max_pos)}};
  c.build = [mode, theta](Context& ctx, const std::vector<Tensor*>& in) {
    return rope(ctx, in[0], in[1], mode, theta);
  };
  const bool neox = mode == RopeMode::Neox;
  c.reference = [neox, theta](const std::vector<Ref>& in) { return ref_rope(in[0], in[1], neox, theta); };
  c.fwd_tol = 1e-12;
  c.grad_tol = 1e-8;
  return c;
}

struct ModeParam {
  const char* name;
  RopeMode mode;
};
// Names the case in gtest's failure lines instead of dumping the struct's bytes.
std::ostream& operator<<(std::ostream& os, const ModeParam& p) {
  return os << p.name;
}
const ModeParam kModes[] = {{"normal", RopeMode::Normal}, {"neox", RopeMode::Neox}};

class RopeModes : public ::testing::TestWithParam<ModeParam> {};

std::string tag(const char* mode, const char* what) {
  return std::string("rope_").append(mode).append(what);
}

TEST_P(RopeModes, MatchesFloat64AndFiniteDifferences) {
  const ModeParam& p = GetParam();
  EXPECT_TRUE(run_case(rope_case(tag(p.name, "_btd"), {2, 3, 2, 8}, p.mode, 10000.0f, 50)));
  EXPECT_TRUE(run_case(rope_case(tag(p.name, "_no_batch"), {5, 3, 6}, p.mode, 10000.0f, 20)));
  EXPECT_TRUE(run_case(rope_case(tag(p.name, "_d2"), {1, 4, 1, 2}, p.mode, 10000.0f, 9)));
  EXPECT_TRUE(run_case(rope_case(tag(p.name, "_theta500"), {2, 4, 3, 10}, p.mode, 500.0f, 30)));
}

TEST_P(RopeModes, LargePositions) {
  // Angles of thousands of radians: they must be reduced in double, not formed as an f32 product.
  OpCase c = rope_case(tag(GetParam().name, "_far"), {1, 6, 2, 16}, GetParam().mode, 10000.0f, 8192);
  c.inputs[1].lo = 4000;
  c.check_grad = false;
  c.fwd_tol = 1e-12;
  EXPECT_TRUE(run_case(c));
}

TEST_P(RopeModes, PositionZeroIsIdentity) {
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.input(DType::F32, {2, 3, 4, 8}, "x");
  reseed("rope_identity");
  Vec v = random_vec(2 * 3 * 4 * 8, -5, 5);
  std::vector<float> xs(v.begin(), v.end());
  set_data(x, xs);
  Tensor* pos = ctx.input(DType::I32, {3}, "pos");
  set_data_int(pos, {0, 7, 0});
  Tensor* y = rope(ctx, x, pos, GetParam().mode);
  Graph g(ctx);
  g.forward(y);
  g.compute();
  std::vector<float> out = get_data(y);
  // Steps 0 and 2 are at position 0: bit-identical to the input. Step 1 is rotated.
  int changed = 0;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t t = 0; t < 3; ++t)
      for (int64_t i = 0; i < 4 * 8; ++i) {
        const size_t k = size_t(((b * 3 + t) * 4) * 8 + i);
        if (t != 1)
          EXPECT_EQ(out[k], xs[k]) << "b " << b << " t " << t << " i " << i;
        else
          changed += out[k] != xs[k];
      }
  EXPECT_GT(changed, 32);
}

TEST_P(RopeModes, PreservesPairNorms) {
  // A rotation keeps the length of every rotated pair.
  Context ctx(default_cpu_backend());
  const int64_t d = 12, half = d / 2;
  Tensor* x = ctx.input(DType::F32, {4, 2, d}, "x");
  reseed("rope_norms");
  Vec v = random_vec(4 * 2 * d, -1, 1);
  set_data(x, std::vector<float>(v.begin(), v.end()));
  Tensor* pos = ctx.input(DType::I32, {4}, "pos");
  set_data_int(pos, {3, 100, 2048, 5});
  Tensor* y = rope(ctx, x, pos, GetParam().mode, 10000.0f);
  Graph g(ctx);
  g.forward(y);
  g.compute();
  std::vector<float> out = get_data(y);
  const bool neox = GetParam().mode == RopeMode::Neox;
  for (int64_t r = 0; r < 8; ++r)
    for (int64_t i = 0; i < half; ++i) {
      const size_t j = size_t(r * d + (neox ? i : 2 * i)), k = j + size_t(neox ? half : 1);
      EXPECT_NEAR(std::hypot(out[j], out[k]), std::hypot(v[j], v[k]), 1e-6);
    }
}

TEST_P(RopeModes, AttentionLayoutView) {
  // q stored [B, heads, T, d] and permuted to [B, T, heads, d]: the rows rope sees are strided.
  const ModeParam& p = GetParam();
  OpCase c;
  c.name = tag(p.name, "_permuted");
  c.inputs = {{Shape{2, 3, 4, 6}}, {Shape{4}, DType::I32, false, 0, 40}};
  const RopeMode mode = p.mode;
  c.build = [mode](Context& ctx, const std::vector<Tensor*>& in) {
    return rope(ctx, permute(ctx, in[0], 0, 2, 1, 3), in[1], mode, 10000.0f);
  };
  const bool neox = mode == RopeMode::Neox;
  c.reference = [neox](const std::vector<Ref>& in) {
    const Ref& s = in[0];  // ne = {6, T = 4, heads = 3, 2}
    Ref x;
    x.ne[0] = 6;
    x.ne[1] = 3;
    x.ne[2] = 4;
    x.ne[3] = 2;
    x.v.resize(size_t(x.size()));
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t t = 0; t < 4; ++t)
        for (int64_t h = 0; h < 3; ++h)
          for (int64_t i = 0; i < 6; ++i) x.at(i, h, t, b) = s.at(i, t, h, b);
    return ref_rope(x, in[1], neox, 10000.0);
  };
  c.fwd_tol = 1e-12;
  c.grad_tol = 1e-8;
  EXPECT_TRUE(run_case(c));
}

TEST_P(RopeModes, Bf16Storage) {
  OpCase c = rope_case(tag(GetParam().name, "_bf16"), {2, 3, 2, 8}, GetParam().mode, 10000.0f, 64);
  c.inputs[0].dtype = DType::BF16;
  c.fwd_tol = 3e-5;  // the output is rounded to bf16
  c.grad_tol = 3e-5;
  EXPECT_TRUE(run_case(c));
}

TEST_P(RopeModes, GradientIsTheInverseRotation) {
  // sum(rope(x) * w) has gradient rope^-1(w): rotating that gradient forward again gives w back.
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.param(DType::F32, {3, 2, 8}, "x");
  Tensor* w = ctx.input(DType::F32, {3, 2, 8}, "w");
  reseed("rope_inverse");
  Vec wv = random_vec(48, -1, 1);
  set_data(w, std::vector<float>(wv.begin(), wv.end()));
  Tensor* pos = ctx.input(DType::I32, {3}, "pos");
  set_data_int(pos, {1, 17, 300});
  Graph g(ctx);
  g.backward(sum(ctx, mul(ctx, rope(ctx, x, pos, GetParam().mode), w)));
  g.compute();
  std::vector<float> dx = get_data(g.grad(x));
  Context ctx2(default_cpu_backend());
  Tensor* d = ctx2.input(DType::F32, {3, 2, 8}, "dx");
  set_data(d, dx);
  Tensor* pos2 = ctx2.input(DType::I32, {3}, "pos");
  set_data_int(pos2, {1, 17, 300});
  Tensor* back = rope(ctx2, d, pos2, GetParam().mode);
  Graph g2(ctx2);
  g2.forward(back);
  g2.compute();
  EXPECT_LE(nmse(to_f64(get_data(back)), wv), 1e-12);
}

INSTANTIATE_TEST_SUITE_P(Ops, RopeModes, ::testing::ValuesIn(kModes),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(Rope, ModesDiffer) {
  // Normal and Neox pair different elements, so they disagree on the same input (d > 2).
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.input(DType::F32, {1, 1, 8}, "x");
  set_data(x, {1, 2, 3, 4, 5, 6, 7, 8});
  Tensor* pos = ctx.input(DType::I32, {1}, "pos");
  set_data_int(pos, {3});
  Tensor* a = rope(ctx, x, pos, RopeMode::Normal);
  Tensor* b = rope(ctx, x, pos, RopeMode::Neox);
  a->flags |= kOutput;
  b->flags |= kOutput;
  Graph g(ctx);
  g.forward(a);
  g.forward(b);
  g.compute();
  EXPECT_GT(max_abs_diff(to_f64(get_data(a)), to_f64(get_data(b))), 0.1);
  // Pair 0 (angle = position * 1) in Normal mode rotates elements 0 and 1.
  std::vector<float> va = get_data(a);
  EXPECT_NEAR(va[0], std::cos(3.0) * 1 - std::sin(3.0) * 2, 1e-6);
  EXPECT_NEAR(va[1], std::sin(3.0) * 1 + std::cos(3.0) * 2, 1e-6);
  // In Neox mode it rotates elements 0 and 4.
  std::vector<float> vb = get_data(b);
  EXPECT_NEAR(vb[0], std::cos(3.0) * 1 - std::sin(3.0) * 5, 1e-6);
  EXPECT_NEAR(vb[4], std::sin(3.0) * 1 + std::cos(3.0) * 5, 1e-6);
}

TEST(Rope, BadInputThrows) {
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.tensor(DType::F32, {2, 4, 3, 8});
  Tensor* pos = ctx.tensor(DType::I32, {4});
  std::string m = error_of([&] { rope(ctx, ctx.tensor(DType::F32, {2, 4, 3, 7}), pos); });
  expect_mentions(m, {"rope", "[2, 4, 3, 7]", "even"});
  m = error_of([&] { rope(ctx, x, ctx.tensor(DType::I32, {5})); });
  expect_mentions(m, {"rope", "i32[5]", "[2, 4, 3, 8]", "T = 4"});
  m = error_of([&] { rope(ctx, x, ctx.tensor(DType::I32, {2, 4})); });
  expect_mentions(m, {"rope", "i32[2, 4]", "[2, 4, 3, 8]"});
  m = error_of([&] { rope(ctx, x, ctx.tensor(DType::I64, {4})); });
  expect_mentions(m, {"rope", "i64[4]", "i32"});
  m = error_of([&] { rope(ctx, x, ctx.tensor(DType::F32, {4})); });
  expect_mentions(m, {"rope", "f32[4]"});
  m = error_of([&] { rope(ctx, ctx.tensor(DType::I32, {2, 4, 3, 8}), pos); });
  expect_mentions(m, {"rope", "i32[2, 4, 3, 8]", "float"});
  m = error_of([&] { rope(ctx, x, pos, RopeMode(1)); });
  expect_mentions(m, {"rope", "mode 1", "[2, 4, 3, 8]"});
  m = error_of([&] { rope(ctx, x, pos, RopeMode::Normal, 0.0f); });
  expect_mentions(m, {"rope", "theta", "[2, 4, 3, 8]"});
  m = error_of([&] { rope(ctx, x, pos, RopeMode::Normal, -1.0f); });
  expect_mentions(m, {"rope", "theta"});
}

}  // namespace
}  // namespace retort::test
