// Device helpers shared by the K-sparse top-K kernels (cuda_sparse_topk.cu: the gather and the scatter;
// sparse_fkl.cu: the forward-KL pass): the slot rule by id, 8-wide loads and stores of weight, hidden and
// gradient rows, and the alignment test their vector paths need.
#pragma once
#include "../cuda_common.cuh"
#include "cuda_chunk_kernels.h"
#include "fused_device.cuh"
#include "row_common.cuh"

namespace retort::cuda::fused {

// The id of slot (r, k), or −1 for a padding slot (invalid, or an id outside [0, v)).
__device__ __forceinline__ long long slot_id(const BD& ids, const BD& logprobs, const BD& mask, int64_t r,
                                             int64_t k, int64_t v) {
  if (!slot_on(logprobs, mask, r, k)) return -1;
  const long long id = load_i(el(ids, r, k), ids.dtype);
  return id >= 0 && id < v ? id : -1;
}

// Eight consecutive elements as f32 (p 16-byte aligned).
__device__ __forceinline__ void load8(const float* p, float f[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
}
__device__ __forceinline__ void load8(const __nv_bfloat16* p, float f[8]) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 t = __bfloat1622float2(h[i]);
    f[2 * i] = t.x, f[2 * i + 1] = t.y;
  }
}
__device__ __forceinline__ void load8(const __half* p, float f[8]) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const __half2* h = reinterpret_cast<const __half2*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 t = __half22float2(h[i]);
    f[2 * i] = t.x, f[2 * i + 1] = t.y;
  }
}

// Streaming stores (st.global.cs): the f32 gradient rows are written once and not read again by this
// pass, so they should not push the chunk's hidden rows (re-read from L2 by the dW update) out of L2.
__device__ __forceinline__ void store8(float* p, const float f[8]) {
  __stcs(reinterpret_cast<float4*>(p), make_float4(f[0], f[1], f[2], f[3]));
  __stcs(reinterpret_cast<float4*>(p) + 1, make_float4(f[4], f[5], f[6], f[7]));
}

// Eight consecutive elements as loaded (rowk::Raw8: 16 bytes of a 16-bit type, 32 of f32, plain global
// loads), widened to f32 by rowk::unpack8 only where they are used: fewer registers while a row's loads are
// in flight.
using rowk::Raw8;
template <typename T>
__device__ __forceinline__ Raw8<T> load_raw8(const T* p) {
  return rowk::load_raw8_plain(p);
}

// Rows of b 16-byte aligned (the base and, with more than one row, the row stride).
inline bool aligned16(const Block& b) {
  return (reinterpret_cast<uintptr_t>(b.data) % 16 == 0) && (b.rows <= 1 || b.row_stride % 16 == 0);
}

}  // namespace retort::cuda::fused
