// Softmax family: softmax and log_softmax over dim 0, causal_softmax for attention scores. Forward against
// float64, gradients against central differences, strided and bf16 inputs, rows of one element, rows of
// +-1e4, odd row lengths, exact zeros under the causal mask, and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <ostream>

#include "harness.h"
#include "expect_error.h"

namespace retort::test {
namespace {

using Build = Tensor* (*)(Context&, Tensor*);

// Applies f to every row (dim 0) of a contiguous float64 array.
Vec per_row(const Ref& x, const std::function<void(const double*, double*, int64_t)>& f) {
  Vec out(x.v.size());
  const int64_t n = x.ne[0];
  for (int64_t r = 0; r < x.size() / n; ++r) f(x.v.data() + r * n, out.data() + r * n, n);
  return out;
}

void ref_softmax_row(const double* x, double* y, int64_t n) {
  double m = x[0];
  for (int64_t i = 1; i < n; ++i) m = std::max(m, x[i]);
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(x[i] - m);
  for (int64_t i = 0; i < n; ++i) y[i] = std::exp(x[i] - m) / s;
}

void ref_log_softmax_row(const double* x, double* y, int64_t n) {
  double m = x[0];
  for (int64_t i = 1; i < n; ++i) m = std::max(m, x[i]);
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(x[i] - m);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] - m - std::log(s);
}

Ref transposed(const Ref& x) {
  Ref t = x;
  std::swap(t.ne[0], t.ne[1]);
  for (int64_t i3 = 0; i3 < x.ne[3]; ++i3)
    for (int64_t i2 = 0; i2 < x.ne[2]; ++i2)
      for (int64_t i1 = 0; i1 < x.ne[1]; ++i1)
        for (int64_t i0 = 0; i0 < x.ne[0]; ++i0) t.at(i1, i0, i2, i3) = x.at(i0, i1, i2, i3);
  return t;
}

// Causal reference: query row i (dim 1) sees keys j <= i + n_past.
Vec ref_causal(const Ref& x, double scale, int64_t n_past) {
  Vec out(x.v.size(), 0.0);
  const int64_t tk = x.ne[0], tq = x.ne[1];
  for (int64_t r = 0; r < x.size() / tk; ++r) {
    const int64_t visible = std::min(tk, r % tq + n_past + 1);
    Vec row(static_cast<size_t>(visible));
    for (int64_t j = 0; j < visible; ++j) row[size_t(j)] = x.v[size_t(r * tk + j)] * scale;
    ref_softmax_row(row.data(), out.data() + r * tk, visible);
  }
  return out;
}

void expect_mentions(const std::string& msg, std::initializer_list<const char*> parts) {
  for (const char* p : parts)
    EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' missing from: " << msg;
}

struct Family {
  const char* name;
  Build build;
  void (*ref)(const double*, double*, int64_t);
};
// Names the case in gtest's failure lines instead of dumping the struct's bytes.
std::ostream& operator<<(std::ostream& os, const Family& p) {
  return os << p.name;
}
const Family kFamilies[] = {{"softmax", softmax, ref_softmax_row},
                            {"log_softmax", log_softmax, ref_log_softmax_row}};

class SoftmaxFamily : public ::testing::TestWithParam<Family> {};

OpCase row_case(const Family& f, const std::string& tag, Shape shape, double lo = -3, double hi = 3) {
  OpCase c;
  c.name = std::string(f.name) + "_" + tag;
  c.inputs = {{shape, DType::F32, true, lo, hi}};
  Build b = f.build;
  c.build = [b](Context& ctx, const std::vector<Tensor*>& in) { return b(ctx, in[0]); };
  auto ref = f.ref;
  c.reference = [ref](const std::vector<Ref>& in) { return per_row(in[0], ref); };
  c.fwd_tol = 1e-12;
  c.grad_tol = 1e-8;
  return c;
}

TEST_P(SoftmaxFamily, MatchesFloat64AndFiniteDifferences) {
  int k = 0;
  for (Shape s : {Shape{7}, Shape{3, 5}, Shape{2, 3, 4}, Shape{2, 2, 3, 5}})
    EXPECT_TRUE(run_case(row_case(GetParam(), std::string("shape").append(std::to_string(k++)), s)));
}

TEST_P(SoftmaxFamily, RowLengthsNotAMultipleOfEight) {
  for (int64_t n : {1, 3, 13, 67})
    EXPECT_TRUE(run_case(row_case(GetParam(), std::string("n").append(std::to_string(n)), {4, n})));
  OpCase wide = row_case(GetParam(), "n1003", {3, 1003}, -8, 8);
  EXPECT_TRUE(run_case(wide));
}

TEST_P(SoftmaxFamily, RowOfOneElement) {
  // softmax of one element is 1 and log_softmax is 0, whatever the value; the gradient is 0.
  OpCase c = row_case(GetParam(), "single", {5, 1}, -50, 50);
  EXPECT_TRUE(run_case(c));
}

TEST_P(SoftmaxFamily, TransposedInput) {
  const Family f = GetParam();
  OpCase c = row_case(f, "transposed", {6, 5});
  c.build = [b = f.build](Context& ctx, const std::vector<Tensor*>& in) {
    return b(ctx, transpose(ctx, in[0]));
  };
  c.reference = [ref = f.ref](const std::vector<Ref>& in) { return per_row(transposed(in[0]), ref); };
  EXPECT_TRUE(run_case(c));
}

TEST_P(SoftmaxFamily, SlicedInput) {
  const Family f = GetParam();
  OpCase c = row_case(f, "sliced", {4, 9});
  c.build = [b = f.build](Context& ctx, const std::vector<Tensor*>& in) {
    return b(ctx, slice(ctx, in[0], 0, 2, 6));  // columns 2..7: rows strided by 9
  };
  c.reference = [ref = f.ref](const std::vector<Ref>& in) {
    Ref s;
    s.ne[0] = 6;
    s.ne[1] = in[0].ne[1];
    for (int64_t r = 0; r < s.ne[1]; ++r)
      for (int64_t i = 0; i < 6; ++i) s.v.push_back(in[0].at(i + 2, r));
    return per_row(s, ref);
  };
  EXPECT_TRUE(run_case(c));
}

TEST_P(SoftmaxFamily, Bf16Storage) {
  OpCase c = row_case(GetParam(), "bf16", {4, 19});
  c.inputs[0].dtype = DType::BF16;
  c.fwd_tol = 3e-5;   // the output is rounded to bf16 (8 bits of mantissa)
  c.grad_tol = 1e-4;  // the backward reads the bf16-rounded output
  EXPECT_TRUE(run_case(c));
}

TEST_P(SoftmaxFamily, LargeLogitsStayFinite) {
  // Rows spanning +-1e4: exp would overflow without the max shift. Forward only, since the function is
  // flat to double precision almost everywhere at this scale.
  OpCase c = row_case(GetParam(), "large", {6, 11}, -1e4, 1e4);
  c.check_grad = false;
  EXPECT_TRUE(run_case(c));

  Context ctx(default_cpu_backend());
  Tensor* x = ctx.input(DType::F32, {2, 4}, "x");
  const std::vector<float> xs = {1e4f, -1e4f, 0.0f, 1e4f, -1e4f, -1e4f, -1e4f + 1.0f, -1e4f};
  set_data(x, xs);
  Tensor* y = GetParam().build(ctx, x);
  Graph g(ctx);
  g.forward(y);
  g.compute();
  std::vector<float> v = get_data(y);
  const bool is_log = std::string(GetParam().name) == "log_softmax";
  // Expected by hand: row 0 splits between the two 1e4 entries; row 1 is 1 / (3 e^-1 + 1) at index 2.
  const double p2 = 1.0 / (3.0 * std::exp(-1.0) + 1.0);
  const double p_rest = std::exp(-1.0) * p2;
  const double probs[8] = {0.5, 0, 0, 0.5, p_rest, p_rest, p2, p_rest};
  const double logs[8] = {-std::log(2.0),   -2e4 - std::log(2.0), -1e4 - std::log(2.0), -std::log(2.0),
                          std::log(p_rest), std::log(p_rest),     std::log(p2),         std::log(p_rest)};
  for (int i = 0; i < 8; ++i) {
    EXPECT_TRUE(std::isfinite(v[size_t(i)])) << i << ": " << v[size_t(i)];
    if (is_log) {
      EXPECT_NEAR(v[size_t(i)], logs[i], 1e-6 * std::max(1.0, std::abs(logs[i]))) << i;
    } else {
      EXPECT_NEAR(v[size_t(i)], probs[i], 1e-6) << i;
    }
  }
}

TEST_P(SoftmaxFamily, IntegerInputThrows) {
  Context ctx(default_cpu_backend());
  std::string m = error_of([&] { GetParam().build(ctx, ctx.tensor(DType::I32, {3, 4})); });
  expect_mentions(m, {GetParam().name, "i32[3, 4]", "float"});
}

INSTANTIATE_TEST_SUITE_P(Ops, SoftmaxFamily, ::testing::ValuesIn(kFamilies),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(Softmax, RowsSumToOne) {
  Context ctx(default_cpu_backend());
  reseed("softmax_sum");
  Tensor* x = ctx.input(DType::F32, {64, 257}, "x");
  Vec v = random_vec(64 * 257, -20, 20);
  set_data(x, std::vector<float>(v.begin(), v.end()));
  Tensor* y = sum_rows(ctx, softmax(ctx, x));
  Graph g(ctx);
  g.forward(y);
  g.compute();
  for (float s : get_data(y)) EXPECT_NEAR(s, 1.0, 1e-6);
}

OpCase causal_case(const std::string& name, Shape shape, float scale, int64_t n_past) {
  OpCase c;
  c.name = name;
  c.inputs = {{shape, DType::F32, true, -3, 3}};
  c.build = [scale, n_past](Context& ctx, const std::vector<Tensor*>& in) {
    return causal_softmax(ctx, in[0], scale, n_past);
  };
  c.reference = [scale, n_past](const std::vector<Ref>& in) { return ref_causal(in[0], scale, n_past); };
  c.fwd_tol = 1e-12;
  c.grad_tol = 1e-8;
  return c;
}

TEST(CausalSoftmax, MatchesFloat64AndFiniteDifferences) {
  EXPECT_TRUE(run_case(causal_case("causal_square", {3, 4, 4}, 0.5f, 0)));
  EXPECT_TRUE(run_case(causal_case("causal_unit_scale", {2, 5, 5}, 1.0f, 0)));
  EXPECT_TRUE(run_case(causal_case("causal_negative_scale", {2, 3, 3}, -0.7f, 0)));
  EXPECT_TRUE(run_case(causal_case("causal_4d", {2, 2, 4, 4}, 0.35f, 0)));
}

TEST(CausalSoftmax, WithPastKeys) {
  // Decoding with a cache: 4 new queries over 2 cached + 4 new keys.
  EXPECT_TRUE(run_case(causal_case("causal_past2", {3, 4, 6}, 0.5f, 2)));
  // A single new query sees every key.
  EXPECT_TRUE(run_case(causal_case("causal_one_query", {2, 1, 7}, 0.5f, 6)));
  // n_past past the end: nothing is masked, so this is a plain scaled softmax.
  EXPECT_TRUE(run_case(causal_case("causal_unmasked", {2, 3, 5}, 1.5f, 10)));
}

TEST(CausalSoftmax, MoreQueriesThanKeys) {
  // Queries past the last key see all of them; the first query sees key 0 only.
  EXPECT_TRUE(run_case(causal_case("causal_tall", {2, 6, 3}, 0.8f, 0)));
}

TEST(CausalSoftmax, MaskedEntriesAreExactlyZero) {
  Context ctx(default_cpu_backend());
  const int64_t bh = 2, t = 9;
  Tensor* x = ctx.param(DType::F32, {bh, t, t}, "x");
  // Huge scores at masked positions must not leak into the visible ones.
  std::vector<float> v(size_t(bh * t * t));
  for (int64_t r = 0; r < bh * t; ++r)
    for (int64_t j = 0; j < t; ++j) v[size_t(r * t + j)] = j > r % t ? 1e4f : float(j % 3) * 0.25f;
  set_data(x, v);
  Tensor* y = causal_softmax(ctx, x, 0.125f);
  y->flags |= kOutput;
  Graph g(ctx);
  g.backward(sum(ctx, mul(ctx, y, y)));
  g.set_poison(true);  // unwritten elements would read back as NaN
  g.compute();
  std::vector<float> out = get_data(y);
  std::vector<float> dx = get_data(g.grad(x));
  for (int64_t r = 0; r < bh * t; ++r) {
    const int64_t i = r % t;
    double s = 0;
    for (int64_t j = 0; j < t; ++j) {
      const size_t k = size_t(r * t + j);
      if (j > i) {
        EXPECT_EQ(out[k], 0.0f) << "row " << r << " key " << j;
        EXPECT_EQ(dx[k], 0.0f) << "row " << r << " key " << j;
      } else {
        EXPECT_GT(out[k], 0.0f);
        s += out[k];
      }
    }
    EXPECT_NEAR(s, 1.0, 1e-6) << "row " << r;
  }
  // The first query sees only key 0.
  EXPECT_EQ(out[0], 1.0f);
}

TEST(CausalSoftmax, TransposedInput) {
  // Scores stored [bh, T_k, T_q] and read through a transposed view as [bh, T_q, T_k].
  OpCase c = causal_case("causal_transposed", {2, 5, 4}, 0.5f, 1);
  c.build = [](Context& ctx, const std::vector<Tensor*>& in) {
    return causal_softmax(ctx, transpose(ctx, in[0]), 0.5f, 1);
  };
  c.reference = [](const std::vector<Ref>& in) { return ref_causal(transposed(in[0]), 0.5, 1); };
  EXPECT_TRUE(run_case(c));
}

TEST(CausalSoftmax, Bf16Storage) {
  OpCase c = causal_case("causal_bf16", {3, 6, 6}, 0.4f, 0);
  c.inputs[0].dtype = DType::BF16;
  c.fwd_tol = 3e-5;
  c.grad_tol = 1e-4;
  EXPECT_TRUE(run_case(c));
}

TEST(CausalSoftmax, LargeScoresStayFinite) {
  OpCase c = causal_case("causal_large", {2, 5, 5}, 1.0f, 0);
  c.inputs[0].lo = -1e4;
  c.inputs[0].hi = 1e4;
  c.check_grad = false;
  EXPECT_TRUE(run_case(c));
}

TEST(CausalSoftmax, BadOptionsThrow) {
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.tensor(DType::F32, {2, 4, 4});
  std::string m = error_of([&] { causal_softmax(ctx, x, 1.0f, -1); });
  expect_mentions(m, {"causal_softmax", "n_past", "-1", "[2, 4, 4]"});
  m = error_of([&] { causal_softmax(ctx, x, std::nanf(""), 0); });
  expect_mentions(m, {"causal_softmax", "scale", "[2, 4, 4]"});
  m = error_of([&] { causal_softmax(ctx, ctx.tensor(DType::I64, {4, 4}), 1.0f, 0); });
  expect_mentions(m, {"causal_softmax", "i64[4, 4]"});
}

}  // namespace
}  // namespace retort::test
