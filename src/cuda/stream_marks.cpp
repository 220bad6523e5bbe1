// StreamMarks: events on a backend's stream for ordering and deferred releases (stream_marks.h).
#include "stream_marks.h"

#include "cuda_internal.h"

namespace retort::cuda {

StreamMarks::~StreamMarks() {
  try {
    run_finished(true);
  } catch (...) {  // a destructor must not throw; the releases themselves do not
  }
  for (cudaEvent_t e : pool_) (void)cudaEventDestroy(e);
}

cudaEvent_t StreamMarks::take() {
  if (!pool_.empty()) {
    cudaEvent_t e = pool_.back();
    pool_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  RT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

void StreamMarks::make_wait(cudaStream_t other) {
  DeviceScope scope(device_);
  std::lock_guard<std::mutex> lock(mu_);
  cudaEvent_t e = take();
  // A wait binds to the event's record at the time of the call, so the event may be recorded again at once.
  const cudaError_t r = cudaEventRecord(e, stream_);
  const cudaError_t w = r == cudaSuccess ? cudaStreamWaitEvent(other, e, 0) : r;
  pool_.push_back(e);
  RT_CUDA_CHECK(w);
}

void StreamMarks::wait_for(cudaStream_t other) {
  DeviceScope scope(device_);
  std::lock_guard<std::mutex> lock(mu_);
  cudaEvent_t e = take();
  const cudaError_t r = cudaEventRecord(e, other);
  const cudaError_t w = r == cudaSuccess ? cudaStreamWaitEvent(stream_, e, 0) : r;
  pool_.push_back(e);
  RT_CUDA_CHECK(w);
}

void StreamMarks::after_queued(std::function<void()> fn) {
  DeviceScope scope(device_);
  std::lock_guard<std::mutex> lock(mu_);
  cudaEvent_t e = take();
  const cudaError_t r = cudaEventRecord(e, stream_);
  if (r != cudaSuccess) {
    pool_.push_back(e);
    RT_CUDA_CHECK(r);
  }
  releases_.emplace_back(e, std::move(fn));
}

bool StreamMarks::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !releases_.empty();
}

void StreamMarks::run_finished(bool all) {
  std::vector<std::function<void()>> ready;
  {
    DeviceScope scope(device_);
    std::lock_guard<std::mutex> lock(mu_);
    // Events complete in stream order: the first one still running ends the scan.
    while (!releases_.empty()) {
      auto& [e, fn] = releases_.front();
      if (!all && cudaEventQuery(e) != cudaSuccess) break;
      ready.push_back(std::move(fn));
      pool_.push_back(e);
      releases_.pop_front();
    }
  }
  for (auto& fn : ready) fn();
}

}  // namespace retort::cuda
