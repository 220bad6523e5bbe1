// flash_attention's forward on Hopper (attention_sm90.h): one warpgroup per CTA owns 64 query rows of one
// head; per step it multiplies them with a tile of 128 keys (S = Q·Kᵀ, a wgmma reading both operands from
// shared memory), keeps the online softmax in registers, and adds P·V (a wgmma reading P from registers and
// V from shared memory, transposed by the instruction). K and V tiles stream in by cp.async into two stages,
// stored in the 128-byte swizzled layout the wgmma descriptors describe (D 64 in 16 bits is one 128-byte
// row), so a tile needs no transposition. Several CTAs share an SM, so one's softmax overlaps another's
// wgmmas. The math (base-2 exponentials, masking, the saved log-sum-exp) is cuda_attention.cu's.
#include "attention_sm90.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <mutex>

#include "cuda_internal.h"

namespace retort::cuda {

namespace {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define RT_SM90A 1
#endif

constexpr int kD = 64, kBM = 64, kBN = 128, kThreads = 128;
constexpr float kLog2e = 1.4426950408889634f;

struct Dims {
  int B, Tq, Tk, H, KV;
  int causal, n_past;
  float scale_log2;
};

__device__ __forceinline__ bool visible(const Dims& s, int query, int key) {
  return query < s.Tq && key < s.Tk && (!s.causal || key <= query + s.n_past);
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return uint32_t(__cvta_generic_to_shared(p));
}

#ifdef RT_SM90A

// A 128-byte swizzled tile (rows 128 bytes apart, 8-row groups 1024 bytes apart), as wgmma reads it. The
// leading byte offset is unused for a K-major operand (its rows hold all of K: softmax_chunk's 16); for the
// MN-major V (64 elements wide: one swizzle atom) 1024 names the 8-row groups along K under either reading.
__device__ __forceinline__ uint64_t desc_sw128(uint32_t addr, uint32_t lbo = 16) {
  uint64_t d = uint64_t((addr & 0x3FFFF) >> 4);
  d |= uint64_t(lbo >> 4) << 16;   // leading byte offset
  d |= uint64_t(1024 >> 4) << 32;  // stride byte offset: 8 rows of 128 bytes
  d |= uint64_t(1) << 62;          // 128-byte swizzle
  return d;
}

// rows × 64 16-bit values (row r at base + r·stride elements) into the swizzled tile at s: row r at s + 128 r,
// its 16-byte chunk c at chunk c ^ (r % 8); rows from `valid` on are zero-filled.
template <typename T>
__device__ __forceinline__ void load_tile(uint32_t s, const T* base, int64_t stride, int rows, int valid) {
  for (int i = threadIdx.x; i < rows * 8; i += kThreads) {
    const int r = i >> 3, c = i & 7;
    const bool in = r < valid;
    const T* src = in ? base + r * stride + c * 8 : base;  // a mapped address; nothing is read from it
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s + r * 128 + ((c ^ (r & 7)) << 4)),
                 "l"(src), "r"(in ? 16 : 0));
  }
}

template <typename T>
struct Wg;

// The wgmma forms used: S[64 × 128] (=)+ Q·Kᵀ with both operands in shared memory (K-major), and
// O[64 × 64] += P·V with P in registers and V in shared memory read transposed (its rows are the k index).
#define RT_WG_TYPES(TY)                                                                                        \
  static __device__ __forceinline__ void qk128(float (&d)[64], uint64_t a, uint64_t b, int acc) {             \
    asm volatile(                                                                                              \
        "{\n .reg .pred p;\n setp.ne.b32 p, %66, 0;\n"                                                         \
        "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,"    \
        "%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,"  \
        "%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,"  \
        "%62,%63}, %64, %65, p, 1, 1, 0, 0;\n}"                                                                 \
        : RT_D8(0), RT_D8(8), RT_D8(16), RT_D8(24), RT_D8(32), RT_D8(40), RT_D8(48), RT_D8(56)                 \
        : "l"(a), "l"(b), "r"(acc));                                                                           \
  }                                                                                                            \
  static __device__ __forceinline__ void pv64(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {            \
    asm volatile(                                                                                              \
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,"     \
        "%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, " \
        "%36, 1, 1, 1, 1;\n"                                                                                   \
        : RT_D8(0), RT_D8(8), RT_D8(16), RT_D8(24)                                                             \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));                                                 \
  }
#define RT_D8(i)                                                                              \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])

template <>
struct Wg<__nv_bfloat16> {
  RT_WG_TYPES("bf16")
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
};
template <>
struct Wg<__half> {
  RT_WG_TYPES("f16")
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
};
#undef RT_WG_TYPES
#undef RT_D8

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ void wg_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wg_commit_wait() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
// Keeps the compiler from moving accumulator reads or writes across the asynchronous wgmma.
template <int N>
__device__ __forceinline__ void pin(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

#endif  // RT_SM90A

// Grid (query blocks, H, B), the last query blocks (the most keys under a causal mask) first. kBN keys per
// step: S is 64 × kBN f32 in the wgmma accumulator layout — warp w holds rows 16 w + g and
// 16 w + g + 8 (lane = 4 g + t), at columns 8 n + 2 t and + 1 in s[4 n .. 4 n + 3], like mma.sync's C tiles.
template <typename T>
__global__ void __launch_bounds__(kThreads) attention_fwd_sm90_kernel(const T* __restrict__ q,
                                                                      const T* __restrict__ k,
                                                                      const T* __restrict__ v, T* __restrict__ o,
                                                                      float* __restrict__ lse, Dims s) {
#ifdef RT_SM90A
  extern __shared__ unsigned char raw[];
  // Q [64 × 64], then two stages of K [kBN × 64] and V [kBN × 64], each tile 1024-byte aligned.
  const uint32_t base = (smem_u32(raw) + 1023) & ~1023u;
  constexpr uint32_t kQ = kBM * 128, kTile = kBN * 128;
  const uint32_t sq = base;
  const int b = blockIdx.z, h = blockIdx.y, kvh = h / (s.H / s.KV);
  const int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  const int q0 = (gridDim.x - 1 - blockIdx.x) * kBM, qw = q0 + warp * 16;
  const int64_t qstride = int64_t(s.H) * kD, kstride = int64_t(s.KV) * kD;
  const T* kb = k + (int64_t(b) * s.Tk * s.KV + kvh) * kD;
  const T* vb = v + (int64_t(b) * s.Tk * s.KV + kvh) * kD;
  int end = s.Tk;
  if (s.causal) end = max(0, min(s.Tk, min(q0 + kBM, s.Tq) + s.n_past));
  const int steps = (end + kBN - 1) / kBN;

  load_tile<T>(sq, q + (int64_t(b) * s.Tq * s.H + h) * kD + int64_t(q0) * qstride, qstride, kBM, s.Tq - q0);
  auto fetch = [&](int step) {
    if (step < steps) {
      const uint32_t st = base + kQ + (step & 1) * 2 * kTile;
      const int k0 = step * kBN;
      load_tile<T>(st, kb + int64_t(k0) * kstride, kstride, kBN, s.Tk - k0);
      load_tile<T>(st + kTile, vb + int64_t(k0) * kstride, kstride, kBN, s.Tk - k0);
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  };
  fetch(0);  // with Q
  fetch(1);

  float acc[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) acc[i] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  for (int step = 0; step < steps; ++step) {
    const int k0 = step * kBN;
    asm volatile("cp.async.wait_group 1;\n" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // cp.async's writes, seen by wgmma
    __syncthreads();
    const uint32_t sk = base + kQ + (step & 1) * 2 * kTile, sv = sk + kTile;
    float sc[kBN / 2];
    pin(acc);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) Wg<T>::qk128(sc, desc_sw128(sq + kk * 32), desc_sw128(sk + kk * 32), kk);
    wg_commit_wait();
    pin(sc);

    // The mask only where the tile crosses the diagonal or an edge (a warp-uniform branch). The maximum is
    // taken over the raw scores (the scale is positive), so each score then costs one FFMA and one ex2.
    const bool whole = qw + 16 <= s.Tq && k0 + kBN <= s.Tk && (!s.causal || k0 + kBN - 1 <= qw + s.n_past);
    if (!whole) {
#pragma unroll
      for (int n = 0; n < kBN / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = qw + g + (e >> 1) * 8, key = k0 + n * 8 + 2 * t + (e & 1);
          if (!visible(s, row, key)) sc[4 * n + e] = -INFINITY;
        }
    }
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < kBN / 8; ++n) {
      mx[0] = fmaxf(mx[0], fmaxf(sc[4 * n], sc[4 * n + 1]));
      mx[1] = fmaxf(mx[1], fmaxf(sc[4 * n + 2], sc[4 * n + 3]));
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    }
    float alpha[2], sub[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float mn = fmaxf(m[r], mx[r] * s.scale_log2);
      sub[r] = mn == -INFINITY ? 0.0f : mn;  // a row with nothing visible yet: every exp2 below is 0
      alpha[r] = ex2(m[r] - sub[r]);
      m[r] = mn;
      l[r] *= alpha[r];
    }
    uint32_t pa[kBN / 16][4];
#pragma unroll
    for (int n = 0; n < kBN / 8; ++n) {
      float* x = sc + 4 * n;
      x[0] = ex2(fmaf(x[0], s.scale_log2, -sub[0]));
      x[1] = ex2(fmaf(x[1], s.scale_log2, -sub[0]));
      x[2] = ex2(fmaf(x[2], s.scale_log2, -sub[1]));
      x[3] = ex2(fmaf(x[3], s.scale_log2, -sub[1]));
      l[0] += x[0] + x[1];
      l[1] += x[2] + x[3];
      // Columns 16 kk + [0, 8) are a0 (row g) and a1 (row g + 8), 16 kk + [8, 16) a2 and a3.
      pa[n / 2][(n & 1) * 2 + 0] = Wg<T>::pack(x[0], x[1]);
      pa[n / 2][(n & 1) * 2 + 1] = Wg<T>::pack(x[2], x[3]);
    }
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      acc[4 * n + 0] *= alpha[0];
      acc[4 * n + 1] *= alpha[0];
      acc[4 * n + 2] *= alpha[1];
      acc[4 * n + 3] *= alpha[1];
    }
    pin(acc);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) Wg<T>::pv64(acc, pa[kk], desc_sw128(sv + kk * 16 * 128, 1024));
    wg_commit_wait();
    pin(acc);
    __syncthreads();  // every warp is done with this stage before it is refilled
    fetch(step + 2);
  }
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  const float f0 = l[0] > 0.0f ? 1.0f / l[0] : 0.0f, f1 = l[1] > 0.0f ? 1.0f / l[1] : 0.0f;
  T* ob = o + (int64_t(b) * s.Tq * s.H + h) * kD + int64_t(qw) * qstride;
#pragma unroll
  for (int n = 0; n < 8; ++n) {
    const int col = n * 8 + 2 * t;
    if (qw + g < s.Tq)
      *reinterpret_cast<uint32_t*>(ob + g * qstride + col) = Wg<T>::pack(acc[4 * n] * f0, acc[4 * n + 1] * f0);
    if (qw + g + 8 < s.Tq)
      *reinterpret_cast<uint32_t*>(ob + (g + 8) * qstride + col) =
          Wg<T>::pack(acc[4 * n + 2] * f1, acc[4 * n + 3] * f1);
  }
  if (t == 0) {
    float* lrow = lse + (int64_t(b) * s.H + h) * s.Tq;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = qw + g + 8 * r;
      if (row < s.Tq) lrow[row] = l[r] > 0.0f ? (m[r] + log2f(l[r])) / kLog2e : -INFINITY;
    }
  }
#else
  (void)q, (void)k, (void)v, (void)o, (void)lse, (void)s;
#endif
}

template <typename T>
bool launch(const AttentionFwdArgs& a, cudaStream_t stream) {
  auto kernel = attention_fwd_sm90_kernel<T>;
  const size_t smem = 1024 + size_t(kBM) * 128 + 4 * size_t(kBN) * 128;  // alignment, Q, two stages of K and V
  static std::once_flag once;
  std::call_once(once, [&] {
    RT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  });
  const Dims s{a.B, a.Tq, a.Tk, a.H, a.KV, a.causal, a.n_past, a.scale_log2};
  const dim3 grid((a.Tq + kBM - 1) / kBM, a.H, a.B);
  kernel<<<grid, kThreads, smem, stream>>>(static_cast<const T*>(a.q), static_cast<const T*>(a.k),
                                           static_cast<const T*>(a.v), static_cast<T*>(a.o), a.lse, s);
  RT_CUDA_LAUNCH_CHECK("attention_fwd_sm90");
  return true;
}

// Whether the device runs this file's sm_90a code: compute capability 9.0 and a kernel image built for it.
bool device_has_sm90a(int device) {
#ifndef RETORT_SM90A_BUILD
  (void)device;
  return false;
#else
  static std::mutex mu;
  static int known[64] = {};  // 0 unknown, 1 yes, 2 no
  if (device < 0 || device >= 64) return false;
  std::lock_guard<std::mutex> lock(mu);
  if (known[device] == 0) {
    int major = 0, minor = 0;
    bool ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
              cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess &&
              major == 9 && minor == 0;
    cudaFuncAttributes fa{};
    ok = ok && cudaFuncGetAttributes(&fa, attention_fwd_sm90_kernel<__nv_bfloat16>) == cudaSuccess &&
         fa.binaryVersion == 90;
    (void)cudaGetLastError();
    known[device] = ok ? 1 : 2;
  }
  return known[device] == 1;
#endif
}

}  // namespace

bool attention_sm90_available(int device) {
  return device_has_sm90a(device);
}

bool attention_fwd_sm90(const AttentionFwdArgs& a, cudaStream_t stream) {
  int device = 0;
  if (a.D != kD || cudaGetDevice(&device) != cudaSuccess || !device_has_sm90a(device)) return false;
  return a.bf16 ? launch<__nv_bfloat16>(a, stream) : launch<__half>(a, stream);
}

}  // namespace retort::cuda
