// topk_logprobs on the CPU: every case of topk_cases.h against the float64 reference (ids exactly equal,
// logprobs within 1e-6 + 2^-23·|ref|: the kernel sums the exps in double and rounds the result once, so only
// its exp's 2 ulp per term and that rounding remain), results that do not depend on the thread count, and
// bad input: shapes, dtypes and K at build time, NaN and +inf at run time, backward through the op.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "topk_cases.h"
#include "expect_error.h"

namespace retort::test {
namespace {

void expect_mentions(const std::string& msg, std::initializer_list<const char*> parts) {
  for (const char* p : parts)
    EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' missing from: " << msg;
}

class TopKCpu : public ::testing::TestWithParam<TopKCase> {};

TEST_P(TopKCpu, MatchesFloat64Reference) {
  const TopKCase& c = GetParam();
  Context ctx(default_cpu_backend());
  const TopKInput in = make_topk_input(ctx, c);
  const TopKResult want = topk_reference(in.values, c.n, c.v, c.k);
  const TopKResult got = run_topk(default_cpu_backend(), c);
  ASSERT_EQ(got.ids.size(), want.ids.size());
  int bad_ids = 0, bad_lp = 0;
  for (size_t i = 0; i < want.ids.size(); ++i) {
    if (got.ids[i] != want.ids[i] && bad_ids++ < 5)
      ADD_FAILURE() << "row " << i / size_t(c.k) << " slot " << i % size_t(c.k) << ": id " << got.ids[i]
                    << ", want " << want.ids[i];
    const double w = want.logprobs[i], g = got.logprobs[i];
    const bool ok = std::isinf(w) ? g == w : std::abs(g - w) <= 1e-6 + std::ldexp(std::abs(w), -23);
    if (!ok && bad_lp++ < 5)
      ADD_FAILURE() << "row " << i / size_t(c.k) << " slot " << i % size_t(c.k) << ": logprob " << g
                    << ", want " << w;
  }
  EXPECT_EQ(bad_ids, 0);
  EXPECT_EQ(bad_lp, 0);
}

INSTANTIATE_TEST_SUITE_P(Cases, TopKCpu, ::testing::ValuesIn(topk_cases()),
                         [](const ::testing::TestParamInfo<TopKCase>& i) { return i.param.name; });

TEST(TopKLogprobs, SameBitsForAnyThreadCount) {
  CpuBackend one(1);
  for (const TopKCase& c : topk_cases()) {
    if (c.n * c.v > 200000) continue;
    SCOPED_TRACE(c.name);
    const TopKResult a = run_topk(one, c), b = run_topk(default_cpu_backend(), c);
    EXPECT_EQ(a.ids, b.ids);
    for (size_t i = 0; i < a.logprobs.size(); ++i)
      EXPECT_EQ(std::memcmp(&a.logprobs[i], &b.logprobs[i], sizeof(float)), 0) << "slot " << i;
  }
}

TEST(TopKLogprobs, ShapesOfTheOutputs) {
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.input(DType::BF16, {7, 50}, "x");
  const TopKLogprobs o = topk_logprobs(ctx, x, 4);
  EXPECT_EQ(o.logprobs->dtype, DType::F32);
  EXPECT_EQ(o.ids->dtype, DType::I32);
  EXPECT_EQ(o.logprobs->shape(), (Shape{7, 4}));
  EXPECT_EQ(o.ids->shape(), (Shape{7, 4}));
  EXPECT_EQ(o.ids->src[0], o.logprobs);
}

TEST(TopKLogprobs, BadShapesDtypesAndKThrow) {
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.input(DType::F32, {4, 6}, "logits");
  expect_mentions(error_of([&] { topk_logprobs(ctx, x, 0); }), {"topk_logprobs", "K = 0", "V = 6", "[4, 6]"});
  expect_mentions(error_of([&] { topk_logprobs(ctx, x, 7); }), {"topk_logprobs", "K = 7", "[1, V]"});
  expect_mentions(error_of([&] { topk_logprobs(ctx, x, -3); }), {"K = -3"});
  expect_mentions(error_of([&] {
                    topk_logprobs(ctx, ctx.input(DType::I32, {4, 6}, "ints"), 2);
                  }),
                  {"topk_logprobs", "f32, bf16 or f16", "i32[4, 6]"});
  expect_mentions(error_of([&] {
                    topk_logprobs(ctx, ctx.input(DType::F32, {2, 4, 6}, "batched"), 2);
                  }),
                  {"topk_logprobs", "2-D", "[2, 4, 6]"});
  expect_mentions(error_of([&] { topk_logprobs(ctx, nullptr, 2); }), {"topk_logprobs", "null"});
}

TEST(TopKLogprobs, NanAndPlusInfThrowNamingTheRow) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (DType dt : {DType::F32, DType::BF16}) {
    for (float bad : {nan, -nan, inf}) {
      Context ctx(default_cpu_backend());
      Tensor* x = ctx.input(dt, {3, 200}, "logits");
      std::vector<float> v(600, 0.5f);
      v[1 * 200 + 17] = -std::numeric_limits<float>::infinity();  // fine
      v[2 * 200 + 123] = bad;
      set_data(x, v);
      const TopKLogprobs o = topk_logprobs(ctx, x, 5);
      Graph g(ctx);
      g.forward(o.logprobs);
      expect_mentions(error_of([&] { g.compute(); }),
                      {"topk_logprobs", "row 2", "column 123", std::isnan(bad) ? "NaN" : "+inf", "[3, 200]"});
    }
  }
  // NaN in a row whose other entries are all -inf (no sum to carry it).
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.input(DType::F32, {1, 9}, "logits");
  std::vector<float> v(9, -inf);
  v[4] = nan;
  set_data(x, v);
  const TopKLogprobs o = topk_logprobs(ctx, x, 2);
  Graph g(ctx);
  g.forward(o.logprobs);
  expect_mentions(error_of([&] { g.compute(); }), {"row 0", "column 4", "NaN"});
}

TEST(TopKLogprobs, BackwardThroughItThrows) {
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.param(DType::F32, {3, 10}, "logits");
  const TopKLogprobs o = topk_logprobs(ctx, x, 2);
  Graph g(ctx);
  expect_mentions(error_of([&] { g.backward(sum(ctx, o.logprobs)); }), {"topk_logprobs", "no gradient"});
}

TEST(TopKLogprobs, ReadsOnlyItsWindowOfAWiderRow) {
  // The sliced cases put values above every logit beside the window; also check one by hand.
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.input(DType::F32, {2, 6}, "wide");
  set_data(x, {9, 1, 3, 2, 3, 9, 9, 0, -1, 5, -2, 9});
  const TopKLogprobs o = topk_logprobs(ctx, slice(ctx, x, 0, 1, 4), 2);
  o.logprobs->flags |= kOutput;
  Graph g(ctx);
  g.forward(o.logprobs);
  g.compute();
  EXPECT_EQ(get_data_int(o.ids), (std::vector<int64_t>{1, 3, 2, 0}));  // the tie 3 = 3 goes to id 1 first
  const double l0 = std::log(std::exp(1.0) + 2 * std::exp(3.0) + std::exp(2.0));
  const double l1 = std::log(1 + std::exp(-1.0) + std::exp(5.0) + std::exp(-2.0));
  const std::vector<float> lp = get_data(o.logprobs);
  EXPECT_NEAR(lp[0], 3 - l0, 1e-6);
  EXPECT_NEAR(lp[1], 3 - l0, 1e-6);
  EXPECT_NEAR(lp[2], 5 - l1, 1e-6);
  EXPECT_NEAR(lp[3], 0 - l1, 1e-6);
}

}  // namespace
}  // namespace retort::test
