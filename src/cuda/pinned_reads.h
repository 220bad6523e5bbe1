// Device-to-host reads that the host does not wait for when it queues them (Backend::read_later): a copy into
// pinned memory from a pool and an event behind it. The pool keeps its buffers across reads, because pinning
// memory costs far more than the copy of a batch's results.
#pragma once
#include <cuda_runtime.h>

#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "../core/backend.h"

namespace retort::cuda {

class PinnedReads {
 public:
  PinnedReads() : pool_(std::make_shared<Pool>()) {}
  // Queues the copy on stream (of device) and returns its handle; on_wait runs after the bytes landed (the
  // backend counts the wait and reports a device fault recorded by the work before the copy).
  std::unique_ptr<PendingRead> queue(int device, cudaStream_t stream, const void* src, size_t bytes,
                                     std::function<void()> on_wait);

  struct Pool {
    struct Slot {
      void* p = nullptr;
      size_t size = 0;
      bool busy = false;
    };
    std::mutex mu;
    std::vector<Slot> slots;
    ~Pool();
    size_t take(size_t bytes);  // a free slot of at least bytes (grown or added as needed)
    void give_back(size_t slot);
  };

 private:
  std::shared_ptr<Pool> pool_;  // shared with the handles, which may go after the backend's last read
};

}  // namespace retort::cuda
