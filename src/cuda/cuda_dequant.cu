// Quantized model weights decoded on the device: the raw GGUF blocks are copied over (4-8 bits a weight
// instead of 32) and each thread decodes one block with the same inline decoders the CPU uses (core/quant.h),
// so device and host give identical values.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../core/quant.h"
#include "cuda_internal.h"

namespace retort::cuda {

namespace {

template <typename T>
__device__ void store(T* out, float v);
template <>
__device__ void store(float* out, float v) {
  *out = v;
}
template <>
__device__ void store(__nv_bfloat16* out, float v) {
  *out = __float2bfloat16_rn(v);
}
template <>
__device__ void store(__half* out, float v) {
  *out = __float2half_rn(v);
}

template <typename T>
__global__ void dequantize_kernel(QuantType t, const uint8_t* src, T* dst, int64_t blocks, int block_elems,
                                  int block_bytes) {
  const int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= blocks) return;
  float y[quant::kQKK];  // the largest block (a K-quant super-block)
  quant::dequant_block(t, src + b * block_bytes, y);
  for (int i = 0; i < block_elems; ++i) store(dst + b * block_elems + i, y[i]);
}

}  // namespace

void launch_dequantize(QuantType t, const uint8_t* src, DType out, void* dst, int64_t n,
                       cudaStream_t stream) {
  const QuantTraits& q = quant_traits(t);
  RT_CHECK(q.dequantizable && q.block_elems <= quant::kQKK, "dequantize: retort cannot decode ", q.name,
           " (it decodes ", dequantizable_types(), ")");
  RT_CHECK(n % q.block_elems == 0, "dequantize: ", n, " elements of ", q.name, " are not whole blocks of ",
           q.block_elems);
  const int64_t blocks = n / q.block_elems;
  if (blocks == 0) return;
  const int threads = 128;
  const unsigned grid = unsigned((blocks + threads - 1) / threads);
  const int be = int(q.block_elems), bb = int(q.block_bytes);
  switch (out) {
    case DType::F32:
      dequantize_kernel<<<grid, threads, 0, stream>>>(t, src, static_cast<float*>(dst), blocks, be, bb);
      break;
    case DType::BF16:
      dequantize_kernel<<<grid, threads, 0, stream>>>(t, src, static_cast<__nv_bfloat16*>(dst), blocks, be,
                                                      bb);
      break;
    case DType::F16:
      dequantize_kernel<<<grid, threads, 0, stream>>>(t, src, static_cast<__half*>(dst), blocks, be, bb);
      break;
    default:
      RT_CHECK(false, "dequantize: the output must be f32, bf16 or f16, got ", dtype_name(out));
  }
  RT_CUDA_LAUNCH_CHECK("dequantize_kernel");
}

}  // namespace retort::cuda
