// Views and copies: reshape, permute, transpose, slice, contiguous, cast, concat, fill. Forward against
// float64 index arithmetic, gradients against central differences, every dim, strided inputs, bf16 / f16
// storage, and bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>

#include "expect_error.h"
#include "harness.h"

namespace retort::test {
namespace {

using Index = std::array<int64_t, 4>;

// Calls f(i) for every index of a Ref, i[0] fastest (the storage order of Ref::v).
template <typename F>
void for_each_index(const int64_t ne[4], F&& f) {
  Index i{};
  for (i[3] = 0; i[3] < ne[3]; ++i[3])
    for (i[2] = 0; i[2] < ne[2]; ++i[2])
      for (i[1] = 0; i[1] < ne[1]; ++i[1])
        for (i[0] = 0; i[0] < ne[0]; ++i[0]) f(i);
}

Ref shaped(const int64_t ne[4]) {
  Ref r;
  for (int d = 0; d < 4; ++d) r.ne[d] = ne[d];
  r.v.assign(size_t(r.size()), 0.0);
  return r;
}

double at(const Ref& r, const Index& i) {
  return r.at(i[0], i[1], i[2], i[3]);
}
double& at(Ref& r, const Index& i) {
  return r.at(i[0], i[1], i[2], i[3]);
}

// ggml permute: dim d of x becomes dim axes[d] of the result.
Ref permute_ref(const Ref& x, const int axes[4]) {
  int64_t ne[4];
  for (int d = 0; d < 4; ++d) ne[axes[d]] = x.ne[d];
  Ref o = shaped(ne);
  for_each_index(x.ne, [&](const Index& i) {
    Index j;
    for (int d = 0; d < 4; ++d) j[size_t(axes[d])] = i[size_t(d)];
    at(o, j) = at(x, i);
  });
  return o;
}

Ref slice_ref(const Ref& x, int dim, int64_t start, int64_t len) {
  int64_t ne[4] = {x.ne[0], x.ne[1], x.ne[2], x.ne[3]};
  ne[dim] = len;
  Ref o = shaped(ne);
  for_each_index(ne, [&](const Index& i) {
    Index j = i;
    j[size_t(dim)] += start;
    at(o, i) = at(x, j);
  });
  return o;
}

Ref concat_ref(const Ref& a, const Ref& b, int dim) {
  int64_t ne[4] = {a.ne[0], a.ne[1], a.ne[2], a.ne[3]};
  ne[dim] += b.ne[dim];
  Ref o = shaped(ne);
  for_each_index(ne, [&](const Index& i) {
    Index j = i;
    if (i[size_t(dim)] < a.ne[dim]) {
      at(o, i) = at(a, j);
    } else {
      j[size_t(dim)] -= a.ne[dim];
      at(o, i) = at(b, j);
    }
  });
  return o;
}

const int kTranspose[4] = {1, 0, 2, 3};

// ---- reshape ----------------------------------------------------------------------------------------------

TEST(ViewOps, ReshapeKeepsTheElementOrder) {
  const Shape targets[] = {{12}, {2, 6}, {4, 3}, {2, 3, 2}, {1, 2, 3, 2}, {12, 1}};
  int k = 0;
  for (DType dt : {DType::F32, DType::BF16})
    for (const Shape& s : targets) {
      OpCase c;
      c.name = std::string("reshape_") + dtype_name(dt) + std::to_string(k++);
      c.inputs = {{Shape{3, 4}, dt}};
      c.build = [s](Context& ctx, const std::vector<Tensor*>& in) { return reshape(ctx, in[0], s); };
      c.reference = [](const std::vector<Ref>& in) { return in[0].v; };
      c.fwd_tol = 0;  // a view: bit-identical values
      c.grad_tol = 1e-10;
      EXPECT_TRUE(run_case(c));
    }
}

// ---- permute / transpose ----------------------------------------------------------------------------------

TEST(ViewOps, EveryPermutationOf4D) {
  int axes[4] = {0, 1, 2, 3};
  int k = 0;
  do {
    OpCase c;
    c.name = "permute_" + std::to_string(axes[0]) + std::to_string(axes[1]) + std::to_string(axes[2]) +
             std::to_string(axes[3]);
    c.inputs = {{Shape{2, 3, 4, 5}}};
    std::array<int, 4> a = {axes[0], axes[1], axes[2], axes[3]};
    // Read through contiguous() so the check covers the strided copy too.
    c.build = [a](Context& ctx, const std::vector<Tensor*>& in) {
      return contiguous(ctx, permute(ctx, in[0], a[0], a[1], a[2], a[3]));
    };
    c.reference = [a](const std::vector<Ref>& in) { return permute_ref(in[0], a.data()).v; };
    c.fwd_tol = 0;
    c.grad_tol = 1e-10;
    EXPECT_TRUE(run_case(c));
    ++k;
  } while (std::next_permutation(axes, axes + 4));
  EXPECT_EQ(k, 24);
}

TEST(ViewOps, PermuteOutputIsTheViewItself) {
  // The harness reads the non-contiguous view directly (get_data honours strides); gradient flows through it.
  OpCase c;
  c.name = "permute_view_output";
  c.inputs = {{Shape{3, 4, 5}}};
  c.build = [](Context& ctx, const std::vector<Tensor*>& in) { return permute(ctx, in[0], 2, 0, 1, 3); };
  const int axes[4] = {2, 0, 1, 3};
  c.reference = [axes](const std::vector<Ref>& in) { return permute_ref(in[0], axes).v; };
  c.fwd_tol = 0;
  EXPECT_TRUE(run_case(c));
}

TEST(ViewOps, TransposeShapesAndDTypes) {
  const Shape shapes[] = {{5}, {3, 7}, {2, 3, 4}, {2, 2, 3, 5}};
  int k = 0;
  for (DType dt : {DType::F32, DType::BF16, DType::F16})
    for (const Shape& s : shapes) {
      OpCase c;
      c.name = std::string("transpose_") + dtype_name(dt) + std::to_string(k++);
      c.inputs = {{s, dt}};
      c.build = [](Context& ctx, const std::vector<Tensor*>& in) { return transpose(ctx, in[0]); };
      c.reference = [](const std::vector<Ref>& in) { return permute_ref(in[0], kTranspose).v; };
      c.fwd_tol = 0;
      c.grad_tol = 1e-10;
      EXPECT_TRUE(run_case(c));
    }
}

TEST(ViewOps, DoubleTransposeIsIdentity) {
  OpCase c;
  c.name = "transpose_twice";
  c.inputs = {{Shape{4, 6}}};
  c.build = [](Context& ctx, const std::vector<Tensor*>& in) {
    return transpose(ctx, transpose(ctx, in[0]));
  };
  c.reference = [](const std::vector<Ref>& in) { return in[0].v; };
  c.fwd_tol = 0;
  EXPECT_TRUE(run_case(c));
}

// ---- slice ------------------------------------------------------------------------------------------------

TEST(ViewOps, SliceAlongEveryDim) {
  struct W {
    int dim;
    int64_t start, len;
  };
  // Input [3, 4, 5, 6]: ne = {6, 5, 4, 3}.
  const W windows[] = {{0, 0, 6}, {0, 1, 3}, {0, 5, 1}, {1, 0, 2}, {1, 2, 3}, {1, 4, 1},
                       {2, 1, 2}, {2, 0, 4}, {2, 3, 1}, {3, 1, 2}, {3, 0, 1}, {3, 2, 1}};
  for (DType dt : {DType::F32, DType::BF16})
    for (const W& w : windows) {
      OpCase c;
      c.name = std::string("slice_") + dtype_name(dt) + "_d" + std::to_string(w.dim) + "_" +
               std::to_string(w.start) + "_" + std::to_string(w.len);
      c.inputs = {{Shape{3, 4, 5, 6}, dt}};
      c.build = [w](Context& ctx, const std::vector<Tensor*>& in) {
        return slice(ctx, in[0], w.dim, w.start, w.len);
      };
      c.reference = [w](const std::vector<Ref>& in) { return slice_ref(in[0], w.dim, w.start, w.len).v; };
      c.fwd_tol = 0;
      c.grad_tol = 1e-10;
      EXPECT_TRUE(run_case(c));
    }
}

TEST(ViewOps, SliceOfSliceAndOfTransposed) {
  OpCase c;
  c.name = "slice_nested";
  c.inputs = {{Shape{6, 8}}};
  c.build = [](Context& ctx, const std::vector<Tensor*>& in) {
    Tensor* t = transpose(ctx, in[0]);                   // [8, 6]
    return slice(ctx, slice(ctx, t, 1, 2, 5), 0, 1, 4);  // rows 2..6, cols 1..4
  };
  c.reference = [](const std::vector<Ref>& in) {
    return slice_ref(slice_ref(permute_ref(in[0], kTranspose), 1, 2, 5), 0, 1, 4).v;
  };
  c.fwd_tol = 0;
  EXPECT_TRUE(run_case(c));
}

TEST(ViewOps, OverlappingSlicesSumTheirGradients) {
  OpCase c;
  c.name = "slice_overlap";
  c.inputs = {{Shape{4, 7}}};
  c.build = [](Context& ctx, const std::vector<Tensor*>& in) {
    Tensor* a = slice(ctx, in[0], 0, 0, 5);
    Tensor* b = slice(ctx, in[0], 0, 2, 5);
    return mul(ctx, a, b);
  };
  c.reference = [](const std::vector<Ref>& in) {
    Ref a = slice_ref(in[0], 0, 0, 5), b = slice_ref(in[0], 0, 2, 5);
    for (size_t i = 0; i < a.v.size(); ++i) a.v[i] *= b.v[i];
    return a.v;
  };
  c.fwd_tol = 1e-14;
  c.grad_tol = 1e-9;
  EXPECT_TRUE(run_case(c));
}

// ---- contiguous / cast ------------------------------------------------------------------------------------

TEST(ViewOps, ContiguousOfStridedViews) {
  OpCase c;
  c.name = "contiguous_slice_permute";
  c.inputs = {{Shape{3, 5, 4}, DType::BF16}};
  const int axes[4] = {1, 2, 0, 3};
  c.build = [axes](Context& ctx, const std::vector<Tensor*>& in) {
    Tensor* v = permute(ctx, slice(ctx, in[0], 1, 1, 3), axes[0], axes[1], axes[2], axes[3]);
    Tensor* y = contiguous(ctx, v);
    EXPECT_TRUE(y->is_contiguous());
    EXPECT_EQ(y->dtype, DType::BF16);
    return y;
  };
  c.reference = [axes](const std::vector<Ref>& in) { return permute_ref(slice_ref(in[0], 1, 1, 3), axes).v; };
  c.fwd_tol = 0;
  c.grad_tol = 1e-10;
  EXPECT_TRUE(run_case(c));
}

double round_to(DType t, double x) {
  float f = float(x);
  if (t == DType::BF16) return bf16_to_f32(f32_to_bf16(f));
  if (t == DType::F16) return f16_to_f32(f32_to_f16(f));
  return f;
}

TEST(ViewOps, CastRoundsExactlyLikeTheConversions) {
  const std::pair<DType, DType> pairs[] = {{DType::F32, DType::BF16}, {DType::F32, DType::F16},
                                           {DType::BF16, DType::F32}, {DType::F16, DType::F32},
                                           {DType::BF16, DType::F16}, {DType::F16, DType::BF16},
                                           {DType::F32, DType::F32}};
  for (auto [from, to] : pairs) {
    OpCase c;
    c.name = std::string("cast_") + dtype_name(from) + "_" + dtype_name(to);
    c.inputs = {{Shape{5, 9}, from, true, -3, 3}};
    c.build = [to](Context& ctx, const std::vector<Tensor*>& in) {
      // Through a transposed view: the cast also makes the layout contiguous.
      return cast(ctx, transpose(ctx, in[0]), to);
    };
    c.reference = [to](const std::vector<Ref>& in) {
      Vec o = permute_ref(in[0], kTranspose).v;
      for (double& x : o) x = round_to(to, x);
      return o;
    };
    c.fwd_tol = 0;         // rounding is exact, so the reference reproduces it bit for bit
    c.check_grad = false;  // rounding is a step function: its finite differences say nothing
    EXPECT_TRUE(run_case(c));
  }
}

TEST(ViewOps, CastGradientPassesThrough) {
  for (DType to : {DType::BF16, DType::F16, DType::F32}) {
    OpCase c;
    c.name = std::string("cast_grad_") + dtype_name(to);
    c.inputs = {{Shape{4, 6}}};
    c.build = [to](Context& ctx, const std::vector<Tensor*>& in) { return cast(ctx, in[0], to); };
    c.reference = [](const std::vector<Ref>& in) { return in[0].v; };  // identity, up to output rounding
    // Output rounding: at most 2^-9 (bf16) or 2^-12 (f16) relative per element.
    c.fwd_tol = to == DType::F32 ? 0 : to == DType::BF16 ? 4e-6 : 6e-8;
    c.grad_tol = 1e-10;  // the gradient passes through unrounded, so it is the weight exactly
    EXPECT_TRUE(run_case(c));
  }
}

TEST(ViewOps, IntegerCastsAndCopies) {
  for (auto [from, to] : {std::pair{DType::I32, DType::I64}, std::pair{DType::I64, DType::I32},
                          std::pair{DType::I32, DType::I32}}) {
    OpCase c;
    c.name = std::string("cast_") + dtype_name(from) + "_" + dtype_name(to);
    c.inputs = {{Shape{3, 7}, from, false, -1000, 1000}};
    c.build = [to](Context& ctx, const std::vector<Tensor*>& in) {
      return cast(ctx, transpose(ctx, in[0]), to);
    };
    c.reference = [](const std::vector<Ref>& in) { return permute_ref(in[0], kTranspose).v; };
    c.fwd_tol = 0;
    c.check_grad = false;
    EXPECT_TRUE(run_case(c));
  }
}

TEST(ViewOps, LargeIntegersSurviveACopy) {
  // i64 values beyond 2^24 would be rounded by a detour through f32.
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.input(DType::I64, {2, 2}, "ids");
  std::vector<int64_t> v = {(int64_t(1) << 40) + 1, -(int64_t(1) << 33) - 7, 16777217, 3};
  set_data_int(x, v);
  Tensor* y = contiguous(ctx, transpose(ctx, x));
  y->flags |= kOutput;
  Graph g(ctx);
  g.forward(y);
  g.compute();
  EXPECT_EQ(get_data_int(y), (std::vector<int64_t>{v[0], v[2], v[1], v[3]}));
}

// ---- concat -----------------------------------------------------------------------------------------------

TEST(ViewOps, ConcatAlongEveryDim) {
  // a [2, 3, 4, 5] (ne = {5, 4, 3, 2}); b differs from a in the concat dim only.
  for (DType dt : {DType::F32, DType::BF16})
    for (int dim = 0; dim < 4; ++dim) {
      Shape sb = {2, 3, 4, 5};
      sb[size_t(3 - dim)] = 2;
      OpCase c;
      c.name = std::string("concat_") + dtype_name(dt) + "_d" + std::to_string(dim);
      c.inputs = {{Shape{2, 3, 4, 5}, dt}, {sb, dt}};
      c.build = [dim](Context& ctx, const std::vector<Tensor*>& in) {
        return concat(ctx, in[0], in[1], dim);
      };
      c.reference = [dim](const std::vector<Ref>& in) { return concat_ref(in[0], in[1], dim).v; };
      c.fwd_tol = 0;
      c.grad_tol = 1e-10;
      EXPECT_TRUE(run_case(c));
    }
}

TEST(ViewOps, ConcatOfStridedInputs) {
  for (int dim = 0; dim < 2; ++dim) {
    OpCase c;
    c.name = "concat_strided_d" + std::to_string(dim);
    c.inputs = {{Shape{4, 3}}, {Shape{4, 3}}};
    c.build = [dim](Context& ctx, const std::vector<Tensor*>& in) {
      return concat(ctx, transpose(ctx, in[0]), slice(ctx, transpose(ctx, in[1]), 0, 0, 4), dim);
    };
    c.reference = [dim](const std::vector<Ref>& in) {
      return concat_ref(permute_ref(in[0], kTranspose), permute_ref(in[1], kTranspose), dim).v;
    };
    c.fwd_tol = 0;
    c.grad_tol = 1e-10;
    EXPECT_TRUE(run_case(c));
  }
}

TEST(ViewOps, ConcatWithItselfAlongEveryDim) {
  // a == b: the kernel must pick the half by index, not by comparing the operands.
  for (int dim = 0; dim < 4; ++dim) {
    OpCase c;
    c.name = "concat_self_d" + std::to_string(dim);
    c.inputs = {{Shape{2, 3, 2, 3}}};
    c.build = [dim](Context& ctx, const std::vector<Tensor*>& in) { return concat(ctx, in[0], in[0], dim); };
    c.reference = [dim](const std::vector<Ref>& in) { return concat_ref(in[0], in[0], dim).v; };
    c.fwd_tol = 0;
    c.grad_tol = 1e-10;
    EXPECT_TRUE(run_case(c));
  }
}

TEST(ViewOps, ConcatOfLargeIntegersIsExact) {
  for (DType dt : {DType::I32, DType::I64})
    for (int dim = 0; dim < 2; ++dim) {
      Context ctx(default_cpu_backend());
      Tensor* a = ctx.input(dt, {2, 2}, "a");
      Tensor* b = ctx.input(dt, {2, 2}, "b");
      const int64_t big = dt == DType::I64 ? (int64_t(1) << 40) : (int64_t(1) << 30);
      set_data_int(a, {big + 1, -big - 3, 16777217, 5});
      set_data_int(b, {7, big + 11, -16777219, big - 1});
      Tensor* c = concat(ctx, a, transpose(ctx, b), dim);
      c->flags |= kOutput;
      Graph g(ctx);
      g.forward(c);
      g.compute();
      std::vector<int64_t> want =
          dim == 0 ? std::vector<int64_t>{big + 1, -big - 3, 7, -16777219, 16777217, 5, big + 11, big - 1}
                   : std::vector<int64_t>{big + 1, -big - 3, 16777217, 5, 7, -16777219, big + 11, big - 1};
      EXPECT_EQ(get_data_int(c), want) << dtype_name(dt) << " dim " << dim;
    }
}

// ---- fill -------------------------------------------------------------------------------------------------

TEST(ViewOps, FillEveryDType) {
  const std::pair<DType, double> cases[] = {
      {DType::F32, 2.5}, {DType::BF16, 0.1}, {DType::F16, -3.3}, {DType::I32, 7}, {DType::I64, -2}};
  for (auto [dt, value] : cases) {
    OpCase c;
    c.name = std::string("fill_") + dtype_name(dt);
    const int64_t ne[kMaxDims] = {5, 3, 2, 1};
    c.build = [dt, value, ne](Context& ctx, const std::vector<Tensor*>&) {
      return fill(ctx, dt, ne, float(value));
    };
    c.reference = [dt, value](const std::vector<Ref>&) {
      return Vec(30, is_float(dt) ? round_to(dt, value) : value);
    };
    c.fwd_tol = 0;
    c.check_grad = false;
    EXPECT_TRUE(run_case(c));
  }
}

TEST(ViewOps, FillAsAConstantOperand) {
  OpCase c;
  c.name = "fill_operand";
  c.inputs = {{Shape{3, 4}}};
  c.build = [](Context& ctx, const std::vector<Tensor*>& in) {
    return mul(ctx, in[0], fill(ctx, DType::F32, in[0]->ne, -1.5f));
  };
  c.reference = [](const std::vector<Ref>& in) {
    Vec o = in[0].v;
    for (double& x : o) x *= -1.5;
    return o;
  };
  EXPECT_TRUE(run_case(c));
}

// ---- a chain of views -------------------------------------------------------------------------------------

TEST(ViewOps, ChainOfViewsAndCopies) {
  OpCase c;
  c.name = "view_chain";
  c.inputs = {{Shape{2, 3, 4}}, {Shape{4, 2}}};
  const int axes[4] = {2, 0, 1, 3};
  c.build = [axes](Context& ctx, const std::vector<Tensor*>& in) {
    Tensor* p = contiguous(ctx, permute(ctx, in[0], axes[0], axes[1], axes[2], axes[3]));  // [3, 4, 2]
    Tensor* r = reshape(ctx, p, {12, 2});
    Tensor* s = slice(ctx, r, 1, 4, 4);          // rows 4..7: [4, 2]
    return concat(ctx, s, tanh(ctx, in[1]), 0);  // [4, 4]
  };
  c.reference = [axes](const std::vector<Ref>& in) {
    Ref p = permute_ref(in[0], axes);
    Ref r = p;
    r.ne[0] = 2;
    r.ne[1] = 12;
    r.ne[2] = r.ne[3] = 1;
    Ref t = in[1];
    for (double& x : t.v) x = std::tanh(x);
    return concat_ref(slice_ref(r, 1, 4, 4), t, 0).v;
  };
  c.fwd_tol = 1e-13;
  c.grad_tol = 1e-9;
  EXPECT_TRUE(run_case(c));
}

// ---- bad input --------------------------------------------------------------------------------------------

TEST(ViewOps, BadInputThrows) {
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.tensor(DType::F32, {4, 6}, "x");
  Tensor* ids = ctx.tensor(DType::I32, {4, 6}, "ids");
  expect_error([&] { reshape(ctx, x, {25}); }, {"reshape", "'x' f32[4, 6]", "[25]"});
  expect_error([&] { reshape(ctx, x, {2, 0, 12}); }, {"reshape", ">= 1"});
  expect_error([&] { reshape(ctx, permute(ctx, x, 1, 0, 2, 3), {24}); }, {"reshape", "not contiguous"});
  expect_error([&] { permute(ctx, x, 0, 1, 2, 4); }, {"permute", "permutation"});
  expect_error([&] { permute(ctx, x, -1, 1, 2, 3); }, {"permute", "'x'"});
  expect_error([&] { slice(ctx, x, 1, 3, 2); }, {"slice", "[3, 5)", "'x' f32[4, 6]"});
  expect_error([&] { slice(ctx, x, -1, 0, 1); }, {"slice", "dim -1"});
  expect_error([&] { concat(ctx, x, ctx.tensor(DType::F32, {4, 5}), 1); }, {"concat", "[4, 6]", "[4, 5]"});
  expect_error([&] { concat(ctx, x, x, 4); }, {"concat", "dim 4"});
  expect_error([&] { concat(ctx, x, ctx.tensor(DType::BF16, {4, 6}), 0); }, {"concat", "dtypes", "bf16"});
  expect_error([&] { cast(ctx, ids, DType::F32); }, {"cast", "'ids' i32[4, 6]", "f32"});
  expect_error([&] { cast(ctx, x, DType::I32); }, {"cast", "'x'", "i32"});
}

}  // namespace
}  // namespace retort::test
