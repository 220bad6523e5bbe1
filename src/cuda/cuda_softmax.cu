// The softmax family over dim 0 on the device: softmax, log_softmax, causal_softmax and the two backward ops.
// One block per row. The forward pass reads the row once for an online (max, sum of exp) pair per thread,
// merges the pairs with a fixed butterfly/tree (deterministic), then reads it again to write the result.
#include "cuda_common.cuh"

namespace retort::cuda {

namespace {

enum SoftmaxMode : int { kSoftmax = 0, kLogSoftmax = 1, kCausal = 2 };

// Causal mode: x is [.., T_q, T_k] with rows = queries; row r's query index is r mod ne1 and it sees keys
// j <= i + n_past. The input is scaled by `scale` first; hidden keys get probability 0.
__global__ __launch_bounds__(1024) void softmax_kernel(TDesc out, TDesc x, int mode, float scale,
                                                       int64_t n_past) {
  __shared__ MaxSum sh[32];
  const int64_t rows = nrows(x), n = x.ne[0];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const char* xp = row_at(x, r);
    char* op = row_at(out, r);
    int64_t limit = n;
    float sc = 1.0f;
    if (mode == kCausal) {
      const int64_t q = r % x.ne[1];
      limit = q + n_past + 1;
      limit = limit < 0 ? 0 : (limit > n ? n : limit);
      sc = scale;
    }
    MaxSum ms{-INFINITY, 0.0f};
    for (int64_t j = threadIdx.x; j < limit; j += blockDim.x)
      ms = maxsum_add(ms, load_f(xp + j * x.nb[0], x.dtype) * sc);
    ms = block_maxsum(ms, sh);
    const float inv = 1.0f / ms.s;
    const float lse = ms.m + logf(ms.s);
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      float v = 0.0f;
      if (j < limit) {
        const float xv = load_f(xp + j * x.nb[0], x.dtype) * sc;
        v = mode == kLogSoftmax ? xv - lse : expf(xv - ms.m) * inv;
      }
      store_f(op + j * out.nb[0], out.dtype, v);
    }
  }
}

// softmax_back: dx = y * (g - sum(g * y)). log_softmax_back: dx = g - exp(y) * sum(g).
__global__ __launch_bounds__(1024) void softmax_back_kernel(TDesc out, TDesc g, TDesc y, bool log_mode) {
  __shared__ float sh[32];
  const int64_t rows = nrows(out), n = out.ne[0];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const char* gp = row_at(g, r);
    const char* yp = row_at(y, r);
    char* op = row_at(out, r);
    float acc = 0.0f;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const float gv = load_f(gp + j * g.nb[0], g.dtype);
      acc += log_mode ? gv : gv * load_f(yp + j * y.nb[0], y.dtype);
    }
    const float s = block_reduce(acc, SumOp{}, 0.0f, sh);
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const float gv = load_f(gp + j * g.nb[0], g.dtype);
      const float yv = load_f(yp + j * y.nb[0], y.dtype);
      store_f(op + j * out.nb[0], out.dtype, log_mode ? gv - expf(yv) * s : yv * (gv - s));
    }
  }
}

void launch_softmax(CudaExec& ex, Tensor* t, int mode, float scale, int64_t n_past) {
  const Tensor* x = t->src[0];
  RT_CHECK(is_float(x->dtype) && same_shape(x, t), "cuda ", op_name(t->op), ": unexpected input ",
           x->describe(), " for ", t->describe());
  softmax_kernel<<<row_grid(x->nrows()), row_block(x->ne[0]), 0, ex.stream>>>(desc(t), desc(x), mode, scale,
                                                                              n_past);
  RT_CUDA_LAUNCH_CHECK("softmax_kernel");
}

void launch_softmax_back(CudaExec& ex, Tensor* t, bool log_mode) {
  const Tensor* g = t->src[0];
  const Tensor* y = t->src[1];
  RT_CHECK(is_float(g->dtype) && is_float(y->dtype) && same_shape(g, t) && same_shape(y, t), "cuda ",
           op_name(t->op), ": unexpected inputs ", g->describe(), " and ", y->describe(), " for ",
           t->describe());
  softmax_back_kernel<<<row_grid(t->nrows()), row_block(t->ne[0]), 0, ex.stream>>>(desc(t), desc(g), desc(y),
                                                                                   log_mode);
  RT_CUDA_LAUNCH_CHECK("softmax_back_kernel");
}

void softmax_l(CudaExec& ex, Tensor* t) {
  launch_softmax(ex, t, kSoftmax, 1.0f, 0);
}
void log_softmax_l(CudaExec& ex, Tensor* t) {
  launch_softmax(ex, t, kLogSoftmax, 1.0f, 0);
}
void causal_softmax_l(CudaExec& ex, Tensor* t) {
  launch_softmax(ex, t, kCausal, t->fp[0], t->ip[0]);
}
void softmax_back_l(CudaExec& ex, Tensor* t) {
  launch_softmax_back(ex, t, false);
}
void log_softmax_back_l(CudaExec& ex, Tensor* t) {
  launch_softmax_back(ex, t, true);
}

}  // namespace

void register_cuda_softmax_ops(CudaOpTable& t) {
  t[size_t(Op::Softmax)] = softmax_l;
  t[size_t(Op::LogSoftmax)] = log_softmax_l;
  t[size_t(Op::CausalSoftmax)] = causal_softmax_l;
  t[size_t(Op::SoftmaxBack)] = softmax_back_l;
  t[size_t(Op::LogSoftmaxBack)] = log_softmax_back_l;
}

}  // namespace retort::cuda
