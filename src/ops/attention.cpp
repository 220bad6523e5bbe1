// flash_attention: scaled dot-product attention that never stores the [T_q, T_k] scores. q is [B, T_q, H, D]
// and k, v are [B, T_k, KV, D], the layout the projections produce (no head-major copies); query head h reads
// kv head h / (H / KV) (grouped-query attention without repeated k, v). The forward saves only the per-row
// log-sum-exp of the scaled scores; the backward recomputes the probabilities from it.
//
// CPU kernels: tiles of 64 query rows against 64 keys, each product a small register-blocked GEMM on f32
// tiles in cache (tile_gemm.h; 16-bit inputs are widened as a head is loaded), with an online softmax per key
// tile in the forward. Head dims and key counts are padded with zeros to the GEMM's 16 lanes; padded keys
// and keys a row does not see get probability 0. The backward runs one task per (batch, kv head), so each
// task owns the dk, dv of its head and writes the dq of the query heads that read it: no atomics, the same
// result on any thread count.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "../core/error.h"
#include "../core/op_table.h"
#include "../core/thread_pool.h"
#include "ops.h"
#include "tile_gemm.h"
#include "vec_math.h"

namespace retort {

namespace {

constexpr int kAuxLse = 0;             // FlashAttention: aux slot of the log-sum-exp [B, H, T_q]
constexpr int kAuxDk = 0, kAuxDv = 1;  // FlashAttentionBack: aux slots of dk and dv
constexpr int64_t kQueryTile = 64;     // query rows per tile (and per forward task)
constexpr int64_t kKeyTile = 64;       // keys per tile (a multiple of tile::kTileLanes)
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

int64_t padded(int64_t n) {
  return (n + tile::kTileLanes - 1) / tile::kTileLanes * tile::kTileLanes;
}

struct Dims {
  int64_t B, Tq, Tk, H, KV, D;
  bool causal;
  int64_t n_past;
  float scale;
  // Keys visible to query i: [0, visible(i)); never fewer for a later row.
  int64_t visible(int64_t i) const {
    if (!causal) return Tk;
    return std::clamp<int64_t>(i + n_past + 1, 0, Tk);
  }
  int64_t dp() const { return padded(D); }
  int64_t tkp() const { return padded(Tk); }
};

Dims dims_of(const Tensor* node) {
  const Tensor* q = node->src[0];
  const Tensor* k = node->src[1];
  return {q->ne[3], q->ne[2], k->ne[2], q->ne[1], k->ne[1], q->ne[0], node->ip[0] != 0, node->ip[1],
          node->fp[0]};
}

// Rows t0..t0+rows-1 of head h of batch b of a contiguous [B, T, heads, D] tensor, times scale, as f32 rows
// of ld floats (columns D..ld-1 zero).
void load_rows(const Tensor* x, int64_t b, int64_t t0, int64_t rows, int64_t h, float scale, float* out,
               int64_t ld) {
  const int64_t D = x->ne[0];
  for (int64_t r = 0; r < rows; ++r) {
    const char* p = static_cast<const char*>(x->data) +
                    size_t(((b * x->ne[2] + t0 + r) * x->ne[1] + h) * D) * x->elsize();
    float* o = out + r * ld;
    if (x->dtype == DType::F32) {
      const float* s = reinterpret_cast<const float*>(p);
      for (int64_t d = 0; d < D; ++d) o[d] = scale * s[d];
    } else if (x->dtype == DType::BF16) {
      const uint16_t* s = reinterpret_cast<const uint16_t*>(p);
      for (int64_t d = 0; d < D; ++d) o[d] = scale * bf16_to_f32(s[d]);
    } else {
      for (int64_t d = 0; d < D; ++d) o[d] = scale * load_f32(p, x->dtype, d);
    }
    std::fill(o + D, o + ld, 0.0f);
  }
}

void store_rows(const Tensor* x, int64_t b, int64_t t0, int64_t rows, int64_t h, const float* in,
                int64_t ld) {
  const int64_t D = x->ne[0];
  for (int64_t r = 0; r < rows; ++r) {
    char* p =
        static_cast<char*>(x->data) + size_t(((b * x->ne[2] + t0 + r) * x->ne[1] + h) * D) * x->elsize();
    if (x->dtype == DType::F32)
      std::copy_n(in + r * ld, D, reinterpret_cast<float*>(p));
    else
      for (int64_t d = 0; d < D; ++d) store_f32(p, x->dtype, d, in[r * ld + d]);
  }
}

// One kv head of one batch in f32, zero-padded to [tkp, dp]: k and v as they are, kᵀ (and vᵀ for the
// backward) [dp, tkp] for the products that run along the head dim.
struct KvHead {
  std::vector<float> k, v, kt, vt;
  int64_t loaded = -1;  // b * KV + g, or -1

  void load(const Dims& d, const Tensor* kx, const Tensor* vx, int64_t b, int64_t g, bool transposed_v) {
    const int64_t dp = d.dp(), tkp = d.tkp(), size = tkp * dp;
    k.assign(size_t(size), 0.0f);
    v.assign(size_t(size), 0.0f);
    load_rows(kx, b, 0, d.Tk, g, 1.0f, k.data(), dp);
    load_rows(vx, b, 0, d.Tk, g, 1.0f, v.data(), dp);
    transpose(k, kt, tkp, dp);
    if (transposed_v) transpose(v, vt, tkp, dp);
    loaded = b * d.KV + g;
  }
  static void transpose(const std::vector<float>& x, std::vector<float>& xt, int64_t rows, int64_t cols) {
    xt.resize(x.size());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) xt[size_t(c * rows + r)] = x[size_t(r * cols + c)];
  }
};

// Query tile i0..i0+rows-1 of head h: qs holds those rows times scale ([kQueryTile, dp]); writes o (the same
// layout, normalized) and the rows' log-sum-exp. s is [kQueryTile, kKeyTile] scratch.
void forward_tile(const Dims& d, const KvHead& kv, const float* qs, int64_t i0, int64_t rows, float* o,
                  float* lse, float* s) {
  const int64_t dp = d.dp(), tkp = d.tkp(), n_max = d.visible(i0 + rows - 1);
  float m[kQueryTile], l[kQueryTile];
  std::fill(m, m + rows, kNegInf);
  std::fill(l, l + rows, 0.0f);
  std::fill(o, o + rows * dp, 0.0f);
  for (int64_t j0 = 0; j0 < n_max; j0 += kKeyTile) {
    const int64_t nk = std::min(kKeyTile, n_max - j0), nkp = padded(nk);
    tile::gemm(rows, nkp, dp, qs, dp, 1, kv.kt.data() + j0, tkp, s, kKeyTile, false);  // scaled scores
    for (int64_t r = 0; r < rows; ++r) {
      float* sr = s + r * kKeyTile;
      const int64_t cnt = std::clamp<int64_t>(d.visible(i0 + r) - j0, 0, nk);
      const float mn = cnt > 0 ? std::max(m[r], vmath::max(sr, cnt)) : kNegInf;
      std::fill(sr + cnt, sr + nkp, 0.0f);  // keys this row does not see
      if (mn == kNegInf) {
        std::fill(sr, sr + cnt, 0.0f);
        continue;
      }
      if (mn > m[r]) {
        // A new running max: rescale what the row has summed so far (nothing yet when m is -inf).
        const float alpha = m[r] == kNegInf ? 0.0f : std::exp(m[r] - mn);
        for (float* x = o + r * dp; x < o + (r + 1) * dp; ++x) *x *= alpha;
        l[r] *= alpha;
        m[r] = mn;
      }
      l[r] += float(vmath::exp_affine(sr, sr, cnt, mn, 1.0f, 0.0f, 1.0f, 0.0f));
    }
    tile::gemm(rows, dp, nkp, s, kKeyTile, 1, kv.v.data() + j0 * dp, dp, o, dp, true);  // o += p v
  }
  for (int64_t r = 0; r < rows; ++r) {
    // A row with no visible key: zeros, and lse -inf.
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    for (float* x = o + r * dp; x < o + (r + 1) * dp; ++x) *x *= inv;
    lse[r] = l[r] > 0.0f ? m[r] + std::log(l[r]) : kNegInf;
  }
}

void cpu_flash_attention(Tensor* t, ThreadPool& pool) {
  const Dims d = dims_of(t);
  const Tensor *q = t->src[0], *k = t->src[1], *v = t->src[2];
  float* lse = static_cast<float*>(t->aux[kAuxLse]->data);
  const int64_t qtiles = (d.Tq + kQueryTile - 1) / kQueryTile, group = d.H / d.KV, dp = d.dp();
  pool.parallel_for(d.B * d.H * qtiles, [&](int64_t begin, int64_t end) {
    KvHead kv;
    std::vector<float> qs(size_t(kQueryTile * dp)), o(size_t(kQueryTile * dp)),
        s(size_t(kQueryTile * kKeyTile));
    for (int64_t task = begin; task < end; ++task) {
      const int64_t qt = task % qtiles, h = task / qtiles % d.H, b = task / qtiles / d.H;
      const int64_t g = h / group, i0 = qt * kQueryTile, rows = std::min(kQueryTile, d.Tq - i0);
      if (kv.loaded != b * d.KV + g) kv.load(d, k, v, b, g, false);
      load_rows(q, b, i0, rows, h, d.scale, qs.data(), dp);
      forward_tile(d, kv, qs.data(), i0, rows, o.data(), lse + (b * d.H + h) * d.Tq + i0, s.data());
      store_rows(t, b, i0, rows, h, o.data(), dp);
    }
  });
}

// Per-task scratch of the backward: one query tile's rows ([kQueryTile, dp]) and score-sized tiles
// ([kQueryTile, kKeyTile]); dk, dv of the task's kv head ([tkp, dp]).
struct BackScratch {
  std::vector<float> qs, dout, o, dq, s, dpr, p, ds, dk, dv;
  float rowdot[kQueryTile], lse[kQueryTile];
  explicit BackScratch(const Dims& d)
      : qs(size_t(kQueryTile * d.dp())),
        dout(qs.size()),
        o(qs.size()),
        dq(qs.size()),
        s(size_t(kQueryTile * kKeyTile)),
        dpr(s.size()),
        p(s.size()),
        ds(s.size()),
        dk(size_t(d.tkp() * d.dp())),
        dv(dk.size()) {}
};

// One query tile of head h against every key it sees: dq of its rows into sc.dq (unscaled), and its share of
// dk, dv added into sc.dk, sc.dv. With q pre-scaled, ds_ij = p_ij (dp_ij − D_i) gives dk_j = Σ_i ds_ij (scale
// q_i) directly, and dq_i = scale Σ_j ds_ij k_j once the caller scales.
void backward_tile(const Dims& d, const KvHead& kv, int64_t i0, int64_t rows, BackScratch& sc) {
  const int64_t dp = d.dp(), tkp = d.tkp(), n_max = d.visible(i0 + rows - 1);
  std::fill(sc.dq.begin(), sc.dq.begin() + rows * dp, 0.0f);
  for (int64_t j0 = 0; j0 < n_max; j0 += kKeyTile) {
    const int64_t nk = std::min(kKeyTile, n_max - j0), nkp = padded(nk);
    tile::gemm(rows, nkp, dp, sc.qs.data(), dp, 1, kv.kt.data() + j0, tkp, sc.s.data(), kKeyTile, false);
    tile::gemm(rows, nkp, dp, sc.dout.data(), dp, 1, kv.vt.data() + j0, tkp, sc.dpr.data(), kKeyTile, false);
    for (int64_t r = 0; r < rows; ++r) {
      float *pr = sc.p.data() + r * kKeyTile, *dsr = sc.ds.data() + r * kKeyTile;
      const float* dpr = sc.dpr.data() + r * kKeyTile;
      const int64_t cnt = sc.lse[r] == kNegInf ? 0 : std::clamp<int64_t>(d.visible(i0 + r) - j0, 0, nk);
      vmath::exp_affine(sc.s.data() + r * kKeyTile, pr, cnt, 0.0f, 1.0f, sc.lse[r], 1.0f, 0.0f);
      for (int64_t j = 0; j < cnt; ++j) dsr[j] = pr[j] * (dpr[j] - sc.rowdot[r]);
      std::fill(pr + cnt, pr + nkp, 0.0f);
      std::fill(dsr + cnt, dsr + nkp, 0.0f);
    }
    const float* ds = sc.ds.data();
    tile::gemm(rows, dp, nkp, ds, kKeyTile, 1, kv.k.data() + j0 * dp, dp, sc.dq.data(), dp, true);
    tile::gemm(nkp, dp, rows, ds, 1, kKeyTile, sc.qs.data(), dp, sc.dk.data() + j0 * dp, dp, true);
    tile::gemm(nkp, dp, rows, sc.p.data(), 1, kKeyTile, sc.dout.data(), dp, sc.dv.data() + j0 * dp, dp, true);
  }
  for (float* x = sc.dq.data(); x < sc.dq.data() + rows * dp; ++x) *x *= d.scale;
}

// src = q, k, v, o, do, lse; the node is dq, aux dk and dv.
//   p_ij = exp(s_ij − lse_i), dp_ij = do_i · v_j, D_i = do_i · o_i, ds_ij = p_ij (dp_ij − D_i)
//   dq_i = scale Σ_j ds_ij k_j, dk_j = scale Σ_i ds_ij q_i, dv_j = Σ_i p_ij do_i
void cpu_flash_attention_back(Tensor* t, ThreadPool& pool) {
  const Dims d = dims_of(t);
  const Tensor *q = t->src[0], *k = t->src[1], *v = t->src[2], *o = t->src[3], *dout = t->src[4];
  const float* lse = static_cast<const float*>(t->src[5]->data);
  const Tensor *dk = t->aux[kAuxDk], *dv = t->aux[kAuxDv];
  const int64_t group = d.H / d.KV, dp = d.dp();
  pool.parallel_for(d.B * d.KV, [&](int64_t begin, int64_t end) {
    KvHead kv;
    BackScratch sc(d);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t g = task % d.KV, b = task / d.KV;
      kv.load(d, k, v, b, g, true);
      std::fill(sc.dk.begin(), sc.dk.end(), 0.0f);
      std::fill(sc.dv.begin(), sc.dv.end(), 0.0f);
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        for (int64_t i0 = 0; i0 < d.Tq; i0 += kQueryTile) {
          const int64_t rows = std::min(kQueryTile, d.Tq - i0);
          load_rows(q, b, i0, rows, h, d.scale, sc.qs.data(), dp);
          load_rows(dout, b, i0, rows, h, 1.0f, sc.dout.data(), dp);
          load_rows(o, b, i0, rows, h, 1.0f, sc.o.data(), dp);
          for (int64_t r = 0; r < rows; ++r) {
            sc.rowdot[r] = vmath::dot(sc.dout.data() + r * dp, sc.o.data() + r * dp, d.D);
            sc.lse[r] = lse[(b * d.H + h) * d.Tq + i0 + r];
          }
          backward_tile(d, kv, i0, rows, sc);
          store_rows(t, b, i0, rows, h, sc.dq.data(), dp);
        }
      }
      store_rows(dk, b, 0, d.Tk, g, sc.dk.data(), dp);
      store_rows(dv, b, 0, d.Tk, g, sc.dv.data(), dp);
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
