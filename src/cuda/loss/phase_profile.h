// The fused losses' phase profiler (CudaOptions::chunk_profile, RETORT_CHUNK_PROFILE=1): their phases timed
// in context by CUDA events on the stream (each GEMM by shape, each row loss by kind, and the whole op from
// the executor's birth to its death), summed per label and printed to stderr at exit. For finding where a
// fused step's time goes under sustained load, where Nsight Compute's kernel-by-kernel replay runs cooler;
// the events cost a few microseconds of host time each. Host-only header.
#pragma once
#include <cuda_runtime.h>

#include <string>

namespace retort::cuda {

// Starts a phase labelled label on stream s; returns its id, or -1 when the profile is off (or an event
// could not be made).
int phase_begin(const std::string& label, cudaStream_t s);
// Ends phase id (from phase_begin; -1 does nothing) on stream s.
void phase_end(int id, cudaStream_t s);
// Turns the profile on for the rest of the process (a CUDA backend made with CudaOptions::chunk_profile does).
void enable_phase_profile();
// Whether the profile is on.
bool phase_profile_on();

// A phase of the profile, from construction to destruction (nothing when the profile is off).
class Phase {
 public:
  // label() makes the phase's name, only when the profile is on.
  template <class Label>
  Phase(const Label& label, cudaStream_t s) : s_(s) {
    if (phase_profile_on()) id_ = phase_begin(label(), s);
  }
  ~Phase() { phase_end(id_, s_); }
  Phase(const Phase&) = delete;
  Phase& operator=(const Phase&) = delete;

 private:
  cudaStream_t s_;
  int id_ = -1;
};

}  // namespace retort::cuda
