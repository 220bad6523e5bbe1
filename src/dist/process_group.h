// A process group: this process's place in the world, the TCP bootstrap that joined it to the others, and
// the collective its training graph uses (NCCL on a CUDA backend, the TCP group itself on the CPU). A world
// of 1 opens nothing and costs nothing.
#pragma once
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../core/backend.h"
#include "../core/collective.h"
#include "../core/tensor.h"
#include "tcp_group.h"
#include "world.h"

namespace retort::dist {

class ProcessGroup {
 public:
  // Joins the world (rendezvous at MASTER_ADDR:MASTER_PORT) and makes the collective for backend. Throws
  // retort::Error on a failed rendezvous, a world larger than 1 on a CUDA backend without NCCL (saying
  // why), or when NCCL cannot start.
  ProcessGroup(const World& world, Backend& backend);
  ~ProcessGroup();

  const World& world() const { return world_; }
  int rank() const { return world_.rank; }
  int size() const { return world_.size; }
  bool is_root() const { return world_.rank == 0; }
  // Host-side sums, broadcasts and barriers (every rank, same order).
  TcpGroup& host() { return *tcp_; }
  // The collective on the backend's memory: null in a world of 1.
  Collective* device() { return device_; }
  // "nccl" / "tcp" / "none" (world of 1).
  std::string transport() const { return device_ ? device_->name() : "none"; }

  // get_data(t), the one host wait of a training step, bounded by the world's timeout when the collective
  // runs on a GPU: a peer that died or hangs leaves NCCL's kernels waiting for it, so past the timeout the
  // communicator is aborted (which ends them) and this throws retort::Error naming `what`.
  std::vector<float> read_bounded(const Tensor* t, const std::string& what);

 private:
  void watch();
  World world_;
  std::unique_ptr<TcpGroup> tcp_;
  std::unique_ptr<Collective> nccl_;
  Collective* device_ = nullptr;
  // The watchdog (GPU collectives only): armed around a host wait, it aborts NCCL when the wait overruns.
  std::thread watchdog_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool armed_ = false, fired_ = false, quit_ = false;
  std::chrono::steady_clock::time_point deadline_;
};

}  // namespace retort::dist
