// The K-sparse top-K path of the CUDA ChunkExecutor (see cuda_chunk_kernels.h): the student logits at the
// teacher's K ids as K dot products per row, and the gradients as K-sparse updates, all deterministic.
//
//   gather:   one block per row, one warp per slot; the dot product is a fixed per-lane order plus a
//   butterfly,
//             so a logit has the same bits whatever the chunking.
//   dhidden:  one block per row, one thread per column, the slots of the row (staged in shared memory, 256
//             at a time) added in slot order — the CPU executor's order.
//   dW, dbias: every valid slot becomes (key = id, value = r·K + k); a stable radix sort (CUB) groups them by
//             id with rows (then slots) in order, and one warp per distinct id adds its updates in that
//             order. No atomics: dW does not depend on the grid, and across chunks it accumulates in row
//             order.
// A slot whose id is out of range is padding here (validate() has already recorded the error).
#include <cub/device/device_radix_sort.cuh>

#include "../cuda_common.cuh"
#include "cuda_chunk_kernels.h"
#include "fused_device.cuh"

namespace retort::cuda::fused {

namespace {

constexpr int kSlotTile = kBlock;  // slots staged per step by the dhidden kernel (one per thread)

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

// kVec: hidden and w are both T with dense rows, 16-byte aligned, H a multiple of 8 (checked on the host);
// otherwise every element goes through load_f.
template <bool kVec, typename T>
__global__ void gather_kernel(BD x, BD w, BD bias, BD ids, BD logprobs, BD mask, BD out, int64_t v) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int64_t h = x.cols, kk = out.cols;
  for (int64_t r = blockIdx.x; r < x.rows; r += gridDim.x) {
    for (int64_t k = warp; k < kk; k += nw) {
      float* o = reinterpret_cast<float*>(el(out, r, k));
      const long long id = slot_id(ids, logprobs, mask, r, k, v);  // the same in every lane
      if (id < 0) {
        if (lane == 0) *o = 0.0f;
        continue;
      }
      float s = 0.0f;
      if constexpr (kVec) {
        const T* xr = reinterpret_cast<const T*>(el(x, r, 0));
        const T* wr = reinterpret_cast<const T*>(el(w, id, 0));
        for (int64_t j = int64_t(lane) * 8; j < h; j += 32 * 8) {
          float a[8], b[8];
          load8(xr + j, a);
          load8(wr + j, b);
#pragma unroll
          for (int i = 0; i < 8; ++i) s = fmaf(a[i], b[i], s);
        }
      } else {
        for (int64_t j = lane; j < h; j += 32)
          s = fmaf(load_f(el(x, r, j), x.dtype), load_f(el(w, id, j), w.dtype), s);
      }
      s = warp_reduce(s, SumOp{});
      if (lane == 0) *o = s + (bias.data ? load_f(el(bias, 0, id), bias.dtype) : 0.0f);
    }
  }
}

// dhidden[r, j] = Σ_k g[r, k]·w[id_rk, j] over the valid slots with g != 0, in slot order. blockDim.x must be
// kSlotTile.
__global__ void dhidden_kernel(BD g, BD w, BD ids, BD logprobs, BD mask, BD dh, int64_t v) {
  __shared__ long long s_id[kSlotTile];
  __shared__ float s_g[kSlotTile];
  const int64_t h = dh.cols, kk = g.cols;
  for (int64_t r = blockIdx.x; r < g.rows; r += gridDim.x) {
    for (int64_t h0 = 0; h0 < h; h0 += blockDim.x) {
      const int64_t j = h0 + threadIdx.x;
      float acc = 0.0f;
      for (int64_t k0 = 0; k0 < kk; k0 += kSlotTile) {
        const int n = int(kk - k0 < kSlotTile ? kk - k0 : kSlotTile);
        __syncthreads();  // the previous tile is no longer read
        if (threadIdx.x < n) {
          const int64_t k = k0 + threadIdx.x;
          const float gv = *reinterpret_cast<const float*>(el(g, r, k));
          s_g[threadIdx.x] = gv;
          s_id[threadIdx.x] = gv != 0.0f ? slot_id(ids, logprobs, mask, r, k, v) : -1;
        }
        __syncthreads();
        if (j < h)
          for (int q = 0; q < n; ++q)
            if (s_id[q] >= 0) acc = fmaf(s_g[q], load_f(el(w, s_id[q], j), w.dtype), acc);
      }
      if (j < h) *reinterpret_cast<float*>(el(dh, r, j)) = acc;
    }
  }
}

// key = id of a valid slot with g != 0, else v (sorted last, skipped); value = r·K + k.
__global__ void keys_kernel(BD g, BD ids, BD logprobs, BD mask, int64_t v, int* keys, int* vals) {
  const int64_t kk = g.cols;
  RT_GRID_LOOP(e, g.rows * kk) {
    const int64_t r = e / kk, k = e % kk;
    const float gv = *reinterpret_cast<const float*>(el(g, r, k));
    const long long id = gv != 0.0f ? slot_id(ids, logprobs, mask, r, k, v) : -1;
    keys[e] = id >= 0 ? int(id) : int(v);
    vals[e] = int(e);
  }
}

// One warp per sorted position; the warp at the first position of an id applies that id's updates in order.
__global__ void dw_kernel(const int* keys, const int* vals, int64_t count, int64_t v, BD g, BD x, BD dw,
                          BD dbias) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = (int64_t(gridDim.x) * blockDim.x) >> 5;
  const int kk = int(g.cols);
  for (int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5; i < count; i += warps) {
    const int id = keys[i];
    if (id >= v || (i > 0 && keys[i - 1] == id)) continue;  // uniform over the warp
    int64_t end = i + 1;
    while (end < count && keys[end] == id) ++end;
    if (dw.data) {
      for (int64_t j = lane; j < dw.cols; j += 32) {
        float* p = reinterpret_cast<float*>(el(dw, id, j));
        float acc = *p;
        for (int64_t q = i; q < end; ++q) {
          const int e = vals[q], r = e / kk, k = e % kk;
          acc = fmaf(*reinterpret_cast<const float*>(el(g, r, k)), load_f(el(x, r, j), x.dtype), acc);
        }
        *p = acc;
      }
    }
    if (dbias.data && lane == 0) {
      float* p = reinterpret_cast<float*>(el(dbias, 0, id));
      float b = *p;
      for (int64_t q = i; q < end; ++q) {
        const int e = vals[q];
        b += *reinterpret_cast<const float*>(el(g, e / kk, e % kk));
      }
      *p = b;
    }
  }
}

// The same updates, vectorized: each lane owns 8 consecutive columns of dW (two float4) and of the hidden
// rows (one 16-byte load), and the id's updates are read once per 32 by the lanes and broadcast with
// shuffles. Same order of additions per element as dw_kernel (updates in sorted order, one fma each), so
// the same bits. x is T with dense 16-byte-aligned rows, dW dense f32 rows 16-byte aligned, H % 8 == 0.
template <typename T>
__global__ void dw_vec_kernel(const int* keys, const int* vals, int64_t count, int64_t v, BD g, BD x, BD dw,
                              BD dbias) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = (int64_t(gridDim.x) * blockDim.x) >> 5;
  const int kk = int(g.cols);
  const int64_t groups = dw.data ? dw.cols / 8 : 0;
  for (int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5; i < count; i += warps) {
    const int id = keys[i];
    if (id >= v || (i > 0 && keys[i - 1] == id)) continue;  // uniform over the warp
    int64_t end = i + 1;
    while (end < count && keys[end] == id) ++end;
    float bsum = 0.0f;
    if (dbias.data && lane == 0) bsum = *reinterpret_cast<const float*>(el(dbias, 0, id));
    float* drow = dw.data ? reinterpret_cast<float*>(el(dw, id, 0)) : nullptr;
    for (int64_t q0 = i; q0 < end; q0 += 32) {
      const int nq = int(min(int64_t(32), end - q0));
      int my_r = 0;
      float my_g = 0.0f;
      if (lane < nq) {
        const int e = vals[q0 + lane];
        my_r = e / kk;
        my_g = *reinterpret_cast<const float*>(el(g, my_r, e % kk));
      }
      if (dbias.data)
        for (int t = 0; t < nq; ++t) {
          const float gv = __shfl_sync(0xffffffffu, my_g, t);
          if (lane == 0) bsum += gv;
        }
      for (int64_t base = 0; base < groups; base += 32) {
        const int64_t c8 = base + lane;
        const bool on = c8 < groups;
        float acc[8];
        if (on) load8(drow + c8 * 8, acc);
        for (int t = 0; t < nq; ++t) {
          const int r = __shfl_sync(0xffffffffu, my_r, t);
          const float gv = __shfl_sync(0xffffffffu, my_g, t);
          if (!on) continue;
          float xv[8];
          load8(reinterpret_cast<const T*>(el(x, r, c8 * 8)), xv);
#pragma unroll
          for (int k = 0; k < 8; ++k) acc[k] = fmaf(gv, xv[k], acc[k]);
        }
        if (on) {
          float4* o = reinterpret_cast<float4*>(drow + c8 * 8);
          o[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
          o[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
        }
      }
    }
    if (dbias.data && lane == 0) *reinterpret_cast<float*>(el(dbias, 0, id)) = bsum;
  }
}

bool aligned16(const Block& b) {
  return (reinterpret_cast<uintptr_t>(b.data) % 16 == 0) && (b.rows <= 1 || b.row_stride % 16 == 0);
}

template <typename T>
void launch_gather(CudaExec& ex, bool vec, const BD& x, const BD& w, const BD& bias, const BD& ids,
                   const BD& lp, const BD& mask, const BD& out, int64_t v) {
  const unsigned grid = unsigned(std::min<int64_t>(x.rows, int64_t(ex.sm_count) * 16));
  if (vec)
    gather_kernel<true, T><<<grid, kBlock, 0, ex.stream>>>(x, w, bias, ids, lp, mask, out, v);
  else
    gather_kernel<false, T><<<grid, kBlock, 0, ex.stream>>>(x, w, bias, ids, lp, mask, out, v);
  RT_CUDA_LAUNCH_CHECK("gather_kernel");
}

}  // namespace

void gather_topk_logits(CudaExec& ex, const Block& hidden, const Block& w, const Block& bias,
                        const loss::TopKSide& side, const Block& out) {
  if (hidden.rows == 0) return;
  RT_ASSERT(out.dtype == DType::F32 && out.cols == side.logprobs.cols && !side.ids.empty());
  const int64_t h = hidden.cols, es = int64_t(dtype_size(hidden.dtype));
  const bool vec = hidden.dtype == w.dtype && h % 8 == 0 && int64_t(hidden.col_stride) == es &&
                   int64_t(w.col_stride) == es && aligned16(hidden) && aligned16(w);
  const BD x = bd(hidden), wd = bd(w), b = bd(bias), ids = bd(side.ids), lp = bd(side.logprobs),
           mask = bd(side.mask), o = bd(out);
  switch (vec ? hidden.dtype : DType::F32) {
    case DType::BF16:
      launch_gather<__nv_bfloat16>(ex, true, x, wd, b, ids, lp, mask, o, w.rows);
      break;
    case DType::F16:
      launch_gather<__half>(ex, true, x, wd, b, ids, lp, mask, o, w.rows);
      break;
    default:
      launch_gather<float>(ex, vec, x, wd, b, ids, lp, mask, o, w.rows);
      break;
  }
}

void scatter_topk_grads(CudaExec& ex, const Block& g, const Block& hidden, const Block& w,
                        const loss::TopKSide& side, const Block& dhidden, const Block& dw,
                        const Block& dbias) {
  if (g.rows == 0) return;
  const int64_t v = w.rows;
  const BD gd = bd(g), ids = bd(side.ids), lp = bd(side.logprobs), mask = bd(side.mask);
  if (!dhidden.empty()) {
    const unsigned grid = unsigned(std::min<int64_t>(g.rows, int64_t(ex.sm_count) * 16));
    dhidden_kernel<<<grid, kSlotTile, 0, ex.stream>>>(gd, bd(w), ids, lp, mask, bd(dhidden), v);
    RT_CUDA_LAUNCH_CHECK("dhidden_kernel");
  }
  if (dw.empty() && dbias.empty()) return;
  const int64_t count = g.rows * g.cols;
  RT_CHECK(count < (int64_t(1) << 31) && v < (int64_t(1) << 31), "fused top-K: ", g.rows,
           " rows x K = ", g.cols, " slots (or V = ", v,
           ") is too many for one chunk's sort; lower memory_budget or chunk_rows");
  // keys_in, vals_in, keys_out, vals_out, then CUB's temporary storage.
  auto buf = ex.temp(4 * size_t(count) * sizeof(int));
  int* keys_in = buf->as<int>();
  int* vals_in = keys_in + count;
  int* keys_out = vals_in + count;
  int* vals_out = keys_out + count;
  keys_kernel<<<ex.grid_for(count, kBlock), kBlock, 0, ex.stream>>>(gd, ids, lp, mask, v, keys_in, vals_in);
  RT_CUDA_LAUNCH_CHECK("keys_kernel");
  int end_bit = 1;
  while (end_bit < 31 && (int64_t(1) << end_bit) <= v) ++end_bit;  // keys are in [0, v]
  size_t temp_bytes = 0;
  RT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, keys_out, vals_in, vals_out,
                                                int(count), 0, end_bit, ex.stream));
  auto temp = ex.temp(std::max<size_t>(temp_bytes, 1));
  RT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp->data(), temp_bytes, keys_in, keys_out, vals_in,
                                                vals_out, int(count), 0, end_bit, ex.stream));
  const bool vec = (dw.empty() || (aligned16(dw) && dw.col_stride == sizeof(float) && dw.cols % 8 == 0)) &&
                   aligned16(hidden) && hidden.col_stride == dtype_size(hidden.dtype) && hidden.cols % 8 == 0;
  const unsigned grid = unsigned(ex.grid_for(count * 32, kBlock));
  if (vec && hidden.dtype == DType::BF16) {
    dw_vec_kernel<__nv_bfloat16>
        <<<grid, kBlock, 0, ex.stream>>>(keys_out, vals_out, count, v, gd, bd(hidden), bd(dw), bd(dbias));
  } else if (vec && hidden.dtype == DType::F16) {
    dw_vec_kernel<__half>
        <<<grid, kBlock, 0, ex.stream>>>(keys_out, vals_out, count, v, gd, bd(hidden), bd(dw), bd(dbias));
  } else if (vec && hidden.dtype == DType::F32) {
    dw_vec_kernel<float>
        <<<grid, kBlock, 0, ex.stream>>>(keys_out, vals_out, count, v, gd, bd(hidden), bd(dw), bd(dbias));
  } else {
    dw_kernel<<<grid, kBlock, 0, ex.stream>>>(keys_out, vals_out, count, v, gd, bd(hidden), bd(dw),
                                              bd(dbias));
  }
  RT_CUDA_LAUNCH_CHECK("dw_kernel");
}

}  // namespace retort::cuda::fused
