// The softmax-epilogue chunk's GEMM (softmax_chunk.h; its row pass is softmax_rows.cu). Built for sm_90a only
// (meson compiles this file with its own -gencode): the GEMM uses TMA and wgmma, which exist only there; on
// other targets the kernels compile to nothing and softmax_epilogue_supported() says no.
//
// The GEMM (measured alone against cuBLAS: bench/HISTORY.md, session 18): persistent CTAs, one per
// SM, walk the 128 x 256 output tiles m-fastest (so the CTAs in flight share a few W tiles and the whole
// hidden chunk in L2). Per CTA a producer warp issues TMA loads of 64-wide K tiles of x [128 rows] and W
// [256 rows] (128-byte swizzle) into a ring of stages with full / empty mbarriers, running ahead across
// tiles; two consumer warpgroups of 64 rows each issue m64n256k16 wgmmas from the shared-memory descriptors,
// one group in flight. The epilogue forms exp2(z·log2 e − c·log2 e) for the columns < v (inf past f32's
// range: the row's sum is then out of range and the exact kernel rewrites it; interior tiles skip the column
// test), reduces each row's sum over the tile (a fixed shuffle tree), stores it to part[row, tile], and
// stages the bf16 tile in 128-byte swizzled shared memory of its own for TMA stores, so the ring keeps
// loading the next tile meanwhile. TMA zero-fills loads beyond the rows, columns and K, and clips stores at
// the rows and columns, so any extents work.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <mutex>
#include <utility>

#include "../cuda_common.cuh"
#include "sm90_ops.cuh"
#include "softmax_chunk.h"

namespace retort::cuda {

namespace {

constexpr int kBN = 256, kBK = 64;
constexpr int kTileB = kBN * kBK * 2;
constexpr int kEpi = 128 * kBN * 2;  // the staged bf16 output tiles (64 x 256 per consumer warpgroup)
// Ring stages (x tile + W tile each) with E written / forward only: cooperative 48 KB stages, ping-pong 40
// KB.
constexpr int kStagesCoop = 3, kStagesCoopFwd = 4, kStagesPP = 4, kStagesPPFwd = 5;
constexpr float kLog2e = 1.4426950408889634f;

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define RT_SM90A 1
#endif

#ifdef RT_SM90A
using namespace sm90;

__device__ __forceinline__ float ex2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
// Stores four 8 x 8 b16 matrices from the mma fragment layout: register j holds this lane's pair of
// matrix j (row l / 4, columns 2 (l % 4) + {0, 1}); lanes 8 j .. 8 j + 7 give matrix j's row addresses.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(a), "r"(b),
               "r"(c), "r"(d)
               : "memory");
}
// Column blocks i and i + 1 (8 columns each) of this thread's m64n256 fragment d, as bf16, into the staged
// tile at epi_base (this warpgroup's 64 rows, four 64-column boxes of 8 KB, 128-byte swizzled): four 8 x 8
// blocks per stmatrix, (block i, rows 0-7 and 8-15 of warp w's 16) then block i + 1. Lanes 8q .. 8q + 7 give
// block q's row addresses: row 16 w + 8 (q % 2) + l % 8, column block b = i + q / 2 (box b / 8, 16-byte chunk
// b % 8 swizzled with the row's low three bits, l % 8). i must be a constant after unrolling.
__device__ __forceinline__ void stage_pair(uint32_t epi_base, const float (&d)[128], int i, int w, int l) {
  const int q = l / 8, b = i + q / 2;
  const uint32_t p =
      epi_base + (b / 8) * 8192 + (16 * w + 8 * (q % 2) + l % 8) * 128 + (((b % 8) ^ (l % 8)) * 16);
  stmatrix_x4(p, pack_bf16x2(d[4 * i], d[4 * i + 1]), pack_bf16x2(d[4 * i + 2], d[4 * i + 3]),
              pack_bf16x2(d[4 * i + 4], d[4 * i + 5]), pack_bf16x2(d[4 * i + 6], d[4 * i + 7]));
}
#endif

// WRITE: E stored (a gradient follows); otherwise only the row sums (a forward pass).
// PP (ping-pong): each consumer warpgroup takes whole 64 x 256 tiles of its own, the CTA's tiles alternating
// between them, and the two run their mainloops in turn (two named barriers order them), so that one
// warpgroup's epilogue (exp2, sums, bf16 staging) runs while the other's wgmmas keep the tensor cores busy.
// Otherwise (cooperative) both warpgroups share a 128 x 256 tile, 64 rows each, and their epilogues run
// together while the tensor cores wait. The ping-pong ring holds 64-row x tiles (a W tile then serves 64
// rows, not 128: more L2 traffic per flop); the order also keeps each warpgroup within one phase of every
// stage's barrier, which the parity waits need (the ring is filled in tile order, and a warpgroup starts
// waiting on tile j's stages only once the other has waited on all of tile j - 1's). The ping-pong stores
// each 64-column box of E as soon as it is staged (so the store of one box overlaps the staging of the next:
// 0.503 against 0.543 ms on the CE-small chunk, H100; no gain for the cooperative schedule, which keeps one
// store burst).
template <bool PP>
struct Shape {
  static constexpr int kRows = PP ? 64 : 128;  // tile rows (x box rows)
  static constexpr int kA = kRows * kBK * 2;
  static constexpr int kStageBytes = kA + kTileB;
};

template <int STAGES, bool WRITE, bool PP>
__global__ void __launch_bounds__(384, 1)
    softmax_gemm_kernel(const __grid_constant__ CUtensorMap ta, const __grid_constant__ CUtensorMap tb,
                        const __grid_constant__ CUtensorMap tc, const float* __restrict__ shift,
                        float* __restrict__ part, int rows, int wrows, int v, int h) {
#ifdef RT_SM90A
  constexpr int BM = Shape<PP>::kRows, TA = Shape<PP>::kA, ST = Shape<PP>::kStageBytes;
  extern __shared__ unsigned char raw[];
  unsigned char* base =
      reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
  __shared__ alignas(8) uint64_t full[STAGES], empty[STAGES];
  const int wg = int(threadIdx.x) / 128, t = int(threadIdx.x) % 128;
  const int mt = (rows + BM - 1) / BM, nt = (wrows + kBN - 1) / kBN, kt_n = (h + kBK - 1) / kBK;
  const int tiles = mt * nt;
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(&full[s])));
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(&empty[s])), "r"(PP ? 1 : 2));
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (wg == 0) {  // producer
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (t == 0) {
      int it = 0;
      for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const int m0 = (tile % mt) * BM, n0 = (tile / mt) * kBN;
        for (int kt = 0; kt < kt_n; ++kt, ++it) {
          const int s = it % STAGES;
          bar_wait(&empty[s], ((it / STAGES) & 1) ^ 1);
          unsigned char* sa = base + s * ST;
          asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(&full[s])),
                       "r"(ST)
                       : "memory");
          tma_load_2d(sa, &ta, kt * kBK, m0, &full[s]);
          tma_load_2d(sa + TA, &tb, kt * kBK, n0, &full[s]);
        }
      }
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
  const int cw = wg - 1, w = t / 32, l = t % 32;
  unsigned char* epi = base + STAGES * ST + cw * (kEpi / 2);
  const uint32_t epi_base = smem_u32(epi);
  // The CTA's j-th tile is blockIdx.x + j·gridDim.x; its k-blocks fill ring slots j·kt_n .. j·kt_n + kt_n
  // − 1. Cooperative: every tile, both warpgroups. Ping-pong: tiles j ≡ cw (mod 2).
  const int step = PP ? 2 : 1;
  for (int j = PP ? cw : 0, tile = blockIdx.x + j * gridDim.x; tile < tiles;
       j += step, tile += step * gridDim.x) {
    const int m0 = (tile % mt) * BM, nb = tile / mt, n0 = nb * kBN;
    const int mrow = m0 + (PP ? 0 : 64 * cw);  // this warpgroup's first row
    // Ping-pong: wait for the other warpgroup to have waited on all of tile j − 1's stages (named barrier
    // 4 + cw: the other arrives on it, 256 threads in all).
    if (PP && j > 0) asm volatile("bar.sync %0, 256;" ::"r"(4 + cw) : "memory");
    float d[128];  // zeroed by the first wgmma (scale-d 0)
    int it = j * kt_n;
    for (int kt = 0; kt < kt_n; ++kt, ++it) {
      const int s = it % STAGES;
      bar_wait(&full[s], (it / STAGES) & 1);
      const unsigned char* sa = base + s * ST + (PP ? 0 : cw * (64 * 128));
      const unsigned char* sb = base + s * ST + TA;
      asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) mma_n256(d, smem_desc(sa + 32 * ks), smem_desc(sb + 32 * ks), kt + ks);
      asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
      asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
      if (kt > 0 && t == 0) bar_arrive(&empty[(it - 1) % STAGES]);
    }
    // Ping-pong: the other warpgroup's next tile (if any) may start its waits.
    if (PP && tile + gridDim.x < tiles) asm volatile("bar.arrive %0, 256;" ::"r"(5 - cw) : "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    if (t == 0) bar_arrive(&empty[(it - 1) % STAGES]);
    // This thread holds rows r0 and r0 + 8, columns n0 + 8 i + 2 (l % 4) + {0, 1}, i < 32.
    const int r0 = mrow + 16 * w + l / 4;
    const float c0 = r0 < rows ? shift[r0] * kLog2e : 0.0f;
    const float c1 = r0 + 8 < rows ? shift[r0 + 8] * kLog2e : 0.0f;
    float s0 = 0.0f, s1 = 0.0f;
    if (n0 + kBN <= v) {  // an interior tile: every column counts
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        d[4 * i] = ex2_ftz(fmaf(d[4 * i], kLog2e, -c0));
        d[4 * i + 1] = ex2_ftz(fmaf(d[4 * i + 1], kLog2e, -c0));
        d[4 * i + 2] = ex2_ftz(fmaf(d[4 * i + 2], kLog2e, -c1));
        d[4 * i + 3] = ex2_ftz(fmaf(d[4 * i + 3], kLog2e, -c1));
        s0 += d[4 * i] + d[4 * i + 1];
        s1 += d[4 * i + 2] + d[4 * i + 3];
      }
    } else {
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const int col = n0 + 8 * i + 2 * (l % 4);
        const bool in0 = col < v, in1 = col + 1 < v;
        d[4 * i] = in0 ? ex2_ftz(fmaf(d[4 * i], kLog2e, -c0)) : 0.0f;
        d[4 * i + 1] = in1 ? ex2_ftz(fmaf(d[4 * i + 1], kLog2e, -c0)) : 0.0f;
        d[4 * i + 2] = in0 ? ex2_ftz(fmaf(d[4 * i + 2], kLog2e, -c1)) : 0.0f;
        d[4 * i + 3] = in1 ? ex2_ftz(fmaf(d[4 * i + 3], kLog2e, -c1)) : 0.0f;
        s0 += d[4 * i] + d[4 * i + 1];
        s1 += d[4 * i + 2] + d[4 * i + 3];
      }
    }
    s0 += __shfl_xor_sync(0xffffffffu, s0, 1);
    s0 += __shfl_xor_sync(0xffffffffu, s0, 2);
    s1 += __shfl_xor_sync(0xffffffffu, s1, 1);
    s1 += __shfl_xor_sync(0xffffffffu, s1, 2);
    if (l % 4 == 0) {
      if (r0 < rows) part[size_t(r0) * nt + nb] = s0;
      if (r0 + 8 < rows) part[size_t(r0 + 8) * nt + nb] = s1;
    }
    if (!WRITE) continue;
    // This warpgroup's previous TMA store has finished reading its staging buffer.
    if (t == 0) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
    asm volatile("bar.sync %0, 128;" ::"r"(2 + cw) : "memory");
    // Staged and stored in batches of 64-column boxes: the ping-pong stores each box once it is staged (its
    // store overlaps the next box's staging), the cooperative schedule all four after one barrier.
    constexpr int kBatch = PP ? 1 : 4;
#pragma unroll
    for (int b0 = 0; b0 < 4; b0 += kBatch) {
#pragma unroll
      for (int i = 8 * b0; i < 8 * (b0 + kBatch); i += 2) stage_pair(epi_base, d, i, w, l);
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      asm volatile("bar.sync %0, 128;" ::"r"(2 + cw) : "memory");
      if (t == 0 && mrow < rows)
        for (int bx = b0; bx < b0 + kBatch; ++bx)
          if (n0 + 64 * bx < wrows)
            asm volatile(
                "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];" ::"l"(&tc),
                "r"(n0 + 64 * bx), "r"(mrow), "r"(smem_u32(epi + bx * 8192))
                : "memory");
    }
    if (t == 0 && mrow < rows) asm volatile("cp.async.bulk.commit_group;" ::: "memory");
  }
  if (WRITE && t == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
#else
  (void)shift, (void)part, (void)rows, (void)wrows, (void)v, (void)h;
#endif
}

// cuTensorMapEncodeTiled through the runtime's driver entry point (nothing links libcuda).
using EncodeFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                              const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                              CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
EncodeFn encoder() {
  static EncodeFn fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
#if CUDART_VERSION >= 12050
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) !=
        cudaSuccess)
      p = nullptr;
#else
    if (cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &p, cudaEnableDefault, &q) != cudaSuccess)
      p = nullptr;
#endif
    return q == cudaDriverEntryPointSuccess ? reinterpret_cast<EncodeFn>(p) : nullptr;
  }();
  return fn;
}

// A tensor map over a [rows, cols] bf16 matrix with ld elements between rows, boxes [box_rows, 64], 128-byte
// swizzle.
CUtensorMap map_of(const void* p, int64_t rows, int64_t cols, int64_t ld, int box_rows) {
  CUtensorMap m;
  const cuuint64_t dim[2] = {cuuint64_t(cols), cuuint64_t(rows)}, stride[1] = {cuuint64_t(ld) * 2};
  const cuuint32_t box[2] = {64, cuuint32_t(box_rows)}, estride[2] = {1, 1};
  const EncodeFn enc = encoder();
  RT_CHECK(enc, "softmax epilogue GEMM: cuTensorMapEncodeTiled is not available from the driver");
  const CUresult r = enc(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(p), dim, stride, box,
                         estride, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                         CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  RT_CHECK(r == CUDA_SUCCESS, "softmax epilogue GEMM: cuTensorMapEncodeTiled failed (", int(r), ") for [",
           rows, ", ", cols, "] bf16 with ", ld, " elements between rows");
  return m;
}

template <int STAGES, bool WRITE, bool PP>
void launch(const SoftmaxGemm& g, int sm_count, cudaStream_t stream) {
  constexpr int smem = STAGES * Shape<PP>::kStageBytes + (WRITE ? kEpi : 0) + 1024;
  const auto kernel = softmax_gemm_kernel<STAGES, WRITE, PP>;
  const CUtensorMap ta = map_of(g.x, g.rows, g.h, g.ldx, Shape<PP>::kRows);
  const CUtensorMap tb = map_of(g.w, g.wrows, g.h, g.ldw, kBN);
  const CUtensorMap tc = g.e ? map_of(g.e, g.rows, g.wrows, g.lde, 64) : tb;
  const int64_t tiles = (g.rows + Shape<PP>::kRows - 1) / Shape<PP>::kRows * softmax_tiles(g.wrows);
  const int grid = int(std::min<int64_t>(sm_count, tiles));
  allow_smem(reinterpret_cast<const void*>(kernel), smem);
  kernel<<<grid, 384, smem, stream>>>(ta, tb, tc, g.shift, g.part, int(g.rows), int(g.wrows), int(g.v),
                                      int(g.h));
  RT_CUDA_LAUNCH_CHECK("softmax_gemm_kernel");
}

bool aligned16(const void* p, int64_t ld) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && ld % 8 == 0;
}

}  // namespace

void allow_smem(const void* kernel, size_t bytes) {
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, size_t> limit;
  int dev = 0;
  RT_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  size_t& lim = limit[{kernel, dev}];
  if (bytes <= std::max<size_t>(lim, 48 * 1024)) return;
  RT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  lim = bytes;
}

bool softmax_epilogue_supported(int device) {
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
    cudaFuncAttributes a{};
    ok = ok && cudaFuncGetAttributes(&a, softmax_gemm_kernel<kStagesCoop, true, false>) == cudaSuccess &&
         a.binaryVersion == 90 && encoder() != nullptr;
    (void)cudaGetLastError();
    known[device] = ok ? 1 : 2;
  }
  return known[device] == 1;
#endif
}

int64_t softmax_tiles(int64_t wrows) {
  return (wrows + kBN - 1) / kBN;
}

void softmax_gemm(const SoftmaxGemm& g, int sm_count, cudaStream_t stream) {
  RT_CHECK(g.rows > 0 && g.h > 0 && g.wrows > 0 && g.v <= g.wrows && g.rows < (int64_t(1) << 31) &&
               g.wrows < (int64_t(1) << 31) && aligned16(g.x, g.ldx) && aligned16(g.w, g.ldw) &&
               (!g.e || aligned16(g.e, g.lde)) && g.ldx >= g.h && g.ldw >= g.h && (!g.e || g.lde >= g.wrows),
           "softmax epilogue GEMM: needs bf16 rows 16-byte aligned, got x [", g.rows, ", ", g.h, "] ld ",
           g.ldx, ", W [", g.wrows, ", ", g.h, "] ld ", g.ldw, ", E ld ", g.lde);
  RT_CHECK(g.schedule == SoftmaxSchedule::Cooperative || g.schedule == SoftmaxSchedule::PingPong,
           "softmax epilogue GEMM: unknown schedule ", int(g.schedule));
  const bool pp = g.schedule == SoftmaxSchedule::PingPong;
  if (g.e && pp)
    launch<kStagesPP, true, true>(g, sm_count, stream);
  else if (g.e)
    launch<kStagesCoop, true, false>(g, sm_count, stream);
  else if (pp)
    launch<kStagesPPFwd, false, true>(g, sm_count, stream);
  else
    launch<kStagesCoopFwd, false, false>(g, sm_count, stream);
}

}  // namespace retort::cuda
