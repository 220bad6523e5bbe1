// Structural ops on the device: contiguous copy / cast, fill, in-place accumulate, concat, slice_back.
// One thread per output element (grid-stride); any dtype and any strides on every side.
#include "cuda_common.cuh"
#include "loss/row_common.cuh"

namespace retort::cuda {

namespace {

__global__ void cont_float_kernel(TDesc out, TDesc x, int64_t n) {
  RT_GRID_LOOP(i, n) {
    int64_t c[4];
    unravel(i, out.ne, c);
    store_f(at(out, c), out.dtype, load_f(at(x, c), x.dtype));
  }
}

// Both sides dense (row-major, no gaps): a flat loop, four elements per thread, the dtypes known at compile
// time. The strided kernel's index arithmetic and dtype branches cost several times the bandwidth on the
// large casts a gradient makes (an lm-head's f32 accumulator to bf16).
template <typename TO, typename TI>
__global__ void dense_copy_kernel(TO* __restrict__ out, const TI* __restrict__ x, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x * 4;
  for (int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 4; i < n; i += stride) {
    if (i + 4 <= n) {
      float v[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) v[k] = rowk::to_f(x[i + k]);
#pragma unroll
      for (int k = 0; k < 4; ++k) out[i + k] = rowk::from_f<TO>(v[k]);
    } else {
      for (int64_t k = i; k < n; ++k) out[k] = rowk::from_f<TO>(rowk::to_f(x[k]));
    }
  }
}

// acc += g, both dense.
template <typename TA, typename TG>
__global__ void dense_accumulate_kernel(TA* __restrict__ acc, const TG* __restrict__ g, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x * 4;
  for (int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 4; i < n; i += stride) {
    const int64_t e = i + 4 <= n ? i + 4 : n;
    for (int64_t k = i; k < e; ++k) acc[k] = rowk::from_f<TA>(rowk::to_f(acc[k]) + rowk::to_f(g[k]));
  }
}

bool dense(const TDesc& d) {
  int64_t want = int64_t(dtype_size(d.dtype));
  for (int i = 0; i < 4; ++i) {
    if (d.ne[i] != 1 && d.nb[i] != want) return false;
    want *= d.ne[i];
  }
  return true;
}

// Calls f.template operator()<T>() with the C++ type of a float dtype.
template <typename F>
void with_float_type(DType t, F&& f) {
  switch (t) {
    case DType::BF16:
      f.template operator()<__nv_bfloat16>();
      break;
    case DType::F16:
      f.template operator()<__half>();
      break;
    default:
      f.template operator()<float>();
      break;
  }
}

// Integer copies go through int64 so large ids are exact (a float would round them).
__global__ void cont_int_kernel(TDesc out, TDesc x, int64_t n) {
  RT_GRID_LOOP(i, n) {
    int64_t c[4];
    unravel(i, out.ne, c);
    long long v = load_i(at(x, c), x.dtype);
    char* p = at(out, c);
    if (out.dtype == DType::I32)
      *reinterpret_cast<int32_t*>(p) = int32_t(v);
    else
      *reinterpret_cast<long long*>(p) = v;
  }
}

__global__ void fill_kernel(TDesc out, int64_t n, float value) {
  RT_GRID_LOOP(i, n) {
    int64_t c[4];
    unravel(i, out.ne, c);
    store_f(at(out, c), out.dtype, value);
  }
}

__global__ void accumulate_kernel(TDesc acc, TDesc g, int64_t n) {
  RT_GRID_LOOP(i, n) {
    int64_t c[4];
    unravel(i, acc.ne, c);
    char* p = at(acc, c);
    store_f(p, acc.dtype, load_f(p, acc.dtype) + load_f(at(g, c), g.dtype));
  }
}

// Output element o reads a at o, or b at o shifted back by a's extent along dim.
__device__ __forceinline__ const char* concat_src(const TDesc& a, const TDesc& b, int dim, const int64_t o[4],
                                                  DType* dt) {
  int64_t c[4] = {o[0], o[1], o[2], o[3]};
  if (c[dim] < a.ne[dim]) {
    *dt = a.dtype;
    return at(a, c);
  }
  c[dim] -= a.ne[dim];
  *dt = b.dtype;
  return at(b, c);
}

__global__ void concat_kernel(TDesc out, TDesc a, TDesc b, int dim, int64_t n) {
  RT_GRID_LOOP(i, n) {
    int64_t o[4];
    unravel(i, out.ne, o);
    DType dt;
    const char* p = concat_src(a, b, dim, o, &dt);
    store_f(at(out, o), out.dtype, load_f(p, dt));
  }
}

__global__ void concat_int_kernel(TDesc out, TDesc a, TDesc b, int dim, int64_t n) {
  RT_GRID_LOOP(i, n) {
    int64_t o[4];
    unravel(i, out.ne, o);
    DType dt;
    long long v = load_i(concat_src(a, b, dim, o, &dt), dt);
    char* p = at(out, o);
    if (out.dtype == DType::I32)
      *reinterpret_cast<int32_t*>(p) = int32_t(v);
    else
      *reinterpret_cast<long long*>(p) = v;
  }
}

// out is shaped like the sliced tensor: g inside the window [start, start + g.ne[dim]) of dim, zero
// elsewhere.
__global__ void slice_back_kernel(TDesc out, TDesc g, int dim, int64_t start, int64_t n) {
  RT_GRID_LOOP(i, n) {
    int64_t c[4];
    unravel(i, out.ne, c);
    char* p = at(out, c);
    float v = 0.0f;
    int64_t k = c[dim] - start;
    if (k >= 0 && k < g.ne[dim]) {
      c[dim] = k;
      v = load_f(at(g, c), g.dtype);
    }
    store_f(p, out.dtype, v);
  }
}

void launch_cont(CudaExec& ex, Tensor* t) {
  const Tensor* x = t->src[0];
  RT_CHECK(is_int(x->dtype) == is_int(t->dtype) && same_shape(x, t), "contiguous: cannot convert ",
           x->describe(), " to ", t->describe(), " on CUDA (float and integer tensors do not mix)");
  copy_elements(ex, desc(t), desc(x));
}

void launch_fill(CudaExec& ex, Tensor* t) {
  int64_t n = t->nelements();
  fill_kernel<<<ex.grid_for(n, kBlock), kBlock, 0, ex.stream>>>(desc(t), n, t->fp[0]);
  RT_CUDA_LAUNCH_CHECK("fill_kernel");
}

void launch_accumulate(CudaExec& ex, Tensor* t) {
  Tensor* acc = t->src[0];
  const Tensor* g = t->src[1];
  RT_CHECK(is_float(acc->dtype) && is_float(g->dtype) && same_shape(acc, g), "accumulate: cannot add ",
           g->describe(), " into ", acc->describe());
  int64_t n = acc->nelements();
  const TDesc a = desc(acc), gd = desc(g);
  if (dense(a) && dense(gd)) {
    with_float_type(a.dtype, [&]<typename TA>() {
      with_float_type(gd.dtype, [&]<typename TG>() {
        dense_accumulate_kernel<TA, TG><<<ex.grid_for((n + 3) / 4, kBlock), kBlock, 0, ex.stream>>>(
            reinterpret_cast<TA*>(a.data), reinterpret_cast<const TG*>(gd.data), n);
      });
    });
    RT_CUDA_LAUNCH_CHECK("dense_accumulate_kernel");
    return;
  }
  accumulate_kernel<<<ex.grid_for(n, kBlock), kBlock, 0, ex.stream>>>(desc(acc), desc(g), n);
  RT_CUDA_LAUNCH_CHECK("accumulate_kernel");
}

void launch_concat(CudaExec& ex, Tensor* t) {
  int64_t n = t->nelements();
  int dim = int(t->ip[0]);
  if (is_int(t->dtype)) {
    concat_int_kernel<<<ex.grid_for(n, kBlock), kBlock, 0, ex.stream>>>(desc(t), desc(t->src[0]),
                                                                        desc(t->src[1]), dim, n);
    RT_CUDA_LAUNCH_CHECK("concat_int_kernel");
    return;
  }
  concat_kernel<<<ex.grid_for(n, kBlock), kBlock, 0, ex.stream>>>(desc(t), desc(t->src[0]), desc(t->src[1]),
                                                                  dim, n);
  RT_CUDA_LAUNCH_CHECK("concat_kernel");
}

void launch_slice_back(CudaExec& ex, Tensor* t) {
  int64_t n = t->nelements();
  slice_back_kernel<<<ex.grid_for(n, kBlock), kBlock, 0, ex.stream>>>(desc(t), desc(t->src[0]), int(t->ip[0]),
                                                                      t->ip[1], n);
  RT_CUDA_LAUNCH_CHECK("slice_back_kernel");
}

}  // namespace

void accumulate_dense_f32(CudaExec& ex, float* acc, const float* g, int64_t n) {
  dense_accumulate_kernel<float, float><<<ex.grid_for((n + 3) / 4, kBlock), kBlock, 0, ex.stream>>>(acc, g, n);
  RT_CUDA_LAUNCH_CHECK("dense_accumulate_kernel");
}

void copy_elements(CudaExec& ex, const TDesc& out, const TDesc& src) {
  int64_t n = out.ne[0] * out.ne[1] * out.ne[2] * out.ne[3];
  if (is_int(out.dtype)) {
    cont_int_kernel<<<ex.grid_for(n, kBlock), kBlock, 0, ex.stream>>>(out, src, n);
    RT_CUDA_LAUNCH_CHECK("cont_int_kernel");
    return;
  }
  if (dense(out) && dense(src)) {
    with_float_type(out.dtype, [&]<typename TO>() {
      with_float_type(src.dtype, [&]<typename TI>() {
        dense_copy_kernel<TO, TI><<<ex.grid_for((n + 3) / 4, kBlock), kBlock, 0, ex.stream>>>(
            reinterpret_cast<TO*>(out.data), reinterpret_cast<const TI*>(src.data), n);
      });
    });
    RT_CUDA_LAUNCH_CHECK("dense_copy_kernel");
    return;
  }
  cont_float_kernel<<<ex.grid_for(n, kBlock), kBlock, 0, ex.stream>>>(out, src, n);
  RT_CUDA_LAUNCH_CHECK("cont_float_kernel");
}

void register_cuda_view_ops(CudaOpTable& t) {
  t[size_t(Op::Cont)] = launch_cont;
  t[size_t(Op::Fill)] = launch_fill;
  t[size_t(Op::Accumulate)] = launch_accumulate;
  t[size_t(Op::Concat)] = launch_concat;
  t[size_t(Op::SliceBack)] = launch_slice_back;
}

}  // namespace retort::cuda
