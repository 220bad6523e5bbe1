// Built instead of the CUDA backend when retort is configured without CUDA.
#include "../core/error.h"
#include "cuda_backend.h"

namespace retort {

namespace {
constexpr const char* kNoCuda =
    "retort was built without CUDA (reconfigure with -Dcuda=enabled where nvcc exists)";
}

bool cuda_available(std::string* why_not) {
  if (why_not) *why_not = kNoCuda;
  return false;
}

std::unique_ptr<Backend> make_cuda_backend(int, const CudaOptions&) {
  RT_FAIL("cuda backend: ", kNoCuda);
}

CudaMemoryStats cuda_memory_stats(Backend&) {
  RT_FAIL("cuda_memory_stats: ", kNoCuda);
}
void cuda_reset_peak(Backend&) {
  RT_FAIL("cuda_reset_peak: ", kNoCuda);
}
void cuda_empty_cache(Backend&) {
  RT_FAIL("cuda_empty_cache: ", kNoCuda);
}

CudaOptions cuda_options_from_env(CudaOptions) {
  RT_FAIL("cuda_options_from_env: ", kNoCuda);
}

bool cuda_has_kernel(Op) {
  RT_FAIL("cuda_has_kernel: ", kNoCuda);
}

size_t cuda_tuned_gemms(Backend&) {
  RT_FAIL("cuda_tuned_gemms: ", kNoCuda);
}

size_t cuda_cached_gemms(Backend&) {
  RT_FAIL("cuda_cached_gemms: ", kNoCuda);
}

CudaSoftmaxEpilogueStats cuda_softmax_epilogue_stats(Backend&) {
  RT_FAIL("cuda_softmax_epilogue_stats: ", kNoCuda);
}

bool cuda_hopper_attention(Backend&) {
  RT_FAIL("cuda_hopper_attention: ", kNoCuda);
}

CudaGraphStats cuda_graph_stats(Backend&) {
  RT_FAIL("cuda_graph_stats: ", kNoCuda);
}

}  // namespace retort
