// cross_entropy: the mean over valid rows against float64, gradients against central differences, some and
// all rows ignored, [B, T, V] logits, odd V, strided and bf16 logits, logits of +-1e4, labels out of range at
// run time, and bad shapes.
#include <gtest/gtest.h>

#include <cmath>

#include "harness.h"
#include "expect_error.h"

namespace retort::test {
namespace {

// Reference: rows of logits (ne[0] = V) paired with labels in ggml order.
double ref_ce(const Ref& logits, const Ref& labels, int64_t ignore) {
  const int64_t v = logits.ne[0];
  double total = 0;
  int64_t valid = 0;
  for (int64_t r = 0; r < logits.size() / v; ++r) {
    const int64_t y = int64_t(labels.v[size_t(r)]);
    if (y == ignore) continue;
    const double* x = logits.v.data() + r * v;
    double m = x[0];
    for (int64_t i = 1; i < v; ++i) m = std::max(m, x[i]);
    double s = 0;
    for (int64_t i = 0; i < v; ++i) s += std::exp(x[i] - m);
    total += m + std::log(s) - x[y];
    ++valid;
  }
  return valid ? total / double(valid) : 0.0;
}

void expect_mentions(const std::string& msg, std::initializer_list<const char*> parts) {
  for (const char* p : parts)
    EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' missing from: " << msg;
}

// Labels drawn from [lo, hi); with ignore inside that range some rows are ignored.
OpCase ce_case(const std::string& name, Shape logits, DType label_type, int64_t ignore, int64_t lo,
               int64_t hi) {
  OpCase c;
  c.name = name;
  Shape labels{1};  // logits without the V dim; one label for 1-D logits
  if (logits.size() > 1) labels.assign(logits.begin(), logits.begin() + std::ptrdiff_t(logits.size() - 1));
  c.inputs = {{logits, DType::F32, true, -4, 4}, {labels, label_type, false, double(lo), double(hi)}};
  c.build = [ignore](Context& ctx, const std::vector<Tensor*>& in) {
    return cross_entropy(ctx, in[0], in[1], ignore);
  };
  c.reference = [ignore](const std::vector<Ref>& in) { return Vec{ref_ce(in[0], in[1], ignore)}; };
  c.fwd_tol = 1e-12;
  c.grad_tol = 1e-8;
  return c;
}

TEST(CrossEntropy, MatchesFloat64AndFiniteDifferences) {
  EXPECT_TRUE(run_case(ce_case("ce_5x7", {5, 7}, DType::I32, -100, 0, 7)));
  EXPECT_TRUE(run_case(ce_case("ce_one_row", {1, 9}, DType::I32, -100, 0, 9)));
  EXPECT_TRUE(run_case(ce_case("ce_1d", {6}, DType::I32, -100, 0, 6)));
  EXPECT_TRUE(run_case(ce_case("ce_i64", {4, 10}, DType::I64, -100, 0, 10)));
}

TEST(CrossEntropy, VocabNotAMultipleOfEight) {
  for (int64_t v : {1, 3, 13, 67, 1001}) {
    OpCase c = ce_case(std::string("ce_v").append(std::to_string(v)), {3, v}, DType::I32, -100, 0, v);
    EXPECT_TRUE(run_case(c));
  }
}

TEST(CrossEntropy, BatchTimeVocab) {
  // Logits [B, T, V] with labels [B, T]: every (b, t) is a row.
  EXPECT_TRUE(run_case(ce_case("ce_btv", {2, 3, 11}, DType::I32, -100, 0, 11)));
  EXPECT_TRUE(run_case(ce_case("ce_abtv", {2, 2, 3, 5}, DType::I64, -100, 0, 5)));
  Context ctx(default_cpu_backend());
  Tensor* loss = cross_entropy(ctx, ctx.tensor(DType::F32, {2, 3, 11}), ctx.tensor(DType::I32, {2, 3}));
  EXPECT_EQ(loss->nelements(), 1);
  EXPECT_EQ(loss->dtype, DType::F32);
}

TEST(CrossEntropy, SomeRowsIgnored) {
  // ignore_index = -1 among labels drawn from [-1, 4): about one row in five is ignored.
  OpCase c = ce_case("ce_some_ignored", {24, 4}, DType::I32, -1, -1, 4);
  int64_t ignored = -1;
  auto base = c.reference;
  c.reference = [base, &ignored](const std::vector<Ref>& in) {
    ignored = 0;
    for (double y : in[1].v) ignored += y == -1;
    return base(in);
  };
  EXPECT_TRUE(run_case(c));
  EXPECT_GT(ignored, 0) << "the draw ignored no row; the case tests nothing";
  EXPECT_LT(ignored, 24);
  // An ignore_index that is also a valid class id: rows labelled 2 drop out.
  EXPECT_TRUE(run_case(ce_case("ce_ignore_valid_id", {16, 5}, DType::I64, 2, 0, 5)));
}

TEST(CrossEntropy, AllRowsIgnoredGivesZero) {
  // Every label is ignore_index: the loss is 0 (not 0/0) and the gradient is all zeros.
  EXPECT_TRUE(run_case(ce_case("ce_all_ignored", {4, 6}, DType::I32, -100, -100, -99)));
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.param(DType::F32, {3, 5}, "x");
  set_data(x, std::vector<float>(15, 0.3f));
  Tensor* y = ctx.input(DType::I32, {3}, "y");
  set_data_int(y, {-100, -100, -100});
  Tensor* loss = cross_entropy(ctx, x, y);
  Graph g(ctx);
  g.backward(loss);
  g.set_poison(true);
  g.compute();
  EXPECT_EQ(get_data(loss)[0], 0.0f);
  for (float d : get_data(g.grad(x))) EXPECT_EQ(d, 0.0f);
}

TEST(CrossEntropy, TransposedLogits) {
  // Logits stored [V, N] and read as [N, V]: each row's V elements are strided.
  OpCase c;
  c.name = "ce_transposed";
  c.inputs = {{Shape{9, 5}, DType::F32, true, -3, 3}, {Shape{5}, DType::I32, false, 0, 9}};
  c.build = [](Context& ctx, const std::vector<Tensor*>& in) {
    return cross_entropy(ctx, transpose(ctx, in[0]), in[1]);
  };
  c.reference = [](const std::vector<Ref>& in) {
    Ref t;
    t.ne[0] = 9;
    t.ne[1] = 5;
    for (int64_t r = 0; r < 5; ++r)
      for (int64_t i = 0; i < 9; ++i) t.v.push_back(in[0].at(r, i));
    return Vec{ref_ce(t, in[1], -100)};
  };
  c.fwd_tol = 1e-12;
  c.grad_tol = 1e-8;
  EXPECT_TRUE(run_case(c));
}

TEST(CrossEntropy, SlicedLogitsAndLabels) {
  // The last 4 of 7 rows, with their labels taken from a longer label tensor.
  OpCase c;
  c.name = "ce_sliced";
  c.inputs = {{Shape{7, 6}, DType::F32, true, -3, 3}, {Shape{7}, DType::I64, false, 0, 6}};
  c.build = [](Context& ctx, const std::vector<Tensor*>& in) {
    return cross_entropy(ctx, slice(ctx, in[0], 1, 3, 4), slice(ctx, in[1], 0, 3, 4));
  };
  c.reference = [](const std::vector<Ref>& in) {
    Ref x, y;
    x.ne[0] = 6;
    x.ne[1] = 4;
    x.v.assign(in[0].v.begin() + 18, in[0].v.end());
    y.ne[0] = 4;
    y.v.assign(in[1].v.begin() + 3, in[1].v.end());
    return Vec{ref_ce(x, y, -100)};
  };
  c.fwd_tol = 1e-12;
  c.grad_tol = 1e-8;
  EXPECT_TRUE(run_case(c));
}

TEST(CrossEntropy, Bf16Logits) {
  OpCase c = ce_case("ce_bf16", {6, 37}, DType::I32, -1, -1, 37);
  c.inputs[0].dtype = DType::BF16;
  // The reference sees the bf16-rounded logits and the math is f32, so only f32 rounding remains; the
  // gradient itself is f32 (it is not stored as bf16).
  c.fwd_tol = 1e-12;
  c.grad_tol = 1e-8;
  EXPECT_TRUE(run_case(c));
}

TEST(CrossEntropy, LargeLogitsStayFinite) {
  OpCase c = ce_case("ce_large", {5, 9}, DType::I32, -100, 0, 9);
  c.inputs[0].lo = -1e4;
  c.inputs[0].hi = 1e4;
  c.check_grad = false;  // the loss is piecewise linear to double precision at this scale
  c.fwd_tol = 1e-12;
  EXPECT_TRUE(run_case(c));

  // And a hand-made case with the gradient: row 0 is sure of the right class, row 1 of a wrong one.
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.param(DType::F32, {2, 3}, "x");
  set_data(x, {1e4f, -1e4f, 0.0f, 1e4f, -1e4f, 1e4f});
  Tensor* y = ctx.input(DType::I32, {2}, "y");
  set_data_int(y, {0, 1});
  Tensor* loss = cross_entropy(ctx, x, y);
  Graph g(ctx);
  g.backward(loss);
  g.compute();
  // Row 0: loss 0. Row 1: lse = 1e4 + log 2, minus -1e4. Mean over 2 rows.
  EXPECT_NEAR(get_data(loss)[0], (2e4 + std::log(2.0)) / 2, 1e-2);
  std::vector<float> d = get_data(g.grad(x));
  const double want[6] = {0, 0, 0, 0.25, -0.5, 0.25};  // (softmax - onehot) / 2
  for (int i = 0; i < 6; ++i) {
    EXPECT_TRUE(std::isfinite(d[size_t(i)]));
    EXPECT_NEAR(d[size_t(i)], want[i], 1e-6) << i;
  }
}

TEST(CrossEntropy, UpstreamGradientScales) {
  // loss = 3 * ce: the gradient is (softmax - onehot) * 3 / n_valid for valid rows, 0 for ignored ones.
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.param(DType::F32, {3, 4}, "x");
  const std::vector<float> xs = {0.1f, 0.2f, -0.3f, 0.5f, 1, 2, 3, 4, -1, 0, 1, 0};
  set_data(x, xs);
  Tensor* y = ctx.input(DType::I32, {3}, "y");
  set_data_int(y, {3, -100, 0});
  Graph g(ctx);
  g.backward(scale(ctx, cross_entropy(ctx, x, y), 3.0f));
  g.compute();
  std::vector<float> d = get_data(g.grad(x));
  const int labels[3] = {3, -1, 0};
  for (int r = 0; r < 3; ++r) {
    double s = 0;
    for (int i = 0; i < 4; ++i) s += std::exp(double(xs[size_t(r * 4 + i)]));
    for (int i = 0; i < 4; ++i) {
      double want =
          labels[r] < 0 ? 0.0 : (std::exp(double(xs[size_t(r * 4 + i)])) / s - (i == labels[r])) * 3.0 / 2.0;
      EXPECT_NEAR(d[size_t(r * 4 + i)], want, 1e-6) << r << "," << i;
    }
  }
}

// Computes cross_entropy of a [rows, v] tensor of zeros with the given labels; returns the error if any.
std::string run_with_labels(DType type, int64_t v, const std::vector<int64_t>& labels) {
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.input(DType::F32, {int64_t(labels.size()), v}, "logits");
  Tensor* y = ctx.input(type, {int64_t(labels.size())}, "labels");
  set_data_int(y, labels);
  Graph g(ctx);
  g.forward(cross_entropy(ctx, x, y));
  return error_of([&] { g.compute(); });
}

TEST(CrossEntropy, LabelOutOfRangeThrowsAtRunTime) {
  std::string m = run_with_labels(DType::I32, 7, {0, 3, 7, 1});
  expect_mentions(m, {"cross_entropy", "label 7", "[0, 7)", "row 2"});
  m = run_with_labels(DType::I64, 5, {-100, -5, 1});
  expect_mentions(m, {"cross_entropy", "label -5", "[0, 5)", "-100"});
  // -100 is fine as ignore_index, but not when another ignore_index is in use.
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.input(DType::F32, {2, 3}, "logits");
  Tensor* y = ctx.input(DType::I32, {2}, "labels");
  set_data_int(y, {-100, 1});
  Graph g(ctx);
  g.forward(cross_entropy(ctx, x, y, -1));
  m = error_of([&] { g.compute(); });
  expect_mentions(m, {"cross_entropy", "label -100"});
}

TEST(CrossEntropy, BadShapesAndDtypesThrow) {
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.tensor(DType::F32, {4, 10});
  std::string m = error_of([&] { cross_entropy(ctx, x, ctx.tensor(DType::I32, {5})); });
  expect_mentions(m, {"cross_entropy", "i32[5]", "f32[4, 10]"});
  m = error_of([&] { cross_entropy(ctx, x, ctx.tensor(DType::I32, {4, 10})); });
  expect_mentions(m, {"cross_entropy", "i32[4, 10]", "f32[4, 10]"});
  m = error_of([&] { cross_entropy(ctx, x, ctx.tensor(DType::F32, {4})); });
  expect_mentions(m, {"cross_entropy", "f32[4]", "i32 or i64"});
  m = error_of([&] { cross_entropy(ctx, ctx.tensor(DType::I64, {4, 10}), ctx.tensor(DType::I32, {4})); });
  expect_mentions(m, {"cross_entropy", "i64[4, 10]", "float"});
  m = error_of([&] {
    cross_entropy(ctx, ctx.tensor(DType::F32, {2, 3, 10}), ctx.tensor(DType::I32, {3, 2}));
  });
  expect_mentions(m, {"cross_entropy", "[3, 2]", "[2, 3, 10]"});
}

TEST(CrossEntropy, ManyRowsDeterministic) {
  // Enough rows to split across threads: the loss matches float64 and repeats bit for bit.
  OpCase c = ce_case("ce_many", {300, 129}, DType::I32, -1, -1, 129);
  c.check_grad = false;
  EXPECT_TRUE(run_case(c));
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.input(DType::F32, {300, 129}, "x");
  reseed("ce_many_bits");
  Vec v = random_vec(300 * 129, -5, 5);
  set_data(x, std::vector<float>(v.begin(), v.end()));
  Tensor* y = ctx.input(DType::I32, {300}, "y");
  set_data_int(y, random_ints(300, 0, 129));
  Tensor* loss = cross_entropy(ctx, x, y);
  Graph g(ctx);
  g.forward(loss);
  g.compute();
  const float first = get_data(loss)[0];
  CpuBackend one(1);
  Context ctx1(one);
  Tensor* x1 = ctx1.input(DType::F32, {300, 129}, "x");
  set_data(x1, get_data(x));
  Tensor* y1 = ctx1.input(DType::I32, {300}, "y");
  set_data_int(y1, get_data_int(y));
  Tensor* loss1 = cross_entropy(ctx1, x1, y1);
  Graph g1(ctx1);
  g1.forward(loss1);
  g1.compute();
  EXPECT_EQ(get_data(loss1)[0], first) << "the loss depends on the thread count";
}

}  // namespace
}  // namespace retort::test
