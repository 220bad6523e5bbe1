// topk_logprobs on the device: the K largest entries of each row of logits [N, V] as log-softmax values with
// their ids, best first, equal values by smaller id (the CPU's order: the ids agree exactly). One block per
// row.
//
// The common case reads the row once. Each thread streams its share (16-byte loads where the row allows)
// and keeps an online max and sum of exp, and its own best kT entries in registers. The block then finds L,
// the K-th largest of all kept entries, by a radix select on the order-preserving bit pattern of the values
// (8 bits a pass, histograms in shared memory). A thread that dropped entries dropped only entries no larger
// than its own kT-th; when that is below L for every thread, nothing dropped can be in the top K, so the kept
// entries >= L hold the top K exactly, and a bitonic sort of them in shared memory ends the row. Otherwise
// (a thread read more than kT of the best: a sorted row, peaks one thread reads) a second pass collects the
// row's entries >= L; only when those overflow the shared buffer (many equal values) does the block select
// the K-th value over the whole row, in passes from L2 or memory, and take the equal ones in id order.
//
// A NaN or +inf logit is recorded in the device error record (the row), reported at the next synchronize.
// The fused teacher head (fused_linear_topk_logprobs) runs the same kernel on its chunks (topk_rows.h), with
// the row's log-sum-exp and its target's nll written from the same pass.
#include <algorithm>
#include <cfloat>
#include <type_traits>

#include "cuda_common.cuh"
#include "loss/row_common.cuh"
#include "topk_rows.h"

namespace retort::cuda {

namespace {

using rowk::to_f;

constexpr int kMaxK = int(kTopKRowsMaxK);  // the shared candidate buffer and the kept lists are sized for it
constexpr int kMaxThreads = 512;

// The order-preserving key of a value: a larger value has a larger key. -0 takes +0's key: they are equal
// values, ordered by id as on the CPU. Key 0 (a NaN's) marks an empty slot.
__device__ __forceinline__ uint32_t order_key(float v) {
  uint32_t b = __float_as_uint(v);
  if (b == 0x80000000u) b = 0;
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float key_value(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}
// A candidate as one word that sorts like the output: the key, then the inverted id (the smaller id wins).
__device__ __forceinline__ uint64_t pack(uint32_t key, int id) {
  return (uint64_t(key) << 32) | uint64_t(~uint32_t(id));
}

// The 16 / sizeof(T) values of a 16-byte word.
template <typename T>
__device__ __forceinline__ void unpack(const uint4& u, float* v) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    if constexpr (sizeof(T) == 4) {
      v[q] = __uint_as_float(w[q]);
    } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      v[2 * q] = __uint_as_float(w[q] << 16);
      v[2 * q + 1] = __uint_as_float(w[q] & 0xffff0000u);
    } else {
      v[2 * q] = __half2float(__ushort_as_half((unsigned short)(w[q] & 0xffffu)));
      v[2 * q + 1] = __half2float(__ushort_as_half((unsigned short)(w[q] >> 16)));
    }
  }
}

// One row as the block reads it: 16-byte loads from `head` on when its elements are contiguous.
struct Row {
  const char* p;
  int64_t nb0;
  int V, head;
  bool vec;
};

template <typename T>
__device__ __forceinline__ Row make_row(const TDesc& x, int64_t r) {
  Row row;
  row.p = row_at(x, r);
  row.nb0 = x.nb[0];
  row.V = int(x.ne[0]);
  const int mis = int(reinterpret_cast<uintptr_t>(row.p) % 16);
  row.vec = x.nb[0] == int64_t(sizeof(T)) && mis % int(sizeof(T)) == 0;
  const int head = (16 - mis) % 16 / int(sizeof(T));
  row.head = row.vec ? (head < row.V ? head : row.V) : 0;
  return row;
}

template <typename T>
__device__ __forceinline__ float load_at(const Row& row, int j) {
  return to_f(*reinterpret_cast<const T*>(row.p + j * row.nb0));
}

// Calls fn(v, n, id) for runs of n values with ids id, id + 1, ...; each thread sees its ids in rising order.
template <typename T, typename Fn>
__device__ __forceinline__ void visit_row(const Row& row, Fn&& fn) {
  const int bd = blockDim.x;
  if (!row.vec) {
    for (int j = threadIdx.x; j < row.V; j += bd) {
      const float v = load_at<T>(row, j);
      fn(&v, 1, j);
    }
    return;
  }
  constexpr int kPer = 16 / sizeof(T);
  if (int(threadIdx.x) < row.head) {
    const float v = load_at<T>(row, threadIdx.x);
    fn(&v, 1, int(threadIdx.x));
  }
  const uint4* pv = reinterpret_cast<const uint4*>(row.p + row.head * sizeof(T));
  const int nvec = (row.V - row.head) / kPer;
  int i = threadIdx.x;
  // Four loads in flight per thread before any is used, so the memory system sees enough bytes per SM.
  for (; i + 3 * bd < nvec; i += 4 * bd) {
    uint4 u[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) u[q] = pv[i + q * bd];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      float v[kPer];
      unpack<T>(u[q], v);
      fn(v, kPer, row.head + (i + q * bd) * kPer);
    }
  }
  for (; i < nvec; i += bd) {
    float v[kPer];
    unpack<T>(pv[i], v);
    fn(v, kPer, row.head + i * kPer);
  }
  for (int j = row.head + nvec * kPer + threadIdx.x; j < row.V; j += bd) {
    const float v = load_at<T>(row, j);
    fn(&v, 1, j);
  }
}

// Calls fn(key, valid) the same number of times in every thread (whole warps, for __match_any_sync), once
// for each element of the row.
template <typename T, typename Fn>
__device__ __forceinline__ void visit_row_uniform(const Row& row, Fn&& fn) {
  for (int j0 = 0; j0 < row.V; j0 += blockDim.x) {
    const int j = j0 + threadIdx.x;
    const bool ok = j < row.V;
    fn(ok ? order_key(load_at<T>(row, j)) : 0u, ok, j);
  }
}

// A thread's best kT entries, best first (key 0: empty), and how many entries it has read.
template <int kT>
struct Kept {
  uint32_t key[kT];
  int id[kT];
  int seen;
};

template <int kT>
__device__ __forceinline__ void keep(Kept<kT>& s, uint32_t key, int id) {
  if (key <= s.key[kT - 1]) return;
#pragma unroll
  for (int i = kT - 1; i > 0; --i) {
    if (key > s.key[i - 1]) {
      s.key[i] = s.key[i - 1];
      s.id[i] = s.id[i - 1];
    } else if (key > s.key[i]) {
      s.key[i] = key;
      s.id[i] = id;
    }
  }
  if (key > s.key[0]) {
    s.key[0] = key;
    s.id[0] = id;
  }
}

// The first pass over n values: the online (max, sum of exp), and the kept list. The max starts at -FLT_MAX,
// not -inf, so every value adds a term without a branch: -inf adds 0, a NaN makes the sum NaN and +inf the
// max +inf (the checks after the pass), and a row of -inf only ends with the sum 0. The terms use the
// flush-to-zero exp2: one below 2^-126 cannot change a sum that holds the max's 1.
template <int kT>
__device__ __forceinline__ void scan_values(MaxSum& ms, Kept<kT>& kp, const float* v, int n, int id) {
  float lm = v[0];
#pragma unroll
  for (int q = 1; q < n; ++q) lm = fmaxf(lm, v[q]);
  if (lm > ms.m) {
    ms.s *= rowk::fast_exp2((ms.m - lm) * rowk::kLog2e);
    ms.m = lm;
  }
#pragma unroll
  for (int q = 0; q < n; ++q) ms.s += rowk::fast_exp2((v[q] - ms.m) * rowk::kLog2e);
  kp.seen += n;
  if (order_key(lm) > kp.key[kT - 1]) {
#pragma unroll
    for (int q = 0; q < n; ++q) keep(kp, order_key(v[q]), id + q);
  }
}

struct Selected {
  uint32_t key;  // the k-th largest key
  int take;      // how many of the entries equal to it are among the k largest
  bool found;    // false: fewer than k entries were offered
};

// The k-th largest of the keys the block offers: offer(add) calls add(key, valid, id) the same number of
// times in every thread. Radix select, 8 bits a pass from the top; equal bins within a warp are added once
// (__match_any_sync), since the best entries of a row share their high bits. hist: 256 words of shared
// memory; sh: 2 ints.
template <typename Offer>
__device__ Selected block_select(int k, Offer&& offer, uint32_t* hist, int* sh) {
  uint32_t prefix = 0, mask = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
    __syncthreads();
    offer([&](uint32_t key, bool valid, int) {
      const bool in = valid && (key & mask) == prefix;
      const int bin = in ? int((key >> shift) & 0xffu) : -1;
      const unsigned peers = __match_any_sync(0xffffffffu, bin);
      if (in && int(threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&hist[bin], uint32_t(__popc(peers)));
    });
    __syncthreads();
    if (threadIdx.x < 32) {  // warp 0: the bin that holds the k-th largest, lane l owning bins 255-8l down
      const int lane = threadIdx.x;
      uint32_t c[8], sum = 0;
#pragma unroll
      for (int q = 0; q < 8; ++q) {
        c[q] = hist[255 - 8 * lane - q];
        sum += c[q];
      }
      uint32_t incl = sum;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const uint32_t x = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += x;
      }
      const unsigned hit = __ballot_sync(0xffffffffu, incl >= uint32_t(k));
      if (hit == 0) {
        if (lane == 0) sh[0] = -1;
      } else if (lane == __ffs(hit) - 1) {
        uint32_t run = incl - sum;
        for (int q = 0; q < 8; ++q) {
          if (run + c[q] >= uint32_t(k)) {
            sh[0] = 255 - 8 * lane - q;
            sh[1] = k - int(run);
            break;
          }
          run += c[q];
        }
      }
    }
    __syncthreads();
    const int d = sh[0];
    if (d < 0) return {0u, 0, false};
    k = sh[1];
    prefix |= uint32_t(d) << shift;
    mask |= 0xffu << shift;
  }
  return {prefix, k, true};
}

// Adds e to the candidates unless they already overflow (then the exact path runs and the rest is moot).
__device__ __forceinline__ void append(uint64_t* buf, int cap, int* count, uint64_t e) {
  if (*reinterpret_cast<volatile int*>(count) > cap) return;
  const int p = atomicAdd(count, 1);
  if (p < cap) buf[p] = e;
}

// Bitonic sort of buf[0, n) into descending order; n a power of two.
__device__ void sort_desc(uint64_t* buf, int n) {
  for (int size = 2; size <= n; size <<= 1)
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int j = i ^ stride;
        if (j > i) {
          const uint64_t a = buf[i], b = buf[j];
          if ((i & size) == 0 ? a < b : a > b) {
            buf[i] = b;
            buf[j] = a;
          }
        }
      }
      __syncthreads();
    }
}

// The exact top K into buf[0, K): every entry above the K-th key s.key, and the first s.take entries equal
// to it in id order (a block-wide prefix count of the equal ones, tile by tile).
template <typename T>
__device__ void collect_exact(const Row& row, const Selected& s, int K, uint64_t* buf, int* count,
                              int* warp_counts, int* base) {
  const int above = K - s.take;
  if (threadIdx.x == 0) *count = *base = 0;
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  visit_row_uniform<T>(row, [&](uint32_t key, bool ok, int j) {
    if (ok && key > s.key) {
      const int p = atomicAdd(count, 1);
      if (p < above) buf[p] = pack(key, j);
    }
    const bool eq = ok && key == s.key;
    const unsigned b = __ballot_sync(0xffffffffu, eq);
    if (lane == 0) warp_counts[warp] = __popc(b);
    __syncthreads();
    int before = *base + __popc(b & ((1u << lane) - 1u)), total = 0;
    for (int w = 0; w < nw; ++w) {
      if (w < warp) before += warp_counts[w];
      total += warp_counts[w];
    }
    if (eq && before < s.take) buf[above + before] = pack(key, j);
    __syncthreads();  // every thread has read base and warp_counts of this tile
    if (threadIdx.x == 0) *base += total;
  });
  __syncthreads();
}

struct Args {
  TDesc x;  // logits [N, V]
  float* lp;
  int32_t* ids;  // both [N, K], contiguous
  int K, cap;    // cap: candidates the shared buffer holds (a power of two >= K)
  DeviceError* err;
  Op op;
  long long row0;
  float* lse;  // [N] or null
  float* nll;  // [N] or null (then labels are not read)
  const char* labels;
  bool labels64;
  long long label_stride, ignore;
};

template <typename T, int kT>
__global__ __launch_bounds__(kMaxThreads) void topk_logprobs_kernel(Args a) {
  extern __shared__ uint64_t buf[];  // a.cap candidates
  __shared__ uint32_t hist[256];
  __shared__ MaxSum sh_ms[32];
  __shared__ int warp_counts[32];
  __shared__ int sh[4];  // 0, 1: block_select's answer; 2: candidates; 3: equal entries taken so far
  const int64_t N = a.x.ne[1];
  const int K = a.K;
  for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
    const Row row = make_row<T>(a.x, r);
    MaxSum ms{-FLT_MAX, 0.0f};
    Kept<kT> kp;
#pragma unroll
    for (int i = 0; i < kT; ++i) kp.key[i] = 0, kp.id[i] = 0;
    kp.seen = 0;
    visit_row<T>(row, [&](const float* v, int n, int id) { scan_values(ms, kp, v, n, id); });
    const bool bad = ms.s != ms.s || ms.m == INFINITY;  // a NaN or +inf among this thread's values
    ms = block_maxsum(ms, sh_ms);
    if (__syncthreads_or(bad) && threadIdx.x == 0) report_error(a.err, a.op, kErrNotFinite, a.row0 + r, 0);

    // L: the K-th largest kept entry, a lower bound of the row's K-th largest.
    const Selected lo = block_select(
        K,
        [&](auto add) {
#pragma unroll
          for (int i = 0; i < kT; ++i) add(kp.key[i], kp.key[i] != 0u, kp.id[i]);
        },
        hist, sh);
    const uint32_t L = lo.found ? lo.key : 0u;
    const bool lost = kp.seen > kT && kp.key[kT - 1] >= L;  // it may have dropped an entry >= L
    if (threadIdx.x == 0) sh[2] = 0;
    const bool again = __syncthreads_or(!lo.found || lost);
    if (!again) {
#pragma unroll
      for (int i = 0; i < kT; ++i)
        if (kp.key[i] != 0u && kp.key[i] >= L) append(buf, a.cap, &sh[2], pack(kp.key[i], kp.id[i]));
    } else {
      visit_row<T>(row, [&](const float* v, int n, int id) {
        for (int q = 0; q < n; ++q) {
          const uint32_t key = order_key(v[q]);
          if (key >= L) append(buf, a.cap, &sh[2], pack(key, id + q));
        }
      });
    }
    __syncthreads();
    int m = sh[2];
    if (m > a.cap) {  // many entries equal to L: select the K-th exactly over the row
      const Selected s = block_select(
          K, [&](auto add) { visit_row_uniform<T>(row, add); }, hist, sh);
      collect_exact<T>(row, s, K, buf, &sh[2], warp_counts, &sh[3]);
      m = K;
    }
    int n = 1;
    while (n < m) n <<= 1;
    for (int i = m + threadIdx.x; i < n; i += blockDim.x) buf[i] = 0;
    __syncthreads();
    sort_desc(buf, n);

    const float log_s = logf(ms.s);  // ms.s >= 1 (the max's own term) unless the row is -inf only
    for (int k = threadIdx.x; k < K; k += blockDim.x) {
      const uint64_t e = buf[k];
      const float v = key_value(uint32_t(e >> 32));
      // A row of -inf only has no distribution: every slot reads as padding (-inf), as on the CPU.
      // fminf: the approximate exp may leave the best entry's logprob an ulp above 0; it never is.
      a.lp[r * K + k] = ms.s == 0.0f ? -INFINITY : fminf((v - ms.m) - log_s, 0.0f);
      a.ids[r * K + k] = int32_t(~uint32_t(e));
    }
    if (threadIdx.x == 0 && (a.lse || a.nll)) {
      // One more load for the target's logit, from L2: the row was just read.
      const float lse = ms.s == 0.0f ? -INFINITY : ms.m + log_s;
      if (a.lse) a.lse[r] = lse;
      if (a.nll) {
        const char* yp = a.labels + r * a.label_stride;
        const long long y =
            a.labels64 ? *reinterpret_cast<const long long*>(yp) : *reinterpret_cast<const int*>(yp);
        const bool counts = y != a.ignore && y >= 0 && y < row.V;
        // (m − z_y) + log Σ: shifted by the max, so that logits of 1e4 keep their precision.
        a.nll[r] = !counts ? 0.0f : ms.s == 0.0f ? INFINITY : (ms.m - load_at<T>(row, int(y))) + log_s;
      }
    }
    __syncthreads();  // buf and sh are the next row's
  }
}

int pow2_at_least(int64_t n) {
  int p = 1;
  while (p < n) p <<= 1;
  return p;
}

template <typename T>
void launch(CudaExec& ex, const Args& a, int64_t rows, int threads, int kt) {
  if (rows == 0) return;
  const size_t smem = size_t(a.cap) * sizeof(uint64_t);
  const unsigned grid = row_grid(rows);
  switch (kt) {
    case 4:
      topk_logprobs_kernel<T, 4><<<grid, threads, smem, ex.stream>>>(a);
      break;
    case 8:
      topk_logprobs_kernel<T, 8><<<grid, threads, smem, ex.stream>>>(a);
      break;
    default:
      topk_logprobs_kernel<T, 16><<<grid, threads, smem, ex.stream>>>(a);
      break;
  }
  RT_CUDA_LAUNCH_CHECK("topk_logprobs_kernel");
}

// Fills in the launch shape and the error record, and launches for a.x's dtype.
void launch_rows(CudaExec& ex, Args a) {
  const int64_t V = a.x.ne[0], N = a.x.ne[1], K = a.K;
  // 512 threads keep two blocks per SM, so one block's select and sort overlap another's loads; a thread
  // keeps enough entries that more than kT of the top K landing in one thread (the second pass) is rare.
  const int threads = V >= 4096 ? kMaxThreads : std::clamp(pow2_at_least((V + 7) / 8), 32, kMaxThreads);
  const int kt = K * 8 <= threads ? 4 : K * 2 <= threads ? 8 : 16;
  a.cap = std::max(1024, 2 * pow2_at_least(K));
  a.err = ex.dev_error;
  switch (a.x.dtype) {
    case DType::F32:
      launch<float>(ex, a, N, threads, kt);
      break;
    case DType::BF16:
      launch<__nv_bfloat16>(ex, a, N, threads, kt);
      break;
    default:
      launch<__half>(ex, a, N, threads, kt);
      break;
  }
}

void topk_logprobs_l(CudaExec& ex, Tensor* t) {
  const Tensor* x = t->src[0];
  const Tensor* ids = t->aux[0];
  const int64_t V = x->ne[0], N = x->ne[1], K = t->ip[0];
  RT_CHECK(is_float(x->dtype) && x->ne[2] == 1 && x->ne[3] == 1 && ids && ids->dtype == DType::I32 &&
               K >= 1 && K <= V && t->ne[0] == K && t->ne[1] == N && t->is_contiguous() &&
               ids->is_contiguous() && same_shape(t, ids),
           "cuda topk_logprobs: unexpected node ", t->describe(), " for logits ", x->describe());
  RT_CHECK(K <= kMaxK, "topk_logprobs: K = ", K, " is more than the CUDA kernel selects (at most ", kMaxK,
           "; logits ", x->describe(), ")");
  RT_CHECK(V < 0x7fffffffLL, "topk_logprobs: V = ", V, " is too large for the CUDA kernel (logits ",
           x->describe(), ")");
  Args a{};
  a.x = desc(x);
  a.lp = static_cast<float*>(t->data);
  a.ids = static_cast<int32_t*>(ids->data);
  a.K = int(K);
  a.op = Op::TopKLogprobs;
  launch_rows(ex, a);
}

}  // namespace

void topk_rows(CudaExec& ex, const TopKRowsArgs& r) {
  const char* op = op_name(r.op);
  RT_CHECK(r.K >= 1 && r.K <= r.V, op, ": K = ", r.K, " must be in [1, V] with V = ", r.V);
  RT_CHECK(r.K <= kMaxK, op, ": K = ", r.K, " is more than the CUDA kernel selects (at most ", kMaxK,
           "; V = ", r.V, ")");
  RT_CHECK(r.V < 0x7fffffffLL, op, ": V = ", r.V, " is too large for the CUDA kernel");
  RT_CHECK(is_float(r.dtype) && (!r.nll || is_int(r.label_dtype)), op, ": unexpected row pass dtypes");
  if (r.rows == 0) return;
  Args a{};
  a.x.data = static_cast<char*>(const_cast<void*>(r.logits));
  a.x.dtype = r.dtype;
  a.x.ne[0] = r.V, a.x.ne[1] = r.rows, a.x.ne[2] = a.x.ne[3] = 1;
  a.x.nb[0] = int64_t(dtype_size(r.dtype));
  a.x.nb[1] = r.row_stride;
  a.x.nb[2] = a.x.nb[3] = r.row_stride * r.rows;
  a.lp = r.logprobs;
  a.ids = r.ids;
  a.K = int(r.K);
  a.op = r.op;
  a.row0 = r.row0;
  a.lse = r.lse;
  a.nll = r.nll;
  a.labels = static_cast<const char*>(r.labels);
  a.labels64 = r.label_dtype == DType::I64;
  a.label_stride = r.label_stride;
  a.ignore = r.ignore_index;
  launch_rows(ex, a);
}

void register_cuda_topk_ops(CudaOpTable& t) {
  t[size_t(Op::TopKLogprobs)] = topk_logprobs_l;
}

}  // namespace retort::cuda
