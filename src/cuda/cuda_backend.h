// The CUDA backend: device buffers, a stream, cuBLAS(Lt) GEMMs and kernels. Available when retort was built with
// CUDA (RETORT_HAS_CUDA) and a device is present.
#pragma once
#include <memory>
#include <string>

#include "../core/backend.h"

namespace retort {

// True when retort was built with CUDA and at least one device is usable; why_not gets the reason otherwise.
bool cuda_available(std::string* why_not = nullptr);
// A backend on the given device. Throws retort::Error when CUDA is unavailable (the message says why).
std::unique_ptr<Backend> make_cuda_backend(int device = 0);

}  // namespace retort
