// Device and host helpers shared by the distillation row kernels (distill_rows.cu: top-K; distill_full.cu:
// full vocabulary): side-data access, two-temperature online softmax statistics, the divergence term, the
// dense gradient, launch helpers. The math is row_kernels.h's contract; see distill_rows.h.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "../../core/error.h"
#include "../cuda_common.cuh"
#include "distill_rows.h"
#include "row_common.cuh"

namespace retort::cuda::distk {

using rowk::dispatch;
using rowk::grad_vec_ok;
using rowk::grid_for;
using rowk::vec_ok;
using rowk::vec_rows_ok;
constexpr int kThreads = 512;
constexpr float kLog2e = rowk::kLog2e;

// Device helpers.

__device__ __forceinline__ const char* side_at(const SideMatrix& s, int64_t r, int64_t c) {
  return static_cast<const char*>(s.data) + r * s.row_stride + c * s.col_stride;
}

__device__ __forceinline__ bool nonzero(const char* p, DType t) {
  return (t == DType::I32 || t == DType::I64) ? load_i(p, t) != 0 : load_f(p, t) != 0.0f;
}

struct RowLabel {
  long long y;   // the label; -1 without labels
  bool ignored;  // ignore_index, or out of range (then reported)
};

// Uniform across the block (or the warp, for a warp per row): every thread reads the same label, and the
// `reporter` thread records a bad one.
__device__ __forceinline__ RowLabel row_label(const SideMatrix& labels, int64_t r, int64_t ignore, int64_t v,
                                              const ErrorSink& err, bool reporter = threadIdx.x == 0) {
  if (!labels.data) return {-1, false};
  const long long y = load_i(side_at(labels, r, 0), labels.dtype);
  if (y == ignore) return {y, true};
  if (y < 0 || y >= v) {
    if (reporter && err.record) report_error(err.record, err.op, kErrLabelOutOfRange, y, v);
    return {y, true};
  }
  return {y, false};
}

// Online softmax statistics of values z at two temperatures: m = max z, s1 = Σ exp(z − m),
// st = Σ exp((z − m)/T). kt = log2(e)/T. The max is kept in z units so that (z − m) is formed before the
// division by T: logits of 1e4 keep their precision.
struct Stats2 {
  float m, s1, st;
};

__device__ __forceinline__ Stats2 stats_empty() {
  return {-INFINITY, 0.0f, 0.0f};
}

template <int N>
__device__ __forceinline__ void stats_add(Stats2& a, const float* x, float kt, bool both) {
  float mx = a.m;
#pragma unroll
  for (int i = 0; i < N; ++i) mx = fmaxf(mx, x[i]);
  if (mx == -INFINITY) return;  // nothing but -inf so far (and -inf - -inf would be NaN)
  if (mx != a.m) {
    const float d = a.m - mx;  // -inf the first time: the sums are 0 and stay 0
    a.st *= rowk::fast_exp2(d * kt);
    if (both) a.s1 *= rowk::fast_exp2(d * kLog2e);
    a.m = mx;
  }
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const float d = x[i] - mx;
    a.st += rowk::fast_exp2(d * kt);
    if (both) a.s1 += rowk::fast_exp2(d * kLog2e);
  }
}

__device__ __forceinline__ Stats2 stats_merge(const Stats2& a, const Stats2& b, float kt) {
  const float mx = fmaxf(a.m, b.m);
  if (mx == -INFINITY) return stats_empty();
  const float da = a.m - mx, db = b.m - mx;  // -inf for an empty side, whose sums are 0
  return {mx, a.s1 * exp2f(da * kLog2e) + b.s1 * exp2f(db * kLog2e),
          a.st * exp2f(da * kt) + b.st * exp2f(db * kt)};
}

// Warp-wide merge (a butterfly: every lane ends with the same bits).
__device__ __forceinline__ Stats2 warp_stats(Stats2 v, float kt) {
  for (int o = 16; o > 0; o >>= 1) {
    const Stats2 w{__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s1, o),
                   __shfl_xor_sync(0xffffffffu, v.st, o)};
    v = stats_merge(v, w, kt);
  }
  return v;
}

// Block-wide merge (blockDim.x a multiple of 32); every thread gets the result. sh holds 32 entries.
__device__ __forceinline__ Stats2 block_stats(Stats2 v, float kt, Stats2* sh) {
  for (int o = 16; o > 0; o >>= 1) {
    const Stats2 w{__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s1, o),
                   __shfl_xor_sync(0xffffffffu, v.st, o)};
    v = stats_merge(v, w, kt);
  }
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  __syncthreads();  // earlier readers of sh are done
  if (lane == 0) sh[w] = v;
  __syncthreads();
  if (w == 0) {
    Stats2 x = lane < nw ? sh[lane] : stats_empty();
    for (int o = 16; o > 0; o >>= 1) {
      const Stats2 y{__shfl_xor_sync(0xffffffffu, x.m, o), __shfl_xor_sync(0xffffffffu, x.s1, o),
                     __shfl_xor_sync(0xffffffffu, x.st, o)};
      x = stats_merge(x, y, kt);
    }
    if (lane == 0) sh[0] = x;
  }
  __syncthreads();
  return sh[0];
}

// The pass-1 functor for rowk::for_row.
struct StatsAcc {
  Stats2 st;
  float kt;
  bool both;
  template <int N>
  __device__ __forceinline__ void apply(int64_t, float* x) {
    stats_add<N>(st, x, kt, both);
  }
};

__device__ __forceinline__ float logaddexp_dev(float a, float b) {
  const float hi = fmaxf(a, b), lo = fminf(a, b);
  if (hi == -INFINITY) return -INFINITY;
  return hi + log1pf(expf(lo - hi));
}

// One divergence term (row_kernels.h's table) between teacher log p and student log q (a slot, or a
// vocabulary entry): adds it to d and returns dD/d(log q). Zero-weight terms are skipped so 0·log 0 never
// makes a NaN. (row_kernels.cpp's divergence_term, term for term.)
__device__ __forceinline__ float div_term(const loss::DivergenceSpec& dv, float lp, float lq, double& d) {
  const float p = expf(lp), q = expf(lq);
  switch (dv.kind) {
    case Divergence::Kl:
      break;
    case Divergence::Tvd:
      d += 0.5 * fabs(double(p) - double(q));
      return q > p ? 0.5f * q : q < p ? -0.5f * q : 0.0f;
    case Divergence::SkewKl: {
      if (!(p > 0.0f)) return 0.0f;
      const float a = dv.alpha, lm = logaddexp_dev(logf(a) + lp, log1pf(-a) + lq);
      d += double(p) * (lp - lm);
      return -(1.0f - a) * p * expf(lq - lm);
    }
    case Divergence::SkewReverseKl: {
      if (!(q > 0.0f)) return 0.0f;
      const float a = dv.alpha, lm = logaddexp_dev(log1pf(-a) + lp, logf(a) + lq);
      d += double(q) * (lq - lm);
      return q * (lq - lm + 1.0f - a * expf(lq - lm));
    }
  }
  const float beta = dv.beta;
  if (beta == 0.0f) {
    if (p > 0.0f) d += double(p) * (lp - lq);
    return -p;
  }
  if (beta == 1.0f) {
    if (q > 0.0f) {
      d += double(q) * (lq - lp);
      return q * (lq - lp + 1.0f);
    }
    return 0.0f;
  }
  const float lm = logaddexp_dev(logf(beta) + lp, log1pf(-beta) + lq);
  double t = 0.0;
  if (p > 0.0f) t += double(beta) * p * (lp - lm);
  float g = 0.0f;
  if (q > 0.0f) {
    const float u = q * (lq - lm);
    t += double(1.0f - beta) * u;
    g = (1.0f - beta) * u;
  }
  d += t;
  return g;
}

// The dense part of a distillation gradient at one logit z: a_soft·exp((z − m)/T − log st) (the softmax term
// of the soft loss) + a_hard·exp((z − m) − log s1) (the hard loss's softmax). The slot fixup calls this on
// the saved student logit and gets the same bits as the dense pass did.
struct Dense {
  float m, kt, lst2, ls12, a_soft, a_hard;  // lst2 = log(st)·log2(e), ls12 = log(s1)·log2(e)
  __device__ __forceinline__ float at(float z) const {
    const float d = z - m;
    float g = 0.0f;
    if (a_soft != 0.0f) g = a_soft * rowk::fast_exp2(fmaf(d, kt, -lst2));
    if (a_hard != 0.0f) g = fmaf(a_hard, rowk::fast_exp2(fmaf(d, kLog2e, -ls12)), g);
    return g;
  }
};

// The dense gradient pass of top-K distillation for rowk::for_row: Dense at every column, minus ch at the
// label column y (y < 0: none).
template <typename G>
struct DenseGrad {
  G* out;
  Dense c;
  long long y;
  float ch;
  template <int N>
  __device__ __forceinline__ void apply(int64_t j0, float* z) {
    float g[8];
#pragma unroll
    for (int i = 0; i < N; ++i) g[i] = c.at(z[i]);
    if (y >= j0 && y < j0 + N) {
#pragma unroll
      for (int i = 0; i < N; ++i)
        if (j0 + i == y) g[i] -= ch;
    }
    if constexpr (N == 8) {
      rowk::store8(out + j0, g);
    } else {
      out[j0] = rowk::from_f<G>(g[0]);
    }
  }
};

template <typename G>
__device__ __forceinline__ void zero_row(G* out, int64_t v) {
  for (int64_t j = threadIdx.x; j < v; j += blockDim.x) out[j] = rowk::from_f<G>(0.0f);
}

__device__ __forceinline__ void write_row_outputs(const RowBlock& b, float* hard_out, float* soft_out,
                                                  int64_t r, float loss, float hard, float soft) {
  if (b.loss) b.loss[r] = loss;
  if (hard_out) hard_out[r] = hard;
  if (soft_out) soft_out[r] = soft;
}

__device__ __forceinline__ float grad_scale(const RowBlock& b) {
  return b.scale_dev ? b.scale * *b.scale_dev : b.scale;
}

// Sorts keys[0, n) ascending (n a power of two) with every thread of the block; ends with a barrier.
__device__ inline void bitonic_sort(unsigned long long* keys, int64_t n) {
  for (int64_t size = 2; size <= n; size <<= 1)
    for (int64_t stride = size >> 1; stride > 0; stride >>= 1) {
      for (int64_t t = threadIdx.x; t < n / 2; t += blockDim.x) {
        const int64_t lo = 2 * t - (t & (stride - 1)), hi = lo + stride;  // lo has the stride bit clear
        const bool up = (lo & size) == 0;
        const unsigned long long a = keys[lo], c = keys[hi];
        if ((a > c) == up) {
          keys[lo] = c;
          keys[hi] = a;
        }
      }
      __syncthreads();
    }
}

// Host helpers.

inline void check_common(const RowBlock& b, const SideMatrix& labels, const loss::DivergenceSpec& dv,
                         float temp, float w_hard, float w_soft, const char* op) {
  const float beta = dv.beta;
  RT_CHECK(b.rows >= 0 && b.V >= 1 && b.V < (int64_t(1) << 31) && (b.rows <= 1 || b.stride >= b.V), op,
           ": bad row block (rows ", b.rows, ", V ", b.V, ", stride ", b.stride, ")");
  RT_CHECK(!b.grad || b.rows <= 1 || b.grad_stride >= b.V, op, ": gradient row stride ", b.grad_stride,
           " < V ", b.V);
  RT_CHECK(std::isfinite(temp) && temp > 0.0f, op, ": temperature must be a finite number > 0, got ", temp);
  RT_CHECK(beta >= 0.0f && beta <= 1.0f, op, ": beta must be in [0, 1], got ", beta);
  RT_CHECK(dv.alpha >= 0.0f && dv.alpha <= 1.0f, op, ": skew_alpha must be in [0, 1], got ", dv.alpha);
  RT_CHECK(std::isfinite(w_hard) && w_hard >= 0.0f && std::isfinite(w_soft) && w_soft >= 0.0f, op,
           ": weights must be finite and >= 0, got w_hard ", w_hard, ", w_soft ", w_soft);
  RT_CHECK(!labels.data || is_int(labels.dtype), op, ": labels must be i32 or i64, got ",
           dtype_name(labels.dtype));
  RT_CHECK(w_hard == 0.0f || labels.data, op, ": w_hard = ", w_hard, " needs labels");
}

}  // namespace retort::cuda::distk
