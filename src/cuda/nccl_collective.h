// NCCL as a Collective for the CUDA backend: one communicator per process (one GPU each), its calls on a
// stream of their own so gradient sums overlap the backward kernels still queued on the compute stream.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../core/backend.h"
#include "../core/collective.h"

namespace retort {

inline constexpr size_t kNcclIdBytes = 128;  // sizeof(ncclUniqueId)

// Whether this build has NCCL; why not otherwise (no CUDA, or nccl.h / libnccl not found at build time).
bool nccl_available(std::string* why_not = nullptr);
// A fresh unique id (rank 0 makes it, the bootstrap hands it to the others). Throws retort::Error without
// NCCL.
std::vector<uint8_t> nccl_unique_id();
// Joins the communicator `id` as rank of size on the device of backend (a CUDA backend). Throws
// retort::Error without NCCL, on a backend that is not CUDA, a bad id, or when NCCL fails or the others do
// not join within timeout_s.
std::unique_ptr<Collective> make_nccl_collective(Backend& backend, int rank, int size,
                                                 const std::vector<uint8_t>& id, double timeout_s);
// Aborts c (made by make_nccl_collective) from any thread: its pending calls end, later ones fail. What a
// watchdog does when a peer stops answering. Never throws.
void nccl_abort(Collective& c) noexcept;

}  // namespace retort
