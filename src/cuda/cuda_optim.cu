// The optimizer ops on the device (src/ops/optim_ops.h): a block per chunk of the table, so one launch
// covers every parameter. The update formulas follow the CPU kernels (src/ops/optim.cpp) expression for
// expression, so CPU and CUDA parameters agree to rounding (fused multiply-adds aside). Nothing here reads
// back to the host: the norm, the clip scale and the skip decision go from kernel to kernel through the
// stats leaf, and the per-step values (learning rate, bias corrections) come in the hparams leaf the host
// writes before the step. Every argument is fixed for the table's life, so the launches can be captured in
// a CUDA Graph and replayed.
#include <cstring>

#include "cuda_common.cuh"
#include "../ops/optim_ops.h"

namespace retort::cuda {

namespace {

template <typename T>
__device__ __forceinline__ T* col(const int64_t* row, int c) {
  return reinterpret_cast<T*>(static_cast<intptr_t>(row[c]));
}

// Block b sums the squares of chunk b in double; the reduction order depends only on the block shape, so
// the result is reproducible.
__global__ void chunk_sum_squares_kernel(const int64_t* tab, double* part) {
  __shared__ double sh[32];
  const int64_t* row = tab + int64_t(blockIdx.x) * kOptCols;
  const float* g = col<const float>(row, kOptGrad);
  const int64_t n = row[kOptCount];
  double acc = 0.0;
  const int64_t n4 = (row[kOptGrad] & 15) == 0 ? n / 4 : 0;
  for (int64_t q = threadIdx.x; q < n4; q += blockDim.x) {
    const float4 x = reinterpret_cast<const float4*>(g)[q];
    acc += double(x.x) * double(x.x) + double(x.y) * double(x.y) + double(x.z) * double(x.z) +
           double(x.w) * double(x.w);
  }
  for (int64_t i = n4 * 4 + threadIdx.x; i < n; i += blockDim.x) acc += double(g[i]) * double(g[i]);
  acc = block_reduce(acc, SumOp{}, 0.0, sh);
  if (threadIdx.x == 0) part[blockIdx.x] = acc;
}

// One block: the total, the norm, the clip scale and whether the step may go ahead, into stats.
__global__ __launch_bounds__(1024) void norm_finish_kernel(double* part, int64_t chunks, const char* loss,
                                                           DType loss_dtype, double max_norm, float* stats) {
  __shared__ double sh[32];
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < chunks; i += blockDim.x) acc += part[i];
  acc = block_reduce(acc, SumOp{}, 0.0, sh);
  if (threadIdx.x != 0) return;
  part[chunks] = acc;
  const double norm = sqrt(acc);
  const float lv = loss ? load_f(loss, loss_dtype) : 0.0f;
  const bool ok = isfinite(norm) && isfinite(lv);
  // A non-finite norm keeps scale 1: max_norm / inf would zero the finite gradients and keep the NaNs.
  stats[kStatLoss] = lv;
  stats[kStatNorm] = float(norm);
  stats[kStatScale] = ok && max_norm > 0.0 && norm > max_norm ? float(max_norm / norm) : 1.0f;
  stats[kStatOk] = ok ? 1.0f : 0.0f;
}

__global__ void chunk_scale_kernel(const int64_t* tab, const float* stats) {
  const float s = stats[kStatScale];
  if (s == 1.0f) return;
  const int64_t* row = tab + int64_t(blockIdx.x) * kOptCols;
  float* g = col<float>(row, kOptGrad);
  const int64_t n = row[kOptCount];
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) g[i] *= s;
}

struct AdamWConst {
  float beta1, beta2, eps;
};

// One element's update; w is the parameter (decoupled weight decay, then the Adam step).
__device__ __forceinline__ void adamw_one(float g, float& m, float& v, float& w, float step_size,
                                          float inv_sqrt_bc2, float decay, const AdamWConst& a) {
  m = a.beta1 * m + (1.0f - a.beta1) * g;
  v = a.beta2 * v + (1.0f - a.beta2) * g * g;
  w = w * decay;
  w -= step_size * m / (sqrtf(v) * inv_sqrt_bc2 + a.eps);
}

// hp = {lr, lr / bc1, 1 / sqrt(bc2), 1 - lr * weight_decay}, written by the host for this step. f32
// parameters go four at a time (16-byte accesses keep enough bytes in flight); the rest one by one.
__global__ void adamw_chunks_kernel(const int64_t* tab, const float* stats, const float* hp, AdamWConst a) {
  if (stats[kStatOk] == 0.0f) return;  // a non-finite loss or norm: the whole step is skipped
  const float scale = stats[kStatScale];
  const float step_size = hp[1], inv_sqrt_bc2 = hp[2], decay = hp[3];
  const int64_t* row = tab + int64_t(blockIdx.x) * kOptCols;
  const float* g = col<const float>(row, kOptGrad);
  float* m = col<float>(row, kOptState1);
  float* v = col<float>(row, kOptState2);
  char* p = col<char>(row, kOptParam);
  const DType dt = DType(row[kOptDType]);
  const int64_t n = row[kOptCount], es = dtype_size_dev(dt);
  const bool v4 =
      dt == DType::F32 && ((row[kOptGrad] | row[kOptState1] | row[kOptState2] | row[kOptParam]) & 15) == 0;
  const int64_t n4 = v4 ? n / 4 : 0;
  for (int64_t q = threadIdx.x; q < n4; q += blockDim.x) {
    const float4 gq = reinterpret_cast<const float4*>(g)[q];
    float4 mq = reinterpret_cast<float4*>(m)[q], vq = reinterpret_cast<float4*>(v)[q];
    float4 wq = reinterpret_cast<float4*>(p)[q];
    // the clipped gradient; exact when scale is 1
    adamw_one(gq.x * scale, mq.x, vq.x, wq.x, step_size, inv_sqrt_bc2, decay, a);
    adamw_one(gq.y * scale, mq.y, vq.y, wq.y, step_size, inv_sqrt_bc2, decay, a);
    adamw_one(gq.z * scale, mq.z, vq.z, wq.z, step_size, inv_sqrt_bc2, decay, a);
    adamw_one(gq.w * scale, mq.w, vq.w, wq.w, step_size, inv_sqrt_bc2, decay, a);
    reinterpret_cast<float4*>(m)[q] = mq;
    reinterpret_cast<float4*>(v)[q] = vq;
    reinterpret_cast<float4*>(p)[q] = wq;
  }
  for (int64_t i = n4 * 4 + threadIdx.x; i < n; i += blockDim.x) {
    char* pp = p + i * es;
    float w = load_f(pp, dt);
    adamw_one(g[i] * scale, m[i], v[i], w, step_size, inv_sqrt_bc2, decay, a);
    store_f(pp, dt, w);
  }
}

__global__ void sgd_chunks_kernel(const int64_t* tab, const float* stats, const float* hp, float momentum,
                                  float wd) {
  if (stats[kStatOk] == 0.0f) return;
  const float scale = stats[kStatScale];
  const float lr = hp[0];
  const int64_t* row = tab + int64_t(blockIdx.x) * kOptCols;
  const float* g = col<const float>(row, kOptGrad);
  float* mom = col<float>(row, kOptState1);
  char* p = col<char>(row, kOptParam);
  const DType dt = DType(row[kOptDType]);
  const int64_t n = row[kOptCount], es = dtype_size_dev(dt);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    char* pp = p + i * es;
    const float w = load_f(pp, dt);
    float d = g[i] * scale + wd * w;
    if (mom) d = mom[i] = momentum * mom[i] + d;
    store_f(pp, dt, w - lr * d);
  }
}

// The table's chunk count as a grid size (a chunk is 2^16 elements: 2^31 chunks would be 2^47 elements).
unsigned grid_of(const Tensor* table) {
  RT_ASSERT(table->ne[1] >= 1 && table->ne[1] < (int64_t(1) << 31));
  return unsigned(table->ne[1]);
}

void grad_norm_l(CudaExec& ex, Tensor* node) {
  const Tensor* table = node->src[1];
  const int64_t* tab = static_cast<const int64_t*>(table->data);
  double* part = static_cast<double*>(node->src[2]->data);
  float* stats = static_cast<float*>(node->data);  // aliases the stats leaf
  const Tensor* loss = node->src[3];
  double max_norm = 0;
  std::memcpy(&max_norm, &node->ip[1], sizeof max_norm);
  chunk_sum_squares_kernel<<<grid_of(table), kBlock, 0, ex.stream>>>(tab, part);
  RT_CUDA_LAUNCH_CHECK("chunk_sum_squares_kernel");
  norm_finish_kernel<<<1, 1024, 0, ex.stream>>>(part, table->ne[1],
                                                loss ? static_cast<const char*>(loss->data) : nullptr,
                                                loss ? loss->dtype : DType::F32, max_norm, stats);
  RT_CUDA_LAUNCH_CHECK("norm_finish_kernel");
  if (node->ip[0]) {
    chunk_scale_kernel<<<grid_of(table), kBlock, 0, ex.stream>>>(tab, stats);
    RT_CUDA_LAUNCH_CHECK("chunk_scale_kernel");
  }
}

void adamw_step_l(CudaExec& ex, Tensor* node) {
  const Tensor* table = node->src[1];
  adamw_chunks_kernel<<<grid_of(table), kBlock, 0, ex.stream>>>(
      static_cast<const int64_t*>(table->data), static_cast<const float*>(node->data),
      static_cast<const float*>(node->src[2]->data), AdamWConst{node->fp[0], node->fp[1], node->fp[2]});
  RT_CUDA_LAUNCH_CHECK("adamw_chunks_kernel");
}

void sgd_step_l(CudaExec& ex, Tensor* node) {
  const Tensor* table = node->src[1];
  sgd_chunks_kernel<<<grid_of(table), kBlock, 0, ex.stream>>>(
      static_cast<const int64_t*>(table->data), static_cast<const float*>(node->data),
      static_cast<const float*>(node->src[2]->data), node->fp[0], node->fp[1]);
  RT_CUDA_LAUNCH_CHECK("sgd_chunks_kernel");
}

}  // namespace

void register_cuda_optim_ops(CudaOpTable& t) {
  t[size_t(Op::GradNorm)] = grad_norm_l;
  t[size_t(Op::AdamWStep)] = adamw_step_l;
  t[size_t(Op::SgdStep)] = sgd_step_l;
}

}  // namespace retort::cuda
