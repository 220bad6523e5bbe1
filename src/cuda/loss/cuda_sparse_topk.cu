// The K-sparse top-K path of the CUDA ChunkExecutor (see cuda_chunk_kernels.h): the student logits at the
// teacher's K ids as K dot products per row, and the gradients as K-sparse updates, all deterministic.
//
//   gather:   by id (the sorted runs below): one warp per id, its weight row in shared memory, one dot
//             product per slot of the id; unvectorized layouts: one block per row, one warp per slot. Either
//             way a dot product is a fixed per-lane order plus a butterfly, so a logit has the same bits
//             whatever the chunking.
//   dhidden:  one block per row, 8 columns per thread, the slots of the row (staged in shared memory, 256
//             at a time) added in slot order — the CPU executor's order.
//   forward KL (beta = 0): gather, row loss and dhidden in one pass per row (sparse_fkl.cu), each
//             weight row read once; dhidden is then an online softmax-weighted sum of the weight rows.
//   dW, dbias: every valid slot becomes (key = id, value = r·K + k); a stable radix sort (CUB) groups them by
//             id with rows (then slots) in order, and one warp per id (ids in order) adds its updates in
//             that order. No atomics: dW does not depend on the grid, and across chunks it accumulates in
//             row order.
// A slot whose id is out of range is padding here (validate() has already recorded the error).
#include <cub/device/device_radix_sort.cuh>

#include "../cuda_common.cuh"
#include "cuda_chunk_kernels.h"
#include "fused_device.cuh"
#include "row_common.cuh"
#include "sparse_topk.cuh"

namespace retort::cuda::fused {

namespace {

constexpr int kSlotTile = kBlock;  // slots staged per step by the dhidden kernel (one per thread)

// acc += g_q · row_q[col .. col + 8) for the staged updates q < n, in order, one fma per element each (an
// update whose row is null or whose g is 0 is skipped); eight rows' loads in flight before their fmas.
// row_at(q) gives update q's row of T (16-byte aligned at col).
template <typename T, typename RowAt>
__device__ __forceinline__ void add_staged(float (&acc)[8], int n, const float* g, RowAt row_at,
                                           int64_t col) {
  constexpr int kDepth = 8;
  int q = 0;
  for (; q + kDepth <= n; q += kDepth) {
    const T* rows[kDepth];
    Raw8<T> raw[kDepth];
#pragma unroll
    for (int u = 0; u < kDepth; ++u) {
      rows[u] = g[q + u] != 0.0f ? row_at(q + u) : nullptr;
      if (rows[u]) raw[u] = load_raw8(rows[u] + col);
    }
#pragma unroll
    for (int u = 0; u < kDepth; ++u)
      if (rows[u]) {
        float xv[8];
        rowk::unpack8(raw[u], xv);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] = fmaf(g[q + u], xv[i], acc[i]);
      }
  }
  for (; q < n; ++q) {
    const T* row = g[q] != 0.0f ? row_at(q) : nullptr;
    if (!row) continue;
    float xv[8];
    load8(row + col, xv);
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] = fmaf(g[q], xv[i], acc[i]);
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
__global__ void dhidden_kernel(BD g, BD w, BD ids, BD logprobs, BD mask, BD dh, int64_t v, bool accumulate) {
  __shared__ long long s_id[kSlotTile];
  __shared__ float s_g[kSlotTile];
  const int64_t h = dh.cols, kk = g.cols;
  for (int64_t r = blockIdx.x; r < g.rows; r += gridDim.x) {
    for (int64_t h0 = 0; h0 < h; h0 += blockDim.x) {
      const int64_t j = h0 + threadIdx.x;
      float acc = accumulate && j < h ? *reinterpret_cast<const float*>(el(dh, r, j)) : 0.0f;
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

// key = id of a valid slot, else v (sorted last, skipped); value = r·K + k. An invalid slot's logit in out
// (when given) is 0.
__global__ void keys_kernel(BD ids, BD logprobs, BD mask, int64_t rows, int64_t kk, int64_t v, int* keys,
                            int* vals, BD out) {
  RT_GRID_LOOP(e, rows * kk) {
    const int64_t r = e / kk, k = e % kk;
    const long long id = slot_id(ids, logprobs, mask, r, k, v);
    keys[e] = id >= 0 ? int(id) : int(v);
    vals[e] = int(e);
    if (id < 0 && out.data) *reinterpret_cast<float*>(el(out, r, k)) = 0.0f;
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
          const float gv = *reinterpret_cast<const float*>(el(g, r, k));
          if (gv != 0.0f) acc = fmaf(gv, load_f(el(x, r, j), x.dtype), acc);
        }
        *p = acc;
      }
    }
    if (dbias.data && lane == 0) {
      float* p = reinterpret_cast<float*>(el(dbias, 0, id));
      float b = *p;
      for (int64_t q = i; q < end; ++q) {
        const int e = vals[q];
        const float gv = *reinterpret_cast<const float*>(el(g, e / kk, e % kk));
        if (gv != 0.0f) b += gv;
      }
      *p = b;
    }
  }
}

// dhidden, vectorized: each thread owns 8 consecutive columns (one 16-byte load of a weight row per slot,
// four slots' loads in flight before their fmas). Same slots, same order, one fma each: the bits of
// dhidden_kernel. w is T with dense 16-byte-aligned rows, dh dense f32 16-byte-aligned rows, H % 8 == 0.
template <typename T>
__global__ void __launch_bounds__(kBlock)
    dhidden_vec_kernel(BD g, BD w, BD ids, BD logprobs, BD mask, BD dh, int64_t v, bool accumulate) {
  __shared__ int s_id[kSlotTile];
  __shared__ float s_g[kSlotTile];
  const int64_t groups = dh.cols / 8, kk = g.cols;
  for (int64_t r = blockIdx.x; r < g.rows; r += gridDim.x) {
    float* drow = reinterpret_cast<float*>(el(dh, r, 0));
    for (int64_t c0 = 0; c0 < groups; c0 += blockDim.x) {
      const int64_t c8 = c0 + threadIdx.x;
      const bool on = c8 < groups;
      float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
      if (on && accumulate) load8(drow + c8 * 8, acc);
      for (int64_t k0 = 0; k0 < kk; k0 += kSlotTile) {
        const int n = int(kk - k0 < kSlotTile ? kk - k0 : kSlotTile);
        __syncthreads();  // the previous tile is no longer read
        if (threadIdx.x < n) {
          const int64_t k = k0 + threadIdx.x;
          const float gv = *reinterpret_cast<const float*>(el(g, r, k));
          s_g[threadIdx.x] = gv;
          s_id[threadIdx.x] = gv != 0.0f ? int(slot_id(ids, logprobs, mask, r, k, v)) : -1;
        }
        __syncthreads();
        if (!on) continue;
        add_staged<T>(
            acc, n, s_g,
            [&](int q) { return s_id[q] >= 0 ? reinterpret_cast<const T*>(el(w, s_id[q], 0)) : nullptr; },
            c8 * 8);
      }
      if (on) store8(drow + c8 * 8, acc);
    }
  }
}

// The run of sorted positions [first[id], last[id]) that holds id's updates (first[id] = -1: none).
__global__ void runs_kernel(const int* keys, int64_t count, int64_t v, int* first, int* last) {
  RT_GRID_LOOP(i, count) {
    const int id = keys[i];
    if (id >= v) continue;
    if (i == 0 || keys[i - 1] != id) first[id] = int(i);
    if (i == count - 1 || keys[i + 1] != id) last[id] = int(i + 1);
  }
}

// packed[q] = (r, bits of g[r, k]) for the slot e = r·K + k at sorted position q.
__global__ void pack_kernel(const int* vals, int64_t count, BD g, int2* packed) {
  const int kk = int(g.cols);
  RT_GRID_LOOP(q, count) {
    const int e = vals[q], r = e / kk;
    packed[q] = make_int2(r, __float_as_int(*reinterpret_cast<const float*>(el(g, r, e % kk))));
  }
}

// dW and dbias, one warp per id (ids in order, so dW rows stream): each lane owns kG groups of 8 columns of
// a 256·kG-column tile, the id's (r, g) pairs (packed) are read 32 at a time and broadcast by shuffles, and
// each update's hidden row is loaded whole (kG 16-byte loads per lane) before its fmas: many ids in flight
// per SM, no block barriers. The additions are dw_kernel's (one fma per update per element, updates in
// sorted order, g = 0 skipped; dbias summed by lane 0 in the same order): the same bits.
// overwrite_dw / overwrite_dbias: start from 0 instead of the stored row, and write the zero rows of ids
// without updates too, so an overwritten dW is written once and never read. x is T with dense 16-byte-
// aligned rows, dW dense f32 16-byte-aligned rows, H % 8 == 0.
template <typename T, int kG>
__global__ void __launch_bounds__(256, 2)
    dw_warp_kernel(const int* first, const int* last, const int2* packed, int64_t v, BD x, BD dw, BD dbias,
                   bool overwrite_dw, bool overwrite_dbias) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = (int64_t(gridDim.x) * blockDim.x) >> 5;
  const int64_t groups = dw.data ? dw.cols / 8 : 0;
  constexpr int64_t kTile = 32 * kG;  // column groups per tile
  for (int64_t id = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5; id < v; id += warps) {
    const int i0 = first[id];
    float* drow = dw.data ? reinterpret_cast<float*>(el(dw, id, 0)) : nullptr;
    if (i0 < 0) {  // uniform over the warp
      if (overwrite_dw && drow) {
        const float zeros[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        for (int64_t c8 = lane; c8 < groups; c8 += 32) store8(drow + c8 * 8, zeros);
      }
      if (overwrite_dbias && dbias.data && lane == 0) *reinterpret_cast<float*>(el(dbias, 0, id)) = 0.0f;
      continue;
    }
    const int i1 = last[id];
    for (int64_t t0 = 0; t0 < (groups > 0 ? groups : 1); t0 += kTile) {
      float acc[kG][8];
#pragma unroll
      for (int j = 0; j < kG; ++j) {
        const int64_t c8 = t0 + lane + 32 * j;
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[j][i] = 0.0f;
        if (c8 < groups && !overwrite_dw) load8(drow + c8 * 8, acc[j]);
      }
      const bool bias_here = t0 == 0 && dbias.data && lane == 0;
      float bsum = bias_here && !overwrite_dbias ? *reinterpret_cast<const float*>(el(dbias, 0, id)) : 0.0f;
      for (int q0 = i0; q0 < i1; q0 += 32) {
        const int n = min(32, i1 - q0);
        const int2 mine = lane < n ? packed[q0 + lane] : make_int2(0, 0);
        for (int u = 0; u < n; ++u) {
          const int r = __shfl_sync(0xffffffffu, mine.x, u);
          const float gv = __int_as_float(__shfl_sync(0xffffffffu, mine.y, u));
          if (gv == 0.0f) continue;  // uniform
          if (bias_here) bsum += gv;
          if (groups == 0) continue;
          const T* xr = reinterpret_cast<const T*>(el(x, r, 0));
          Raw8<T> raw[kG];
#pragma unroll
          for (int j = 0; j < kG; ++j) {
            const int64_t c8 = t0 + lane + 32 * j;
            if (c8 < groups) raw[j] = load_raw8(xr + c8 * 8);
          }
#pragma unroll
          for (int j = 0; j < kG; ++j) {
            const int64_t c8 = t0 + lane + 32 * j;
            if (c8 < groups) {
              float xv[8];
              rowk::unpack8(raw[j], xv);
#pragma unroll
              for (int i = 0; i < 8; ++i) acc[j][i] = fmaf(gv, xv[i], acc[j][i]);
            }
          }
        }
      }
#pragma unroll
      for (int j = 0; j < kG; ++j) {
        const int64_t c8 = t0 + lane + 32 * j;
        if (c8 < groups) store8(drow + c8 * 8, acc[j]);
      }
      if (bias_here) *reinterpret_cast<float*>(el(dbias, 0, id)) = bsum;
    }
  }
}

// The gather by id: one warp per id (ids in order), its weight row copied once into the warp's slice of
// shared memory, then one dot product per slot of the id with the slot's hidden row (rows of a chunk are
// few MB: L2). Each lane adds its columns in gather_kernel's order and the warp reduces the same way, so a
// logit has the same bits as there. T rows dense and 16-byte aligned, H % 8 == 0.
constexpr int kGatherWarps = 4;
template <typename T>
__global__ void __launch_bounds__(kGatherWarps * 32)
    gather_runs_kernel(const int* first, const int* last, const int* vals, int64_t v, BD x, BD w, BD bias,
                       BD out) {
  extern __shared__ uint4 gather_smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t h = x.cols, kk = out.cols;
  T* const ws = reinterpret_cast<T*>(gather_smem) + int64_t(warp) * h;
  const int64_t warps = int64_t(gridDim.x) * kGatherWarps;
  for (int64_t id = int64_t(blockIdx.x) * kGatherWarps + warp; id < v; id += warps) {
    const int i0 = first[id];
    if (i0 < 0) continue;  // uniform over the warp
    const int i1 = last[id];
    const uint4* src = reinterpret_cast<const uint4*>(el(w, id, 0));
    uint4* dst = reinterpret_cast<uint4*>(ws);
    // The weight row is read once here (ld.global.cs, evict first): the hidden rows stay in L2.
    for (int64_t j = lane; j < h * int64_t(sizeof(T)) / 16; j += 32) dst[j] = __ldcs(src + j);
    __syncwarp();
    const float b = bias.data ? load_f(el(bias, 0, id), bias.dtype) : 0.0f;
    // The id's slots 32 at a time, one per lane, broadcast by shuffles; each hidden row's loads (up to
    // kU per lane) are all in flight before the fmas, which keep gather_kernel's order.
    constexpr int kU = 8;
    for (int q0 = i0; q0 < i1; q0 += 32) {
      const int n = min(32, i1 - q0);
      const int mine = lane < n ? vals[q0 + lane] : 0;
      for (int u = 0; u < n; ++u) {
        const int e = __shfl_sync(0xffffffffu, mine, u);
        const int64_t r = e / kk, k = e % kk;
        const T* xr = reinterpret_cast<const T*>(el(x, r, 0));
        float s = 0.0f;
        for (int64_t j0 = int64_t(lane) * 8; j0 < h; j0 += 32 * 8 * kU) {
          Raw8<T> raw[kU] = {};
#pragma unroll
          for (int t = 0; t < kU; ++t)
            if (j0 + t * 256 < h) raw[t] = load_raw8(xr + j0 + t * 256);
#pragma unroll
          for (int t = 0; t < kU; ++t)
            if (j0 + t * 256 < h) {
              float a[8], c[8];
              rowk::unpack8(raw[t], a);
              load8(ws + j0 + t * 256, c);
#pragma unroll
              for (int i = 0; i < 8; ++i) s = fmaf(a[i], c[i], s);
            }
        }
        s = warp_reduce(s, SumOp{});
        if (lane == 0) *reinterpret_cast<float*>(el(out, r, k)) = s + b;
      }
    }
    __syncwarp();  // the slice is rewritten for the warp's next id
  }
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

// Sorts the chunk's valid slots by id into runs (see SparseRuns); zeroes the logits of invalid slots in out
// when out is given.
void build_runs(CudaExec& ex, const loss::TopKSide& side, int64_t rows, int64_t kk, int64_t v,
                SparseRuns& runs, const Block& out) {
  const int64_t count = rows * kk;
  RT_CHECK(count < (int64_t(1) << 31) && v < (int64_t(1) << 31), "fused top-K: ", rows, " rows x K = ", kk,
           " slots (or V = ", v, ") is too many for one chunk's sort; lower logits_budget or chunk_rows");
  // keys_in, vals_in, keys, vals, first, last (ints), then CUB's temporary storage.
  const size_t ints = 4 * size_t(count) + 2 * size_t(v);
  int* keys_in = nullptr;
  size_t temp_bytes = 0;
  RT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, keys_in, keys_in, keys_in,
                                                int(count), 0, 31, ex.stream));
  const size_t bytes = ints * sizeof(int) + 256 + temp_bytes;
  if (!runs.buf || runs.buf->size() < bytes) runs.buf = ex.temp(bytes);
  keys_in = runs.buf->as<int>();
  int* vals_in = keys_in + count;
  runs.keys = vals_in + count;
  runs.vals = runs.keys + count;
  runs.first = runs.vals + count;
  runs.last = runs.first + v;
  runs.packed = keys_in;  // 2·count ints at the buffer's start: 8-byte aligned
  void* temp = reinterpret_cast<char*>(runs.buf->data()) + (ints * sizeof(int) + 255) / 256 * 256;
  const BD ids = bd(side.ids), lp = bd(side.logprobs), mask = bd(side.mask);
  keys_kernel<<<ex.grid_for(count, kBlock), kBlock, 0, ex.stream>>>(ids, lp, mask, rows, kk, v, keys_in,
                                                                    vals_in, bd(out));
  RT_CUDA_LAUNCH_CHECK("keys_kernel");
  int end_bit = 1;
  while (end_bit < 31 && (int64_t(1) << end_bit) <= v) ++end_bit;  // keys are in [0, v]
  RT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys_in, runs.keys, vals_in, runs.vals,
                                                int(count), 0, end_bit, ex.stream));
  RT_CUDA_CHECK(cudaMemsetAsync(runs.first, 0xff, size_t(v) * sizeof(int), ex.stream));  // -1: no slot
  runs_kernel<<<ex.grid_for(count, kBlock), kBlock, 0, ex.stream>>>(runs.keys, count, v, runs.first,
                                                                    runs.last);
  RT_CUDA_LAUNCH_CHECK("runs_kernel");
  runs.ids = side.ids.data;
  runs.rows = rows;
  runs.k = kk;
  runs.v = v;
  runs.count = count;
}

}  // namespace

void gather_topk_logits(CudaExec& ex, const Block& hidden, const Block& w, const Block& bias,
                        const loss::TopKSide& side, const Block& out, SparseRuns& runs) {
  if (hidden.rows == 0) return;
  RT_ASSERT(out.dtype == DType::F32 && out.cols == side.logprobs.cols && !side.ids.empty());
  const int64_t h = hidden.cols, es = int64_t(dtype_size(hidden.dtype)), v = w.rows;
  const bool vec = hidden.dtype == w.dtype && h % 8 == 0 && int64_t(hidden.col_stride) == es &&
                   int64_t(w.col_stride) == es && aligned16(hidden) && aligned16(w);
  const BD x = bd(hidden), wd = bd(w), b = bd(bias), ids = bd(side.ids), lp = bd(side.logprobs),
           mask = bd(side.mask), o = bd(out);
  const size_t smem = size_t(kGatherWarps) * size_t(h) * size_t(es);
  if (vec && smem <= 64 * 1024) {
    build_runs(ex, side, hidden.rows, out.cols, v, runs, out);
    const unsigned grid =
        unsigned(std::min<int64_t>((v + kGatherWarps - 1) / kGatherWarps, int64_t(ex.sm_count) * 16));
    auto launch = [&](auto kernel) {
      if (smem > 48 * 1024)
        RT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
      kernel<<<grid, kGatherWarps * 32, smem, ex.stream>>>(runs.first, runs.last, runs.vals, v, x, wd, b, o);
    };
    if (hidden.dtype == DType::BF16)
      launch(gather_runs_kernel<__nv_bfloat16>);
    else if (hidden.dtype == DType::F16)
      launch(gather_runs_kernel<__half>);
    else
      launch(gather_runs_kernel<float>);
    RT_CUDA_LAUNCH_CHECK("gather_runs_kernel");
    return;
  }
  switch (vec ? hidden.dtype : DType::F32) {
    case DType::BF16:
      launch_gather<__nv_bfloat16>(ex, true, x, wd, b, ids, lp, mask, o, v);
      break;
    case DType::F16:
      launch_gather<__half>(ex, true, x, wd, b, ids, lp, mask, o, v);
      break;
    default:
      launch_gather<float>(ex, vec, x, wd, b, ids, lp, mask, o, v);
      break;
  }
}

namespace {

// dW and dbias of one chunk (see scatter_topk_grads).
void scatter_dw(CudaExec& ex, const Block& g, const Block& hidden, int64_t v, const loss::SparseGrads& out,
                SparseRuns& runs, const loss::TopKSide& side) {
  const Block &dw = out.dweight, &dbias = out.dbias;
  const int64_t h = hidden.cols;
  const BD gd = bd(g);
  if (!runs.for_chunk(side, g.rows, g.cols, v)) build_runs(ex, side, g.rows, g.cols, v, runs, Block{});
  const bool vec = (dw.empty() || (aligned16(dw) && dw.col_stride == sizeof(float) && dw.cols % 8 == 0)) &&
                   aligned16(hidden) && hidden.col_stride == dtype_size(hidden.dtype) && h % 8 == 0;
  if (vec) {
    // Overwriting: the kernel writes every row (zeros where no slot points), so dW is written once and
    // never read.
    const bool ow = !out.accumulate_dweight, ob = !out.accumulate_dbias;
    const int64_t count = runs.count;
    auto* packed = reinterpret_cast<int2*>(runs.packed);
    pack_kernel<<<ex.grid_for(count, kBlock), kBlock, 0, ex.stream>>>(runs.vals, count, gd, packed);
    RT_CUDA_LAUNCH_CHECK("pack_kernel");
    const unsigned grid = unsigned(std::min<int64_t>((v + 7) / 8, int64_t(ex.sm_count) * 8));
    if (hidden.dtype == DType::BF16)
      dw_warp_kernel<__nv_bfloat16, 8><<<grid, 256, 0, ex.stream>>>(runs.first, runs.last, packed, v,
                                                                    bd(hidden), bd(dw), bd(dbias), ow, ob);
    else if (hidden.dtype == DType::F16)
      dw_warp_kernel<__half, 8><<<grid, 256, 0, ex.stream>>>(runs.first, runs.last, packed, v, bd(hidden),
                                                             bd(dw), bd(dbias), ow, ob);
    else
      dw_warp_kernel<float, 4><<<grid, 256, 0, ex.stream>>>(runs.first, runs.last, packed, v, bd(hidden),
                                                            bd(dw), bd(dbias), ow, ob);
    RT_CUDA_LAUNCH_CHECK("dw_warp_kernel");
  } else {
    if (!dw.empty() && !out.accumulate_dweight) zero(ex, dw);
    if (!dbias.empty() && !out.accumulate_dbias) zero(ex, dbias);
    const unsigned grid = unsigned(ex.grid_for(runs.count * 32, kBlock));
    dw_kernel<<<grid, kBlock, 0, ex.stream>>>(runs.keys, runs.vals, runs.count, v, gd, bd(hidden), bd(dw),
                                              bd(dbias));
  }
  RT_CUDA_LAUNCH_CHECK("dw_kernel");
}

}  // namespace

void scatter_topk_grads(CudaExec& ex, const Block& g, const Block& hidden, const Block& w,
                        const loss::TopKSide& side, const loss::SparseGrads& out, SparseRuns& runs) {
  const Block &dhidden = out.dhidden, &dw = out.dweight, &dbias = out.dbias;
  const bool accumulate_dhidden = out.accumulate_dhidden;
  if (g.rows == 0) {
    if (!dw.empty() && !out.accumulate_dweight) zero(ex, dw);
    if (!dbias.empty() && !out.accumulate_dbias) zero(ex, dbias);
    return;
  }
  const int64_t v = w.rows;
  const BD gd = bd(g), ids = bd(side.ids), lp = bd(side.logprobs), mask = bd(side.mask);
  const int64_t h = hidden.cols;
  // dW first, while the gather has just brought the chunk's hidden rows into L2 (the dhidden pass streams
  // 64 weight rows per token through it).
  if (!dw.empty() || !dbias.empty()) scatter_dw(ex, g, hidden, v, out, runs, side);
  if (!dhidden.empty()) {
    const unsigned grid = unsigned(std::min<int64_t>(g.rows, int64_t(ex.sm_count) * 16));
    const bool vec = h % 8 == 0 && aligned16(dhidden) && dhidden.col_stride == sizeof(float) &&
                     aligned16(w) && w.col_stride == dtype_size(w.dtype);
    if (vec && w.dtype == DType::BF16)
      dhidden_vec_kernel<__nv_bfloat16>
          <<<grid, kBlock, 0, ex.stream>>>(gd, bd(w), ids, lp, mask, bd(dhidden), v, accumulate_dhidden);
    else if (vec && w.dtype == DType::F16)
      dhidden_vec_kernel<__half>
          <<<grid, kBlock, 0, ex.stream>>>(gd, bd(w), ids, lp, mask, bd(dhidden), v, accumulate_dhidden);
    else if (vec && w.dtype == DType::F32)
      dhidden_vec_kernel<float>
          <<<grid, kBlock, 0, ex.stream>>>(gd, bd(w), ids, lp, mask, bd(dhidden), v, accumulate_dhidden);
    else
      dhidden_kernel<<<grid, kSlotTile, 0, ex.stream>>>(gd, bd(w), ids, lp, mask, bd(dhidden), v,
                                                        accumulate_dhidden);
    RT_CUDA_LAUNCH_CHECK("dhidden_kernel");
  }
}

}  // namespace retort::cuda::fused
