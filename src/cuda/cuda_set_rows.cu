// set_rows on the device: the rows of src [.., n, D] written into dst [.., R, D] (the node aliases dst) at
// the run-time ids rows [n] (or [B3, B2, n], broadcast over src's batch dims), converted to dst's dtype.
//
// One thread per source element, so a decode step's few rows still spread over many threads. Ids outside
// [0, R) are recorded in the device error record (reported at the next synchronize or read) and their rows
// are skipped; the rows with good ids are written.
#include "cuda_common.cuh"

namespace retort::cuda {

namespace {

__global__ void set_rows_kernel(TDesc dst, TDesc src, TDesc ids, DeviceError* err, int64_t n) {
  const int64_t R = dst.ne[1];
  RT_GRID_LOOP(i, n) {
    int64_t c[4];
    unravel(i, src.ne, c);
    const char* idp = ids.data + c[1] * ids.nb[0] + (ids.ne[1] == 1 ? 0 : c[2] * ids.nb[1]) +
                      (ids.ne[2] == 1 ? 0 : c[3] * ids.nb[2]);
    const long long id = load_i(idp, ids.dtype);
    if (id < 0 || id >= R) {
      if (c[0] == 0) report_error(err, Op::SetRows, kErrIdOutOfRange, id, R);
      continue;
    }
    char* out = dst.data + c[0] * dst.nb[0] + id * dst.nb[1] + c[2] * dst.nb[2] + c[3] * dst.nb[3];
    store_f(out, dst.dtype, load_f(at(src, c), src.dtype));
  }
}

void set_rows_l(CudaExec& ex, Tensor* t) {
  const Tensor* src = t->src[1];
  const Tensor* ids = t->src[2];
  RT_CHECK(t->data == t->src[0]->data, "cuda set_rows: the node ", t->describe(),
           " must alias its destination ", t->src[0]->describe());
  RT_CHECK(is_float(t->dtype) && is_float(src->dtype) && is_int(ids->dtype) && src->ne[0] == t->ne[0] &&
               src->ne[2] == t->ne[2] && src->ne[3] == t->ne[3] && ids->ne[0] == src->ne[1],
           "cuda set_rows: src ", src->describe(), " and rows ", ids->describe(), " do not fit dst ",
           t->describe());
  const int64_t n = src->nelements();
  set_rows_kernel<<<ex.grid_for(n, kBlock), kBlock, 0, ex.stream>>>(desc(t), desc(src), desc(ids),
                                                                    ex.dev_error, n);
  RT_CUDA_LAUNCH_CHECK("set_rows_kernel");
}

}  // namespace

void register_cuda_set_rows_ops(CudaOpTable& t) {
  t[size_t(Op::SetRows)] = set_rows_l;
}

}  // namespace retort::cuda
