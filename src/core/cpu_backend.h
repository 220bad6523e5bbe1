// The CPU backend: host memory, kernels from the op table, a thread pool (all cores by default).
#pragma once
#include "backend.h"
#include "thread_pool.h"

namespace retort {

class CpuBackend : public Backend {
 public:
  // threads <= 0: all hardware threads.
  explicit CpuBackend(int threads = 0) : pool_(threads) {}
  std::string name() const override { return "cpu"; }
  bool is_host() const override { return true; }
  std::shared_ptr<Buffer> alloc(size_t bytes) override;
  void write(void* dst, const void* host_src, size_t bytes) override;
  void read(void* host_dst, const void* src, size_t bytes) override;
  void copy(void* dst, const void* src, size_t bytes) override;
  void fill_bytes(void* dst, uint8_t value, size_t bytes) override;
  void run(Tensor* node) override;
  void synchronize() override { count_host_wait(); }

  int threads() const { return pool_.size(); }
  ThreadPool& pool() { return pool_; }

 private:
  ThreadPool pool_;
};

// A process-wide CPU backend with all cores, for callers that do not need their own.
CpuBackend& default_cpu_backend();

}  // namespace retort
