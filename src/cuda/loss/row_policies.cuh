// What the row-loss kernels of row_losses.cu (cross-entropy and entropy through the row drivers) and
// selective_rows.cu (selective log-softmax, row counts) share: the two-pass launch shape, the gradient scale,
// the row-block check, and the loss policies the row drivers run (see row_losses.cu for the policy
// contract); the selective kernel reuses cross-entropy's online-softmax accumulator.
#pragma once
#include <cstdint>

#include "../../core/error.h"
#include "row_common.cuh"
#include "row_losses.h"

namespace retort::cuda::rowloss {

using namespace rowk;

constexpr int kThreads = 512;
constexpr int kUnroll = 4;

__device__ __forceinline__ float grad_scale(const RowBlock& b) {
  return b.scale_dev ? b.scale * *b.scale_dev : b.scale;
}

inline void check_block(const RowBlock& b, const char* op) {
  RT_CHECK(b.rows >= 0 && b.V >= 1 && b.stride >= b.V, op, ": bad row block (rows ", b.rows, ", V ", b.V,
           ", stride ", b.stride, ")");
  RT_CHECK(!b.grad || b.grad_stride >= b.V, op, ": gradient row stride ", b.grad_stride, " < V ", b.V);
}

// Cross-entropy.

struct CePolicy {
  CrossEntropyRows o;
  float inv_cap;
  int* err;
  int64_t label;
  bool valid;
  float inv_v;
  float zy;                             // the (softcapped) logit at the label, thread 0 only (see begin_row)
  int64_t pf_row = -1, pf_label = 0;    // a label loaded ahead of its row (cluster kernel: during pass 2)
  float pf_coef = 0.0f, coef_r = 0.0f;  // o.row_coef at pf_row and at this row

  // Pass 1 without a running maximum (the cluster kernel): no transform, no extra sum.
  __device__ __forceinline__ bool plain_sum() const { return o.softcap == 0.0f && o.label_smoothing == 0.0f; }
  __device__ __forceinline__ void prefetch(const RowBlock&, int64_t r) {
    pf_label = load_index(o.labels, o.label_dtype == DType::I64, r);
    if (o.row_coef) pf_coef = o.row_coef[r];
    pf_row = r;
  }

  __device__ __forceinline__ float xf(float z) const {
    return o.softcap > 0.0f ? o.softcap * tanhf(z * inv_cap) : z;
  }
  // The image of the raw maximum under the pass-1 transform (the same operations as Acc::apply).
  __device__ __forceinline__ float transform_max(float m) const { return xf(m); }

  // Thread 0 reads z at the label here, before the barrier that precedes any gradient store: the gradient may
  // overwrite the logits in place, and another thread (or, on the cluster path, another CTA) may store the
  // label column's gradient before thread 0 gets to finish().
  template <typename T>
  __device__ __forceinline__ void begin_row(const RowBlock& b, int64_t r, const T* row) {
    inv_v = 1.0f / float(b.V);
    label = pf_row == r ? pf_label : load_index(o.labels, o.label_dtype == DType::I64, r);
    if (o.row_coef) coef_r = pf_row == r ? pf_coef : o.row_coef[r];
    valid = label != o.ignore_index;
    if (valid && (label < 0 || label >= b.V)) {
      if (threadIdx.x == 0 && err) atomicCAS(err, 0, int(r) + 1);
      valid = false;
    }
    zy = valid && threadIdx.x == 0 ? xf(to_f<T>(row[label])) : 0.0f;
  }

  struct Acc {
    Online on;
    float sumx = 0.0f, cap = 0.0f, inv_cap = 0.0f;
    float hi = INFINITY;  // softcapped values above this are clamped to it (see start_at)
    bool smooth = false;
    template <int N>
    __device__ __forceinline__ void apply(int64_t, float* x) {
      if (cap > 0.0f) {
#pragma unroll
        for (int i = 0; i < N; ++i) {
          const float y = cap * tanhf(x[i] * inv_cap);
          x[i] = y > hi ? hi : y;  // NaN stays NaN
        }
      }
      on.add<N, false>(x);
      if (smooth) {
#pragma unroll
        for (int i = 0; i < N; ++i) sumx += x[i];
      }
    }
  };
  __device__ __forceinline__ Acc acc() const {
    Acc a;
    a.cap = o.softcap;
    a.inv_cap = inv_cap;
    a.smooth = o.label_smoothing > 0.0f;
    return a;
  }
  // Starts a pass-1 accumulator at the segment's transformed maximum mt. tanhf need not be exactly monotone
  // in floating point: a softcapped value an ulp above mt would be taken as mt, so the running max never
  // moves (the gradient pass uses the value as computed).
  __device__ __forceinline__ static void start_at(Acc& a, float mt) {
    a.on.m = mt;
    a.hi = mt;
  }
  __device__ __forceinline__ static void fold(const Acc& a, Online& on, float& aux) {
    on = a.on;
    aux = a.sumx;
  }

  template <typename T>
  __device__ __forceinline__ void finish(const RowBlock& b, int64_t r, const T*, const Online& on,
                                         float sumx) const {
    const float lse = on.lse(), eps = o.label_smoothing;
    float loss = 0.0f;
    if (valid) {
      // (m - z_y) + log s, not lse - z_y: the large max cancels before the small log-sum is added.
      loss = (1.0f - eps) * ((on.m - zy) + logf(on.s)) +
             (eps > 0.0f ? eps * (lse - sumx / float(b.V)) : 0.0f) + o.z_loss * lse * lse;
    }
    if (b.loss) b.loss[r] = loss;
    if (b.lse) b.lse[r] = lse;
  }

  template <typename G>
  struct Grad {
    G* out;
    float lse2, scale, cap, inv_cap, coef, offset, hit;
    int label;  // relative to out; -1 when the label column is not in [out, out + n)
    template <int N>
    __device__ __forceinline__ void apply(int j0, float* z) {
      float g[8];
      if (cap > 0.0f) {
#pragma unroll
        for (int i = 0; i < N; ++i) {
          float th = tanhf(z[i] * inv_cap);
          float p = fast_exp2(fmaf(cap * th, kLog2e, -lse2));
          g[i] = fmaf(p, coef, -offset) * (1.0f - th * th);
        }
      } else {
#pragma unroll
        for (int i = 0; i < N; ++i) g[i] = fmaf(fast_exp2(fmaf(z[i], kLog2e, -lse2)), coef, -offset);
      }
      // The label column: one range test per vector, the unrolled compare only when it is inside.
      if (unsigned(label - j0) < unsigned(N)) {
#pragma unroll
        for (int i = 0; i < N; ++i)
          if (j0 + i == label) {
            float d = 1.0f;
            if (cap > 0.0f) {
              float th = tanhf(z[i] * inv_cap);
              d = 1.0f - th * th;
            }
            g[i] -= hit * d;
          }
      }
      if constexpr (N == 8) {
        store8(out + j0, g);
      } else {
        out[j0] = from_f<G>(g[0]);
      }
    }
  };
  // out is column c0 of the row, and the functor sees columns [c0, c0 + n) as 0, 1, ...
  template <typename G>
  __device__ __forceinline__ Grad<G> grad(G* out, const Online& on, float, float scale, int64_t c0 = 0,
                                          int64_t n = INT64_MAX) const {
    const float lse = on.lse();
    // An ignored row gets a zero gradient: scale 0 (the softmax of a finite row is finite).
    const float sc = valid ? scale : 0.0f;
    // g = scale·(p·(1 + 2·z_loss·lse) − eps/V − (1 − eps)·[j = label]), times the softcap derivative.
    return Grad<G>{out,
                   lse * kLog2e,
                   sc,
                   o.softcap,
                   inv_cap,
                   o.row_coef ? sc * coef_r : sc * (1.0f + 2.0f * o.z_loss * lse),
                   sc * o.label_smoothing * inv_v,
                   sc * (1.0f - o.label_smoothing) * o.hit_weight,
                   valid && label >= c0 && label - c0 < n ? int(label - c0) : -1};
  }
};

// Entropy.

struct EntropyPolicy {
  float inv_t;
  __device__ __forceinline__ float transform_max(float m) const {
    return __fmul_rn(m, inv_t);  // inv_t > 0 and rounding to nearest: monotone
  }
  template <typename T>
  __device__ __forceinline__ void begin_row(const RowBlock&, int64_t, const T*) {}
  __device__ __forceinline__ static bool plain_sum() { return false; }
  __device__ __forceinline__ static void prefetch(const RowBlock&, int64_t) {}
  struct Acc {
    Online on;
    float inv_t;
    template <int N>
    __device__ __forceinline__ void apply(int64_t, float* x) {
      // __fmul_rn: never fused into a later subtraction, so the gradient pass below sees the same x = z / T.
#pragma unroll
      for (int i = 0; i < N; ++i) x[i] = __fmul_rn(x[i], inv_t);
      on.add<N, true>(x);
    }
  };
  __device__ __forceinline__ Acc acc() const {
    return Acc{Online{}, inv_t};
  }
  __device__ __forceinline__ static void start_at(Acc& a, float mt) {
    a.on.m = mt;
  }
  __device__ __forceinline__ static void fold(const Acc& a, Online& on, float& aux) {
    on = a.on;
    aux = 0.0f;
  }
  // H = lse - E_p[x] with x = z / T; Online keeps t relative to its max, so H = log s - t / s.
  __device__ __forceinline__ static float entropy(const Online& on) {
    return logf(on.s) - on.t / on.s;
  }
  template <typename T>
  __device__ __forceinline__ void finish(const RowBlock& b, int64_t r, const T*, const Online& on,
                                         float) const {
    if (b.loss) b.loss[r] = entropy(on);
    if (b.lse) b.lse[r] = on.lse();
  }
  template <typename G>
  struct Grad {
    G* out;
    float m, log_s, h, inv_t, coef;
    template <int N>
    __device__ __forceinline__ void apply(int64_t j0, float* z) {
      float g[8];
#pragma unroll
      for (int i = 0; i < N; ++i) {
        // log p, shifted by the max before the log-sum is taken off: large logits keep their precision.
        float lp = (__fmul_rn(z[i], inv_t) - m) - log_s;
        float p = fast_exp2(lp * kLog2e);
        g[i] = p > 0.0f ? -p * (lp + h) * coef : 0.0f;  // dH/dz = -(1/T) p (log p + H); 0 at z = -inf
      }
      if constexpr (N == 8) {
        store8(out + j0, g);
      } else {
        out[j0] = from_f<G>(g[0]);
      }
    }
  };
  template <typename G>
  __device__ __forceinline__ Grad<G> grad(G* out, const Online& on, float, float scale, int64_t = 0,
                                          int64_t = 0) const {
    return Grad<G>{out, on.m, logf(on.s), entropy(on), inv_t, inv_t * scale};
  }
};

}  // namespace retort::cuda::rowloss
