// What the full-vocabulary distillation kernels share: distill_full.cu (the portable kernel and the entry)
// and distill_cluster.cu (Hopper's cluster kernel).
#pragma once
#include <cuda_runtime.h>

#include "distill_common.cuh"

namespace retort::cuda::distk {

struct DistillFlags {
  bool hard_on, want_hard;
  bool vec;   // the teacher has the student's dtype and each teacher row the student row's 16-byte alignment
  bool gvec;  // the gradient rows line up with the student rows too (8-wide stores)
};

// Queues the cluster kernel on the rows and returns true when the device (Hopper), the divergence (the KL
// family), the dtypes and the row layout allow it and a cluster of its shape fits; otherwise queues nothing
// and returns false (the portable kernel then takes the rows).
bool launch_distill_cluster(const RowBlock& b, const DistillRows& o, const ErrorSink& err,
                            const DistillFlags& f, cudaStream_t s);

}  // namespace retort::cuda::distk
