// Reductions (sum/mean/max over rows and over everything), repeat and reduce_to: forward against float64,
// gradients against central differences, strided and bf16 / f16 inputs, accumulation accuracy, ties and NaN
// in max, and bad input.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <limits>

#include "expect_error.h"
#include "harness.h"

namespace retort::test {
namespace {

using Index = std::array<int64_t, 4>;

template <typename F>
void for_each_index(const int64_t ne[4], F&& f) {
  Index i{};
  for (i[3] = 0; i[3] < ne[3]; ++i[3])
    for (i[2] = 0; i[2] < ne[2]; ++i[2])
      for (i[1] = 0; i[1] < ne[1]; ++i[1])
        for (i[0] = 0; i[0] < ne[0]; ++i[0]) f(i);
}

enum class Red { Sum, Mean, Max };

// One value per row (over dim 0) of x.
Vec rows_ref(const Ref& x, Red r) {
  Vec out;
  for (int64_t row = 0; row < x.ne[1] * x.ne[2] * x.ne[3]; ++row) {
    double s = 0, m = -std::numeric_limits<double>::infinity();
    for (int64_t i = 0; i < x.ne[0]; ++i) {
      double v = x.v[size_t(row * x.ne[0] + i)];
      s += v;
      m = std::max(m, v);
    }
    out.push_back(r == Red::Sum ? s : r == Red::Mean ? s / double(x.ne[0]) : m);
  }
  return out;
}

Vec all_ref(const Ref& x, Red r) {
  double s = 0, m = -std::numeric_limits<double>::infinity();
  for (double v : x.v) {
    s += v;
    m = std::max(m, v);
  }
  return {r == Red::Sum ? s : r == Red::Mean ? s / double(x.v.size()) : m};
}

// Broadcast x to ne.
Vec repeat_ref(const Ref& x, const int64_t ne[4]) {
  Vec out;
  for_each_index(ne, [&](const Index& i) {
    out.push_back(x.at(i[0] % x.ne[0], i[1] % x.ne[1], i[2] % x.ne[2], i[3] % x.ne[3]));
  });
  return out;
}

// Sum x down to ne (each dim of ne is 1 or x's).
Vec reduce_to_ref(const Ref& x, const int64_t ne[4]) {
  Ref o;
  for (int d = 0; d < 4; ++d) o.ne[d] = ne[d];
  o.v.assign(size_t(o.size()), 0.0);
  for_each_index(x.ne, [&](const Index& i) {
    o.at(i[0] % ne[0], i[1] % ne[1], i[2] % ne[2], i[3] % ne[3]) += x.at(i[0], i[1], i[2], i[3]);
  });
  return o.v;
}

// x read through a transposed view: the reference of the view's elements.
Ref transposed(const Ref& x) {
  Ref o;
  o.ne[0] = x.ne[1];
  o.ne[1] = x.ne[0];
  o.ne[2] = x.ne[2];
  o.ne[3] = x.ne[3];
  for_each_index(o.ne, [&](const Index& i) { o.v.push_back(x.at(i[1], i[0], i[2], i[3])); });
  return o;
}

struct RedParam {
  const char* name;
  Tensor* (*build)(Context&, Tensor*);
  Red kind;
  bool rows;
};

const RedParam kReductions[] = {
    {"sum_rows", sum_rows, Red::Sum, true}, {"mean_rows", mean_rows, Red::Mean, true},
    {"max_rows", max_rows, Red::Max, true}, {"sum", sum, Red::Sum, false},
    {"mean", mean, Red::Mean, false},       {"max", max, Red::Max, false},
};

class Reduction : public ::testing::TestWithParam<RedParam> {};

TEST_P(Reduction, MatchesFloat64AndFiniteDifferences) {
  const RedParam& p = GetParam();
  int k = 0;
  for (Shape s : {Shape{7}, Shape{3, 5}, Shape{4, 1}, Shape{2, 3, 4}, Shape{2, 2, 3, 5}}) {
    OpCase c;
    c.name = std::string(p.name) + "_shape" + std::to_string(k++);
    c.inputs = {{s, DType::F32, true, -2, 2}};
    auto b = p.build;
    c.build = [b](Context& ctx, const std::vector<Tensor*>& in) {
      Tensor* y = b(ctx, in[0]);
      EXPECT_EQ(y->dtype, DType::F32);
      return y;
    };
    Red r = p.kind;
    bool rows = p.rows;
    c.reference = [r, rows](const std::vector<Ref>& in) {
      return rows ? rows_ref(in[0], r) : all_ref(in[0], r);
    };
    c.fwd_tol = 1e-13;  // f32 output of a double accumulation
    c.grad_tol = 1e-9;  // max: no ties among random values, so the arg-max is stable under the FD step
    EXPECT_TRUE(run_case(c));
  }
}

TEST_P(Reduction, StridedInput) {
  const RedParam& p = GetParam();
  OpCase c;
  c.name = std::string(p.name) + "_transposed";
  c.inputs = {{Shape{3, 6, 5}}};
  auto b = p.build;
  c.build = [b](Context& ctx, const std::vector<Tensor*>& in) { return b(ctx, transpose(ctx, in[0])); };
  Red r = p.kind;
  bool rows = p.rows;
  c.reference = [r, rows](const std::vector<Ref>& in) {
    Ref t = transposed(in[0]);
    return rows ? rows_ref(t, r) : all_ref(t, r);
  };
  c.fwd_tol = 1e-13;
  c.grad_tol = 1e-9;
  EXPECT_TRUE(run_case(c));
}

TEST_P(Reduction, SlicedInput) {
  const RedParam& p = GetParam();
  OpCase c;
  c.name = std::string(p.name) + "_sliced";
  c.inputs = {{Shape{4, 9}}};
  auto b = p.build;
  c.build = [b](Context& ctx, const std::vector<Tensor*>& in) { return b(ctx, slice(ctx, in[0], 0, 2, 5)); };
  Red r = p.kind;
  bool rows = p.rows;
  c.reference = [r, rows](const std::vector<Ref>& in) {
    Ref s;
    s.ne[0] = 5;
    s.ne[1] = 4;
    for (int64_t row = 0; row < 4; ++row)
      for (int64_t i = 2; i < 7; ++i) s.v.push_back(in[0].at(i, row));
    return rows ? rows_ref(s, r) : all_ref(s, r);
  };
  c.fwd_tol = 1e-13;
  c.grad_tol = 1e-9;
  EXPECT_TRUE(run_case(c));
}

TEST_P(Reduction, LowPrecisionInputs) {
  const RedParam& p = GetParam();
  for (DType dt : {DType::BF16, DType::F16}) {
    OpCase c;
    c.name = std::string(p.name) + "_" + dtype_name(dt);
    // Rounded inputs tie easily, and at a tie the finite difference splits what autodiff gives to the first
    // arg-max: max gets short rows, where a tie at the top is unlikely (the seed is fixed, so this is stable).
    c.inputs = {{p.kind == Red::Max ? Shape{3, 5} : Shape{3, 33}, dt, true, -4, 4}};
    auto b = p.build;
    c.build = [b](Context& ctx, const std::vector<Tensor*>& in) { return b(ctx, in[0]); };
    Red r = p.kind;
    bool rows = p.rows;
    c.reference = [r, rows](const std::vector<Ref>& in) {
      return rows ? rows_ref(in[0], r) : all_ref(in[0], r);
    };
    // The reference sees the stored (rounded) inputs, and the math is f32 or better: f32 rounding only.
    c.fwd_tol = 1e-13;
    c.grad_tol = 1e-9;
    EXPECT_TRUE(run_case(c));
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, Reduction, ::testing::ValuesIn(kReductions),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(ReduceOps, LongRowsAccumulateInDouble) {
  // 300,000 positive values: a plain f32 running sum is off by ~1e-5 relative (nmse ~1e-10); the double
  // accumulation leaves only the final f32 rounding.
  using Build = Tensor* (*)(Context&, Tensor*);
  const std::pair<const char*, Build> ops[] = {
      {"sum_rows", sum_rows}, {"mean_rows", mean_rows}, {"sum", sum}, {"mean", mean}};
  for (auto [name, op] : ops) {
    OpCase c;
    c.name = std::string("long_") + name;
    c.inputs = {{Shape{3, 100000}, DType::F32, false, 0.0, 1.0}};
    auto b = op;
    c.build = [b](Context& ctx, const std::vector<Tensor*>& in) { return b(ctx, in[0]); };
    bool rows = std::string(name).find("rows") != std::string::npos;
    Red r = std::string(name).find("mean") != std::string::npos ? Red::Mean : Red::Sum;
    c.reference = [r, rows](const std::vector<Ref>& in) {
      return rows ? rows_ref(in[0], r) : all_ref(in[0], r);
    };
    c.fwd_tol = 1e-13;
    c.check_grad = false;
    EXPECT_TRUE(run_case(c));
  }
}

TEST(ReduceOps, MaxOfNegativeValues) {
  // A max that started from 0 instead of -inf would return 0 here.
  for (auto op : {max_rows, max}) {
    OpCase c;
    c.name = op == max ? "max_negative" : "max_rows_negative";
    c.inputs = {{Shape{4, 6}, DType::F32, true, -3, -1}};
    c.build = [op](Context& ctx, const std::vector<Tensor*>& in) { return op(ctx, in[0]); };
    bool rows = op == max_rows;
    c.reference = [rows](const std::vector<Ref>& in) {
      return rows ? rows_ref(in[0], Red::Max) : all_ref(in[0], Red::Max);
    };
    c.fwd_tol = 1e-13;
    c.grad_tol = 1e-9;
    EXPECT_TRUE(run_case(c));
  }
}

// Value and gradient of sum(op(x)) for a given x.
std::pair<std::vector<float>, std::vector<float>> run_reduction(Tensor* (*op)(Context&, Tensor*),
                                                                const Shape& s, const std::vector<float>& x) {
  Context ctx(default_cpu_backend());
  Tensor* p = ctx.param(DType::F32, s, "x");
  set_data(p, x);
  Tensor* y = op(ctx, p);
  y->flags |= kOutput;
  Graph g(ctx);
  g.backward(sum(ctx, y));
  g.compute();
  return {get_data(y), get_data(g.grad(p))};
}

TEST(ReduceOps, MaxGradientGoesToTheFirstArgMaxOnTies) {
  auto [y, gx] = run_reduction(max_rows, {2, 4}, {1, 3, 3, 2, 5, 5, 5, 5});
  EXPECT_EQ(y, (std::vector<float>{3, 5}));
  EXPECT_EQ(gx, (std::vector<float>{0, 1, 0, 0, 1, 0, 0, 0}));
  auto [m, gm] = run_reduction(max, {2, 2}, {1, 3, 3, 2});
  EXPECT_EQ(m, (std::vector<float>{3}));
  EXPECT_EQ(gm, (std::vector<float>{0, 1, 0, 0}));
}

TEST(ReduceOps, MaxPropagatesNaN) {
  // A NaN must not be skipped over: a max that hides it hides the fault that made it.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto [y, gy] = run_reduction(max_rows, {2, 3}, {1, nan, 2, 4, 5, 6});
  EXPECT_TRUE(std::isnan(y[0]));
  EXPECT_EQ(y[1], 6.0f);
  auto [m, gm] = run_reduction(max, {3}, {nan, 1, 2});
  EXPECT_TRUE(std::isnan(m[0]));
  auto [m2, gm2] = run_reduction(max, {3}, {1, 2, nan});
  EXPECT_TRUE(std::isnan(m2[0]));
}

TEST(ReduceOps, SumOfInfinities) {
  const float inf = std::numeric_limits<float>::infinity();
  auto [y, g] = run_reduction(sum_rows, {2, 2}, {inf, 1, inf, -inf});
  EXPECT_EQ(y[0], inf);
  EXPECT_TRUE(std::isnan(y[1]));
}

// ---- repeat / reduce_to -----------------------------------------------------------------------------------

struct BcastCase {
  Shape small;
  std::array<int64_t, 4> big;  // ggml order
};

const BcastCase kBcast[] = {
    {{1}, {5, 3, 1, 1}},       {{3, 1}, {4, 3, 1, 1}},       {{4}, {4, 3, 1, 1}},
    {{2, 1, 4}, {4, 3, 2, 1}}, {{2, 1, 3, 1}, {5, 3, 2, 2}}, {{1, 1, 1, 6}, {6, 2, 3, 2}},
    {{3, 4}, {4, 3, 1, 1}},  // same shape: a plain copy / sum
};

TEST(ReduceOps, RepeatBroadcastsEveryPattern) {
  int k = 0;
  for (const BcastCase& bc : kBcast)
    for (DType dt : {DType::F32, DType::BF16}) {
      OpCase c;
      c.name = std::string("repeat_") + dtype_name(dt) + std::to_string(k++);
      c.inputs = {{bc.small, dt}};
      auto big = bc.big;
      c.build = [big, dt](Context& ctx, const std::vector<Tensor*>& in) {
        Tensor* y = repeat(ctx, in[0], big.data());
        EXPECT_EQ(y->dtype, dt);
        return y;
      };
      c.reference = [big](const std::vector<Ref>& in) { return repeat_ref(in[0], big.data()); };
      c.fwd_tol = 0;
      c.grad_tol = 1e-10;
      EXPECT_TRUE(run_case(c));
    }
}

TEST(ReduceOps, RepeatOfStridedInput) {
  OpCase c;
  c.name = "repeat_sliced";
  c.inputs = {{Shape{5, 3, 4}}};  // ne {4, 3, 5}; column 1 of every row is a strided {1, 3, 5}
  const int64_t big[4] = {4, 3, 5, 2};
  c.build = [big](Context& ctx, const std::vector<Tensor*>& in) {
    Tensor* col = slice(ctx, in[0], 0, 1, 1);
    EXPECT_FALSE(col->is_contiguous());
    return repeat(ctx, col, big);
  };
  c.reference = [big](const std::vector<Ref>& in) {
    Ref col;
    col.ne[0] = 1;
    col.ne[1] = 3;
    col.ne[2] = 5;
    for (int64_t i2 = 0; i2 < 5; ++i2)
      for (int64_t i1 = 0; i1 < 3; ++i1) col.v.push_back(in[0].at(1, i1, i2));
    return repeat_ref(col, big);
  };
  c.fwd_tol = 0;
  c.grad_tol = 1e-10;
  EXPECT_TRUE(run_case(c));
}

TEST(ReduceOps, ReduceToSumsEveryPattern) {
  int k = 0;
  for (const BcastCase& bc : kBcast)
    for (DType dt : {DType::F32, DType::BF16}) {
      // x has the big shape; the target is the small one.
      Shape big_shape;
      for (int d = 3; d >= 0; --d) big_shape.push_back(bc.big[size_t(d)]);
      Context probe(default_cpu_backend());
      Tensor* small = probe.tensor(DType::F32, bc.small);
      std::array<int64_t, 4> target = {small->ne[0], small->ne[1], small->ne[2], small->ne[3]};
      OpCase c;
      c.name = std::string("reduce_to_") + dtype_name(dt) + std::to_string(k++);
      c.inputs = {{big_shape, dt}};
      c.build = [target](Context& ctx, const std::vector<Tensor*>& in) {
        Tensor* y = reduce_to(ctx, in[0], target.data());
        EXPECT_EQ(y->dtype, DType::F32);
        return y;
      };
      c.reference = [target](const std::vector<Ref>& in) { return reduce_to_ref(in[0], target.data()); };
      c.fwd_tol = 1e-13;
      c.grad_tol = 1e-10;
      EXPECT_TRUE(run_case(c));
    }
}

TEST(ReduceOps, ReduceToOfStridedInput) {
  OpCase c;
  c.name = "reduce_to_transposed";
  c.inputs = {{Shape{2, 6, 5}}};  // ne {5, 6, 2}; transposed: {6, 5, 2}
  const int64_t target[4] = {6, 1, 2, 1};
  c.build = [target](Context& ctx, const std::vector<Tensor*>& in) {
    return reduce_to(ctx, transpose(ctx, in[0]), target);
  };
  c.reference = [target](const std::vector<Ref>& in) { return reduce_to_ref(transposed(in[0]), target); };
  c.fwd_tol = 1e-13;
  c.grad_tol = 1e-10;
  EXPECT_TRUE(run_case(c));
}

TEST(ReduceOps, ReductionsCompose) {
  // mean_rows(x) broadcast back and subtracted: a centred x, the pattern every normalization uses.
  OpCase c;
  c.name = "centre_rows";
  c.inputs = {{Shape{4, 7}}};
  c.build = [](Context& ctx, const std::vector<Tensor*>& in) {
    Tensor* centred = sub(ctx, in[0], mean_rows(ctx, in[0]));
    return sum_rows(ctx, mul(ctx, centred, centred));
  };
  c.reference = [](const std::vector<Ref>& in) {
    Vec m = rows_ref(in[0], Red::Mean), out;
    for (int64_t r = 0; r < 4; ++r) {
      double s = 0;
      for (int64_t i = 0; i < 7; ++i) {
        double d = in[0].at(i, r) - m[size_t(r)];
        s += d * d;
      }
      out.push_back(s);
    }
    return out;
  };
  c.fwd_tol = 1e-12;
  c.grad_tol = 1e-8;
  EXPECT_TRUE(run_case(c));
}

// ---- bad input --------------------------------------------------------------------------------------------

TEST(ReduceOps, BadInputThrows) {
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.tensor(DType::F32, {3, 4}, "x");
  Tensor* ids = ctx.tensor(DType::I64, {3, 4}, "ids");
  using Build = Tensor* (*)(Context&, Tensor*);
  const std::pair<const char*, Build> ops[] = {{"sum_rows", sum_rows}, {"mean_rows", mean_rows},
                                               {"max_rows", max_rows}, {"sum", sum},
                                               {"mean", mean},         {"max", max}};
  for (auto [name, op] : ops) {
    expect_error([&] { op(ctx, ids); }, {name, "'ids' i64[3, 4]", "float"});
    expect_error([&] { op(ctx, nullptr); }, {name, "null"});
  }
  const int64_t bad[4] = {4, 2, 1, 1};
  expect_error([&] { repeat(ctx, x, bad); }, {"repeat", "'x' f32[3, 4]", "[2, 4]"});
  expect_error([&] { reduce_to(ctx, x, bad); }, {"reduce_to", "'x' f32[3, 4]", "[2, 4]"});
  const int64_t ok[4] = {4, 3, 1, 1};
  expect_error([&] { repeat(ctx, ids, ok); }, {"repeat", "float"});
  expect_error([&] { reduce_to(ctx, ids, ok); }, {"reduce_to", "float"});
}

}  // namespace
}  // namespace retort::test
