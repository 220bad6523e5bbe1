// PinnedReads: asynchronous device-to-host reads through a pool of pinned buffers (pinned_reads.h).
#include "pinned_reads.h"

#include "cuda_internal.h"

namespace retort::cuda {

namespace {

class PinnedRead : public PendingRead {
 public:
  PinnedRead(std::shared_ptr<PinnedReads::Pool> pool, size_t slot, int device, std::function<void()> on_wait)
      : pool_(std::move(pool)), slot_(slot), device_(device), on_wait_(std::move(on_wait)) {}
  ~PinnedRead() override {
    if (event_) (void)cudaEventDestroy(event_);
    pool_->give_back(slot_);
  }
  void record(cudaStream_t stream) {
    RT_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
    RT_CUDA_CHECK(cudaEventRecord(event_, stream));
  }
  const void* wait() override {
    if (!landed_) {
      DeviceScope scope(device_);
      RT_CUDA_CHECK(cudaEventSynchronize(event_));
      landed_ = true;
      on_wait_();
    }
    std::lock_guard<std::mutex> lock(pool_->mu);
    return pool_->slots[slot_].p;
  }

 private:
  std::shared_ptr<PinnedReads::Pool> pool_;
  size_t slot_;
  int device_;
  std::function<void()> on_wait_;
  cudaEvent_t event_ = nullptr;
  bool landed_ = false;
};

}  // namespace

PinnedReads::Pool::~Pool() {
  for (Slot& s : slots)
    if (s.p) (void)cudaFreeHost(s.p);
}

size_t PinnedReads::Pool::take(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu);
  // The smallest free buffer that holds the bytes; else the largest free one grows; else a new one.
  size_t best = slots.size(), largest = slots.size();
  for (size_t i = 0; i < slots.size(); ++i) {
    if (slots[i].busy) continue;
    if (slots[i].size >= bytes && (best == slots.size() || slots[i].size < slots[best].size)) best = i;
    if (largest == slots.size() || slots[i].size > slots[largest].size) largest = i;
  }
  if (best == slots.size()) {
    best = largest == slots.size() ? slots.size() : largest;
    if (best == slots.size()) slots.push_back(Slot{});
    Slot& s = slots[best];
    if (s.p) RT_CUDA_CHECK(cudaFreeHost(s.p));
    s.p = nullptr;
    s.size = 0;
    RT_CUDA_CHECK(cudaMallocHost(&s.p, std::max<size_t>(bytes, 1)));
    s.size = std::max<size_t>(bytes, 1);
  }
  slots[best].busy = true;
  return best;
}

void PinnedReads::Pool::give_back(size_t slot) {
  std::lock_guard<std::mutex> lock(mu);
  slots[slot].busy = false;
}

std::unique_ptr<PendingRead> PinnedReads::queue(int device, cudaStream_t stream, const void* src, size_t bytes,
                                                std::function<void()> on_wait) {
  DeviceScope scope(device);
  const size_t slot = pool_->take(bytes);
  auto r = std::make_unique<PinnedRead>(pool_, slot, device, std::move(on_wait));
  void* dst = nullptr;
  {
    std::lock_guard<std::mutex> lock(pool_->mu);
    dst = pool_->slots[slot].p;
  }
  if (bytes > 0) RT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream));
  r->record(stream);
  return r;
}

}  // namespace retort::cuda
