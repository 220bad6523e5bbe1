// Softmax family over dim 0: softmax, log_softmax, causal (masked, scaled) softmax for attention, and the
// backward nodes. Numerically stable: the row max is subtracted before exp; exps are f32 (vec_math: eight
// lanes with AVX2), their sum is accumulated in double.
#include <algorithm>
#include <cmath>
#include <limits>

#include "../core/error.h"
#include "../core/op_table.h"
#include "cpu_util.h"
#include "ops.h"
#include "vec_math.h"

namespace retort {

namespace {

Tensor* unary_node(Context& ctx, Op op, const char* name, Tensor* x) {
  RT_CHECK(x != nullptr, name, ": null operand");
  RT_CHECK(is_float(x->dtype), name, ": operand must be a float tensor, got ", x->describe());
  Tensor* t = ctx.node(op, x->dtype, x->ne);
  t->src[0] = x;
  return t;
}

// Backward nodes: src[0] = upstream gradient, src[1] = the forward output y (its shape).
Tensor* back_node(Context& ctx, Op op, Tensor* g, Tensor* y) {
  Tensor* t = ctx.node(op, DType::F32, y->ne);
  t->src[0] = g;
  t->src[1] = y;
  return t;
}

// v[i] = exp(v[i] - max) over the first n entries (the max skips NaNs); returns their sum.
double exp_shifted(float* v, int64_t n) {
  return vmath::exp_affine(v, v, n, vmath::max(v, n), 1.0f, 0.0f, 1.0f, 0.0f);
}

void cpu_softmax(Tensor* t, ThreadPool& pool) {
  const Tensor* x = t->src[0];
  const int64_t n = t->ne[0];
  cpu::for_rows(pool, t->nrows(), n, 1, [&](int64_t r, float* buf) {
    cpu::load_row(x, r, buf);
    const float inv = float(1.0 / exp_shifted(buf, n));
    for (int64_t i = 0; i < n; ++i) buf[i] *= inv;
    cpu::store_row(t, r, buf);
  });
}

void cpu_log_softmax(Tensor* t, ThreadPool& pool) {
  const Tensor* x = t->src[0];
  const int64_t n = t->ne[0];
  cpu::for_rows(pool, t->nrows(), n, 2, [&](int64_t r, float* buf) {
    cpu::load_row(x, r, buf);
    const float m = vmath::max(buf, n);
    for (int64_t i = 0; i < n; ++i) buf[i] -= m;
    const float log_s = float(std::log(vmath::exp_affine(buf, buf + n, n, 0.0f, 1.0f, 0.0f, 1.0f, 0.0f)));
    for (int64_t i = 0; i < n; ++i) buf[i] -= log_s;
    cpu::store_row(t, r, buf);
  });
}

void cpu_causal_softmax(Tensor* t, ThreadPool& pool) {
  const Tensor* x = t->src[0];
  const int64_t n = t->ne[0];
  const float s = t->fp[0];
  const int64_t n_past = t->ip[0];
  cpu::for_rows(pool, t->nrows(), n, 1, [&](int64_t r, float* buf) {
    const int64_t query = r % t->ne[1];
    // Keys 0..last are visible to this query; n_past >= 0 keeps key 0 visible, so no row is empty.
    const int64_t visible = std::min(n, query + n_past + 1);
    cpu::load_row(x, r, buf);
    for (int64_t i = 0; i < visible; ++i) buf[i] *= s;
    const float inv = float(1.0 / exp_shifted(buf, visible));
    for (int64_t i = 0; i < visible; ++i) buf[i] *= inv;
    for (int64_t i = visible; i < n; ++i) buf[i] = 0.0f;  // exactly zero, not exp(-inf)
    cpu::store_row(t, r, buf);
  });
}

// dx = y * (g - sum(g * y))
void cpu_softmax_back(Tensor* t, ThreadPool& pool) {
  const Tensor* g = t->src[0];
  const Tensor* y = t->src[1];
  const int64_t n = t->ne[0];
  cpu::for_rows(pool, t->nrows(), n, 2, [&](int64_t r, float* buf) {
    float* yb = buf + n;
    cpu::load_row(g, r, buf);
    cpu::load_row(y, r, yb);
    double dot = 0;
    for (int64_t i = 0; i < n; ++i) dot += double(buf[i]) * yb[i];
    const float d = float(dot);
    for (int64_t i = 0; i < n; ++i) buf[i] = yb[i] * (buf[i] - d);
    cpu::store_row(t, r, buf);
  });
}

// dx = g - exp(y) * sum(g)
void cpu_log_softmax_back(Tensor* t, ThreadPool& pool) {
  const Tensor* g = t->src[0];
  const Tensor* y = t->src[1];
  const int64_t n = t->ne[0];
  cpu::for_rows(pool, t->nrows(), n, 2, [&](int64_t r, float* buf) {
    float* yb = buf + n;
    cpu::load_row(g, r, buf);
    cpu::load_row(y, r, yb);
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += buf[i];
    const float s = float(sum);
    vmath::exp_affine(yb, buf, n, 0.0f, 1.0f, 0.0f, -s, 0.0f, true);  // buf − exp(y)·Σg
    cpu::store_row(t, r, buf);
  });
}

void back_softmax(BackwardCtx& bc, Tensor* t, Tensor* g) {
  bc.add(t->src[0], back_node(bc.ctx, Op::SoftmaxBack, g, t));
}
void back_log_softmax(BackwardCtx& bc, Tensor* t, Tensor* g) {
  bc.add(t->src[0], back_node(bc.ctx, Op::LogSoftmaxBack, g, t));
}
// Masked entries have y = 0, so SoftmaxBack gives them 0; the chain rule through x * scale adds the factor.
void back_causal_softmax(BackwardCtx& bc, Tensor* t, Tensor* g) {
  Tensor* dx = back_node(bc.ctx, Op::SoftmaxBack, g, t);
  bc.add(t->src[0], t->fp[0] == 1.0f ? dx : scale(bc.ctx, dx, t->fp[0]));
}

}  // namespace

Tensor* softmax(Context& ctx, Tensor* x) {
  return unary_node(ctx, Op::Softmax, "softmax", x);
}
Tensor* log_softmax(Context& ctx, Tensor* x) {
  return unary_node(ctx, Op::LogSoftmax, "log_softmax", x);
}

Tensor* causal_softmax(Context& ctx, Tensor* x, float scale, int64_t n_past) {
  RT_CHECK(x != nullptr, "causal_softmax: null operand");
  RT_CHECK(n_past >= 0, "causal_softmax: n_past must be >= 0, got ", n_past, " for scores ", x->describe());
  RT_CHECK(std::isfinite(scale), "causal_softmax: scale must be finite, got ", scale, " for scores ",
           x->describe());
  Tensor* t = unary_node(ctx, Op::CausalSoftmax, "causal_softmax", x);
  t->fp[0] = scale;
  // Past n_past = keys every key is visible to every query; clamping keeps the kernels' query + n_past exact.
  t->ip[0] = std::min(n_past, x->ne[0]);
  return t;
}

void register_softmax_ops(OpTable& t) {
  t[size_t(Op::Softmax)] = {cpu_softmax, back_softmax, true};
  t[size_t(Op::LogSoftmax)] = {cpu_log_softmax, back_log_softmax, true};
  t[size_t(Op::CausalSoftmax)] = {cpu_causal_softmax, back_causal_softmax, true};
  t[size_t(Op::SoftmaxBack)] = {cpu_softmax_back, nullptr, false};
  t[size_t(Op::LogSoftmaxBack)] = {cpu_log_softmax_back, nullptr, false};
}

}  // namespace retort
