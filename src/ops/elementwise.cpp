// Elementwise ops: binary with broadcasting of the second operand, and unary maps. f32 math; any float dtype
// in storage; strided inputs welcome.
#include <algorithm>
#include <cmath>

#include "../core/error.h"
#include "../core/op_table.h"
#include "cpu_util.h"
#include "ops.h"
#include "vec_math.h"

namespace retort {

namespace {

Tensor* binary(Context& ctx, Op op, const char* name, Tensor* a, Tensor* b) {
  RT_CHECK(a && b, name, ": null operand");
  RT_CHECK(is_float(a->dtype) && is_float(b->dtype), name, ": operands must be float tensors, got ",
           a->describe(), " and ", b->describe());
  RT_CHECK(can_broadcast(b, a), name, ": cannot broadcast ", b->describe(), " over ", a->describe(),
           " (each dim of the second operand must be 1 or equal to the first's)");
  Tensor* t = ctx.node(op, a->dtype, a->ne);
  t->src[0] = a;
  t->src[1] = b;
  return t;
}

Tensor* unary(Context& ctx, Op op, const char* name, Tensor* x) {
  RT_CHECK(x != nullptr, name, ": null operand");
  RT_CHECK(is_float(x->dtype), name, ": operand must be a float tensor, got ", x->describe());
  Tensor* t = ctx.node(op, x->dtype, x->ne);
  t->src[0] = x;
  return t;
}

// Gradient-of-activation nodes: src[0] = upstream gradient, src[1] = the activation's input.
Tensor* act_back(Context& ctx, Op op, Tensor* g, Tensor* x) {
  Tensor* t = ctx.node(op, DType::F32, x->ne);
  t->src[0] = g;
  t->src[1] = x;
  return t;
}

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluC = 0.044715f;

inline float gelu_f(float x) { return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * (x + kGeluC * x * x * x))); }
inline float gelu_grad(float x) {
  float u = kSqrt2OverPi * (x + kGeluC * x * x * x);
  float th = std::tanh(u);
  return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * kSqrt2OverPi * (1.0f + 3.0f * kGeluC * x * x);
}

// f over contiguous f32 tensors: b of a's shape, or one row of n broadcast down a's rows (a norm's weight).
// One loop over each row in place, which the compiler vectorizes, instead of copying rows through buffers.
template <typename F>
bool f32_rows_in_place(Tensor* t, ThreadPool& pool, F f) {
  const Tensor* a = t->src[0];
  const Tensor* b = t->src[1];
  const int64_t n = t->ne[0];
  const bool same = b->nelements() == a->nelements(), row = b->nelements() == n && b->ne[0] == n;
  if (t->dtype != DType::F32 || a->dtype != DType::F32 || b->dtype != DType::F32 || !t->is_contiguous() ||
      !a->is_contiguous() || !b->is_contiguous() || !(same || row))
    return false;
  const float* pa = static_cast<const float*>(a->data);
  const float* pb = static_cast<const float*>(b->data);
  float* pt = static_cast<float*>(t->data);
  pool.parallel_for(
      t->nrows(),
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const float* x = pa + r * n;
          const float* y = same ? pb + r * n : pb;
          // o may be x itself (an in-place node): each element is read before it is written.
          float* o = pt + r * n;
          for (int64_t i = 0; i < n; ++i) o[i] = f(x[i], y[i]);
        }
      },
      std::max<int64_t>(1, 16384 / n));
  return true;
}

template <typename F>
void binary_kernel(Tensor* t, ThreadPool& pool, F f) {
  if (f32_rows_in_place(t, pool, f)) return;
  const Tensor* a = t->src[0];
  const Tensor* b = t->src[1];
  const int64_t n = t->ne[0];
  cpu::for_rows(pool, t->nrows(), n, 2, [&](int64_t r, float* buf) {
    float* bb = buf + n;
    cpu::load_row(a, r, buf);
    const char* brow = cpu::broadcast_row_ptr(b, a, r);
    if (b->ne[0] == n) {
      cpu::load_row(b, brow, bb);
      for (int64_t i = 0; i < n; ++i) buf[i] = f(buf[i], bb[i]);
    } else {  // b->ne[0] == 1: one value for the whole row
      float v = load_f32(brow, b->dtype, 0);
      for (int64_t i = 0; i < n; ++i) buf[i] = f(buf[i], v);
    }
    cpu::store_row(t, r, buf);
  });
}

template <typename F>
void unary_kernel(Tensor* t, ThreadPool& pool, F f) {
  const Tensor* x = t->src[0];
  const int64_t n = t->ne[0];
  cpu::for_rows(pool, t->nrows(), n, 1, [&](int64_t r, float* buf) {
    cpu::load_row(x, r, buf);
    for (int64_t i = 0; i < n; ++i) buf[i] = f(buf[i]);
    cpu::store_row(t, r, buf);
  });
}

// f(g, x) over two same-shaped tensors (activation backward).
template <typename F>
void act_back_kernel(Tensor* t, ThreadPool& pool, F f) {
  if (f32_rows_in_place(t, pool, f)) return;
  const Tensor* g = t->src[0];
  const Tensor* x = t->src[1];
  const int64_t n = t->ne[0];
  cpu::for_rows(pool, t->nrows(), n, 2, [&](int64_t r, float* buf) {
    float* xb = buf + n;
    cpu::load_row(g, r, buf);
    cpu::load_row(x, r, xb);
    for (int64_t i = 0; i < n; ++i) buf[i] = f(buf[i], xb[i]);
    cpu::store_row(t, r, buf);
  });
}

void cpu_add(Tensor* t, ThreadPool& p) { binary_kernel(t, p, [](float a, float b) { return a + b; }); }
void cpu_sub(Tensor* t, ThreadPool& p) { binary_kernel(t, p, [](float a, float b) { return a - b; }); }
void cpu_mul(Tensor* t, ThreadPool& p) { binary_kernel(t, p, [](float a, float b) { return a * b; }); }
void cpu_div(Tensor* t, ThreadPool& p) { binary_kernel(t, p, [](float a, float b) { return a / b; }); }
void cpu_scale(Tensor* t, ThreadPool& p) {
  float s = t->fp[0];
  unary_kernel(t, p, [s](float x) { return x * s; });
}
void cpu_neg(Tensor* t, ThreadPool& p) { unary_kernel(t, p, [](float x) { return -x; }); }
// exp, log, silu and its backward take their exponentials and logarithms from vec_math, a row at a time:
// f(a, b, scratch, n) with a = src[0]'s row (the result goes there), b = src[1]'s row when srcs == 2.
template <typename F>
void row_kernel(Tensor* t, ThreadPool& pool, int srcs, F f) {
  const int64_t n = t->ne[0];
  cpu::for_rows(pool, t->nrows(), n, 3, [&](int64_t r, float* buf) {
    cpu::load_row(t->src[0], r, buf);
    if (srcs == 2) cpu::load_row(t->src[1], r, buf + n);
    f(buf, buf + n, buf + 2 * n, n);
    cpu::store_row(t, r, buf);
  });
}
void cpu_exp(Tensor* t, ThreadPool& p) {
  row_kernel(t, p, 1, [](float* x, float*, float*, int64_t n) { vmath::exp(x, n); });
}
void cpu_log(Tensor* t, ThreadPool& p) {
  row_kernel(t, p, 1, [](float* x, float*, float*, int64_t n) { vmath::log(x, n); });
}
void cpu_sqrt(Tensor* t, ThreadPool& p) { unary_kernel(t, p, [](float x) { return std::sqrt(x); }); }
void cpu_rsqrt(Tensor* t, ThreadPool& p) { unary_kernel(t, p, [](float x) { return 1.0f / std::sqrt(x); }); }
void cpu_tanh(Tensor* t, ThreadPool& p) { unary_kernel(t, p, [](float x) { return std::tanh(x); }); }
void cpu_relu(Tensor* t, ThreadPool& p) { unary_kernel(t, p, [](float x) { return x > 0 ? x : 0.0f; }); }
void cpu_gelu(Tensor* t, ThreadPool& p) { unary_kernel(t, p, gelu_f); }
// silu(x) = x·sigmoid(x) = x / (1 + exp(−x)).
void cpu_silu(Tensor* t, ThreadPool& p) {
  row_kernel(t, p, 1, [](float* __restrict x, float*, float* __restrict e, int64_t n) {
    vmath::exp_affine(x, e, n, 0.0f, -1.0f, 0.0f, 1.0f, 1.0f);  // 1 + exp(−x)
    for (int64_t i = 0; i < n; ++i) x[i] /= e[i];
  });
}
void cpu_relu_back(Tensor* t, ThreadPool& p) {
  act_back_kernel(t, p, [](float g, float x) { return x > 0 ? g : 0.0f; });
}
void cpu_gelu_back(Tensor* t, ThreadPool& p) {
  act_back_kernel(t, p, [](float g, float x) { return g * gelu_grad(x); });
}
// d silu / dx = s·(1 + x·(1 − s)), s = sigmoid(x); src[0] = g, src[1] = x.
void cpu_silu_back(Tensor* t, ThreadPool& p) {
  row_kernel(t, p, 2, [](float* __restrict g, float* __restrict x, float* __restrict s, int64_t n) {
    vmath::exp_affine(x, s, n, 0.0f, -1.0f, 0.0f, 1.0f, 1.0f);  // 1 + exp(−x)
    for (int64_t i = 0; i < n; ++i) {
      const float si = 1.0f / s[i];
      g[i] = g[i] * si * (1.0f + x[i] * (1.0f - si));
    }
  });
}

// The gradient for a broadcast operand sums over the dims it was broadcast along.
Tensor* unbroadcast(Context& ctx, Tensor* g, const Tensor* like) {
  return same_shape(g, like) ? g : reduce_to(ctx, g, like->ne);
}

void back_add(BackwardCtx& bc, Tensor* t, Tensor* g) {
  bc.add(t->src[0], g);
  if (bc.needs(t->src[1])) bc.add(t->src[1], unbroadcast(bc.ctx, g, t->src[1]));
}
void back_sub(BackwardCtx& bc, Tensor* t, Tensor* g) {
  bc.add(t->src[0], g);
  if (bc.needs(t->src[1])) bc.add(t->src[1], unbroadcast(bc.ctx, neg(bc.ctx, g), t->src[1]));
}
void back_mul(BackwardCtx& bc, Tensor* t, Tensor* g) {
  Tensor *a = t->src[0], *b = t->src[1];
  if (bc.needs(a)) bc.add(a, mul(bc.ctx, g, b));
  if (bc.needs(b)) bc.add(b, unbroadcast(bc.ctx, mul(bc.ctx, g, a), b));
}
void back_div(BackwardCtx& bc, Tensor* t, Tensor* g) {
  Tensor *a = t->src[0], *b = t->src[1];
  if (bc.needs(a)) bc.add(a, div(bc.ctx, g, b));
  // d(a/b)/db = -(a/b)/b = -t/b
  if (bc.needs(b)) bc.add(b, unbroadcast(bc.ctx, neg(bc.ctx, div(bc.ctx, mul(bc.ctx, g, t), b)), b));
}
void back_scale(BackwardCtx& bc, Tensor* t, Tensor* g) { bc.add(t->src[0], scale(bc.ctx, g, t->fp[0])); }
void back_neg(BackwardCtx& bc, Tensor* t, Tensor* g) { bc.add(t->src[0], neg(bc.ctx, g)); }
void back_exp(BackwardCtx& bc, Tensor* t, Tensor* g) { bc.add(t->src[0], mul(bc.ctx, g, t)); }
void back_log(BackwardCtx& bc, Tensor* t, Tensor* g) { bc.add(t->src[0], div(bc.ctx, g, t->src[0])); }
void back_sqrt(BackwardCtx& bc, Tensor* t, Tensor* g) {
  bc.add(t->src[0], div(bc.ctx, scale(bc.ctx, g, 0.5f), t));
}
void back_rsqrt(BackwardCtx& bc, Tensor* t, Tensor* g) {
  // d(x^-1/2)/dx = -1/2 x^-3/2 = -1/2 y^3
  Tensor* y3 = mul(bc.ctx, mul(bc.ctx, t, t), t);
  bc.add(t->src[0], mul(bc.ctx, scale(bc.ctx, g, -0.5f), y3));
}
void back_tanh(BackwardCtx& bc, Tensor* t, Tensor* g) {
  // 1 - y^2, written as g - g*y*y
  bc.add(t->src[0], sub(bc.ctx, g, mul(bc.ctx, mul(bc.ctx, g, t), t)));
}
void back_relu(BackwardCtx& bc, Tensor* t, Tensor* g) { bc.add(t->src[0], act_back(bc.ctx, Op::ReluBack, g, t->src[0])); }
void back_gelu(BackwardCtx& bc, Tensor* t, Tensor* g) { bc.add(t->src[0], act_back(bc.ctx, Op::GeluBack, g, t->src[0])); }
void back_silu(BackwardCtx& bc, Tensor* t, Tensor* g) { bc.add(t->src[0], act_back(bc.ctx, Op::SiluBack, g, t->src[0])); }

}  // namespace

Tensor* add(Context& ctx, Tensor* a, Tensor* b) { return binary(ctx, Op::Add, "add", a, b); }
Tensor* sub(Context& ctx, Tensor* a, Tensor* b) { return binary(ctx, Op::Sub, "sub", a, b); }
Tensor* mul(Context& ctx, Tensor* a, Tensor* b) { return binary(ctx, Op::Mul, "mul", a, b); }
Tensor* div(Context& ctx, Tensor* a, Tensor* b) { return binary(ctx, Op::Div, "div", a, b); }
Tensor* scale(Context& ctx, Tensor* x, float s) {
  Tensor* t = unary(ctx, Op::Scale, "scale", x);
  t->fp[0] = s;
  return t;
}
Tensor* neg(Context& ctx, Tensor* x) { return unary(ctx, Op::Neg, "neg", x); }
Tensor* exp(Context& ctx, Tensor* x) { return unary(ctx, Op::Exp, "exp", x); }
Tensor* log(Context& ctx, Tensor* x) { return unary(ctx, Op::Log, "log", x); }
Tensor* sqrt(Context& ctx, Tensor* x) { return unary(ctx, Op::Sqrt, "sqrt", x); }
Tensor* rsqrt(Context& ctx, Tensor* x) { return unary(ctx, Op::Rsqrt, "rsqrt", x); }
Tensor* tanh(Context& ctx, Tensor* x) { return unary(ctx, Op::Tanh, "tanh", x); }
Tensor* relu(Context& ctx, Tensor* x) { return unary(ctx, Op::Relu, "relu", x); }
Tensor* gelu(Context& ctx, Tensor* x) { return unary(ctx, Op::Gelu, "gelu", x); }
Tensor* silu(Context& ctx, Tensor* x) { return unary(ctx, Op::Silu, "silu", x); }

void register_elementwise_ops(OpTable& t) {
  t[size_t(Op::Add)] = {cpu_add, back_add, true};
  t[size_t(Op::Sub)] = {cpu_sub, back_sub, true};
  t[size_t(Op::Mul)] = {cpu_mul, back_mul, true};
  t[size_t(Op::Div)] = {cpu_div, back_div, true};
  t[size_t(Op::Scale)] = {cpu_scale, back_scale, true};
  t[size_t(Op::Neg)] = {cpu_neg, back_neg, true};
  t[size_t(Op::Exp)] = {cpu_exp, back_exp, true};
  t[size_t(Op::Log)] = {cpu_log, back_log, true};
  t[size_t(Op::Sqrt)] = {cpu_sqrt, back_sqrt, true};
  t[size_t(Op::Rsqrt)] = {cpu_rsqrt, back_rsqrt, true};
  t[size_t(Op::Tanh)] = {cpu_tanh, back_tanh, true};
  t[size_t(Op::Relu)] = {cpu_relu, back_relu, true};
  t[size_t(Op::Gelu)] = {cpu_gelu, back_gelu, true};
  t[size_t(Op::Silu)] = {cpu_silu, back_silu, true};
  t[size_t(Op::ReluBack)] = {cpu_relu_back, nullptr, false};
  t[size_t(Op::GeluBack)] = {cpu_gelu_back, nullptr, false};
  t[size_t(Op::SiluBack)] = {cpu_silu_back, nullptr, false};
}

}  // namespace retort
