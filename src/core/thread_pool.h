// A fixed pool of worker threads; the calling thread takes part in every parallel_for.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace retort {

class ThreadPool {
 public:
  // threads <= 0: all hardware threads.
  explicit ThreadPool(int threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return int(workers_.size()) + 1; }
  // Splits [0, n) into contiguous ranges of at least min_chunk and runs fn(begin, end) on them.
  // The first exception thrown by fn is rethrown here after all ranges finish.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_chunk = 1);

 private:
  void worker_loop(int index);
  void run_share(int index);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_work_, cv_done_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0, job_chunk_ = 1;
  int parts_ = 0;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::mutex run_mu_;  // one parallel_for at a time
};

}  // namespace retort
