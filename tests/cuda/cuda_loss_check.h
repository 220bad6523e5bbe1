// Runs a loss case (tests/ops/test_losses_ref.h's LossCase: explicit or random inputs, a float64 reference)
// on the CPU and on CUDA from the same inputs, and checks the CUDA result three ways: against the CPU
// backend, against the float64 reference, and its gradients against central differences of the reference.
#pragma once
#include "cuda_test_util.h"
#include "test_losses_ref.h"

namespace retort::test {

struct CudaTol {
  double cpu = kCpuTol;       // outputs, CUDA vs CPU
  double cpu_grad = kCpuTol;  // gradients, CUDA vs CPU
  // Gradients against central differences of the reference (c.grad_tol); off for cases too big for it or
  // whose inputs hold -inf.
  bool finite_differences = true;
};

// The forward vs reference uses c.fwd_tol, the gradients vs central differences c.grad_tol. A case with
// unit_seed runs backward on the scalar loss itself: the single-pass path, no multiply by an upstream.
// EXPECTs inside; returns false on any failure.
bool check_cuda(const LossCase& c, const CudaTol& tol);
// The same with the case's own tolerances against the CPU (backend_tol, backend_grad_tol; against the
// reference the looser of those and fwd_tol / grad_tol) and its fd and fd_samples (none when
// finite_differences is false); a case the CUDA backend does not support (cuda_unsupported) fails here: skip
// it before.
bool check_cuda(const LossCase& c, bool finite_differences = true);

// c on two CUDA backends (say, with different CudaOptions): outputs finite and bitwise equal, every gradient
// finite and within grad_tol (nmse) of a's: GEMMs of other shapes may sum in another order. For cases whose
// results must not depend on how the backend schedules the work.
bool check_cuda_same(const LossCase& c, Backend& a, Backend& b, double grad_tol);
// Fused cross-entropy forward + backward of hidden [n, h] and weight [v, h] in dtype dt, chunk logits in
// logits_dtype, at a memory budget, on a backend of its own: the bytes its second run allocates at peak
// beyond what was in use before it (the first run makes the arena and the allocator's cache). EXPECTs a
// finite loss and weight gradient.
size_t fused_ce_peak_extra(DType dt, DType logits_dtype, size_t budget, int64_t n, int64_t h, int64_t v,
                           const std::string& seed);

}  // namespace retort::test
