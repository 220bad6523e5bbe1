// Reductions (over rows and over everything), repeat (broadcast) and its adjoint reduce_to.
// Sums accumulate in double on the CPU; results are f32.
#include <cmath>
#include <limits>
#include <mutex>

#include "../core/error.h"
#include "../core/op_table.h"
#include "cpu_util.h"
#include "ops.h"

namespace retort {

namespace {

Tensor* reduction(Context& ctx, Op op, const char* name, Tensor* x, bool rows) {
  RT_CHECK(x != nullptr, name, ": null operand");
  RT_CHECK(is_float(x->dtype), name, ": operand must be a float tensor, got ", x->describe());
  int64_t ne[kMaxDims] = {1, 1, 1, 1};
  if (rows)
    for (int d = 1; d < kMaxDims; ++d) ne[d] = x->ne[d];
  Tensor* t = ctx.node(op, DType::F32, ne);
  t->src[0] = x;
  return t;
}

Tensor* max_back(Context& ctx, Tensor* g, Tensor* x, Tensor* y, bool rows) {
  Tensor* t = ctx.node(Op::MaxBack, DType::F32, x->ne);
  t->src[0] = g;
  t->src[1] = x;
  t->src[2] = y;
  t->ip[0] = rows ? 1 : 0;
  return t;
}

// Row reductions: one value per row.
template <typename F>
void row_reduce(Tensor* t, ThreadPool& pool, F f) {
  const Tensor* x = t->src[0];
  const int64_t n = x->ne[0];
  float* out = static_cast<float*>(t->data);  // t is contiguous f32 with one element per row
  cpu::for_rows(pool, x->nrows(), n, 1, [&](int64_t r, float* buf) {
    cpu::load_row(x, r, buf);
    out[r] = f(buf, n);
  });
}

float sum_of(const float* v, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += v[i];
  return float(s);
}
// A NaN anywhere makes the max NaN (std::max alone would skip it and hide the fault that made it).
float max_of(const float* v, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(v[i])) return v[i];
    m = std::max(m, v[i]);
  }
  return m;
}
double max_nan(double a, double b) { return std::isnan(a) || std::isnan(b) ? a + b : std::max(a, b); }

void cpu_sum_rows(Tensor* t, ThreadPool& p) { row_reduce(t, p, sum_of); }
void cpu_mean_rows(Tensor* t, ThreadPool& p) {
  row_reduce(t, p, [](const float* v, int64_t n) { return float(double(sum_of(v, n)) / double(n)); });
}
void cpu_max_rows(Tensor* t, ThreadPool& p) { row_reduce(t, p, max_of); }

// Whole-tensor reductions: per-thread partials in double, combined in thread order.
template <typename Init, typename Step, typename Combine>
double whole_reduce(const Tensor* x, ThreadPool& pool, Init init, Step step, Combine combine) {
  const int64_t n = x->ne[0];
  std::mutex mu;
  std::vector<std::pair<int64_t, double>> parts;
  pool.parallel_for(x->nrows(), [&](int64_t b, int64_t e) {
    std::vector<float> buf(static_cast<size_t>(n));
    double acc = init;
    for (int64_t r = b; r < e; ++r) {
      cpu::load_row(x, r, buf.data());
      for (int64_t i = 0; i < n; ++i) acc = step(acc, buf[size_t(i)]);
    }
    std::lock_guard<std::mutex> lock(mu);
    parts.emplace_back(b, acc);
  }, std::max<int64_t>(1, 16384 / n));
  std::sort(parts.begin(), parts.end());  // a fixed order keeps the result deterministic
  double acc = init;
  for (auto& [b, v] : parts) acc = combine(acc, v);
  return acc;
}

void cpu_sum(Tensor* t, ThreadPool& p) {
  auto add2 = [](double a, double b) { return a + b; };
  *static_cast<float*>(t->data) = float(whole_reduce(t->src[0], p, 0.0, add2, add2));
}
void cpu_mean(Tensor* t, ThreadPool& p) {
  auto add2 = [](double a, double b) { return a + b; };
  double s = whole_reduce(t->src[0], p, 0.0, add2, add2);
  *static_cast<float*>(t->data) = float(s / double(t->src[0]->nelements()));
}
void cpu_max(Tensor* t, ThreadPool& p) {
  *static_cast<float*>(t->data) =
      float(whole_reduce(t->src[0], p, -std::numeric_limits<double>::infinity(), max_nan, max_nan));
}

void cpu_repeat(Tensor* t, ThreadPool& pool) {
  const Tensor* x = t->src[0];
  const int64_t n = t->ne[0];
  cpu::for_rows(pool, t->nrows(), n, 1, [&](int64_t r, float* buf) {
    const char* xr = cpu::broadcast_row_ptr(x, t, r);
    if (x->ne[0] == n) {
      cpu::load_row(x, xr, buf);
    } else {
      std::fill(buf, buf + n, load_f32(xr, x->dtype, 0));
    }
    cpu::store_row(t, r, buf);
  });
}

void cpu_reduce_to(Tensor* t, ThreadPool& pool) {
  const Tensor* x = t->src[0];
  const int64_t n = x->ne[0];
  const int64_t out_n = t->nelements();
  std::mutex mu;
  std::vector<std::pair<int64_t, std::vector<double>>> parts;
  pool.parallel_for(x->nrows(), [&](int64_t b, int64_t e) {
    std::vector<double> acc(size_t(out_n), 0.0);
    std::vector<float> buf(static_cast<size_t>(n));
    for (int64_t r = b; r < e; ++r) {
      int64_t i1, i2, i3;
      cpu::row_coords(x, r, i1, i2, i3);
      int64_t o = (i1 % t->ne[1]) * t->ne[0] + (i2 % t->ne[2]) * t->ne[0] * t->ne[1] +
                  (i3 % t->ne[3]) * t->ne[0] * t->ne[1] * t->ne[2];
      cpu::load_row(x, r, buf.data());
      if (t->ne[0] == n) {
        for (int64_t i = 0; i < n; ++i) acc[size_t(o + i)] += buf[size_t(i)];
      } else {
        double s = 0;
        for (int64_t i = 0; i < n; ++i) s += buf[size_t(i)];
        acc[size_t(o)] += s;
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    parts.emplace_back(b, std::move(acc));
  }, std::max<int64_t>(1, 16384 / n));
  std::sort(parts.begin(), parts.end(), [](auto& a, auto& b) { return a.first < b.first; });
  std::vector<double> total(size_t(out_n), 0.0);
  for (auto& [b, acc] : parts)
    for (int64_t i = 0; i < out_n; ++i) total[size_t(i)] += acc[size_t(i)];
  std::vector<float> row(size_t(t->ne[0]));
  for (int64_t r = 0; r < t->nrows(); ++r) {
    for (int64_t i = 0; i < t->ne[0]; ++i) row[size_t(i)] = float(total[size_t(r * t->ne[0] + i)]);
    cpu::store_row(t, r, row.data());
  }
}

void cpu_max_back(Tensor* t, ThreadPool& pool) {
  const Tensor* g = t->src[0];
  const Tensor* x = t->src[1];
  const Tensor* y = t->src[2];
  const int64_t n = x->ne[0];
  if (t->ip[0]) {  // per row: the gradient goes to the first arg-max of the row
    cpu::for_rows(pool, x->nrows(), n, 1, [&](int64_t r, float* buf) {
      cpu::load_row(x, r, buf);
      float m = load_f32(cpu::row_ptr(y, r), y->dtype, 0);
      float gv = load_f32(cpu::row_ptr(g, r), g->dtype, 0);
      bool done = false;
      for (int64_t i = 0; i < n; ++i) {
        bool hit = !done && buf[i] == m;
        done |= hit;
        buf[i] = hit ? gv : 0.0f;
      }
      cpu::store_row(t, r, buf);
    });
    return;
  }
  float m = load_f32(y->data, y->dtype, 0);
  float gv = load_f32(g->data, g->dtype, 0);
  bool done = false;
  std::vector<float> buf(static_cast<size_t>(n));
  for (int64_t r = 0; r < x->nrows(); ++r) {
    cpu::load_row(x, r, buf.data());
    for (int64_t i = 0; i < n; ++i) {
      bool hit = !done && buf[size_t(i)] == m;
      done |= hit;
      buf[size_t(i)] = hit ? gv : 0.0f;
    }
    cpu::store_row(t, r, buf.data());
  }
}

void back_sum(BackwardCtx& bc, Tensor* t, Tensor* g) { bc.add(t->src[0], repeat(bc.ctx, g, t->src[0]->ne)); }
void back_mean_rows(BackwardCtx& bc, Tensor* t, Tensor* g) {
  bc.add(t->src[0], scale(bc.ctx, repeat(bc.ctx, g, t->src[0]->ne), 1.0f / float(t->src[0]->ne[0])));
}
void back_mean(BackwardCtx& bc, Tensor* t, Tensor* g) {
  bc.add(t->src[0], scale(bc.ctx, repeat(bc.ctx, g, t->src[0]->ne), 1.0f / float(t->src[0]->nelements())));
}
void back_max_rows(BackwardCtx& bc, Tensor* t, Tensor* g) { bc.add(t->src[0], max_back(bc.ctx, g, t->src[0], t, true)); }
void back_max(BackwardCtx& bc, Tensor* t, Tensor* g) { bc.add(t->src[0], max_back(bc.ctx, g, t->src[0], t, false)); }
void back_repeat(BackwardCtx& bc, Tensor* t, Tensor* g) { bc.add(t->src[0], reduce_to(bc.ctx, g, t->src[0]->ne)); }
void back_reduce_to(BackwardCtx& bc, Tensor* t, Tensor* g) { bc.add(t->src[0], repeat(bc.ctx, g, t->src[0]->ne)); }

}  // namespace

Tensor* sum_rows(Context& ctx, Tensor* x) { return reduction(ctx, Op::SumRows, "sum_rows", x, true); }
Tensor* mean_rows(Context& ctx, Tensor* x) { return reduction(ctx, Op::MeanRows, "mean_rows", x, true); }
Tensor* max_rows(Context& ctx, Tensor* x) { return reduction(ctx, Op::MaxRows, "max_rows", x, true); }
Tensor* sum(Context& ctx, Tensor* x) { return reduction(ctx, Op::Sum, "sum", x, false); }
Tensor* mean(Context& ctx, Tensor* x) { return reduction(ctx, Op::Mean, "mean", x, false); }
Tensor* max(Context& ctx, Tensor* x) { return reduction(ctx, Op::Max, "max", x, false); }

Tensor* repeat(Context& ctx, Tensor* x, const int64_t ne[kMaxDims]) {
  RT_CHECK(x && is_float(x->dtype), "repeat: operand must be a float tensor");
  for (int d = 0; d < kMaxDims; ++d)
    RT_CHECK(x->ne[d] == 1 || x->ne[d] == ne[d], "repeat: cannot broadcast ", x->describe(), " to ",
             shape_str(ne));
  Tensor* t = ctx.node(Op::Repeat, x->dtype, ne);
  t->src[0] = x;
  return t;
}

Tensor* reduce_to(Context& ctx, Tensor* x, const int64_t ne[kMaxDims]) {
  RT_CHECK(x && is_float(x->dtype), "reduce_to: operand must be a float tensor");
  for (int d = 0; d < kMaxDims; ++d)
    RT_CHECK(ne[d] == 1 || x->ne[d] == ne[d], "reduce_to: cannot sum ", x->describe(), " down to ",
             shape_str(ne), " (each target dim must be 1 or equal)");
  Tensor* t = ctx.node(Op::ReduceTo, DType::F32, ne);
  t->src[0] = x;
  return t;
}

void register_reduce_ops(OpTable& t) {
  t[size_t(Op::SumRows)] = {cpu_sum_rows, back_sum, true};
  t[size_t(Op::MeanRows)] = {cpu_mean_rows, back_mean_rows, true};
  t[size_t(Op::MaxRows)] = {cpu_max_rows, back_max_rows, true};
  t[size_t(Op::Sum)] = {cpu_sum, back_sum, true};
  t[size_t(Op::Mean)] = {cpu_mean, back_mean, true};
  t[size_t(Op::Max)] = {cpu_max, back_max, true};
  t[size_t(Op::Repeat)] = {cpu_repeat, back_repeat, true};
  t[size_t(Op::ReduceTo)] = {cpu_reduce_to, back_reduce_to, true};
  t[size_t(Op::MaxBack)] = {cpu_max_back, nullptr, false};
}

}  // namespace retort
