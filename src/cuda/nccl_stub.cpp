// Built instead of src/cuda/nccl_collective.cu when retort has no CUDA or NCCL was not found.
#include "../core/error.h"
#include "nccl_collective.h"
#include "retort_config.h"

namespace retort {

namespace {
constexpr const char* kNoNccl = RETORT_HAS_CUDA
                                    ? "retort was built without NCCL (nccl.h and libnccl were not found at "
                                      "build time; install NCCL, e.g. the CUDA toolkit's, and reconfigure)"
                                    : "retort was built without CUDA, so without NCCL";
}

bool nccl_available(std::string* why_not) {
  if (why_not) *why_not = kNoNccl;
  return false;
}

std::vector<uint8_t> nccl_unique_id() {
  RT_FAIL("nccl: ", kNoNccl);
}

std::unique_ptr<Collective> make_nccl_collective(Backend&, int, int, const std::vector<uint8_t>&, double) {
  RT_FAIL("multi-GPU data parallelism needs NCCL: ", kNoNccl);
}

void nccl_abort(Collective&) noexcept {}

}  // namespace retort
