// Full-vocabulary distillation on Hopper: rows held in a cluster's shared memory (see distill_rows.h).
//
// The portable kernel (distill_full.cu) reads each student and teacher row two or three times (statistics,
// divergence, gradient), and at 8192 × 151936 the rows in flight do not fit in L2, so most re-reads go to
// HBM. Here a cluster of CTAs owns a row pair: each CTA copies its segment of both rows into shared memory
// with the bulk copy engine (with two buffers, where they fit, the next row pair streams into the second
// while this one is worked on), and the passes read shared memory: the segments' maxima (16-bit pairs in
// packed form), their sums of exponentials, the divergence, and for reverse KL and JSD the gradient.
// Statistics and the divergence sums cross the cluster through distributed shared memory, merged in rank
// order (deterministic). HBM sees each row once and the gradient once: the floor. Per entry the passes cost
// ~46 instructions for JSD (H100 SASS; 72 when pass 1 was an online max-and-sum and the divergence terms were
// summed one by one).
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "distill_full.cuh"

namespace retort::cuda {

namespace {

using namespace distk;

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define RT_DISTILL_CLUSTERS 1
#endif

constexpr int kMaxBufs = 2;
// Threads per CTA: 512 (or 320, see distill_three_per_sm) where the row pair fits in the cluster that way:
// two CTAs of different clusters per SM with 108 KB of row segments each, so one computes while the other
// waits at a barrier or for its bulk copy (H100, JSD fwd+bwd at N = 8192, V = 151936, bf16: 7.7 ms, against
// 10.5 ms with one double-buffered 1024-thread CTA per SM). Otherwise (long f32 rows) one 1024-thread CTA
// per SM with 200 KB.
// Where two 512-thread CTAs per SM hold one row pair each (single-buffered), three CTAs of 320 threads (the
// 512-thread build: 64 registers) hold smaller segments of one row pair each when those fit in 8 CTAs:
// while one CTA waits for its row's copy or at a barrier the other two compute (bench/HISTORY.md,
// session 16).
// Row-segment shared memory per CTA with k CTAs per SM (each also has ~1.5 KB static and 1 KB reserved).
int64_t cluster_smem(int per_sm) {
  return per_sm == 1 ? 200 * 1024 : per_sm == 2 ? 108 * 1024 : 70 * 1024;
}
constexpr int kMaxClusterCtas = 8;  // the portable cluster size

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// What a CTA shares with its cluster after pass 1 and after pass 2.
struct RowStats {
  Stats2 z, w;  // student at T (and 1), teacher at T, over this CTA's segment
  float zy;     // the student logit at the label, from the CTA whose segment holds it (0 elsewhere)
};
struct RowSums {
  double d, g;  // divergence sum and Σ dD/dlog q over the segment
};

__device__ __forceinline__ float fast_log2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Base-2 logs of probabilities are clamped here: 2^-65000 is 0 in f32 as 2^-inf is, but a zero probability
// times its clamped log is then 0, not NaN, and t = log2 q − log2 m (below) stays within f16's range.
constexpr float kLogFloor = -65000.0f;

// Pass 2 keeps t in the teacher's slots (f32 rows: as is; 16-bit rows: as f16 — |t| ≤ 65,000 by the floor
// above) for pass 3 to read back.
__device__ __forceinline__ void keep_t(float* slot, const float (&t)[8]) {  // shared memory: plain stores
  reinterpret_cast<float4*>(slot)[0] = make_float4(t[0], t[1], t[2], t[3]);
  reinterpret_cast<float4*>(slot)[1] = make_float4(t[4], t[5], t[6], t[7]);
}
template <typename T>
__device__ __forceinline__ void keep_t(T* slot, const float (&t)[8]) {
  uint32_t h[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __half2 p = __floats2half2_rn(t[2 * i], t[2 * i + 1]);  // one packing conversion per pair
    h[i] = *reinterpret_cast<const uint32_t*>(&p);
  }
  *reinterpret_cast<uint4*>(slot) = make_uint4(h[0], h[1], h[2], h[3]);
}
__device__ __forceinline__ void load_t(const float* slot, float (&t)[8]) {
  rowk::load8<false>(slot, t);
}
template <typename T>
__device__ __forceinline__ void load_t(const T* slot, float (&t)[8]) {
  rowk::load8<false>(reinterpret_cast<const __half*>(slot), t);
}

__device__ __forceinline__ float sum8(const float (&e)[8]) {  // a tree: short dependency chains
  return ((e[0] + e[1]) + (e[2] + e[3])) + ((e[4] + e[5]) + (e[6] + e[7]));
}

template <typename T, typename G, int kMode, int kCT>
__global__ void __launch_bounds__(kCT, kCT == 512 ? 2 : 1)
    distill_cluster_kernel(RowBlock b, DistillRows o, ErrorSink err, DistillFlags f, int64_t seg, int nbuf,
                           bool gvec) {
#ifdef RT_DISTILL_CLUSTERS
  extern __shared__ uint4 dyn_smem[];
  T* const base = reinterpret_cast<T*>(dyn_smem);  // buffer i: student at base + 2i·seg, teacher after it
  __shared__ alignas(8) uint64_t bars[kMaxBufs];
  __shared__ float wmax[32][2];  // the warps' maxima (student, teacher)
  __shared__ float4 wsum[32];    // the warps' sums (student at T, student at 1, teacher at T)
  __shared__ double dsh[32], dsh2[32];
  __shared__ RowStats xstate[2];  // by row parity (see below)
  __shared__ RowSums dstate[2];
  __shared__ RowStats xmerged;
  __shared__ RowSums dmerged;
  namespace cg = cooperative_groups;
  cg::cluster_group cl = cg::this_cluster();
  // JSD keeps pass 2's t for pass 3: exactly with f32 rows; with 16-bit rows only when the gradient is 16-bit
  // too (t in f16 is then well within the gradient's own rounding).
  constexpr bool kKeepT = std::is_same_v<T, float> || sizeof(G) == 2;
  const int cs = int(cl.num_blocks()), rank = int(cl.block_rank());
  const int64_t v = b.V, c0 = int64_t(rank) * seg,
                n = std::max<int64_t>(0, std::min<int64_t>(v, c0 + seg) - c0);
  const uint32_t seg_bytes = uint32_t(n * int64_t(sizeof(T)));
  const int64_t first = blockIdx.x / cs, step = gridDim.x / cs;
  const float temp = o.temperature, inv_t = 1.0f / temp, kt = inv_t * kLog2e, beta = o.div.beta;
  const bool want_grad = b.grad != nullptr;
  const int nt = int(blockDim.x), nw = nt / 32;  // at most kCT threads (cluster_plan's count)
  const int lane = int(threadIdx.x & 31), wid = int(threadIdx.x >> 5);
  if (threadIdx.x == 0) {
    for (int i = 0; i < nbuf; ++i)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&bars[i])));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  auto copy = [&](char* dst, const char* src, uint32_t bytes, uint64_t* bar) {
    for (uint32_t off = 0; off < bytes; off += 32768) {
      const uint32_t len = min(32768u, bytes - off);
      asm volatile(
          "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
              smem_addr(dst + off)),
          "l"(src + off), "r"(len), "r"(smem_addr(bar))
          : "memory");
    }
  };
  auto student_seg = [&](int64_t r) {
    return reinterpret_cast<const char*>(static_cast<const T*>(b.logits) + r * b.stride + c0);
  };
  auto teacher_seg = [&](int64_t r) {
    return reinterpret_cast<const char*>(static_cast<const T*>(o.teacher) + r * o.teacher_stride + c0);
  };
  // Thread 0 asks the copy engine for row r's student and teacher segments into buffer i.
  auto issue = [&](int64_t r, int i) {
    if (threadIdx.x != 0 || seg_bytes == 0) return;
    asm volatile("fence.proxy.async.shared::cta;" ::
                     : "memory");  // earlier generic reads of the buffer are done
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(&bars[i])),
                 "r"(2 * seg_bytes)
                 : "memory");
    T* dst = base + 2 * int64_t(i) * seg;
    copy(reinterpret_cast<char*>(dst), student_seg(r), seg_bytes, &bars[i]);
    copy(reinterpret_cast<char*>(dst + seg), teacher_seg(r), seg_bytes, &bars[i]);
  };
  uint32_t phases = 0;
  for (int k = 0; k < nbuf - 1; ++k)
    if (first + k * step < b.rows) issue(first + k * step, k);
  // Read once (a device scalar written before this kernel): a load per row would wait in the middle of it.
  const float scale = want_grad ? grad_scale(b) : 0.0f;
  int it = 0, cur = 0, next_buf = nbuf - 1;  // it % nbuf and (it + nbuf - 1) % nbuf
  const int nv = int(n / 8);  // segments are whole 8-element vectors (V % 8 == 0), of at most 2^20 bytes
  for (int64_t r = first; r < b.rows; r += step, ++it, cur = cur + 1 == nbuf ? 0 : cur + 1,
               next_buf = next_buf + 1 == nbuf ? 0 : next_buf + 1) {
    const int64_t ahead = r + int64_t(nbuf - 1) * step;
    if (ahead < b.rows) issue(ahead, next_buf);  // the buffer the previous row used
    // The label is the same for every CTA of the cluster, so every branch below is uniform across it. (Read
    // before the wait: its load overlaps the copy's.)
    const RowLabel lab = row_label(o.labels, r, o.ignore_index, v, err);
    const bool ignored = lab.ignored;
    if (seg_bytes) {
      asm volatile(
          "{\n .reg .pred done;\n WAIT_%=:\n mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
          " @!done bra WAIT_%=;\n}" ::"r"(smem_addr(&bars[cur])),
          "r"((phases >> cur) & 1u)
          : "memory");
      phases ^= 1u << cur;
    }
    T* const zs = base + 2 * int64_t(cur) * seg;
    T* const ws = base + 2 * int64_t(cur) * seg + seg;
    G* grow = want_grad ? static_cast<G*>(b.grad) + r * b.grad_stride + c0 : nullptr;
    if (ignored && !b.lse) {
      if (rank == 0 && threadIdx.x == 0) write_row_outputs(b, o.hard, o.soft, r, 0.0f, 0.0f, 0.0f);
      if (want_grad) zero_row(grow, n);
      __syncthreads();  // the buffer is free for the copy issued at the next row
      continue;
    }
    const bool both = f.want_hard && !ignored && temp != 1.0f;
    // Pass 1: the segment's maxima (CTA-wide), then its sums of exponentials relative to them. (The teacher's
    // too on an ignored row, where they go unused: no branch in the loops.)
    float cmz, cmw;
    {
      rowk::SegMax<T> az, aw;
      for (int k = int(threadIdx.x); k < nv; k += nt) {
        az.add(rowk::load_raw8<false>(zs + k * 8));
        aw.add(rowk::load_raw8<false>(ws + k * 8));
      }
      float m[2] = {az.get(), aw.get()};
      rowk::block_max(m, wmax, nw);
      cmz = m[0];
      cmw = m[1];
    }
    float stz = 0.0f, s1z = 0.0f, stw = 0.0f;
    {
      // A segment of −inf only: its sums are 0 (exp2(−inf − 0)), and its maximum tells the merge it has none.
      const float oz = cmz == -INFINITY ? 0.0f : cmz, ow = cmw == -INFINITY ? 0.0f : cmw;
      auto sums = [&]<bool kBoth>() {
        for (int k = int(threadIdx.x); k < nv; k += nt) {
          float z[8], w[8], ez[8], e1[8], ew[8];
          rowk::load8<false>(zs + k * 8, z);
          rowk::load8<false>(ws + k * 8, w);
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            const float d = z[i] - oz;
            ez[i] = rowk::fast_exp2(d * kt);
            if constexpr (kBoth) e1[i] = rowk::fast_exp2(d * kLog2e);
            ew[i] = rowk::fast_exp2((w[i] - ow) * kt);
          }
          stz += sum8(ez);
          if constexpr (kBoth) s1z += sum8(e1);
          stw += sum8(ew);
        }
      };
      if (both)
        sums.template operator()<true>();
      else
        sums.template operator()<false>();
    }
    for (int m = 16; m > 0; m >>= 1) {
      stz += __shfl_xor_sync(0xffffffffu, stz, m);
      s1z += __shfl_xor_sync(0xffffffffu, s1z, m);
      stw += __shfl_xor_sync(0xffffffffu, stw, m);
    }
    if (lane == 0) wsum[wid] = make_float4(stz, s1z, stw, 0.0f);
    __syncthreads();
    // Slots by row parity: a peer reads slot it&1 between this row's first cluster barrier and its second;
    // the slot is written again two rows on, after this CTA passed the second barrier of the row in between
    // (which no peer reaches before it is done reading).
    const int slot = it & 1;
    if (wid == 0) {
      float4 x = lane < nw ? wsum[lane] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      for (int m = 16; m > 0; m >>= 1) {
        x.x += __shfl_xor_sync(0xffffffffu, x.x, m);
        x.y += __shfl_xor_sync(0xffffffffu, x.y, m);
        x.z += __shfl_xor_sync(0xffffffffu, x.z, m);
      }
      if (lane == 0) {
        const bool owns_y = f.want_hard && !ignored && lab.y >= c0 && lab.y < c0 + n;
        xstate[slot] =
            RowStats{{cmz, x.y, x.x}, {cmw, 0.0f, x.z}, owns_y ? rowk::to_f<T>(zs[lab.y - c0]) : 0.0f};
      }
    }
    rowk::cluster_barrier_t0();
    if (threadIdx.x < 32) {
      // The row's maxima, then each rank's sums scaled to them (a rank with no finite value adds 0). Sums by
      // an xor butterfly: every lane adds the same pairs, so lane 0's result is the same on every run.
      RowStats x{stats_empty(), stats_empty(), 0.0f};
      if (lane < cs) x = *cl.map_shared_rank(&xstate[slot], lane);
      float mz = x.z.m, mw = x.w.m;
      for (int m = 16; m > 0; m >>= 1) {
        mz = fmaxf(mz, __shfl_xor_sync(0xffffffffu, mz, m));
        mw = fmaxf(mw, __shfl_xor_sync(0xffffffffu, mw, m));
      }
      const bool hz = x.z.m != -INFINITY, hw = x.w.m != -INFINITY;
      float a = hz ? x.z.st * exp2f((x.z.m - mz) * kt) : 0.0f;
      float c = hz ? x.z.s1 * exp2f((x.z.m - mz) * kLog2e) : 0.0f;
      float e = hw ? x.w.st * exp2f((x.w.m - mw) * kt) : 0.0f;
      float zy = x.zy;
      for (int m = 16; m > 0; m >>= 1) {
        a += __shfl_xor_sync(0xffffffffu, a, m);
        c += __shfl_xor_sync(0xffffffffu, c, m);
        e += __shfl_xor_sync(0xffffffffu, e, m);
        zy += __shfl_xor_sync(0xffffffffu, zy, m);
      }
      if (threadIdx.x == 0) xmerged = RowStats{{mz, c, a}, {mw, 0.0f, e}, zy};
    }
    __syncthreads();
    const Stats2 sz = xmerged.z, sw = xmerged.w;
    const float zy = xmerged.zy;
    const float log_sz = logf(sz.st), log_s1 = both ? logf(sz.s1) : log_sz;
    if (rank == 0 && threadIdx.x == 0 && b.lse) b.lse[r] = sz.m * inv_t + log_sz;
    if (ignored) {
      if (rank == 0 && threadIdx.x == 0) write_row_outputs(b, o.hard, o.soft, r, 0.0f, 0.0f, 0.0f);
      if (want_grad) zero_row(grow, n);
      if (threadIdx.x == 0) dstate[slot] = RowSums{0.0, 0.0};
      rowk::cluster_barrier_t0();  // keeps the barrier count of every row the same (see the slots above)
      __syncthreads();
      continue;
    }
    const float log_sw = logf(sw.st);
    const float hard = f.want_hard ? (sz.m - zy) + log_s1 : 0.0f;
    const float cs_soft = want_grad && o.w_soft != 0.0f ? scale * o.w_soft * temp : 0.0f;
    const float ch = want_grad && f.hard_on ? scale * o.w_hard : 0.0f;
    // The hard loss's gradient ch·softmax(z) at T = 1: with T = 1 that softmax is q, and ch goes into q's
    // coefficient (chq); otherwise it costs one more exp2 per entry (hsep).
    const bool hsep = ch != 0.0f && both;
    const float chq = hsep ? 0.0f : ch, ls12 = log_s1 * kLog2e;
    // The label column within this segment, or one no vector holds.
    const int y = f.hard_on && lab.y >= c0 && lab.y < c0 + n ? int(lab.y - c0) : -16;
    // log2 q_j = (z_j − m)·kt − log2 Σ: the difference first, so logits of 1e4 keep their precision.
    const float lsz2 = log_sz * kLog2e, lsw2 = log_sw * kLog2e, mz = sz.m, mw = sw.m, omb = 1.0f - beta;
    auto lq2_at = [&](float z) { return fmaxf(fmaf(z - mz, kt, -lsz2), kLogFloor); };
    auto lp2_at = [&](float w) { return fmaxf(fmaf(w - mw, kt, -lsw2), kLogFloor); };
    auto q1_at = [&](float z) { return rowk::fast_exp2(fmaf(z - mz, kLog2e, -ls12)); };
    auto store = [&](int k, float(&g)[8]) {
      const int yy = y - k * 8;
      if (unsigned(yy) < 8u) {
#pragma unroll
        for (int i = 0; i < 8; ++i)
          if (i == yy) g[i] -= ch;
      }
      if (gvec) {
        rowk::store8(grow + int64_t(k) * 8, g);
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) grow[int64_t(k) * 8 + i] = rowk::from_f<G>(g[i]);
      }
    };
    // Pass 2: the divergence in base 2 (scaled by ln 2 once below), and for forward KL, whose gradient needs
    // no row-wide sum, the gradient. Per mode, sa and sb hold:
    //   forward KL  sa = Σ p·(log2 p − log2 q); D = sa; gradient (q − p)·cs + ch·q1
    //   reverse KL  sa = Σ q·(log2 q − log2 p), sb = Σ q; D = sa; Σ dD/dlog q = ln2·sa + sb
    //   JSD         sa = Σ p·(log2 p − log2 m), sb = Σ q·t; D = β·sa + (1 − β)·sb;
    //               Σ dD/dlog q = (1 − β)·ln2·sb
    // with t = log2 q − log2 m, m = βp + (1 − β)q. JSD with kKeepT: the teacher's slot of each entry then
    // holds t for pass 3, and (unless kHsep, whose pass 3 needs z) the student's slot q·2^15 (f16's normal
    // range holds q ≥ 2^-29 so, with 11 bits, well within the 16-bit gradient's rounding), so pass 3 needs no
    // exp2 at all.
    float sa = 0.0f, sb = 0.0f;
    auto pass2 = [&]<bool kHsep>() {
      [[maybe_unused]] const float cq = cs_soft + chq;
      for (int k = int(threadIdx.x); k < nv; k += nt) {
        float z[8], w[8];
        [[maybe_unused]] float g[8];
        rowk::load8<false>(zs + k * 8, z);
        rowk::load8<false>(ws + k * 8, w);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const float lq2 = lq2_at(z[i]), lp2 = lp2_at(w[i]);
          const float q = rowk::fast_exp2(lq2);
          if constexpr (kMode == 0) {
            const float p = rowk::fast_exp2(lp2);
            sa = fmaf(p, lp2 - lq2, sa);
            g[i] = fmaf(q, cq, -cs_soft * p);
            if constexpr (kHsep) g[i] = fmaf(ch, q1_at(z[i]), g[i]);
          } else if constexpr (kMode == 1) {
            sa = fmaf(q, lq2 - lp2, sa);
            sb += q;
          } else {
            const float p = rowk::fast_exp2(lp2);
            // M below the smallest normal float only where P and Q are (nearly) zero: their terms vanish.
            const float lm2 = fast_log2(fmaxf(fmaf(beta, p, omb * q), 1.2e-38f));
            const float t = lq2 - lm2;
            sa = fmaf(p, lp2 - lm2, sa);
            sb = fmaf(q, t, sb);
            w[i] = t;
            z[i] = q * 32768.0f;
          }
        }
        if constexpr (kMode == 2 && kKeepT)
          if (want_grad) {
            keep_t(ws + k * 8, w);
            if constexpr (!kHsep) keep_t(zs + k * 8, z);
          }
        if constexpr (kMode == 0)
          if (want_grad) store(k, g);
      }
    };
    if (kMode != 1 && hsep)
      pass2.template operator()<true>();
    else
      pass2.template operator()<false>();
    {  // the CTA's sums, as the statistics above: warps, then warp 0, then the cluster
      const float dpart = kMode == 0 ? sa : kMode == 1 ? sa : fmaf(beta, sa, omb * sb);
      const float gpart = kMode == 0 ? 0.0f : kMode == 1 ? fmaf(sa, rowk::kLn2, sb) : omb * rowk::kLn2 * sb;
      const double dw = warp_reduce(double(dpart), SumOp{});
      const double gw = kMode != 0 ? warp_reduce(double(gpart), SumOp{}) : 0.0;
      if (lane == 0) {
        dsh[wid] = dw;
        dsh2[wid] = gw;
      }
      __syncthreads();
      if (wid == 0) {
        const double d = warp_reduce(lane < nw ? dsh[lane] : 0.0, SumOp{});
        const double g = warp_reduce(lane < nw ? dsh2[lane] : 0.0, SumOp{});
        if (lane == 0) dstate[slot] = RowSums{d, g};
      }
    }
    rowk::cluster_barrier_t0();
    if (threadIdx.x == 0) {
      RowSums s{0.0, 0.0};
      for (int i = 0; i < cs; ++i) {  // rank order: deterministic
        const RowSums p = *cl.map_shared_rank(&dstate[slot], i);
        s.d += p.d;
        s.g += p.g;
      }
      dmerged = s;
    }
    __syncthreads();
    const double dsum = dmerged.d * double(rowk::kLn2);
    if (kMode != 0 && want_grad) {
      // Pass 3: dD/dz_j = (g_j − q_j Σ g)/T, times T² in cs_soft, with g_j = dD/dlog q_j = q_j·(a·u_j + c)
      // (JSD: u = t, a = (1 − β)·ln2; reverse KL: u = log2 q − log2 p, a = ln2, c = 1); so the entry's
      // gradient is q_j·(cs·a·u_j + cs·(c − Σ g) + chq), plus ch·q1_j when hsep.
      const float gs = float(dmerged.g);
      const float a3 = cs_soft * (kMode == 2 ? omb * rowk::kLn2 : rowk::kLn2);
      const float b3 = fmaf(cs_soft, (kMode == 2 ? 0.0f : 1.0f) - gs, chq);
      // With q·2^15 kept by pass 2, the 2^-15 goes into the coefficients (exact: powers of 2).
      const float a3k = a3 * (1.0f / 32768.0f), b3k = b3 * (1.0f / 32768.0f);
      auto pass3 = [&]<bool kHsep>() {
        for (int k = int(threadIdx.x); k < nv; k += nt) {
          float z[8], w[8], g[8];
          if constexpr (kMode == 2 && kKeepT && !kHsep) {
            load_t(zs + k * 8, z);  // q·2^15
            load_t(ws + k * 8, w);  // t
#pragma unroll
            for (int i = 0; i < 8; ++i) g[i] = z[i] * fmaf(a3k, w[i], b3k);
            store(k, g);
            continue;
          }
          rowk::load8<false>(zs + k * 8, z);
          if constexpr (kMode == 2 && kKeepT)
            load_t(ws + k * 8, w);
          else
            rowk::load8<false>(ws + k * 8, w);
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            float q, u;
            if constexpr (kMode == 2 && kKeepT) {
              // No floor needed: q is 0 at −inf and t is finite.
              q = rowk::fast_exp2(fmaf(z[i] - mz, kt, -lsz2));
              u = w[i];
            } else {
              const float lq2 = lq2_at(z[i]), lp2 = lp2_at(w[i]);
              q = rowk::fast_exp2(lq2);
              if constexpr (kMode == 1) {
                u = lq2 - lp2;
              } else {
                const float p = rowk::fast_exp2(lp2);
                u = lq2 - fast_log2(fmaxf(fmaf(beta, p, omb * q), 1.2e-38f));
              }
            }
            g[i] = q * fmaf(a3, u, b3);
            if constexpr (kHsep) g[i] = fmaf(ch, q1_at(z[i]), g[i]);
          }
          store(k, g);
        }
      };
      if (hsep)
        pass3.template operator()<true>();
      else
        pass3.template operator()<false>();
    }
    const float soft = temp * temp * float(dsum);
    if (rank == 0 && threadIdx.x == 0)
      write_row_outputs(b, o.hard, o.soft, r,
                        (f.hard_on ? o.w_hard * hard : 0.0f) + (o.w_soft != 0.0f ? o.w_soft * soft : 0.0f),
                        hard, soft);
    __syncthreads();  // the buffer and the merged values are rewritten by the next row
  }
  cl.sync();  // no CTA leaves while a peer may still read its shared memory
#endif
}

// The cluster plan for a row pair of V elements of T: CTAs per row and segment length, or cs = 0 when the
// rows are not eligible (not Hopper, dtypes differ, rows not 16-byte aligned vectors, or too long).
struct ClusterPlan {
  int cs = 0, nbuf = 0, threads = 0;  // threads: the build's bound (512: 64 registers, or 1024)
  int block = 0;                      // the threads launched per CTA, <= threads
  int64_t seg = 0;
};

ClusterPlan cluster_plan(const RowBlock& b, const DistillRows& o, size_t elsize) {
  ClusterPlan p;
  int dev = 0, major = 0;
  RT_CUDA_CHECK(cudaGetDevice(&dev));
  RT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  if (major < 9 || b.dtype != o.teacher_dtype || !vec_ok(b.logits, b.V, b.stride, elsize) ||
      !vec_ok(o.teacher, b.V, o.teacher_stride, elsize))
    return p;
  // The fewest CTAs whose segments (student + teacher, two buffers) fit; one buffer when two never do: 512
  // threads with two CTAs per SM, or three of 320 (above) where two would hold one buffer each, else 1024
  // threads with one CTA per SM. Two CTAs per SM need every warp to hide the latency, so thread counts that
  // split a segment's vectors more evenly (the cross-entropy kernel's rule) and double-buffered plans with
  // more, smaller segments lose here (bench/HISTORY.md, sessions 15 and 16).
  // The fewest CTAs of `block` threads (k per SM) whose segments fit in up to max_nbuf buffers.
  auto search = [&](int block, int per_sm, int max_nbuf) {
    ClusterPlan q;
    for (int nbuf = max_nbuf; nbuf >= 1 && q.cs == 0; --nbuf)
      for (int cs = 1; cs <= kMaxClusterCtas; ++cs) {
        const int64_t seg = ((b.V + cs - 1) / cs + 7) / 8 * 8;
        if (int64_t(nbuf) * 2 * seg * int64_t(elsize) <= cluster_smem(per_sm)) {
          q = ClusterPlan{cs, nbuf, block <= 512 ? 512 : 1024, block, seg};
          break;
        }
      }
    return q;
  };
  p = search(512, 2, kMaxBufs);
  if (p.cs && p.nbuf == 1) {
    const ClusterPlan q = search(320, 3, 1);
    if (q.cs) p = q;
  }
  if (p.cs == 0) p = search(1024, 1, kMaxBufs);
  return p;
}

}  // namespace

bool distk::launch_distill_cluster(const RowBlock& b, const DistillRows& o, const ErrorSink& err,
                                   const DistillFlags& f, cudaStream_t s) {
  // The cluster kernel is specialized for the KL family; the other divergences take the portable kernel.
  if (o.div.kind != Divergence::Kl) return false;
  bool launched = false;
  dispatch(b.dtype, b.grad ? b.grad_dtype : DType::F32, "distill_rows", [&]<typename T, typename G>() {
    // The cluster kernel is built for gradients in f32 or the logits' dtype, and for any gradient dtype of
    // f32 logits (the fused path's chunks, whose gradient may go to a 16-bit buffer); others take the
    // portable kernel.
    constexpr bool kClusterG = std::is_same_v<G, float> || std::is_same_v<G, T> || std::is_same_v<T, float>;
    if constexpr (kClusterG) {
      const ClusterPlan cp = cluster_plan(b, o, sizeof(T));
      if (cp.cs == 0) return;
      const bool half = cp.threads == 512;
      auto kernel =
          o.div.beta == 0.0f
              ? (half ? distill_cluster_kernel<T, G, 0, 512> : distill_cluster_kernel<T, G, 0, 1024>)
          : o.div.beta == 1.0f
              ? (half ? distill_cluster_kernel<T, G, 1, 512> : distill_cluster_kernel<T, G, 1, 1024>)
              : (half ? distill_cluster_kernel<T, G, 2, 512> : distill_cluster_kernel<T, G, 2, 1024>);
      const size_t smem = size_t(cp.nbuf) * 2 * size_t(cp.seg) * sizeof(T);
      cudaLaunchAttribute attr[1];
      attr[0].id = cudaLaunchAttributeClusterDimension;
      attr[0].val.clusterDim.x = unsigned(cp.cs);
      attr[0].val.clusterDim.y = 1;
      attr[0].val.clusterDim.z = 1;
      cudaLaunchConfig_t cfg = {};
      cfg.blockDim = dim3(unsigned(cp.block));
      cfg.gridDim = dim3(unsigned(cp.cs));
      cfg.dynamicSmemBytes = smem;
      cfg.stream = s;
      cfg.attrs = attr;
      cfg.numAttrs = 1;
      int clusters = rowk::max_active_clusters(kernel, cfg, cp.cs);
      if (clusters <= 0)
        return;  // no cluster of this shape fits (another process's partition of the GPU, say)
      clusters = int(std::min<int64_t>(b.rows, clusters));
      cfg.gridDim = dim3(unsigned(clusters * cp.cs));
      const bool gvec = !b.grad || vec_ok(b.grad, b.V, b.grad_stride, sizeof(G));
      int64_t seg = cp.seg;
      int nbuf = cp.nbuf;
      RT_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, b, o, err, f, seg, nbuf, gvec));
      launched = true;
    }
  });
  return launched;
}

}  // namespace retort::cuda
