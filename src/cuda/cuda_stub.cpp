// Built instead of the CUDA backend when retort is configured without CUDA.
#include "../core/error.h"
#include "cuda_backend.h"

namespace retort {

bool cuda_available(std::string* why_not) {
  if (why_not) *why_not = "retort was built without CUDA (reconfigure with -Dcuda=enabled where nvcc exists)";
  return false;
}

std::unique_ptr<Backend> make_cuda_backend(int) {
  RT_FAIL("cuda backend: retort was built without CUDA (reconfigure with -Dcuda=enabled where nvcc exists)");
}

}  // namespace retort
