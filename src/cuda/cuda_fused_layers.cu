// The fused layers on the device (src/ops/fused_layers.cpp has the math and the CPU reference).
// rms_norm_affine and its backward: one warp per row, f32 reductions in a fixed tree (deterministic).
// The weight's gradient: each row's r first, then blocks of 32·W columns × a chunk of rows sum gy·s·r with
// coalesced reads into a [chunks, n] scratch and one thread per column adds its chunks in order (the same
// bits every run, no atomics). swiglu and its backward: one grid-stride pass over the elements.
// No host synchronization and no cudaMalloc here: scratch comes from the backend's allocator (ex.temp).
#include "../ops/ops.h"
#include "cuda_common.cuh"

namespace retort::cuda {

namespace {

// y = s r w, s = x (+ delta) written to s_out when has_delta; one warp per row (no block barriers, 8 rows per
// block). The first pass only loads, so the loads of a lane's values are all in flight at once; the second
// reads the row again from L1/L2 rather than keeping it in registers, so occupancy stays high.
template <int W>
__global__ void rms_norm_affine_warp_kernel(TDesc out, TDesc x, TDesc w, TDesc delta, TDesc s_out, bool has_delta,
                                            float eps) {
  const int64_t rows = nrows(x), n = x.ne[0];
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t r = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; r < rows; r += warps) {
    const char* xp = row_at(x, r);
    const char* dp = has_delta ? row_at(delta, r) : nullptr;
    float acc = 0.0f;
#pragma unroll 2
    for (int64_t i = lane * W; i < n; i += 32 * W) {
      float v[W], d[W];
      load_w<W>(xp, i, x.nb[0], x.dtype, v);
      if (has_delta) load_w<W>(dp, i, delta.nb[0], delta.dtype, d);
#pragma unroll
      for (int k = 0; k < W; ++k) {
        if (has_delta) v[k] += d[k];
        acc += v[k] * v[k];
      }
    }
    const float inv = 1.0f / sqrtf(warp_reduce(acc, SumOp{}) / float(n) + eps);
    char* op = row_at(out, r);
    char* sp = has_delta ? row_at(s_out, r) : nullptr;
    for (int64_t i = lane * W; i < n; i += 32 * W) {
      float v[W], d[W], g[W];
      load_w<W>(xp, i, x.nb[0], x.dtype, v);
      load_w<W>(w.data, i, w.nb[0], w.dtype, g);
      if (has_delta) {
        load_w<W>(dp, i, delta.nb[0], delta.dtype, d);
#pragma unroll
        for (int k = 0; k < W; ++k) v[k] += d[k];
        store_w<W>(sp, i, s_out.nb[0], s_out.dtype, v);
      }
#pragma unroll
      for (int k = 0; k < W; ++k) v[k] = v[k] * inv * g[k];
      store_w<W>(op, i, out.nb[0], out.dtype, v);
    }
  }
}

// ds = r (gy w) − r³ s mean(gy w s) (+ gs), one warp per row.
template <int W>
__global__ void rms_norm_affine_back_warp_kernel(TDesc out, TDesc gy, TDesc s, TDesc w, TDesc gs, bool has_gs,
                                                 float eps) {
  const int64_t rows = nrows(out), n = out.ne[0];
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t r = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; r < rows; r += warps) {
    const char* gp = row_at(gy, r);
    const char* sp = row_at(s, r);
    float ass = 0.0f, ags = 0.0f;
#pragma unroll 2
    for (int64_t i = lane * W; i < n; i += 32 * W) {
      float sv[W], gv[W], wv[W];
      load_w<W>(sp, i, s.nb[0], s.dtype, sv);
      load_w<W>(gp, i, gy.nb[0], gy.dtype, gv);
      load_w<W>(w.data, i, w.nb[0], w.dtype, wv);
#pragma unroll
      for (int k = 0; k < W; ++k) {
        ass += sv[k] * sv[k];
        ags += gv[k] * wv[k] * sv[k];
      }
    }
    const float inv = 1.0f / sqrtf(warp_reduce(ass, SumOp{}) / float(n) + eps);
    const float c = (warp_reduce(ags, SumOp{}) / float(n)) * inv * inv * inv;
    const char* gsp = has_gs ? row_at(gs, r) : nullptr;
    char* op = row_at(out, r);
    for (int64_t i = lane * W; i < n; i += 32 * W) {
      float sv[W], gv[W], wv[W], o[W] = {};
      load_w<W>(sp, i, s.nb[0], s.dtype, sv);
      load_w<W>(gp, i, gy.nb[0], gy.dtype, gv);
      load_w<W>(w.data, i, w.nb[0], w.dtype, wv);
      if (has_gs) load_w<W>(gsp, i, gs.nb[0], gs.dtype, o);
#pragma unroll
      for (int k = 0; k < W; ++k) o[k] += inv * (gv[k] * wv[k]) - c * sv[k];
      store_w<W>(op, i, out.nb[0], out.dtype, o);
    }
  }
}

// inv[r] = (mean(s_r²) + eps)^-1/2, one warp per row.
template <int W>
__global__ void row_inv_rms_kernel(TDesc s, float eps, float* inv) {
  const int64_t rows = nrows(s), n = s.ne[0];
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t r = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; r < rows; r += warps) {
    const char* sp = row_at(s, r);
    float acc = 0.0f;
#pragma unroll 2
    for (int64_t i = lane * W; i < n; i += 32 * W) {
      float v[W];
      load_w<W>(sp, i, s.nb[0], s.dtype, v);
#pragma unroll
      for (int k = 0; k < W; ++k) acc += v[k] * v[k];
    }
    acc = warp_reduce(acc, SumOp{});
    if (lane == 0) inv[r] = 1.0f / sqrtf(acc / float(n) + eps);
  }
}

// part[chunk, col] = Σ over the chunk's rows of gy·s·inv; a thread owns W adjacent columns, 8 rows in step.
template <int W>
__global__ void norm_w_partial_kernel(TDesc gy, TDesc s, const float* inv, int64_t m, int64_t chunk_rows,
                                      float* part) {
  __shared__ float sh[8][32 * W + 1];
  const int64_t n = s.ne[0];
  const int64_t col = (int64_t(blockIdx.x) * 32 + threadIdx.x) * W;
  const int64_t r0 = int64_t(blockIdx.y) * chunk_rows;
  float acc[W] = {};
  if (col < n)
    for (int64_t r = r0 + threadIdx.y; r < min(m, r0 + chunk_rows); r += 8) {
      float gv[W], sv[W];
      load_w<W>(row_at(gy, r), col, gy.nb[0], gy.dtype, gv);
      load_w<W>(row_at(s, r), col, s.nb[0], s.dtype, sv);
      const float ir = inv[r];
#pragma unroll
      for (int k = 0; k < W; ++k) acc[k] += gv[k] * sv[k] * ir;
    }
#pragma unroll
  for (int k = 0; k < W; ++k) sh[threadIdx.y][threadIdx.x * W + k] = acc[k];
  __syncthreads();
  if (threadIdx.y == 0 && col < n) {
#pragma unroll
    for (int k = 0; k < W; ++k) {
      float t = 0.0f;
      for (int y = 0; y < 8; ++y) t += sh[y][threadIdx.x * W + k];
      part[int64_t(blockIdx.y) * n + col + k] = t;
    }
  }
}

// out[col] = Σ_c part[c, col]: 32 columns per block, 32 threads stepping over the chunks of each, then a fixed
// shared-memory tree (the same bits every run).
__global__ void norm_w_final_kernel(const float* part, int64_t chunks, TDesc out) {
  __shared__ float sh[32][33];
  const int64_t n = out.ne[0], col = int64_t(blockIdx.x) * 32 + threadIdx.x;
  float t = 0.0f;
  if (col < n) {
#pragma unroll 4
    for (int64_t c = threadIdx.y; c < chunks; c += 32) t += part[c * n + col];
  }
  sh[threadIdx.y][threadIdx.x] = t;
  __syncthreads();
  for (int h = 16; h > 0; h >>= 1) {
    if (threadIdx.y < h) sh[threadIdx.y][threadIdx.x] += sh[threadIdx.y + h][threadIdx.x];
    __syncthreads();
  }
  if (threadIdx.y == 0 && col < n) store_f(out.data + col * out.nb[0], out.dtype, sh[0][threadIdx.x]);
}

__device__ __forceinline__ float sigmoid_f(float g) { return 1.0f / (1.0f + __expf(-g)); }

// Element k of a tensor shaped like shape, wherever its strides put it.
__device__ __forceinline__ char* elem(const TDesc& t, const TDesc& shape, int64_t k) {
  int64_t c[4];
  unravel(k, shape.ne, c);
  return at(t, c);
}

// Contiguous operands (always, in a model): flat groups (cuda_common.cuh).
template <int W>
__global__ void swiglu_flat_kernel(TDesc out, TDesc g, TDesc u, int64_t n) {
  flat_groups<W>(n, [&]<int V>(int64_t k) {
    float gv[V], uv[V];
    load_w<V>(g.data, k, g.nb[0], g.dtype, gv);
    load_w<V>(u.data, k, u.nb[0], u.dtype, uv);
#pragma unroll
    for (int j = 0; j < V; ++j) gv[j] = gv[j] * sigmoid_f(gv[j]) * uv[j];
    store_w<V>(out.data, k, out.nb[0], out.dtype, gv);
  });
}

template <int W>
__global__ void swiglu_back_flat_kernel(TDesc dg, TDesc du, TDesc dy, TDesc g, TDesc u, int64_t n) {
  flat_groups<W>(n, [&]<int V>(int64_t k) {
    float gv[V], uv[V], d[V], a[V], b[V];
    load_w<V>(g.data, k, g.nb[0], g.dtype, gv);
    load_w<V>(u.data, k, u.nb[0], u.dtype, uv);
    load_w<V>(dy.data, k, dy.nb[0], dy.dtype, d);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float sg = sigmoid_f(gv[j]);
      a[j] = d[j] * uv[j] * sg * (1.0f + gv[j] * (1.0f - sg));
      b[j] = d[j] * gv[j] * sg;
    }
    store_w<V>(dg.data, k, dg.nb[0], dg.dtype, a);
    store_w<V>(du.data, k, du.nb[0], du.dtype, b);
  });
}

__global__ void swiglu_kernel(TDesc out, TDesc g, TDesc u, int64_t n) {
  RT_GRID_LOOP(k, n) {
    const float gv = load_f(elem(g, out, k), g.dtype);
    store_f(elem(out, out, k), out.dtype, gv * sigmoid_f(gv) * load_f(elem(u, out, k), u.dtype));
  }
}

__global__ void swiglu_back_kernel(TDesc dg, TDesc du, TDesc dy, TDesc g, TDesc u, int64_t n) {
  RT_GRID_LOOP(k, n) {
    const float gv = load_f(elem(g, dg, k), g.dtype), uv = load_f(elem(u, dg, k), u.dtype);
    const float d = load_f(elem(dy, dg, k), dy.dtype), sg = sigmoid_f(gv);
    store_f(elem(dg, dg, k), dg.dtype, d * uv * sg * (1.0f + gv * (1.0f - sg)));
    store_f(elem(du, dg, k), du.dtype, d * gv * sg);
  }
}

// Whether every given tensor (nulls skipped) takes 8-wide row access.
bool vec8_all(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    if (t && !rows_vec8(t)) return false;
  return true;
}

// The same for flat access over contiguous tensors: only the start needs the alignment.
bool flat_vec8(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    if (!aligned16(t->data)) return false;
  return true;
}

void check_like(const Tensor* t, const Tensor* x, const char* what) {
  RT_CHECK(x && is_float(x->dtype) && same_shape(x, t), "cuda ", op_name(t->op), ": ", what, " ",
           x ? x->describe() : std::string("null"), " does not fit ", t->describe());
}

void check_weight(const Tensor* t, const Tensor* w) {
  RT_CHECK(is_float(w->dtype) && w->ne[0] == t->ne[0] && w->nelements() == w->ne[0], "cuda ", op_name(t->op),
           ": the weight ", w->describe(), " does not fit ", t->describe());
}

void rms_norm_affine_l(CudaExec& ex, Tensor* t) {
  const Tensor *x = t->src[0], *w = t->src[1], *delta = t->src[2];
  check_like(t, x, "x");
  check_weight(t, w);
  const bool has_delta = delta != nullptr;
  if (has_delta) {
    check_like(t, delta, "delta");
    check_like(t, t->aux[0], "the residual sum");
  }
  const TDesc none = desc(x);
  const bool v8 = vec8_all({t, x, w, delta, has_delta ? t->aux[0] : nullptr});
  auto launch = [&]<int W>() {
    rms_norm_affine_warp_kernel<W><<<ex.grid_for(x->nrows() * 32, kBlock), kBlock, 0, ex.stream>>>(
        desc(t), desc(x), desc(w), has_delta ? desc(delta) : none, has_delta ? desc(t->aux[0]) : none,
        has_delta, t->fp[0]);
  };
  v8 ? launch.template operator()<8>() : launch.template operator()<1>();
  RT_CUDA_LAUNCH_CHECK("rms_norm_affine_warp_kernel");
}

void rms_norm_affine_back_l(CudaExec& ex, Tensor* t) {
  const Tensor *gy = t->src[0], *s = t->src[1], *w = t->src[2], *gs = t->src[3];
  check_like(t, gy, "the upstream gradient");
  check_like(t, s, "the normalized input");
  check_weight(t, w);
  if (gs) check_like(t, gs, "the residual sum's gradient");
  auto launch = [&]<int W>() {
    rms_norm_affine_back_warp_kernel<W><<<ex.grid_for(t->nrows() * 32, kBlock), kBlock, 0, ex.stream>>>(
        desc(t), desc(gy), desc(s), desc(w), gs ? desc(gs) : desc(s), gs != nullptr, t->fp[0]);
  };
  vec8_all({t, gy, s, w, gs}) ? launch.template operator()<8>() : launch.template operator()<1>();
  RT_CUDA_LAUNCH_CHECK("rms_norm_affine_back_warp_kernel");
}

void rms_norm_affine_back_w_l(CudaExec& ex, Tensor* t) {
  const Tensor *gy = t->src[0], *s = t->src[1];
  RT_CHECK(same_shape(gy, s) && s->ne[0] == t->ne[0] && t->nelements() == t->ne[0], "cuda ", op_name(t->op),
           ": ", gy->describe(), " and ", s->describe(), " do not give the weight gradient ", t->describe());
  const int64_t m = s->nrows(), n = s->ne[0];
  const int W = vec8_all({gy, s}) ? 8 : 1;
  // Rows per chunk: halved from 256 (down to 32) until the column blocks × chunks give ~4 blocks per SM.
  const int64_t col_blocks = (n + 32 * W - 1) / (32 * W);
  int64_t chunk_rows = 256;
  while (chunk_rows > 32 && col_blocks * ((m + chunk_rows - 1) / chunk_rows) < 4 * int64_t(ex.sm_count))
    chunk_rows /= 2;
  const int64_t chunks = (m + chunk_rows - 1) / chunk_rows;
  RT_CHECK(chunks < 65536, "cuda ", op_name(t->op), ": ", s->describe(), " has too many rows");
  auto inv = ex.temp(sizeof(float) * size_t(m));
  auto part = ex.temp(sizeof(float) * size_t(chunks) * size_t(n));
  float* ip = static_cast<float*>(inv->data());
  float* pp = static_cast<float*>(part->data());
  auto launch = [&]<int V>() {
    row_inv_rms_kernel<V><<<ex.grid_for(m * 32, kBlock), kBlock, 0, ex.stream>>>(desc(s), t->fp[0], ip);
    RT_CUDA_LAUNCH_CHECK("row_inv_rms_kernel");
    norm_w_partial_kernel<V><<<dim3(unsigned(col_blocks), unsigned(chunks)), dim3(32, 8), 0, ex.stream>>>(
        desc(gy), desc(s), ip, m, chunk_rows, pp);
    RT_CUDA_LAUNCH_CHECK("norm_w_partial_kernel");
  };
  W == 8 ? launch.template operator()<8>() : launch.template operator()<1>();
  norm_w_final_kernel<<<unsigned((n + 31) / 32), dim3(32, 32), 0, ex.stream>>>(pp, chunks, desc(t));
  RT_CUDA_LAUNCH_CHECK("norm_w_final_kernel");
}

void swiglu_l(CudaExec& ex, Tensor* t) {
  check_like(t, t->src[0], "gate");
  check_like(t, t->src[1], "up");
  const int64_t n = t->nelements();
  if (t->is_contiguous() && t->src[0]->is_contiguous() && t->src[1]->is_contiguous()) {
    auto launch = [&]<int W>() {
      swiglu_flat_kernel<W><<<ex.grid_for((n + W - 1) / W, kBlock), kBlock, 0, ex.stream>>>(
          desc(t), desc(t->src[0]), desc(t->src[1]), n);
    };
    flat_vec8({t, t->src[0], t->src[1]}) ? launch.template operator()<8>() : launch.template operator()<1>();
    RT_CUDA_LAUNCH_CHECK("swiglu_flat_kernel");
    return;
  }
  swiglu_kernel<<<ex.grid_for(n, kBlock), kBlock, 0, ex.stream>>>(desc(t), desc(t->src[0]), desc(t->src[1]), n);
  RT_CUDA_LAUNCH_CHECK("swiglu_kernel");
}

void swiglu_back_l(CudaExec& ex, Tensor* t) {
  check_like(t, t->src[0], "the upstream gradient");
  check_like(t, t->src[1], "gate");
  check_like(t, t->src[2], "up");
  check_like(t, t->aux[0], "dup");
  const int64_t n = t->nelements();
  bool flat = t->is_contiguous() && t->aux[0]->is_contiguous();
  for (int i = 0; i < 3; ++i) flat = flat && t->src[size_t(i)]->is_contiguous();
  if (flat) {
    auto launch = [&]<int W>() {
      swiglu_back_flat_kernel<W><<<ex.grid_for((n + W - 1) / W, kBlock), kBlock, 0, ex.stream>>>(
          desc(t), desc(t->aux[0]), desc(t->src[0]), desc(t->src[1]), desc(t->src[2]), n);
    };
    flat_vec8({t, t->aux[0], t->src[0], t->src[1], t->src[2]}) ? launch.template operator()<8>()
                                                                : launch.template operator()<1>();
    RT_CUDA_LAUNCH_CHECK("swiglu_back_flat_kernel");
    return;
  }
  swiglu_back_kernel<<<ex.grid_for(n, kBlock), kBlock, 0, ex.stream>>>(
      desc(t), desc(t->aux[0]), desc(t->src[0]), desc(t->src[1]), desc(t->src[2]), n);
  RT_CUDA_LAUNCH_CHECK("swiglu_back_kernel");
}

}  // namespace

void register_cuda_fused_layer_ops(CudaOpTable& t) {
  t[size_t(Op::RmsNormAffine)] = rms_norm_affine_l;
  t[size_t(Op::RmsNormAffineBack)] = rms_norm_affine_back_l;
  t[size_t(Op::RmsNormAffineBackW)] = rms_norm_affine_back_w_l;
  t[size_t(Op::Swiglu)] = swiglu_l;
  t[size_t(Op::SwigluBack)] = swiglu_back_l;
}

}  // namespace retort::cuda
