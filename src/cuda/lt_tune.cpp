// Choosing among cuBLASLt's algorithms by timing them (lt_tune.h).
#include "lt_tune.h"

#include <algorithm>

#include "cuda_internal.h"

namespace retort::cuda {

std::vector<LtAlgo> lt_candidates(cublasLtHandle_t lt, cublasLtMatmulDesc_t md, cublasLtMatrixLayout_t a,
                                  cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                  cublasLtMatmulPreference_t pref, int max_count) {
  std::vector<cublasLtMatmulHeuristicResult_t> h(size_t(std::max(1, max_count)));
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(lt, md, a, b, c, c, pref, int(h.size()), h.data(), &found);
  std::vector<LtAlgo> out;
  if (st != CUBLAS_STATUS_SUCCESS) return out;
  for (int i = 0; i < found; ++i)
    if (h[size_t(i)].state == CUBLAS_STATUS_SUCCESS) out.push_back(LtAlgo{h[size_t(i)].algo});
  return out;
}

namespace {
struct Events {
  std::vector<cudaEvent_t> e;
  explicit Events(size_t n) : e(n, nullptr) {
    for (cudaEvent_t& x : e) RT_CUDA_CHECK(cudaEventCreate(&x));
  }
  ~Events() {
    for (cudaEvent_t x : e)
      if (x) (void)cudaEventDestroy(x);
  }
};
}  // namespace

int lt_fastest(int n, cudaStream_t s, const std::function<void(int)>& run, int rounds, int runs,
               double margin) {
  if (n <= 1) return 0;
  // Timing waits for the device, which a CUDA Graph recording cannot: the backend then runs the graph eagerly
  // (the timing happens there) and records it at a later run.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  RT_CUDA_CHECK(cudaStreamIsCapturing(s, &capture));
  RT_CHECK(capture == cudaStreamCaptureStatusNone,
           "cuBLASLt algorithm timing: the stream's launches are being recorded as a CUDA Graph");
  rounds = std::max(1, rounds);
  runs = std::max(1, runs);
  for (int i = 0; i < n; ++i) run(i);  // warm-up (and any lazy module loading)
  // Events bracket each sample: rounds × n samples, each between events 2k and 2k + 1.
  Events ev(size_t(2 * rounds * n));
  for (int r = 0; r < rounds; ++r)
    for (int i = 0; i < n; ++i) {
      const size_t k = size_t(r * n + i);
      RT_CUDA_CHECK(cudaEventRecord(ev.e[2 * k], s));
      for (int j = 0; j < runs; ++j) run(i);
      RT_CUDA_CHECK(cudaEventRecord(ev.e[2 * k + 1], s));
    }
  RT_CUDA_CHECK(cudaEventSynchronize(ev.e.back()));
  std::vector<float> med(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    std::vector<float> t(static_cast<size_t>(rounds));
    for (int r = 0; r < rounds; ++r) {
      const size_t k = size_t(r * n + i);
      RT_CUDA_CHECK(cudaEventElapsedTime(&t[size_t(r)], ev.e[2 * k], ev.e[2 * k + 1]));
    }
    std::nth_element(t.begin(), t.begin() + rounds / 2, t.end());
    med[size_t(i)] = t[size_t(rounds / 2)];
  }
  int best = 0;
  for (int i = 1; i < n; ++i)
    if (med[size_t(i)] < med[size_t(best)]) best = i;
  return med[size_t(best)] < float(1.0 - margin) * med[0] ? best : 0;
}

}  // namespace retort::cuda
