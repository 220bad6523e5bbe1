// clang-format off
// Groundwork for a fused-loss GEMM of our own (issue 4): a warp-specialized TMA + wgmma GEMM,
// C [M, N] bf16 = A [M, K] · B [N, K]ᵀ (bf16 operands stored K-major, f32 accumulation), checked and timed
// against cuBLAS on the fused losses' logits shapes. Not part of the build. On a GPU machine:
//     nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -o /tmp/gemm_probe \
//         tools/probes/gemm_probe.cu -lcublas && /tmp/gemm_probe
// One CTA per 128 x 256 output tile: a producer warpgroup (one thread issuing TMA loads of 64-wide K tiles
// into a 4-stage ring, full / empty mbarriers) and two consumer warpgroups (64 rows each, m64n256k16 from the
// shared-memory descriptors of sm90_probe.cuh, one wgmma group kept in flight), registers moved to the
// consumers with setmaxnreg (40 / 232). The output is poisoned (NaN) first and compared element by element
// with cuBLAS's bf16 result. Epilogues: direct bf16x2 stores from the accumulator fragments (mode 0), or the
// tile staged in 128-byte swizzled shared memory and written by TMA stores (mode 1).
// H100, session 16, mode 0 only: bit-identical to cuBLAS on both shapes; 4096 x 50176 x 768: 0.672 ms
// against cuBLAS 0.451 (1.49: the short K leaves the per-tile epilogue exposed); 2048 x 128256 x 2048:
// 1.769 ms against 1.479 (1.20, 608 TFLOP/s). Those figures are from the version before the helpers moved
// into sm90_probe.cuh (a mechanical move, not yet re-run). Mode 1 is written but HAS NOT RUN: run it first.
// Next steps for a product kernel: persistent CTAs with the next tile's loads under the epilogue, TMA
// multicast of the shared operand across a 2-CTA cluster, and the loss's per-row partial max and sum of
// exponentials in the epilogue.
// clang-format on
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cublas_v2.h>

#include "sm90_probe.cuh"

constexpr int kBM = 128, kBN = 256, kBK = 64, kStages = 4;
constexpr int kTileA = kBM * kBK * 2, kTileB = kBN * kBK * 2, kStage = kTileA + kTileB;

__global__ void __launch_bounds__(384, 1)
    gemm(const __grid_constant__ CUtensorMap ta, const __grid_constant__ CUtensorMap tb,
         const __grid_constant__ CUtensorMap tc, __nv_bfloat16* c, int M, int N, int K, int tma_store) {
  extern __shared__ unsigned char raw[];
  unsigned char* base =
      reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
  __shared__ alignas(8) uint64_t full[kStages], empty[kStages];
  const int wg = int(threadIdx.x) / 128, t = int(threadIdx.x) % 128;
  const int m0 = int(blockIdx.x) * kBM, n0 = int(blockIdx.y) * kBN, kt_n = K / kBK;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(&full[s])));
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 2;" ::"r"(smem_u32(&empty[s])));
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (wg == 0) {  // producer
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (t == 0) {
      for (int kt = 0; kt < kt_n; ++kt) {
        const int s = kt % kStages;
        bar_wait(&empty[s], ((kt / kStages) & 1) ^ 1);
        unsigned char* sa = base + s * kStage;
        unsigned char* sb = sa + kTileA;
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(&full[s])),
                     "r"(kStage)
                     : "memory");
        tma_load_2d(sa, &ta, kt * kBK, m0, &full[s]);
        tma_load_2d(sb, &tb, kt * kBK, n0, &full[s]);
      }
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
  const int cw = wg - 1;  // consumer: rows 64·cw .. of the tile
  float d[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) d[i] = 0.0f;
  for (int kt = 0; kt < kt_n; ++kt) {
    const int s = kt % kStages;
    bar_wait(&full[s], (kt / kStages) & 1);
    const unsigned char* sa = base + s * kStage + cw * (64 * 128);
    const unsigned char* sb = base + s * kStage + kTileA;
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) mma_n256(d, smem_desc(sa + 32 * ks), smem_desc(sb + 32 * ks), kt + ks);
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
    if (kt > 0 && t == 0) {  // the previous tile's wgmma group is done: its stage is free
      asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(&empty[(kt - 1) % kStages]))
                   : "memory");
    }
  }
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  const int w = t / 32, l = t % 32;
  if (!tma_store) {
    const int r = m0 + 64 * cw + 16 * w + l / 4;
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const int col = n0 + 8 * i + 2 * (l % 4);
      *reinterpret_cast<__nv_bfloat162*>(c + size_t(r) * N + col) =
          __floats2bfloat162_rn(d[4 * i], d[4 * i + 1]);
      *reinterpret_cast<__nv_bfloat162*>(c + size_t(r + 8) * N + col) =
          __floats2bfloat162_rn(d[4 * i + 2], d[4 * i + 3]);
    }
    return;
  }
  // Both consumers are done reading the stages: the first 64 KB hold the output tile, per consumer 4 blocks
  // of [64 rows x 64 columns] bf16 in the 128-byte swizzled layout TMA stores from.
  asm volatile("bar.sync 1, 256;" ::: "memory");
  unsigned char* e = base + cw * 32768;
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    const int kap = 8 * i + 2 * (l % 4), blk = kap / 64, kin = kap % 64, j = kin / 8;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int rho = 16 * w + l / 4 + 8 * h;
      unsigned char* p = e + blk * 8192 + rho * 128 + ((j ^ (rho % 8)) * 16) + (kin % 8) * 2;
      *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(d[4 * i + 2 * h], d[4 * i + 2 * h + 1]);
    }
  }
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  asm volatile("bar.sync %0, 128;" ::"r"(2 + cw) : "memory");
  if (t == 0) {
    for (int b = 0; b < 4; ++b)
      asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];" ::"l"(&tc),
                   "r"(n0 + 64 * b), "r"(m0 + 64 * cw), "r"(smem_u32(e + b * 8192))
                   : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
  }
}

void run(int M, int N, int K) {
  __nv_bfloat16 *a, *b, *c, *cref;
  CK(cudaMalloc(&a, size_t(M) * K * 2));
  CK(cudaMalloc(&b, size_t(N) * K * 2));
  CK(cudaMalloc(&c, size_t(M) * N * 2));
  CK(cudaMalloc(&cref, size_t(M) * N * 2));
  fill<<<1024, 256>>>(a, size_t(M) * K, 1, 0.25f);
  fill<<<1024, 256>>>(b, size_t(N) * K, 2, 0.25f);
  const CUtensorMap ta = map_of(a, M, K, kBM), tb = map_of(b, N, K, kBN), tc = map_of(c, M, N, 64);
  const int smem = kStages * kStage + 1024;
  CK(cudaFuncSetAttribute(gemm, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cublasHandle_t h;
  cublasCreate(&h);
  const float one = 1.0f, zero = 0.0f;
  int mode = 0;
  auto ours = [&] { gemm<<<dim3(M / kBM, N / kBN), 384, smem>>>(ta, tb, tc, c, M, N, K, mode); };
  auto theirs = [&] {
    cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, b, CUDA_R_16BF, K, a, CUDA_R_16BF, K, &zero,
                 cref, CUDA_R_16BF, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  };
  for (mode = 0; mode < 2; ++mode) {
    CK(cudaMemset(c, 0xff, size_t(M) * N * 2));
    ours();
    CK(cudaGetLastError());
    theirs();
    CK(cudaDeviceSynchronize());
    std::vector<__nv_bfloat16> h1(size_t(M) * N), h2(size_t(M) * N);
    CK(cudaMemcpy(h1.data(), c, h1.size() * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(h2.data(), cref, h2.size() * 2, cudaMemcpyDeviceToHost));
    size_t bad = 0;
    double worst = 0;
    for (size_t i = 0; i < h1.size(); ++i) {
      const double x = __bfloat162float(h1[i]), y = __bfloat162float(h2[i]);
      const double e = std::fabs(x - y);
      if (!(e <= 1e-2 * std::fabs(y) + 1e-3)) ++bad;
      worst = std::isnan(e) ? INFINITY : std::fmax(worst, e);
    }
    double t_ours = 0, t_cublas = 0;
    for (int rep = 0; rep < 3; ++rep) {  // alternate
      t_ours += time_ms(ours, 5);
      t_cublas += time_ms(theirs, 5);
    }
    t_ours /= 3;
    t_cublas /= 3;
    CK(cudaGetLastError());
    std::printf(
        "%s M %d N %d K %d: ours %.3f ms (%.0f TFLOP/s), cuBLAS %.3f ms, ratio %.3f; vs cuBLAS: worst %.3g, "
        "%zu of %zu off\n",
        mode ? "TMA-store epilogue" : "direct stores     ", M, N, K, t_ours,
        2.0 * M * N * double(K) / t_ours * 1e-9, t_cublas, t_ours / t_cublas, worst, bad, h1.size());
  }
  cublasDestroy(h);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  cudaFree(cref);
}

int main() {
  run(4096, 50176, 768);
  run(2048, 128256, 2048);
  return 0;
}
