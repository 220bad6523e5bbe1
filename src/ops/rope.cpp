// Rotary position embedding. Pair i of a head (elements (2i, 2i+1) in Normal mode, (i, i + d/2) in Neox
// mode) at position p is rotated by the angle p * theta^(-2i/d). A rotation's adjoint is the rotation by the
// negated angle, so the backward pass is a Rope node with the inverse flag (ip[1]) toggled; that node is
// itself differentiable the same way.
#include <cmath>
#include <vector>

#include "../core/error.h"
#include "../core/op_table.h"
#include "cpu_util.h"
#include "ops.h"

namespace retort {

namespace {

Tensor* rope_node(Context& ctx, Tensor* x, Tensor* positions, int64_t mode, float theta, bool inverse) {
  Tensor* t = ctx.node(Op::Rope, x->dtype, x->ne);
  t->src[0] = x;
  t->src[1] = positions;
  t->ip[0] = mode;
  t->ip[1] = inverse ? 1 : 0;
  t->fp[0] = theta;
  return t;
}

void cpu_rope(Tensor* t, ThreadPool& pool) {
  const Tensor* x = t->src[0];
  const Tensor* pos = t->src[1];
  const int64_t d = t->ne[0];
  const int64_t half = d / 2;
  const int64_t steps = t->ne[2];
  const bool neox = RopeMode(t->ip[0]) == RopeMode::Neox;
  const double sign = t->ip[1] ? -1.0 : 1.0;
  const double theta = t->fp[0];

  // cos / sin of every (position, pair), computed once in double: angles reach thousands of radians, where
  // an f32 product would lose several bits before the cos.
  std::vector<float> cs(static_cast<size_t>(steps * half)), sn(static_cast<size_t>(steps * half));
  std::vector<double> freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) freq[size_t(i)] = std::pow(theta, -2.0 * double(i) / double(d));
  for (int64_t s = 0; s < steps; ++s) {
    const double p = double(load_i64(static_cast<const char*>(pos->data) + s * pos->nb[0], pos->dtype, 0));
    for (int64_t i = 0; i < half; ++i) {
      const double a = sign * p * freq[size_t(i)];
      cs[size_t(s * half + i)] = float(std::cos(a));
      sn[size_t(s * half + i)] = float(std::sin(a));
    }
  }

  cpu::for_rows(pool, t->nrows(), d, 1, [&](int64_t r, float* buf) {
    int64_t head, step, batch;
    cpu::row_coords(t, r, head, step, batch);
    cpu::load_row(x, static_cast<const char*>(x->ptr(0, head, step, batch)), buf);
    const float* c = cs.data() + step * half;
    const float* s = sn.data() + step * half;
    const int64_t stride = neox ? half : 1;  // distance between the two elements of a pair
    for (int64_t i = 0; i < half; ++i) {
      const int64_t j = neox ? i : 2 * i;
      const float a = buf[j], b = buf[j + stride];
      buf[j] = a * c[i] - b * s[i];
      buf[j + stride] = a * s[i] + b * c[i];
    }
    cpu::store_row(t, r, buf);
  });
}

void back_rope(BackwardCtx& bc, Tensor* t, Tensor* g) {
  bc.add(t->src[0], rope_node(bc.ctx, g, t->src[1], t->ip[0], t->fp[0], t->ip[1] == 0));
}

}  // namespace

Tensor* rope(Context& ctx, Tensor* x, Tensor* positions, RopeMode mode, float theta) {
  RT_CHECK(x && positions, "rope: null operand");
  RT_CHECK(is_float(x->dtype), "rope: x must be a float tensor [B, T, heads, d], got ", x->describe());
  RT_CHECK(x->ne[0] % 2 == 0, "rope: the head size d (innermost dim) must be even, got ", x->describe());
  RT_CHECK(positions->dtype == DType::I32, "rope: positions must be i32 [T], got ", positions->describe(),
           " for x ", x->describe());
  RT_CHECK(positions->n_dims() == 1 && positions->ne[0] == x->ne[2], "rope: positions ",
           positions->describe(), " must be [T] with T = ", x->ne[2], ", the second-outermost dim of x ",
           x->describe(), " = [B, T, heads, d]");
  RT_CHECK(mode == RopeMode::Normal || mode == RopeMode::Neox, "rope: unknown mode ", int64_t(mode),
           " for x ", x->describe(), " (expected Normal = 0 or Neox = 2)");
  RT_CHECK(std::isfinite(theta) && theta > 0.0f, "rope: theta must be finite and > 0, got ", theta, " for x ",
           x->describe());
  return rope_node(ctx, x, positions, int64_t(mode), theta, false);
}

void register_rope_ops(OpTable& t) {
  t[size_t(Op::Rope)] = {cpu_rope, back_rope, true};
}

}  // namespace retort
