// Elementwise helpers, validation and layout copies of the CUDA ChunkExecutor (see cuda_chunk_kernels.h).
// Kernels read every block through its byte strides and dtype (load_f / load_i of cuda_common.cuh), so any
// layout the scheduler passes works; the large blocks (chunk logits, dW) are dense and read coalesced.
#include <algorithm>

#include "../cuda_common.cuh"
#include "cuda_chunk_kernels.h"
#include "fused_device.cuh"

namespace retort::cuda::fused {

namespace {

// A 2-D launch for [rows, cols] work: x over columns, y over rows, both grid-stride.
dim3 grid_2d(int64_t rows, int64_t cols) {
  const int64_t gx = std::min<int64_t>((cols + kBlock - 1) / kBlock, 1024);
  const int64_t gy = std::min<int64_t>(rows, 65535);
  return dim3(unsigned(std::max<int64_t>(gx, 1)), unsigned(std::max<int64_t>(gy, 1)));
}

#define RT_LOOP_2D(r, j, rows, cols)                                             \
  for (int64_t r = blockIdx.y; r < (rows); r += gridDim.y)                       \
    for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < (cols); \
         j += int64_t(gridDim.x) * blockDim.x)

// c f32, or the 16-bit logits block (the sum in f32, rounded once on the store).
__global__ void add_bias_kernel(BD c, BD bias) {
  RT_LOOP_2D(r, j, c.rows, c.cols) {
    char* p = el(c, r, j);
    const float b = load_f(el(bias, 0, j), bias.dtype);
    if (c.dtype == DType::F32)
      *reinterpret_cast<float*>(p) += b;
    else
      store_f(p, c.dtype, load_f(p, c.dtype) + b);
  }
}

__global__ void scale_rows_kernel(BD g, BD u) {
  RT_LOOP_2D(r, j, g.rows, g.cols) {
    const float s = load_f(el(u, r, 0), u.dtype);
    char* p = el(g, r, j);
    store_f(p, g.dtype, load_f(p, g.dtype) * s);
  }
}

__global__ void zero_kernel(BD b) {
  RT_LOOP_2D(r, j, b.rows, b.cols) {
    store_f(el(b, r, j), b.dtype, 0.0f);
  }
}

// One thread per column, down the rows in order, in double (as the CPU executor): the result does not depend
// on the grid. Eight loads are issued before they are added (in order) so that a thread has several
// requests in flight.
__global__ void column_sums_kernel(BD g, BD out, bool accumulate) {
  for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < g.cols;
       j += int64_t(gridDim.x) * blockDim.x) {
    double s = 0.0;
    int64_t r = 0;
    for (; r + 8 <= g.rows; r += 8) {
      float v[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = load_f(el(g, r + i, j), g.dtype);
#pragma unroll
      for (int i = 0; i < 8; ++i) s += double(v[i]);
    }
    for (; r < g.rows; ++r) s += double(load_f(el(g, r, j), g.dtype));
    float* o = reinterpret_cast<float*>(el(out, 0, j));
    *o = float((accumulate ? double(*o) : 0.0) + s);
  }
}

// Labels: the range check over every row (grid-stride), and with inv set (one block) the count of the rows
// that are not ignore_index, summed in a fixed order.
__global__ void check_labels_kernel(BD labels, long long ignore, int64_t v, DeviceError* err, Op op,
                                    float* inv) {
  __shared__ double sh[32];
  double count = 0.0;
  RT_GRID_LOOP(r, labels.rows) {
    const long long y = load_i(el(labels, r, 0), labels.dtype);
    if (y == ignore) continue;
    count += 1.0;
    if (y < 0 || y >= v) report_error(err, op, kErrLabelOutOfRange, y, v);
  }
  if (!inv) return;
  count = block_reduce(count, SumOp{}, 0.0, sh);
  if (threadIdx.x == 0) *inv = float(1.0 / (count > 1.0 ? count : 1.0));
}

__global__ void check_ids_kernel(BD ids, BD logprobs, BD mask, bool slots, int64_t v, DeviceError* err,
                                 Op op) {
  const int64_t k = ids.cols;
  RT_GRID_LOOP(i, ids.rows * k) {
    const int64_t r = i / k, s = i % k;
    if (slots) {
      if (!slot_on(logprobs, mask, r, s)) continue;
      // Every path of the chunk loop (the K-sparse ones too) relies on this check for NaN and +inf.
      if (!(load_f(el(logprobs, r, s), logprobs.dtype) < INFINITY)) {
        report_error(err, op, kErrTeacherLogprob, r, s);
        continue;
      }
    }
    const long long id = load_i(el(ids, r, s), ids.dtype);
    if (id < 0 || id >= v) report_error(err, op, kErrIdOutOfRange, id, v);
  }
}

__global__ void copy_block_kernel(BD src, DType dt, char* out) {
  const int64_t cols = src.cols, es = dtype_size_dev(dt);
  const bool ints = src.dtype == DType::I32 || src.dtype == DType::I64;
  RT_GRID_LOOP(i, src.rows * cols) {
    const char* p = el(src, i / cols, i % cols);
    char* q = out + i * es;
    if (!ints)
      store_f(q, dt, load_f(p, src.dtype));
    else if (dt == DType::I64)
      *reinterpret_cast<long long*>(q) = load_i(p, src.dtype);
    else
      *reinterpret_cast<int32_t*>(q) = int32_t(load_i(p, src.dtype));
  }
}

__global__ void copy_labels_kernel(BD labels, long long ignore, bool remap, long long* out) {
  RT_GRID_LOOP(r, labels.rows) {
    const long long y = load_i(el(labels, r, 0), labels.dtype);
    out[r] = remap ? (y == ignore ? -1 : 0) : y;
  }
}

__global__ void gather_logprobs_kernel(const float* z, int64_t ld, int64_t rows, const long long* ids,
                                       int64_t k, const float* lse, float* lp) {
  RT_GRID_LOOP(i, rows * k) {
    const int64_t r = i / k;
    lp[i] = z[r * ld + ids[i]] - lse[r];
  }
}

}  // namespace

void add_bias(CudaExec& ex, const Block& c, const Block& bias) {
  if (c.rows == 0) return;
  add_bias_kernel<<<grid_2d(c.rows, c.cols), kBlock, 0, ex.stream>>>(bd(c), bd(bias));
  RT_CUDA_LAUNCH_CHECK("add_bias_kernel");
}

void column_sums(CudaExec& ex, const Block& g, const Block& dbias, bool accumulate) {
  column_sums_kernel<<<ex.grid_for(g.cols, kBlock), kBlock, 0, ex.stream>>>(bd(g), bd(dbias), accumulate);
  RT_CUDA_LAUNCH_CHECK("column_sums_kernel");
}

void scale_rows(CudaExec& ex, const Block& g, const Block& u) {
  if (g.rows == 0) return;
  scale_rows_kernel<<<grid_2d(g.rows, g.cols), kBlock, 0, ex.stream>>>(bd(g), bd(u));
  RT_CUDA_LAUNCH_CHECK("scale_rows_kernel");
}

void zero(CudaExec& ex, const Block& b) {
  if (b.rows == 0 || b.cols == 0) return;
  RT_ASSERT(is_float(b.dtype));
  const size_t es = dtype_size(b.dtype), width = size_t(b.cols) * es;  // float zero is all zero bits
  if (b.col_stride == es && (b.rows == 1 || b.row_stride >= width)) {
    const size_t pitch = b.rows == 1 ? width : b.row_stride;
    RT_CUDA_CHECK(cudaMemset2DAsync(b.data, pitch, 0, width, size_t(b.rows), ex.stream));
    return;
  }
  zero_kernel<<<grid_2d(b.rows, b.cols), kBlock, 0, ex.stream>>>(bd(b));
  RT_CUDA_LAUNCH_CHECK("zero_kernel");
}

void check_labels(CudaExec& ex, const Block& labels, int64_t ignore, int64_t v, Op op, float* inv_count) {
  RT_CHECK(is_int(labels.dtype), op_name(op), ": labels must be i32 or i64, got ", dtype_name(labels.dtype));
  const int grid = inv_count ? 1 : ex.grid_for(labels.rows, kBlock);
  const int block = inv_count ? 1024 : kBlock;
  check_labels_kernel<<<grid, block, 0, ex.stream>>>(bd(labels), ignore, v, ex.dev_error, op, inv_count);
  RT_CUDA_LAUNCH_CHECK("check_labels_kernel");
}

void check_ids(CudaExec& ex, const Block& ids, const loss::TopKSide* slots, int64_t v, Op op) {
  RT_CHECK(is_int(ids.dtype), op_name(op), ": ids must be i32 or i64, got ", dtype_name(ids.dtype));
  const int64_t n = ids.rows * ids.cols;
  if (n == 0) return;
  check_ids_kernel<<<ex.grid_for(n, kBlock), kBlock, 0, ex.stream>>>(
      bd(ids), slots ? bd(slots->logprobs) : BD{}, slots ? bd(slots->mask) : BD{}, slots != nullptr, v,
      ex.dev_error, op);
  RT_CUDA_LAUNCH_CHECK("check_ids_kernel");
}

void copy_block(CudaExec& ex, const Block& src, DType dt, void* out) {
  RT_ASSERT(is_int(src.dtype) == is_int(dt) && (!is_int(dt) || dt == DType::I32 || dt == DType::I64));
  const int64_t n = src.rows * src.cols;
  if (n == 0) return;
  copy_block_kernel<<<ex.grid_for(n, kBlock), kBlock, 0, ex.stream>>>(bd(src), dt, static_cast<char*>(out));
  RT_CUDA_LAUNCH_CHECK("copy_block_kernel");
}

void copy_labels(CudaExec& ex, const Block& labels, int64_t ignore, bool remap, int64_t* out) {
  RT_CHECK(is_int(labels.dtype), "labels must be i32 or i64, got ", dtype_name(labels.dtype));
  if (labels.rows == 0) return;
  copy_labels_kernel<<<ex.grid_for(labels.rows, kBlock), kBlock, 0, ex.stream>>>(
      bd(labels), ignore, remap, reinterpret_cast<long long*>(out));
  RT_CUDA_LAUNCH_CHECK("copy_labels_kernel");
}

void gather_logprobs(CudaExec& ex, const float* z, int64_t ld, int64_t rows, const int64_t* ids, int64_t k,
                     const float* lse, float* lp) {
  if (rows * k == 0) return;
  gather_logprobs_kernel<<<ex.grid_for(rows * k, kBlock), kBlock, 0, ex.stream>>>(
      z, ld, rows, reinterpret_cast<const long long*>(ids), k, lse, lp);
  RT_CUDA_LAUNCH_CHECK("gather_logprobs_kernel");
}

}  // namespace retort::cuda::fused
