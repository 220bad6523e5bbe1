// Optimizer updates and the helpers gradient clipping needs, on the device. The update formulas follow the
// CPU backend operation for operation (same f32 expressions, same host-side bias corrections), so CPU and
// CUDA parameters agree to rounding.
#include <cmath>

#include "cuda_common.cuh"

namespace retort::cuda {

namespace {

struct AdamWArgs {
  float beta1, beta2, eps, step_size, inv_sqrt_bc2, decay;
};

__global__ void adamw_kernel(char* p, DType dt, const float* g, float* m, float* v, AdamWArgs a, int64_t n) {
  RT_GRID_LOOP(i, n) {
    const float gi = g[i];
    const float mi = a.beta1 * m[i] + (1.0f - a.beta1) * gi;
    const float vi = a.beta2 * v[i] + (1.0f - a.beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    char* pp = p + i * int64_t(dtype_size_dev(dt));
    float w = load_f(pp, dt) * a.decay;  // decoupled weight decay
    w -= a.step_size * mi / (sqrtf(vi) * a.inv_sqrt_bc2 + a.eps);
    store_f(pp, dt, w);
  }
}

__global__ void sgd_kernel(char* p, DType dt, const float* g, float* mom, float lr, float momentum, float wd,
                           int64_t n) {
  RT_GRID_LOOP(i, n) {
    char* pp = p + i * int64_t(dtype_size_dev(dt));
    const float w = load_f(pp, dt);
    float d = g[i] + wd * w;
    if (mom) d = mom[i] = momentum * mom[i] + d;
    store_f(pp, dt, w - lr * d);
  }
}

constexpr int kSsBlocks = 1024;

// Stage 1 of sum_squares: block b sums a grid-stride share in double. The grid is fixed (kSsBlocks or fewer
// for small n, a function of n alone), so the result is reproducible.
__global__ void sum_squares_stage1(const float* x, int64_t n, double* part) {
  __shared__ double sh[32];
  double acc = 0.0;
  RT_GRID_LOOP(i, n) acc += double(x[i]) * double(x[i]);
  acc = block_reduce(acc, SumOp{}, 0.0, sh);
  if (threadIdx.x == 0) part[blockIdx.x] = acc;
}

__global__ __launch_bounds__(1024) void sum_squares_stage2(const double* part, int nparts, double* out) {
  __shared__ double sh[32];
  double acc = 0.0;
  for (int i = threadIdx.x; i < nparts; i += blockDim.x) acc += part[i];
  acc = block_reduce(acc, SumOp{}, 0.0, sh);
  if (threadIdx.x == 0) *out = acc;
}

__global__ void scale_kernel(float* x, float s, int64_t n) {
  RT_GRID_LOOP(i, n) x[i] *= s;
}

}  // namespace

void launch_adamw(CudaExec& ex, Tensor* p, const Tensor* g, Tensor* m, Tensor* v, const AdamWParams& o) {
  const double bc1 = 1.0 - std::pow(double(o.beta1), double(o.step));
  const double bc2 = 1.0 - std::pow(double(o.beta2), double(o.step));
  AdamWArgs a;
  a.beta1 = o.beta1;
  a.beta2 = o.beta2;
  a.eps = o.eps;
  a.step_size = float(o.lr / bc1);
  a.inv_sqrt_bc2 = float(1.0 / std::sqrt(bc2));
  a.decay = 1.0f - o.lr * o.weight_decay;
  const int64_t n = p->nelements();
  adamw_kernel<<<ex.grid_for(n, kBlock), kBlock, 0, ex.stream>>>(
      static_cast<char*>(p->data), p->dtype, static_cast<const float*>(g->data), static_cast<float*>(m->data),
      static_cast<float*>(v->data), a, n);
  RT_CUDA_LAUNCH_CHECK("adamw_kernel");
}

void launch_sgd(CudaExec& ex, Tensor* p, const Tensor* g, Tensor* mom, const SgdParams& o) {
  const int64_t n = p->nelements();
  sgd_kernel<<<ex.grid_for(n, kBlock), kBlock, 0, ex.stream>>>(
      static_cast<char*>(p->data), p->dtype, static_cast<const float*>(g->data),
      mom ? static_cast<float*>(mom->data) : nullptr, o.lr, o.momentum, o.weight_decay, n);
  RT_CUDA_LAUNCH_CHECK("sgd_kernel");
}

void launch_sum_squares(CudaExec& ex, const Tensor* t, double* out) {
  const int64_t n = t->nelements();
  const int nparts = int(std::min<int64_t>((n + kBlock - 1) / kBlock, kSsBlocks));
  auto part = ex.temp(sizeof(double) * size_t(nparts));
  sum_squares_stage1<<<nparts, kBlock, 0, ex.stream>>>(static_cast<const float*>(t->data), n,
                                                       part->as<double>());
  RT_CUDA_LAUNCH_CHECK("sum_squares_stage1");
  sum_squares_stage2<<<1, 1024, 0, ex.stream>>>(part->as<double>(), nparts, out);
  RT_CUDA_LAUNCH_CHECK("sum_squares_stage2");
}

void launch_scale(CudaExec& ex, Tensor* t, float s) {
  const int64_t n = t->nelements();
  scale_kernel<<<ex.grid_for(n, kBlock), kBlock, 0, ex.stream>>>(static_cast<float*>(t->data), s, n);
  RT_CUDA_LAUNCH_CHECK("scale_kernel");
}

}  // namespace retort::cuda
