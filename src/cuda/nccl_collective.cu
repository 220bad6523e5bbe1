// NCCL behind the Collective interface (src/cuda/nccl_collective.h). Calls are queued on a stream of the
// communicator's own after an event on the backend's stream, so they start when the work queued before
// them is done and overlap whatever the backend queues after; join() puts the reverse event on the
// backend's stream.
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "cuda_internal.h"
#include "nccl_collective.h"

namespace retort {

namespace {

#define RT_NCCL_CHECK(call)                                                                             \
  do {                                                                                                  \
    ncclResult_t rt_nc_ = (call);                                                                       \
    if (rt_nc_ != ncclSuccess && rt_nc_ != ncclInProgress)                                              \
      RT_FAIL("nccl: ", #call, " failed: ", ncclGetErrorString(rt_nc_), " (", ncclGetLastError(nullptr), \
              ") at ", __FILE__, ":", __LINE__);                                                        \
  } while (0)

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::BF16: return ncclBfloat16;
    default: RT_FAIL("nccl: dtype ", dtype_name(t), " is not supported (f32 or bf16)");
  }
}

class NcclCollective final : public Collective {
 public:
  NcclCollective(Backend& backend, int rank, int size, const std::vector<uint8_t>& id, double timeout_s)
      : rank_(rank), size_(size), compute_(static_cast<cudaStream_t>(backend.stream_handle())) {
    RT_CHECK(!backend.is_host() && backend.name().rfind("cuda", 0) == 0,
             "nccl: the backend must be a CUDA backend, got ", backend.name());
    RT_CHECK(id.size() == sizeof(ncclUniqueId), "nccl: unique id of ", id.size(), " bytes, expected ",
             sizeof(ncclUniqueId));
    // The communicator, its stream and events belong to the backend's device ("cuda:N").
    device_ = std::stoi(backend.name().substr(5));
    cuda::DeviceScope scope(device_);
    int lo = 0, hi = 0;
    RT_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    // High priority: a bucket's sum should start as soon as it is ready, ahead of queued backward kernels.
    RT_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, hi));
    RT_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    RT_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
    ncclUniqueId uid;
    std::memcpy(&uid, id.data(), sizeof uid);
    // Non-blocking init, polled against the deadline: a rank that never joins is an error, not a hang.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    RT_NCCL_CHECK(ncclCommInitRankConfig(&comm_, size, uid, rank, &config));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    for (;;) {
      ncclResult_t st = ncclInProgress;
      RT_NCCL_CHECK(ncclCommGetAsyncError(comm_, &st));
      if (st == ncclSuccess) break;
      if (st != ncclInProgress) RT_FAIL("nccl: communicator init failed: ", ncclGetErrorString(st));
      if (std::chrono::steady_clock::now() > deadline) {
        ncclCommAbort(comm_);
        comm_ = nullptr;
        RT_FAIL("nccl: rank ", rank, " of ", size, ": the other ranks did not join the communicator within ",
                timeout_s, " s");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  ~NcclCollective() override {
    if (comm_ && !aborted_) ncclCommDestroy(comm_);
    cudaEventDestroy(ready_);
    cudaEventDestroy(done_);
    cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "nccl"; }
  void* stream() const override { return stream_; }

  void all_reduce_sum(void* data, int64_t n, DType dtype) override {
    after_compute();
    RT_NCCL_CHECK(ncclAllReduce(data, data, size_t(n), nccl_type(dtype), ncclSum, comm_, stream_));
    settle();
  }
  void broadcast(void* data, size_t bytes, int root) override {
    after_compute();
    RT_NCCL_CHECK(ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, stream_));
    settle();
  }
  void all_gather(const void* send, void* recv, size_t bytes) override {
    after_compute();
    RT_NCCL_CHECK(ncclAllGather(send, recv, bytes, ncclUint8, comm_, stream_));
    settle();
  }
  void reduce_scatter_sum(const void* send, void* recv, int64_t n, DType dtype) override {
    after_compute();
    RT_NCCL_CHECK(ncclReduceScatter(send, recv, size_t(n), nccl_type(dtype), ncclSum, comm_, stream_));
    settle();
  }
  void abort() noexcept {
    if (!aborted_.exchange(true) && comm_) ncclCommAbort(comm_);
  }
  void join() override {
    RT_CUDA_CHECK(cudaEventRecord(done_, stream_));
    RT_CUDA_CHECK(cudaStreamWaitEvent(compute_, done_, 0));
  }

 private:
  void after_compute() {
    RT_CHECK(!aborted_, "nccl: the communicator was aborted (another rank died or hangs)");
    RT_CUDA_CHECK(cudaEventRecord(ready_, compute_));
    RT_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
  }
  // A non-blocking communicator may return before the call is enqueued; the next call must not start first.
  void settle() {
    ncclResult_t st = ncclInProgress;
    while (st == ncclInProgress) RT_NCCL_CHECK(ncclCommGetAsyncError(comm_, &st));
    RT_CHECK(st == ncclSuccess, "nccl: ", ncclGetErrorString(st), " (a peer may have failed)");
  }

  int rank_, size_, device_ = 0;
  cudaStream_t compute_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr, done_ = nullptr;
  ncclComm_t comm_ = nullptr;
  std::atomic<bool> aborted_{false};
};

}  // namespace

bool nccl_available(std::string* why_not) {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) {
    if (why_not) *why_not = "libnccl is present at build time but ncclGetVersion failed";
    return false;
  }
  return true;
}

std::vector<uint8_t> nccl_unique_id() {
  ncclUniqueId id;
  RT_NCCL_CHECK(ncclGetUniqueId(&id));
  return std::vector<uint8_t>(reinterpret_cast<uint8_t*>(&id), reinterpret_cast<uint8_t*>(&id) + sizeof id);
}

void nccl_abort(Collective& c) noexcept {
  if (auto* n = dynamic_cast<NcclCollective*>(&c)) n->abort();
}

std::unique_ptr<Collective> make_nccl_collective(Backend& backend, int rank, int size,
                                                 const std::vector<uint8_t>& id, double timeout_s) {
  return std::make_unique<NcclCollective>(backend, rank, size, id, timeout_s);
}

}  // namespace retort
