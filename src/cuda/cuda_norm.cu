// Normalization over dim 0 (rms_norm, layer_norm and their backward ops) and rotary position embedding on the
// device. Norms: one block per row, f32 block reductions in a fixed tree (deterministic); the backward
// kernels recompute the row statistics from x, like the CPU. Backward nodes: src[0] = upstream gradient,
// src[1] = x, fp[0] = eps.
#include <algorithm>

#include "../ops/ops.h"
#include "cuda_common.cuh"

namespace retort::cuda {

namespace {

__device__ __forceinline__ float row_sum(const char* p, const TDesc& t, float* sh) {
  float acc = 0.0f;
  for (int64_t i = threadIdx.x; i < t.ne[0]; i += blockDim.x) acc += load_f(p + i * t.nb[0], t.dtype);
  return block_reduce(acc, SumOp{}, 0.0f, sh);
}

// y = x / sqrt(mean(x^2) + eps)
__global__ __launch_bounds__(1024) void rms_norm_kernel(TDesc out, TDesc x, float eps) {
  __shared__ float sh[32];
  const int64_t rows = nrows(x), n = x.ne[0];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const char* xp = row_at(x, r);
    char* op = row_at(out, r);
    float acc = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const float v = load_f(xp + i * x.nb[0], x.dtype);
      acc += v * v;
    }
    const float ss = block_reduce(acc, SumOp{}, 0.0f, sh);
    const float inv = 1.0f / sqrtf(ss / float(n) + eps);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
      store_f(op + i * out.nb[0], out.dtype, load_f(xp + i * x.nb[0], x.dtype) * inv);
  }
}

// dx = r g - r^3 x mean(g x), r = 1 / sqrt(mean(x^2) + eps)
__global__ __launch_bounds__(1024) void rms_norm_back_kernel(TDesc out, TDesc g, TDesc x, float eps) {
  __shared__ float sh[32];
  const int64_t rows = nrows(out), n = out.ne[0];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const char* gp = row_at(g, r);
    const char* xp = row_at(x, r);
    char* op = row_at(out, r);
    float axx = 0.0f, agx = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const float xv = load_f(xp + i * x.nb[0], x.dtype);
      axx += xv * xv;
      agx += load_f(gp + i * g.nb[0], g.dtype) * xv;
    }
    const float ss = block_reduce(axx, SumOp{}, 0.0f, sh);
    const float gx = block_reduce(agx, SumOp{}, 0.0f, sh);
    const float inv = 1.0f / sqrtf(ss / float(n) + eps);
    const float c = (gx / float(n)) * inv * inv * inv;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const float gv = load_f(gp + i * g.nb[0], g.dtype);
      const float xv = load_f(xp + i * x.nb[0], x.dtype);
      store_f(op + i * out.nb[0], out.dtype, inv * gv - c * xv);
    }
  }
}

// The mean and 1 / sqrt(biased variance + eps) of a row (two passes: no cancellation).
__device__ __forceinline__ void row_moments(const char* xp, const TDesc& x, float eps, float* sh, float& mean,
                                            float& inv) {
  const int64_t n = x.ne[0];
  mean = row_sum(xp, x, sh) / float(n);
  float acc = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float d = load_f(xp + i * x.nb[0], x.dtype) - mean;
    acc += d * d;
  }
  const float ss = block_reduce(acc, SumOp{}, 0.0f, sh);
  inv = 1.0f / sqrtf(ss / float(n) + eps);
}

__global__ __launch_bounds__(1024) void layer_norm_kernel(TDesc out, TDesc x, float eps) {
  __shared__ float sh[32];
  const int64_t rows = nrows(x), n = x.ne[0];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const char* xp = row_at(x, r);
    char* op = row_at(out, r);
    float mean, inv;
    row_moments(xp, x, eps, sh, mean, inv);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
      store_f(op + i * out.nb[0], out.dtype, (load_f(xp + i * x.nb[0], x.dtype) - mean) * inv);
  }
}

// With xh = (x - mean) r: dx = r (g - mean(g) - xh mean(g xh)).
__global__ __launch_bounds__(1024) void layer_norm_back_kernel(TDesc out, TDesc g, TDesc x, float eps) {
  __shared__ float sh[32];
  const int64_t rows = nrows(out), n = out.ne[0];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const char* gp = row_at(g, r);
    const char* xp = row_at(x, r);
    char* op = row_at(out, r);
    float mean, inv;
    row_moments(xp, x, eps, sh, mean, inv);
    float ag = 0.0f, agx = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const float gv = load_f(gp + i * g.nb[0], g.dtype);
      const float xh = (load_f(xp + i * x.nb[0], x.dtype) - mean) * inv;
      ag += gv;
      agx += gv * xh;
    }
    const float mg = block_reduce(ag, SumOp{}, 0.0f, sh) / float(n);
    const float mgx = block_reduce(agx, SumOp{}, 0.0f, sh) / float(n);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const float gv = load_f(gp + i * g.nb[0], g.dtype);
      const float xh = (load_f(xp + i * x.nb[0], x.dtype) - mean) * inv;
      store_f(op + i * out.nb[0], out.dtype, inv * (gv - mg - xh * mgx));
    }
  }
}

// Rope: x [B, T, heads, d] (ne0 = d, ne1 = heads, ne2 = T, ne3 = B), positions i32 [T]. One thread per pair:
// pair i of (head, step, batch) is (2i, 2i + 1) in Normal mode and (i, i + d/2) in Neox mode, rotated by
// p * theta^(-2i/d) (negated when inverse). Like the CPU, the angle and its cos / sin are computed in double:
// angles reach thousands of radians, where an f32 angle would already be off by 1e-4.
__global__ void rope_kernel(TDesc out, TDesc x, TDesc pos, bool neox, bool inverse, double theta, int64_t n) {
  const int64_t d = x.ne[0], half = d / 2;
  RT_GRID_LOOP(k, n) {
    const int64_t i = k % half;
    const int64_t r = k / half;  // row over dims 1..3
    const int64_t head = r % x.ne[1], q = r / x.ne[1];
    const int64_t step = q % x.ne[2], batch = q / x.ne[2];
    const double p = double(load_i(pos.data + step * pos.nb[0], pos.dtype));
    const double a = (inverse ? -p : p) * pow(theta, -2.0 * double(i) / double(d));
    double sd, cd;
    sincos(a, &sd, &cd);
    const float c = float(cd), s = float(sd);
    const int64_t j0 = neox ? i : 2 * i, j1 = neox ? i + half : 2 * i + 1;
    const int64_t c_in[4] = {0, head, step, batch};
    const char* xp = at(x, c_in);
    char* op = at(out, c_in);
    const float v0 = load_f(xp + j0 * x.nb[0], x.dtype), v1 = load_f(xp + j1 * x.nb[0], x.dtype);
    store_f(op + j0 * out.nb[0], out.dtype, v0 * c - v1 * s);
    store_f(op + j1 * out.nb[0], out.dtype, v0 * s + v1 * c);
  }
}

// The same for contiguous x and out, in two passes: the [T, d/2] (cos, sin) table (angles in double, as
// above), then a flat pass over the values that reads it from L2. W = 8: a thread rotates 8 values in one
// 16-byte access (4 adjacent pairs, or in Neox mode 8 first halves and their partners).
__global__ void rope_table_kernel(TDesc pos, int64_t T, int64_t d, bool inverse, double theta, float2* cs) {
  const int64_t half = d / 2;
  RT_GRID_LOOP(k, T * half) {
    const int64_t step = k / half, i = k % half;
    const double p = double(load_i(pos.data + step * pos.nb[0], pos.dtype));
    const double a = (inverse ? -p : p) * pow(theta, -2.0 * double(i) / double(d));
    double sd, cd;
    sincos(a, &sd, &cd);
    cs[k] = make_float2(float(cd), float(sd));
  }
}

template <int W>
__global__ void rope_apply_kernel(char* out, DType ot, const char* x, DType xt, int64_t x_row, const float2* cs,
                                  int64_t heads, int64_t d, int64_t T, int64_t rows, bool neox) {
  const int xs = dtype_size_dev(xt), os = dtype_size_dev(ot);
  const int64_t half = d / 2;
  // A group is W values of a head: W / 2 pairs (Normal), or W first halves whose partners sit half further.
  const int64_t per_head = neox ? half / W : d / W, per_row = heads * per_head;
  RT_GRID_LOOP(q, rows * per_row) {
    const int64_t row = q / per_row, k = q % per_row, head = k / per_head, g = k % per_head;
    const float2* c = cs + (row % T) * half;
    // x's rows (positions) may sit x_row elements apart (q, k and v side by side); out is dense.
    const int64_t base = row * heads * d + head * d, xbase = row * x_row + head * d, dx = xbase - base;
    if (neox) {
      const int64_t i0 = g * W, j0 = base + i0, j1 = j0 + half;
      float v0[W], v1[W];
      load_w<W>(x, j0 + dx, xs, xt, v0);
      load_w<W>(x, j1 + dx, xs, xt, v1);
#pragma unroll
      for (int e = 0; e < W; ++e) {
        const float2 r = c[i0 + e];
        const float a0 = v0[e], a1 = v1[e];
        v0[e] = a0 * r.x - a1 * r.y;
        v1[e] = a0 * r.y + a1 * r.x;
      }
      store_w<W>(out, j0, os, ot, v0);
      store_w<W>(out, j1, os, ot, v1);
    } else {
      // Normal: W = 8 rotates 4 adjacent pairs; W = 1 makes a group of each pair (per_head counts values,
      // so odd groups have nothing to do).
      constexpr int P = W == 8 ? 4 : 1;
      if (W == 1 && g % 2) continue;
      const int64_t j = base + (W == 8 ? g * 8 : g), i0 = (W == 8 ? g * 4 : g / 2);
      float v[2 * P];
      if constexpr (W == 8) {
        load8f(x + (j + dx) * xs, xt, v);
      } else {
        v[0] = load_f(x + (j + dx) * xs, xt), v[1] = load_f(x + (j + 1 + dx) * xs, xt);
      }
#pragma unroll
      for (int e = 0; e < P; ++e) {
        const float2 r = c[i0 + e];
        const float a0 = v[2 * e], a1 = v[2 * e + 1];
        v[2 * e] = a0 * r.x - a1 * r.y;
        v[2 * e + 1] = a0 * r.y + a1 * r.x;
      }
      if constexpr (W == 8) {
        store8f(out + j * os, ot, v);
      } else {
        store_f(out + j * os, ot, v[0]), store_f(out + (j + 1) * os, ot, v[1]);
      }
    }
  }
}

void check_norm(const Tensor* t, const Tensor* x) {
  RT_CHECK(is_float(x->dtype) && same_shape(x, t), "cuda ", op_name(t->op), ": unexpected input ",
           x->describe(), " for ", t->describe());
}

void rms_norm_l(CudaExec& ex, Tensor* t) {
  const Tensor* x = t->src[0];
  check_norm(t, x);
  rms_norm_kernel<<<row_grid(x->nrows()), row_block(x->ne[0]), 0, ex.stream>>>(desc(t), desc(x), t->fp[0]);
  RT_CUDA_LAUNCH_CHECK("rms_norm_kernel");
}

void layer_norm_l(CudaExec& ex, Tensor* t) {
  const Tensor* x = t->src[0];
  check_norm(t, x);
  layer_norm_kernel<<<row_grid(x->nrows()), row_block(x->ne[0]), 0, ex.stream>>>(desc(t), desc(x), t->fp[0]);
  RT_CUDA_LAUNCH_CHECK("layer_norm_kernel");
}

void rms_norm_back_l(CudaExec& ex, Tensor* t) {
  check_norm(t, t->src[0]);
  check_norm(t, t->src[1]);
  rms_norm_back_kernel<<<row_grid(t->nrows()), row_block(t->ne[0]), 0, ex.stream>>>(
      desc(t), desc(t->src[0]), desc(t->src[1]), t->fp[0]);
  RT_CUDA_LAUNCH_CHECK("rms_norm_back_kernel");
}

void layer_norm_back_l(CudaExec& ex, Tensor* t) {
  check_norm(t, t->src[0]);
  check_norm(t, t->src[1]);
  layer_norm_back_kernel<<<row_grid(t->nrows()), row_block(t->ne[0]), 0, ex.stream>>>(
      desc(t), desc(t->src[0]), desc(t->src[1]), t->fp[0]);
  RT_CUDA_LAUNCH_CHECK("layer_norm_back_kernel");
}

void rope_l(CudaExec& ex, Tensor* t) {
  const Tensor* x = t->src[0];
  const Tensor* pos = t->src[1];
  check_norm(t, x);
  RT_CHECK(x->ne[0] % 2 == 0 && is_int(pos->dtype) && pos->ne[0] == x->ne[2], "cuda rope: positions ",
           pos->describe(), " do not fit x ", x->describe());
  const bool neox = RopeMode(t->ip[0]) == RopeMode::Neox, inverse = t->ip[1] != 0;
  // The table path: out dense, x dense within each position's heads, its positions evenly apart.
  const size_t es = x->elsize();
  const bool x_rows = x->nb[0] == es && x->nb[1] == size_t(x->ne[0]) * es && x->nb[2] % es == 0 &&
                      x->nb[2] >= size_t(x->ne[0] * x->ne[1]) * es && x->nb[3] == size_t(x->ne[2]) * x->nb[2];
  if (x_rows && t->is_contiguous()) {
    const int64_t T = x->ne[2], half = x->ne[0] / 2, rows = x->ne[2] * x->ne[3];
    const int64_t x_row = int64_t(x->nb[2] / es);
    auto table = ex.temp(sizeof(float2) * size_t(T) * size_t(half));
    float2* cs = static_cast<float2*>(table->data());
    rope_table_kernel<<<ex.grid_for(T * half, kBlock), kBlock, 0, ex.stream>>>(desc(pos), T, x->ne[0], inverse,
                                                                              double(t->fp[0]), cs);
    RT_CUDA_LAUNCH_CHECK("rope_table_kernel");
    // 8-wide when a group of 8 never crosses a head's half (Neox) or a head (Normal), and the rows align.
    const bool v8 = aligned16(x->data) && aligned16(t->data) && x->nb[2] % 16 == 0 &&
                    (neox ? half % 8 == 0 : x->ne[0] % 8 == 0);
    auto launch = [&]<int W>() {
      const int64_t groups = rows * x->ne[1] * (neox ? half / W : x->ne[0] / W);
      rope_apply_kernel<W><<<ex.grid_for(groups, kBlock), kBlock, 0, ex.stream>>>(
          static_cast<char*>(t->data), t->dtype, static_cast<const char*>(x->data), x->dtype, x_row, cs, x->ne[1],
          x->ne[0], T, rows, neox);
    };
    v8 ? launch.template operator()<8>() : launch.template operator()<1>();
    RT_CUDA_LAUNCH_CHECK("rope_apply_kernel");
    return;
  }
  const int64_t n = x->nelements() / 2;
  rope_kernel<<<ex.grid_for(n, kBlock), kBlock, 0, ex.stream>>>(
      desc(t), desc(x), desc(pos), RopeMode(t->ip[0]) == RopeMode::Neox, t->ip[1] != 0, double(t->fp[0]), n);
  RT_CUDA_LAUNCH_CHECK("rope_kernel");
}

}  // namespace

void register_cuda_norm_ops(CudaOpTable& t) {
  t[size_t(Op::RmsNorm)] = rms_norm_l;
  t[size_t(Op::RmsNormBack)] = rms_norm_back_l;
  t[size_t(Op::LayerNorm)] = layer_norm_l;
  t[size_t(Op::LayerNormBack)] = layer_norm_back_l;
  t[size_t(Op::Rope)] = rope_l;
  // The fused norm and SwiGLU (their own file) register with the norms, whose family they extend.
  register_cuda_fused_layer_ops(t);
}

}  // namespace retort::cuda
