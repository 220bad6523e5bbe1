// Normalization over dim 0 without an affine part (a weight is a separate mul): RMSNorm and LayerNorm.
// Row statistics accumulate in double. The backward kernels recompute the statistics from x instead of
// keeping them from the forward pass: one extra pass over a row is cheaper than another saved tensor.
#include <cmath>

#include "../core/error.h"
#include "../core/op_table.h"
#include "cpu_util.h"
#include "ops.h"

namespace retort {

namespace {

Tensor* norm_node(Context& ctx, Op op, const char* name, Tensor* x, float eps) {
  RT_CHECK(x != nullptr, name, ": null operand");
  RT_CHECK(is_float(x->dtype), name, ": operand must be a float tensor, got ", x->describe());
  // eps = 0 turns an all-zero row into 0/0: NaN that nothing downstream would name.
  RT_CHECK(std::isfinite(eps) && eps > 0.0f, name, ": eps must be finite and > 0, got ", eps, " for ",
           x->describe());
  Tensor* t = ctx.node(op, x->dtype, x->ne);
  t->src[0] = x;
  t->fp[0] = eps;
  return t;
}

// src[0] = upstream gradient, src[1] = the forward input x; fp[0] = eps.
Tensor* norm_back(Context& ctx, Op op, Tensor* g, Tensor* x, float eps) {
  Tensor* t = ctx.node(op, DType::F32, x->ne);
  t->src[0] = g;
  t->src[1] = x;
  t->fp[0] = eps;
  return t;
}

// 1 / sqrt(mean(x^2) + eps)
float rms_inv(const float* x, int64_t n, float eps) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += double(x[i]) * x[i];
  return float(1.0 / std::sqrt(ss / double(n) + double(eps)));
}

// The mean, and 1 / sqrt(biased variance + eps).
void moments(const float* x, int64_t n, float eps, float& mean, float& inv_std) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += x[i];
  const double mu = s / double(n);
  double ss = 0;  // two passes: the variance never goes negative through cancellation
  for (int64_t i = 0; i < n; ++i) ss += (x[i] - mu) * (x[i] - mu);
  mean = float(mu);
  inv_std = float(1.0 / std::sqrt(ss / double(n) + double(eps)));
}

void cpu_rms_norm(Tensor* t, ThreadPool& pool) {
  const Tensor* x = t->src[0];
  const int64_t n = t->ne[0];
  const float eps = t->fp[0];
  cpu::for_rows(pool, t->nrows(), n, 1, [&](int64_t r, float* buf) {
    cpu::load_row(x, r, buf);
    const float inv = rms_inv(buf, n, eps);
    for (int64_t i = 0; i < n; ++i) buf[i] *= inv;
    cpu::store_row(t, r, buf);
  });
}

// y = x r with r = (mean(x^2) + eps)^-1/2; dr/dx_j = -r^3 x_j / n, so
// dx = r g - r^3 x mean(g x).
void cpu_rms_norm_back(Tensor* t, ThreadPool& pool) {
  const Tensor* g = t->src[0];
  const Tensor* x = t->src[1];
  const int64_t n = t->ne[0];
  const float eps = t->fp[0];
  cpu::for_rows(pool, t->nrows(), n, 2, [&](int64_t r, float* buf) {
    float* xb = buf + n;
    cpu::load_row(g, r, buf);
    cpu::load_row(x, r, xb);
    const float inv = rms_inv(xb, n, eps);
    double gx = 0;
    for (int64_t i = 0; i < n; ++i) gx += double(buf[i]) * xb[i];
    const float c = float(gx / double(n)) * inv * inv * inv;
    for (int64_t i = 0; i < n; ++i) buf[i] = inv * buf[i] - c * xb[i];
    cpu::store_row(t, r, buf);
  });
}

void cpu_layer_norm(Tensor* t, ThreadPool& pool) {
  const Tensor* x = t->src[0];
  const int64_t n = t->ne[0];
  const float eps = t->fp[0];
  cpu::for_rows(pool, t->nrows(), n, 1, [&](int64_t r, float* buf) {
    cpu::load_row(x, r, buf);
    float mean, inv;
    moments(buf, n, eps, mean, inv);
    for (int64_t i = 0; i < n; ++i) buf[i] = (buf[i] - mean) * inv;
    cpu::store_row(t, r, buf);
  });
}

// With xh = (x - mean) r: dx = r (g - mean(g) - xh mean(g xh)).
void cpu_layer_norm_back(Tensor* t, ThreadPool& pool) {
  const Tensor* g = t->src[0];
  const Tensor* x = t->src[1];
  const int64_t n = t->ne[0];
  const float eps = t->fp[0];
  cpu::for_rows(pool, t->nrows(), n, 2, [&](int64_t r, float* buf) {
    float* xb = buf + n;
    cpu::load_row(g, r, buf);
    cpu::load_row(x, r, xb);
    float mean, inv;
    moments(xb, n, eps, mean, inv);
    double sg = 0, sgx = 0;
    for (int64_t i = 0; i < n; ++i) {
      xb[i] = (xb[i] - mean) * inv;
      sg += buf[i];
      sgx += double(buf[i]) * xb[i];
    }
    const float mg = float(sg / double(n));
    const float mgx = float(sgx / double(n));
    for (int64_t i = 0; i < n; ++i) buf[i] = inv * (buf[i] - mg - xb[i] * mgx);
    cpu::store_row(t, r, buf);
  });
}

void back_rms_norm(BackwardCtx& bc, Tensor* t, Tensor* g) {
  bc.add(t->src[0], norm_back(bc.ctx, Op::RmsNormBack, g, t->src[0], t->fp[0]));
}
void back_layer_norm(BackwardCtx& bc, Tensor* t, Tensor* g) {
  bc.add(t->src[0], norm_back(bc.ctx, Op::LayerNormBack, g, t->src[0], t->fp[0]));
}

}  // namespace

Tensor* rms_norm(Context& ctx, Tensor* x, float eps) {
  return norm_node(ctx, Op::RmsNorm, "rms_norm", x, eps);
}
Tensor* layer_norm(Context& ctx, Tensor* x, float eps) {
  return norm_node(ctx, Op::LayerNorm, "layer_norm", x, eps);
}

void register_norm_ops(OpTable& t) {
  t[size_t(Op::RmsNorm)] = {cpu_rms_norm, back_rms_norm, true};
  t[size_t(Op::RmsNormBack)] = {cpu_rms_norm_back, nullptr, false};
  t[size_t(Op::LayerNorm)] = {cpu_layer_norm, back_layer_norm, true};
  t[size_t(Op::LayerNormBack)] = {cpu_layer_norm_back, nullptr, false};
}

}  // namespace retort
