// Groundwork for a fused-loss GEMM of our own (issue 4): checks, on an sm_90 GPU, that operands loaded by the
// tensor memory accelerator with 128-byte swizzle feed wgmma through shared-memory descriptors as encoded
// here. Not part of the build. On a GPU machine:
//     nvcc -std=c++17 -O2 -gencode arch=compute_90a,code=sm_90a -o /tmp/wgmma_probe
//     tools/probes/wgmma_probe.cu /tmp/wgmma_probe
// One warpgroup computes D [64, N] f32 = A [64, K] · B [N, K]ᵀ from bf16 operands stored K-major (rows of K
// contiguous values), K in 64-element tiles (one 128-byte TMA box row each). Cases, each against a float64
// reference of the same inputs, with the output poisoned (NaN) first:
//   m64n64k16 over K = 64, the descriptor's start address advanced 32 bytes per 16-element K step;
//   the same without the advance, which must fail (so the check can fail);
//   m64n256k16 over K = 128 (two TMA boxes per operand).
// Descriptor (64 bits): start address >> 4 in bits 0-13, leading byte offset >> 4 in 16-29 (unused for
// swizzled K-major operands: 1), stride byte offset >> 4 in 32-45 (1024 bytes: eight 128-byte rows), swizzle
// in 62-63 (1: 128 B). wgmma needs the arch-specific target sm_90a. H100, session 16: both real cases exact
// to 7.1e-7, the control off in 4092 of 4096 entries ("probe passed").
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                              \
  do {                                                     \
    cudaError_t e_ = (x);                                  \
    if (e_ != cudaSuccess) {                               \
      std::printf("%s: %s\n", #x, cudaGetErrorString(e_)); \
      std::exit(1);                                        \
    }                                                      \
  } while (0)

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return uint32_t(__cvta_generic_to_shared(p));
}

// A K-major operand tile in shared memory, 128-byte swizzled (as TMA wrote it), rows 128 bytes apart.
__device__ __forceinline__ uint64_t smem_desc(const void* p) {
  uint64_t d = uint64_t((smem_u32(p) & 0x3FFFF) >> 4);  // start address
  d |= uint64_t(1) << 16;                               // leading byte offset: unused here
  d |= uint64_t(1024 >> 4) << 32;                       // stride byte offset: 8 rows of 128 bytes
  d |= uint64_t(1) << 62;                               // 128-byte swizzle
  return d;
}

// D += A·Bᵀ for one 16-element K step (D zeroed first when !acc).
__device__ __forceinline__ void mma_n64(float (&d)[32], uint64_t da, uint64_t db, int acc) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,"
      "%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n}"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(acc));
}
// The same at N = 256: the accumulator is four of the n64 one side by side in the fragment order below, so it
// is issued as one instruction over d[0..127].
__device__ __forceinline__ void mma_n256(float (&d)[128], uint64_t da, uint64_t db, int acc) {
#define R8(i)                                                                                 \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,"
      "%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%"
      "53,"
      "%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%"
      "79,"
      "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%"
      "104,"
      "%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%"
      "125,"
      "%126,%127}, %128, %129, p, 1, 1, 0, 0;\n}"
      : R8(0), R8(8), R8(16), R8(24), R8(32), R8(40), R8(48), R8(56), R8(64), R8(72), R8(80), R8(88), R8(96),
        R8(104), R8(112), R8(120)
      : "l"(da), "l"(db), "r"(acc));
#undef R8
}

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
      asm volatile(
          "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
          "[%4];" ::"r"(smem_u32(sa + kt * kTileA)),
          "l"(&ta), "r"(kt * 64), "r"(0), "r"(smem_u32(&bar))
          : "memory");
      asm volatile(
          "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
          "[%4];" ::"r"(smem_u32(sb + kt * kTileB)),
          "l"(&tb), "r"(kt * 64), "r"(0), "r"(smem_u32(&bar))
          : "memory");
    }
  }
  asm volatile(
      "{\n .reg .pred p;\n WAIT:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], 0;\n @!p bra WAIT;\n}" ::
          "r"(smem_u32(&bar))
      : "memory");
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

PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q;
  CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q));
  if (!fn || q != cudaDriverEntryPointSuccess) {
    std::printf("cuTensorMapEncodeTiled not found\n");
    std::exit(1);
  }
  return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
}

// A tensor map over a [rows, k] bf16 row-major matrix, boxes of [rows, 64] with 128-byte swizzle.
CUtensorMap map_of(const void* p, int rows, int k) {
  static const PFN_cuTensorMapEncodeTiled_v12000 enc = encoder();
  CUtensorMap m;
  cuuint64_t dim[2] = {cuuint64_t(k), cuuint64_t(rows)}, stride[1] = {cuuint64_t(k) * 2};
  cuuint32_t box[2] = {64, cuuint32_t(rows)}, estride[2] = {1, 1};
  if (enc(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(p), dim, stride, box, estride,
          CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
          CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
    std::printf("cuTensorMapEncodeTiled failed for [%d, %d]\n", rows, k);
    std::exit(1);
  }
  return m;
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
  const CUtensorMap ma = map_of(pa, 64, K), mb = map_of(pb, N, K);
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
