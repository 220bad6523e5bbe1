// The bootstrap and the CPU collective: rank 0 listens at MASTER_ADDR:MASTER_PORT, every other rank connects
// to it (over any network: it is plain TCP), and the star of connections that the rendezvous leaves is then
// the transport of a Collective on host memory. Programs use it for the rendezvous and small host-side
// values (token counts, the NCCL unique id); CI uses it as the stand-in for NCCL, worlds of a few processes
// on loopback. Every wait has a deadline: a rank that dies or hangs makes the others throw within the timeout.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../core/collective.h"
#include "world.h"

namespace retort::dist {

class TcpGroup final : public Collective {
 public:
  // The rendezvous: returns once every rank of world has joined. Throws retort::Error when the port cannot
  // be bound, MASTER_ADDR does not resolve, a rank does not join within world.timeout_s, two processes claim
  // one rank, or the ranks disagree on the world size. A world of 1 opens no socket.
  explicit TcpGroup(const World& world);
  ~TcpGroup() override;
  TcpGroup(const TcpGroup&) = delete;
  TcpGroup& operator=(const TcpGroup&) = delete;

  int rank() const override { return world_.rank; }
  int size() const override { return world_.size; }
  std::string name() const override { return "tcp"; }
  const World& world() const { return world_; }

  // Host memory. Sums are taken on rank 0 in rank order and sent back, so every rank gets the same bits.
  void all_reduce_sum(void* data, int64_t n, DType dtype) override;
  void broadcast(void* data, size_t bytes, int root) override;
  void all_gather(const void* send, void* recv, size_t bytes) override;
  void reduce_scatter_sum(const void* send, void* recv, int64_t n, DType dtype) override;

  // Host-side helpers for the programs: sums of 64-bit counts and doubles, and a barrier.
  void all_reduce_sum(std::vector<int64_t>& values);
  void all_reduce_sum(std::vector<double>& values);
  void barrier();

 private:
  struct Impl;
  World world_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace retort::dist
