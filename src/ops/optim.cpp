// The optimizer ops (optim_ops.h): chunk tables, the global gradient norm with its clip scale, and the
// multi-tensor AdamW and SGD updates, with their CPU kernels. The update arithmetic is the per-parameter
// update's, expression for expression, so a step gives the same bits whichever way its chunks are cut; the
// CUDA kernels (src/cuda/cuda_optim.cu) follow the same expressions.
#include <bit>
#include <cmath>
#include <cstring>
#include <initializer_list>

#include "../core/error.h"
#include "../core/op_table.h"
#include "../core/thread_pool.h"
#include "optim_ops.h"
#include "vec_math.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace retort {

namespace {

int64_t address(const Tensor* t, int64_t element) {
  return t ? int64_t(reinterpret_cast<intptr_t>(static_cast<const char*>(t->data) + element * t->elsize()))
           : 0;
}

// A leaf the op may keep an address of: its storage is its own and never moves (a graph node's is replanned).
void check_leaf(const Tensor* t, const Context& ctx, const char* who, const char* role) {
  RT_CHECK(t->is_leaf() && t->data != nullptr, who, ": ", role, " ", t->describe(),
           " must be a tensor with its own storage (a leaf), not a graph node");
  RT_CHECK(&t->backend() == &ctx.backend(), who, ": ", role, " ", t->describe(), " lives on another ",
           t->backend().name(), " backend than the optimizer's state");
}

void check_f32_like(const Tensor* t, int64_t n, const Context& ctx, const char* who, const char* role,
                    const Tensor* of) {
  check_leaf(t, ctx, who, role);
  RT_CHECK(t->dtype == DType::F32 && t->is_contiguous() && t->nelements() == n, who, ": ", role, " ",
           t->describe(), " must be a contiguous f32 tensor with the ", n, " elements of ", of->describe());
}

const float* stats_of(const Tensor* t) {
  return static_cast<const float*>(t->data);  // the node aliases the stats leaf
}

// Calls f(row) for each chunk row of the table, chunks spread over the pool.
template <typename F>
void for_chunks(const Tensor* table, ThreadPool& pool, F&& f) {
  const int64_t* tab = static_cast<const int64_t*>(table->data);
  pool.parallel_for(table->ne[1], [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) f(tab + c * kOptCols);
  });
}

template <typename T>
T* ptr(const int64_t* row, int col) {
  return reinterpret_cast<T*>(intptr_t(row[col]));
}

void cpu_grad_norm(Tensor* t, ThreadPool& pool) {
  const Tensor* table = t->src[1];
  const int64_t chunks = table->ne[1];
  double* part = static_cast<double*>(t->src[2]->data);
  const int64_t* tab = static_cast<const int64_t*>(table->data);
  pool.parallel_for(chunks, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      const int64_t* row = tab + c * kOptCols;
      const float* g = ptr<const float>(row, kOptGrad);
      double s = 0;
      for (int64_t i = 0; i < row[kOptCount]; ++i) s += double(g[i]) * g[i];
      part[c] = s;
    }
  });
  // In chunk order, so the total does not depend on how the chunks were shared among threads.
  double total = 0;
  for (int64_t c = 0; c < chunks; ++c) total += part[c];
  part[chunks] = total;
  const double norm = std::sqrt(total);
  const Tensor* loss = t->src[3];
  const float lv = loss ? load_f32(loss->data, loss->dtype, 0) : 0.0f;
  const double max_norm = std::bit_cast<double>(t->ip[1]);
  const bool ok = std::isfinite(norm) && std::isfinite(lv);
  // A non-finite norm keeps scale 1: max_norm / inf would zero the finite gradients and keep the NaNs.
  const float scale = ok && max_norm > 0 && norm > max_norm ? float(max_norm / norm) : 1.0f;
  float* stats = static_cast<float*>(t->data);  // aliases the stats leaf
  stats[kStatLoss] = lv;
  stats[kStatNorm] = float(norm);
  stats[kStatScale] = scale;
  stats[kStatOk] = ok ? 1.0f : 0.0f;
  if (t->ip[0] && scale != 1.0f)
    for_chunks(table, pool, [&](const int64_t* row) {
      float* g = ptr<float>(row, kOptGrad);
      for (int64_t i = 0; i < row[kOptCount]; ++i) g[i] *= scale;
    });
}

// AdamW's update of n f32 parameters, 16 at a time, in the scalar loop's expressions (no fused multiply-adds:
// the bits must not depend on the instruction set); returns how many it updated, a multiple of 16. The scalar
// loop's sqrt and division do not vectorize, and they are most of its time.
#if defined(__x86_64__)
__attribute__((target("avx512f"), optimize("fp-contract=off"))) int64_t adamw_f32_avx512(
    int64_t n, const float* g, float* mm, float* vv, float* w, float scale, float beta1, float beta2,
    float step_size, float inv_sqrt_bc2, float eps, float decay) {
  const __m512 s = _mm512_set1_ps(scale), b1 = _mm512_set1_ps(beta1), c1 = _mm512_set1_ps(1.0f - beta1);
  const __m512 b2 = _mm512_set1_ps(beta2), c2 = _mm512_set1_ps(1.0f - beta2), lr = _mm512_set1_ps(step_size);
  const __m512 ib = _mm512_set1_ps(inv_sqrt_bc2), ep = _mm512_set1_ps(eps), dc = _mm512_set1_ps(decay);
  const int64_t n16 = n / 16 * 16;
  for (int64_t i = 0; i < n16; i += 16) {
    const __m512 gi = _mm512_mul_ps(_mm512_loadu_ps(g + i), s);
    const __m512 m = _mm512_add_ps(_mm512_mul_ps(b1, _mm512_loadu_ps(mm + i)), _mm512_mul_ps(c1, gi));
    const __m512 v =
        _mm512_add_ps(_mm512_mul_ps(b2, _mm512_loadu_ps(vv + i)), _mm512_mul_ps(_mm512_mul_ps(c2, gi), gi));
    _mm512_storeu_ps(mm + i, m);
    _mm512_storeu_ps(vv + i, v);
    const __m512 den = _mm512_add_ps(_mm512_mul_ps(_mm512_maskz_sqrt_ps(0xFFFF, v), ib), ep);
    const __m512 wd = _mm512_mul_ps(_mm512_loadu_ps(w + i), dc);
    _mm512_storeu_ps(w + i, _mm512_sub_ps(wd, _mm512_div_ps(_mm512_mul_ps(lr, m), den)));
  }
  return n16;
}
#endif

void cpu_adamw_step(Tensor* t, ThreadPool& pool) {
  const float* stats = stats_of(t);
  if (stats[kStatOk] == 0.0f) return;
  const float scale = stats[kStatScale];
  const float* hp = static_cast<const float*>(t->src[2]->data);
  const float step_size = hp[1], inv_sqrt_bc2 = hp[2], decay = hp[3];
  const float beta1 = t->fp[0], beta2 = t->fp[1], eps = t->fp[2];
  for_chunks(t->src[1], pool, [&](const int64_t* row) {
    const float* g = ptr<const float>(row, kOptGrad);
    float* mm = ptr<float>(row, kOptState1);
    float* vv = ptr<float>(row, kOptState2);
    void* pd = ptr<void>(row, kOptParam);
    const DType dt = DType(row[kOptDType]);
    int64_t i = 0;
#if defined(__x86_64__)
    if (dt == DType::F32 && vmath::best_impl() == vmath::Impl::Avx512)
      i = adamw_f32_avx512(row[kOptCount], g, mm, vv, static_cast<float*>(pd), scale, beta1, beta2, step_size,
                           inv_sqrt_bc2, eps, decay);
#endif
    for (; i < row[kOptCount]; ++i) {
      const float gi = g[i] * scale;  // the clipped gradient; exact when scale is 1
      mm[i] = beta1 * mm[i] + (1.0f - beta1) * gi;
      vv[i] = beta2 * vv[i] + (1.0f - beta2) * gi * gi;
      float w = load_f32(pd, dt, i) * decay;  // decoupled weight decay
      w -= step_size * mm[i] / (std::sqrt(vv[i]) * inv_sqrt_bc2 + eps);
      store_f32(pd, dt, i, w);
    }
  });
}

void cpu_sgd_step(Tensor* t, ThreadPool& pool) {
  const float* stats = stats_of(t);
  if (stats[kStatOk] == 0.0f) return;
  const float scale = stats[kStatScale];
  const float lr = static_cast<const float*>(t->src[2]->data)[0];
  const float momentum = t->fp[0], wd = t->fp[1];
  for_chunks(t->src[1], pool, [&](const int64_t* row) {
    const float* g = ptr<const float>(row, kOptGrad);
    float* mb = ptr<float>(row, kOptState1);
    void* pd = ptr<void>(row, kOptParam);
    const DType dt = DType(row[kOptDType]);
    for (int64_t i = 0; i < row[kOptCount]; ++i) {
      const float w = load_f32(pd, dt, i);
      float d = g[i] * scale + wd * w;
      if (mb) d = mb[i] = momentum * mb[i] + d;
      store_f32(pd, dt, i, w - lr * d);
    }
  });
}

// The stats leaf behind stats: the leaf itself, or the grad_norm node that writes it (so an update that reads
// the node runs after it).
const Tensor* stats_leaf(const Tensor* stats) {
  return stats && stats->op == Op::GradNorm ? stats->view_src : stats;
}

void check_stats(const Tensor* stats, const char* who) {
  const Tensor* s = stats_leaf(stats);
  RT_CHECK(s && s->is_leaf() && s->data && s->dtype == DType::F32 && s->is_contiguous() &&
               s->nelements() == kOptStats,
           who, ": stats must be an f32 leaf of ", int(kOptStats),
           " elements (optimizer_stats) or a grad_norm node over one, got ",
           stats ? stats->describe() : std::string("null"));
}

void check_table(const Tensor* table, const Tensor* stats, const char* who) {
  RT_CHECK(table && table->is_leaf() && table->data && table->dtype == DType::I64 && table->is_contiguous() &&
               table->ne[0] == kOptCols && table->ne[2] == 1 && table->ne[3] == 1,
           who, ": table must be a chunk table from optimizer_table, got ",
           table ? table->describe() : std::string("null"));
  RT_CHECK(&table->backend() == &stats_leaf(stats)->backend(), who,
           ": table and stats live on different backends");
}

// Whether every row of the table has each of cols (recorded by optimizer_table in the leaf's ip[0], since a
// device table cannot be read without a synchronization).
bool has_all(const Tensor* table, std::initializer_list<int> cols) {
  for (int c : cols)
    if (!(table->ip[0] >> c & 1)) return false;
  return true;
}

// The node of a multi-tensor op: it aliases stats, like set_rows its destination, so that whatever reads
// the node runs after it.
Tensor* optimizer_node(Context& ctx, Op op, Tensor* stats, Tensor* table) {
  Tensor* t = ctx.node(op, DType::F32, stats->ne);
  t->src[0] = stats;
  t->src[1] = table;
  t->view_src = const_cast<Tensor*>(stats_leaf(stats));
  t->data = t->view_src->data;
  return t;
}

void check_hparams(const Tensor* hp, int64_t n, const Tensor* stats, const char* who) {
  RT_CHECK(hp && hp->is_leaf() && hp->data && hp->dtype == DType::F32 && hp->is_contiguous() &&
               hp->nelements() == n,
           who, ": hparams must be an f32 leaf of ", n, " elements, got ",
           hp ? hp->describe() : std::string("null"));
  RT_CHECK(&hp->backend() == &stats_leaf(stats)->backend(), who,
           ": hparams and stats live on different backends");
}

}  // namespace

Tensor* optimizer_table(Context& ctx, const std::vector<OptSlot>& slots, const char* who) {
  RT_CHECK(!slots.empty(), who, ": no tensors to update");
  std::vector<int64_t> rows;
  int64_t present = (1 << kOptParam) | (1 << kOptState1) | (1 << kOptState2);
  for (const OptSlot& s : slots) {
    if (!s.param) present &= ~(int64_t(1) << kOptParam);
    if (!s.state1) present &= ~(int64_t(1) << kOptState1);
    if (!s.state2) present &= ~(int64_t(1) << kOptState2);
    RT_CHECK(s.grad != nullptr, who, ": a table entry has no gradient");
    const Tensor* of = s.param ? s.param : s.grad;
    if (s.param) {
      check_leaf(s.param, ctx, who, "parameter");
      RT_CHECK(is_float(s.param->dtype) && s.param->is_contiguous(), who, ": parameter ", s.param->describe(),
               " must be a contiguous float tensor");
    }
    const int64_t n = of->nelements();
    check_f32_like(s.grad, n, ctx, who, "gradient", of);
    if (s.state1) check_f32_like(s.state1, n, ctx, who, "optimizer state", of);
    if (s.state2) check_f32_like(s.state2, n, ctx, who, "optimizer state", of);
    for (int64_t off = 0; off < n; off += kOptChunk) {
      rows.push_back(address(s.param, off));
      rows.push_back(address(s.grad, off));
      rows.push_back(address(s.state1, off));
      rows.push_back(address(s.state2, off));
      rows.push_back(std::min(kOptChunk, n - off));
      rows.push_back(int64_t(s.param ? s.param->dtype : DType::F32));
    }
  }
  Tensor* t = ctx.tensor(DType::I64, {int64_t(rows.size()) / kOptCols, kOptCols}, "optimizer_table");
  set_data_int(t, rows);
  t->ip[0] = present;
  return t;
}

Tensor* optimizer_stats(Context& ctx) {
  Tensor* t = ctx.tensor(DType::F32, {kOptStats}, "optimizer_stats");
  std::vector<float> v(size_t(kOptStats), 0.0f);
  v[kStatScale] = 1.0f;
  v[kStatOk] = 1.0f;
  set_data(t, v);
  return t;
}

Tensor* optimizer_scratch(Context& ctx, const Tensor* table) {
  return ctx.tensor(DType::I64, {table->ne[1] + 1}, "optimizer_scratch");
}

Tensor* grad_norm_op(Context& ctx, Tensor* stats, Tensor* table, Tensor* scratch, Tensor* loss,
                     double max_norm, bool apply) {
  RT_CHECK(stats && stats->is_leaf(), "grad_norm: stats must be the stats leaf (optimizer_stats)");
  check_stats(stats, "grad_norm");
  check_table(table, stats, "grad_norm");
  RT_CHECK(scratch && scratch->is_leaf() && scratch->data && scratch->dtype == DType::I64 &&
               scratch->is_contiguous() && scratch->nelements() == table->ne[1] + 1 &&
               &scratch->backend() == &table->backend(),
           "grad_norm: scratch must be optimizer_scratch(table), got ",
           scratch ? scratch->describe() : std::string("null"));
  RT_CHECK(!loss || (is_float(loss->dtype) && loss->nelements() == 1), "grad_norm: loss ",
           loss ? loss->describe() : std::string(), " must be a single float element");
  RT_CHECK(std::isfinite(max_norm) && max_norm >= 0, "grad_norm: max_norm = ", max_norm,
           " must be a finite number >= 0 (0: no clipping)");
  Tensor* t = optimizer_node(ctx, Op::GradNorm, stats, table);
  t->src[2] = scratch;
  t->src[3] = loss;
  t->ip[0] = apply ? 1 : 0;
  t->ip[1] = std::bit_cast<int64_t>(max_norm);
  return t;
}

Tensor* adamw_step_op(Context& ctx, Tensor* stats, Tensor* table, Tensor* hparams, float beta1, float beta2,
                      float eps) {
  check_stats(stats, "adamw_step");
  check_table(table, stats, "adamw_step");
  check_hparams(hparams, kAdamWHparams, stats, "adamw_step");
  RT_CHECK(has_all(table, {kOptParam, kOptState1, kOptState2}), "adamw_step: every table entry needs a ",
           "parameter, m and v");
  Tensor* t = optimizer_node(ctx, Op::AdamWStep, stats, table);
  t->src[2] = hparams;
  t->fp[0] = beta1;
  t->fp[1] = beta2;
  t->fp[2] = eps;
  return t;
}

Tensor* sgd_step_op(Context& ctx, Tensor* stats, Tensor* table, Tensor* hparams, float momentum,
                    float weight_decay) {
  check_stats(stats, "sgd_step");
  check_table(table, stats, "sgd_step");
  check_hparams(hparams, 1, stats, "sgd_step");
  RT_CHECK(has_all(table, {kOptParam}), "sgd_step: every table entry needs a parameter");
  RT_CHECK(momentum == 0.0f || has_all(table, {kOptState1}), "sgd_step: momentum ", momentum,
           " needs a momentum buffer in every table entry");
  Tensor* t = optimizer_node(ctx, Op::SgdStep, stats, table);
  t->src[2] = hparams;
  t->fp[0] = momentum;
  t->fp[1] = weight_decay;
  return t;
}

void register_optim_ops(OpTable& t) {
  t[size_t(Op::GradNorm)] = {cpu_grad_norm, nullptr, false};
  t[size_t(Op::AdamWStep)] = {cpu_adamw_step, nullptr, false};
  t[size_t(Op::SgdStep)] = {cpu_sgd_step, nullptr, false};
}

}  // namespace retort
