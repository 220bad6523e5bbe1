// Views (reshape, permute, transpose, slice), copies (contiguous, cast), concat, fill, and the structural
// nodes the graph itself uses (Accumulate, AuxOutput, SliceBack).
#include <cmath>
#include <cstring>

#include "../core/checked.h"
#include "../core/error.h"
#include "../core/op_table.h"
#include "cpu_util.h"
#include "ops.h"

namespace retort {

namespace {

Tensor* make_view(Context& ctx, Tensor* x, const int64_t ne[kMaxDims], const size_t nb[kMaxDims], size_t offs,
                  ViewKind kind) {
  Tensor* v = ctx.view_node(x, ne, nb, offs);
  v->ip[0] = int64_t(kind);
  return v;
}

}  // namespace

Tensor* reshape(Context& ctx, Tensor* x, const Shape& shape) {
  int64_t ne[kMaxDims];
  shape_to_ne(shape, ne, "reshape");
  const int64_t n = shape_nelements(ne, "reshape");
  RT_CHECK(n == x->nelements(), "reshape: cannot view ", x->describe(), " (", x->nelements(),
           " elements) as ", shape_str(ne), " (", n, " elements)");
  RT_CHECK(x->is_contiguous(), "reshape: ", x->describe(),
           " is not contiguous; call contiguous() first to make the copy explicit");
  size_t nb[kMaxDims];
  nb[0] = x->elsize();
  for (int d = 1; d < kMaxDims; ++d) nb[d] = nb[d - 1] * size_t(ne[d - 1]);
  return make_view(ctx, x, ne, nb, 0, ViewKind::Reshape);
}

Tensor* permute(Context& ctx, Tensor* x, int a0, int a1, int a2, int a3) {
  int axes[kMaxDims] = {a0, a1, a2, a3};
  bool used[kMaxDims] = {};
  for (int d = 0; d < kMaxDims; ++d) {
    RT_CHECK(axes[d] >= 0 && axes[d] < kMaxDims && !used[axes[d]], "permute: axes (", a0, ", ", a1, ", ", a2,
             ", ", a3, ") of ", x->describe(), " must be a permutation of 0..3");
    used[axes[d]] = true;
  }
  int64_t ne[kMaxDims];
  size_t nb[kMaxDims];
  for (int d = 0; d < kMaxDims; ++d) {
    ne[axes[d]] = x->ne[d];
    nb[axes[d]] = x->nb[d];
  }
  Tensor* v = make_view(ctx, x, ne, nb, 0, ViewKind::Permute);
  for (int d = 0; d < kMaxDims; ++d) v->ip[1 + d] = axes[d];
  return v;
}

Tensor* transpose(Context& ctx, Tensor* x) {
  return permute(ctx, x, 1, 0, 2, 3);
}

Tensor* slice(Context& ctx, Tensor* x, int dim, int64_t start, int64_t len) {
  RT_CHECK(dim >= 0 && dim < kMaxDims, "slice: dim ", dim, " of ", x->describe(), " must be in 0..3");
  // Compared as len <= ne - start, so a window near INT64_MAX cannot overflow the check itself.
  if (!(start >= 0 && start < x->ne[dim] && len >= 1 && len <= x->ne[dim] - start)) {
    int64_t end;
    const bool wraps = __builtin_add_overflow(start, len, &end);
    RT_FAIL("slice: window [", start, ", ", wraps ? std::string("past INT64_MAX") : std::to_string(end),
            ") of dim ", dim, " runs past ", x->describe(), " whose dim ", dim, " has ", x->ne[dim],
            " elements");
  }
  int64_t ne[kMaxDims];
  size_t nb[kMaxDims];
  for (int d = 0; d < kMaxDims; ++d) {
    ne[d] = x->ne[d];
    nb[d] = x->nb[d];
  }
  ne[dim] = len;
  Tensor* v = make_view(ctx, x, ne, nb, size_t(start) * x->nb[dim], ViewKind::Slice);
  v->ip[1] = dim;
  v->ip[2] = start;
  return v;
}

Tensor* cast(Context& ctx, Tensor* x, DType dtype) {
  RT_CHECK(is_float(dtype) == is_float(x->dtype), "cast: cannot convert ", x->describe(), " to ",
           dtype_name(dtype), " (float and integer tensors do not mix)");
  Tensor* t = ctx.node(Op::Cont, dtype, x->ne);
  t->src[0] = x;
  return t;
}

Tensor* contiguous(Context& ctx, Tensor* x) {
  return cast(ctx, x, x->dtype);
}

Tensor* concat(Context& ctx, Tensor* a, Tensor* b, int dim) {
  RT_CHECK(dim >= 0 && dim < kMaxDims, "concat: dim ", dim, " must be in 0..3");
  RT_CHECK(a->dtype == b->dtype, "concat: dtypes differ: ", a->describe(), " and ", b->describe());
  for (int d = 0; d < kMaxDims; ++d)
    RT_CHECK(d == dim || a->ne[d] == b->ne[d], "concat: ", a->describe(), " and ", b->describe(),
             " must match in every dim but ", dim);
  int64_t ne[kMaxDims] = {a->ne[0], a->ne[1], a->ne[2], a->ne[3]};
  ne[dim] = checked_add(a->ne[dim], b->ne[dim], "concat of ", a->describe(), " and ", b->describe());
  Tensor* t = ctx.node(Op::Concat, a->dtype, ne);
  t->src[0] = a;
  t->src[1] = b;
  t->ip[0] = dim;
  return t;
}

Tensor* fill(Context& ctx, DType dtype, const int64_t ne[kMaxDims], float value) {
  if (is_int(dtype)) {
    const double lo = dtype == DType::I32 ? -0x1p31 : -0x1p63;
    RT_CHECK(std::isfinite(value) && value >= lo && value < -lo, "fill: value ", value, " does not fit ",
             dtype_name(dtype));
  }
  Tensor* t = ctx.node(Op::Fill, dtype, ne);
  t->fp[0] = value;
  return t;
}

namespace {

// Copies every element of src into dst (same ne), converting dtype; both may be strided.
void copy_elements(const Tensor* src, Tensor* dst, ThreadPool& pool) {
  if (is_int(src->dtype)) {
    const int64_t n = src->ne[0];
    pool.parallel_for(src->nrows(), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const char* s = cpu::row_ptr(src, r);
        char* d = cpu::row_ptr(dst, r);
        for (int64_t i = 0; i < n; ++i) {
          int64_t v = load_i64(s + i * src->nb[0], src->dtype, 0);
          if (dst->dtype == DType::I32)
            *reinterpret_cast<int32_t*>(d + i * dst->nb[0]) = int32_t(v);
          else
            *reinterpret_cast<int64_t*>(d + i * dst->nb[0]) = v;
        }
      }
    });
    return;
  }
  cpu::for_rows(pool, src->nrows(), src->ne[0], 1, [&](int64_t r, float* buf) {
    cpu::load_row(src, r, buf);
    cpu::store_row(dst, r, buf);
  });
}

void cpu_cont(Tensor* t, ThreadPool& pool) {
  copy_elements(t->src[0], t, pool);
}

void cpu_fill(Tensor* t, ThreadPool& pool) {
  std::vector<float> row(size_t(t->ne[0]), t->fp[0]);
  pool.parallel_for(t->nrows(), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) cpu::store_row(t, r, row.data());
  });
}

// Integer concat copies bytes: a detour through f32 would round ids above 2^24.
void concat_exact(Tensor* t, ThreadPool& pool) {
  const Tensor* a = t->src[0];
  const Tensor* b = t->src[1];
  const int dim = int(t->ip[0]);
  const size_t es = t->elsize();
  pool.parallel_for(t->nrows(), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      int64_t i[kMaxDims] = {0, 0, 0, 0};
      cpu::row_coords(t, r, i[1], i[2], i[3]);
      char* dst = cpu::row_ptr(t, r);
      for (int64_t i0 = 0; i0 < t->ne[0]; ++i0) {
        int64_t j[kMaxDims] = {i0, i[1], i[2], i[3]};
        const bool from_b = j[dim] >= a->ne[dim];
        const Tensor* s = from_b ? b : a;
        if (from_b) j[dim] -= a->ne[dim];
        std::memcpy(dst + i0 * t->nb[0], s->ptr(j[0], j[1], j[2], j[3]), es);
      }
    }
  });
}

void cpu_concat(Tensor* t, ThreadPool& pool) {
  if (is_int(t->dtype)) return concat_exact(t, pool);
  const Tensor* a = t->src[0];
  const Tensor* b = t->src[1];
  int dim = int(t->ip[0]);
  cpu::for_rows(pool, t->nrows(), t->ne[0], 1, [&](int64_t r, float* buf) {
    int64_t i[kMaxDims] = {0, 0, 0, 0};
    cpu::row_coords(t, r, i[1], i[2], i[3]);
    if (dim == 0) {
      int64_t ra = i[1] + a->ne[1] * (i[2] + a->ne[2] * i[3]);
      cpu::load_row(a, ra, buf);
      cpu::load_row(b, ra, buf + a->ne[0]);
    } else {
      // Decide by index, not by comparing pointers: concat(x, x) has a == b.
      const bool from_b = i[dim] >= a->ne[dim];
      const Tensor* s = from_b ? b : a;
      if (from_b) i[dim] -= a->ne[dim];
      cpu::load_row(s, static_cast<const char*>(s->ptr(0, i[1], i[2], i[3])), buf);
    }
    cpu::store_row(t, r, buf);
  });
}

void cpu_slice_back(Tensor* t, ThreadPool& pool) {
  // t is shaped like the sliced tensor; the gradient src[0] lands in the window, zeros elsewhere.
  const Tensor* g = t->src[0];
  int dim = int(t->ip[0]);
  int64_t start = t->ip[1];
  cpu::for_rows(pool, t->nrows(), t->ne[0], 1, [&](int64_t r, float* buf) {
    int64_t i[kMaxDims] = {0, 0, 0, 0};
    cpu::row_coords(t, r, i[1], i[2], i[3]);
    std::fill(buf, buf + t->ne[0], 0.0f);
    if (dim == 0) {
      std::vector<float> tmp(size_t(g->ne[0]));
      cpu::load_row(g, static_cast<const char*>(g->ptr(0, i[1], i[2], i[3])), tmp.data());
      std::copy(tmp.begin(), tmp.end(), buf + start);
    } else if (i[dim] >= start && i[dim] < start + g->ne[dim]) {
      i[dim] -= start;
      cpu::load_row(g, static_cast<const char*>(g->ptr(0, i[1], i[2], i[3])), buf);
    }
    cpu::store_row(t, r, buf);
  });
}

void cpu_accumulate(Tensor* t, ThreadPool& pool) {
  Tensor* acc = t->src[0];
  const Tensor* g = t->src[1];
  cpu::for_rows(pool, acc->nrows(), acc->ne[0], 2, [&](int64_t r, float* buf) {
    float* gb = buf + acc->ne[0];
    cpu::load_row(acc, r, buf);
    cpu::load_row(g, r, gb);
    for (int64_t i = 0; i < acc->ne[0]; ++i) buf[i] += gb[i];
    cpu::store_row(acc, r, buf);
  });
}

void cpu_nothing(Tensor*, ThreadPool&) {}

Tensor* slice_back(Context& ctx, Tensor* grad, const Tensor* like, int dim, int64_t start) {
  Tensor* t = ctx.node(Op::SliceBack, DType::F32, like->ne);
  t->src[0] = grad;
  t->ip[0] = dim;
  t->ip[1] = start;
  return t;
}

void back_view(BackwardCtx& bc, Tensor* t, Tensor* g) {
  Tensor* x = t->src[0];
  switch (ViewKind(t->ip[0])) {
    case ViewKind::Reshape:
      bc.add(x, reshape(bc.ctx, g->is_contiguous() ? g : contiguous(bc.ctx, g), x->shape()));
      break;
    case ViewKind::Permute: {
      // t's dim axes[d] came from x's dim d, so x's dim d comes back from t's dim axes[d].
      int inv[kMaxDims];
      for (int d = 0; d < kMaxDims; ++d) inv[t->ip[1 + d]] = d;
      bc.add(x, permute(bc.ctx, g, inv[0], inv[1], inv[2], inv[3]));
      break;
    }
    case ViewKind::Slice:
      bc.add(x, slice_back(bc.ctx, g, x, int(t->ip[1]), t->ip[2]));
      break;
  }
}

void back_cont(BackwardCtx& bc, Tensor* t, Tensor* g) {
  bc.add(t->src[0], g);
}

void back_concat(BackwardCtx& bc, Tensor* t, Tensor* g) {
  int dim = int(t->ip[0]);
  Tensor* a = t->src[0];
  Tensor* b = t->src[1];
  if (bc.needs(a)) bc.add(a, slice(bc.ctx, g, dim, 0, a->ne[dim]));
  if (bc.needs(b)) bc.add(b, slice(bc.ctx, g, dim, a->ne[dim], b->ne[dim]));
}

void back_slice_back(BackwardCtx& bc, Tensor* t, Tensor* g) {
  bc.add(t->src[0], slice(bc.ctx, g, int(t->ip[0]), t->ip[1], t->src[0]->ne[t->ip[0]]));
}

}  // namespace

void register_view_ops(OpTable& t) {
  t[size_t(Op::None)] = {nullptr, nullptr, false};
  t[size_t(Op::View)] = {cpu_nothing, back_view, true};
  t[size_t(Op::Cont)] = {cpu_cont, back_cont, true};
  t[size_t(Op::Fill)] = {cpu_fill, nullptr, false};
  t[size_t(Op::Accumulate)] = {cpu_accumulate, nullptr, false};
  t[size_t(Op::AuxOutput)] = {cpu_nothing, nullptr, false};
  t[size_t(Op::SliceBack)] = {cpu_slice_back, back_slice_back, true};
  t[size_t(Op::Concat)] = {cpu_concat, back_concat, true};
}

}  // namespace retort
