// Runs a loss case (tests/ops/test_losses_ref.h's LossCase: explicit or random inputs, a float64 reference)
// on the CPU and on CUDA from the same inputs, and checks the CUDA result three ways: against the CPU
// backend, against the float64 reference, and its gradients against central differences of the reference.
#pragma once
#include "cuda_test_util.h"
#include "test_losses_ref.h"

namespace retort::test {

// CUDA against the CPU backend, on normalized MSE, for outputs and gradients alike, whatever the storage
// dtype: both backends read the same stored values and every loss output and gradient is f32, so a bf16 or
// f16 input changes nothing here. What differs is the order of the sums (the CPU in double, CUDA in f32
// trees) and the 2-ulp exp2 approximation on the device: about 1e-13 in practice.
inline constexpr double kCpuTol = 1e-9;

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
bool check_cuda(const LossCase& c, const CudaTol& tol = {});

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
