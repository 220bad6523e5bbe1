// Top-K and full-vocabulary distillation row kernels (see distill_rows.h; the math is row_kernels.h's).
//
// One CTA per row, rows visited grid-stride. Top-K: the K slots go to shared memory first (validity, id,
// student logit at the id, teacher log p), then one online pass over the vocabulary gives the student's
// normalizers (at T, and at 1 for the hard loss when T != 1), and block reductions over the slots give the
// slot normalizers, the teacher renormalization and the divergence. The gradient is a dense pass over the row
// (the softmax terms and the hard loss) and, after a barrier, a fixup of the K slot columns. Slots that share
// an id are made adjacent by a bitonic sort of (id, slot) keys in shared memory; the first of each run owns
// the column and writes it once, recomputing the dense value there from the saved student logit (so a bf16
// gradient is rounded once) and adding the slots' terms in slot order: deterministic, no atomics.
//
// Full vocabulary: one online pass over the student and teacher rows for the normalizers, one pass for the
// divergence (which also writes the gradient for forward KL, whose gradient needs no row-wide sum), and for
// reverse KL and JSD one more pass for the gradient. Math in f32, divergence sums in double like the CPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "../../core/error.h"
#include "../cuda_common.cuh"
#include "distill_rows.h"
#include "row_common.cuh"

namespace retort::cuda {

namespace {

constexpr int kThreads = 512;
constexpr float kLog2e = rowk::kLog2e;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) RT_FAIL("cuda: ", what, " failed: ", cudaGetErrorString(e));
}

// ---- device helpers ---------------------------------------------------------------------------------------

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

// Uniform across the block: every thread reads the same label.
__device__ __forceinline__ RowLabel row_label(const SideMatrix& labels, int64_t r, int64_t ignore, int64_t v,
                                              const ErrorSink& err) {
  if (!labels.data) return {-1, false};
  const long long y = load_i(side_at(labels, r, 0), labels.dtype);
  if (y == ignore) return {y, true};
  if (y < 0 || y >= v) {
    if (threadIdx.x == 0 && err.record) report_error(err.record, err.op, kErrLabelOutOfRange, y, v);
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

// One divergence term between teacher log p and student log q (a slot, or a vocabulary entry): adds it to d
// and returns dD/d(log q). beta = 0 forward KL(P‖Q), 1 reverse KL(Q‖P), otherwise the generalized JSD with
// M = beta·P + (1 − beta)·Q. Zero-weight terms are skipped so 0·log 0 never makes a NaN. (row_kernels.cpp's
// divergence_term, term for term.)
__device__ __forceinline__ float div_term(float beta, float lp, float lq, double& d) {
  const float p = expf(lp), q = expf(lq);
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
__device__ void bitonic_sort(unsigned long long* keys, int64_t n) {
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

// ---- top-K distillation -----------------------------------------------------------------------------------

struct TopKFlags {
  bool gathered;   // no ids: slot k is column k
  bool normalize;  // Q over the valid slots
  bool hard_on;    // labels and w_hard != 0
  bool want_hard;  // labels and (hard_on or the hard part is asked for)
  bool sort;       // the gradient's slot fixup needs the duplicate-id sort
  int64_t pow2;    // sort length: the power of two >= K
};

constexpr unsigned long long kNoKey = ~0ull;  // padding slots sort last

template <typename T, typename G>
__global__ void __launch_bounds__(kThreads)
    topk_kernel(RowBlock b, TopKRows o, ErrorSink err, TopKFlags f, bool vec, bool gvec) {
  extern __shared__ unsigned long long dyn_smem[];
  unsigned long long* keys = dyn_smem;                                     // [pow2] (id << 32 | slot)
  float* xs = reinterpret_cast<float*>(dyn_smem + (f.sort ? f.pow2 : 0));  // [K] student logit at the slot
  float* lp = xs + o.K;                                                    // [K] teacher log p
  float* lq = lp + o.K;                                                    // [K] student log q
  int* sid = reinterpret_cast<int*>(lq + o.K);                             // [K] id of a valid slot, else -1
  __shared__ Stats2 ssh[32];
  __shared__ float fsh[32];
  __shared__ double dsh[32];

  const int64_t v = b.V, kk = o.K;
  const float temp = o.temperature, inv_t = 1.0f / temp, kt = inv_t * kLog2e, beta = o.beta;
  const bool want_grad = b.grad != nullptr;
  for (int64_t r = blockIdx.x; r < b.rows; r += gridDim.x) {
    const T* row = static_cast<const T*>(b.logits) + r * b.stride;
    G* grow = want_grad ? static_cast<G*>(b.grad) + r * b.grad_stride : nullptr;
    const RowLabel lab = row_label(o.labels, r, o.ignore_index, v, err);
    const bool ignored = lab.ignored;
    // Read before any gradient store: the gradient may alias the logits.
    const float zy = f.want_hard && !ignored ? rowk::to_f<T>(row[lab.y]) : 0.0f;

    // Slots. Ids are checked on every row, ignored ones too (the CPU checks them all).
    float cnt = 0.0f;
    for (int64_t k = threadIdx.x; k < kk; k += blockDim.x) {
      const float l = load_f(side_at(o.logprobs, r, k), o.logprobs.dtype);
      bool valid = l != -INFINITY && (!o.mask.data || nonzero(side_at(o.mask, r, k), o.mask.dtype));
      long long id = k;
      if (valid && !f.gathered) {
        id = load_i(side_at(o.ids, r, k), o.ids.dtype);
        if (id < 0 || id >= v) {
          if (err.record) report_error(err.record, err.op, kErrIdOutOfRange, id, v);
          valid = false;
        }
      }
      sid[k] = valid ? int(id) : -1;
      lp[k] = l;
      xs[k] = valid ? rowk::to_f<T>(row[id]) : 0.0f;
      cnt += valid ? 1.0f : 0.0f;
    }
    const float n = block_reduce(cnt, SumOp{}, 0.0f, fsh);  // its barriers publish the slot arrays

    // The student's full-vocabulary statistics: for Q over V, the hard loss and the lse.
    const bool full = !f.gathered && (!f.normalize || (f.want_hard && !ignored) || b.lse);
    const bool both = full && f.want_hard && !ignored && temp != 1.0f;
    Stats2 st = stats_empty();
    if (full) {
      StatsAcc acc{stats_empty(), kt, both};
      rowk::for_row<4>(row, v, vec, acc);
      st = block_stats(acc.st, kt, ssh);
    }
    const float log_st = logf(st.st), log_s1 = both ? logf(st.s1) : log_st;

    // The slot normalizer of normalize_topk (and of the gathered lse).
    float ms = -INFINITY, ls = -INFINITY;
    if (f.normalize && (!ignored || (f.gathered && b.lse))) {
      float mx = -INFINITY;
      for (int64_t k = threadIdx.x; k < kk; k += blockDim.x)
        if (sid[k] >= 0) mx = fmaxf(mx, xs[k]);
      ms = block_reduce(mx, MaxOp{}, -INFINITY, fsh);
      float se = 0.0f;
      for (int64_t k = threadIdx.x; k < kk; k += blockDim.x)
        if (sid[k] >= 0) se += expf((xs[k] - ms) * inv_t);
      ls = logf(block_reduce(se, SumOp{}, 0.0f, fsh));
    }
    if (threadIdx.x == 0 && b.lse)
      b.lse[r] = f.gathered ? (n > 0.0f ? ms * inv_t + ls : 0.0f) : st.m * inv_t + log_st;
    if (ignored) {
      if (threadIdx.x == 0) write_row_outputs(b, o.hard, o.soft, r, 0.0f, 0.0f, 0.0f);
      if (want_grad) zero_row(grow, v);
      __syncthreads();  // the slot arrays are rewritten by the next row
      continue;
    }

    // Student log q and teacher log p per valid slot (each thread its own slots: no barrier needed).
    for (int64_t k = threadIdx.x; k < kk; k += blockDim.x)
      if (sid[k] >= 0) lq[k] = f.normalize ? (xs[k] - ms) * inv_t - ls : (xs[k] - st.m) * inv_t - log_st;
    if (temp != 1.0f && n > 0.0f) {  // the teacher's top-K renormalized at temperature T
      float mx = -INFINITY;
      for (int64_t k = threadIdx.x; k < kk; k += blockDim.x)
        if (sid[k] >= 0) mx = fmaxf(mx, lp[k]);
      const float mu = block_reduce(mx, MaxOp{}, -INFINITY, fsh);
      float se = 0.0f;
      for (int64_t k = threadIdx.x; k < kk; k += blockDim.x)
        if (sid[k] >= 0) se += expf((lp[k] - mu) * inv_t);
      const float lsp = logf(block_reduce(se, SumOp{}, 0.0f, fsh));
      for (int64_t k = threadIdx.x; k < kk; k += blockDim.x)
        if (sid[k] >= 0) lp[k] = (lp[k] - mu) * inv_t - lsp;
    }
    double dpart = 0.0, gpart = 0.0;
    for (int64_t k = threadIdx.x; k < kk; k += blockDim.x)
      if (sid[k] >= 0) gpart += div_term(beta, lp[k], lq[k], dpart);
    const double dsum = block_reduce(dpart, SumOp{}, 0.0, dsh);
    const double gsum = block_reduce(gpart, SumOp{}, 0.0, dsh);  // its barriers also publish lq and lp

    const float soft = temp * temp * float(dsum);
    const float hard = f.want_hard ? (st.m - zy) + log_s1 : 0.0f;
    if (threadIdx.x == 0)
      write_row_outputs(b, o.hard, o.soft, r,
                        (f.hard_on ? o.w_hard * hard : 0.0f) + (o.w_soft != 0.0f ? o.w_soft * soft : 0.0f),
                        hard, soft);
    if (!want_grad) continue;  // uniform; the slot arrays were last read before gsum's barriers

    // d(T²·D)/dz_j = T·(Σ_{k: id_k = j} G_k − π_j·Σ_k G_k), π the softmax Q is normalized over; plus the hard
    // loss's q1_j − [j = y]. Dense part first, then the slot columns.
    const float scale = grad_scale(b);
    const float cs = o.w_soft != 0.0f ? scale * o.w_soft * temp : 0.0f;
    const float ch = f.hard_on ? scale * o.w_hard : 0.0f;
    const float gs = float(gsum);
    const Dense c{st.m, kt, log_st * kLog2e, log_s1 * kLog2e, f.normalize ? 0.0f : -cs * gs, ch};
    const long long y = f.hard_on ? lab.y : -1;
    if (c.a_soft != 0.0f || c.a_hard != 0.0f) {
      DenseGrad<G> dg{grow, c, y, ch};
      rowk::for_row<4>(row, v, vec && gvec, dg);
    } else {
      zero_row(grow, v);
    }
    __syncthreads();  // the dense stores land before the slot columns are rewritten
    if (cs != 0.0f && n > 0.0f) {
      auto term = [&](int64_t k) {  // slot k's share of its column
        double unused = 0.0;
        float g = cs * div_term(beta, lp[k], lq[k], unused);
        if (f.normalize) g -= cs * expf(lq[k]) * gs;
        return g;
      };
      if (f.gathered) {  // every column is one slot: no duplicates
        for (int64_t k = threadIdx.x; k < kk; k += blockDim.x)
          if (sid[k] >= 0) {
            float g = c.at(xs[k]) + term(k);
            if (k == y) g -= ch;
            grow[k] = rowk::from_f<G>(g);
          }
      } else if (f.sort) {
        const int64_t p2 = f.pow2;
        for (int64_t i = threadIdx.x; i < p2; i += blockDim.x)
          keys[i] = i < kk && sid[i] >= 0
                        ? (static_cast<unsigned long long>(sid[i]) << 32) | static_cast<unsigned long long>(i)
                        : kNoKey;
        __syncthreads();
        bitonic_sort(keys, p2);
        for (int64_t i = threadIdx.x; i < p2; i += blockDim.x) {
          const unsigned long long key = keys[i];
          if (key == kNoKey) continue;
          const long long id = static_cast<long long>(key >> 32);
          if (i > 0 && static_cast<long long>(keys[i - 1] >> 32) == id) continue;  // not the first occurrence
          float g = c.at(xs[key & 0xffffffffull]);
          if (id == y) g -= ch;
          for (int64_t q = i; q < p2 && static_cast<long long>(keys[q] >> 32) == id; ++q)
            g += term(static_cast<int64_t>(keys[q] & 0xffffffffull));
          grow[id] = rowk::from_f<G>(g);
        }
      }
    }
    __syncthreads();  // the slot arrays and keys are rewritten by the next row
  }
}

// ---- full-vocabulary distillation -------------------------------------------------------------------------

struct DistillFlags {
  bool hard_on, want_hard;
};

template <typename T, typename G>
__global__ void __launch_bounds__(kThreads)
    distill_kernel(RowBlock b, DistillRows o, ErrorSink err, DistillFlags f) {
  __shared__ Stats2 ssh[32];
  __shared__ double dsh[32];
  const int64_t v = b.V;
  const float temp = o.temperature, inv_t = 1.0f / temp, kt = inv_t * kLog2e, beta = o.beta;
  const bool want_grad = b.grad != nullptr;
  const DType wt = o.teacher_dtype;
  const int64_t wsize = wt == DType::F32 ? 4 : 2;
  for (int64_t r = blockIdx.x; r < b.rows; r += gridDim.x) {
    const T* zr = static_cast<const T*>(b.logits) + r * b.stride;
    const char* wr = static_cast<const char*>(o.teacher) + r * o.teacher_stride * wsize;
    G* grow = want_grad ? static_cast<G*>(b.grad) + r * b.grad_stride : nullptr;
    const RowLabel lab = row_label(o.labels, r, o.ignore_index, v, err);
    const bool ignored = lab.ignored;
    if (ignored && !b.lse) {
      if (threadIdx.x == 0) write_row_outputs(b, o.hard, o.soft, r, 0.0f, 0.0f, 0.0f);
      if (want_grad) zero_row(grow, v);
      continue;
    }
    // Read before any gradient store: the gradient may alias the logits.
    const float zy = f.want_hard && !ignored ? rowk::to_f<T>(zr[lab.y]) : 0.0f;
    const bool both = f.want_hard && !ignored && temp != 1.0f;

    // One online pass over both rows: the student at T (and at 1 for the hard loss), the teacher at T.
    Stats2 sz = stats_empty(), sw = stats_empty();
    for (int64_t j = threadIdx.x; j < v; j += blockDim.x) {
      const float z = rowk::to_f<T>(zr[j]);
      stats_add<1>(sz, &z, kt, both);
      if (!ignored) {
        const float w = load_f(wr + j * wsize, wt);
        stats_add<1>(sw, &w, kt, false);
      }
    }
    sz = block_stats(sz, kt, ssh);
    const float log_sz = logf(sz.st), log_s1 = both ? logf(sz.s1) : log_sz;
    if (threadIdx.x == 0 && b.lse) b.lse[r] = sz.m * inv_t + log_sz;
    if (ignored) {
      if (threadIdx.x == 0) write_row_outputs(b, o.hard, o.soft, r, 0.0f, 0.0f, 0.0f);
      if (want_grad) zero_row(grow, v);
      continue;
    }
    sw = block_stats(sw, kt, ssh);
    const float log_sw = logf(sw.st);

    const float hard = f.want_hard ? (sz.m - zy) + log_s1 : 0.0f;
    const float scale = want_grad ? grad_scale(b) : 0.0f;
    const float cs = want_grad && o.w_soft != 0.0f ? scale * o.w_soft * temp : 0.0f;
    const float ch = want_grad && f.hard_on ? scale * o.w_hard : 0.0f;
    const Dense hard_grad{sz.m, kt, 0.0f, log_s1 * kLog2e, 0.0f, ch};  // ch·q1_j
    const long long y = f.hard_on ? lab.y : -1;
    auto lq_at = [&](float z) { return (z - sz.m) * inv_t - log_sz; };
    auto lp_at = [&](float w) { return (w - sw.m) * inv_t - log_sw; };
    double dpart = 0.0, gpart = 0.0;
    if (beta == 0.0f && want_grad) {
      // Forward KL: dD/dz_j = (q_j − p_j)/T needs no row-wide sum, so loss and gradient share this pass.
      for (int64_t j = threadIdx.x; j < v; j += blockDim.x) {
        const float z = rowk::to_f<T>(zr[j]), lq = lq_at(z), lp = lp_at(load_f(wr + j * wsize, wt));
        div_term(0.0f, lp, lq, dpart);
        float g = cs * (expf(lq) - expf(lp)) + hard_grad.at(z);
        if (j == y) g -= ch;
        grow[j] = rowk::from_f<G>(g);
      }
    } else {
      for (int64_t j = threadIdx.x; j < v; j += blockDim.x)
        gpart += div_term(beta, lp_at(load_f(wr + j * wsize, wt)), lq_at(rowk::to_f<T>(zr[j])), dpart);
    }
    const double dsum = block_reduce(dpart, SumOp{}, 0.0, dsh);
    const double gsum = block_reduce(gpart, SumOp{}, 0.0, dsh);
    if (beta != 0.0f && want_grad) {
      const float gs = float(gsum);
      for (int64_t j = threadIdx.x; j < v; j += blockDim.x) {
        const float z = rowk::to_f<T>(zr[j]), lq = lq_at(z);
        double unused = 0.0;
        const float gj = div_term(beta, lp_at(load_f(wr + j * wsize, wt)), lq, unused);
        float g = cs * (gj - expf(lq) * gs) + hard_grad.at(z);
        if (j == y) g -= ch;
        grow[j] = rowk::from_f<G>(g);
      }
    }
    const float soft = temp * temp * float(dsum);
    if (threadIdx.x == 0)
      write_row_outputs(b, o.hard, o.soft, r,
                        (f.hard_on ? o.w_hard * hard : 0.0f) + (o.w_soft != 0.0f ? o.w_soft * soft : 0.0f),
                        hard, soft);
  }
}

// ---- host side --------------------------------------------------------------------------------------------

int grid_for(int64_t rows) {
  static const int sms = [] {
    int dev = 0, n = 0;
    check(cudaGetDevice(&dev), "cudaGetDevice");
    check(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
    return n > 0 ? n : 80;
  }();
  return int(std::min<int64_t>(rows, int64_t(sms) * 2));
}

bool vec_ok(const void* p, int64_t v, int64_t stride, size_t elsize) {
  return v % 8 == 0 && stride % 8 == 0 && (reinterpret_cast<uintptr_t>(p) % (8 * elsize)) == 0;
}

// Calls f.template operator()<T, G>() for the logits and gradient dtypes.
template <typename F>
void dispatch(DType t, DType g, const char* op, F&& f) {
  auto with_g = [&](auto tt) {
    using T = decltype(tt);
    switch (g) {
      case DType::F32:
        f.template operator()<T, float>();
        return;
      case DType::BF16:
        f.template operator()<T, __nv_bfloat16>();
        return;
      case DType::F16:
        f.template operator()<T, __half>();
        return;
      default:
        RT_FAIL(op, ": gradient dtype must be f32, bf16 or f16, got ", dtype_name(g));
    }
  };
  switch (t) {
    case DType::F32:
      with_g(float{});
      return;
    case DType::BF16:
      with_g(__nv_bfloat16{});
      return;
    case DType::F16:
      with_g(__half{});
      return;
    default:
      RT_FAIL(op, ": logits dtype must be f32, bf16 or f16, got ", dtype_name(t));
  }
}

void check_common(const RowBlock& b, const SideMatrix& labels, float beta, float temp, float w_hard,
                  float w_soft, const char* op) {
  RT_CHECK(b.rows >= 0 && b.V >= 1 && b.V < (int64_t(1) << 31) && (b.rows <= 1 || b.stride >= b.V), op,
           ": bad row block (rows ", b.rows, ", V ", b.V, ", stride ", b.stride, ")");
  RT_CHECK(!b.grad || b.rows <= 1 || b.grad_stride >= b.V, op, ": gradient row stride ", b.grad_stride,
           " < V ", b.V);
  RT_CHECK(std::isfinite(temp) && temp > 0.0f, op, ": temperature must be a finite number > 0, got ", temp);
  RT_CHECK(beta >= 0.0f && beta <= 1.0f, op, ": beta must be in [0, 1], got ", beta);
  RT_CHECK(std::isfinite(w_hard) && w_hard >= 0.0f && std::isfinite(w_soft) && w_soft >= 0.0f, op,
           ": weights must be finite and >= 0, got w_hard ", w_hard, ", w_soft ", w_soft);
  RT_CHECK(!labels.data || is_int(labels.dtype), op, ": labels must be i32 or i64, got ",
           dtype_name(labels.dtype));
  RT_CHECK(w_hard == 0.0f || labels.data, op, ": w_hard = ", w_hard, " needs labels");
}

}  // namespace

void topk_distill_rows(const RowBlock& b, const TopKRows& o, const ErrorSink& err, void* stream) {
  const char* op = "topk_distill_rows";
  check_common(b, o.labels, o.beta, o.temperature, o.w_hard, o.w_soft, op);
  const bool gathered = o.ids.data == nullptr;
  RT_CHECK(o.K >= 1 && o.logprobs.data && is_float(o.logprobs.dtype), op,
           ": need K >= 1 and f32 / bf16 / f16 teacher logprobs, got K = ", o.K);
  RT_CHECK(o.K <= kMaxTopKSlots, op, ": K = ", o.K, " teacher slots per row is more than the ", kMaxTopKSlots,
           " this kernel keeps in shared memory");
  RT_CHECK(gathered ? o.K == b.V : is_int(o.ids.dtype), op, ": gathered logits need V = K (got V = ", b.V,
           ", K = ", o.K, "); teacher ids must be i32 or i64");
  if (b.rows == 0) return;
  TopKFlags f{};
  f.gathered = gathered;
  f.normalize = gathered || o.normalize_topk;
  f.hard_on = o.labels.data && o.w_hard != 0.0f;
  f.want_hard = o.labels.data && (f.hard_on || o.hard);
  f.sort = b.grad && !gathered && o.w_soft != 0.0f;
  f.pow2 = 1;
  while (f.pow2 < o.K) f.pow2 <<= 1;
  const size_t smem = (f.sort ? size_t(f.pow2) * sizeof(unsigned long long) : 0) +
                      size_t(o.K) * (3 * sizeof(float) + sizeof(int));
  auto s = static_cast<cudaStream_t>(stream);
  dispatch(b.dtype, b.grad ? b.grad_dtype : DType::F32, op, [&]<typename T, typename G>() {
    auto kernel = topk_kernel<T, G>;
    int dev = 0, optin = 0;
    check(cudaGetDevice(&dev), "cudaGetDevice");
    check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
          "cudaDeviceGetAttribute");
    cudaFuncAttributes attr{};
    check(cudaFuncGetAttributes(&attr, kernel), "cudaFuncGetAttributes(topk_kernel)");
    RT_CHECK(smem + attr.sharedSizeBytes <= size_t(optin), op, ": K = ", o.K, " teacher slots need ",
             smem + attr.sharedSizeBytes, " bytes of shared memory per block, more than the ", optin,
             " this device allows");
    if (smem > 48 * 1024)
      check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
            "cudaFuncSetAttribute(topk_kernel, max dynamic shared memory)");
    const bool vec = vec_ok(b.logits, b.V, b.stride, sizeof(T));
    const bool gvec = !b.grad || vec_ok(b.grad, b.V, b.grad_stride, sizeof(G));
    kernel<<<grid_for(b.rows), kThreads, smem, s>>>(b, o, err, f, vec, gvec);
  });
  check(cudaGetLastError(), "topk_kernel launch");
}

void distill_rows(const RowBlock& b, const DistillRows& o, const ErrorSink& err, void* stream) {
  const char* op = "distill_rows";
  check_common(b, o.labels, o.beta, o.temperature, o.w_hard, o.w_soft, op);
  RT_CHECK(o.teacher && is_float(o.teacher_dtype) && (b.rows <= 1 || o.teacher_stride >= b.V), op,
           ": need f32 / bf16 / f16 teacher rows of stride >= V = ", b.V, ", got stride ", o.teacher_stride);
  if (b.rows == 0) return;
  DistillFlags f{};
  f.hard_on = o.labels.data && o.w_hard != 0.0f;
  f.want_hard = o.labels.data && (f.hard_on || o.hard);
  auto s = static_cast<cudaStream_t>(stream);
  dispatch(b.dtype, b.grad ? b.grad_dtype : DType::F32, op, [&]<typename T, typename G>() {
    distill_kernel<T, G><<<grid_for(b.rows), kThreads, 0, s>>>(b, o, err, f);
  });
  check(cudaGetLastError(), "distill_kernel launch");
}

}  // namespace retort::cuda
