// clang-format off
// Groundwork for a fused-loss GEMM of our own (issue 4): checks, on an sm_90 GPU, that operands loaded by the
// tensor memory accelerator with 128-byte swizzle feed wgmma through shared-memory descriptors as encoded in
// sm90_probe.cuh. Not part of the build. On a GPU machine:
//     nvcc -std=c++17 -O2 -gencode arch=compute_90a,code=sm_90a -o /tmp/wgmma_probe \
//         tools/probes/wgmma_probe.cu && /tmp/wgmma_probe
// One warpgroup computes D [64, N] f32 = A [64, K] · B [N, K]ᵀ from bf16 operands stored K-major (rows of K
// contiguous values), K in 64-element tiles (one 128-byte TMA box row each). Cases, each against a float64
// reference of the same inputs, with the output poisoned (NaN) first:
//   m64n64k16 over K = 64, the descriptor's start address advanced 32 bytes per 16-element K step;
//   the same without the advance, which must fail (so the check can fail);
//   m64n256k16 over K = 128 (two TMA boxes per operand).
// Descriptor (64 bits): start address >> 4 in bits 0-13, leading byte offset >> 4 in 16-29 (unused for
// swizzled K-major operands: 1), stride byte offset >> 4 in 32-45 (1024 bytes: eight 128-byte rows),
// swizzle in 62-63 (1: 128 B). wgmma needs the arch-specific target sm_90a. H100, session 16: both real
// cases exact to 7.1e-7, the control off in 4092 of 4096 entries ("probe passed"), before the helpers moved
// into sm90_probe.cuh (a mechanical move, not yet re-run).
// clang-format on
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "sm90_probe.cuh"

// One CTA of one warpgroup: TMA loads A [64, 64·KT] and B [N, 64·KT] in 64-element K tiles, then 4·KT wgmma
// steps. advance = false leaves the descriptors at each tile's first K step (the control case).
template <int N, int KT>
__global__ void probe(const __grid_constant__ CUtensorMap ta, const __grid_constant__ CUtensorMap tb,
                      float* out, bool advance) {
  extern __shared__ unsigned char raw[];
  // 128-byte swizzled tiles must start 1024-byte aligned.
  unsigned char* base =
      reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
  constexpr int kTileA = 64 * 128, kTileB = N * 128;  // bytes per 64-element K tile
  unsigned char* sa = base;
  unsigned char* sb = base + KT * kTileA;
  __shared__ alignas(8) uint64_t bar;
  const int t = int(threadIdx.x);
  if (t == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(&bar)));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (t == 0) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(&bar)),
                 "r"(KT * (kTileA + kTileB))
                 : "memory");
    for (int kt = 0; kt < KT; ++kt) {
      tma_load_2d(sa + kt * kTileA, &ta, kt * 64, 0, &bar);
      tma_load_2d(sb + kt * kTileB, &tb, kt * 64, 0, &bar);
    }
  }
  bar_wait(&bar, 0);
  float d[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) d[i] = 0.0f;
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
  for (int k = 0; k < 4 * KT; ++k) {
    const int step = advance ? 32 * (k % 4) : 0;  // 16 bf16 values: 32 bytes along each 128-byte row
    const uint64_t da = smem_desc(sa + (k / 4) * kTileA + step), db = smem_desc(sb + (k / 4) * kTileB + step);
    if constexpr (N == 64)
      mma_n64(d, da, db, k);
    else
      mma_n256(d, da, db, k);
  }
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  // The accumulator fragment: warp w holds rows 16w..16w+15; lane l row 16w + l/4 (and 8 below), columns
  // 8i + 2(l % 4) and the next, in d[4i .. 4i + 3].
  const int w = t / 32, l = t % 32, r = 16 * w + l / 4;
#pragma unroll
  for (int i = 0; i < N / 8; ++i) {
    const int c = (l % 4) * 2 + 8 * i;
    out[r * N + c] = d[4 * i + 0];
    out[r * N + c + 1] = d[4 * i + 1];
    out[(r + 8) * N + c] = d[4 * i + 2];
    out[(r + 8) * N + c + 1] = d[4 * i + 3];
  }
}

// Runs one case and returns how many of the 64·N outputs are off by more than 1e-3 from float64.
template <int N, int KT>
int run_case(const char* name, bool advance) {
  constexpr int K = 64 * KT;
  std::vector<__nv_bfloat16> a(64 * K), b(N * K);
  for (auto& x : a) x = __float2bfloat16(float(std::rand()) / RAND_MAX - 0.5f);
  for (auto& x : b) x = __float2bfloat16(float(std::rand()) / RAND_MAX - 0.5f);
  __nv_bfloat16 *pa, *pb;
  float* po;
  CK(cudaMalloc(&pa, a.size() * 2));
  CK(cudaMalloc(&pb, b.size() * 2));
  CK(cudaMalloc(&po, 64 * N * 4));
  CK(cudaMemcpy(pa, a.data(), a.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(pb, b.data(), b.size() * 2, cudaMemcpyHostToDevice));
  const CUtensorMap ma = map_of(pa, 64, K, 64), mb = map_of(pb, N, K, N);
  const int smem = KT * (64 + N) * 128 + 1024;
  CK(cudaFuncSetAttribute(probe<N, KT>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CK(cudaMemset(po, 0xff, 64 * N * 4));  // NaN where nothing is written
  probe<N, KT><<<1, 128, smem>>>(ma, mb, po, advance);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<float> o(64 * N);
  CK(cudaMemcpy(o.data(), po, o.size() * 4, cudaMemcpyDeviceToHost));
  double worst = 0.0;
  int bad = 0;
  for (int i = 0; i < 64; ++i)
    for (int j = 0; j < N; ++j) {
      double ref = 0.0;
      for (int k = 0; k < K; ++k)
        ref += double(__bfloat162float(a[i * K + k])) * double(__bfloat162float(b[j * K + k]));
      const double e = std::fabs(ref - double(o[i * N + j]));
      if (!(e <= 1e-3)) ++bad;
      worst = std::isnan(e) ? INFINITY : std::fmax(worst, e);
    }
  std::printf("%-58s worst abs err %.3g, %d of %d off by > 1e-3\n", name, worst, bad, 64 * N);
  CK(cudaFree(pa));
  CK(cudaFree(pb));
  CK(cudaFree(po));
  return bad;
}

int main() {
  std::srand(3);
  const int bad64 = run_case<64, 1>("m64n64k16, K = 64", true);
  const int control = run_case<64, 1>("m64n64k16, K = 64, no K advance (control: must fail)", false);
  const int bad256 = run_case<256, 2>("m64n256k16, K = 128 (two TMA boxes per operand)", true);
  const bool ok = bad64 == 0 && bad256 == 0 && control > 0;
  std::printf("%s\n", ok ? "probe passed" : "probe FAILED");
  return ok ? 0 : 1;
}
