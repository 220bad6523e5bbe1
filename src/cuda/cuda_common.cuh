// Device helpers shared by the kernels: the tensor descriptor kernels take by value, dtype load/store to f32,
// strided index helpers, deterministic warp/block reductions, and launch-shape helpers.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "../core/dtype.h"
#include "../core/op_table.h"
#include "../core/tensor.h"
#include "cuda_internal.h"

namespace retort::cuda {

// A tensor as a kernel sees it: data pointer, sizes and byte strides (ggml order), dtype.
struct TDesc {
  char* data;
  int64_t ne[4];
  int64_t nb[4];
  DType dtype;
};

inline TDesc desc(const Tensor* t) {
  TDesc d;
  d.data = static_cast<char*>(t->data);
  for (int i = 0; i < 4; ++i) {
    d.ne[i] = t->ne[i];
    d.nb[i] = int64_t(t->nb[i]);
  }
  d.dtype = t->dtype;
  return d;
}

inline bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// Whether t's rows take 8-wide access (load8f / store8f): a float dtype, dim 0 dense and a multiple of 8
// long, every row start 16-byte aligned.
inline bool rows_vec8(const Tensor* t) {
  if (!t || !is_float(t->dtype) || t->nb[0] != dtype_size(t->dtype) || t->ne[0] % 8 != 0 ||
      !aligned16(t->data))
    return false;
  for (int i = 1; i < 4; ++i)
    if (t->ne[i] > 1 && t->nb[i] % 16 != 0) return false;
  return true;
}

// The descriptor of a contiguous tensor of shape ne at data.
inline TDesc contiguous_desc(void* data, DType dtype, const int64_t ne[4]) {
  TDesc d;
  d.data = static_cast<char*>(data);
  d.dtype = dtype;
  int64_t stride = int64_t(dtype_size(dtype));
  for (int i = 0; i < 4; ++i) {
    d.ne[i] = ne[i];
    d.nb[i] = stride;
    stride *= ne[i];
  }
  return d;
}

// Copies every element of src into out (same shape), converting dtype; queued on ex.stream (cuda_views.cu).
void copy_elements(CudaExec& ex, const TDesc& out, const TDesc& src);
// acc[i] += g[i] for i < n, dense f32 (cuda_views.cu).
void accumulate_dense_f32(CudaExec& ex, float* acc, const float* g, int64_t n);

// ---- dtype load / store (the branch is uniform across a warp, so it costs little) -------------------------
__device__ __forceinline__ float load_f(const char* p, DType t) {
  switch (t) {
    case DType::F32:
      return *reinterpret_cast<const float*>(p);
    case DType::BF16:
      return __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(p));
    case DType::F16:
      return __half2float(*reinterpret_cast<const __half*>(p));
    case DType::I32:
      return float(*reinterpret_cast<const int32_t*>(p));
    case DType::I64:
      return float(*reinterpret_cast<const long long*>(p));
  }
  return 0.0f;
}

// Round to nearest even for bf16 and f16, like the CPU conversions in dtype.h.
__device__ __forceinline__ void store_f(char* p, DType t, float v) {
  switch (t) {
    case DType::F32:
      *reinterpret_cast<float*>(p) = v;
      break;
    case DType::BF16:
      *reinterpret_cast<__nv_bfloat16*>(p) = __float2bfloat16_rn(v);
      break;
    case DType::F16:
      *reinterpret_cast<__half*>(p) = __float2half_rn(v);
      break;
    case DType::I32:
      *reinterpret_cast<int32_t*>(p) = int32_t(v);
      break;
    case DType::I64:
      *reinterpret_cast<long long*>(p) = (long long)(v);
      break;
  }
}

// ---- 8-wide access: one 16-byte load or store for a 16-bit dtype, two for f32; p 16-byte aligned ----------
// Eight values per access keep enough bytes in flight per thread for memory-bound kernels to reach the
// bandwidth; one element per thread leaves them latency-bound at a quarter of it.
__device__ __forceinline__ void load8f(const char* p, DType t, float (&x)[8]) {
  if (t == DType::F32) {
    const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
    x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
    return;
  }
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 f = t == DType::BF16 ? __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[k]))
                                      : __half22float2(*reinterpret_cast<const __half2*>(&w[k]));
    x[2 * k] = f.x, x[2 * k + 1] = f.y;
  }
}

__device__ __forceinline__ void store8f(char* p, DType t, const float (&x)[8]) {
  if (t == DType::F32) {
    reinterpret_cast<float4*>(p)[0] = make_float4(x[0], x[1], x[2], x[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(x[4], x[5], x[6], x[7]);
    return;
  }
  uint32_t w[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if (t == DType::BF16) {
      const __nv_bfloat162 h = __floats2bfloat162_rn(x[2 * k], x[2 * k + 1]);
      w[k] = *reinterpret_cast<const uint32_t*>(&h);
    } else {
      const __half2 h = __floats2half2_rn(x[2 * k], x[2 * k + 1]);
      w[k] = *reinterpret_cast<const uint32_t*>(&h);
    }
  }
  *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
}

// A row's values i .. i + W (W = 8 on the vector path, where every operand passed rows_vec8, else 1).
template <int W>
__device__ __forceinline__ void load_w(const char* p, int64_t i, int64_t stride, DType t, float (&x)[W]) {
  if constexpr (W == 8) {
    load8f(p + i * stride, t, x);
  } else {
    x[0] = load_f(p + i * stride, t);
  }
}

template <int W>
__device__ __forceinline__ void store_w(char* p, int64_t i, int64_t stride, DType t, const float (&x)[W]) {
  if constexpr (W == 8) {
    store8f(p + i * stride, t, x);
  } else {
    store_f(p + i * stride, t, x[0]);
  }
}

__device__ __forceinline__ int dtype_size_dev(DType t) {
  return t == DType::I64 ? 8 : (t == DType::F32 || t == DType::I32 ? 4 : 2);
}

__device__ __forceinline__ long long load_i(const char* p, DType t) {
  return t == DType::I32 ? (long long)(*reinterpret_cast<const int32_t*>(p))
                         : *reinterpret_cast<const long long*>(p);
}

// ---- indices
// ----------------------------------------------------------------------------------------------- Coordinates
// of element i in logical (contiguous, dim 0 fastest) order of a shape ne.
__device__ __forceinline__ void unravel(int64_t i, const int64_t* ne, int64_t c[4]) {
  c[0] = i % ne[0];
  i /= ne[0];
  c[1] = i % ne[1];
  i /= ne[1];
  c[2] = i % ne[2];
  c[3] = i / ne[2];
}

__device__ __forceinline__ char* at(const TDesc& t, const int64_t c[4]) {
  return t.data + c[0] * t.nb[0] + c[1] * t.nb[1] + c[2] * t.nb[2] + c[3] * t.nb[3];
}

// Element c of a shape that t is broadcast over (t's dims are 1 or equal to it).
__device__ __forceinline__ char* at_bcast(const TDesc& t, const int64_t c[4]) {
  return t.data + (t.ne[0] == 1 ? 0 : c[0] * t.nb[0]) + (t.ne[1] == 1 ? 0 : c[1] * t.nb[1]) +
         (t.ne[2] == 1 ? 0 : c[2] * t.nb[2]) + (t.ne[3] == 1 ? 0 : c[3] * t.nb[3]);
}

// Start of row r (rows are dims 1..3, dim 1 fastest).
__device__ __forceinline__ char* row_at(const TDesc& t, int64_t r) {
  int64_t i1 = r % t.ne[1];
  int64_t q = r / t.ne[1];
  return t.data + i1 * t.nb[1] + (q % t.ne[2]) * t.nb[2] + (q / t.ne[2]) * t.nb[3];
}

__device__ __forceinline__ int64_t nrows(const TDesc& t) {
  return t.ne[1] * t.ne[2] * t.ne[3];
}
__device__ __forceinline__ int64_t nelem(const TDesc& t) {
  return t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3];
}

// Grid-stride loop over [0, n).
#define RT_GRID_LOOP(i, n)                                                  \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += int64_t(gridDim.x) * blockDim.x)

// Flat indices over contiguous operands: f.template operator()<V>(k) handles elements k .. k + V; groups of
// W = 8 when every operand is 16-byte aligned, then the n % 8 left one by one (V = 1).
template <int W, typename F>
__device__ __forceinline__ void flat_groups(int64_t n, F&& f) {
  RT_GRID_LOOP(q, n / W) {
    f.template operator()<W>(q * W);
  }
  if constexpr (W > 1) {
    RT_GRID_LOOP(k, n % W) {
      f.template operator()<1>(n - n % W + k);
    }
  }
}

// ---- device errors
// ----------------------------------------------------------------------------------------- Records the first
// bad value found (later ones are dropped); the host reports it at synchronize/read.
__device__ __forceinline__ void report_error(DeviceError* e, Op op, DeviceErrorKind kind, long long value,
                                             long long bound) {
  if (atomicCAS(&e->flag, 0, 1) == 0) {
    e->op = int(op);
    e->kind = int(kind);
    e->value = value;
    e->bound = bound;
  }
}

// ---- deterministic reductions
// ------------------------------------------------------------------------------ Butterfly (xor) shuffles:
// every lane ends with the same value, and the order of operations depends only on the lane layout, so
// results are bitwise reproducible run to run.
struct SumOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
  __device__ __forceinline__ double operator()(double a, double b) const { return a + b; }
};
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct MinI64Op {
  __device__ __forceinline__ long long operator()(long long a, long long b) const { return a < b ? a : b; }
};

template <typename T, typename Op>
__device__ __forceinline__ T warp_reduce(T v, Op op) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Reduces v over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// sh must hold 32 T in shared memory. Safe to call repeatedly with the same sh.
template <typename T, typename Op>
__device__ __forceinline__ T block_reduce(T v, Op op, T identity, T* sh) {
  v = warp_reduce(v, op);
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  __syncthreads();  // earlier readers of sh are done
  if (lane == 0) sh[w] = v;
  __syncthreads();
  if (w == 0) {
    T x = lane < nw ? sh[lane] : identity;
    x = warp_reduce(x, op);
    if (lane == 0) sh[0] = x;
  }
  __syncthreads();
  return sh[0];
}

// The running (max, sum of exp(x - max)) of an online softmax, and its merge. The merge is commutative, so
// the butterfly leaves every lane with the same bits.
struct MaxSum {
  float m, s;
};
__device__ __forceinline__ MaxSum maxsum_add(MaxSum a, float x) {
  if (x > a.m) {
    a.s = a.s * expf(a.m - x) + 1.0f;  // a.m = -inf gives exp(-inf) = 0
    a.m = x;
  } else if (x != -INFINITY) {
    a.s += expf(x - a.m);
  }
  return a;
}
__device__ __forceinline__ MaxSum maxsum_merge(MaxSum a, MaxSum b) {
  float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.0f};
  return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}
__device__ __forceinline__ MaxSum warp_maxsum(MaxSum v) {
  for (int o = 16; o > 0; o >>= 1) {
    MaxSum w{__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o)};
    v = maxsum_merge(v, w);
  }
  return v;
}
// sh must hold 32 MaxSum in shared memory.
__device__ __forceinline__ MaxSum block_maxsum(MaxSum v, MaxSum* sh) {
  v = warp_maxsum(v);
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) sh[w] = v;
  __syncthreads();
  if (w == 0) {
    MaxSum x = lane < nw ? sh[lane] : MaxSum{-INFINITY, 0.0f};
    x = warp_maxsum(x);
    if (lane == 0) sh[0] = x;
  }
  __syncthreads();
  return sh[0];
}

// ---- launch shapes
// -----------------------------------------------------------------------------------------
inline constexpr int kBlock = 256;

// Threads per block for a kernel that gives one block to each row of n elements. Such kernels (and every
// kernel launched with 1024 threads) are declared __launch_bounds__(1024), so the compiler keeps their
// register use low enough for the largest block.
inline int row_block(int64_t n) {
  if (n >= 8192) return 1024;
  if (n >= 2048) return 512;
  if (n >= 512) return 256;
  if (n >= 128) return 128;
  if (n >= 64) return 64;
  return 32;
}

// Blocks for a one-block-per-row kernel (rows beyond the grid are covered by a stride loop).
inline unsigned row_grid(int64_t rows) {
  return unsigned(rows < 2147483647LL ? rows : 2147483647LL);
}

}  // namespace retort::cuda
