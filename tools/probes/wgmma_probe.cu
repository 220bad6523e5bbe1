// Groundwork for a fused-loss GEMM of our own (issue 4): checks, on an sm_90 GPU, that operands loaded by the
// tensor memory accelerator with 128-byte swizzle feed wgmma through shared-memory descriptors as encoded
// here. Not part of the build. On a GPU machine:
//     nvcc -std=c++17 -O2 -gencode arch=compute_90a,code=sm_90a -o /tmp/wgmma_probe
//     tools/probes/wgmma_probe.cu /tmp/wgmma_probe
// Cases, each against a float64 reference of the same bf16 inputs, outputs poisoned (NaN) first:
//   m64n64k16 over K = 64 (one 128-byte row per operand row), the descriptor's start address advanced 32
//   bytes per 16-element K step; the same without the advance, which must fail (the check can fail);
//   m64n256k16 over K = 128 (two 64-element TMA boxes per operand).
// Descriptor (64 bits): start address >> 4 in bits 0-13, leading byte offset >> 4 in 16-29 (unused for
// swizzled K-major operands: 1), stride byte offset >> 4 in 32-45 (1024: eight 128-byte rows), swizzle in
// 62-63 (1: 128 B). wgmma needs the arch-specific target sm_90a. H100, session 16: the first and third cases
// exact to 7e-7, the control off in 4093 of 4096 entries.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <vector>

#define CK(x)                                        \
  do {                                               \
    cudaError_t e = (x);                             \
    if (e != cudaSuccess) {                          \
      printf("%s: %s\n", #x, cudaGetErrorString(e)); \
      exit(1);                                       \
    }                                                \
  } while (0)

__device__ __forceinline__ uint32_t sa(const void* p) {
  return uint32_t(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ uint64_t desc(const void* p, uint32_t sbo_bytes) {
  uint64_t d = 0;
  d |= uint64_t((sa(p) & 0x3FFFF) >> 4);  // bits 0-13
  d |= uint64_t(1) << 16;                 // LBO (unused for swizzled K-major)
  d |= uint64_t(sbo_bytes >> 4) << 32;    // SBO
  d |= uint64_t(1) << 62;                 // 128B swizzle
  return d;
}

__global__ void probe(const __grid_constant__ CUtensorMap ta, const __grid_constant__ CUtensorMap tb,
                      float* out, int mode) {
  __shared__ alignas(1024) __nv_bfloat16 sA[64 * 64];
  __shared__ alignas(1024) __nv_bfloat16 sB[64 * 64];
  __shared__ alignas(8) uint64_t bar;
  const int t = threadIdx.x;
  if (t == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(sa(&bar)));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (t == 0) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(sa(&bar)),
                 "r"(2 * 64 * 64 * 2)
                 : "memory");
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
        "[%4];" ::"r"(sa(sA)),
        "l"(&ta), "r"(0), "r"(0), "r"(sa(&bar))
        : "memory");
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
        "[%4];" ::"r"(sa(sB)),
        "l"(&tb), "r"(0), "r"(0), "r"(sa(&bar))
        : "memory");
  }
  asm volatile(
      "{\n .reg .pred p;\n W:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], 0;\n @!p bra W;\n}" ::"r"(
          sa(&bar))
      : "memory");
  float d[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) d[i] = 0.0f;
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    // K step k: 16 elements = 32 bytes further along each 128-byte row
    const uint64_t da = desc(reinterpret_cast<const char*>(sA) + (mode == 1 ? 0 : 32 * k), 1024);
    const uint64_t db = desc(reinterpret_cast<const char*>(sB) + (mode == 1 ? 0 : 32 * k), 1024);
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%"
        "27,%28,%29,%30,%31},"
        " %32, %33, p, 1, 1, 0, 0;\n}"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
          "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),
          "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),
          "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(da), "l"(db), "r"(k));
  }
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  // D fragment: warp w rows 16w.., lane l: row 16w + l/4 (+8), cols (l%4)*2 + 8i (+1)
  const int w = t / 32, l = t % 32;
  for (int i = 0; i < 8; ++i) {
    const int r = 16 * w + l / 4, c = (l % 4) * 2 + 8 * i;
    out[r * 64 + c] = d[4 * i + 0];
    out[r * 64 + c + 1] = d[4 * i + 1];
    out[(r + 8) * 64 + c] = d[4 * i + 2];
    out[(r + 8) * 64 + c + 1] = d[4 * i + 3];
  }
}

// n256 variant: D[64x256] = A[64x128] * B[256x128]^T, K in two 64-element tiles (one TMA box each per
// operand)
__global__ void probe256(const __grid_constant__ CUtensorMap ta, const __grid_constant__ CUtensorMap tb,
                         float* out) {
  extern __shared__ __align__(1024) unsigned char smraw[];
  unsigned char* base =
      reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smraw) + 1023) & ~uintptr_t(1023));
  __nv_bfloat16* sA = reinterpret_cast<__nv_bfloat16*>(base);          // 2 tiles x [64 rows x 64] = 16 KB
  __nv_bfloat16* sB = reinterpret_cast<__nv_bfloat16*>(base + 16384);  // 2 tiles x [256 rows x 64] = 64 KB
  __shared__ alignas(8) uint64_t bar;
  const int t = threadIdx.x;
  if (t == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(sa(&bar)));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (t == 0) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(sa(&bar)),
                 "r"((64 + 256) * 128 * 2)
                 : "memory");
    for (int kt = 0; kt < 2; ++kt) {
      asm volatile(
          "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
          "[%4];" ::"r"(sa(sA + kt * 64 * 64)),
          "l"(&ta), "r"(kt * 64), "r"(0), "r"(sa(&bar))
          : "memory");
      asm volatile(
          "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
          "[%4];" ::"r"(sa(sB + kt * 256 * 64)),
          "l"(&tb), "r"(kt * 64), "r"(0), "r"(sa(&bar))
          : "memory");
    }
  }
  asm volatile(
      "{\n .reg .pred p;\n W2:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], 0;\n @!p bra W2;\n}" ::"r"(
          sa(&bar))
      : "memory");
  float d[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) d[i] = 0.0f;
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const int kt = k / 4, ks = k % 4;
    const uint64_t da = desc(reinterpret_cast<const char*>(sA + kt * 64 * 64) + 32 * ks, 1024);
    const uint64_t db = desc(reinterpret_cast<const char*>(sB + kt * 256 * 64) + 32 * ks, 1024);
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%"
        "27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%"
        "52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%"
        "77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%"
        "101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%"
        "121,%122,%123,%124,%125,%126,%127},"
        " %128, %129, p, 1, 1, 0, 0;\n}"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
          "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),
          "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),
          "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
          "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),
          "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),
          "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
          "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
          "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]),
          "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]),
          "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]),
          "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]),
          "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]),
          "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]),
          "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]),
          "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
          "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]),
          "+f"(d[127])
        : "l"(da), "l"(db), "r"(k));
  }
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  const int w = t / 32, l = t % 32;
  for (int i = 0; i < 32; ++i) {
    const int r = 16 * w + l / 4, c = (l % 4) * 2 + 8 * i;
    out[r * 256 + c] = d[4 * i + 0];
    out[r * 256 + c + 1] = d[4 * i + 1];
    out[(r + 8) * 256 + c] = d[4 * i + 2];
    out[(r + 8) * 256 + c + 1] = d[4 * i + 3];
  }
}

int main() {
  PFN_cuTensorMapEncodeTiled_v12000 enc = nullptr;
  cudaDriverEntryPointQueryResult q;
  CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", reinterpret_cast<void**>(&enc), 12000,
                                      cudaEnableDefault, &q));
  if (!enc || q != cudaDriverEntryPointSuccess) {
    printf("no cuTensorMapEncodeTiled\n");
    return 1;
  }
  std::vector<__nv_bfloat16> ha(64 * 64), hb(64 * 64);
  srand(3);
  for (auto& x : ha) x = __float2bfloat16(float(rand()) / RAND_MAX - 0.5f);
  for (auto& x : hb) x = __float2bfloat16(float(rand()) / RAND_MAX - 0.5f);
  __nv_bfloat16 *da, *db;
  float* dout;
  CK(cudaMalloc(&da, 8192));
  CK(cudaMalloc(&db, 8192));
  CK(cudaMalloc(&dout, 64 * 64 * 4));
  CK(cudaMemcpy(da, ha.data(), 8192, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(db, hb.data(), 8192, cudaMemcpyHostToDevice));
  CUtensorMap ta, tb;
  for (int which = 0; which < 2; ++which) {
    cuuint64_t gdim[2] = {64, 64}, gstride[1] = {64 * 2};
    cuuint32_t box[2] = {64, 64}, estr[2] = {1, 1};
    CUresult r = enc(which ? &tb : &ta, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, which ? (void*)db : (void*)da,
                     gdim, gstride, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                     CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
      printf("encode failed %d\n", int(r));
      return 1;
    }
  }
  for (int mode = 0; mode < 2; ++mode) {
    CK(cudaMemset(dout, 0xff, 64 * 64 * 4));  // poison: NaN
    probe<<<1, 128>>>(ta, tb, dout, mode);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    std::vector<float> ho(64 * 64);
    CK(cudaMemcpy(ho.data(), dout, 64 * 64 * 4, cudaMemcpyDeviceToHost));
    double worst = 0;
    int bad = 0;
    for (int i = 0; i < 64; ++i)
      for (int j = 0; j < 64; ++j) {
        double ref = 0;
        for (int k = 0; k < 64; ++k)
          ref += double(__bfloat162float(ha[i * 64 + k])) * double(__bfloat162float(hb[j * 64 + k]));
        const double e = std::fabs(ref - ho[i * 64 + j]);
        if (!(e <= 1e-3)) ++bad;
        if (e > worst || std::isnan(e)) worst = std::isnan(e) ? 1e30 : e;
      }
    printf("mode %d (%s): worst abs err %.3g, %d of 4096 off by > 1e-3\n", mode,
           mode == 0 ? "start address + 32 B per K step" : "control: no K advance (expected wrong)", worst,
           bad);
  }
  {  // n256, K = 128
    std::vector<__nv_bfloat16> a2(64 * 128), b2(256 * 128);
    for (auto& x : a2) x = __float2bfloat16(float(rand()) / RAND_MAX - 0.5f);
    for (auto& x : b2) x = __float2bfloat16(float(rand()) / RAND_MAX - 0.5f);
    __nv_bfloat16 *pa, *pb;
    float* po;
    CK(cudaMalloc(&pa, a2.size() * 2));
    CK(cudaMalloc(&pb, b2.size() * 2));
    CK(cudaMalloc(&po, 64 * 256 * 4));
    CK(cudaMemcpy(pa, a2.data(), a2.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(pb, b2.data(), b2.size() * 2, cudaMemcpyHostToDevice));
    CUtensorMap m2a, m2b;
    cuuint64_t ga[2] = {128, 64}, gb[2] = {128, 256}, gs[1] = {128 * 2};
    cuuint32_t ba[2] = {64, 64}, bb[2] = {64, 256}, es[2] = {1, 1};
    if (enc(&m2a, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, pa, ga, gs, ba, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS ||
        enc(&m2b, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, pb, gb, gs, bb, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
      printf("encode 256 failed\n");
      return 1;
    }
    const int smem = 16384 + 65536 + 1024;
    CK(cudaFuncSetAttribute(probe256, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    CK(cudaMemset(po, 0xff, 64 * 256 * 4));
    probe256<<<1, 128, smem>>>(m2a, m2b, po);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    std::vector<float> ho(64 * 256);
    CK(cudaMemcpy(ho.data(), po, ho.size() * 4, cudaMemcpyDeviceToHost));
    double worst = 0;
    int bad = 0;
    for (int i = 0; i < 64; ++i)
      for (int j = 0; j < 256; ++j) {
        double ref = 0;
        for (int k = 0; k < 128; ++k)
          ref += double(__bfloat162float(a2[i * 128 + k])) * double(__bfloat162float(b2[j * 128 + k]));
        const double e = std::fabs(ref - ho[i * 256 + j]);
        if (!(e <= 1e-3)) ++bad;
        if (std::isnan(e))
          worst = 1e30;
        else if (e > worst)
          worst = e;
      }
    printf("n256 K=128 (two 64-wide TMA boxes per operand): worst abs err %.3g, %d of 16384 off by > 1e-3\n",
           worst, bad);
  }
  return 0;
}
