// Internals of the CUDA backend shared by its files: the check helpers, the caching allocator, the launch
// environment every op launcher gets, and the launcher table. Host code only (no kernels here).
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "../core/backend.h"
#include "../core/error.h"
#include "../core/op.h"
#include "../core/tensor.h"
#include "cuda_backend.h"
#include "lt_tune.h"

namespace retort::cuda {

// ---- checks
// ------------------------------------------------------------------------------------------------ Throw
// retort::Error naming the call, file:line and the error string.
[[noreturn]] void fail_cuda(cudaError_t err, const char* call, const char* file, int line);
[[noreturn]] void fail_cublas(cublasStatus_t st, const char* call, const char* file, int line);
// cudaGetLastError after a kernel launch; throws naming the kernel.
void check_launch(const char* kernel, const char* file, int line);

}  // namespace retort::cuda

// Every CUDA runtime call goes through this.
#define RT_CUDA_CHECK(call)                                                                    \
  do {                                                                                         \
    cudaError_t rt_err_ = (call);                                                              \
    if (rt_err_ != cudaSuccess) ::retort::cuda::fail_cuda(rt_err_, #call, __FILE__, __LINE__); \
  } while (0)

// Every cuBLAS / cuBLASLt call goes through this.
#define RT_CUBLAS_CHECK(call)                                                                            \
  do {                                                                                                   \
    cublasStatus_t rt_st_ = (call);                                                                      \
    if (rt_st_ != CUBLAS_STATUS_SUCCESS) ::retort::cuda::fail_cublas(rt_st_, #call, __FILE__, __LINE__); \
  } while (0)

// After every kernel launch: a bad launch configuration (or an earlier asynchronous fault) surfaces here.
#define RT_CUDA_LAUNCH_CHECK(kernel_name) ::retort::cuda::check_launch(kernel_name, __FILE__, __LINE__)

namespace retort::cuda {

// Makes `device` current for the scope of a call and restores the caller's device after.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&prev_) != cudaSuccess) prev_ = -1;
    if (prev_ != device) RT_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceScope() {
    int cur = -1;
    if (prev_ >= 0 && cudaGetDevice(&cur) == cudaSuccess && cur != prev_) (void)cudaSetDevice(prev_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int prev_ = -1;
};

// ---- caching allocator
// ------------------------------------------------------------------------------------- Device memory in
// size-binned free lists. A freed block goes back to its list and is handed out again without
// cudaMalloc/cudaFree (both of which synchronize the device). Reuse is safe without events because every
// backend uses one stream: work that read a block was queued before work that writes it again.
class CudaAllocator {
 public:
  explicit CudaAllocator(int device) : device_(device) {}
  ~CudaAllocator();
  CudaAllocator(const CudaAllocator&) = delete;
  CudaAllocator& operator=(const CudaAllocator&) = delete;

  // A block of at least bytes; *block_bytes gets its real (rounded) size. Throws retort::Error when the
  // device is out of memory even after the cache was emptied.
  void* allocate(size_t bytes, size_t* block_bytes);
  void release(void* p, size_t block_bytes) noexcept;
  CudaMemoryStats stats() const;
  void reset_peak();
  void empty_cache();
  int device() const { return device_; }

  // The size a request is rounded to: 512 B granules up to 1 MiB, 2 MiB granules above.
  static size_t round_size(size_t bytes);

  // A CUDA Graph capture of a node list: from begin_capture() to end_capture(), blocks released go to a
  // private list that only allocations of the capture reuse, and end_capture() hands them over to the
  // recording (a replay writes them again, so nothing else may hold them); give_back() returns them to the
  // cache when the recording is gone. One capture at a time.
  using Blocks = std::vector<std::pair<size_t, void*>>;
  void begin_capture();
  Blocks end_capture();
  void give_back(const Blocks& blocks) noexcept;

 private:
  void free_cached_locked();
  int device_;
  mutable std::mutex mu_;
  std::multimap<size_t, void*> free_;  // block size -> free block
  bool capturing_ = false;
  std::multimap<size_t, void*> capture_free_;  // released during the capture
  CudaMemoryStats st_;
};

// A block from the allocator that goes back to it when destroyed. Holds the allocator alive, so buffers may
// outlive their backend.
class DeviceBuffer final : public Buffer {
 public:
  DeviceBuffer(std::shared_ptr<CudaAllocator> alloc, size_t bytes);
  ~DeviceBuffer() override;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  std::shared_ptr<CudaAllocator> alloc_;
  size_t block_ = 0;
};

// ---- device-side errors
// ------------------------------------------------------------------------------------ Written by the first
// kernel thread that finds bad data (an id or label out of range); the backend reads it after each
// synchronize/read and turns it into retort::Error.
// kErrNotFinite: value = the row that holds NaN or +inf (where only -inf and finite values are allowed).
// kErrTeacherLogprob: a valid top-K slot's teacher logprob is NaN or +inf; value = the row, bound = the slot.
enum DeviceErrorKind : int {
  kErrNone = 0,
  kErrIdOutOfRange = 1,
  kErrLabelOutOfRange = 2,
  kErrNotFinite = 3,
  kErrTeacherLogprob = 4,
};
struct DeviceError {
  int flag;  // 0: no error; set to 1 with atomicCAS by the first reporter
  int op;    // the Op that found it
  int kind;  // DeviceErrorKind
  int pad;
  long long value;  // the offending value
  long long bound;  // the valid range is [0, bound)
};

// ---- launch environment
// ------------------------------------------------------------------------------------
// A cuBLASLt algorithm chosen by timing (lt_tune.h) for one GEMM, by the chunk executor's description of it
// (its GemmKey): for beta = 0 and for beta != 0. Timed twice: at the shape's first call, and once more at
// its first call (that overwrites C) at least kSettleSeconds later, when the GPU has been under load and runs
// at the clocks its power cap allows (the picks of a cool GPU need not hold there).
struct LtTuned {
  static constexpr double kSettleSeconds = 2.0;
  std::vector<int64_t> key;
  std::array<LtAlgo, 2> algo;
  std::vector<LtAlgo> cands;                    // the timed candidates
  std::chrono::steady_clock::time_point first;  // when first timed
  bool settled = false;                         // timed the second time
};

// The fused linear losses' GEMM algorithm cache file (CudaOptions::gemm_cache, cuda/tune_cache.h), shared by
// a backend's executors: per GemmKey, {candidate count, index picked for beta = 0, for beta != 0}. Read at
// the first GEMM that would be timed; written (merged, atomically) each time a shape is timed.
struct GemmCacheFile {
  std::string path;       // empty: no file
  std::string signature;  // the device, SM count, cuBLASLt version and workspace the picks hold for
  bool loaded = false;
  std::map<std::vector<int64_t>, std::vector<int64_t>> entries;
  size_t hits = 0;  // GEMM shapes that took their algorithms from the file instead of timing them
};

struct CudaExec {
  int device = 0;
  cudaStream_t stream = nullptr;
  std::shared_ptr<CudaAllocator> alloc;
  cublasLtHandle_t lt = nullptr;
  DeviceError* dev_error = nullptr;  // device memory
  CudaOptions opts;
  void* workspace = nullptr;  // cuBLASLt workspace (from alloc, opts.gemm_workspace_bytes)
  size_t workspace_bytes = 0;
  int sm_count = 1;
  // The fused linear losses' timed GEMM algorithms, kept for the backend's life (shared by its copies).
  std::shared_ptr<std::vector<LtTuned>> lt_tuned = std::make_shared<std::vector<LtTuned>>();
  std::shared_ptr<GemmCacheFile> gemm_cache = std::make_shared<GemmCacheFile>();
  // Chunks the fused losses ran on the softmax-epilogue path (CudaOptions::softmax_epilogue).
  std::shared_ptr<size_t> softmax_chunks = std::make_shared<size_t>(0);
  // Device memory free for the fused losses' automatic budget, read at their first call (0: not yet).
  std::shared_ptr<size_t> fused_free = std::make_shared<size_t>(0);

  // Grid size for a grid-stride loop over n items with blocks of `block` threads.
  int grid_for(int64_t n, int block) const {
    int64_t g = (n + block - 1) / block;
    int64_t cap = int64_t(sm_count) * 32;
    return int(g < 1 ? 1 : (g > cap ? cap : g));
  }
  // A temporary device block; freeing it right after queuing the work that uses it is safe (one stream).
  std::unique_ptr<DeviceBuffer> temp(size_t bytes) const {
    return std::make_unique<DeviceBuffer>(alloc, bytes);
  }
};

// Runs one node on the device (queues its kernels on ex.stream).
using CudaLauncher = void (*)(CudaExec& ex, Tensor* node);
using CudaOpTable = std::array<CudaLauncher, kOpCount>;

// Registration, one per op family file.
// n elements of quantized type t at device address src decoded into dst (f32, bf16 or f16), on stream.
void launch_dequantize(QuantType t, const uint8_t* src, DType out, void* dst, int64_t n, cudaStream_t stream);

void register_cuda_view_ops(CudaOpTable& t);
void register_cuda_elementwise_ops(CudaOpTable& t);
void register_cuda_reduce_ops(CudaOpTable& t);
void register_cuda_matmul_ops(CudaOpTable& t);
void register_cuda_get_rows_ops(CudaOpTable& t);
void register_cuda_set_rows_ops(CudaOpTable& t);
void register_cuda_softmax_ops(CudaOpTable& t);
void register_cuda_norm_ops(CudaOpTable& t);
void register_cuda_fused_layer_ops(CudaOpTable& t);  // cuda_fused_layers.cu: rms_norm_affine, swiglu
void register_cuda_loss_graph_ops(CudaOpTable& t);  // loss/cuda_loss_ops.cu: the loss backend's ops
void register_cuda_fused_ops(CudaOpTable& t);       // loss/cuda_fused_ops.cu: the fused linear losses
void register_cuda_topk_ops(CudaOpTable& t);        // cuda_topk.cu: topk_logprobs
void register_cuda_attention_ops(CudaOpTable& t);   // cuda_attention.cu: flash_attention
void register_cuda_optim_ops(CudaOpTable& t);       // cuda_optim.cu: grad_norm, adamw_step, sgd_step
void register_cuda_collective_ops(CudaOpTable& t);  // cuda_collective.cu: all_reduce

}  // namespace retort::cuda
