// Device-side view of a loss::Block for the CUDA ChunkExecutor's kernels: a trivially copyable descriptor
// (byte strides, dtype) and the top-K slot rule shared with the row kernels.
#pragma once
#include "../cuda_common.cuh"
#include "cuda_chunk_kernels.h"

namespace retort::cuda::fused {

// Element (r, c) at data + r * rs + c * cs (bytes). data null: absent.
struct BD {
  char* data = nullptr;
  DType dtype = DType::F32;
  int64_t rows = 0, cols = 0, rs = 0, cs = 0;
};

inline BD bd(const Block& b) {
  return {static_cast<char*>(b.data), b.dtype, b.rows, b.cols, int64_t(b.row_stride), int64_t(b.col_stride)};
}

__device__ __forceinline__ char* el(const BD& b, int64_t r, int64_t c) {
  return b.data + r * b.rs + c * b.cs;
}

__device__ __forceinline__ bool nonzero_at(const BD& b, int64_t r, int64_t c) {
  const char* p = el(b, r, c);
  return (b.dtype == DType::I32 || b.dtype == DType::I64) ? load_i(p, b.dtype) != 0
                                                          : load_f(p, b.dtype) != 0.0f;
}

// The slot rule of row_kernels.h: slot (r, k) is valid when mask[r, k] != 0 (or no mask) and
// logprobs[r, k] != −inf.
__device__ __forceinline__ bool slot_on(const BD& logprobs, const BD& mask, int64_t r, int64_t k) {
  if (mask.data && !nonzero_at(mask, r, k)) return false;
  return load_f(el(logprobs, r, k), logprobs.dtype) != -INFINITY;
}

}  // namespace retort::cuda::fused
