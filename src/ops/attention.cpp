// flash_attention: scaled dot-product attention that never stores the [T_q, T_k] scores. q is [B, T_q, H, D]
// and k, v are [B, T_k, KV, D], the layout the projections produce (no head-major copies); query head h reads
// kv head h / (H / KV) (grouped-query attention without repeated k, v). The forward saves only the per-row
// log-sum-exp of the scaled scores; the backward recomputes the probabilities from it.
//
// CPU kernels: per query row, the scores of its visible keys go to a [T_k] scratch row (exact max, exps,
// sum), then o = Σ p_j v_j. The backward runs one task per (batch, kv head), so each task owns the dk, dv of
// its head and writes the dq of the query heads that read it: no atomics, the same result on any thread count.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "../core/error.h"
#include "../core/op_table.h"
#include "cpu_util.h"
#include "ops.h"
#include "vec_math.h"

namespace retort {

namespace {

constexpr int kAuxLse = 0;                 // FlashAttention: aux slot of the log-sum-exp [B, H, T_q]
constexpr int kAuxDk = 0, kAuxDv = 1;      // FlashAttentionBack: aux slots of dk and dv
constexpr int64_t kQueryBlock = 64;        // query rows per CPU task of the forward
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Dims {
  int64_t B, Tq, Tk, H, KV, D;
  bool causal;
  int64_t n_past;
  float scale;
  // Keys visible to query i: [0, visible(i)).
  int64_t visible(int64_t i) const {
    if (!causal) return Tk;
    return std::clamp<int64_t>(i + n_past + 1, 0, Tk);
  }
};

Dims dims_of(const Tensor* node) {
  const Tensor* q = node->src[0];
  const Tensor* k = node->src[1];
  return {q->ne[3], q->ne[2], k->ne[2], q->ne[1], k->ne[1], q->ne[0], node->ip[0] != 0, node->ip[1],
          node->fp[0]};
}

// Row t of head h of batch b of a contiguous [B, T, heads, D] tensor, as f32 into out.
void load_head_row(const Tensor* x, int64_t b, int64_t t, int64_t h, float* out) {
  const int64_t D = x->ne[0];
  const char* p = static_cast<const char*>(x->data) + size_t(((b * x->ne[2] + t) * x->ne[1] + h) * D) * x->elsize();
  if (x->dtype == DType::F32) {
    std::copy_n(reinterpret_cast<const float*>(p), D, out);
    return;
  }
  for (int64_t d = 0; d < D; ++d) out[d] = load_f32(p, x->dtype, d);
}

void store_head_row(const Tensor* x, int64_t b, int64_t t, int64_t h, const float* in) {
  const int64_t D = x->ne[0];
  char* p = static_cast<char*>(x->data) + size_t(((b * x->ne[2] + t) * x->ne[1] + h) * D) * x->elsize();
  for (int64_t d = 0; d < D; ++d) store_f32(p, x->dtype, d, in[d]);
}

// The T_k rows of kv head g of batch b as a contiguous f32 [T_k, D] block.
void load_head(const Tensor* x, int64_t b, int64_t g, float* out) {
  for (int64_t t = 0; t < x->ne[2]; ++t) load_head_row(x, b, t, g, out + t * x->ne[0]);
}

void cpu_flash_attention(Tensor* t, ThreadPool& pool) {
  const Dims d = dims_of(t);
  const Tensor *q = t->src[0], *k = t->src[1], *v = t->src[2];
  Tensor* lse = t->aux[kAuxLse];
  const int64_t qblocks = (d.Tq + kQueryBlock - 1) / kQueryBlock, group = d.H / d.KV;
  pool.parallel_for(d.B * d.H * qblocks, [&](int64_t begin, int64_t end) {
    std::vector<float> kf(size_t(d.Tk * d.D)), vf(size_t(d.Tk * d.D)), s(size_t(d.Tk) + 1),
        qrow(size_t(d.D)), orow(size_t(d.D));
    int64_t loaded = -1;  // the (b, kv head) held in kf, vf
    for (int64_t task = begin; task < end; ++task) {
      const int64_t qb = task % qblocks, h = task / qblocks % d.H, b = task / qblocks / d.H;
      const int64_t g = h / group;
      if (loaded != b * d.KV + g) {
        load_head(k, b, g, kf.data());
        load_head(v, b, g, vf.data());
        loaded = b * d.KV + g;
      }
      for (int64_t i = qb * kQueryBlock; i < std::min(d.Tq, (qb + 1) * kQueryBlock); ++i) {
        const int64_t n = d.visible(i);
        std::fill(orow.begin(), orow.end(), 0.0f);
        float row_lse = kNegInf;  // a row with no visible key: zeros, and lse -inf
        if (n > 0) {
          load_head_row(q, b, i, h, qrow.data());
          for (int64_t j = 0; j < n; ++j) s[j] = d.scale * vmath::dot(qrow.data(), kf.data() + j * d.D, d.D);
          const float m = vmath::max(s.data(), n);
          const double l = vmath::exp_affine(s.data(), s.data(), n, m, 1.0f, 0.0f, 1.0f, 0.0f);
          for (int64_t j = 0; j < n; ++j) vmath::axpy(s[j], vf.data() + j * d.D, orow.data(), d.D);
          const float inv = float(1.0 / l);
          for (float& x : orow) x *= inv;
          row_lse = m + float(std::log(l));
        }
        store_head_row(t, b, i, h, orow.data());
        static_cast<float*>(lse->data)[(b * d.H + h) * d.Tq + i] = row_lse;
      }
    }
  });
}

// src = q, k, v, o, do, lse; the node is dq, aux dk and dv.
//   p_ij = exp(s_ij − lse_i), dp_ij = do_i · v_j, D_i = do_i · o_i, ds_ij = p_ij (dp_ij − D_i)
//   dq_i = scale Σ_j ds_ij k_j, dk_j = scale Σ_i ds_ij q_i, dv_j = Σ_i p_ij do_i
void cpu_flash_attention_back(Tensor* t, ThreadPool& pool) {
  const Dims d = dims_of(t);
  const Tensor *q = t->src[0], *k = t->src[1], *v = t->src[2], *o = t->src[3], *dout = t->src[4];
  const float* lse = static_cast<const float*>(t->src[5]->data);
  Tensor *dk = t->aux[kAuxDk], *dv = t->aux[kAuxDv];
  const int64_t group = d.H / d.KV;
  pool.parallel_for(d.B * d.KV, [&](int64_t begin, int64_t end) {
    const size_t head = size_t(d.Tk * d.D);
    std::vector<float> kf(head), vf(head), dkf(head), dvf(head), p(size_t(d.Tk) + 1), qrow(size_t(d.D)),
        orow(size_t(d.D)), dorow(size_t(d.D)), dqrow(size_t(d.D));
    for (int64_t task = begin; task < end; ++task) {
      const int64_t g = task % d.KV, b = task / d.KV;
      load_head(k, b, g, kf.data());
      load_head(v, b, g, vf.data());
      std::fill(dkf.begin(), dkf.end(), 0.0f);
      std::fill(dvf.begin(), dvf.end(), 0.0f);
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        for (int64_t i = 0; i < d.Tq; ++i) {
          const int64_t n = d.visible(i);
          std::fill(dqrow.begin(), dqrow.end(), 0.0f);
          const float li = lse[(b * d.H + h) * d.Tq + i];
          if (n > 0 && li != kNegInf) {
            load_head_row(q, b, i, h, qrow.data());
            load_head_row(o, b, i, h, orow.data());
            load_head_row(dout, b, i, h, dorow.data());
            const float Di = vmath::dot(dorow.data(), orow.data(), d.D);
            for (int64_t j = 0; j < n; ++j)
              p[j] = std::exp(d.scale * vmath::dot(qrow.data(), kf.data() + j * d.D, d.D) - li);
            for (int64_t j = 0; j < n; ++j) {
              const float* vj = vf.data() + j * d.D;
              const float ds = p[j] * (vmath::dot(dorow.data(), vj, d.D) - Di) * d.scale;
              vmath::axpy(ds, kf.data() + j * d.D, dqrow.data(), d.D);
              vmath::axpy(ds, qrow.data(), dkf.data() + j * d.D, d.D);
              vmath::axpy(p[j], dorow.data(), dvf.data() + j * d.D, d.D);
            }
          }
          store_head_row(t, b, i, h, dqrow.data());
        }
      }
      for (int64_t j = 0; j < d.Tk; ++j) {
        store_head_row(dk, b, j, g, dkf.data() + j * d.D);
        store_head_row(dv, b, j, g, dvf.data() + j * d.D);
      }
    }
  });
}

Tensor* back_node(Context& ctx, Tensor* node, Tensor* grad) {
  Tensor *q = node->src[0], *k = node->src[1], *v = node->src[2];
  Tensor* dout = grad->is_contiguous() ? grad : contiguous(ctx, grad);
  if (dout->dtype != node->dtype) dout = cast(ctx, dout, node->dtype);
  Tensor* t = ctx.node(Op::FlashAttentionBack, q->dtype, q->ne);
  t->src = {q, k, v, node, dout, node->aux[kAuxLse]};
  t->ip = node->ip;
  t->fp = node->fp;
  for (int slot : {kAuxDk, kAuxDv}) {
    Tensor* a = ctx.node(Op::AuxOutput, k->dtype, k->ne);
    a->src[0] = t;
    t->aux[size_t(slot)] = a;
  }
  return t;
}

void back_flash_attention(BackwardCtx& bc, Tensor* node, Tensor* grad) {
  if (!bc.needs(node->src[0]) && !bc.needs(node->src[1]) && !bc.needs(node->src[2])) return;
  Tensor* t = back_node(bc.ctx, node, grad);
  bc.add(node->src[0], t);
  bc.add(node->src[1], t->aux[kAuxDk]);
  bc.add(node->src[2], t->aux[kAuxDv]);
}

void check_heads(const char* op, const char* name, const Tensor* x) {
  RT_CHECK(x != nullptr, op, ": ", name, " is null");
  RT_CHECK(is_float(x->dtype), op, ": ", name, " must be f32, bf16 or f16, got ", x->describe());
  RT_CHECK(x->is_contiguous(), op, ": ", name, " must be contiguous [B, T, heads, D], got a strided ",
           x->describe(), " (make it contiguous first)");
}

}  // namespace

Tensor* flash_attention(Context& ctx, Tensor* q, Tensor* k, Tensor* v, float scale, bool causal,
                        int64_t n_past) {
  const char* op = "flash_attention";
  check_heads(op, "q", q);
  check_heads(op, "k", k);
  check_heads(op, "v", v);
  RT_CHECK(q->dtype == k->dtype && q->dtype == v->dtype, op, ": q, k and v must share a dtype, got ",
           q->describe(), ", ", k->describe(), " and ", v->describe());
  RT_CHECK(same_shape(k, v), op, ": k and v must have the same shape [B, T_k, KV, D], got ", k->describe(),
           " and ", v->describe());
  RT_CHECK(k->ne[3] == q->ne[3] && k->ne[0] == q->ne[0] && k->ne[1] >= 1 && q->ne[1] % k->ne[1] == 0, op,
           ": q [B, T_q, H, D] and k [B, T_k, KV, D] need the same B and D and KV dividing H, got q ",
           q->describe(), " and k ", k->describe());
  RT_CHECK(std::isfinite(scale), op, ": scale must be finite, got ", scale);
  RT_CHECK(std::abs(n_past) <= (int64_t(1) << 40), op, ": n_past = ", n_past, " is out of range");
  Tensor* t = ctx.node(Op::FlashAttention, q->dtype, q->ne);
  t->src[0] = q;
  t->src[1] = k;
  t->src[2] = v;
  t->ip[0] = causal ? 1 : 0;
  t->ip[1] = n_past;
  t->fp[0] = scale;
  const int64_t ne[kMaxDims] = {q->ne[2], q->ne[1], q->ne[3], 1};  // [B, H, T_q]
  Tensor* lse = ctx.node(Op::AuxOutput, DType::F32, ne);
  lse->src[0] = t;
  t->aux[kAuxLse] = lse;
  return t;
}

Tensor* flash_attention_lse(Tensor* attention) {
  RT_CHECK(attention != nullptr && attention->op == Op::FlashAttention,
           "flash_attention_lse: not a flash_attention node");
  return attention->aux[kAuxLse];
}

void register_attention_ops(OpTable& t) {
  t[size_t(Op::FlashAttention)] = {cpu_flash_attention, back_flash_attention, true};
  t[size_t(Op::FlashAttentionBack)] = {cpu_flash_attention_back, nullptr, false};
}

}  // namespace retort
