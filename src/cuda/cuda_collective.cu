// The all_reduce graph op on the device (src/ops/collective_ops.h): the bucket is packed into its staging
// buffer on the compute stream (scaled by this rank's weight, converted to the wire dtype), summed by the
// collective on its own stream, and unpacked there too, so the compute stream goes on with backward; a join
// node makes the compute stream wait before the optimizer reads the sums. Every argument is fixed for the
// graph's life (the weight is read on the device), so the launches can be captured in a CUDA Graph.
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

__global__ void pack_kernel(Bucket b, const float* weight, char* staging, DType wire, int64_t n) {
  const float w = weight ? *weight : 1.0f;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int k = which(b, i);
    const int64_t j = i - (k ? b.end[k - 1] : 0);
    store_f(staging + i * int64_t(dtype_size_dev(wire)), wire, b.t[k][j] * w);
  }
}

__global__ void unpack_kernel(Bucket b, const char* staging, DType wire, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int k = which(b, i);
    const int64_t j = i - (k ? b.end[k - 1] : 0);
    b.t[k][j] = load_f(staging + i * int64_t(dtype_size_dev(wire)), wire);
  }
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
  unpack_kernel<<<ex.grid_for(total, block), block, 0, cs>>>(b, reinterpret_cast<const char*>(staging),
                                                              DType::F32, total);
  RT_CUDA_LAUNCH_CHECK("all_gather unpack");
  comm.join();
}

void launch_all_reduce(CudaExec& ex, Tensor* node) {
  if (node->ip[3] == kAllGatherMode) return launch_all_gather(ex, node);
  Collective& comm = all_reduce_comm(node);
  Tensor* staging = node->src[3];
  const DType wire = staging->dtype;
  Bucket b{};
  int64_t n = 0;
  for (int i = 0; i < kMaxSrc; ++i) {
    if (i >= 1 && i <= 3) continue;
    Tensor* t = node->src[i];
    if (!t) continue;
    b.t[b.count] = static_cast<float*>(t->data);
    n += t->nelements();
    b.end[b.count++] = n;
  }
  const float* weight = node->src[1] ? static_cast<const float*>(node->src[1]->data) : nullptr;
  const int block = 256;
  pack_kernel<<<ex.grid_for(n, block), block, 0, ex.stream>>>(b, weight, static_cast<char*>(staging->data),
                                                               wire, n);
  RT_CUDA_LAUNCH_CHECK("all_reduce pack");
  comm.all_reduce_sum(staging->data, n, wire);
  cudaStream_t cs = comm.stream() ? static_cast<cudaStream_t>(comm.stream()) : ex.stream;
  unpack_kernel<<<ex.grid_for(n, block), block, 0, cs>>>(b, static_cast<const char*>(staging->data), wire, n);
  RT_CUDA_LAUNCH_CHECK("all_reduce unpack");
  if (node->ip[1]) comm.join();
}

}  // namespace

void register_cuda_collective_ops(CudaOpTable& t) {
  t[size_t(Op::AllReduce)] = launch_all_reduce;
}

}  // namespace retort::cuda
