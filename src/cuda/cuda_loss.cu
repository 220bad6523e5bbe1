// Plain cross-entropy on the device: logits [.., V] (one prediction per row), integer labels with the logits'
// shape minus V, ip[0] = ignore_index. The loss is the mean over valid rows of lse(row) - row[label]; all
// rows ignored gives 0. Rows: one block each, an online (max, sum of exp) pass. The mean: per-row losses in a
// buffer, then one block sums them in double in a fixed tree (deterministic).
//
// A label outside [0, V) that is not ignore_index is recorded in the device error record (reported at the
// next synchronize or read) and its row is treated as ignored.
#include "cuda_common.cuh"

namespace retort::cuda {

namespace {

// The label of logits row r (labels' dims 0..2 are the logits' dims 1..3, so r is the labels' logical index).
__device__ __forceinline__ long long label_at(const TDesc& labels, int64_t r) {
  int64_t c[4];
  unravel(r, labels.ne, c);
  return load_i(at(labels, c), labels.dtype);
}

// -1: ignored row; -2: bad label (reported); else the label.
__device__ __forceinline__ long long checked_label(const TDesc& labels, int64_t r, long long ignore,
                                                   int64_t V, Op op, DeviceError* err, bool report) {
  const long long y = label_at(labels, r);
  if (y == ignore) return -1;
  if (y < 0 || y >= V) {
    if (report) report_error(err, op, kErrLabelOutOfRange, y, V);
    return -2;
  }
  return y;
}

// Per row: loss[r] = (m - x[y]) + log(sum exp(x - m)) and valid[r] = 1, or 0 and 0 for an ignored row.
__global__ __launch_bounds__(1024) void ce_rows_kernel(TDesc logits, TDesc labels, long long ignore,
                                                       DeviceError* err, float* loss, float* valid) {
  __shared__ MaxSum sh[32];
  const int64_t rows = nrows(logits), V = logits.ne[0];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const long long y = checked_label(labels, r, ignore, V, Op::CrossEntropy, err, threadIdx.x == 0);
    if (y < 0) {  // uniform across the block
      if (threadIdx.x == 0) loss[r] = valid[r] = 0.0f;
      continue;
    }
    const char* xp = row_at(logits, r);
    MaxSum ms{-INFINITY, 0.0f};
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x)
      ms = maxsum_add(ms, load_f(xp + j * logits.nb[0], logits.dtype));
    ms = block_maxsum(ms, sh);
    if (threadIdx.x == 0) {
      // Written so the large max cancels before it meets the small log-sum.
      loss[r] = (ms.m - load_f(xp + y * logits.nb[0], logits.dtype)) + logf(ms.s);
      valid[r] = 1.0f;
    }
  }
}

// One block: the mean of the valid rows' losses (0 when none is valid).
__global__ __launch_bounds__(1024) void ce_mean_kernel(TDesc out, const float* loss, const float* valid,
                                                       int64_t rows) {
  __shared__ double sh[32];
  double s = 0.0, c = 0.0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    s += double(loss[r]);
    c += double(valid[r]);
  }
  s = block_reduce(s, SumOp{}, 0.0, sh);
  c = block_reduce(c, SumOp{}, 0.0, sh);
  if (threadIdx.x == 0) store_f(out.data, out.dtype, c > 0.0 ? float(s / c) : 0.0f);
}

// One block: coef = grad / (number of valid rows), or 0 when none is valid.
__global__ __launch_bounds__(1024) void ce_coef_kernel(TDesc labels, TDesc grad, long long ignore, int64_t V,
                                                       int64_t rows, DeviceError* err, float* coef) {
  __shared__ double sh[32];
  double c = 0.0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x)
    c += checked_label(labels, r, ignore, V, Op::CrossEntropyBack, err, true) >= 0 ? 1.0 : 0.0;
  c = block_reduce(c, SumOp{}, 0.0, sh);
  if (threadIdx.x == 0) *coef = c > 0.0 ? float(double(load_f(grad.data, grad.dtype)) / c) : 0.0f;
}

// d/dlogits = (softmax(row) - onehot(label)) * coef for valid rows, 0 for ignored (or bad) ones.
__global__ __launch_bounds__(1024) void ce_back_kernel(TDesc out, TDesc logits, TDesc labels,
                                                       long long ignore, const float* coef_p) {
  __shared__ MaxSum sh[32];
  const int64_t rows = nrows(logits), V = logits.ne[0];
  const float coef = *coef_p;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const long long y = checked_label(labels, r, ignore, V, Op::CrossEntropyBack, nullptr, false);
    char* op = row_at(out, r);
    if (y < 0) {
      for (int64_t j = threadIdx.x; j < V; j += blockDim.x) store_f(op + j * out.nb[0], out.dtype, 0.0f);
      continue;
    }
    const char* xp = row_at(logits, r);
    MaxSum ms{-INFINITY, 0.0f};
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x)
      ms = maxsum_add(ms, load_f(xp + j * logits.nb[0], logits.dtype));
    ms = block_maxsum(ms, sh);
    const float lse = logf(ms.s);
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
      float v = expf(load_f(xp + j * logits.nb[0], logits.dtype) - ms.m - lse) * coef;
      if (j == y) v -= coef;
      store_f(op + j * out.nb[0], out.dtype, v);
    }
  }
}

void check_ce(const Tensor* t, const Tensor* logits, const Tensor* labels) {
  bool match = is_float(logits->dtype) && is_int(labels->dtype) && labels->ne[3] == 1;
  for (int d = 0; d < kMaxDims - 1; ++d) match &= labels->ne[d] == logits->ne[d + 1];
  RT_CHECK(match, "cuda ", op_name(t->op), ": unexpected logits ", logits->describe(), " and labels ",
           labels->describe());
}

void cross_entropy_l(CudaExec& ex, Tensor* t) {
  const Tensor* logits = t->src[0];
  const Tensor* labels = t->src[1];
  check_ce(t, logits, labels);
  const int64_t rows = logits->nrows();
  auto buf = ex.temp(sizeof(float) * size_t(rows) * 2);
  float* loss = buf->as<float>();
  float* valid = loss + rows;
  ce_rows_kernel<<<row_grid(rows), row_block(logits->ne[0]), 0, ex.stream>>>(
      desc(logits), desc(labels), t->ip[0], ex.dev_error, loss, valid);
  RT_CUDA_LAUNCH_CHECK("ce_rows_kernel");
  ce_mean_kernel<<<1, 1024, 0, ex.stream>>>(desc(t), loss, valid, rows);
  RT_CUDA_LAUNCH_CHECK("ce_mean_kernel");
}

void cross_entropy_back_l(CudaExec& ex, Tensor* t) {
  const Tensor* logits = t->src[0];
  const Tensor* labels = t->src[1];
  const Tensor* grad = t->src[2];
  check_ce(t, logits, labels);
  RT_CHECK(same_shape(t, logits) && grad->nelements() == 1, "cuda cross_entropy_back: unexpected gradient ",
           grad->describe(), " or result ", t->describe(), " for logits ", logits->describe());
  const int64_t rows = logits->nrows();
  auto coef = ex.temp(sizeof(float));
  ce_coef_kernel<<<1, 1024, 0, ex.stream>>>(desc(labels), desc(grad), t->ip[0], logits->ne[0], rows,
                                            ex.dev_error, coef->as<float>());
  RT_CUDA_LAUNCH_CHECK("ce_coef_kernel");
  ce_back_kernel<<<row_grid(rows), row_block(logits->ne[0]), 0, ex.stream>>>(
      desc(t), desc(logits), desc(labels), t->ip[0], coef->as<float>());
  RT_CUDA_LAUNCH_CHECK("ce_back_kernel");
}

}  // namespace

void register_cuda_loss_ops(CudaOpTable& t) {
  t[size_t(Op::CrossEntropy)] = cross_entropy_l;
  t[size_t(Op::CrossEntropyBack)] = cross_entropy_back_l;
}

}  // namespace retort::cuda
