// Every core op on CUDA against a float64 reference, with its gradients against central finite differences
// (the harness's run_case on the CUDA backend; backward ops run on CUDA too). Matmul has its own file.
#include <gtest/gtest.h>

#include <cmath>

#include "cuda_test_util.h"
#include "rope_reference.h"

namespace retort::test {
namespace {

class CudaOps : public CudaTest {};

using Refs = std::vector<Ref>;

// ---- references ------------------------------------------------------------------------------------------

Vec map1(const Ref& x, double (*f)(double)) {
  Vec o(x.v.size());
  for (size_t i = 0; i < o.size(); ++i) o[i] = f(x.v[i]);
  return o;
}

Vec map2(const Ref& a, const Ref& b, double (*f)(double, double)) {
  Ref out = a;
  for (int64_t i3 = 0; i3 < a.ne[3]; ++i3)
    for (int64_t i2 = 0; i2 < a.ne[2]; ++i2)
      for (int64_t i1 = 0; i1 < a.ne[1]; ++i1)
        for (int64_t i0 = 0; i0 < a.ne[0]; ++i0)
          out.at(i0, i1, i2, i3) =
              f(a.at(i0, i1, i2, i3), b.at(i0 % b.ne[0], i1 % b.ne[1], i2 % b.ne[2], i3 % b.ne[3]));
  return out.v;
}

// Applies f to each row of x (n = ne[0] elements), writing m outputs per row.
template <typename F>
Vec per_row(const Ref& x, int64_t m, F f) {
  const int64_t n = x.ne[0], rows = x.size() / n;
  Vec out(size_t(rows * m));
  for (int64_t r = 0; r < rows; ++r) f(r, x.v.data() + r * n, out.data() + r * m, n);
  return out;
}

double r_neg(double x) {
  return -x;
}
double r_exp(double x) {
  return std::exp(x);
}
double r_log(double x) {
  return std::log(x);
}
double r_sqrt(double x) {
  return std::sqrt(x);
}
double r_rsqrt(double x) {
  return 1 / std::sqrt(x);
}
double r_tanh(double x) {
  return std::tanh(x);
}
double r_relu(double x) {
  return x > 0 ? x : 0;
}
double r_gelu(double x) {
  return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}
double r_silu(double x) {
  return x / (1 + std::exp(-x));
}
double r_add(double a, double b) {
  return a + b;
}
double r_sub(double a, double b) {
  return a - b;
}
double r_mul(double a, double b) {
  return a * b;
}
double r_div(double a, double b) {
  return a / b;
}

struct UnaryOp {
  const char* name;
  Tensor* (*build)(Context&, Tensor*);
  double (*ref)(double);
  double lo, hi;
};
const UnaryOp kUnary[] = {
    {"neg", neg, r_neg, -2, 2},     {"exp", exp, r_exp, -2, 2},        {"log", log, r_log, 0.2, 3},
    {"sqrt", sqrt, r_sqrt, 0.2, 3}, {"rsqrt", rsqrt, r_rsqrt, 0.2, 3}, {"tanh", tanh, r_tanh, -2, 2},
    {"relu", relu, r_relu, -2, 2},  {"gelu", gelu, r_gelu, -3, 3},     {"silu", silu, r_silu, -3, 3},
};

struct BinaryOp {
  const char* name;
  Tensor* (*build)(Context&, Tensor*, Tensor*);
  double (*ref)(double, double);
};
const BinaryOp kBinary[] = {
    {"add", add, r_add}, {"sub", sub, r_sub}, {"mul", mul, r_mul}, {"div", div, r_div}};

// ---- elementwise -----------------------------------------------------------------------------------------

TEST_F(CudaOps, UnaryMatchFloat64AndFiniteDifferences) {
  for (const UnaryOp& p : kUnary)
    for (Shape s : {Shape{7}, Shape{3, 5}, Shape{2, 2, 3, 5}}) {
      OpCase c;
      c.name = std::string("cuda_") + p.name + "_" + std::to_string(s.size());
      c.inputs = {{s, DType::F32, true, p.lo, p.hi}};
      auto b = p.build;
      c.build = [b](Context& ctx, const std::vector<Tensor*>& in) { return b(ctx, in[0]); };
      auto f = p.ref;
      c.reference = [f](const Refs& in) { return map1(in[0], f); };
      c.fwd_tol = 1e-11;  // f32 math with CUDA's expf / tanhf / logf (2 ulp at most)
      c.grad_tol = 1e-8;
      EXPECT_TRUE(run_case(c, &cuda_backend())) << p.name;
    }
}

TEST_F(CudaOps, UnaryOnTransposedBf16Input) {
  for (const UnaryOp& p : kUnary) {
    OpCase c;
    c.name = std::string("cuda_") + p.name + "_bf16_t";
    c.inputs = {{Shape{6, 5}, DType::BF16, true, p.lo, p.hi}};
    auto b = p.build;
    c.build = [b](Context& ctx, const std::vector<Tensor*>& in) { return b(ctx, transpose(ctx, in[0])); };
    auto f = p.ref;
    c.reference = [f](const Refs& in) {
      const Ref& x = in[0];  // ne = {5, 6}; the op sees {6, 5}
      Vec out(size_t(x.size()));
      for (int64_t i1 = 0; i1 < x.ne[0]; ++i1)
        for (int64_t i0 = 0; i0 < x.ne[1]; ++i0) out[size_t(i0 + x.ne[1] * i1)] = f(x.at(i1, i0));
      return out;
    };
    c.fwd_tol = 3e-5;   // bf16 output rounding
    c.grad_tol = 1e-4;  // the gradient flows through bf16-stored activations
    EXPECT_TRUE(run_case(c, &cuda_backend())) << p.name;
  }
}

TEST_F(CudaOps, BinaryBroadcastMatchFloat64AndFiniteDifferences) {
  const std::pair<Shape, Shape> shapes[] = {
      {{4, 6}, {4, 6}}, {{4, 6}, {6}}, {{4, 6}, {4, 1}}, {{3, 4, 5}, {4, 5}}, {{2, 3, 4, 5}, {2, 1, 4, 1}},
      {{5}, {1}}};
  for (const BinaryOp& p : kBinary) {
    int k = 0;
    for (auto& [sa, sb] : shapes) {
      OpCase c;
      c.name = std::string("cuda_") + p.name + std::to_string(k++);
      c.inputs = {{sa, DType::F32, true, -1, 1}, {sb, DType::F32, true, 0.5, 2}};
      auto b = p.build;
      c.build = [b](Context& ctx, const std::vector<Tensor*>& in) { return b(ctx, in[0], in[1]); };
      auto f = p.ref;
      c.reference = [f](const Refs& in) { return map2(in[0], in[1], f); };
      c.fwd_tol = 1e-12;
      c.grad_tol = 1e-8;  // the broadcast operand's gradient runs through reduce_to on CUDA
      EXPECT_TRUE(run_case(c, &cuda_backend())) << c.name;
    }
  }
}

TEST_F(CudaOps, ScaleMatchesFloat64) {
  OpCase c;
  c.name = "cuda_scale";
  c.inputs = {{Shape{3, 7}}};
  c.build = [](Context& ctx, const std::vector<Tensor*>& in) { return scale(ctx, in[0], -2.5f); };
  c.reference = [](const Refs& in) {
    Vec o = in[0].v;
    for (auto& x : o) x *= -2.5;
    return o;
  };
  EXPECT_TRUE(run_case(c, &cuda_backend()));
}

// ---- reductions ------------------------------------------------------------------------------------------

TEST_F(CudaOps, ReductionsMatchFloat64AndFiniteDifferences) {
  struct R {
    const char* name;
    Tensor* (*build)(Context&, Tensor*);
    bool rows;
    int kind;  // 0 sum, 1 mean, 2 max
  };
  const R rs[] = {{"sum_rows", sum_rows, true, 0}, {"mean_rows", mean_rows, true, 1},
                  {"max_rows", max_rows, true, 2}, {"sum", sum, false, 0},
                  {"mean", mean, false, 1},        {"max", max, false, 2}};
  for (const R& p : rs)
    for (Shape s : {Shape{9}, Shape{3, 70}, Shape{2, 3, 1100}}) {
      OpCase c;
      c.name = std::string("cuda_") + p.name + std::to_string(s.size());
      c.inputs = {{s}};
      auto b = p.build;
      c.build = [b](Context& ctx, const std::vector<Tensor*>& in) { return b(ctx, in[0]); };
      const int kind = p.kind;
      const bool rows = p.rows;
      c.reference = [kind, rows](const Refs& in) {
        Ref x = in[0];
        if (!rows) {  // one row holding everything
          x.ne[0] = x.size();
          x.ne[1] = x.ne[2] = x.ne[3] = 1;
        }
        return per_row(x, 1, [kind](int64_t, const double* v, double* o, int64_t n) {
          double acc = kind == 2 ? -INFINITY : 0;
          for (int64_t i = 0; i < n; ++i) acc = kind == 2 ? std::max(acc, v[i]) : acc + v[i];
          o[0] = kind == 1 ? acc / double(n) : acc;
        });
      };
      c.fwd_tol = 1e-11;  // f32 accumulation in a tree
      c.grad_tol = 1e-8;
      EXPECT_TRUE(run_case(c, &cuda_backend())) << c.name;
    }
}

TEST_F(CudaOps, RepeatAndReduceToMatchFloat64) {
  const std::pair<Shape, Shape> cases[] = {{{1, 5}, {4, 5}}, {{3, 1}, {3, 6}}, {{2, 1, 4, 1}, {2, 3, 4, 5}}};
  int k = 0;
  for (auto& [small, big] : cases) {
    OpCase rep;
    rep.name = "cuda_repeat" + std::to_string(k);
    rep.inputs = {{small}};
    const Shape bs = big;
    rep.build = [bs](Context& ctx, const std::vector<Tensor*>& in) {
      int64_t ne[4];
      shape_to_ne(bs, ne, "test");
      return repeat(ctx, in[0], ne);
    };
    rep.reference = [bs](const Refs& in) {
      Ref out;
      shape_to_ne(bs, out.ne, "test");
      out.v.resize(size_t(out.size()));
      const Ref& x = in[0];
      for (int64_t i3 = 0; i3 < out.ne[3]; ++i3)
        for (int64_t i2 = 0; i2 < out.ne[2]; ++i2)
          for (int64_t i1 = 0; i1 < out.ne[1]; ++i1)
            for (int64_t i0 = 0; i0 < out.ne[0]; ++i0)
              out.at(i0, i1, i2, i3) = x.at(i0 % x.ne[0], i1 % x.ne[1], i2 % x.ne[2], i3 % x.ne[3]);
      return out.v;
    };
    rep.grad_tol = 1e-8;  // the gradient is reduce_to
    EXPECT_TRUE(run_case(rep, &cuda_backend())) << rep.name;

    OpCase red;
    red.name = "cuda_reduce_to" + std::to_string(k++);
    red.inputs = {{big}};
    const Shape ss = small;
    red.build = [ss](Context& ctx, const std::vector<Tensor*>& in) {
      int64_t ne[4];
      shape_to_ne(ss, ne, "test");
      return reduce_to(ctx, in[0], ne);
    };
    red.reference = [ss](const Refs& in) {
      Ref out;
      shape_to_ne(ss, out.ne, "test");
      out.v.assign(size_t(out.size()), 0.0);
      const Ref& x = in[0];
      for (int64_t i3 = 0; i3 < x.ne[3]; ++i3)
        for (int64_t i2 = 0; i2 < x.ne[2]; ++i2)
          for (int64_t i1 = 0; i1 < x.ne[1]; ++i1)
            for (int64_t i0 = 0; i0 < x.ne[0]; ++i0)
              out.at(i0 % out.ne[0], i1 % out.ne[1], i2 % out.ne[2], i3 % out.ne[3]) += x.at(i0, i1, i2, i3);
      return out.v;
    };
    red.fwd_tol = 1e-11;
    red.grad_tol = 1e-8;
    EXPECT_TRUE(run_case(red, &cuda_backend())) << red.name;
  }
}

// ---- views and copies
// --------------------------------------------------------------------------------------

TEST_F(CudaOps, PermuteSliceConcatAndCastMatchFloat64) {
  {  // permute then contiguous: out(i0..i3) = x at the permuted index
    OpCase c;
    c.name = "cuda_permute";
    c.inputs = {{Shape{2, 3, 4, 5}}};
    c.build = [](Context& ctx, const std::vector<Tensor*>& in) {
      return contiguous(ctx, permute(ctx, in[0], 2, 0, 3, 1));
    };
    c.reference = [](const Refs& in) {
      const Ref& x = in[0];  // x dim d goes to result dim axes[d] = {2, 0, 3, 1}
      Ref out;
      out.ne[2] = x.ne[0];
      out.ne[0] = x.ne[1];
      out.ne[3] = x.ne[2];
      out.ne[1] = x.ne[3];
      out.v.resize(x.v.size());
      for (int64_t a = 0; a < x.ne[0]; ++a)
        for (int64_t b = 0; b < x.ne[1]; ++b)
          for (int64_t c2 = 0; c2 < x.ne[2]; ++c2)
            for (int64_t d = 0; d < x.ne[3]; ++d) out.at(b, d, a, c2) = x.at(a, b, c2, d);
      return out.v;
    };
    EXPECT_TRUE(run_case(c, &cuda_backend()));
  }
  for (int dim = 0; dim < 3; ++dim) {  // slice (its gradient is slice_back) feeding concat
    OpCase c;
    c.name = "cuda_slice_concat" + std::to_string(dim);
    c.inputs = {{Shape{4, 5, 6}}, {Shape{4, 5, 6}}};
    c.build = [dim](Context& ctx, const std::vector<Tensor*>& in) {
      return concat(ctx, slice(ctx, in[0], dim, 1, 2), in[1], dim);
    };
    c.reference = [dim](const Refs& in) {
      const Ref& a = in[0];
      const Ref& b = in[1];
      Ref out = b;
      out.ne[dim] += 2;
      out.v.resize(size_t(out.size()));
      for (int64_t i3 = 0; i3 < out.ne[3]; ++i3)
        for (int64_t i2 = 0; i2 < out.ne[2]; ++i2)
          for (int64_t i1 = 0; i1 < out.ne[1]; ++i1)
            for (int64_t i0 = 0; i0 < out.ne[0]; ++i0) {
              int64_t i[4] = {i0, i1, i2, i3};
              if (i[dim] < 2) {
                i[dim] += 1;
                out.at(i0, i1, i2, i3) = a.at(i[0], i[1], i[2], i[3]);
              } else {
                i[dim] -= 2;
                out.at(i0, i1, i2, i3) = b.at(i[0], i[1], i[2], i[3]);
              }
            }
      return out.v;
    };
    EXPECT_TRUE(run_case(c, &cuda_backend())) << c.name;
  }
  for (DType dt : {DType::BF16, DType::F16}) {  // cast down and back: the rounding of dt
    OpCase c;
    c.name = std::string("cuda_cast_") + dtype_name(dt);
    c.inputs = {{Shape{5, 7}}};
    c.build = [dt](Context& ctx, const std::vector<Tensor*>& in) {
      return cast(ctx, cast(ctx, in[0], dt), DType::F32);
    };
    c.reference = [](const Refs& in) { return in[0].v; };
    c.fwd_tol = dt == DType::BF16 ? 3e-5 : 1e-7;
    c.grad_tol = 1e-8;
    EXPECT_TRUE(run_case(c, &cuda_backend())) << c.name;
  }
}

// ---- indexing, softmax, norms, rope, cross-entropy
// ---------------------------------------------------------

TEST_F(CudaOps, GetRowsMatchesFloat64AndItsGradientScatters) {
  for (DType idt : {DType::I32, DType::I64})
    for (Shape ids_shape : {Shape{9}, Shape{2, 6}}) {
      OpCase c;
      c.name = std::string("cuda_get_rows_") + dtype_name(idt) + std::to_string(ids_shape.size());
      c.inputs = {{Shape{7, 5}}, {ids_shape, idt, false, 0, 7}};
      c.build = [](Context& ctx, const std::vector<Tensor*>& in) { return get_rows(ctx, in[0], in[1]); };
      c.reference = [](const Refs& in) {
        const Ref& t = in[0];
        Vec out;
        for (double id : in[1].v)
          for (int64_t i = 0; i < t.ne[0]; ++i) out.push_back(t.at(i, int64_t(id)));
        return out;
      };
      c.grad_tol = 1e-9;
      EXPECT_TRUE(run_case(c, &cuda_backend())) << c.name;
    }
}

Vec ref_softmax_rows(const Ref& x, int mode, double scale, int64_t n_past) {
  return per_row(x, x.ne[0], [&](int64_t r, const double* v, double* o, int64_t n) {
    const int64_t visible = mode == 2 ? std::min(n, r % x.ne[1] + n_past + 1) : n;
    const double sc = mode == 2 ? scale : 1.0;
    double m = -INFINITY;
    for (int64_t i = 0; i < visible; ++i) m = std::max(m, v[i] * sc);
    double s = 0;
    for (int64_t i = 0; i < visible; ++i) s += std::exp(v[i] * sc - m);
    for (int64_t i = 0; i < n; ++i)
      o[i] = i >= visible ? 0.0 : (mode == 1 ? v[i] * sc - m - std::log(s) : std::exp(v[i] * sc - m) / s);
  });
}

TEST_F(CudaOps, SoftmaxFamilyMatchesFloat64AndFiniteDifferences) {
  for (Shape s : {Shape{3, 17}, Shape{2, 4, 300}, Shape{2, 3, 2100}}) {
    for (int mode = 0; mode < 3; ++mode) {
      OpCase c;
      c.name = "cuda_softmax" + std::to_string(mode) + "_" + std::to_string(s.back());
      c.inputs = {{s, DType::F32, true, -3, 3}};
      c.build = [mode](Context& ctx, const std::vector<Tensor*>& in) {
        if (mode == 0) return softmax(ctx, in[0]);
        if (mode == 1) return log_softmax(ctx, in[0]);
        return causal_softmax(ctx, in[0], 0.7f, 2);
      };
      c.reference = [mode](const Refs& in) { return ref_softmax_rows(in[0], mode, 0.7, 2); };
      c.fwd_tol = 1e-11;
      c.grad_tol = 1e-7;
      c.check_grad = s.back() < 1000;  // finite differences over every element get slow
      EXPECT_TRUE(run_case(c, &cuda_backend())) << c.name;
    }
  }
}

TEST_F(CudaOps, NormsMatchFloat64AndFiniteDifferences) {
  for (Shape s : {Shape{4, 37}, Shape{2, 3, 130}, Shape{1}}) {
    for (int kind = 0; kind < 2; ++kind) {
      if (kind == 1 && s == Shape{1}) continue;  // layer_norm of one element is 0 and flat
      OpCase c;
      c.name = std::string(kind ? "cuda_layer_norm" : "cuda_rms_norm") + std::to_string(s.back());
      c.inputs = {{s, DType::F32, true, -2, 2}};
      c.build = [kind](Context& ctx, const std::vector<Tensor*>& in) {
        return kind ? layer_norm(ctx, in[0], 1e-3f) : rms_norm(ctx, in[0], 1e-3f);
      };
      c.reference = [kind](const Refs& in) {
        return per_row(in[0], in[0].ne[0], [kind](int64_t, const double* v, double* o, int64_t n) {
          double mu = 0;
          if (kind) {
            for (int64_t i = 0; i < n; ++i) mu += v[i];
            mu /= double(n);
          }
          double ss = 0;
          for (int64_t i = 0; i < n; ++i) ss += (v[i] - mu) * (v[i] - mu);
          const double r = 1 / std::sqrt(ss / double(n) + double(1e-3f));
          for (int64_t i = 0; i < n; ++i) o[i] = (v[i] - mu) * r;
        });
      };
      c.fwd_tol = 1e-11;
      c.grad_tol = 1e-7;
      EXPECT_TRUE(run_case(c, &cuda_backend())) << c.name;
    }
  }
}

// d 8: Neox one value at a time, Normal 8-wide; d 16: both 8-wide; d 6: both one at a time.
TEST_F(CudaOps, RopeMatchesFloat64AndFiniteDifferences) {
  for (const Shape& shape : {Shape{2, 3, 2, 8}, Shape{2, 5, 3, 16}, Shape{1, 4, 2, 6}})
    for (RopeMode mode : {RopeMode::Normal, RopeMode::Neox}) {
      OpCase c;
      c.name = std::string("cuda_rope") + (mode == RopeMode::Neox ? "_neox" : "_normal") +
               std::to_string(shape[3]);
      c.inputs = {{shape}, {Shape{shape[1]}, DType::I32, false, 0, 2000}};
      c.build = [mode](Context& ctx, const std::vector<Tensor*>& in) {
        return rope(ctx, in[0], in[1], mode, 10000.0f);
      };
      const bool neox = mode == RopeMode::Neox;
      c.reference = [neox](const Refs& in) { return ref_rope(in[0], in[1], neox, 10000.0); };
      c.fwd_tol = 1e-12;
      c.grad_tol = 1e-8;
      EXPECT_TRUE(run_case(c, &cuda_backend())) << c.name;
    }
}

// x a column range of a wider row (q, k and v side by side: a slice of the heads dim), the table path that
// reads positions x_row apart: 8-wide (d 16) and one at a time (d 6), heads taken from the middle.
TEST_F(CudaOps, RopeOnASliceOfWiderRowsMatchesFloat64) {
  for (const Shape& shape : {Shape{2, 5, 7, 16}, Shape{1, 4, 5, 6}})
    for (RopeMode mode : {RopeMode::Normal, RopeMode::Neox}) {
      OpCase c;
      c.name = std::string("cuda_rope_slice") + (mode == RopeMode::Neox ? "_neox" : "_normal") +
               std::to_string(shape[3]);
      c.inputs = {{shape}, {Shape{shape[1]}, DType::I32, false, 0, 2000}};
      c.build = [mode](Context& ctx, const std::vector<Tensor*>& in) {
        return rope(ctx, slice(ctx, in[0], 1, 2, 3), in[1], mode, 10000.0f);
      };
      const bool neox = mode == RopeMode::Neox;
      c.reference = [neox, shape](const Refs& in) {
        // The same heads cut out of the float64 input, then the plain reference.
        const int64_t B = shape[0], T = shape[1], Hs = shape[2], d = shape[3];
        const Ref& x = in[0];
        Ref cut;
        cut.ne[0] = d, cut.ne[1] = 3, cut.ne[2] = T, cut.ne[3] = B;
        cut.v.resize(size_t(B * T * 3 * d));
        for (int64_t r = 0; r < B * T; ++r)
          for (int64_t h = 0; h < 3; ++h)
            for (int64_t i = 0; i < d; ++i)
              cut.v[size_t((r * 3 + h) * d + i)] = x.v[size_t((r * Hs + h + 2) * d + i)];
        return ref_rope(cut, in[1], neox, 10000.0);
      };
      c.fwd_tol = 1e-12;
      c.grad_tol = 1e-8;
      EXPECT_TRUE(run_case(c, &cuda_backend())) << c.name;
    }
}

TEST_F(CudaOps, CrossEntropyMatchesFloat64AndFiniteDifferences) {
  for (int64_t ignore : {int64_t(-100), int64_t(3)}) {  // 3 is a real class: rows labelled 3 drop out
    OpCase c;
    c.name = "cuda_cross_entropy" + std::to_string(ignore);
    c.inputs = {{Shape{12, 11}, DType::F32, true, -4, 4}, {Shape{12}, DType::I32, false, 0, 11}};
    c.build = [ignore](Context& ctx, const std::vector<Tensor*>& in) {
      return cross_entropy(ctx, in[0], in[1], ignore);
    };
    c.reference = [ignore](const Refs& in) {
      const Ref& x = in[0];
      double total = 0;
      int64_t valid = 0;
      const Vec lse = per_row(x, 1, [](int64_t, const double* v, double* o, int64_t n) {
        double m = -INFINITY, s = 0;
        for (int64_t i = 0; i < n; ++i) m = std::max(m, v[i]);
        for (int64_t i = 0; i < n; ++i) s += std::exp(v[i] - m);
        o[0] = m + std::log(s);
      });
      for (int64_t r = 0; r < x.ne[1]; ++r) {
        const int64_t y = int64_t(in[1].v[size_t(r)]);
        if (y == ignore) continue;
        total += lse[size_t(r)] - x.at(y, r);
        ++valid;
      }
      return Vec{valid ? total / double(valid) : 0.0};
    };
    c.fwd_tol = 1e-11;
    c.grad_tol = 1e-7;
    EXPECT_TRUE(run_case(c, &cuda_backend())) << c.name;
  }
}

}  // namespace
}  // namespace retort::test
