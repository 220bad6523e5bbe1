#include "thread_pool.h"

#include <algorithm>

namespace retort {

namespace {
// Set while a thread runs a share of a job: a nested parallel_for then runs inline instead of deadlocking.
thread_local bool t_in_job = false;
}  // namespace

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = std::max(1u, std::thread::hardware_concurrency());
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_work_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::run_share(int index) {
  // Part `index` of `parts_` equal shares of [0, job_n_).
  int64_t begin = job_n_ * index / parts_;
  int64_t end = job_n_ * (index + 1) / parts_;
  if (begin >= end) return;
  t_in_job = true;
  try {
    (*job_)(begin, end);
    t_in_job = false;
  } catch (...) {
    t_in_job = false;
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_) error_ = std::current_exception();
  }
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_work_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (index >= parts_) continue;  // this job has fewer parts than threads
    }
    run_share(index);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) cv_done_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_chunk) {
  if (n <= 0) return;
  min_chunk = std::max<int64_t>(1, min_chunk);
  int parts = int(std::min<int64_t>(size(), std::max<int64_t>(1, n / min_chunk)));
  if (parts <= 1 || t_in_job) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> run_lock(run_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    job_n_ = n;
    parts_ = parts;
    pending_ = parts - 1;
    error_ = nullptr;
    ++generation_;
  }
  cv_work_.notify_all();
  run_share(0);
  std::exception_ptr err;
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_done_.wait(lock, [&] { return pending_ == 0; });
    err = error_;
    job_ = nullptr;
  }
  if (err) std::rethrow_exception(err);
}

}  // namespace retort
