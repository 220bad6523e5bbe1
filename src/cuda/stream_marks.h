// Points in a CUDA backend's stream ("everything queued so far"), as events: ordering another stream with
// ours both ways, and releases that wait for the work queued before them without the host waiting. DLPack
// exchange with other libraries needs all three, and none of them may cost a host synchronization.
#pragma once
#include <cuda_runtime.h>

#include <deque>
#include <functional>
#include <mutex>
#include <utility>
#include <vector>

namespace retort::cuda {

class StreamMarks {
 public:
  StreamMarks(int device, cudaStream_t stream) : device_(device), stream_(stream) {}
  // Runs what is still pending: the owner drains the stream first.
  ~StreamMarks();
  StreamMarks(const StreamMarks&) = delete;
  StreamMarks& operator=(const StreamMarks&) = delete;

  // other waits for the work queued on our stream so far.
  void make_wait(cudaStream_t other);
  // Our stream's later work waits for the work queued on other so far.
  void wait_for(cudaStream_t other);
  // fn runs once the work queued on our stream so far has finished (run_finished finds it so).
  void after_queued(std::function<void()> fn);
  // Runs the releases whose work has finished, in queue order; all: the stream was drained, run every one.
  // Callable from any thread; the releases run on the caller's, outside the lock.
  void run_finished(bool all);
  // Cheap check for the hot path: whether any release waits.
  bool pending() const;

 private:
  cudaEvent_t take();  // from the pool; with mu_ held
  int device_;
  cudaStream_t stream_;
  mutable std::mutex mu_;
  std::vector<cudaEvent_t> pool_;
  std::deque<std::pair<cudaEvent_t, std::function<void()>>> releases_;
};

}  // namespace retort::cuda
