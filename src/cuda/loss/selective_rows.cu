// Selective log-softmax rows and the small row reductions (row counts, a scalar sum); see row_losses.h.
#include <cuda_runtime.h>

#include "row_policies.cuh"

namespace retort::cuda {

namespace {

using namespace rowloss;

// Selective log-softmax.

template <typename G>
struct SelGrad {
  G* out;
  float lse, gsum, scale;
  template <int N>
  __device__ __forceinline__ void apply(int64_t j0, float* z) {
    float g[N > 1 ? 8 : 1];
#pragma unroll
    for (int i = 0; i < N; ++i) g[i] = -fast_exp2(fmaf(z[i], kLog2e, -lse * kLog2e)) * gsum * scale;
    if constexpr (N == 8) {
      store8(out + j0, reinterpret_cast<float(&)[8]>(g));
    } else {
      out[j0] = from_f<G>(g[0]);
    }
  }
};

// Forward: lse by an online pass, then out[k] = z[id_k] - lse. Backward (upstream given, lse from the
// forward): one dense pass writes -p_j·Σg, then, after a barrier, the K id columns are overwritten with Σ_{k:
// id_k = j} g_k - p_j·Σg. Each distinct id is written by one thread (its first occurrence), so duplicate ids
// need no atomics and the result is deterministic. p at an id comes from the forward's log-probabilities, so
// the logits may already be overwritten (in-place gradient).
template <typename T, typename G>
__global__ void __launch_bounds__(kThreads)
    selective_kernel(RowBlock b, SelectiveRows o, int* err, bool vec, bool gvec) {
  __shared__ alignas(16) unsigned char scratch_raw[32 * sizeof(Online)];
  Online* scratch = reinterpret_cast<Online*>(scratch_raw);
  __shared__ float fscratch[32];
  __shared__ int bad;
  const bool i64 = o.id_dtype == DType::I64;
  for (int64_t r = blockIdx.x; r < b.rows; r += gridDim.x) {
    const T* row = static_cast<const T*>(b.logits) + r * b.stride;
    const int64_t* ids64 = static_cast<const int64_t*>(o.ids) + r * o.K;
    const int32_t* ids32 = static_cast<const int32_t*>(o.ids) + r * o.K;
    auto id_at = [&](int64_t k) { return i64 ? ids64[k] : int64_t(ids32[k]); };
    if (threadIdx.x == 0) bad = 0;
    __syncthreads();
    for (int64_t k = threadIdx.x; k < o.K; k += blockDim.x) {
      int64_t id = id_at(k);
      if (id < 0 || id >= b.V) bad = 1;
    }
    __syncthreads();
    if (bad) {
      if (threadIdx.x == 0 && err) atomicCAS(err, 0, int(r) + 1);
      continue;  // uniform across the block
    }
    if (!o.upstream) {
      CePolicy::Acc acc;  // plain online softmax
      for_row<kUnroll>(row, b.V, vec, acc);
      Online on = block_merge(acc.on, scratch);
      const float lse = on.lse(), log_s = logf(on.s);
      if (threadIdx.x == 0 && b.lse) b.lse[r] = lse;
      // (z - m) - log s: the large max cancels before the small log-sum is taken off.
      for (int64_t k = threadIdx.x; k < o.K; k += blockDim.x)
        o.out[r * o.K + k] = (to_f<T>(row[id_at(k)]) - on.m) - log_s;
    } else {
      const float* g = o.upstream + r * o.K;
      // The forward log-probabilities when given; else p at an id is recomputed from the logit exactly as
      // the dense pass computed it (then the gradient must not alias the logits: checked on the host).
      const float* lp = o.out ? o.out + r * o.K : nullptr;
      float gs = 0.0f;
      for (int64_t k = threadIdx.x; k < o.K; k += blockDim.x) gs += g[k];
      gs = block_sum(gs, fscratch);
      const float scale = grad_scale(b);
      G* grow = static_cast<G*>(b.grad) + r * b.grad_stride;
      SelGrad<G> gr{grow, b.lse[r], gs, scale};
      for_row<kUnroll>(row, b.V, vec && gvec, gr);
      __syncthreads();  // dense writes land before the id columns are overwritten
      for (int64_t k = threadIdx.x; k < o.K; k += blockDim.x) {
        int64_t id = id_at(k);
        bool first = true;
        for (int64_t q = 0; q < k && first; ++q) first = id_at(q) != id;
        if (!first) continue;
        float acc = 0.0f;
        for (int64_t q = k; q < o.K; ++q)
          if (id_at(q) == id) acc += g[q];
        float p =
            lp ? fast_exp2(lp[k] * kLog2e) : fast_exp2(fmaf(to_f<T>(row[id]), kLog2e, -b.lse[r] * kLog2e));
        grow[id] = from_f<G>((acc - p * gs) * scale);
      }
    }
    __syncthreads();
  }
}

// Small helpers.

__global__ void count_kernel(const void* labels, bool i64, int64_t rows, int64_t ignore, float weight,
                             float* inv_count, int* count) {
  __shared__ float scratch[32];
  float c = 0.0f;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x)
    c += load_index(labels, i64, r) != ignore ? 1.0f : 0.0f;
  c = block_sum(c, scratch);
  if (threadIdx.x == 0) {
    *inv_count = weight / fmaxf(c, 1.0f);
    if (count) *count = int(c);
  }
}

__global__ void sum_kernel(const float* v, int64_t n, const float* scale_dev, float scale, float* out) {
  __shared__ float scratch[32];
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += v[i];
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) *out = s * scale * (scale_dev ? *scale_dev : 1.0f);
}

}  // namespace

void selective_log_softmax_rows(const RowBlock& b, const SelectiveRows& o, int* err, void* stream) {
  check_block(b, "selective_log_softmax");
  RT_CHECK(o.K >= 1 && o.ids && (o.out || o.upstream), "selective_log_softmax: need K >= 1, ids and out");
  RT_CHECK(!o.upstream || (b.grad && b.lse),
           "selective_log_softmax: the backward needs grad and the forward lse");
  RT_CHECK(!o.upstream || o.out || b.grad != b.logits,
           "selective_log_softmax: a backward without the forward log-probabilities reads the logits after "
           "the dense pass, so the gradient must not alias them");
  if (b.rows == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  dispatch(b.dtype, b.grad ? b.grad_dtype : DType::F32, "selective_log_softmax",
           [&]<typename T, typename G>() {
             bool vec = true;  // for_row's vector path takes any row
             bool gvec = grad_vec_ok(b.logits, b.stride, sizeof(T), b.grad, b.grad_stride, sizeof(G));
             selective_kernel<T, G><<<grid_for(b.rows), kThreads, 0, s>>>(b, o, err, vec, gvec);
           });
  RT_CUDA_LAUNCH_CHECK("selective_log_softmax_rows");
}

void count_valid_rows(const void* labels, DType label_dtype, int64_t rows, int64_t ignore_index, float weight,
                      float* inv_count, int* count, void* stream) {
  count_kernel<<<1, 1024, 0, static_cast<cudaStream_t>(stream)>>>(labels, label_dtype == DType::I64, rows,
                                                                  ignore_index, weight, inv_count, count);
  RT_CUDA_LAUNCH_CHECK("count_valid_rows");
}

void sum_rows_scalar(const float* values, int64_t n, const float* scale_dev, float scale, float* out,
                     void* stream) {
  sum_kernel<<<1, 1024, 0, static_cast<cudaStream_t>(stream)>>>(values, n, scale_dev, scale, out);
  RT_CUDA_LAUNCH_CHECK("sum_rows_scalar");
}

}  // namespace retort::cuda
