// Matmul on the device through cuBLASLt, with a plain tiled kernel as the fallback (and for tests).
//
// Shapes (ggml order, see ops.h): C [.., M, N] = op(A) op(B) with op(A) [M, K] and op(B) [K, N]; C is f32 and
// contiguous. Batch dims 2 and 3 of A and B are 1 (broadcast) or equal to C's.
//
// Row-major vs column-major. cuBLASLt reads matrices column-major: element (r, c) at r + c * ld. A ggml
// matrix S (rows = dim 1, columns = dim 0) whose dim 0 is contiguous, element (i1, i0) at i0 + i1 * ld, is
// therefore seen by cuBLASLt as the ne0 x ne1 matrix Sᵀ; one whose dim 1 is contiguous (a transposed view) is
// seen as S itself, ne1 x ne0 with ld = nb0. Our C is row-major [M, N], which cuBLASLt sees as Cᵀ (N x M, ld
// = N). So we ask cuBLASLt for
//     Cᵀ = op(B)ᵀ · op(A)ᵀ        (m = N, n = M, k = K; cuBLASLt's "A" is our B, its "B" is our A)
// and for each operand pick the cuBLASLt op (N or T) that turns what it sees in memory into the factor
// needed: op = N when the memory view already is that factor, T when it is the factor's transpose.
#include <algorithm>

#include "cuda_common.cuh"
#include "lt_gemm.h"

namespace retort::cuda {

namespace {

// ---- fallback: a tiled f32 GEMM that reads any dtype and any strides
// ------------------------------------------

constexpr int kTile = 16;

__device__ __forceinline__ float load_op(const TDesc& t, const char* base, bool trans, int64_t r, int64_t c) {
  // Element (r, c) of op(t): t itself has row index i1 and column index i0; trans swaps them.
  int64_t i0 = trans ? r : c, i1 = trans ? c : r;
  return load_f(base + i0 * t.nb[0] + i1 * t.nb[1], t.dtype);
}

// One block computes a kTile x kTile tile of C for batch blockIdx.z + z0. Tiles are flattened into
// blockIdx.x.
__global__ void simple_gemm_kernel(TDesc c, TDesc a, TDesc b, bool ta, bool tb, int64_t M, int64_t N,
                                   int64_t K, int64_t z0) {
  __shared__ float as[kTile][kTile + 1];
  __shared__ float bs[kTile][kTile + 1];
  const int64_t z = z0 + blockIdx.z;
  const int64_t i2 = z % c.ne[2], i3 = z / c.ne[2];
  const char* ab = a.data + (a.ne[2] == 1 ? 0 : i2 * a.nb[2]) + (a.ne[3] == 1 ? 0 : i3 * a.nb[3]);
  const char* bb = b.data + (b.ne[2] == 1 ? 0 : i2 * b.nb[2]) + (b.ne[3] == 1 ? 0 : i3 * b.nb[3]);
  const int64_t tiles_n = (N + kTile - 1) / kTile;
  const int64_t tm = int64_t(blockIdx.x) / tiles_n, tn = int64_t(blockIdx.x) % tiles_n;
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t row = tm * kTile + ty, col = tn * kTile + tx;
  float acc = 0.0f;
  for (int64_t k0 = 0; k0 < K; k0 += kTile) {
    const int64_t ka = k0 + tx, kb = k0 + ty;
    as[ty][tx] = (row < M && ka < K) ? load_op(a, ab, ta, row, ka) : 0.0f;
    bs[ty][tx] = (kb < K && col < N) ? load_op(b, bb, tb, kb, col) : 0.0f;
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kTile; ++kk) acc += as[ty][kk] * bs[kk][tx];
    __syncthreads();
  }
  if (row < M && col < N)
    store_f(c.data + col * c.nb[0] + row * c.nb[1] + i2 * c.nb[2] + i3 * c.nb[3], c.dtype, acc);
}

void simple_gemm(CudaExec& ex, const Tensor* a, bool ta, const Tensor* b, bool tb, Tensor* c, int64_t M,
                 int64_t N, int64_t K) {
  const int64_t tiles = ((M + kTile - 1) / kTile) * ((N + kTile - 1) / kTile);
  RT_CHECK(tiles < 2147483647LL, "cuda matmul: ", c->describe(), " is too large for the fallback GEMM");
  const int64_t batches = c->ne[2] * c->ne[3];
  for (int64_t z0 = 0; z0 < batches; z0 += 65535) {
    dim3 grid(unsigned(tiles), 1, unsigned(std::min<int64_t>(65535, batches - z0)));
    simple_gemm_kernel<<<grid, dim3(kTile, kTile), 0, ex.stream>>>(desc(c), desc(a), desc(b), ta, tb, M, N, K,
                                                                   z0);
    RT_CUDA_LAUNCH_CHECK("simple_gemm_kernel");
  }
}

// ---- cuBLASLt
// ------------------------------------------------------------------------------------------------

// How cuBLASLt sees one 2-D slice of a tensor in memory (see the comment at the top).
struct MatLayout {
  bool ok = false;
  bool shows_transpose =
      false;  // true: memory reads as Sᵀ (dim 0 contiguous); false: as S (dim 1 contiguous)
  uint64_t rows = 0, cols = 0;
  int64_t ld = 0;
};

MatLayout layout_of(const Tensor* t) {
  const size_t es = t->elsize();
  const int64_t ne0 = t->ne[0], ne1 = t->ne[1];
  MatLayout L;
  if ((ne0 == 1 || t->nb[0] == es) && t->nb[1] % es == 0) {
    int64_t ld = ne1 == 1 ? ne0 : int64_t(t->nb[1] / es);
    if (ld >= ne0) return {true, true, uint64_t(ne0), uint64_t(ne1), ld};
  }
  if ((ne1 == 1 || t->nb[1] == es) && t->nb[0] % es == 0) {
    int64_t ld = ne0 == 1 ? ne1 : int64_t(t->nb[0] / es);
    if (ld >= ne1) return {true, false, uint64_t(ne1), uint64_t(ne0), ld};
  }
  return L;
}

// The batch of a flattened index b = i2 + ne2 * i3 (over C's dims 2, 3) starts at b * stride elements in x
// when that is affine; false when x needs one call per i3.
bool flat_batch_stride(const Tensor* x, const Tensor* c, int64_t* stride) {
  const int64_t es = int64_t(x->elsize());
  const bool b2 = x->ne[2] > 1, b3 = x->ne[3] > 1;
  if (!b2 && !b3) {
    *stride = 0;
    return true;
  }
  if (c->ne[3] == 1) {
    *stride = int64_t(x->nb[2]) / es;
    return true;
  }
  if (c->ne[2] == 1) {
    *stride = int64_t(x->nb[3]) / es;
    return true;
  }
  if (b2 && b3 && x->nb[3] == x->nb[2] * size_t(x->ne[2])) {
    *stride = int64_t(x->nb[2]) / es;
    return true;
  }
  return false;
}

void make_layout(LtLayout& out, cudaDataType_t type, const MatLayout& L, int32_t batch, int64_t stride) {
  RT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&out.l, type, L.rows, L.cols, L.ld));
  if (batch > 1) {
    RT_CUBLAS_CHECK(
        cublasLtMatrixLayoutSetAttribute(out.l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof(batch)));
    RT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(out.l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                     &stride, sizeof(stride)));
  }
}

// C = op(A) op(B) (+ addend, laid out like C, possibly C itself) with cuBLASLt. A and B share a float dtype
// and are matrix-like. Returns false (having queued nothing) when cuBLASLt has no algorithm for this problem.
bool lt_gemm(CudaExec& ex, const Tensor* a, bool ta, const Tensor* b, bool tb, Tensor* c,
             const Tensor* addend = nullptr) {
  const MatLayout la = layout_of(a), lb = layout_of(b), lc = layout_of(c);
  RT_ASSERT(la.ok && lb.ok && lc.ok && lc.shows_transpose);
  // cuBLASLt's first factor is op(B)ᵀ: wanted as a transpose of B's math matrix exactly when !tb.
  const cublasOperation_t op_x = (!tb) == lb.shows_transpose ? CUBLAS_OP_N : CUBLAS_OP_T;
  // Its second factor is op(A)ᵀ: a transpose of A's math matrix exactly when !ta.
  const cublasOperation_t op_y = (!ta) == la.shows_transpose ? CUBLAS_OP_N : CUBLAS_OP_T;

  int64_t sa = 0, sb = 0;
  const int64_t es_a = int64_t(a->elsize()), es_b = int64_t(b->elsize());
  const bool flat = flat_batch_stride(a, c, &sa) && flat_batch_stride(b, c, &sb);
  // Flat: one call over all ne2 * ne3 batches. Otherwise one call per i3, batched over i2.
  const int64_t calls = flat ? 1 : c->ne[3];
  const int64_t batch = flat ? c->ne[2] * c->ne[3] : c->ne[2];
  if (!flat) {
    sa = a->ne[2] == 1 ? 0 : int64_t(a->nb[2]) / es_a;
    sb = b->ne[2] == 1 ? 0 : int64_t(b->nb[2]) / es_b;
  }
  const int64_t es_c = int64_t(c->elsize());
  const int64_t sc = int64_t(c->nb[2]) / es_c;
  RT_CHECK(batch < 2147483647LL, "cuda matmul: too many batches in ", c->describe());

  const bool f32_in = a->dtype == DType::F32;
  const cublasComputeType_t compute =
      f32_in && ex.opts.allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  LtMatmulDesc md;
  lt_matmul_desc(md, compute, op_x, op_y);

  LtLayout lx, ly, lz;
  make_layout(lx, lt_type(b->dtype, "cuda matmul"), lb, int32_t(batch), sb);
  make_layout(ly, lt_type(a->dtype, "cuda matmul"), la, int32_t(batch), sa);
  // A 16-bit C is the epilogue's conversion of the f32 accumulators (compute and scale types stay f32).
  make_layout(lz, lt_type(c->dtype, "cuda matmul"), lc, int32_t(batch), sc);

  // cuBLASLt assumes 256-byte aligned operands unless told otherwise; views and odd leading dimensions are
  // less aligned, so state the real alignment of every address it will form (base, columns, batches, calls).
  auto i3_step = [&](const Tensor* t) { return calls > 1 && t->ne[3] > 1 ? uint64_t(t->nb[3]) : 0; };
  const uint32_t al_x =
      lt_alignment({uint64_t(uintptr_t(b->data)), uint64_t(lb.ld * es_b), uint64_t(sb * es_b), i3_step(b)});
  const uint32_t al_y =
      lt_alignment({uint64_t(uintptr_t(a->data)), uint64_t(la.ld * es_a), uint64_t(sa * es_a), i3_step(a)});
  const uint32_t al_c = lt_alignment({uint64_t(uintptr_t(c->data)), uint64_t(lc.ld * es_c), uint64_t(sc * es_c),
                                      calls > 1 ? uint64_t(c->nb[3]) : 0,
                                      addend ? uint64_t(uintptr_t(addend->data)) : 0});
  LtPref pref;
  lt_preference(pref, ex.workspace_bytes, al_x, al_y, al_c);

  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(ex.lt, md.d, lx.l, ly.l, lz.l, lz.l, pref.p, 1, &heur, &found);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || (st == CUBLAS_STATUS_SUCCESS && found == 0)) return false;
  RT_CUBLAS_CHECK(st);

  RT_ASSERT(!addend || calls == 1);
  const float alpha = 1.0f, beta = addend ? 1.0f : 0.0f;
  for (int64_t i3 = 0; i3 < calls; ++i3) {
    const char* pa = static_cast<const char*>(a->data) + (a->ne[3] == 1 || flat ? 0 : i3 * a->nb[3]);
    const char* pb = static_cast<const char*>(b->data) + (b->ne[3] == 1 || flat ? 0 : i3 * b->nb[3]);
    char* pc = static_cast<char*>(c->data) + (flat ? 0 : i3 * c->nb[3]);
    const void* pin = addend ? addend->data : pc;
    RT_CUBLAS_CHECK(cublasLtMatmul(ex.lt, md.d, &alpha, pb, lx.l, pa, ly.l, &beta, pin, lz.l, pc, lz.l,
                                   &heur.algo, ex.workspace, ex.workspace_bytes, ex.stream));
  }
  return true;
}

// A matrix-like operand of dtype want: x itself, or a contiguous copy (kept alive by tmp, described by
// scratch).
const Tensor* as_operand(CudaExec& ex, const Tensor* x, DType want, std::unique_ptr<DeviceBuffer>& tmp,
                         Tensor& scratch) {
  if (x->dtype == want && layout_of(x).ok) return x;
  scratch.dtype = want;
  for (int d = 0; d < kMaxDims; ++d) scratch.ne[d] = x->ne[d];
  set_contiguous_strides(&scratch);
  tmp = ex.temp(size_t(x->nelements()) * dtype_size(want));
  scratch.data = tmp->data();
  copy_elements(ex, desc(&scratch), desc(x));
  return &scratch;
}

void matmul_l(CudaExec& ex, Tensor* t) {
  const Tensor* a = t->src[0];
  const Tensor* b = t->src[1];
  const bool ta = t->ip[0] != 0, tb = t->ip[1] != 0;
  const int64_t M = t->ne[1], N = t->ne[0];
  const int64_t K = ta ? a->ne[1] : a->ne[0];
  RT_CHECK(is_float(a->dtype) && is_float(b->dtype), "cuda matmul: operands must be float tensors, got ",
           a->describe(), " and ", b->describe());
  RT_CHECK(
      (ta ? a->ne[0] : a->ne[1]) == M && (tb ? b->ne[0] : b->ne[1]) == K && (tb ? b->ne[1] : b->ne[0]) == N,
      "cuda matmul: ", a->describe(), (ta ? "ᵀ" : ""), " x ", b->describe(), (tb ? "ᵀ" : ""),
      " does not give ", t->describe());
  for (int d = 2; d < 4; ++d)
    RT_CHECK((a->ne[d] == 1 || a->ne[d] == t->ne[d]) && (b->ne[d] == 1 || b->ne[d] == t->ne[d]),
             "cuda matmul: batch dims of ", a->describe(), " and ", b->describe(), " do not broadcast to ",
             t->describe());
  RT_CHECK((t->dtype == DType::F32 || (t->dtype == a->dtype && a->dtype == b->dtype)) && t->is_contiguous(),
           "cuda matmul: the result ", t->describe(), " must be contiguous f32 or in the operands' 16-bit dtype");
  // Graph::backward's addend (the GEMM's C; none in a run that starts its accumulator: kFresh).
  const Tensor* addend = t->src[2] && !t->has(kFresh) ? t->src[2] : nullptr;
  RT_CHECK(!addend || (t->dtype == DType::F32 && addend->dtype == DType::F32 && addend->is_contiguous() &&
                       same_shape(addend, t) && t->ne[2] == 1 && t->ne[3] == 1),
           "cuda matmul: the addend ", addend ? addend->describe() : std::string(), " does not fit ", t->describe());
  // The fallback GEMM overwrites the result: an addend that is the result's own storage is copied first.
  auto simple = [&](const Tensor* A, const Tensor* B) {
    std::unique_ptr<DeviceBuffer> keep;
    const float* c_in = addend ? static_cast<const float*>(addend->data) : nullptr;
    if (addend && addend->data == t->data) {
      keep = ex.temp(addend->nbytes());
      RT_CUDA_CHECK(cudaMemcpyAsync(keep->data(), addend->data, addend->nbytes(), cudaMemcpyDeviceToDevice,
                                    ex.stream));
      c_in = static_cast<const float*>(keep->data());
    }
    simple_gemm(ex, A, ta, B, tb, t, M, N, K);
    if (c_in) accumulate_dense_f32(ex, static_cast<float*>(t->data), c_in, t->nelements());
  };
  if (ex.opts.simple_gemm) {
    simple(a, b);
    return;
  }
  // Mixed dtypes compute in f32: cuBLASLt wants one input type.
  const DType want_a = a->dtype == b->dtype ? a->dtype : DType::F32;
  const DType want_b = a->dtype == b->dtype ? b->dtype : DType::F32;
  std::unique_ptr<DeviceBuffer> tmp_a, tmp_b;
  Tensor scratch_a, scratch_b;
  const Tensor* A = as_operand(ex, a, want_a, tmp_a, scratch_a);
  const Tensor* B = as_operand(ex, b, want_b, tmp_b, scratch_b);
  if (!lt_gemm(ex, A, ta, B, tb, t, addend)) simple(A, B);
}

}  // namespace

void register_cuda_matmul_ops(CudaOpTable& t) {
  t[size_t(Op::Matmul)] = matmul_l;
}

}  // namespace retort::cuda
