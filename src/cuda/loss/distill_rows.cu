// Top-K distillation row kernels (see distill_rows.h; the math is row_kernels.h's).
//
// One CTA per row, rows visited grid-stride. Top-K: the K slots go to shared memory first (validity, id,
// student logit at the id, teacher log p), then one online pass over the vocabulary gives the student's
// normalizers (at T, and at 1 for the hard loss when T != 1), and block reductions over the slots give the
// slot normalizers, the teacher renormalization and the divergence. The gradient is a dense pass over the row
// (the softmax terms and the hard loss) and, after a barrier, a fixup of the K slot columns. Slots that share
// an id are made adjacent by a bitonic sort of (id, slot) keys in shared memory; the first of each run owns
// the column and writes it once, recomputing the dense value there from the saved student logit (so a bf16
// gradient is rounded once) and adding the slots' terms in slot order: deterministic, no atomics.
// (Full-vocabulary distillation is in distill_full.cu; the shared helpers in distill_common.cuh.)
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "../../core/error.h"
#include "../cuda_common.cuh"
#include "distill_rows.h"
#include "distill_common.cuh"
#include "row_common.cuh"

namespace retort::cuda {

namespace {

using namespace distk;

// Top-K distillation.

struct TopKFlags {
  bool gathered;   // no ids: slot k is column k
  bool normalize;  // Q over the valid slots
  bool hard_on;    // labels and w_hard != 0
  bool want_hard;  // labels and (hard_on or the hard part is asked for)
  bool sort;       // the gradient's slot fixup needs the duplicate-id sort
  int64_t pow2;    // sort length: the power of two >= K
};

constexpr unsigned long long kNoKey = ~0ull;  // padding slots sort last

// Slot k of row r, with its teacher log-probability in lp: the column it points at (k itself when gathered,
// no ids) when valid, else -1 (padding: lp = -inf or masked; or, reported when `report`, a logprob that is
// NaN or +inf or an id out of [0, v)).
__device__ __forceinline__ int slot_id(const TopKRows& o, int64_t r, int64_t k, int64_t v, float& lp,
                                       const ErrorSink* report) {
  lp = load_f(side_at(o.logprobs, r, k), o.logprobs.dtype);
  if (lp == -INFINITY || (o.mask.data && !nonzero(side_at(o.mask, r, k), o.mask.dtype))) return -1;
  // A NaN would drop out of the loss (a max and a sum over slots) and show only in the gradient, where a
  // finite-loss check does not look: it is an error, as on the CPU.
  if (!(lp < INFINITY)) {
    if (report && report->record) report_error(report->record, report->op, kErrTeacherLogprob, r, k);
    return -1;
  }
  if (!o.ids.data) return int(k);
  const long long id = load_i(side_at(o.ids, r, k), o.ids.dtype);
  if (id < 0 || id >= v) {
    if (report && report->record) report_error(report->record, report->op, kErrIdOutOfRange, id, v);
    return -1;
  }
  return int(id);
}

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
  const float temp = o.temperature, inv_t = 1.0f / temp, kt = inv_t * kLog2e;
  const loss::DivergenceSpec dv = o.div;
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
      const int id = slot_id(o, r, k, v, lp[k], &err);
      sid[k] = id;
      xs[k] = id >= 0 ? rowk::to_f<T>(row[id]) : 0.0f;
      cnt += id >= 0 ? 1.0f : 0.0f;
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
      if (sid[k] >= 0) gpart += div_term(dv, lp[k], lq[k], dpart);
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
        float g = cs * div_term(dv, lp[k], lq[k], unused);
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

// Top-K rows as cross-entropy rows.
//
// At T = 1 with forward KL (beta = 0 over the teacher's slots) or normalize_topk, the dense part of the
// gradient is one softmax term: scale·(w_hard·[labels] + w_soft·Σ_k p_k [not normalize_topk])·q_j, minus
// scale·w_hard at the label; only the K slot columns differ. So the row runs as a cross-entropy row with a
// per-row coefficient (row_losses.cu: one read of the row, the cluster kernel on Hopper), between
//   topk_gather_kernel  a warp per row: labels checked (bad or ignored: -1), ids checked, the student logits
//                       at the valid slots saved, and the row's coefficient;
//   topk_fixup_kernel   a warp per row: the slot terms, the divergence and the losses from the saved slot
//                       logits and the lse; each distinct slot column rewritten once, by the lane of its
//                       first slot, as the cross-entropy kernel's value at that logit (the same float
//                       operations, so the gradient is rounded once) plus the slots' terms in slot order.

struct FastView {  // topk_scratch_bytes: lab [rows] i64, coef, lse, hard [rows] f32, xs [rows, K] f32
  int64_t* lab;
  float *coef, *lse, *hard, *xs;
  FastView(void* base, int64_t rows) {
    char* p = static_cast<char*>(base);
    lab = reinterpret_cast<int64_t*>(p);
    coef = reinterpret_cast<float*>(p + rows * sizeof(int64_t));
    lse = coef + rows;
    hard = lse + rows;
    xs = hard + rows;
  }
};

constexpr int kFastWarps = 8;  // rows per CTA of the gather and fixup kernels

template <typename T>
__global__ void __launch_bounds__(kFastWarps * 32)
    topk_gather_kernel(RowBlock b, TopKRows o, ErrorSink err, FastView w, bool hard_on) {
  const int lane = int(threadIdx.x & 31);
  const int64_t v = b.V, kk = o.K, nw = int64_t(gridDim.x) * kFastWarps;
  for (int64_t r = int64_t(blockIdx.x) * kFastWarps + (threadIdx.x >> 5); r < b.rows; r += nw) {
    const T* row = static_cast<const T*>(b.logits) + r * b.stride;
    const RowLabel lab = row_label(o.labels, r, o.ignore_index, v, err, lane == 0);
    float ps = 0.0f;
    for (int64_t k = lane; k < kk; k += 32) {  // ids checked on every row, ignored ones too
      float lp;
      const int id = slot_id(o, r, k, v, lp, &err);
      w.xs[r * kk + k] = id >= 0 ? rowk::to_f<T>(row[id]) : 0.0f;
      if (id >= 0) ps += expf(lp);
    }
    ps = warp_reduce(ps, SumOp{});
    if (lane == 0) {
      w.lab[r] = lab.ignored ? -1 : lab.y;
      w.coef[r] = (hard_on ? o.w_hard : 0.0f) + (o.normalize_topk ? 0.0f : o.w_soft * ps);
    }
  }
}

template <typename G>
__global__ void __launch_bounds__(kFastWarps * 32)
    topk_fixup_kernel(RowBlock b, TopKRows o, FastView w, bool hard_on) {
  __shared__ int sid_all[kFastWarps][kMaxFastSlots];
  __shared__ float lq_all[kFastWarps][kMaxFastSlots], lp_all[kFastWarps][kMaxFastSlots];
  const int lane = int(threadIdx.x & 31), wi = int(threadIdx.x >> 5);
  int* sid = sid_all[wi];
  float *lq = lq_all[wi], *lpv = lp_all[wi];
  const int64_t v = b.V, kk = o.K, nw = int64_t(gridDim.x) * kFastWarps;
  const loss::DivergenceSpec dv = o.div;
  const float scale = grad_scale(b);
  for (int64_t r = int64_t(blockIdx.x) * kFastWarps + wi; r < b.rows; r += nw) {
    const long long y = w.lab[r];
    if (y < 0) {  // ignored: the cross-entropy kernel wrote a zero gradient row
      if (lane == 0) {
        write_row_outputs(b, o.hard, o.soft, r, 0.0f, 0.0f, 0.0f);
        if (b.lse) b.lse[r] = w.lse[r];
      }
      continue;
    }
    const float lse = w.lse[r];
    const float* xs = w.xs + r * kk;
    float mx = -INFINITY, cnt = 0.0f;
    for (int64_t k = lane; k < kk; k += 32) {
      float lp;
      const int id = slot_id(o, r, k, v, lp, nullptr);
      sid[k] = id;
      lpv[k] = lp;
      if (id >= 0) {
        mx = fmaxf(mx, xs[k]);
        cnt += 1.0f;
      }
    }
    const float n = warp_reduce(cnt, SumOp{});
    float ms = 0.0f, ls = 0.0f;  // the slot normalizer (normalize_topk)
    if (o.normalize_topk && n > 0.0f) {
      ms = warp_reduce(mx, MaxOp{});
      float se = 0.0f;
      for (int64_t k = lane; k < kk; k += 32)
        if (sid[k] >= 0) se += expf(xs[k] - ms);
      ls = logf(warp_reduce(se, SumOp{}));
    }
    double dpart = 0.0;
    float gpart = 0.0f;
    for (int64_t k = lane; k < kk; k += 32)
      if (sid[k] >= 0) {
        lq[k] = o.normalize_topk ? (xs[k] - ms) - ls : xs[k] - lse;
        gpart += div_term(dv, lpv[k], lq[k], dpart);
      }
    const float soft = float(warp_reduce(dpart, SumOp{})), gs = warp_reduce(gpart, SumOp{});
    const float hard = w.hard[r];
    if (lane == 0) {
      write_row_outputs(b, o.hard, o.soft, r,
                        (hard_on ? o.w_hard * hard : 0.0f) + (o.w_soft != 0.0f ? o.w_soft * soft : 0.0f),
                        hard, soft);
      if (b.lse) b.lse[r] = lse;
    }
    __syncwarp();  // every lane's lq and sid are visible to the others
    if (b.grad && o.w_soft != 0.0f && n > 0.0f) {
      G* grow = static_cast<G*>(b.grad) + r * b.grad_stride;
      const float cs = scale * o.w_soft, coef = scale * w.coef[r], hit = hard_on ? scale * o.w_hard : 0.0f;
      const float lse2 = lse * kLog2e;
      for (int64_t k = lane; k < kk; k += 32) {
        const int id = sid[k];
        if (id < 0) continue;
        bool first = true;
        for (int64_t q = 0; q < k && first; ++q) first = sid[q] != id;
        if (!first) continue;
        // The cross-entropy kernel's value at this logit (row_losses.cu, CePolicy::Grad), then the slots.
        float g = fmaf(rowk::fast_exp2(fmaf(xs[k], kLog2e, -lse2)), coef, -0.0f);
        if (id == y) g -= hit;
        for (int64_t q = k; q < kk; ++q) {
          if (sid[q] != id) continue;
          double unused = 0.0;
          float t = cs * div_term(dv, lpv[q], lq[q], unused);
          if (o.normalize_topk) t -= cs * expf(lq[q]) * gs;
          g += t;
        }
        grow[id] = rowk::from_f<G>(g);
      }
    }
    __syncwarp();  // the slot arrays are rewritten by the next row
  }
}

}  // namespace

void topk_distill_rows(const RowBlock& b, const TopKRows& o, const ErrorSink& err, void* stream) {
  const char* op = "topk_distill_rows";
  check_common(b, o.labels, o.div, o.temperature, o.w_hard, o.w_soft, op);
  const bool gathered = o.ids.data == nullptr;
  RT_CHECK(o.K >= 1 && o.logprobs.data && is_float(o.logprobs.dtype), op,
           ": need K >= 1 and f32 / bf16 / f16 teacher logprobs, got K = ", o.K);
  RT_CHECK(o.K <= kMaxTopKSlots, op, ": K = ", o.K, " teacher slots per row is more than the ", kMaxTopKSlots,
           " this kernel keeps in shared memory");
  RT_CHECK(gathered ? o.K == b.V : is_int(o.ids.dtype), op, ": gathered logits need V = K (got V = ", b.V,
           ", K = ", o.K, "); teacher ids must be i32 or i64");
  if (b.rows == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  if (o.scratch && b.grad && !gathered && o.labels.data && o.temperature == 1.0f &&
      (o.div.forward_kl() || o.normalize_topk) && o.K <= kMaxFastSlots) {
    const FastView w(o.scratch, b.rows);
    const bool hard_on = o.w_hard != 0.0f;
    const int grid = int(std::min<int64_t>((b.rows + kFastWarps - 1) / kFastWarps, 4096));
    dispatch(b.dtype, b.grad_dtype, op, [&]<typename T, typename G>() {
      topk_gather_kernel<T><<<grid, kFastWarps * 32, 0, s>>>(b, o, err, w, hard_on);
    });
    RT_CUDA_LAUNCH_CHECK("topk_gather_kernel");
    RowBlock bc = b;
    bc.loss = w.hard;
    bc.lse = w.lse;
    CrossEntropyRows co;
    co.labels = w.lab;
    co.label_dtype = DType::I64;
    co.ignore_index = -1;
    co.row_coef = w.coef;
    co.hit_weight = hard_on ? o.w_hard : 0.0f;
    cross_entropy_rows(bc, co, nullptr, stream);
    dispatch(b.dtype, b.grad_dtype, op, [&]<typename T, typename G>() {
      topk_fixup_kernel<G><<<grid, kFastWarps * 32, 0, s>>>(b, o, w, hard_on);
    });
    RT_CUDA_LAUNCH_CHECK("topk_fixup_kernel");
    return;
  }
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
  dispatch(b.dtype, b.grad ? b.grad_dtype : DType::F32, op, [&]<typename T, typename G>() {
    auto kernel = topk_kernel<T, G>;
    int dev = 0, optin = 0;
    RT_CUDA_CHECK(cudaGetDevice(&dev));
    RT_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    cudaFuncAttributes attr{};
    RT_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
    RT_CHECK(smem + attr.sharedSizeBytes <= size_t(optin), op, ": K = ", o.K, " teacher slots need ",
             smem + attr.sharedSizeBytes, " bytes of shared memory per block, more than the ", optin,
             " this device allows");
    if (smem > 48 * 1024)
      RT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    const bool vec = true;  // for_row's vector path takes any row
    const bool gvec = grad_vec_ok(b.logits, b.stride, sizeof(T), b.grad, b.grad_stride, sizeof(G));
    // Short rows (the K-sparse path's gathered [N, K] logits): a 512-thread CTA would idle most of its
    // threads through every barrier, so a CTA of a warp or few per row, and many rows in flight.
    int threads = kThreads, grid = grid_for(b.rows);
    const int64_t widest = std::max<int64_t>(b.V / 8, o.K);
    if (widest <= 256) {
      threads = int(std::max<int64_t>(32, (widest + 31) / 32 * 32));
      grid = int(std::min<int64_t>(b.rows, int64_t(grid_for(b.rows)) * (kThreads / threads)));
    }
    kernel<<<grid, threads, smem, s>>>(b, o, err, f, vec, gvec);
  });
  RT_CUDA_LAUNCH_CHECK("topk_kernel");
}

}  // namespace retort::cuda
