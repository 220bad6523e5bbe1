// Cross-entropy and entropy row kernels: the row drivers, run with the loss policies of row_policies.cuh (see
// row_losses.h for the contract; selective log-softmax is in selective_rows.cu).
//
// Forward reads each row once with an online softmax (running max and rescaled sum, one exp per element).
// With a gradient the same CTA re-reads the row right away: with one row per CTA in flight the working set is
// about (CTAs in flight × row bytes), which stays in L2, so the second read costs little HBM traffic; the
// gradient goes out with streaming stores so it does not evict rows still to be re-read.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "../../core/error.h"
#include "row_losses.h"
#include "row_policies.cuh"

namespace retort::cuda {

namespace {

using namespace rowk;
using namespace rowloss;

// Threads per cluster CTA (one CTA per SM) for a segment of nv 8-wide vectors: of 512, 640, ..., 1024, the
// count whose last round of vectors is fullest (every thread of a CTA waits at each row's barriers for the
// threads with one vector more: V = 128,256 in 3 segments is 5.2 vectors per thread at 1024 threads, 6.96 at
// 768), the larger one on a tie (fewer vectors, so less latency, per thread).
int cluster_threads(int64_t nv) {
  int best = 1024;
  double best_fill = 0.0;
  for (int t = 1024; t >= 512; t -= 128) {
    const double per = double(nv) / t, fill = per / std::ceil(per);
    if (fill > best_fill + 0.01) {
      best = t;
      best_fill = fill;
    }
  }
  return best;
}
// Shared memory for one row segment of a cluster CTA (it holds two).
constexpr int64_t kSegmentBytes = 100 * 1024;
constexpr int kMaxCluster = 8;
constexpr int64_t kSmemBudget = 220 * 1024;  // of the 227 KB a CTA may use on H100

// Row drivers.
//
// A policy P describes one loss: begin_row(b, r, row) loads the row's side data, and reads from the row what
// finish() needs (the gradient may overwrite the row once the statistics are merged); acc() makes the
// per-thread pass-1 accumulator (an object with apply<N>(j0, x)); fold(acc, on, aux) extracts its statistics
// (an online-softmax state plus one additive extra); finish(b, r, row, on, aux) writes the row's loss and lse
// (thread 0 only); and grad<G>(out, on, aux, scale, c0, n) makes the pass-2 functor that writes the gradient
// (out is column c0 of the row, and the functor sees columns c0 .. c0 + n - 1 as 0 .. n - 1). For the cluster
// kernel also: plain_sum() (uniform) says pass 1 is a plain sum of exp(x - max), with no transform or extra,
// and prefetch(b, r) loads row r's side data ahead (during the previous row's gradient pass).

// Two passes per row from global memory; the second read is meant to hit L2. Works on every architecture and
// for rows of any length.
template <class P, typename T, typename G>
__global__ void __launch_bounds__(kThreads) rows_l2_kernel(RowBlock b, P p, bool vec, bool gvec) {
  __shared__ alignas(16) unsigned char scratch_raw[32 * sizeof(Online)];
  Online* scratch = reinterpret_cast<Online*>(scratch_raw);
  __shared__ float fscratch[32];
  for (int64_t r = blockIdx.x; r < b.rows; r += gridDim.x) {
    const T* row = static_cast<const T*>(b.logits) + r * b.stride;
    p.begin_row(b, r, row);
    auto acc = p.acc();
    for_row<kUnroll>(row, b.V, vec, acc);
    Online on;
    float aux;
    p.fold(acc, on, aux);
    on = block_merge(on, scratch);
    aux = block_sum(aux, fscratch);
    if (threadIdx.x == 0) p.finish(b, r, row, on, aux);
    if (b.grad) {
      auto gr = p.template grad<G>(static_cast<G*>(b.grad) + r * b.grad_stride, on, aux, grad_scale(b));
      for_row<kUnroll>(row, b.V, vec && gvec, gr);
    }
    __syncthreads();  // the row (when the gradient aliases it) and scratch are done before the next row
  }
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define RT_HAS_CLUSTERS 1
#endif

// Hopper: a cluster of CTAs owns a row, each CTA a segment of `seg` columns held in its shared memory, so the
// gradient pass reads shared memory instead of HBM or L2: the row crosses HBM once and the gradient once,
// which is the floor. Each CTA has two segment buffers: the bulk-copy engine (cp.async.bulk, completing on an
// mbarrier) streams the next row's segment into one while the threads work on the other, so HBM reads never
// wait for the softmax statistics, the cluster barrier or the gradient stores. Each CTA takes its segment's
// maximum first (16-bit values in packed pairs), so its threads' softmax sums share that maximum and add up
// without rescaling; the segments' statistics are merged across the cluster through distributed shared
// memory, in rank order.
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

constexpr int kMaxBuffers = 3;

// Visits columns [e0, e1) of a segment in shared memory (16-byte aligned; e0 a multiple of 8, e1 a multiple
// of 8 or the segment's end) with 32-bit indices: f.template apply<N>(j, x) gets N consecutive values from
// column j of the segment (8-wide when vec, else one by one). seg_for visits the whole segment buf[0, n).
template <typename T, typename F>
__device__ __forceinline__ void seg_part(const T* buf, int e0, int e1, int nt, bool vec, F& f) {
  int j = e0 + int(threadIdx.x);
  if (vec) {
    const int v1 = e1 >> 3;
    for (int v = (e0 >> 3) + int(threadIdx.x); v < v1; v += nt) {
      float x[8];
      unpack8(load_raw8<false>(buf + v * 8), x);
      f.template apply<8>(v * 8, x);
    }
    j = v1 * 8 + int(threadIdx.x);
  }
  for (; j < e1; j += nt) {
    float x[1] = {to_f<T>(buf[j])};
    f.template apply<1>(j, x);
  }
}
template <typename T, typename F>
__device__ __forceinline__ void seg_for(const T* buf, int n, int nt, bool vec, F& f) {
  seg_part(buf, 0, n, nt, vec, f);
}

// Pass 1 of a policy whose transform is the identity (plain_sum()): the segment's maximum is known, so the
// sum of exp(x - m) needs no running maximum.
struct SumExp {
  float s, ml;  // ml = m·log2(e)
  template <int N>
  __device__ __forceinline__ void apply(int, const float* x) {
#pragma unroll
    for (int i = 0; i < N; ++i) s += fast_exp2(fmaf(x[i], kLog2e, -ml));
  }
};

// Up to 1024 threads per CTA (launch_rows picks the count that splits a segment's vectors most evenly).
template <class P, typename T, typename G>
__global__ void __launch_bounds__(1024)
    rows_cluster_kernel(RowBlock b, P p, int64_t seg, int nbuf, bool gvec) {
#ifdef RT_HAS_CLUSTERS
  const int nt = int(blockDim.x);
  extern __shared__ uint4 dyn_smem[];
  T* const base = reinterpret_cast<T*>(dyn_smem);
  __shared__ alignas(8) uint64_t bars[kMaxBuffers];
  __shared__ float maxes[32][1];  // the warps' maxima
  __shared__ float4 sums[32];     // the warps' sums (s, t, aux)
  // Double-buffered by row parity: a peer may still read slot i%2 while this CTA already writes slot (i+1)%2;
  // slot i%2 is rewritten only after every peer passed the cluster barrier of row i+1.
  __shared__ alignas(16) unsigned char state_raw[2 * sizeof(Online)];
  Online* state = reinterpret_cast<Online*>(state_raw);
  __shared__ float state_aux[2];
  __shared__ alignas(16) unsigned char merged_raw[sizeof(Online)];
  Online* merged = reinterpret_cast<Online*>(merged_raw);
  __shared__ float merged_aux;
  namespace cg = cooperative_groups;
  cg::cluster_group cl = cg::this_cluster();
  const int cs = int(cl.num_blocks()), rank = int(cl.block_rank());
  const int64_t c0 = int64_t(rank) * seg, n = std::max<int64_t>(0, std::min<int64_t>(b.V, c0 + seg) - c0);
  // The copy engine moves whole 16-byte pieces: the last segment's < 8 trailing values (V % 8 != 0) are
  // loaded by the threads once the bulk copy has landed.
  const int tail = int(n % 8);
  const uint32_t seg_bytes = uint32_t((n - tail) * int64_t(sizeof(T)));
  const int64_t first = blockIdx.x / cs, step = gridDim.x / cs;
  // A single buffer (nbuf == 1) is used in two halves, each on a barrier of its own (bars[0], bars[1]): the
  // gradient pass asks for the next row's first half as soon as it is past it, so that load runs under the
  // pass's second half instead of after it. A segment too short to split (under two vectors) is one piece.
  // hv: the first half's length, whole 8-element vectors.
  const bool halves = nbuf == 1 && n - tail >= 16;
  const int hv = halves ? int((n - tail) / 16 * 8) : int(n - tail);
  const uint32_t h0_bytes = uint32_t(hv * int64_t(sizeof(T)));
  if (threadIdx.x == 0) {
    for (int i = 0; i < (halves ? 2 : nbuf); ++i)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(&bars[i])));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  // One thread asks the copy engine for bytes [off0, off0 + bytes) of row r's segment, into buffer i, on
  // barrier bar (in pieces of at most 32 KB).
  auto issue_bytes = [&](int64_t r, int i, uint32_t off0, uint32_t bytes, int bar) {
    if (threadIdx.x != 0 || bytes == 0) return;
    asm volatile("fence.proxy.async.shared::cta;" ::
                     : "memory");  // earlier generic reads of the buffer are done
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(&bars[bar])),
                 "r"(bytes)
                 : "memory");
    const char* src =
        reinterpret_cast<const char*>(static_cast<const T*>(b.logits) + r * b.stride + c0) + off0;
    char* dst = reinterpret_cast<char*>(base + i * seg) + off0;
    for (uint32_t off = 0; off < bytes; off += 32768) {
      uint32_t len = min(32768u, bytes - off);
      asm volatile(
          "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
              smem_u32(dst + off)),
          "l"(src + off), "r"(len), "r"(smem_u32(&bars[bar]))
          : "memory");
    }
  };
  auto issue = [&](int64_t r, int i) { issue_bytes(r, i, 0, seg_bytes, i); };
  // Rows i+1 .. i+nbuf-1 stream in while row i is worked on.
  uint32_t phases = 0;  // bit i: the parity to wait for on buffer i
  for (int k = 0; k < nbuf - 1; ++k)
    if (first + k * step < b.rows) issue(first + k * step, k);
  const float scale = grad_scale(b);  // read once: written before this kernel, if on the device
  if (first < b.rows) p.prefetch(b, first);
  int it = 0, cur = 0, next_buf = nbuf - 1;  // it % nbuf and (it + nbuf - 1) % nbuf
  for (int64_t r = first; r < b.rows; r += step, ++it, cur = cur + 1 == nbuf ? 0 : cur + 1,
               next_buf = next_buf + 1 == nbuf ? 0 : next_buf + 1) {
    const int64_t ahead = r + int64_t(nbuf - 1) * step;
    if (!halves) {
      if (ahead < b.rows) issue(ahead, next_buf);  // the buffer row i-1 used, released below
    } else {  // the first half was asked for by the previous row's gradient pass, but for the first row
      if (it == 0) issue_bytes(r, 0, 0, h0_bytes, 0);
      issue_bytes(r, 0, h0_bytes, seg_bytes - h0_bytes, 1);
    }
    auto wait_bar = [&](int i) {
      asm volatile(
          "{\n .reg .pred done;\n WAIT_%=:\n mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
          " @!done bra WAIT_%=;\n}" ::"r"(smem_u32(&bars[i])),
          "r"((phases >> i) & 1u)
          : "memory");
      phases ^= 1u << i;
    };
    if (seg_bytes) {
      wait_bar(cur);
      if (halves) wait_bar(1);
    }
    T* const buf = base + cur * seg;
    const T* row = static_cast<const T*>(b.logits) + r * b.stride;
    if (tail) {  // uniform across the CTA
      if (int(threadIdx.x) < tail) buf[n - tail + threadIdx.x] = row[c0 + n - tail + threadIdx.x];
      __syncthreads();
    }
    p.begin_row(b, r, row);  // before the cluster barrier that precedes any gradient store
    // The segment's maximum first: the policies' transforms are monotone (softcap's is clamped to it), so
    // every thread's softmax state starts at the CTA's transformed maximum and stays there, and the CTA's
    // merge is a plain sum. (A NaN maximum, all values NaN, stays NaN, as do the sums.)
    const float mt = p.transform_max(cta_max(buf, int(n), nt, maxes));
    Online on;
    float aux = 0.0f;
    if (p.plain_sum()) {  // uniform
      on.m = mt;
      if (mt != -INFINITY) {  // else every value is -inf: nothing to add
        SumExp se{0.0f, mt * kLog2e};
        seg_for(buf, int(n), nt, true, se);
        on.s = se.s;
      }
    } else {
      auto acc = p.acc();
      p.start_at(acc, mt);
      seg_for(buf, int(n), nt, true, acc);
      p.fold(acc, on, aux);
    }
    const int slot = it & 1;
    {
      float4 x = make_float4(on.s, on.t, aux, 0.0f);
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        x.x += __shfl_xor_sync(0xffffffffu, x.x, o);
        x.y += __shfl_xor_sync(0xffffffffu, x.y, o);
        x.z += __shfl_xor_sync(0xffffffffu, x.z, o);
      }
      if ((threadIdx.x & 31) == 0) sums[threadIdx.x >> 5] = x;
      __syncthreads();
      if (threadIdx.x < 32) {
        x = int(threadIdx.x) < nt / 32 ? sums[threadIdx.x] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
          x.x += __shfl_xor_sync(0xffffffffu, x.x, o);
          x.y += __shfl_xor_sync(0xffffffffu, x.y, o);
          x.z += __shfl_xor_sync(0xffffffffu, x.z, o);
        }
        if (threadIdx.x == 0) {
          Online c;
          c.m = mt;
          c.s = x.x;
          c.t = x.y;
          state[slot] = c;
          state_aux[slot] = x.z;
        }
      }
    }
    cluster_barrier_t0();
    if (threadIdx.x < 32) {
      Online o;
      float a = 0.0f;
      if (int(threadIdx.x) < cs) {
        o = *cl.map_shared_rank(&state[slot], int(threadIdx.x));
        a = *cl.map_shared_rank(&state_aux[slot], int(threadIdx.x));
      }
      // A butterfly over the cs lanes that hold a state (lanes past them hold none): every lane merges in
      // the same order.
      for (int m = 1; m < cs; m <<= 1) {
        o.merge(shfl_xor(o, m));
        a += __shfl_xor_sync(0xffffffffu, a, m);
      }
      if (threadIdx.x == 0) {
        *merged = o;
        merged_aux = a;
      }
    }
    __syncthreads();
    on = *merged;
    aux = merged_aux;
    if (rank == 0 && threadIdx.x == 0) p.finish(b, r, row, on, aux);
    if (r + step < b.rows) p.prefetch(b, r + step);  // the next row's side data, in flight during pass 2
    auto gr = p.template grad<G>(static_cast<G*>(b.grad) + r * b.grad_stride + c0, on, aux, scale, c0, n);
    if (halves) {
      seg_part(buf, 0, hv, nt, gvec, gr);
      __syncthreads();  // every thread is past the first half: the next row's may come in
      if (r + step < b.rows) issue_bytes(r + step, 0, 0, h0_bytes, 0);
      seg_part(buf, hv, int(n), nt, gvec, gr);
    } else {
      seg_for(buf, int(n), nt, gvec, gr);
    }
    __syncthreads();  // the buffer and `merged` are rewritten two rows on / by the next row
  }
  cl.sync();  // no CTA leaves while a peer may still read its state
#endif
}

int device_sm_count_and_arch(int* major) {
  static int sms = 0, maj = 0;
  if (sms == 0) {
    int dev = 0;
    RT_CUDA_CHECK(cudaGetDevice(&dev));
    RT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    RT_CUDA_CHECK(cudaDeviceGetAttribute(&maj, cudaDevAttrComputeCapabilityMajor, dev));
  }
  *major = maj;
  return sms;
}

// Runs policy p over the rows: on Hopper with a gradient to write, the cluster kernel keeps each row in
// shared memory (when it fits in at most kMaxCluster segments); otherwise the two-pass kernel.
template <class P>
void launch_rows(const RowBlock& b, P p, void* stream, const char* what) {
  if (b.rows == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  dispatch(b.dtype, b.grad ? b.grad_dtype : DType::F32, what, [&]<typename T, typename G>() {
    const bool vec = vec_rows_ok(b.logits, b.stride, sizeof(T));  // every row aligned: the cluster path
    const bool gvec = !b.grad || vec_rows_ok(b.grad, b.grad_stride, sizeof(G));
    int major = 0;
    (void)device_sm_count_and_arch(&major);
    const int64_t row_bytes = b.V * int64_t(sizeof(T));
    const int cs = int((row_bytes + kSegmentBytes - 1) / kSegmentBytes);
    bool launched = false;
    if (b.grad && vec && major >= 9 && cs <= kMaxCluster) {
      // Segments are whole 8-element vectors so every CTA's slice stays 16-byte aligned.
      const int64_t seg = ((b.V + cs - 1) / cs + 7) / 8 * 8;
      // Three buffers when they fit (two rows streaming in while one is used). Else, for rows of three or
      // more segments, two CTAs of 512 threads per SM with one buffer each, so that one CTA computes while
      // the other waits for its copy or at a barrier, as in the distillation kernel (bench/HISTORY.md,
      // session 16); else two buffers in one CTA per SM.
      const int nbuf = 3 * seg * int64_t(sizeof(T)) <= kSmemBudget ? 3 : cs >= 3 ? 1 : 2;
      const size_t smem = size_t(nbuf) * size_t(seg) * sizeof(T);
      const int threads = nbuf == 1 ? 512 : cluster_threads(seg / 8);
      auto kernel = rows_cluster_kernel<P, T, G>;
      cudaLaunchConfig_t cfg = {};
      cudaLaunchAttribute attr[1];
      attr[0].id = cudaLaunchAttributeClusterDimension;
      attr[0].val.clusterDim.x = cs;
      attr[0].val.clusterDim.y = 1;
      attr[0].val.clusterDim.z = 1;
      cfg.blockDim = dim3(threads);
      cfg.dynamicSmemBytes = smem;
      cfg.stream = s;
      cfg.attrs = attr;
      cfg.numAttrs = 1;
      cfg.gridDim = dim3(cs);
      // No cluster of this shape fits (another process's partition of the GPU, say): the two-pass kernel.
      int clusters = max_active_clusters(kernel, cfg, cs);
      if (clusters > 0) {
        clusters = int(std::min<int64_t>(b.rows, clusters));
        cfg.gridDim = dim3(clusters * cs);
        int64_t seg_arg = seg;
        int nbuf_arg = nbuf;
        bool gvec_arg = gvec;
        RT_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, b, p, seg_arg, nbuf_arg, gvec_arg));
        launched = true;
      }
    }
    if (!launched) {
      // 8-wide loads on any row; 8-wide gradient stores where the gradient rows line up with the logits.
      const bool gshift = grad_vec_ok(b.logits, b.stride, sizeof(T), b.grad, b.grad_stride, sizeof(G));
      rows_l2_kernel<P, T, G><<<grid_for(b.rows), kThreads, 0, s>>>(b, p, true, gshift);
    }
  });
  RT_CUDA_LAUNCH_CHECK(what);
}

}  // namespace

void cross_entropy_rows(const RowBlock& b, const CrossEntropyRows& o, int* err, void* stream) {
  check_block(b, "cross_entropy");
  RT_CHECK(o.softcap >= 0.0f && o.label_smoothing >= 0.0f && o.label_smoothing <= 1.0f,
           "cross_entropy: softcap must be >= 0 and label_smoothing in [0, 1]");
  CePolicy p{};
  p.o = o;
  p.inv_cap = o.softcap > 0.0f ? 1.0f / o.softcap : 0.0f;
  p.err = err;
  launch_rows(b, p, stream, "cross_entropy_rows");
}

void entropy_rows(const RowBlock& b, const EntropyRows& o, void* stream) {
  check_block(b, "entropy");
  RT_CHECK(o.temperature > 0.0f, "entropy: temperature must be > 0, got ", o.temperature);
  launch_rows(b, EntropyPolicy{1.0f / o.temperature}, stream, "entropy_rows");
}

}  // namespace retort::cuda
