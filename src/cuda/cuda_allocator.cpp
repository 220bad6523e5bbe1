// The caching device allocator and the check helpers of the CUDA backend.
#include <algorithm>

#include "../core/checked.h"
#include "cuda_internal.h"

namespace retort::cuda {

// ---- checks
// ------------------------------------------------------------------------------------------------

void fail_cuda(cudaError_t err, const char* call, const char* file, int line) {
  // Clear a non-sticky error so the next launch check does not report it a second time.
  (void)cudaGetLastError();
  RT_FAIL("cuda backend: ", call, " failed at ", file, ":", line, ": ", cudaGetErrorName(err), " (",
          cudaGetErrorString(err), ")");
}

void fail_cublas(cublasStatus_t st, const char* call, const char* file, int line) {
  RT_FAIL("cuda backend: ", call, " failed at ", file, ":", line, ": ", cublasLtGetStatusName(st), " (",
          cublasLtGetStatusString(st), ")");
}

void check_launch(const char* kernel, const char* file, int line) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    RT_FAIL("cuda backend: launching kernel ", kernel, " failed at ", file, ":", line, ": ",
            cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
}

// ---- allocator
// ---------------------------------------------------------------------------------------------

namespace {

constexpr size_t kSmallGranule = 512;
constexpr size_t kSmallLimit = size_t(1) << 20;
constexpr size_t kLargeGranule = size_t(2) << 20;

}  // namespace

size_t CudaAllocator::round_size(size_t bytes) {
  // Checked before the round-up, which would wrap a size near 2^64 to a small one.
  RT_CHECK(bytes <= size_t(kMaxTensorBytes), "cuda backend: cannot allocate ", bytes,
           " bytes, more than the 2^48 bytes a backend can address");
  if (bytes == 0) bytes = 1;
  size_t g = bytes <= kSmallLimit ? kSmallGranule : kLargeGranule;
  return (bytes + g - 1) / g * g;
}

CudaAllocator::~CudaAllocator() {
  // Live blocks are owned by buffers that hold this allocator, so only cached blocks remain here.
  std::lock_guard<std::mutex> lock(mu_);
  try {
    free_cached_locked();
  } catch (...) {  // a destructor must not throw; the driver reclaims the memory at exit
  }
}

void CudaAllocator::free_cached_locked() {
  if (free_.empty()) return;
  DeviceScope scope(device_);
  // cudaFree synchronizes the device, so no queued work still uses these blocks. Each entry leaves the list
  // before it is freed, so a failure part-way never frees a block twice.
  while (!free_.empty()) {
    auto it = free_.begin();
    const size_t size = it->first;
    void* p = it->second;
    free_.erase(it);
    st_.bytes_cached -= size;
    st_.bytes_reserved -= size;
    RT_CUDA_CHECK(cudaFree(p));
  }
}

void* CudaAllocator::allocate(size_t bytes, size_t* block_bytes) {
  const size_t want = round_size(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  ++st_.alloc_calls;
  // Take the smallest cached block that fits and wastes at most a quarter of the request (first from the
  // blocks a capture in progress released).
  auto take = [&](std::multimap<size_t, void*>& list) -> void* {
    auto it = list.lower_bound(want);
    if (it == list.end() || it->first > want + want / 4) return nullptr;
    const size_t size = it->first;
    void* p = it->second;
    list.erase(it);
    st_.bytes_cached -= size;
    st_.bytes_in_use += size;
    st_.peak_bytes = std::max(st_.peak_bytes, st_.bytes_in_use);
    *block_bytes = size;
    return p;
  };
  if (capturing_)
    if (void* p = take(capture_free_)) return p;
  if (void* p = take(free_)) return p;
  DeviceScope scope(device_);
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, want);
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    free_cached_locked();  // give the cache back to the device and try once more
    err = cudaMalloc(&p, want);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      RT_FAIL("cuda backend: out of device memory allocating ", bytes, " bytes on device ", device_, " (",
              st_.bytes_in_use, " bytes in use by this backend)");
    }
  }
  if (err != cudaSuccess) fail_cuda(err, "cudaMalloc(&p, want)", __FILE__, __LINE__);
  ++st_.device_allocs;
  st_.bytes_in_use += want;
  st_.bytes_reserved += want;
  st_.peak_bytes = std::max(st_.peak_bytes, st_.bytes_in_use);
  *block_bytes = want;
  return p;
}

void CudaAllocator::release(void* p, size_t block_bytes) noexcept {
  if (!p) return;
  std::lock_guard<std::mutex> lock(mu_);
  (capturing_ ? capture_free_ : free_).emplace(block_bytes, p);
  st_.bytes_in_use -= block_bytes;
  st_.bytes_cached += block_bytes;
}

void CudaAllocator::begin_capture() {
  std::lock_guard<std::mutex> lock(mu_);
  RT_ASSERT(!capturing_ && capture_free_.empty());
  capturing_ = true;
}

CudaAllocator::Blocks CudaAllocator::end_capture() {
  std::lock_guard<std::mutex> lock(mu_);
  Blocks kept(capture_free_.begin(), capture_free_.end());
  capture_free_.clear();
  capturing_ = false;
  // Held by the recording: in use, not cached.
  for (const auto& b : kept) {
    st_.bytes_cached -= b.first;
    st_.bytes_in_use += b.first;
  }
  st_.peak_bytes = std::max(st_.peak_bytes, st_.bytes_in_use);
  return kept;
}

void CudaAllocator::give_back(const Blocks& blocks) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& b : blocks) {
    free_.emplace(b.first, b.second);
    st_.bytes_in_use -= b.first;
    st_.bytes_cached += b.first;
  }
}

CudaMemoryStats CudaAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return st_;
}

void CudaAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  st_.peak_bytes = st_.bytes_in_use;
}

void CudaAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  free_cached_locked();
}

DeviceBuffer::DeviceBuffer(std::shared_ptr<CudaAllocator> alloc, size_t bytes) : alloc_(std::move(alloc)) {
  data_ = alloc_->allocate(bytes, &block_);
  size_ = bytes;
}

DeviceBuffer::~DeviceBuffer() {
  alloc_->release(data_, block_);
}

}  // namespace retort::cuda
