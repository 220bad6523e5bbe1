#include "process_group.h"

#include "../core/context.h"
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
  watchdog_ = std::thread([this] { watch(); });
}

ProcessGroup::~ProcessGroup() {
  if (!watchdog_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    quit_ = true;
  }
  cv_.notify_all();
  watchdog_.join();
}

void ProcessGroup::watch() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!quit_) {
    if (!armed_) {
      cv_.wait(lock);
      continue;
    }
    if (cv_.wait_until(lock, deadline_) == std::cv_status::timeout && armed_ && !fired_ &&
        std::chrono::steady_clock::now() >= deadline_) {
      fired_ = true;
      nccl_abort(*nccl_);
    }
  }
}

std::vector<float> ProcessGroup::read_bounded(const Tensor* t, const std::string& what) {
  if (!watchdog_.joinable()) return get_data(t);
  {
    std::lock_guard<std::mutex> lock(mu_);
    armed_ = true;
    deadline_ = std::chrono::steady_clock::now() +
                std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                    std::chrono::duration<double>(world_.timeout_s));
  }
  cv_.notify_all();
  std::vector<float> v;
  std::string err;
  try {
    v = get_data(t);
  } catch (const Error& e) {
    err = e.what();
  }
  bool fired;
  {
    std::lock_guard<std::mutex> lock(mu_);
    armed_ = false;
    fired = fired_;
  }
  cv_.notify_all();
  RT_CHECK(!fired, "distributed: ", what, " did not finish within ", world_.timeout_s, " s on ",
           world_.describe(), ": another rank died or hangs (NCCL aborted; RETORT_DIST_TIMEOUT sets the limit)");
  RT_CHECK(err.empty(), err);
  return v;
}

}  // namespace retort::dist
