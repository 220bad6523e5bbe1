// get_rows and its gradient get_rows_back on the device.
//
// Shapes: out [.., N, D] takes, for output row r (dims 1..3), the table row ids[r] (ids read in logical
// order, so ids [N] or [B, T] both work); a table with batch dims 2, 3 contributes its batch (i2, i3) (ggml's
// rule).
//
// get_rows_back is deterministic without float atomics: the (output row, position) pairs are sorted by output
// row with a stable radix sort (CUB), so each output row's contributions form one segment in ascending
// position order; one block owns each segment and sums it in that order, writing its row exactly once. The
// result is bitwise reproducible run to run, and the order of summation is the order of the ids, like the
// CPU.
//
// Ids outside [0, R) are recorded in the device error record (reported at the next synchronize or read); the
// row reads as zero in get_rows and is dropped in get_rows_back.
#include <cub/device/device_radix_sort.cuh>

#include "cuda_common.cuh"

namespace retort::cuda {

namespace {

__device__ __forceinline__ long long id_at(const TDesc& ids, int64_t r) {
  int64_t c[4];
  unravel(r, ids.ne, c);
  return load_i(at(ids, c), ids.dtype);
}

__global__ void get_rows_kernel(TDesc out, TDesc table, TDesc ids, DeviceError* err, int64_t n) {
  const int64_t R = table.ne[1];
  RT_GRID_LOOP(i, n) {
    int64_t c[4];
    unravel(i, out.ne, c);
    const int64_t r = c[1] + out.ne[1] * (c[2] + out.ne[2] * c[3]);
    const long long id = id_at(ids, r);
    float v = 0.0f;
    if (id < 0 || id >= R) {
      if (c[0] == 0) report_error(err, Op::GetRows, kErrIdOutOfRange, id, R);
    } else {
      const char* p = table.data + c[0] * table.nb[0] + id * table.nb[1] +
                      (table.ne[2] == 1 ? 0 : c[2] * table.nb[2]) +
                      (table.ne[3] == 1 ? 0 : c[3] * table.nb[3]);
      v = load_f(p, table.dtype);
    }
    store_f(at(out, c), out.dtype, v);
  }
}

// Key of gradient row k: the output row it adds into, or `sentinel` (sorted last, skipped) for a bad id.
__global__ void row_keys_kernel(TDesc out, TDesc grad, TDesc ids, DeviceError* err, uint32_t sentinel,
                                uint32_t* keys, int32_t* pos, int64_t n) {
  const int64_t R = out.ne[1];
  RT_GRID_LOOP(k, n) {
    const long long id = id_at(ids, k);
    const int64_t k2 = (k / grad.ne[1]) % grad.ne[2], k3 = k / (grad.ne[1] * grad.ne[2]);
    uint32_t key = sentinel;
    if (id < 0 || id >= R) {
      report_error(err, Op::GetRowsBack, kErrIdOutOfRange, id, R);
    } else {
      key = uint32_t(id + R * ((out.ne[2] == 1 ? 0 : k2) + out.ne[2] * (out.ne[3] == 1 ? 0 : k3)));
    }
    keys[k] = key;
    pos[k] = int32_t(k);
  }
}

// One block per segment of equal keys: sums the gradient rows of the segment in ascending position order,
// then adds the row's old value when `add` (the result holds the addend already).
__global__ __launch_bounds__(1024) void segment_sum_kernel(TDesc out, TDesc grad, const uint32_t* keys,
                                                           const int32_t* pos, uint32_t sentinel, int64_t n,
                                                           bool add) {
  const int64_t D = out.ne[0];
  for (int64_t b = blockIdx.x; b < n; b += gridDim.x) {
    const uint32_t key = keys[b];
    if (key == sentinel || (b > 0 && keys[b - 1] == key)) continue;  // not the start of a real segment
    char* orow = row_at(out, int64_t(key));
    for (int64_t c = threadIdx.x; c < D; c += blockDim.x) {
      float acc = 0.0f;
      for (int64_t j = b; j < n && keys[j] == key; ++j)
        acc += load_f(row_at(grad, pos[j]) + c * grad.nb[0], grad.dtype);
      if (add) acc = load_f(orow + c * out.nb[0], out.dtype) + acc;
      store_f(orow + c * out.nb[0], out.dtype, acc);
    }
  }
}

void get_rows_l(CudaExec& ex, Tensor* t) {
  const Tensor* table = t->src[0];
  const Tensor* ids = t->src[1];
  RT_CHECK(is_int(ids->dtype) && ids->nelements() == t->nrows() && table->ne[0] == t->ne[0],
           "cuda get_rows: ids ", ids->describe(), " and table ", table->describe(), " do not give ",
           t->describe());
  const int64_t n = t->nelements();
  get_rows_kernel<<<ex.grid_for(n, kBlock), kBlock, 0, ex.stream>>>(desc(t), desc(table), desc(ids),
                                                                    ex.dev_error, n);
  RT_CUDA_LAUNCH_CHECK("get_rows_kernel");
}

void get_rows_back_l(CudaExec& ex, Tensor* t) {
  const Tensor* grad = t->src[0];
  const Tensor* ids = t->src[1];
  const int64_t n = grad->nrows();
  RT_CHECK(is_int(ids->dtype) && ids->nelements() == n && grad->ne[0] == t->ne[0], "cuda get_rows_back: ids ",
           ids->describe(), " and gradient ", grad->describe(), " do not give ", t->describe());
  RT_CHECK(t->is_contiguous(), "cuda get_rows_back: the result ", t->describe(), " must be contiguous");
  const int64_t total = t->nrows();
  RT_CHECK(total < 0xffffffffLL && n < 0x7fffffffLL, "cuda get_rows_back: ", t->describe(), " with ", n,
           " ids is too large");
  const uint32_t sentinel = uint32_t(total);
  int end_bit = 0;
  while (end_bit < 32 && (uint64_t(1) << end_bit) <= uint64_t(sentinel)) ++end_bit;

  // Graph::backward's addend (the rest of a gradient sum, possibly the result's own storage: an accumulator;
  // none in a run that starts the accumulator: kFresh) is the result's starting value; without one, rows
  // that no id names stay zero.
  const Tensor* addend = t->src[2] && !t->has(kFresh) ? t->src[2] : nullptr;
  RT_CHECK(!addend || (t->dtype == DType::F32 && addend->dtype == DType::F32 && addend->is_contiguous() &&
                       same_shape(addend, t)),
           "cuda get_rows_back: the addend ", addend ? addend->describe() : std::string(), " does not fit ",
           t->describe());
  if (!addend)
    RT_CUDA_CHECK(cudaMemsetAsync(t->data, 0, t->nbytes(), ex.stream));
  else if (addend->data != t->data)
    RT_CUDA_CHECK(cudaMemcpyAsync(t->data, addend->data, t->nbytes(), cudaMemcpyDeviceToDevice, ex.stream));

  auto keys = ex.temp(sizeof(uint32_t) * size_t(n) * 2);
  auto pos = ex.temp(sizeof(int32_t) * size_t(n) * 2);
  uint32_t* keys_in = keys->as<uint32_t>();
  uint32_t* keys_out = keys_in + n;
  int32_t* pos_in = pos->as<int32_t>();
  int32_t* pos_out = pos_in + n;
  row_keys_kernel<<<ex.grid_for(n, kBlock), kBlock, 0, ex.stream>>>(
      desc(t), desc(grad), desc(ids), ex.dev_error, sentinel, keys_in, pos_in, n);
  RT_CUDA_LAUNCH_CHECK("row_keys_kernel");

  size_t temp_bytes = 0;
  RT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, keys_out, pos_in, pos_out,
                                                int(n), 0, end_bit, ex.stream));
  auto temp = ex.temp(temp_bytes);
  RT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp->data(), temp_bytes, keys_in, keys_out, pos_in, pos_out,
                                                int(n), 0, end_bit, ex.stream));

  const int block = row_block(t->ne[0]);
  segment_sum_kernel<<<row_grid(n), block, 0, ex.stream>>>(desc(t), desc(grad), keys_out, pos_out, sentinel, n,
                                                           addend != nullptr);
  RT_CUDA_LAUNCH_CHECK("segment_sum_kernel");
}

}  // namespace

void register_cuda_get_rows_ops(CudaOpTable& t) {
  t[size_t(Op::GetRows)] = get_rows_l;
  t[size_t(Op::GetRowsBack)] = get_rows_back_l;
}

}  // namespace retort::cuda
