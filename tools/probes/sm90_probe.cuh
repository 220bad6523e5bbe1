// Shared pieces of the sm_90a probes: CUDA error checks, the library's PTX wrappers (src/cuda/loss/sm90_ops.cuh:
// shared-memory descriptors for 128-byte swizzled K-major operands, the m64n256k16 bf16 wgmma, mbarrier waits,
// TMA loads) plus the m64n64k16 wgmma, 2-D tensor maps (cuTensorMapEncodeTiled through the runtime's driver
// entry point, so nothing links libcuda), a bf16 fill and an event timer.
#pragma once
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CK(x)                                              \
  do {                                                     \
    cudaError_t e_ = (x);                                  \
    if (e_ != cudaSuccess) {                               \
      std::printf("%s: %s\n", #x, cudaGetErrorString(e_)); \
      std::exit(1);                                        \
    }                                                      \
  } while (0)

// smem_u32, smem_desc, mma_n256, bar_wait, bar_arrive, tma_load_2d: the library's own (sm90_ops.cuh).
#include "../../src/cuda/loss/sm90_ops.cuh"
using namespace retort::cuda::sm90;

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

// A tensor map over a [rows, k] bf16 row-major matrix, boxes of [box_rows, 64] with 128-byte swizzle.
CUtensorMap map_of(const void* p, int rows, int k, int box_rows) {
  static const PFN_cuTensorMapEncodeTiled_v12000 enc = encoder();
  CUtensorMap m;
  cuuint64_t dim[2] = {cuuint64_t(k), cuuint64_t(rows)}, stride[1] = {cuuint64_t(k) * 2};
  cuuint32_t box[2] = {64, cuuint32_t(box_rows)}, estride[2] = {1, 1};
  if (enc(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(p), dim, stride, box, estride,
          CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
          CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
    std::printf("cuTensorMapEncodeTiled failed for [%d, %d]\n", rows, k);
    std::exit(1);
  }
  return m;
}

// Uniform bf16 values in ±scale/2 from a hash of the index (the same on every run).
__global__ void fill(__nv_bfloat16* p, size_t n, uint32_t seed, float scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    p[i] = __float2bfloat16((float(h & 0xffff) / 65535.0f - 0.5f) * scale);
  }
}

// Mean milliseconds of f over reps calls after warm calls, by CUDA events on the default stream.
template <typename F>
float time_ms(F f, int warm = 3, int reps = 20) {
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  for (int i = 0; i < warm; ++i) f();
  cudaEventRecord(e0);
  for (int i = 0; i < reps; ++i) f();
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return ms / reps;
}
