// Device helpers shared by the row-loss kernels: typed 8-wide loads and stores, the online softmax state,
// and block-wide reductions. One CTA owns one row at a time; rows are visited grid-stride (persistent grid).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include "../../core/dtype.h"
#include "../../core/error.h"
#include "../cuda_internal.h"

namespace retort::cuda::rowk {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
#define RT_NEG_INF (-INFINITY)

template <typename T>
__device__ __forceinline__ float to_f(T v);
template <>
__device__ __forceinline__ float to_f<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <>
__device__ __forceinline__ float to_f<__half>(__half v) {
  return __half2float(v);
}

template <typename T>
__device__ __forceinline__ T from_f(float v);
template <>
__device__ __forceinline__ float from_f<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half from_f<__half>(float v) {
  return __float2half_rn(v);
}

// 2^x in one MUFU instruction (flush-to-zero: results below 2^-126 become 0, harmless for softmax terms).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// A cluster barrier after which a CTA's peers may read what its thread 0 stored to its shared memory before
// the barrier (and after which thread 0's earlier loads are done). cooperative_groups' cluster.sync() makes
// every thread's arrival a release, which on sm_90 waits for each thread's outstanding global stores (the
// previous row's gradient) before it arrives; here only warp 0 does, the other warps arrive relaxed.
// Warp-uniform: every thread of the CTA calls it.
__device__ __forceinline__ void cluster_barrier_t0() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (threadIdx.x < 32)
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
  else
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

// The raw bytes of 8 consecutive elements (16 bytes for 2-byte types, 32 for f32).
template <typename T>
struct Raw8 {
  uint4 v[sizeof(T) / 2];
};

// Loads 8 consecutive elements aligned to 8 elements: kGlobal from global memory through the read-only path,
// otherwise from shared memory with an explicit shared-space load (a generic load would cost more).
template <bool kGlobal, typename T>
__device__ __forceinline__ Raw8<T> load_raw8(const T* p) {
  Raw8<T> r;
  const uint4* q = reinterpret_cast<const uint4*>(p);
#pragma unroll
  for (int i = 0; i < int(sizeof(T) / 2); ++i) {
    if constexpr (kGlobal) {
      r.v[i] = __ldg(q + i);
    } else {
      uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(q + i));
      asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                   : "=r"(r.v[i].x), "=r"(r.v[i].y), "=r"(r.v[i].z), "=r"(r.v[i].w)
                   : "r"(a));
    }
  }
  return r;
}

// Plain global loads (ld.global, cached in L1): for data a kernel may read again soon, such as weight rows
// that several tokens share.
template <typename T>
__device__ __forceinline__ Raw8<T> load_raw8_plain(const T* p) {
  Raw8<T> r;
  const uint4* q = reinterpret_cast<const uint4*>(p);
#pragma unroll
  for (int i = 0; i < int(sizeof(T) / 2); ++i) r.v[i] = q[i];
  return r;
}

// Widens the 8 values from the register words, without taking an address (which can push the raw values of
// a batch of loads in flight to local memory): bf16 is the upper half of an f32.
template <typename T>
__device__ __forceinline__ void unpack8(const Raw8<T>& r, float (&x)[8]) {
  if constexpr (sizeof(T) == 4) {
    const unsigned w[8] = {r.v[0].x, r.v[0].y, r.v[0].z, r.v[0].w, r.v[1].x, r.v[1].y, r.v[1].z, r.v[1].w};
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = __uint_as_float(w[i]);
  } else {
    const unsigned w[4] = {r.v[0].x, r.v[0].y, r.v[0].z, r.v[0].w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (std::is_same_v<T, __nv_bfloat16>) {
        x[2 * i] = __uint_as_float(w[i] << 16);
        x[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
      } else {
        x[2 * i] = __half2float(__ushort_as_half(static_cast<unsigned short>(w[i] & 0xffffu)));
        x[2 * i + 1] = __half2float(__ushort_as_half(static_cast<unsigned short>(w[i] >> 16)));
      }
    }
  }
}

// The running maximum of a thread's share of a segment; 16-bit values two at a time in packed form (one
// instruction per pair). NaN is skipped as by fmaxf (a NaN then reaches the sums and the loss).
template <typename T>
struct SegMax {
  static constexpr bool kPacked = sizeof(T) == 2;
  using P = std::conditional_t<std::is_same_v<T, __nv_bfloat16>, __nv_bfloat162, __half2>;
  uint32_t a = kPacked ? (std::is_same_v<T, __nv_bfloat16> ? 0xff80ff80u : 0xfc00fc00u) : 0u, c = a;
  float f = -INFINITY;
  __device__ __forceinline__ static P as_p(uint32_t u) { return *reinterpret_cast<const P*>(&u); }
  __device__ __forceinline__ static uint32_t as_u(P p) { return *reinterpret_cast<const uint32_t*>(&p); }
  __device__ __forceinline__ void add(const Raw8<T>& r) {
    if constexpr (kPacked) {
      a = as_u(__hmax2(as_p(a), __hmax2(as_p(r.v[0].x), as_p(r.v[0].y))));
      c = as_u(__hmax2(as_p(c), __hmax2(as_p(r.v[0].z), as_p(r.v[0].w))));
    } else {
      float x[8];
      unpack8(r, x);
#pragma unroll
      for (int i = 0; i < 8; ++i) f = fmaxf(f, x[i]);
    }
  }
  __device__ __forceinline__ float get() const {
    if constexpr (kPacked) {
      const P m = __hmax2(as_p(a), as_p(c));
      return fmaxf(to_f<T>(m.x), to_f<T>(m.y));
    } else {
      return f;
    }
  }
};

template <bool kGlobal = true, typename T>
__device__ __forceinline__ void load8(const T* p, float (&x)[8]) {
  unpack8(load_raw8<kGlobal>(p), x);
}

// Streaming store: the gradient is not read again soon, so keep it from evicting logits still to be re-read.
template <typename T>
__device__ __forceinline__ void store8(T* p, const float (&x)[8]) {
  if constexpr (sizeof(T) == 4) {
    __stcs(reinterpret_cast<float4*>(p), make_float4(x[0], x[1], x[2], x[3]));
    __stcs(reinterpret_cast<float4*>(p) + 1, make_float4(x[4], x[5], x[6], x[7]));
  } else {
    uint4 u;
    T* h = reinterpret_cast<T*>(&u);
#pragma unroll
    for (int i = 0; i < 8; ++i) h[i] = from_f<T>(x[i]);
    __stcs(reinterpret_cast<uint4*>(p), u);
  }
}

// Visits n values at p: f.template apply<N>(j0, x) gets N consecutive values starting at column base + offset
// (N = 8 on the vector path, 1 on the scalar path). The vector path keeps U loads in flight per thread before
// using any. With `cache`, the raw values are also copied to cache[0..n) (shared memory) on the way.
template <int U, bool kGlobal = true, typename T, typename F>
__device__ __forceinline__ void for_row(const T* p, int64_t n, bool vec, F& f, int64_t base = 0,
                                        T* cache = nullptr) {
  if (vec) {
    // A row need not start 16-byte aligned (contiguous rows of V = 50,257): the values up to the first
    // aligned one go one by one, then 8-wide vectors, then the < 8 left (a row of stride 50,304 ends so).
    const int64_t head =
        std::min<int64_t>(n, int64_t((16 - reinterpret_cast<uintptr_t>(p) % 16) % 16 / sizeof(T)));
    for (int64_t j = threadIdx.x; j < head; j += blockDim.x) {
      T raw = p[j];
      if (cache) cache[j] = raw;
      float x[1] = {to_f<T>(raw)};
      f.template apply<1>(base + j, x);
    }
    const T* q = p + head;
    T* qc = cache ? cache + head : nullptr;
    const int64_t m = n - head, b0 = base + head;
    const int64_t nvec = m / 8;
    int64_t v = threadIdx.x;
    const int64_t step = blockDim.x;
    for (; v + (U - 1) * step < nvec; v += U * step) {
      Raw8<T> raw[U];
#pragma unroll
      for (int u = 0; u < U; ++u) raw[u] = load_raw8<kGlobal>(q + (v + u * step) * 8);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (qc) *reinterpret_cast<Raw8<T>*>(qc + (v + u * step) * 8) = raw[u];
        float x[8];
        unpack8(raw[u], x);
        f.template apply<8>(b0 + (v + u * step) * 8, x);
      }
    }
    for (; v < nvec; v += step) {
      Raw8<T> raw = load_raw8<kGlobal>(q + v * 8);
      if (qc) *reinterpret_cast<Raw8<T>*>(qc + v * 8) = raw;
      float x[8];
      unpack8(raw, x);
      f.template apply<8>(b0 + v * 8, x);
    }
    for (int64_t j = nvec * 8 + threadIdx.x; j < m; j += step) {
      T raw = q[j];
      if (qc) qc[j] = raw;
      float x[1] = {to_f<T>(raw)};
      f.template apply<1>(b0 + j, x);
    }
  } else {
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      T raw = p[j];
      if (cache) cache[j] = raw;
      float x[1] = {to_f<T>(raw)};
      f.template apply<1>(base + j, x);
    }
  }
}

// Online softmax state over a set of values: max m, s = Σ exp(x - m), t = Σ exp(x - m)·(x - m) (for entropy).
// t is kept relative to the running max, so E[x] - m = t / s stays precise when the values are large (1e4):
// an unshifted Σ e·x would cancel against the lse. Terms with exp(x - m) = 0 (x = -inf) add nothing to t.
struct Online {
  float m = RT_NEG_INF, s = 0.0f, t = 0.0f;

  template <int N, bool kT>
  __device__ __forceinline__ void add(const float* x) {
    float mx = m;
#pragma unroll
    for (int i = 0; i < N; ++i) mx = fmaxf(mx, x[i]);
    if (mx == RT_NEG_INF) return;  // all -inf so far: nothing to add
    if (mx != m) {
      float r = fast_exp2((m - mx) * kLog2e);  // m = -inf gives 0
      // Every x - m drops by mx - m: t' = r·(t + s·(m - mx)); nothing was added yet when s = 0 (m = -inf).
      if (kT) t = s > 0.0f ? r * fmaf(s, m - mx, t) : 0.0f;
      s *= r;
      m = mx;
    }
    [[maybe_unused]] const float ml = mx * kLog2e;
#pragma unroll
    for (int i = 0; i < N; ++i) {
      if constexpr (kT) {
        // x - mx first: with x near 1e4, rounding mx·log2(e) would cost 3e-4 of every term.
        const float d = x[i] - mx;
        const float e = fast_exp2(d * kLog2e);
        s += e;
        t += e > 0.0f ? e * d : 0.0f;
      } else {
        s += fast_exp2(fmaf(x[i], kLog2e, -ml));
      }
    }
  }

  __device__ __forceinline__ void merge(const Online& o) {
    float mx = fmaxf(m, o.m);
    if (mx == RT_NEG_INF) return;
    float a = exp2f((m - mx) * kLog2e), b = exp2f((o.m - mx) * kLog2e);
    // Both t move to the common max (a side with s = 0 has t = 0 and may have m = -inf).
    float ta = s > 0.0f ? fmaf(s, m - mx, t) : 0.0f, tb = o.s > 0.0f ? fmaf(o.s, o.m - mx, o.t) : 0.0f;
    s = s * a + o.s * b;
    t = ta * a + tb * b;
    m = mx;
  }
  __device__ __forceinline__ float lse() const {
    return m + logf(s);
  }
};

__device__ __forceinline__ Online shfl_xor(const Online& v, int lane_mask) {
  Online o;
  o.m = __shfl_xor_sync(0xffffffffu, v.m, lane_mask);
  o.s = __shfl_xor_sync(0xffffffffu, v.s, lane_mask);
  o.t = __shfl_xor_sync(0xffffffffu, v.t, lane_mask);
  return o;
}

// Block-wide merge of Online states; every thread gets the result. `scratch` holds 32 entries.
__device__ __forceinline__ Online block_merge(Online v, Online* scratch) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v.merge(shfl_xor(v, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nwarps = (blockDim.x + 31) / 32;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  Online r = lane < nwarps ? scratch[lane] : Online{};
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) r.merge(shfl_xor(r, o));
  __syncthreads();  // scratch may be reused right after
  return r;
}

// Block-wide sum (fixed order: deterministic); every thread gets the result.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nwarps = (blockDim.x + 31) / 32;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float r = lane < nwarps ? scratch[lane] : 0.0f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) r += __shfl_xor_sync(0xffffffffu, r, o);
  __syncthreads();
  return r;
}

// CTA-wide maxima of N values per thread (nw warps, at most 32; NaN skipped, as by fmaxf): every thread gets
// them. red holds 32 entries.
template <int N>
__device__ __forceinline__ void block_max(float (&m)[N], float (&red)[32][N], int nw) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m[i] = fmaxf(m[i], __shfl_xor_sync(0xffffffffu, m[i], o));
  const int lane = int(threadIdx.x & 31);
  if (lane == 0)
#pragma unroll
    for (int i = 0; i < N; ++i) red[threadIdx.x >> 5][i] = m[i];
  __syncthreads();
#pragma unroll
  for (int i = 0; i < N; ++i) {
    m[i] = lane < nw ? red[lane][i] : -INFINITY;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m[i] = fmaxf(m[i], __shfl_xor_sync(0xffffffffu, m[i], o));
  }
}

// CTA-wide maximum of buf[0, n) (shared memory, 16-byte aligned; nt threads, a multiple of 32): every
// thread gets it.
template <typename T>
__device__ __forceinline__ float cta_max(const T* buf, int n, int nt, float (&red)[32][1]) {
  const int nv = n / 8;
  SegMax<T> acc;
  for (int k = int(threadIdx.x); k < nv; k += nt) acc.add(load_raw8<false>(buf + k * 8));
  float m[1] = {acc.get()};
  for (int j = nv * 8 + int(threadIdx.x); j < n; j += nt) m[0] = fmaxf(m[0], to_f<T>(buf[j]));
  block_max(m, red, nt / 32);
  return m[0];
}

__device__ __forceinline__ int64_t load_index(const void* p, bool is_i64, int64_t i) {
  return is_i64 ? static_cast<const int64_t*>(p)[i] : int64_t(static_cast<const int32_t*>(p)[i]);
}

// Whether rows of v elements at p (element size elsize, stride elements apart) can be read as aligned 8-wide
// vectors.
inline bool vec_ok(const void* p, int64_t v, int64_t stride, size_t elsize) {
  return v % 8 == 0 && stride % 8 == 0 && (reinterpret_cast<uintptr_t>(p) % (8 * elsize)) == 0;
}
// Every row starts 16-byte aligned (the cluster kernels' bulk copies need it); the length may be any.
inline bool vec_rows_ok(const void* p, int64_t stride, size_t elsize) {
  return stride % 8 == 0 && (reinterpret_cast<uintptr_t>(p) % (8 * elsize)) == 0;
}
// for_row's vector path takes any row (a scalar head up to 16-byte alignment, computed from the logits
// row); the gradient functors' 8-wide stores then need each gradient row to share its logits row's
// alignment: both aligned, or the same element size and stride and base addresses 16 bytes apart.
inline bool grad_vec_ok(const void* logits, int64_t stride, size_t elsize, const void* grad, int64_t gstride,
                        size_t gsize) {
  if (!grad) return true;
  if (vec_rows_ok(logits, stride, elsize) && vec_rows_ok(grad, gstride, gsize)) return true;
  return elsize == gsize && stride == gstride &&
         (reinterpret_cast<uintptr_t>(grad) - reinterpret_cast<uintptr_t>(logits)) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(logits) % elsize == 0;
}

// The grid of the two-pass row kernels (one row per 512-thread CTA at a time): two CTAs per SM keep enough
// loads in flight; more rows are visited grid-stride.
inline int grid_for(int64_t rows) {
  static const int sms = [] {
    int dev = 0, n = 0;
    RT_CUDA_CHECK(cudaGetDevice(&dev));
    RT_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    return n > 0 ? n : 80;
  }();
  return int(std::min<int64_t>(rows, int64_t(sms) * 2));
}

// Host side: calls f.template operator()<T, G>() for the logits dtype t and the gradient dtype g (f32, bf16
// or f16 each); any other dtype throws retort::Error naming op.
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

// Host side: the most clusters of cfg's shape that fit on the device at once, with the kernel's dynamic
// shared memory limit raised to cfg.dynamicSmemBytes first. Both calls cost host time on every launch (and
// the GPU waits for it when nothing is queued ahead), so the count is kept per kernel, shared memory size,
// cluster size, block size and device. The limit is a property of the kernel, not of the launch: it only
// ever grows (to the largest size asked for on that device), so a launch with a size seen before still fits
// after one with a smaller size set the limit.
template <typename Kernel>
int max_active_clusters(Kernel kernel, const cudaLaunchConfig_t& cfg, int cluster_size) {
  static std::mutex mu;
  static std::map<std::tuple<const void*, size_t, int, int, unsigned>, int> known;
  static std::map<std::pair<const void*, int>, size_t> limit;  // (kernel, device) -> the limit set
  int dev = 0;
  RT_CUDA_CHECK(cudaGetDevice(&dev));
  const void* fn = reinterpret_cast<const void*>(kernel);
  const auto key = std::make_tuple(fn, cfg.dynamicSmemBytes, cluster_size, dev, cfg.blockDim.x);
  std::lock_guard<std::mutex> lock(mu);
  size_t& lim = limit[{fn, dev}];
  if (cfg.dynamicSmemBytes > lim) {
    RT_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(cfg.dynamicSmemBytes)));
    lim = cfg.dynamicSmemBytes;
  }
  auto it = known.find(key);
  if (it == known.end()) {
    int clusters = 0;
    RT_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg));
    it = known.emplace(key, clusters).first;
  }
  return it->second;
}

}  // namespace retort::cuda::rowk
