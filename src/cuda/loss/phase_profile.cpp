// The fused losses' phase profiler (phase_profile.h).
#include "phase_profile.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

namespace retort::cuda {

namespace {

class PhaseProfile {
 public:
  // The profile once enable() made it, else null.
  static PhaseProfile* get() { return instance().load(std::memory_order_acquire); }
  static void enable() {
    static std::once_flag once;
    std::call_once(once, [] {
      instance().store(new PhaseProfile, std::memory_order_release);  // lives to the end: printed at exit
      std::atexit([] { get()->report(); });
    });
  }
  // Records the start of a phase on stream s; end() records its end.
  int begin(const std::string& label, cudaStream_t s) {
    std::lock_guard<std::mutex> lock(mu_);
    Rec r{label, nullptr, nullptr};
    if (cudaEventCreate(&r.a) != cudaSuccess) return -1;
    if (cudaEventRecord(r.a, s) != cudaSuccess) {
      (void)cudaEventDestroy(r.a);
      return -1;
    }
    open_[next_] = r;
    return next_++;
  }
  void end(int id, cudaStream_t s) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = open_.find(id);
    if (it == open_.end()) return;
    Rec r = it->second;
    open_.erase(it);
    if (cudaEventCreate(&r.b) != cudaSuccess || cudaEventRecord(r.b, s) != cudaSuccess) {
      (void)cudaEventDestroy(r.a);
      if (r.b) (void)cudaEventDestroy(r.b);
      return;
    }
    done_.push_back(r);
    if (done_.size() >= 4096) flush_locked();
  }

 private:
  struct Rec {
    std::string label;
    cudaEvent_t a, b;
  };
  void flush_locked() {
    for (Rec& r : done_) {
      float ms = 0.0f;
      if (cudaEventSynchronize(r.b) == cudaSuccess && cudaEventElapsedTime(&ms, r.a, r.b) == cudaSuccess)
        samples_[r.label].push_back(ms);
      (void)cudaEventDestroy(r.a);
      (void)cudaEventDestroy(r.b);
    }
    done_.clear();
  }
  void report() {
    std::lock_guard<std::mutex> lock(mu_);
    flush_locked();
    std::fprintf(
        stderr,
        "fused-loss phases (CudaOptions::chunk_profile): label, count, median us, mean us (the first calls "
        "include module loading and GEMM timing)\n");
    for (auto& [label, v] : samples_) {
      double sum = 0.0;
      for (float x : v) sum += x;
      std::nth_element(v.begin(), v.begin() + ptrdiff_t(v.size() / 2), v.end());
      std::fprintf(stderr, "  %-52s %8zu %10.1f %10.1f\n", label.c_str(), v.size(), 1e3 * v[v.size() / 2],
                   1e3 * sum / double(v.size()));
    }
  }
  static std::atomic<PhaseProfile*>& instance() {
    static std::atomic<PhaseProfile*> p{nullptr};
    return p;
  }
  std::mutex mu_;
  int next_ = 0;
  std::map<int, Rec> open_;                            // begun, not ended
  std::vector<Rec> done_;                              // both events recorded, not yet read
  std::map<std::string, std::vector<float>> samples_;  // ms per call
};

}  // namespace

void enable_phase_profile() {
  PhaseProfile::enable();
}

bool phase_profile_on() {
  return PhaseProfile::get() != nullptr;
}

int phase_begin(const std::string& label, cudaStream_t s) {
  PhaseProfile* p = PhaseProfile::get();
  return p ? p->begin(label, s) : -1;
}

void phase_end(int id, cudaStream_t s) {
  if (id >= 0) PhaseProfile::get()->end(id, s);
}

}  // namespace retort::cuda
