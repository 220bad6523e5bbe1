// flash_attention on the device (bf16 and f16, head dim D in {16, 32, 64, 96, 128}): tiled online softmax on
// mma.sync m16n8k16 tensor-core instructions (sm_80 and later), f32 accumulation, never storing the scores.
// q is [B, T_q, H, D] and k, v are [B, T_k, KV, D] as the projections write them; query head h reads kv head
// h / (H / KV).
//
// Each warp owns 16 rows of the tile (queries in the forward and dq kernels, keys in the dk/dv kernel), so a
// row's softmax statistics live in the four lanes of a quad and need two shuffles. Fragment layouts follow the
// PTX ISA for m16n8k16: lane = 4·g + t; A (16×16, row-major) holds rows g and g+8 at columns 2t, 2t+1 and
// 2t+8, 2t+9; B (16×8) holds column g at rows 2t, 2t+1 and 2t+8, 2t+9; C holds rows g, g+8 at columns 2t,
// 2t+1. A C tile of 16×16 is therefore already the A fragment of the next product (the probabilities feed P·V
// without leaving registers). B operands come from row-major shared-memory tiles through ldmatrix (.trans
// where the tile's rows run along k), so no tile is ever transposed.
//
// The backward runs two kernels so that no gradient needs atomics (and every result is deterministic): dk and
// dv per block of 64 keys of one kv head (looping over the queries of all heads that read it), then dq per
// block of 64 queries; both recompute the probabilities from the saved log-sum-exp.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdlib>
#include <type_traits>

#include "../core/error.h"
#include "attention_sm90.h"
#include "cuda_common.cuh"
#include "cuda_internal.h"

namespace retort::cuda {

namespace {

constexpr int kWarps = 4;              // 16 rows each
constexpr int kRows = 16 * kWarps;     // rows of a block's own tile
constexpr int kKeys = 64;              // keys per step of the forward kernel
constexpr int kPad = 8;                // shared-memory row padding (elements): conflict-free 32-bit fragment reads
constexpr float kLog2e = 1.4426950408889634f;

template <typename T>
struct Mma;
template <>
struct Mma<__nv_bfloat16> {
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  static __device__ __forceinline__ void run(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};
template <>
struct Mma<__half> {
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  static __device__ __forceinline__ void run(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

struct Shape {
  int B, Tq, Tk, H, KV;
  int causal, n_past;
  float scale_log2;  // scale · log2(e): the kernels work in base 2
};

__device__ __forceinline__ bool visible(const Shape& s, int query, int key) {
  return query < s.Tq && key < s.Tk && (!s.causal || key <= query + s.n_past);
}

// Whether every query of [q0, q0 + nq) sees every key of [k0, k0 + nk).
__device__ __forceinline__ bool all_visible(const Shape& s, int q0, int nq, int k0, int nk) {
  return q0 + nq <= s.Tq && k0 + nk <= s.Tk && (!s.causal || k0 + nk - 1 <= q0 + s.n_past);
}

__device__ __forceinline__ uint32_t ld32(const void* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// rows × D elements of a [.., D] tensor whose row r starts at base + r·stride into s (row-major, ld D + kPad),
// zeros past `valid` rows; 16-byte vectors.
template <typename T, int D>
__device__ __forceinline__ void load_rows(T* s, const T* base, int64_t stride, int rows, int valid) {
  constexpr int kVec = 8, kPerRow = D / kVec;
  for (int i = threadIdx.x; i < rows * kPerRow; i += blockDim.x) {
    const int r = i / kPerRow, c = (i % kPerRow) * kVec;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r < valid) v = *reinterpret_cast<const uint4*>(base + r * stride + c);
    *reinterpret_cast<uint4*>(s + r * (D + kPad) + c) = v;
  }
}

// The A fragments of 16 rows × D of a row-major [.., D] tensor (row r at base + r·stride), zeros past valid.
template <typename T, int D>
__device__ __forceinline__ void load_a_rows(uint32_t (&a)[D / 16][4], const T* base, int64_t stride, int valid) {
  const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const int c = kk * 16 + 2 * t;
    a[kk][0] = g < valid ? ld32(base + g * stride + c) : 0u;
    a[kk][1] = g + 8 < valid ? ld32(base + (g + 8) * stride + c) : 0u;
    a[kk][2] = g < valid ? ld32(base + g * stride + c + 8) : 0u;
    a[kk][3] = g + 8 < valid ? ld32(base + (g + 8) * stride + c + 8) : 0u;
  }
}

// C (16 × 8·N, f32) tiles as the A fragments (16 × 16 steps) of the next product.
template <typename T, int N>
__device__ __forceinline__ void c_to_a(uint32_t (&a)[N / 2][4], const float (&c)[N][4]) {
#pragma unroll
  for (int kk = 0; kk < N / 2; ++kk) {
    a[kk][0] = Mma<T>::pack(c[2 * kk][0], c[2 * kk][1]);
    a[kk][1] = Mma<T>::pack(c[2 * kk][2], c[2 * kk][3]);
    a[kk][2] = Mma<T>::pack(c[2 * kk + 1][0], c[2 * kk + 1][1]);
    a[kk][3] = Mma<T>::pack(c[2 * kk + 1][2], c[2 * kk + 1][3]);
  }
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x2(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// As load_rows, asynchronously (cp.async, 16 bytes per copy; rows past `valid` are zero-filled), so the next
// tile streams in while the current one is multiplied.
template <typename T, int D>
__device__ __forceinline__ void load_rows_async(T* s, const T* base, int64_t stride, int rows, int valid) {
  constexpr int kVec = 8, kPerRow = D / kVec;
  for (int i = threadIdx.x; i < rows * kPerRow; i += blockDim.x) {
    const int r = i / kPerRow, c = (i % kPerRow) * kVec;
    const bool in = r < valid;
    const T* src = in ? base + r * stride + c : base;  // a mapped address; nothing is read from it
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(s + r * (D + kPad) + c)),
                 "l"(src), "r"(in ? 16 : 0));
  }
}
__device__ __forceinline__ void cp_commit() {
  asm volatile("cp.async.commit_group;\n");
}
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// c[n] += A (16 × 16·KS) · B with B[k][n·8 + j] = s[(n·8 + j)·ld + k]: the tile's rows are B's columns (K in
// q·kᵀ). ldmatrix hands each lane its B fragment directly (an 8×8 matrix row per 16 bytes).
template <typename T, int KS, int N>
__device__ __forceinline__ void mma_nmajor(float (&c)[N][4], const uint32_t (&a)[KS][4], const T* s, int ld) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int n = 0; n < N; ++n) {
    const T* row = s + (n * 8 + (lane & 7)) * ld + (lane >> 3) * 8;
#pragma unroll
    for (int kk = 0; kk < KS; kk += 2) {
      uint32_t r[4];
      if (kk + 1 < KS) {
        ldsm_x4(r, row + kk * 16);
        Mma<T>::run(c[n], a[kk], r[0], r[1]);
        Mma<T>::run(c[n], a[kk + 1], r[2], r[3]);
      } else {
        ldsm_x2(r, s + (n * 8 + (lane & 7)) * ld + kk * 16 + ((lane >> 3) & 1) * 8);
        Mma<T>::run(c[n], a[kk], r[0], r[1]);
      }
    }
  }
}

// c[n] += A (16 × 16·KS) · B with B[k][n] = s[k·ld + n]: the tile's rows are B's rows (V in p·v), read
// transposed by ldmatrix.trans. N is even (D / 8 for D a multiple of 16).
template <typename T, int KS, int N>
__device__ __forceinline__ void mma_kmajor(float (&c)[N][4], const uint32_t (&a)[KS][4], const T* s, int ld) {
  static_assert(N % 2 == 0, "two column tiles per ldmatrix");
  const int lane = threadIdx.x & 31;
  const T* base = s + ((lane & 7) + ((lane >> 3) & 1) * 8) * ld + (lane >> 4) * 8;
#pragma unroll
  for (int n = 0; n < N; n += 2) {
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) {
      uint32_t r[4];
      ldsm_x4_t(r, base + kk * 16 * ld + n * 8);
      Mma<T>::run(c[n], a[kk], r[0], r[1]);
      Mma<T>::run(c[n + 1], a[kk], r[2], r[3]);
    }
  }
}

template <int N>
__device__ __forceinline__ void zero(float (&c)[N][4]) {
#pragma unroll
  for (int n = 0; n < N; ++n) c[n][0] = c[n][1] = c[n][2] = c[n][3] = 0.0f;
}

// Stores 16 rows (g, g + 8 per lane) of C tiles c[D/8] times f (per row) as T at base + r·stride.
template <typename T, int D>
__device__ __forceinline__ void store_c_rows(T* base, int64_t stride, int valid, const float (&c)[D / 8][4],
                                             float f0, float f1) {
  const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    const int col = n * 8 + 2 * t;
    if (g < valid)
      *reinterpret_cast<uint32_t*>(base + g * stride + col) = Mma<T>::pack(c[n][0] * f0, c[n][1] * f0);
    if (g + 8 < valid)
      *reinterpret_cast<uint32_t*>(base + (g + 8) * stride + col) = Mma<T>::pack(c[n][2] * f1, c[n][3] * f1);
  }
}

// Keys a block of query rows [q0, q0 + rows) can see: [0, end).
__device__ __forceinline__ int keys_end(const Shape& s, int q0, int rows) {
  if (!s.causal) return s.Tk;
  const int last = min(q0 + rows, s.Tq) - 1 + s.n_past + 1;
  return max(0, min(s.Tk, last));
}

// ---- forward ------------------------------------------------------------------------------------------------
// Grid (query blocks, H, B). lse in natural log, -inf for a row without a visible key (its output is 0).
template <typename T, int D>
__global__ __launch_bounds__(kWarps * 32) void attention_fwd(const T* q, const T* k, const T* v, T* o, float* lse,
                                                            Shape s) {
  extern __shared__ __align__(16) unsigned char smem[];
  T* stages = reinterpret_cast<T*>(smem);  // two stages of K, V tiles [kKeys][D + kPad]
  constexpr int kTile = kKeys * (D + kPad);
  const int b = blockIdx.z, h = blockIdx.y, kvh = h / (s.H / s.KV);
  const int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  // The last query blocks see the most keys: run them first so the short ones fill the tail.
  const int q0 = (gridDim.x - 1 - blockIdx.x) * kRows, qw = q0 + warp * 16;
  const int64_t qstride = int64_t(s.H) * D, kstride = int64_t(s.KV) * D;
  const T* qb = q + (int64_t(b) * s.Tq * s.H + h) * D;
  const T* kb = k + (int64_t(b) * s.Tk * s.KV + kvh) * D;
  const T* vb = v + (int64_t(b) * s.Tk * s.KV + kvh) * D;

  uint32_t qa[D / 16][4];
  load_a_rows<T, D>(qa, qb + int64_t(qw) * qstride, qstride, s.Tq - qw);
  float acc[D / 8][4];
  zero(acc);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const int steps = (keys_end(s, q0, kRows) + kKeys - 1) / kKeys;
  auto fetch = [&](int step) {
    T* st = stages + (step & 1) * 2 * kTile;
    const int k0 = step * kKeys;
    load_rows_async<T, D>(st, kb + int64_t(k0) * kstride, kstride, kKeys, s.Tk - k0);
    load_rows_async<T, D>(st + kTile, vb + int64_t(k0) * kstride, kstride, kKeys, s.Tk - k0);
    cp_commit();
  };
  if (steps > 0) fetch(0);
  for (int step = 0; step < steps; ++step) {
    const int k0 = step * kKeys;
    if (step + 1 < steps) {
      fetch(step + 1);
      cp_wait<1>();
    } else {
      cp_wait<0>();
    }
    __syncthreads();
    const T* ks = stages + (step & 1) * 2 * kTile;
    const T* vs = ks + kTile;
    float sc[kKeys / 8][4];
    zero(sc);
    mma_nmajor<T, D / 16>(sc, qa, ks, D + kPad);
    float mx[2] = {-INFINITY, -INFINITY};
    // The mask only where the tile crosses the diagonal or an edge (a warp-uniform branch).
    const bool whole = all_visible(s, qw, 16, k0, kKeys);
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = qw + g + (e >> 1) * 8, key = k0 + n * 8 + 2 * t + (e & 1);
        sc[n][e] = whole || visible(s, row, key) ? sc[n][e] * s.scale_log2 : -INFINITY;
        mx[e >> 1] = fmaxf(mx[e >> 1], sc[n][e]);
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    }
    float alpha[2], base[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float mn = fmaxf(m[r], mx[r]);
      base[r] = mn == -INFINITY ? 0.0f : mn;  // a row with nothing visible yet: every exp2 below is 0
      alpha[r] = exp2f(m[r] - base[r]);
      m[r] = mn;
      l[r] *= alpha[r];
    }
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        sc[n][e] = exp2f(sc[n][e] - base[e >> 1]);
        l[e >> 1] += sc[n][e];
      }
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      acc[n][0] *= alpha[0];
      acc[n][1] *= alpha[0];
      acc[n][2] *= alpha[1];
      acc[n][3] *= alpha[1];
    }
    uint32_t pa[kKeys / 16][4];
    c_to_a<T, kKeys / 8>(pa, sc);
    mma_kmajor<T, kKeys / 16>(acc, pa, vs, D + kPad);
    __syncthreads();  // this stage is refilled two steps on
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  const float f0 = l[0] > 0.0f ? 1.0f / l[0] : 0.0f, f1 = l[1] > 0.0f ? 1.0f / l[1] : 0.0f;
  store_c_rows<T, D>(o + (int64_t(b) * s.Tq * s.H + h) * D + int64_t(qw) * qstride, qstride, s.Tq - qw, acc, f0,
                     f1);
  if (t == 0) {
    float* lrow = lse + (int64_t(b) * s.H + h) * s.Tq;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = qw + g + 8 * r;
      if (row < s.Tq) lrow[row] = l[r] > 0.0f ? (m[r] + log2f(l[r])) / kLog2e : -INFINITY;
    }
  }
}

// ---- backward -----------------------------------------------------------------------------------------------
// dsum[b, h, i] = do_i · o_i (f32), one warp per row.
template <typename T, int D>
__global__ void attention_dsum(const T* o, const T* dout, float* dsum, Shape s) {
  const int64_t rows = int64_t(s.B) * s.Tq * s.H;
  const int lane = threadIdx.x & 31;
  for (int64_t r = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5; r < rows;
       r += (int64_t(gridDim.x) * blockDim.x) >> 5) {
    float acc = 0.0f;
    for (int d = lane; d < D; d += 32) acc += float(o[r * D + d]) * float(dout[r * D + d]);
    acc = warp_reduce(acc, SumOp{});
    // r runs over [B, T_q, H]; dsum is [B, H, T_q].
    const int64_t h = r % s.H, i = r / s.H % s.Tq, b = r / s.H / s.Tq;
    if (lane == 0) dsum[(b * s.H + h) * s.Tq + i] = acc;
  }
}

// Grid (key blocks, KV, B): dk, dv of 64 keys of one kv head, over the queries of every head that reads it.
// Query tiles of QT rows (fewer for D = 128, to keep the accumulators in registers).
template <typename T, int D>
__global__ __launch_bounds__(kWarps * 32) void attention_bwd_dkdv(const T* q, const T* k, const T* v, const T* dout,
                                                                 const float* lse, const float* dsum, T* dk, T* dv,
                                                                 Shape s) {
  constexpr int QT = D > 64 ? 32 : 64;
  extern __shared__ __align__(16) unsigned char smem[];
  // Two stages of: Q [QT][D + kPad], dO [QT][D + kPad], then lse · log2(e) [QT] and dsum [QT] (f32).
  constexpr int kStage = (2 * QT * (D + kPad) * int(sizeof(T)) + 2 * QT * 4 + 15) / 16 * 16;  // bytes
  const int b = blockIdx.z, kvh = blockIdx.y, group = s.H / s.KV;
  const int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  const int k0 = blockIdx.x * kRows, kw = k0 + warp * 16;
  const int64_t qstride = int64_t(s.H) * D, kstride = int64_t(s.KV) * D;
  const int64_t kvoff = (int64_t(b) * s.Tk * s.KV + kvh) * D;
  uint32_t ka[D / 16][4], va[D / 16][4];
  load_a_rows<T, D>(ka, k + kvoff + int64_t(kw) * kstride, kstride, s.Tk - kw);
  load_a_rows<T, D>(va, v + kvoff + int64_t(kw) * kstride, kstride, s.Tk - kw);
  float dka[D / 8][4], dva[D / 8][4];
  zero(dka);
  zero(dva);
  // The first query that sees key k0: k0 − n_past (causal). Steps run over (query head of the group, tile).
  const int qbegin = s.causal ? max(0, k0 - s.n_past) / QT * QT : 0;
  const int tiles = s.Tq > qbegin ? (s.Tq - qbegin + QT - 1) / QT : 0, steps = group * tiles;
  auto stage = [&](int step) { return smem + (step & 1) * kStage; };
  auto fetch = [&](int step) {
    const int h = kvh * group + step / tiles, i0 = qbegin + step % tiles * QT;
    const int64_t qoff = (int64_t(b) * s.Tq * s.H + h) * D;
    T* qs = reinterpret_cast<T*>(stage(step));
    load_rows_async<T, D>(qs, q + qoff + int64_t(i0) * qstride, qstride, QT, s.Tq - i0);
    load_rows_async<T, D>(qs + QT * (D + kPad), dout + qoff + int64_t(i0) * qstride, qstride, QT, s.Tq - i0);
    cp_commit();
    float* ls = reinterpret_cast<float*>(qs + 2 * QT * (D + kPad));
    const float* lrow = lse + (int64_t(b) * s.H + h) * s.Tq;
    const float* drow = dsum + (int64_t(b) * s.H + h) * s.Tq;
    for (int i = threadIdx.x; i < QT; i += blockDim.x) {
      const bool in = i0 + i < s.Tq;
      ls[i] = in ? lrow[i0 + i] * kLog2e : -INFINITY;
      ls[QT + i] = in ? drow[i0 + i] : 0.0f;
    }
  };
  if (steps > 0) fetch(0);
  for (int step = 0; step < steps; ++step) {
    {
      const int i0 = qbegin + step % tiles * QT;
      if (step + 1 < steps) {
        fetch(step + 1);
        cp_wait<1>();
      } else {
        cp_wait<0>();
      }
      __syncthreads();
      const T* qs = reinterpret_cast<const T*>(stage(step));
      const T* ds = qs + QT * (D + kPad);
      const float* ls = reinterpret_cast<const float*>(qs + 2 * QT * (D + kPad));
      const float* dd = ls + QT;
      // Sᵀ (16 keys × QT queries) = K_w Qᵀ, then Pᵀ.
      float p[QT / 8][4];
      zero(p);
      const bool whole = all_visible(s, i0, QT, kw, 16);
      mma_nmajor<T, D / 16>(p, ka, qs, D + kPad);
#pragma unroll
      for (int n = 0; n < QT / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = kw + g + (e >> 1) * 8, qi = n * 8 + 2 * t + (e & 1);
          const float li = ls[qi];
          p[n][e] = whole || (visible(s, i0 + qi, key) && li != -INFINITY) ? exp2f(p[n][e] * s.scale_log2 - li)
                                                                           : 0.0f;
        }
      // dV += Pᵀ dO.
      uint32_t pa[QT / 16][4];
      c_to_a<T, QT / 8>(pa, p);
      mma_kmajor<T, QT / 16>(dva, pa, ds, D + kPad);
      // dPᵀ (16 keys × QT) = V_w dOᵀ; dSᵀ = Pᵀ (dPᵀ − D).
      float dp[QT / 8][4];
      zero(dp);
      mma_nmajor<T, D / 16>(dp, va, ds, D + kPad);
#pragma unroll
      for (int n = 0; n < QT / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) dp[n][e] = p[n][e] * (dp[n][e] - dd[n * 8 + 2 * t + (e & 1)]);
      // dK += dSᵀ Q (scaled at the end).
      c_to_a<T, QT / 8>(pa, dp);
      mma_kmajor<T, QT / 16>(dka, pa, qs, D + kPad);
      __syncthreads();  // this stage is refilled two steps on
    }
  }
  const float scale = s.scale_log2 / kLog2e;
  store_c_rows<T, D>(dk + kvoff + int64_t(kw) * kstride, kstride, s.Tk - kw, dka, scale, scale);
  store_c_rows<T, D>(dv + kvoff + int64_t(kw) * kstride, kstride, s.Tk - kw, dva, 1.0f, 1.0f);
}

// Keys per step of the dq kernel: fewer for D > 64, so the q, dO and dq fragments stay in registers.
template <int D>
constexpr int dq_keys() {
  return D > 64 ? 32 : 64;
}

// Grid (query blocks, H, B): dq of 64 queries.
template <typename T, int D>
__global__ __launch_bounds__(kWarps * 32) void attention_bwd_dq(const T* q, const T* k, const T* v, const T* dout,
                                                               const float* lse, const float* dsum, T* dq, Shape s) {
  constexpr int KK = dq_keys<D>();
  extern __shared__ __align__(16) unsigned char smem[];
  T* stages = reinterpret_cast<T*>(smem);  // two stages of K, V tiles [KK][D + kPad]
  constexpr int kTile = KK * (D + kPad);
  const int b = blockIdx.z, h = blockIdx.y, kvh = h / (s.H / s.KV);
  const int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  const int q0 = (gridDim.x - 1 - blockIdx.x) * kRows, qw = q0 + warp * 16;
  const int64_t qstride = int64_t(s.H) * D, kstride = int64_t(s.KV) * D;
  const int64_t qoff = (int64_t(b) * s.Tq * s.H + h) * D, kvoff = (int64_t(b) * s.Tk * s.KV + kvh) * D;
  uint32_t qa[D / 16][4], da[D / 16][4];
  load_a_rows<T, D>(qa, q + qoff + int64_t(qw) * qstride, qstride, s.Tq - qw);
  load_a_rows<T, D>(da, dout + qoff + int64_t(qw) * qstride, qstride, s.Tq - qw);
  float li[2], di[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = qw + g + 8 * r;
    const bool in = row < s.Tq;
    li[r] = in ? lse[(int64_t(b) * s.H + h) * s.Tq + row] * kLog2e : -INFINITY;
    di[r] = in ? dsum[(int64_t(b) * s.H + h) * s.Tq + row] : 0.0f;
  }
  float dqa[D / 8][4];
  zero(dqa);
  const int steps = (keys_end(s, q0, kRows) + KK - 1) / KK;
  auto fetch = [&](int step) {
    T* st = stages + (step & 1) * 2 * kTile;
    const int k0 = step * KK;
    load_rows_async<T, D>(st, k + kvoff + int64_t(k0) * kstride, kstride, KK, s.Tk - k0);
    load_rows_async<T, D>(st + kTile, v + kvoff + int64_t(k0) * kstride, kstride, KK, s.Tk - k0);
    cp_commit();
  };
  if (steps > 0) fetch(0);
  for (int step = 0; step < steps; ++step) {
    const int k0 = step * KK;
    if (step + 1 < steps) {
      fetch(step + 1);
      cp_wait<1>();
    } else {
      cp_wait<0>();
    }
    __syncthreads();
    const T* ks = stages + (step & 1) * 2 * kTile;
    const T* vs = ks + kTile;
    float p[KK / 8][4], dp[KK / 8][4];
    zero(p);
    zero(dp);
    mma_nmajor<T, D / 16>(p, qa, ks, D + kPad);
    mma_nmajor<T, D / 16>(dp, da, vs, D + kPad);
    const bool whole = all_visible(s, qw, 16, k0, KK);
#pragma unroll
    for (int n = 0; n < KK / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1, row = qw + g + 8 * r, key = k0 + n * 8 + 2 * t + (e & 1);
        const float pv = whole || (visible(s, row, key) && li[r] != -INFINITY)
                             ? exp2f(p[n][e] * s.scale_log2 - li[r])
                             : 0.0f;
        dp[n][e] = pv * (dp[n][e] - di[r]);
      }
    uint32_t sa[KK / 16][4];
    c_to_a<T, KK / 8>(sa, dp);
    mma_kmajor<T, KK / 16>(dqa, sa, ks, D + kPad);
    __syncthreads();  // this stage is refilled two steps on
  }
  const float scale = s.scale_log2 / kLog2e;
  store_c_rows<T, D>(dq + qoff + int64_t(qw) * qstride, qstride, s.Tq - qw, dqa, scale, scale);
}

// ---- launchers ----------------------------------------------------------------------------------------------
Shape shape_of(const Tensor* node) {
  const Tensor *q = node->src[0], *k = node->src[1];
  Shape s;
  s.B = int(q->ne[3]);
  s.Tq = int(q->ne[2]);
  s.H = int(q->ne[1]);
  s.Tk = int(k->ne[2]);
  s.KV = int(k->ne[1]);
  s.causal = node->ip[0] != 0 ? 1 : 0;
  s.n_past = int(node->ip[1]);
  s.scale_log2 = node->fp[0] * kLog2e;
  return s;
}

void check_node(const Tensor* node) {
  const Tensor *q = node->src[0], *k = node->src[1];
  const int64_t D = q->ne[0];
  RT_CHECK(q->dtype == DType::BF16 || q->dtype == DType::F16, "cuda ", op_name(node->op),
           ": the CUDA kernels take bf16 or f16 q, k, v, got ", q->describe(),
           " (cast to bf16, or run f32 on the CPU)");
  RT_CHECK(D == 16 || D == 32 || D == 64 || D == 96 || D == 128, "cuda ", op_name(node->op),
           ": head dim D must be 16, 32, 64, 96 or 128 on the GPU, got D = ", D, " (q ", q->describe(), ")");
  for (int64_t n : {q->ne[1], q->ne[2], q->ne[3], k->ne[2]})
    RT_CHECK(n < (int64_t(1) << 30), "cuda ", op_name(node->op), ": sizes must be below 2^30, got q ",
             q->describe(), " and k ", k->describe());
  RT_CHECK(std::abs(node->ip[1]) < (int64_t(1) << 30), "cuda ", op_name(node->op), ": n_past ", node->ip[1],
           " is out of range");
}

// Dynamic shared memory above the default 48 KiB needs the kernel's opt-in.
template <typename K>
void allow_smem(K kernel, size_t smem) {
  if (smem > 48 * 1024)
    RT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
}

template <typename T, int D>
void forward(CudaExec& ex, Tensor* node) {
  const Shape s = shape_of(node);
  if (ex.opts.hopper_attention) {
    const AttentionFwdArgs a{node->src[0]->data, node->src[1]->data, node->src[2]->data, node->data,
                             static_cast<float*>(node->aux[0]->data), s.B, s.Tq, s.Tk, s.H, s.KV, D, s.causal,
                             s.n_past, s.scale_log2, std::is_same_v<T, __nv_bfloat16>};
    if (attention_fwd_sm90(a, ex.stream)) return;
  }
  const size_t smem = sizeof(T) * 4 * kKeys * (D + kPad);  // two stages of K and V
  auto kernel = attention_fwd<T, D>;
  allow_smem(kernel, smem);
  const dim3 grid((s.Tq + kRows - 1) / kRows, s.H, s.B);
  kernel<<<grid, kWarps * 32, smem, ex.stream>>>(
      static_cast<const T*>(node->src[0]->data), static_cast<const T*>(node->src[1]->data),
      static_cast<const T*>(node->src[2]->data), static_cast<T*>(node->data), static_cast<float*>(node->aux[0]->data),
      s);
  RT_CUDA_LAUNCH_CHECK("attention_fwd");
}

template <typename T, int D>
void backward(CudaExec& ex, Tensor* node) {
  const Shape s = shape_of(node);
  const T* q = static_cast<const T*>(node->src[0]->data);
  const T* k = static_cast<const T*>(node->src[1]->data);
  const T* v = static_cast<const T*>(node->src[2]->data);
  const T* o = static_cast<const T*>(node->src[3]->data);
  const T* dout = static_cast<const T*>(node->src[4]->data);
  const float* lse = static_cast<const float*>(node->src[5]->data);
  auto dsum = ex.temp(sizeof(float) * size_t(s.B) * size_t(s.H) * size_t(s.Tq));
  float* dd = static_cast<float*>(dsum->data());
  const int64_t rows = int64_t(s.B) * s.Tq * s.H;
  attention_dsum<T, D><<<ex.grid_for(rows * 32, 256), 256, 0, ex.stream>>>(o, dout, dd, s);
  RT_CUDA_LAUNCH_CHECK("attention_dsum");

  constexpr int QT = D > 64 ? 32 : 64;
  const size_t smem_kv = 2 * ((2 * QT * (D + kPad) * sizeof(T) + 2 * QT * 4 + 15) / 16 * 16);  // two stages
  auto kv_kernel = attention_bwd_dkdv<T, D>;
  allow_smem(kv_kernel, smem_kv);
  kv_kernel<<<dim3((s.Tk + kRows - 1) / kRows, s.KV, s.B), kWarps * 32, smem_kv, ex.stream>>>(
      q, k, v, dout, lse, dd, static_cast<T*>(node->aux[0]->data), static_cast<T*>(node->aux[1]->data), s);
  RT_CUDA_LAUNCH_CHECK("attention_bwd_dkdv");

  const size_t smem_q = sizeof(T) * 4 * dq_keys<D>() * (D + kPad);  // two stages of K and V
  auto q_kernel = attention_bwd_dq<T, D>;
  allow_smem(q_kernel, smem_q);
  q_kernel<<<dim3((s.Tq + kRows - 1) / kRows, s.H, s.B), kWarps * 32, smem_q, ex.stream>>>(
      q, k, v, dout, lse, dd, static_cast<T*>(node->data), s);
  RT_CUDA_LAUNCH_CHECK("attention_bwd_dq");
}

template <bool Back, typename T>
void dispatch_d(CudaExec& ex, Tensor* node) {
  switch (node->src[0]->ne[0]) {
    case 16: return Back ? backward<T, 16>(ex, node) : forward<T, 16>(ex, node);
    case 32: return Back ? backward<T, 32>(ex, node) : forward<T, 32>(ex, node);
    case 64: return Back ? backward<T, 64>(ex, node) : forward<T, 64>(ex, node);
    case 96: return Back ? backward<T, 96>(ex, node) : forward<T, 96>(ex, node);
    default: return Back ? backward<T, 128>(ex, node) : forward<T, 128>(ex, node);
  }
}

template <bool Back>
void attention_l(CudaExec& ex, Tensor* node) {
  check_node(node);
  if (node->src[0]->dtype == DType::BF16)
    dispatch_d<Back, __nv_bfloat16>(ex, node);
  else
    dispatch_d<Back, __half>(ex, node);
}

}  // namespace

void register_cuda_attention_ops(CudaOpTable& t) {
  t[size_t(Op::FlashAttention)] = attention_l<false>;
  t[size_t(Op::FlashAttentionBack)] = attention_l<true>;
}

}  // namespace retort::cuda
