// The all_reduce graph op on the device (src/ops/collective_ops.h): the bucket is packed into its staging
// buffer on the compute stream (scaled by this rank's weight, converted to the wire dtype), summed by the
// collective on its own stream, and unpacked there too, so the compute stream goes on with backward; a join
// node makes the compute stream wait before the optimizer reads the sums. A single f32 tensor with no weight
// (gradients already carry the rank's share from the loss seed) is summed where it lies, with neither pass.
// Every argument is fixed for the
// graph's life (the weight is read on the device), so the launches can be captured in a CUDA Graph.
#include <algorithm>

#include "../ops/collective_ops.h"
#include "cuda_common.cuh"

namespace retort::cuda {

namespace {

struct Bucket {
  float* t[kAllReduceMaxTensors];
  int64_t end[kAllReduceMaxTensors];  // running element counts: tensor i holds [end[i-1], end[i])
  int count;
};

__device__ __forceinline__ int which(const Bucket& b, int64_t i) {
  int k = 0;
  while (k + 1 < b.count && i >= b.end[k]) ++k;
  return k;
}

// Blocks along y take one tensor each (no per-element search), x strides over its elements eight at a time
// where the tensor and its place in the staging buffer are 16-byte aligned.
template <bool Pack>
__global__ void move_kernel(Bucket b, const float* weight, char* staging, DType wire) {
  const int k = blockIdx.y;
  const int64_t lo = k ? b.end[k - 1] : 0, n = b.end[k] - lo;
  const int ws = dtype_size_dev(wire);
  float* t = b.t[k];
  char* s = staging + lo * ws;
  const float w = Pack && weight ? *weight : 1.0f;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x, first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t done = 0;
  if (((reinterpret_cast<uintptr_t>(t) | reinterpret_cast<uintptr_t>(s)) & 15) == 0) {
    done = n / 8 * 8;
    for (int64_t i = first * 8; i < done; i += stride * 8) {
      float x[8];
      if (Pack) {
        load8f(reinterpret_cast<const char*>(t + i), DType::F32, x);
#pragma unroll
        for (int j = 0; j < 8; ++j) x[j] *= w;
        store8f(s + i * ws, wire, x);
      } else {
        load8f(s + i * ws, wire, x);
        store8f(reinterpret_cast<char*>(t + i), DType::F32, x);
      }
    }
  }
  for (int64_t i = done + first; i < n; i += stride) {
    if (Pack)
      store_f(s + i * ws, wire, t[i] * w);
    else
      t[i] = load_f(s + i * ws, wire);
  }
}

// Packs (Pack) the bucket's tensors into staging, scaled by *weight, or unpacks them from it, on stream.
template <bool Pack>
void move_bucket(CudaExec& ex, const Bucket& b, const float* weight, char* staging, DType wire, cudaStream_t stream) {
  int64_t most = 0;
  for (int k = 0; k < b.count; ++k) most = std::max(most, b.end[k] - (k ? b.end[k - 1] : 0));
  const int block = 256;
  const int x = std::max(1, std::min(ex.grid_for((most + 7) / 8, block) / b.count, int((most / 8 + block) / block)));
  move_kernel<Pack><<<dim3(x, b.count), block, 0, stream>>>(b, weight, staging, wire);
  RT_CUDA_LAUNCH_CHECK(Pack ? "all_reduce pack" : "all_reduce unpack");
}

// Gather mode: element lo + i of the tensors' run (0 past its end) into staging[lo + i], i < slice.
__global__ void pack_slice_kernel(Bucket b, float* staging, int64_t lo, int64_t slice, int64_t total) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < slice;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t g = lo + i;
    float v = 0.0f;
    if (g < total) {
      const int k = which(b, g);
      v = b.t[k][g - (k ? b.end[k - 1] : 0)];
    }
    staging[g] = v;
  }
}

Bucket bucket_of(const Tensor* node, int64_t* n) {
  Bucket b{};
  *n = 0;
  for (int i = 0; i < kMaxSrc; ++i) {
    if (i >= 1 && i <= 3) continue;
    Tensor* t = node->src[i];
    if (!t) continue;
    b.t[b.count] = static_cast<float*>(t->data);
    *n += t->nelements();
    b.end[b.count++] = *n;
  }
  return b;
}

// ZeRO-1's parameter exchange: this rank's slice packed on the compute stream, gathered and unpacked on the
// collective's, then joined (the next step's forward reads the parameters).
void launch_all_gather(CudaExec& ex, Tensor* node) {
  Collective& comm = all_reduce_comm(node);
  int64_t total = 0;
  const Bucket b = bucket_of(node, &total);
  const int64_t slice = node->ip[4], lo = comm.rank() * slice;
  float* staging = static_cast<float*>(node->src[3]->data);
  const int block = 256;
  pack_slice_kernel<<<ex.grid_for(slice, block), block, 0, ex.stream>>>(b, staging, lo, slice, total);
  RT_CUDA_LAUNCH_CHECK("all_gather pack");
  comm.all_gather(staging + lo, staging, size_t(slice) * sizeof(float));
  cudaStream_t cs = comm.stream() ? static_cast<cudaStream_t>(comm.stream()) : ex.stream;
  move_bucket<false>(ex, b, nullptr, reinterpret_cast<char*>(staging), DType::F32, cs);
  comm.join();
}

// An embedding's gradient rows and ids, gathered on the collective's stream straight from where they lie,
// then joined: the scatter that reads them comes next, and nothing can reuse their memory before.
void launch_gather_rows(CudaExec&, Tensor* node) {
  Collective& comm = all_reduce_comm(node);
  const Tensor* rows = node->src[4];
  const Tensor* ids = node->src[5];
  comm.all_gather(rows->data, node->src[0]->data, rows->nbytes());
  comm.all_gather(ids->data, node->src[3]->data, ids->nbytes());
  comm.join();
}

void launch_all_reduce(CudaExec& ex, Tensor* node) {
  if (node->ip[3] == kAllGatherMode) return launch_all_gather(ex, node);
  if (node->ip[3] == kGatherRowsMode) return launch_gather_rows(ex, node);
  Collective& comm = all_reduce_comm(node);
  Tensor* staging = node->src[3];
  if (!staging) {
    comm.all_reduce_sum(node->src[0]->data, node->src[0]->nelements(), DType::F32);
    if (node->ip[1]) comm.join();
    return;
  }
  const DType wire = staging->dtype;
  int64_t n = 0;
  const Bucket b = bucket_of(node, &n);
  const float* weight = node->src[1] ? static_cast<const float*>(node->src[1]->data) : nullptr;
  char* st = static_cast<char*>(staging->data);
  move_bucket<true>(ex, b, weight, st, wire, ex.stream);
  comm.all_reduce_sum(staging->data, n, wire);
  cudaStream_t cs = comm.stream() ? static_cast<cudaStream_t>(comm.stream()) : ex.stream;
  move_bucket<false>(ex, b, nullptr, st, wire, cs);
  if (node->ip[1]) comm.join();
}

}  // namespace

void register_cuda_collective_ops(CudaOpTable& t) {
  t[size_t(Op::AllReduce)] = launch_all_reduce;
}

}  // namespace retort::cuda
