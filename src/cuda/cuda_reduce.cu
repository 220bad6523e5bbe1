// Reductions on the device: over rows (one block per row), over everything (a fixed two-stage tree), repeat,
// reduce_to and max_back. All sums accumulate in f32 with a fixed reduction tree: the grid of the
// whole-tensor reductions depends only on the element count, never on the device, so results are bitwise
// reproducible.
#include <climits>

#include "cuda_common.cuh"

namespace retort::cuda {

namespace {

enum ReduceKind : int { kSum = 0, kMean = 1, kMax = 2 };

__device__ __forceinline__ float reduce_step(int kind, float acc, float v) {
  return kind == kMax ? fmaxf(acc, v) : acc + v;
}

__device__ __forceinline__ float block_finish(int kind, float acc, float* sh) {
  return kind == kMax ? block_reduce(acc, MaxOp{}, -INFINITY, sh) : block_reduce(acc, SumOp{}, 0.0f, sh);
}

// One block per row of x; out has one element per row.
__global__ __launch_bounds__(1024) void row_reduce_kernel(TDesc out, TDesc x, int kind) {
  __shared__ float sh[32];
  const int64_t rows = nrows(x), n = x.ne[0];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const char* p = row_at(x, r);
    float acc = kind == kMax ? -INFINITY : 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
      acc = reduce_step(kind, acc, load_f(p + i * x.nb[0], x.dtype));
    float res = block_finish(kind, acc, sh);
    if (kind == kMean) res /= float(n);
    if (threadIdx.x == 0) store_f(row_at(out, r), out.dtype, res);
  }
}

// Stage 1 of a whole-tensor reduction: block b reduces a grid-stride share of the elements into part[b].
__global__ void all_reduce_stage1(TDesc x, int kind, float* part) {
  __shared__ float sh[32];
  const int64_t n = nelem(x);
  float acc = kind == kMax ? -INFINITY : 0.0f;
  RT_GRID_LOOP(i, n) {
    int64_t c[4];
    unravel(i, x.ne, c);
    acc = reduce_step(kind, acc, load_f(at(x, c), x.dtype));
  }
  float res = block_finish(kind, acc, sh);
  if (threadIdx.x == 0) part[blockIdx.x] = res;
}

// Stage 2: one block folds the partials and writes the single result.
__global__ __launch_bounds__(1024) void all_reduce_stage2(TDesc out, const float* part, int nparts, int kind,
                                                          int64_t n) {
  __shared__ float sh[32];
  float acc = kind == kMax ? -INFINITY : 0.0f;
  for (int i = threadIdx.x; i < nparts; i += blockDim.x) acc = reduce_step(kind, acc, part[i]);
  float res = block_finish(kind, acc, sh);
  if (kind == kMean) res = float(double(res) / double(n));
  if (threadIdx.x == 0) store_f(out.data, out.dtype, res);
}

__global__ void repeat_kernel(TDesc out, TDesc x, int64_t n) {
  RT_GRID_LOOP(i, n) {
    int64_t c[4];
    unravel(i, out.ne, c);
    store_f(at(out, c), out.dtype, load_f(at_bcast(x, c), x.dtype));
  }
}

// reduce_to: output element o sums x over the dims where out has 1 and x more (the "reduced" dims). rs holds
// x's extent in reduced dims and 1 elsewhere, m their product.
struct ReduceShape {
  int64_t rs[4];
  int64_t m;
};

__device__ __forceinline__ const char* reduce_src(const TDesc& x, const ReduceShape& s, const int64_t o[4],
                                                  int64_t j) {
  int64_t jc[4];
  unravel(j, s.rs, jc);
  int64_t c[4];
  for (int d = 0; d < 4; ++d) c[d] = s.rs[d] > 1 ? jc[d] : o[d];
  return at(x, c);
}

// One thread per output element, summing in ascending order of the reduced index (coalesced when dim 0 is
// kept).
__global__ void reduce_to_thread_kernel(TDesc out, TDesc x, ReduceShape s, int64_t n) {
  RT_GRID_LOOP(i, n) {
    int64_t o[4];
    unravel(i, out.ne, o);
    float acc = 0.0f;
    for (int64_t j = 0; j < s.m; ++j) acc += load_f(reduce_src(x, s, o, j), x.dtype);
    store_f(at(out, o), out.dtype, acc);
  }
}

// One warp per output element: lanes stride over the reduced index, then a butterfly sum.
__global__ void reduce_to_warp_kernel(TDesc out, TDesc x, ReduceShape s, int64_t n) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x >> 5);
  for (int64_t i = int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5); i < n; i += warps) {
    int64_t o[4];
    unravel(i, out.ne, o);
    float acc = 0.0f;
    for (int64_t j = lane; j < s.m; j += 32) acc += load_f(reduce_src(x, s, o, j), x.dtype);
    acc = warp_reduce(acc, SumOp{});
    if (lane == 0) store_f(at(out, o), out.dtype, acc);
  }
}

// max_back over rows: the row's gradient goes to the first element equal to the row's max.
__global__ __launch_bounds__(1024) void max_back_rows_kernel(TDesc out, TDesc g, TDesc x, TDesc y) {
  __shared__ long long sh[32];
  const int64_t rows = nrows(x), n = x.ne[0];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const char* xp = row_at(x, r);
    const float m = load_f(row_at(y, r), y.dtype);
    const float gv = load_f(row_at(g, r), g.dtype);
    long long first = LLONG_MAX;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
      if (load_f(xp + i * x.nb[0], x.dtype) == m) {
        first = i;
        break;  // later hits of this thread are larger
      }
    first = block_reduce(first, MinI64Op{}, LLONG_MAX, sh);
    char* op = row_at(out, r);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
      store_f(op + i * out.nb[0], out.dtype, i == first ? gv : 0.0f);
  }
}

// max_back over everything, step 1: the smallest logical index whose value equals the max (integer atomicMin
// gives the same answer in any order).
__global__ void first_match_kernel(TDesc x, TDesc y, unsigned long long* first, int64_t n) {
  const float m = load_f(y.data, y.dtype);
  RT_GRID_LOOP(i, n) {
    int64_t c[4];
    unravel(i, x.ne, c);
    if (load_f(at(x, c), x.dtype) == m) atomicMin(first, (unsigned long long)i);
  }
}

__global__ void max_back_all_kernel(TDesc out, TDesc g, const unsigned long long* first, int64_t n) {
  const float gv = load_f(g.data, g.dtype);
  const unsigned long long f = *first;
  RT_GRID_LOOP(i, n) {
    int64_t c[4];
    unravel(i, out.ne, c);
    store_f(at(out, c), out.dtype, (unsigned long long)i == f ? gv : 0.0f);
  }
}

void check_float_src(const Tensor* t) {
  RT_CHECK(is_float(t->src[0]->dtype), "cuda ", op_name(t->op), ": operand must be a float tensor, got ",
           t->src[0]->describe());
}

void launch_row_reduce(CudaExec& ex, Tensor* t, int kind) {
  check_float_src(t);
  const Tensor* x = t->src[0];
  int block = row_block(x->ne[0]);
  row_reduce_kernel<<<row_grid(x->nrows()), block, 0, ex.stream>>>(desc(t), desc(x), kind);
  RT_CUDA_LAUNCH_CHECK("row_reduce_kernel");
}

void launch_all_reduce(CudaExec& ex, Tensor* t, int kind) {
  check_float_src(t);
  const Tensor* x = t->src[0];
  const int64_t n = x->nelements();
  // The grid depends on n alone (not on the device), which keeps the result reproducible across devices.
  const int64_t per_block = int64_t(kBlock) * 4;
  const int nparts = int(std::min<int64_t>((n + per_block - 1) / per_block, 1024));
  auto part = ex.temp(sizeof(float) * size_t(nparts));
  all_reduce_stage1<<<nparts, kBlock, 0, ex.stream>>>(desc(x), kind, part->as<float>());
  RT_CUDA_LAUNCH_CHECK("all_reduce_stage1");
  all_reduce_stage2<<<1, 1024, 0, ex.stream>>>(desc(t), part->as<float>(), nparts, kind, n);
  RT_CUDA_LAUNCH_CHECK("all_reduce_stage2");
}

void sum_rows_l(CudaExec& ex, Tensor* t) {
  launch_row_reduce(ex, t, kSum);
}
void mean_rows_l(CudaExec& ex, Tensor* t) {
  launch_row_reduce(ex, t, kMean);
}
void max_rows_l(CudaExec& ex, Tensor* t) {
  launch_row_reduce(ex, t, kMax);
}
void sum_l(CudaExec& ex, Tensor* t) {
  launch_all_reduce(ex, t, kSum);
}
void mean_l(CudaExec& ex, Tensor* t) {
  launch_all_reduce(ex, t, kMean);
}
void max_l(CudaExec& ex, Tensor* t) {
  launch_all_reduce(ex, t, kMax);
}

void repeat_l(CudaExec& ex, Tensor* t) {
  check_float_src(t);
  RT_CHECK(can_broadcast(t->src[0], t), "cuda repeat: cannot broadcast ", t->src[0]->describe(), " to ",
           t->describe());
  int64_t n = t->nelements();
  repeat_kernel<<<ex.grid_for(n, kBlock), kBlock, 0, ex.stream>>>(desc(t), desc(t->src[0]), n);
  RT_CUDA_LAUNCH_CHECK("repeat_kernel");
}

// reduce_to of a contiguous x seen as [m rows, n columns] down to its n columns (a bias's or a norm weight's
// gradient): blocks of 32 columns × kColRows rows sum with coalesced reads into a [chunks, n] scratch, then one
// thread per column adds its chunks in order (a fixed tree: the same bits every run).
constexpr int kColRows = 256;
__global__ void column_partial_kernel(const char* x, DType xt, int64_t m, int64_t n, float* part) {
  __shared__ float sh[8][33];
  const int64_t col = int64_t(blockIdx.x) * 32 + threadIdx.x;
  const int64_t r0 = int64_t(blockIdx.y) * kColRows;
  const int es = dtype_size_dev(xt);
  float acc = 0.0f;
  if (col < n)
    for (int64_t r = r0 + threadIdx.y; r < min(m, r0 + kColRows); r += 8) acc += load_f(x + (r * n + col) * es, xt);
  sh[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < n) {
    float s = 0.0f;
    for (int y = 0; y < 8; ++y) s += sh[y][threadIdx.x];
    part[int64_t(blockIdx.y) * n + col] = s;
  }
}
__global__ void column_final_kernel(const float* part, int64_t chunks, int64_t n, char* out, DType ot) {
  RT_GRID_LOOP(col, n) {
    float s = 0.0f;
    for (int64_t c = 0; c < chunks; ++c) s += part[c * n + col];
    store_f(out + col * dtype_size_dev(ot), ot, s);
  }
}

void reduce_to_l(CudaExec& ex, Tensor* t) {
  check_float_src(t);
  const Tensor* x = t->src[0];
  RT_CHECK(can_broadcast(t, x), "cuda reduce_to: cannot sum ", x->describe(), " down to ", t->describe());
  ReduceShape s;
  s.m = 1;
  for (int d = 0; d < 4; ++d) {
    s.rs[d] = t->ne[d] == 1 ? x->ne[d] : 1;
    s.m *= s.rs[d];
  }
  const int64_t n = t->nelements();
  if (x->is_contiguous() && t->is_contiguous() && t->ne[0] == x->ne[0] && n == t->ne[0] && s.m > 1) {
    const int64_t m = s.m, chunks = (m + kColRows - 1) / kColRows;
    RT_CHECK(chunks < 65536, "cuda reduce_to: ", x->describe(), " has too many rows for the column reduction");
    auto part = ex.temp(sizeof(float) * size_t(chunks) * size_t(n));
    float* p = static_cast<float*>(part->data());
    column_partial_kernel<<<dim3(unsigned((n + 31) / 32), unsigned(chunks)), dim3(32, 8), 0, ex.stream>>>(
        static_cast<const char*>(x->data), x->dtype, m, n, p);
    RT_CUDA_LAUNCH_CHECK("column_partial_kernel");
    column_final_kernel<<<ex.grid_for(n, kBlock), kBlock, 0, ex.stream>>>(p, chunks, n, static_cast<char*>(t->data),
                                                                          t->dtype);
    RT_CUDA_LAUNCH_CHECK("column_final_kernel");
    return;
  }
  if (s.rs[0] == 1 && n >= 2048) {
    reduce_to_thread_kernel<<<ex.grid_for(n, kBlock), kBlock, 0, ex.stream>>>(desc(t), desc(x), s, n);
    RT_CUDA_LAUNCH_CHECK("reduce_to_thread_kernel");
  } else {
    reduce_to_warp_kernel<<<ex.grid_for(n * 32, kBlock), kBlock, 0, ex.stream>>>(desc(t), desc(x), s, n);
    RT_CUDA_LAUNCH_CHECK("reduce_to_warp_kernel");
  }
}

void max_back_l(CudaExec& ex, Tensor* t) {
  const Tensor* g = t->src[0];
  const Tensor* x = t->src[1];
  const Tensor* y = t->src[2];
  RT_CHECK(is_float(x->dtype) && same_shape(x, t), "cuda max_back: unexpected input ", x->describe(), " for ",
           t->describe());
  if (t->ip[0]) {
    RT_CHECK(g->nelements() == x->nrows() && y->nelements() == x->nrows(), "cuda max_back: gradient ",
             g->describe(), " and max ", y->describe(), " must have one element per row of ", x->describe());
    max_back_rows_kernel<<<row_grid(x->nrows()), row_block(x->ne[0]), 0, ex.stream>>>(desc(t), desc(g),
                                                                                      desc(x), desc(y));
    RT_CUDA_LAUNCH_CHECK("max_back_rows_kernel");
    return;
  }
  const int64_t n = x->nelements();
  auto first = ex.temp(sizeof(unsigned long long));
  RT_CUDA_CHECK(cudaMemsetAsync(first->data(), 0xff, sizeof(unsigned long long), ex.stream));
  first_match_kernel<<<ex.grid_for(n, kBlock), kBlock, 0, ex.stream>>>(desc(x), desc(y),
                                                                       first->as<unsigned long long>(), n);
  RT_CUDA_LAUNCH_CHECK("first_match_kernel");
  max_back_all_kernel<<<ex.grid_for(n, kBlock), kBlock, 0, ex.stream>>>(desc(t), desc(g),
                                                                        first->as<unsigned long long>(), n);
  RT_CUDA_LAUNCH_CHECK("max_back_all_kernel");
}

}  // namespace

void register_cuda_reduce_ops(CudaOpTable& t) {
  t[size_t(Op::SumRows)] = sum_rows_l;
  t[size_t(Op::MeanRows)] = mean_rows_l;
  t[size_t(Op::MaxRows)] = max_rows_l;
  t[size_t(Op::Sum)] = sum_l;
  t[size_t(Op::Mean)] = mean_l;
  t[size_t(Op::Max)] = max_l;
  t[size_t(Op::Repeat)] = repeat_l;
  t[size_t(Op::ReduceTo)] = reduce_to_l;
  t[size_t(Op::MaxBack)] = max_back_l;
}

}  // namespace retort::cuda
