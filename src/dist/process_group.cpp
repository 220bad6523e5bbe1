#include "process_group.h"

#include "../core/error.h"
#include "../cuda/nccl_collective.h"

namespace retort::dist {

ProcessGroup::ProcessGroup(const World& world, Backend& backend)
    : world_(world), tcp_(std::make_unique<TcpGroup>(world)) {
  if (world.size == 1) return;
  if (backend.is_host()) {
    device_ = tcp_.get();
    return;
  }
  std::string why;
  // Every rank learns whether the others can go on before any of them starts NCCL, so a rank without NCCL
  // makes them all fail with its reason instead of leaving them waiting inside NCCL's own rendezvous.
  std::vector<int64_t> missing{nccl_available(&why) ? 0 : 1};
  tcp_->all_reduce_sum(missing);
  RT_CHECK(missing[0] == 0, "distributed: ", world.describe(), ": ", missing[0], " rank(s) cannot use NCCL",
           why.empty() ? std::string() : " (" + why + ")");
  std::vector<uint8_t> id(kNcclIdBytes);
  if (world.rank == 0) id = nccl_unique_id();
  tcp_->broadcast(id.data(), id.size(), 0);
  nccl_ = make_nccl_collective(backend, world.rank, world.size, id, world.timeout_s);
  device_ = nccl_.get();
}

ProcessGroup::~ProcessGroup() = default;

}  // namespace retort::dist
