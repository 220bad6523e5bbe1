// Fused transformer layers: RMSNorm with its weight (and optionally the residual add before it) and SwiGLU,
// each one pass over its rows where the unfused graph takes three to five, with the result written straight
// in the dtype its consumer (a 16-bit GEMM) reads.
//
//   rms_norm_affine: y = s · r · w, s = x (+ delta), r = (mean(s²) + eps)^-1/2; aux[0] = s when delta is given
//   backward:        dx = r (gy w) − r³ s mean(gy w s) (+ the gradient of s from its other readers)
//                    dw = Σ_rows gy s r, one node of its own, summed in a fixed order (deterministic)
//   swiglu:          y = silu(g) · u; dg = dy u σ(g) (1 + g (1 − σ(g))), du = dy silu(g)
//
// Row statistics accumulate in double on the CPU; the backward recomputes r from s instead of saving it.
#include <algorithm>
#include <cmath>
#include <vector>

#include "../core/error.h"
#include "../core/op_table.h"
#include "../core/thread_pool.h"
#include "cpu_util.h"
#include "ops.h"
#include "vec_math.h"

namespace retort {

namespace {

constexpr int kAuxSum = 0;  // RmsNormAffine: aux slot of s = x + delta
constexpr int kAuxDup = 0;  // SwigluBack: aux slot of dup

float rms_inv(const float* s, int64_t n, float eps) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += double(s[i]) * s[i];
  return float(1.0 / std::sqrt(ss / double(n) + double(eps)));
}

// src = x, w, delta?; the node is y; aux[kAuxSum] = s when delta is given.
void cpu_rms_norm_affine(Tensor* t, ThreadPool& pool) {
  const Tensor *x = t->src[0], *w = t->src[1], *delta = t->src[2];
  Tensor* s_out = delta ? t->aux[kAuxSum] : nullptr;
  const int64_t n = t->ne[0];
  std::vector<float> wv(size_t(n) + 1);
  cpu::load_row(w, static_cast<const char*>(w->data), wv.data());
  cpu::for_rows(pool, t->nrows(), n, 2, [&](int64_t r, float* buf) {
    cpu::load_row(x, r, buf);
    if (delta) {
      float* d = buf + n;
      cpu::load_row(delta, r, d);
      for (int64_t i = 0; i < n; ++i) buf[i] += d[i];
      cpu::store_row(s_out, r, buf);
    }
    const float inv = rms_inv(buf, n, t->fp[0]);
    // (s r) w in this order: the f32 result equals mul(rms_norm(s), w) bit for bit.
    for (int64_t i = 0; i < n; ++i) buf[i] = buf[i] * inv * wv[size_t(i)];
    cpu::store_row(t, r, buf);
  });
}

// src = gy, s, w, gs?; the node is ds (f32).
void cpu_rms_norm_affine_back(Tensor* t, ThreadPool& pool) {
  const Tensor *gy = t->src[0], *s = t->src[1], *w = t->src[2], *gs = t->src[3];
  const int64_t n = t->ne[0];
  std::vector<float> wv(size_t(n) + 1);
  cpu::load_row(w, static_cast<const char*>(w->data), wv.data());
  cpu::for_rows(pool, t->nrows(), n, 3, [&](int64_t r, float* buf) {
    float *sb = buf + n, *extra = buf + 2 * n;
    cpu::load_row(gy, r, buf);
    cpu::load_row(s, r, sb);
    const float inv = rms_inv(sb, n, t->fp[0]);
    double gx = 0;
    for (int64_t i = 0; i < n; ++i) {
      buf[i] *= wv[size_t(i)];
      gx += double(buf[i]) * sb[i];
    }
    const float c = float(gx / double(n)) * inv * inv * inv;
    for (int64_t i = 0; i < n; ++i) buf[i] = inv * buf[i] - c * sb[i];
    if (gs) {
      cpu::load_row(gs, r, extra);
      for (int64_t i = 0; i < n; ++i) buf[i] += extra[i];
    }
    cpu::store_row(t, r, buf);
  });
}

// src = gy, s; the node is dw [n] (f32). Each task owns a range of columns and walks every row in order, so
// the sums do not depend on the thread count.
void cpu_rms_norm_affine_back_w(Tensor* t, ThreadPool& pool) {
  const Tensor *gy = t->src[0], *s = t->src[1];
  const int64_t n = t->ne[0], rows = s->nrows();
  std::vector<float> inv(size_t(rows) + 1);
  cpu::for_rows(pool, rows, n, 1, [&](int64_t r, float* buf) {
    cpu::load_row(s, r, buf);
    inv[size_t(r)] = rms_inv(buf, n, t->fp[0]);
  });
  constexpr int64_t kCols = 64;
  const int64_t blocks = (n + kCols - 1) / kCols;
  float* out = static_cast<float*>(t->data);
  pool.parallel_for(blocks, [&](int64_t b0, int64_t b1) {
    std::vector<double> acc(kCols);
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t c0 = b * kCols, c1 = std::min(n, c0 + kCols);
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t r = 0; r < rows; ++r) {
        const char* gp = cpu::row_ptr(gy, r);
        const char* sp = cpu::row_ptr(s, r);
        for (int64_t c = c0; c < c1; ++c)
          acc[size_t(c - c0)] += double(load_f32(gp + c * gy->nb[0], gy->dtype, 0)) *
                                 double(load_f32(sp + c * s->nb[0], s->dtype, 0)) * inv[size_t(r)];
      }
      for (int64_t c = c0; c < c1; ++c) out[c] = float(acc[size_t(c - c0)]);
    }
  });
}

// e[i] = exp(−g[i]) for the row, by vmath's vectorized exp (a libm call per element costs more than the rest
// of the SwiGLU pass); sigmoid(g) is then 1 / (1 + e), which the loops below vectorize.
void neg_exp(const float* g, float* e, int64_t n) {
  for (int64_t i = 0; i < n; ++i) e[i] = -g[i];
  vmath::exp(e, n);
}

// src = gate, up; the node is y.
void cpu_swiglu(Tensor* t, ThreadPool& pool) {
  const int64_t n = t->ne[0];
  cpu::for_rows(pool, t->nrows(), n, 3, [&](int64_t r, float* buf) {
    float *u = buf + n, *e = buf + 2 * n;
    cpu::load_row(t->src[0], r, buf);
    cpu::load_row(t->src[1], r, u);
    neg_exp(buf, e, n);
    for (int64_t i = 0; i < n; ++i) buf[i] = buf[i] / (1.0f + e[i]) * u[i];
    cpu::store_row(t, r, buf);
  });
}

// src = dy, gate, up; the node is dgate, aux[kAuxDup] = dup.
void cpu_swiglu_back(Tensor* t, ThreadPool& pool) {
  Tensor* dup = t->aux[kAuxDup];
  const int64_t n = t->ne[0];
  cpu::for_rows(pool, t->nrows(), n, 4, [&](int64_t r, float* buf) {
    float *g = buf + n, *u = buf + 2 * n, *e = buf + 3 * n;
    cpu::load_row(t->src[0], r, buf);
    cpu::load_row(t->src[1], r, g);
    cpu::load_row(t->src[2], r, u);
    neg_exp(g, e, n);
    for (int64_t i = 0; i < n; ++i) {
      const float sg = 1.0f / (1.0f + e[i]), dy = buf[i];
      buf[i] = dy * u[i] * sg * (1.0f + g[i] * (1.0f - sg));
      u[i] = dy * g[i] * sg;
    }
    cpu::store_row(t, r, buf);
    cpu::store_row(dup, r, u);
  });
}

Tensor* norm_back_node(Context& ctx, Tensor* gy, Tensor* s, Tensor* w, Tensor* gs, float eps) {
  Tensor* t = ctx.node(Op::RmsNormAffineBack, DType::F32, s->ne);
  t->src = {gy, s, w, gs};
  t->fp[0] = eps;
  return t;
}

void back_rms_norm_affine(BackwardCtx& bc, Tensor* t, Tensor* gy) {
  Tensor *x = t->src[0], *w = t->src[1], *delta = t->src[2];
  Tensor* s = delta ? t->aux[kAuxSum] : x;
  Tensor* gs = delta ? bc.grad_of(s) : nullptr;
  const float eps = t->fp[0];
  if (gy && bc.needs(w)) {
    Tensor* dw = bc.ctx.node(Op::RmsNormAffineBackW, DType::F32, w->ne);
    dw->src = {gy, s};
    dw->fp[0] = eps;
    bc.add(w, dw);
  }
  if (!bc.needs(x) && !(delta && bc.needs(delta))) return;
  Tensor* ds = gy ? norm_back_node(bc.ctx, gy, s, w, gs, eps) : gs;
  if (!ds) return;
  bc.add(x, ds);
  if (delta) bc.add(delta, ds);
}

void back_swiglu(BackwardCtx& bc, Tensor* t, Tensor* dy) {
  Tensor *gate = t->src[0], *up = t->src[1];
  if (!bc.needs(gate) && !bc.needs(up)) return;
  Tensor* dg = bc.ctx.node(Op::SwigluBack, gate->dtype, gate->ne);
  dg->src = {dy, gate, up};
  Tensor* du = bc.ctx.node(Op::AuxOutput, up->dtype, up->ne);
  du->src[0] = dg;
  dg->aux[kAuxDup] = du;
  bc.add(gate, dg);
  bc.add(up, du);
}

void check_out_dtype(const char* op, DType out, const Tensor* x) {
  RT_CHECK(is_float(out), op, ": the output dtype must be f32, bf16 or f16, got ", dtype_name(out), " for ",
           x->describe());
}

Tensor* norm_node(const char* op, Context& ctx, Tensor* x, Tensor* delta, Tensor* w, float eps, DType out) {
  RT_CHECK(x && w, op, ": null operand");
  RT_CHECK(is_float(x->dtype), op, ": x must be a float tensor, got ", x->describe());
  RT_CHECK(is_float(w->dtype) && w->n_dims() == 1 && w->ne[0] == x->ne[0], op, ": the weight ", w->describe(),
           " must be a float vector [", x->ne[0], "], one per element of a row of x ", x->describe());
  if (delta)
    RT_CHECK(is_float(delta->dtype) && same_shape(delta, x), op, ": delta ", delta->describe(),
             " must be a float tensor shaped like x ", x->describe());
  RT_CHECK(std::isfinite(eps) && eps > 0.0f, op, ": eps must be finite and > 0, got ", eps, " for ",
           x->describe());
  check_out_dtype(op, out, x);
  Tensor* t = ctx.node(Op::RmsNormAffine, out, x->ne);
  t->src = {x, w, delta};
  t->fp[0] = eps;
  if (delta) {
    Tensor* s = ctx.node(Op::AuxOutput, DType::F32, x->ne);
    s->src[0] = t;
    t->aux[kAuxSum] = s;
  }
  return t;
}

}  // namespace

Tensor* rms_norm_affine(Context& ctx, Tensor* x, Tensor* w, float eps, DType out) {
  return norm_node("rms_norm_affine", ctx, x, nullptr, w, eps, out);
}

AddRmsNorm add_rms_norm(Context& ctx, Tensor* x, Tensor* delta, Tensor* w, float eps, DType out) {
  RT_CHECK(delta != nullptr, "add_rms_norm: delta is null");
  Tensor* y = norm_node("add_rms_norm", ctx, x, delta, w, eps, out);
  return {y, y->aux[kAuxSum]};
}

Tensor* swiglu(Context& ctx, Tensor* gate, Tensor* up, DType out) {
  const char* op = "swiglu";
  RT_CHECK(gate && up, op, ": null operand");
  RT_CHECK(is_float(gate->dtype) && is_float(up->dtype), op, ": gate and up must be float tensors, got ",
           gate->describe(), " and ", up->describe());
  RT_CHECK(same_shape(gate, up), op, ": gate ", gate->describe(), " and up ", up->describe(),
           " must have the same shape");
  check_out_dtype(op, out, gate);
  Tensor* t = ctx.node(Op::Swiglu, out, gate->ne);
  t->src[0] = gate;
  t->src[1] = up;
  return t;
}

void register_fused_layer_ops(OpTable& t) {
  t[size_t(Op::RmsNormAffine)] = {cpu_rms_norm_affine, back_rms_norm_affine, true};
  t[size_t(Op::RmsNormAffine)].grads_through_aux = true;
  t[size_t(Op::RmsNormAffineBack)] = {cpu_rms_norm_affine_back, nullptr, false};
  t[size_t(Op::RmsNormAffineBackW)] = {cpu_rms_norm_affine_back_w, nullptr, false};
  t[size_t(Op::Swiglu)] = {cpu_swiglu, back_swiglu, true};
  t[size_t(Op::SwigluBack)] = {cpu_swiglu_back, nullptr, false};
}

}  // namespace retort
