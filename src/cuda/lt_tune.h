// Choosing among cuBLASLt's algorithms by timing them. cuBLASLt's heuristic ranks its candidates by a model;
// on an H100, timed alone, its first choice is often not the fastest for the fused losses' GEMMs (a
// weight-gradient GEMM that accumulates into f32, C += Gᵀ·H over a 2,048-row chunk: 3.55 ms for the first
// candidate against 3.13 for the sixth, bench/HISTORY.md session 14). The CUDA chunk executor
// (CudaOptions::gemm_tune) and the fused benchmark's floor (--floor best) can take the fastest of the
// first few candidates, timed once per GEMM shape.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <functional>
#include <vector>

namespace retort::cuda {

// A cuBLASLt algorithm under a name of its own: nvcc's front end fails on standard containers of the unnamed
// struct cublasLtMatmulAlgo_t (an internal error in std::_Destroy).
struct LtAlgo {
  cublasLtMatmulAlgo_t algo;
};

// cuBLASLt's first (at most) max_count candidates for the matmul D = alpha·op(A)·op(B) + beta·C under pref,
// best-ranked first; empty when it has none.
std::vector<LtAlgo> lt_candidates(cublasLtHandle_t lt, cublasLtMatmulDesc_t md, cublasLtMatrixLayout_t a,
                                  cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                  cublasLtMatmulPreference_t pref, int max_count);

// The index of the fastest of n candidates. run(i) queues candidate i's matmul on stream s. Each runs once
// to warm up, then `rounds` samples of `runs` back-to-back runs go round-robin over the candidates (the
// GPU's clocks drift with its temperature and power; round-robin spreads the drift over all of them) and
// each one's median sample counts. Candidate 0 (cuBLASLt's own first choice) stays unless another is faster
// by more than `margin` (repeated timings of one GEMM vary by a few percent, so closer calls are noise).
// Waits for s; n <= 1 returns 0 without running anything.
int lt_fastest(int n, cudaStream_t s, const std::function<void(int)>& run, int rounds = 5, int runs = 3,
               double margin = 0.03);

}  // namespace retort::cuda
