// The softmax-epilogue chunk's row pass (softmax_chunk.h): the shift before the epilogue GEMM, the row
// statistics, losses and scales after it with the exact per-row fallback, and the dhidden row scaling. Plain
// CUDA (the GEMM itself is softmax_chunk.cu, built for sm_90a only).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "../cuda_common.cuh"
#include "softmax_chunk.h"

namespace retort::cuda {

namespace {

__device__ unsigned long long g_fallback_rows = 0;

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// Eight bf16 as f32 pairs, from a 16-byte load.
__device__ __forceinline__ void load8(const __nv_bfloat16* p, float2 (&f)[4]) {
  const uint4 q = *reinterpret_cast<const uint4*>(p);
  const uint32_t u[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) f[i] = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u[i]));
}

// x[0..h) · w[0..h) over the warp's lanes (h even, rows 16-byte aligned: 8 entries per load when h is a
// multiple of 8, else pairs); every lane gets the sum.
__device__ __forceinline__ float warp_dot(const __nv_bfloat16* x, const __nv_bfloat16* w, int64_t h) {
  float acc = 0.0f;
  if (h % 8 == 0) {
    for (int64_t k = 8 * (threadIdx.x % 32); k < h; k += 256) {
      float2 a[4], b[4];
      load8(x + k, a);
      load8(w + k, b);
#pragma unroll
      for (int i = 0; i < 4; ++i) acc = fmaf(a[i].x, b[i].x, fmaf(a[i].y, b[i].y, acc));
    }
    return warp_sum(acc);
  }
  for (int64_t k = 2 * (threadIdx.x % 32); k < h; k += 64) {
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(x + k));
    const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(w + k));
    acc = fmaf(a.x, b.x, fmaf(a.y, b.y, acc));
  }
  return warp_sum(acc);
}
// The same with x in shared memory as f32.
__device__ __forceinline__ float warp_dot_f(const float* x, const __nv_bfloat16* w, int64_t h) {
  float acc = 0.0f;
  for (int64_t k = 2 * (threadIdx.x % 32); k < h; k += 64) {
    const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(w + k));
    acc = fmaf(x[k], b.x, fmaf(x[k + 1], b.y, acc));
  }
  return warp_sum(acc);
}

__device__ __forceinline__ bool counted(int64_t y, int64_t ignore, int64_t v) {
  return y != ignore && y >= 0 && y < v;
}

constexpr int kWarps = 8;

__device__ __forceinline__ const char* side_ptr(const SideMatrix& s, int64_t r, int64_t c) {
  return static_cast<const char*>(s.data) + r * s.row_stride + c * s.col_stride;
}

__device__ __forceinline__ bool nonzero(const char* p, DType t) {
  return (t == DType::I32 || t == DType::I64) ? load_i(p, t) != 0 : load_f(p, t) != 0.0f;
}

__device__ __forceinline__ bool slot_ok(const SoftmaxRows& r, int64_t m, int64_t k, float* lp) {
  const int64_t id = r.ids[m * r.k + k];
  if (id < 0 || id >= r.v) return false;
  if (r.mask.data && !nonzero(side_ptr(r.mask, m, k), r.mask.dtype)) return false;
  *lp = load_f(side_ptr(r.logprobs, m, k), r.logprobs.dtype);
  return *lp != -INFINITY;
}

__global__ void shift_kernel(SoftmaxRows r, SideMatrix labels_in, float* shift) {
  const int64_t m = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (m >= r.rows) return;
  const int lane = int(threadIdx.x % 32);
  if (labels_in.data) {
    const int64_t y = load_i(side_ptr(labels_in, m, 0), labels_in.dtype);
    const auto* x = static_cast<const __nv_bfloat16*>(r.x) + m * r.ldx;
    const auto* w = static_cast<const __nv_bfloat16*>(r.w) + (counted(y, r.ignore, r.v) ? y : 0) * r.ldw;
    const float z = warp_dot(x, w, r.h);
    if (lane == 0) {
      shift[m] = z;
      const_cast<int64_t*>(r.labels)[m] = y;
    }
    return;
  }
  float mx = -INFINITY, lp;
  for (int64_t k = lane; k < r.k; k += 32)
    if (slot_ok(r, m, k, &lp)) mx = fmaxf(mx, r.zk[m * r.k + k]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if (lane == 0) shift[m] = mx == -INFINITY ? 0.0f : mx;
}

struct RowCoef {
  float coef;   // the row's gradient scale (0: ignored)
  float dense;  // the softmax's factor
};

// The per-row loss given lse (and, with labels, z_y through hard = lse − z_y), into the outputs; the soft
// part's Σ p_k is returned through P. z at slot k: zrow[k], or (zrow null) shift + ln E[m, id] from the bf16
// block (*zero set when such an E is 0: the row needs the exact kernel). Every lane of the warp calls it;
// lane 0 writes.
__device__ float row_loss_out(const SoftmaxRows& r, int64_t m, bool valid, float lse, float hard, float* P,
                              const float* zrow, bool* zero) {
  float soft = 0.0f, psum = 0.0f, lp;
  bool z0 = false;
  const auto* erow = static_cast<const __nv_bfloat16*>(r.e_read) + m * r.lde;
  for (int64_t k = threadIdx.x % 32; k < r.k; k += 32)
    if (slot_ok(r, m, k, &lp)) {
      float z;
      if (zrow) {
        z = zrow[k];
      } else {
        const float e = __bfloat162float(erow[r.ids[m * r.k + k]]);
        z0 = z0 || !(e > 0.0f);
        z = r.shift[m] + logf(e);
      }
      const float p = expf(lp);
      soft += p * (lp - (z - lse));
      psum += p;
    }
  soft = warp_sum(soft);
  psum = warp_sum(psum);
  if (zero) *zero = __any_sync(0xffffffffu, z0);
  *P = psum;
  if (!r.labels) hard = 0.0f;
  if (!valid) hard = soft = 0.0f;
  if (threadIdx.x % 32 == 0) {
    if (r.lse) r.lse[m] = lse;
    if (r.loss) r.loss[m] = valid ? r.w_hard * hard + r.w_soft * soft + r.z_loss * lse * lse : 0.0f;
    if (r.hard) r.hard[m] = hard;
    if (r.soft) r.soft[m] = soft;
  }
  return soft;
}

__device__ RowCoef row_coef(const SoftmaxRows& r, int64_t m, bool valid, float lse, float P) {
  RowCoef c{0.0f, 0.0f};
  if (!valid || !r.e) return c;
  c.coef = r.grad_scale * (r.scale_dev ? *r.scale_dev : 1.0f);
  if (r.upstream.data)
    c.coef *= load_f(static_cast<const char*>(r.upstream.data) + m * r.upstream.row_stride, r.upstream.dtype);
  c.dense = (r.labels ? r.w_hard : 0.0f) + 2.0f * r.z_loss * lse + r.w_soft * P;
  return c;
}

// Subtracts the row's sparse entries (coef·w_hard at the label, coef·w_soft·p_k at each valid slot) divided
// by s from E, one store per distinct column (duplicate ids summed). The warp's lanes share the entries
// through shared memory (kSoftmaxMaxSlots + 1 per warp).
__device__ void fold_entries(const SoftmaxRows& r, int64_t m, int64_t y, RowCoef c, float s, int64_t* eid,
                             float* ea) {
  const int lane = int(threadIdx.x % 32);
  int n = 0;
  for (int64_t k0 = 0; k0 < r.k; k0 += 32) {  // compact the valid slots, in slot order
    const int64_t k = k0 + lane;
    float lp = 0.0f;
    const bool ok = k < r.k && slot_ok(r, m, k, &lp);
    const unsigned b = __ballot_sync(0xffffffffu, ok);
    if (ok) {
      const int at = n + __popc(b & ((1u << lane) - 1));
      eid[at] = r.ids[m * r.k + k];
      ea[at] = c.coef * r.w_soft * expf(lp);
    }
    n += __popc(b);
  }
  if (r.labels) {
    if (lane == 0) {
      eid[n] = y;
      ea[n] = c.coef * r.w_hard;
    }
    ++n;
  }
  __syncwarp();
  auto* e = static_cast<__nv_bfloat16*>(r.e) + m * r.lde;
  for (int i = lane; i < n; i += 32) {
    const int64_t id = eid[i];
    bool first = true;
    float a = 0.0f;
    for (int j = 0; j < n; ++j)
      if (eid[j] == id) {
        if (j < i) first = false;
        a += ea[j];
      }
    if (first && a != 0.0f) e[id] = __float2bfloat16_rn(__bfloat162float(e[id]) - a / s);
  }
  __syncwarp();
}

// xs[m, :] = bf16(s·x[m, :]) by the warp.
__device__ void write_xs(const SoftmaxRows& r, int64_t m, float s) {
  if (!r.xs) return;
  const auto* x = static_cast<const __nv_bfloat16*>(r.x) + m * r.ldx;
  auto* o = static_cast<__nv_bfloat16*>(r.xs) + m * r.h;
  if (r.h % 8 == 0) {  // rows of x and xs 16-byte aligned: 8 entries per load and store
    for (int64_t k = 8 * (threadIdx.x % 32); k < r.h; k += 256) {
      float2 a[4];
      load8(x + k, a);
      uint32_t u[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const __nv_bfloat162 b = __floats2bfloat162_rn(s * a[i].x, s * a[i].y);
        u[i] = *reinterpret_cast<const uint32_t*>(&b);
      }
      *reinterpret_cast<uint4*>(o + k) = make_uint4(u[0], u[1], u[2], u[3]);
    }
    return;
  }
  for (int64_t k = 2 * (threadIdx.x % 32); k < r.h; k += 64) {
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(x + k));
    *reinterpret_cast<__nv_bfloat162*>(o + k) = __floats2bfloat162_rn(s * a.x, s * a.y);
  }
}

__global__ void rows_kernel(SoftmaxRows r) {
  __shared__ int64_t eid_all[kWarps][kSoftmaxMaxSlots + 1];
  __shared__ float ea_all[kWarps][kSoftmaxMaxSlots + 1];
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32);
  const int64_t m = int64_t(blockIdx.x) * kWarps + warp;
  if (m >= r.rows) return;
  float S = 0.0f;
  for (int64_t t = lane; t < r.tiles; t += 32) S += r.part[m * r.tiles + t];
  S = warp_sum(S);
  const int64_t y = r.labels ? r.labels[m] : -1;
  const bool valid = !r.labels || counted(y, r.ignore, r.v);
  const float lse = r.shift[m] + logf(S);
  // Out of range: recomputed exactly. With E written every such row is, an ignored one too (an inf in E
  // would make NaN against its s = 0 in the gradient GEMMs); without, only the rows whose results count.
  bool bad = (valid || r.lse || r.e) && !(S >= 0x1p-100f && S <= 0x1p100f);
  if (bad) {
    if (lane == 0) r.bad[m] = 1;
    return;
  }
  float P = 0.0f;
  bool zero = false;  // with labels the shift is z_y: hard = log S
  row_loss_out(r, m, valid, lse, logf(S), &P, r.zk ? r.zk + m * r.k : nullptr, &zero);
  const RowCoef c = row_coef(r, m, valid, lse, P);
  const float s = c.coef != 0.0f ? c.coef * c.dense / S : 0.0f;
  // Entries to fold but a zero scale (the dense factor vanished), or a slot's E underflowed: only the exact
  // kernel can write the row.
  bad = (valid && zero) || (c.coef != 0.0f && !(s != 0.0f && isfinite(s)));
  if (lane == 0) r.bad[m] = bad ? 1 : 0;
  if (bad || !r.e) return;
  if (lane == 0) r.s[m] = s;
  if (c.coef != 0.0f) fold_entries(r, m, y, c, s, eid_all[warp], ea_all[warp]);
  write_xs(r, m, s);
}

// A bad row, by one block: z recomputed from x and W in f32, an online max / sum, the losses, then (with e)
// the exact gradient row written into E with s = 1 (the dense part, then the entries by one thread).
__device__ void fallback_row(const SoftmaxRows& r, int64_t m) {
  extern __shared__ float xs[];
  __shared__ float wm[kWarps], ws[kWarps], stat[2];
  const __nv_bfloat16* x = static_cast<const __nv_bfloat16*>(r.x) + m * r.ldx;
  const __nv_bfloat16* w = static_cast<const __nv_bfloat16*>(r.w);
  for (int64_t k = threadIdx.x; k < r.h; k += blockDim.x) xs[k] = __bfloat162float(x[k]);
  __syncthreads();
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32);
  float mx = -INFINITY, sum = 0.0f;
  for (int64_t j = warp; j < r.v; j += kWarps) {
    const float z = warp_dot_f(xs, w + j * r.ldw, r.h);
    if (z > mx) {
      sum = sum * expf(mx - z) + 1.0f;
      mx = z;
    } else {
      sum += expf(z - mx);
    }
  }
  if (lane == 0) {
    wm[warp] = mx;
    ws[warp] = sum;
  }
  __syncthreads();
  const int64_t y = r.labels ? r.labels[m] : -1;
  const bool valid = !r.labels || counted(y, r.ignore, r.v);
  if (threadIdx.x == 0) {
    float M = -INFINITY;
    for (int i = 0; i < kWarps; ++i) M = fmaxf(M, wm[i]);
    float S = 0.0f;
    for (int i = 0; i < kWarps; ++i) S += ws[i] == 0.0f ? 0.0f : ws[i] * expf(wm[i] - M);
    stat[0] = M + logf(S);
    atomicAdd(&g_fallback_rows, 1ull);
  }
  __syncthreads();
  const float lse = stat[0];
  const float zy = r.labels && valid ? warp_dot_f(xs, w + y * r.ldw, r.h) : 0.0f;
  __shared__ float zks[kSoftmaxMaxSlots];  // z at the slots, exact
  for (int64_t k = warp; k < r.k; k += kWarps) {
    const int64_t id = r.ids[m * r.k + k];
    const float z = id >= 0 && id < r.v ? warp_dot_f(xs, w + id * r.ldw, r.h) : 0.0f;
    if (lane == 0) zks[k] = z;
  }
  __syncthreads();
  float P = 0.0f;
  if (warp == 0) {
    row_loss_out(r, m, valid, lse, lse - zy, &P, zks, nullptr);
    if (lane == 0) stat[1] = P;
  }
  __syncthreads();
  P = stat[1];
  if (r.e) {
    const RowCoef c = row_coef(r, m, valid, lse, P);
    __nv_bfloat16* e = static_cast<__nv_bfloat16*>(r.e) + m * r.lde;
    for (int64_t j = warp; j < r.wrows; j += kWarps) {
      float g = 0.0f;
      if (j < r.v && c.coef != 0.0f) g = c.coef * c.dense * expf(warp_dot_f(xs, w + j * r.ldw, r.h) - lse);
      if (lane == 0) e[j] = __float2bfloat16_rn(g);
    }
    __syncthreads();
    if (threadIdx.x == 0 && c.coef != 0.0f) {
      if (r.labels) e[y] = __float2bfloat16_rn(__bfloat162float(e[y]) - c.coef * r.w_hard);
      float lp;
      for (int64_t k = 0; k < r.k; ++k)
        if (slot_ok(r, m, k, &lp)) {
          const int64_t id = r.ids[m * r.k + k];
          e[id] = __float2bfloat16_rn(__bfloat162float(e[id]) - c.coef * r.w_soft * expf(lp));
        }
      r.s[m] = 1.0f;
    }
    if (threadIdx.x == 0 && c.coef == 0.0f) r.s[m] = 0.0f;
    if (warp == 0) write_xs(r, m, c.coef != 0.0f ? 1.0f : 0.0f);
  }
  __syncthreads();  // xs is rewritten by the next row
}

__global__ void fallback_kernel(SoftmaxRows r) {
  for (int64_t m = blockIdx.x; m < r.rows; m += gridDim.x)
    if (r.bad[m]) fallback_row(r, m);
}

// VEC consecutive columns per thread (4: f32 rows 16-byte aligned, h a multiple of 4).
template <int VEC>
__global__ void scale_add_kernel(float* dh, int64_t dh_ld, const float* t, int64_t t_ld, int64_t rows,
                                 int64_t h, const float* s, bool accumulate, ScaleAddTail tail) {
  const int64_t groups = h / VEC;
  RT_GRID_LOOP(i, rows * groups) {
    const int64_t m = i / groups, k = (i % groups) * VEC;
    const float sm = s[m];
    float add[VEC];
    if (sm == 0.0f) {  // an ignored row: its t (and tail) may be huge or inf
#pragma unroll
      for (int u = 0; u < VEC; ++u) add[u] = 0.0f;
    } else {
      const float* tr = t + m * t_ld + k;
      if constexpr (VEC == 4) {
        const float4 q = *reinterpret_cast<const float4*>(tr);
        add[0] = q.x, add[1] = q.y, add[2] = q.z, add[3] = q.w;
      } else {
        add[0] = tr[0];
      }
      const auto* e = static_cast<const __nv_bfloat16*>(tail.e) + m * tail.lde;
      for (int64_t j = 0; j < tail.cols; ++j) {
        const float ej = __bfloat162float(e[j]);
        const auto* wr = static_cast<const __nv_bfloat16*>(tail.w) + j * tail.ldw + k;
#pragma unroll
        for (int u = 0; u < VEC; ++u) add[u] = fmaf(ej, __bfloat162float(wr[u]), add[u]);
      }
#pragma unroll
      for (int u = 0; u < VEC; ++u) add[u] *= sm;
    }
    float* o = dh + m * dh_ld + k;
    if constexpr (VEC == 4) {
      float4 q = accumulate ? *reinterpret_cast<const float4*>(o) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      q.x += add[0], q.y += add[1], q.z += add[2], q.w += add[3];
      *reinterpret_cast<float4*>(o) = q;
    } else {
      *o = accumulate ? *o + add[0] : add[0];
    }
  }
}

}  // namespace

void softmax_shift(const SoftmaxRows& r, const SideMatrix& labels_in, float* shift, cudaStream_t stream) {
  shift_kernel<<<unsigned((r.rows + kWarps - 1) / kWarps), 32 * kWarps, 0, stream>>>(r, labels_in, shift);
  RT_CUDA_LAUNCH_CHECK("shift_kernel");
}

void softmax_rows(const SoftmaxRows& r, cudaStream_t stream) {
  RT_CHECK(r.k <= kSoftmaxMaxSlots, "softmax epilogue rows: at most ", kSoftmaxMaxSlots, " slots, got ", r.k);
  rows_kernel<<<unsigned((r.rows + kWarps - 1) / kWarps), 32 * kWarps, 0, stream>>>(r);
  RT_CUDA_LAUNCH_CHECK("rows_kernel");
  const size_t smem = size_t(r.h) * sizeof(float);
  allow_smem(reinterpret_cast<const void*>(fallback_kernel), smem);
  // A few blocks scan the flags; each bad row takes a whole block (rare).
  fallback_kernel<<<unsigned(std::min<int64_t>(r.rows, 264)), 32 * kWarps, smem, stream>>>(r);
  RT_CUDA_LAUNCH_CHECK("fallback_kernel");
}

void scale_add_rows(float* dh, int64_t dh_ld, const float* t, int64_t t_ld, int64_t rows, int64_t h,
                    const float* s, bool accumulate, const ScaleAddTail& tail, int sm_count,
                    cudaStream_t stream) {
  RT_ASSERT(tail.cols >= 0 && tail.cols < 8 && (tail.cols == 0 || (tail.e && tail.w)));
  if (rows == 0 || h == 0) return;
  const bool vec = h % 4 == 0 && dh_ld % 4 == 0 && t_ld % 4 == 0 &&
                   reinterpret_cast<uintptr_t>(dh) % 16 == 0 && reinterpret_cast<uintptr_t>(t) % 16 == 0;
  const int64_t n = vec ? rows * (h / 4) : rows * h;
  const int grid = int(std::min<int64_t>((n + 255) / 256, int64_t(std::max(sm_count, 1)) * 8));
  if (vec)
    scale_add_kernel<4><<<grid, 256, 0, stream>>>(dh, dh_ld, t, t_ld, rows, h, s, accumulate, tail);
  else
    scale_add_kernel<1><<<grid, 256, 0, stream>>>(dh, dh_ld, t, t_ld, rows, h, s, accumulate, tail);
  RT_CUDA_LAUNCH_CHECK("scale_add_kernel");
}

size_t softmax_fallback_rows() {
  unsigned long long n = 0;
  if (cudaMemcpyFromSymbol(&n, g_fallback_rows, sizeof(n)) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return size_t(n);
}

}  // namespace retort::cuda
