// The CUDA backend: one stream, a caching allocator, a cuBLASLt handle, and a launcher table indexed by Op.
//
// Ordering: every device operation of a backend (copies, memsets, kernels, GEMMs) is queued on its one
// stream, so they run in the order they were issued and no event bookkeeping is needed. write() returns once
// the host bytes are staged (the caller may free them); read() and synchronize() wait for the stream.
//
// Device-side errors: kernels that meet bad data (an id or label out of range) cannot throw. They record the
// first such value in a DeviceError in device memory and carry on (skipping the bad row). Each run_nodes
// queues a copy of that record to pinned host memory and an event behind it; the next run_nodes (or
// poll_errors) that finds the event passed reads the copy without waiting, and synchronize() and read() read
// it after the stream drains. Whoever finds it set clears it and throws retort::Error naming the op and the
// value. So a bad id surfaces at a later run, synchronize() or read(), and the host never waits for it.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "../core/op_table.h"
#include "attention_sm90.h"
#include "cuda_backend.h"
#include "cuda_common.cuh"
#include "loss/phase_profile.h"
#include "loss/softmax_chunk.h"
#include "pinned_reads.h"
#include "stream_marks.h"

#ifndef RETORT_SM_ARCH
#define RETORT_SM_ARCH "?"
#endif

namespace retort {

namespace cuda {
namespace {

__global__ void probe_kernel(int* out) {
  if (out) *out = 1;
}

// CudaOptions::op_profile: each node's kernels timed with a pair of events, summed per op (and per op and
// shape), and printed to stderr as a table when the backend goes away: where a training step's time goes.
class OpProfile {
 public:
  ~OpProfile() {
    for (cudaEvent_t e : pool_) (void)cudaEventDestroy(e);
  }
  void begin(cudaStream_t s) {
    a_ = take();
    RT_CUDA_CHECK(cudaEventRecord(a_, s));
  }
  void end(cudaStream_t s, const Tensor* node) {
    cudaEvent_t b = take();
    RT_CUDA_CHECK(cudaEventRecord(b, s));
    const std::string op = op_name(node->op);
    std::string shape = op + " " + dtype_name(node->dtype) + shape_str(node->ne);
    for (int i = 0; i < 3 && node->src[size_t(i)]; ++i)
      shape += (i ? ", " : " <- ") + std::string(dtype_name(node->src[size_t(i)]->dtype)) +
               shape_str(node->src[size_t(i)]->ne);
    marks_.push_back({op, shape, a_, b});
  }
  // Drops what was counted so far (pairs still in flight are dropped at their collect).
  void restart() { by_op_.clear(), by_shape_.clear(), drop_ = marks_.size(); }
  // After a stream synchronize: the recorded pairs are complete.
  void collect() {
    for (size_t i = 0; i < marks_.size(); ++i) {
      Mark& m = marks_[i];
      float ms = 0;
      if (i >= drop_ && cudaEventElapsedTime(&ms, m.a, m.b) == cudaSuccess) {
        by_op_[m.op].add(ms);
        by_shape_[m.shape].add(ms);
      }
      pool_.push_back(m.a);
      pool_.push_back(m.b);
    }
    marks_.clear();
    drop_ = 0;
  }
  void print() const {
    double total = 0;
    for (const auto& [k, v] : by_op_) total += v.ms;
    auto table = [&](const std::map<std::string, Sum>& m, const char* title, size_t rows) {
      std::vector<std::pair<std::string, Sum>> v(m.begin(), m.end());
      std::sort(v.begin(), v.end(), [](const auto& x, const auto& y) { return x.second.ms > y.second.ms; });
      std::fprintf(stderr, "%-90s %8s %10s %6s\n", title, "calls", "ms", "%");
      for (size_t i = 0; i < v.size() && i < rows; ++i)
        std::fprintf(stderr, "%-90.90s %8lld %10.3f %6.1f\n", v[i].first.c_str(), v[i].second.calls,
                     v[i].second.ms, total > 0 ? 100.0 * v[i].second.ms / total : 0.0);
    };
    std::fprintf(stderr, "RETORT_OP_PROFILE: %.3f ms in node launches\n", total);
    table(by_op_, "op", 40);
    table(by_shape_, "op and shape", 40);
  }

 private:
  struct Mark {
    std::string op, shape;
    cudaEvent_t a, b;
  };
  struct Sum {
    long long calls = 0;
    double ms = 0;
    void add(float t) {
      ++calls;
      ms += t;
    }
  };
  cudaEvent_t take() {
    if (!pool_.empty()) {
      cudaEvent_t e = pool_.back();
      pool_.pop_back();
      return e;
    }
    cudaEvent_t e;
    RT_CUDA_CHECK(cudaEventCreate(&e));
    return e;
  }
  cudaEvent_t a_ = nullptr;
  size_t drop_ = 0;
  std::vector<Mark> marks_;
  std::vector<cudaEvent_t> pool_;
  std::map<std::string, Sum> by_op_, by_shape_;
};

const CudaOpTable& launcher_table() {
  static const CudaOpTable table = [] {
    CudaOpTable t{};
    register_cuda_view_ops(t);
    register_cuda_elementwise_ops(t);
    register_cuda_reduce_ops(t);
    register_cuda_matmul_ops(t);
    register_cuda_get_rows_ops(t);
    register_cuda_set_rows_ops(t);
    register_cuda_softmax_ops(t);
    register_cuda_norm_ops(t);
    register_cuda_loss_graph_ops(t);
    register_cuda_fused_ops(t);
    register_cuda_topk_ops(t);
    register_cuda_attention_ops(t);
    register_cuda_optim_ops(t);
    register_cuda_collective_ops(t);
    return t;
  }();
  return table;
}

std::string cuda_error_text(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ")";
}

// Whether `device` exists and can run this build's kernels; never throws.
bool device_usable(int device, std::string* why) {
  auto no = [&](const std::string& reason) {
    (void)cudaGetLastError();
    if (why) *why = reason;
    return false;
  };
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess)
    return no("no usable CUDA driver or device: cudaGetDeviceCount: " + cuda_error_text(e));
  if (n == 0) return no("no CUDA device found");
  if (device < 0 || device >= n)
    return no("device " + std::to_string(device) + " does not exist (" + std::to_string(n) + " devices)");
  int prev = -1;
  if (cudaGetDevice(&prev) != cudaSuccess) prev = -1;
  e = cudaSetDevice(device);
  if (e != cudaSuccess) return no("cudaSetDevice(" + std::to_string(device) + "): " + cuda_error_text(e));
  int major = 0, minor = 0;
  (void)cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  (void)cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  // The kernels are compiled for fixed architectures (no PTX): ask whether this device has an image of them.
  cudaFuncAttributes attr;
  e = cudaFuncGetAttributes(&attr, probe_kernel);
  if (prev >= 0 && prev != device) (void)cudaSetDevice(prev);
  if (e != cudaSuccess)
    return no("device " + std::to_string(device) + " (sm_" + std::to_string(major) + std::to_string(minor) +
              ") cannot run retort's kernels, built for sm " RETORT_SM_ARCH ": " + cuda_error_text(e));
  if (why) why->clear();
  return true;
}

// A node list's launches recorded as a CUDA Graph (CudaOptions::graphs), with the temporaries the recording
// writes (held until it is dropped).
class CudaReplay final : public Replay {
 public:
  explicit CudaReplay(std::shared_ptr<CudaAllocator> alloc) : alloc_(std::move(alloc)) {}
  ~CudaReplay() override { drop(); }
  // Forgets the recording. A replay still queued finishes first: later users of the blocks queue behind it.
  void drop() noexcept {
    if (exec) (void)cudaGraphExecDestroy(exec);
    exec = nullptr;
    alloc_->give_back(blocks);
    blocks.clear();
  }
  cudaGraphExec_t exec = nullptr;
  uint64_t signature = 0;  // of the recorded list
  uint64_t last = 0;       // of the list run before: a list is recorded when it runs a second time
  bool ran = false;
  int failures = 0;
  CudaAllocator::Blocks blocks;

 private:
  std::shared_ptr<CudaAllocator> alloc_;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, const CudaOptions& opts) {
    std::string why;
    RT_CHECK(device_usable(device, &why), "cuda backend: ", why);
    RT_CHECK(opts.gemm_workspace_bytes <= (size_t(1) << 32), "cuda backend: gemm_workspace_bytes ",
             opts.gemm_workspace_bytes, " is larger than 4 GiB");
    ex_.device = device;
    const int tune = int(opts.gemm_tune);
    RT_CHECK(tune >= 0 && tune <= 2,
             "cuda backend: gemm_tune must be GemmTune::Off, Accumulating or All, got ", tune);
    RT_CHECK(opts.softmax_pingpong >= -1 && opts.softmax_pingpong <= 1,
             "cuda backend: softmax_pingpong must be -1 (by H), 0 (off) or 1 (on), got ",
             opts.softmax_pingpong);
    ex_.opts = cuda_options_from_env(opts);
    ex_.gemm_cache->path = ex_.opts.gemm_cache;
    if (ex_.opts.op_profile) profile_ = std::make_unique<OpProfile>();
    if (ex_.opts.chunk_profile) enable_phase_profile();
    DeviceScope scope(device);
    try {
      RT_CUDA_CHECK(cudaDeviceGetAttribute(&ex_.sm_count, cudaDevAttrMultiProcessorCount, device));
      RT_CUDA_CHECK(cudaStreamCreateWithFlags(&ex_.stream, cudaStreamNonBlocking));
      RT_CUBLAS_CHECK(cublasLtCreate(&ex_.lt));
      RT_CUDA_CHECK(cudaMalloc(&ex_.dev_error, sizeof(DeviceError)));
      RT_CUDA_CHECK(cudaMemsetAsync(ex_.dev_error, 0, sizeof(DeviceError), ex_.stream));
      RT_CUDA_CHECK(cudaMallocHost(&host_error_, sizeof(DeviceError)));
      *host_error_ = DeviceError{};
      RT_CUDA_CHECK(cudaEventCreateWithFlags(&error_event_, cudaEventDisableTiming));
      marks_ = std::make_unique<StreamMarks>(device, ex_.stream);
      ex_.alloc = std::make_shared<CudaAllocator>(device);
      if (opts.gemm_workspace_bytes > 0) {
        workspace_ = std::make_unique<DeviceBuffer>(ex_.alloc, opts.gemm_workspace_bytes);
        ex_.workspace = workspace_->data();
        ex_.workspace_bytes = opts.gemm_workspace_bytes;
      }
      RT_CUDA_CHECK(cudaStreamSynchronize(ex_.stream));
    } catch (...) {
      release();
      throw;
    }
  }

  ~CudaBackend() override {
    try {
      DeviceScope scope(ex_.device);
      if (ex_.stream) (void)cudaStreamSynchronize(ex_.stream);
      marks_.reset();  // the stream drained: every pending release runs
      if (profile_) {
        profile_->collect();
        profile_->print();
        profile_.reset();
      }
      release();
    } catch (...) {  // a destructor must not throw
    }
  }

  std::string name() const override { return "cuda:" + std::to_string(ex_.device); }
  bool is_host() const override { return false; }

  std::shared_ptr<Buffer> alloc(size_t bytes) override {
    return std::make_shared<DeviceBuffer>(ex_.alloc, bytes);
  }

  void write(void* dst, const void* host_src, size_t bytes) override {
    if (bytes == 0) return;
    DeviceScope scope(ex_.device);
    // A copy from pageable memory holds the host until the device has taken it in stream order (behind the
    // queued graph) and runs at a fraction of the bus's speed; one from pinned staging returns at once.
    if (void* staged = stage_.take(bytes)) {
      std::memcpy(staged, host_src, bytes);
      RT_CUDA_CHECK(cudaMemcpyAsync(dst, staged, bytes, cudaMemcpyHostToDevice, ex_.stream));
      return;
    }
    RT_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, ex_.stream));
  }

  void read(void* host_dst, const void* src, size_t bytes) override {
    // A large read lands in pinned memory at the bus's speed and is copied out after; into pageable memory
    // the driver stages it in pieces at a fraction of that.
    if (bytes >= kPinnedReadMin && bytes <= kPinnedReadMax) {
      std::memcpy(host_dst, read_later(src, bytes)->wait(), bytes);
      return;
    }
    DeviceScope scope(ex_.device);
    if (bytes > 0) RT_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, ex_.stream));
    finish();
  }

  std::unique_ptr<PendingRead> read_later(const void* src, size_t bytes) override {
    return reads_.queue(ex_.device, ex_.stream, src, bytes, [this] {
      count_host_wait();
      poll_errors();
    });
  }

  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    DeviceScope scope(ex_.device);
    RT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, ex_.stream));
  }

  void fill_bytes(void* dst, uint8_t value, size_t bytes) override {
    if (bytes == 0) return;
    DeviceScope scope(ex_.device);
    RT_CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, ex_.stream));
  }

  void run(Tensor* node) override {
    RT_CHECK(size_t(node->op) < size_t(kOpCount), "cuda backend: node ", node->describe(), " has unknown op ",
             int(node->op));
    if (kOpKernels[size_t(node->op)] == OpKernels::Structural) return;
    CudaLauncher f = launcher_table()[size_t(node->op)];
    RT_CHECK(f != nullptr, "cuda backend: op ", op_name(node->op), " (node ", node->describe(),
             ") has no CUDA kernel");
    DeviceScope scope(ex_.device);
    if (!profile_) return f(ex_, node);
    profile_->begin(ex_.stream);
    f(ex_, node);
    profile_->end(ex_.stream, node);
  }

  bool records_launches() const override { return ex_.opts.graphs && !profile_; }

  void run_nodes(const std::vector<Tensor*>& nodes, uint64_t signature,
                 std::unique_ptr<Replay>& slot) override {
    DeviceScope scope(ex_.device);
    poll_errors();  // a fault of earlier work is this call's error, reported before more work is queued
    run_recorded(nodes, signature, slot);
    // The fault record's copy and an event behind it: a later call reads the copy once the event passed.
    RT_CUDA_CHECK(
        cudaMemcpyAsync(host_error_, ex_.dev_error, sizeof(DeviceError), cudaMemcpyDeviceToHost, ex_.stream));
    RT_CUDA_CHECK(cudaEventRecord(error_event_, ex_.stream));
    error_copy_queued_ = true;
    stage_mark_ = stage_.takes();
  }

  void poll_errors() override {
    if (marks_->pending()) marks_->run_finished(false);
    if (!error_copy_queued_) return;
    DeviceScope scope(ex_.device);
    const cudaError_t q = cudaEventQuery(error_event_);
    if (q == cudaErrorNotReady) return;
    RT_CUDA_CHECK(q);
    error_copy_queued_ = false;
    if (stage_.takes() == stage_mark_) stage_.reset();  // every staged copy was queued before the event
    report_recorded_error();
  }

  void make_wait(void* stream) override { marks_->make_wait(static_cast<cudaStream_t>(stream)); }
  void wait_for(void* stream) override { marks_->wait_for(static_cast<cudaStream_t>(stream)); }
  void after_queued(std::function<void()> release) override { marks_->after_queued(std::move(release)); }

  // run_nodes' launches: replayed from a recording, recorded at the list's second run, or eager.
  void run_recorded(const std::vector<Tensor*>& nodes, uint64_t signature, std::unique_ptr<Replay>& slot) {
    if (!records_launches()) return launch_all(nodes);
    auto* r = dynamic_cast<CudaReplay*>(slot.get());
    if (!r) {
      slot = std::make_unique<CudaReplay>(ex_.alloc);
      r = static_cast<CudaReplay*>(slot.get());
    }
    if (r->exec && r->signature == signature) {
      RT_CUDA_CHECK(cudaGraphLaunch(r->exec, ex_.stream));
      ++graph_stats_.replays;
      return;
    }
    r->drop();
    const bool again = r->ran && r->last == signature;
    r->ran = true;
    r->last = signature;
    if (again && r->failures < kMaxCaptureFailures && !tuning_pending() && capture(nodes, *r, signature)) {
      RT_CUDA_CHECK(cudaGraphLaunch(r->exec, ex_.stream));
      return;
    }
    launch_all(nodes);
  }

  CudaGraphStats graph_stats() const { return graph_stats_; }

  void synchronize() override {
    DeviceScope scope(ex_.device);
    finish();
  }

  // Other libraries (DLPack producers and consumers) order their work with ours on this stream.
  void* stream_handle() const override { return ex_.stream; }

  void dequantize_into(Tensor* dst, QuantType t, const uint8_t* host_blocks) override {
    RT_CHECK(dst != nullptr && is_float(dst->dtype) && dst->is_contiguous() && dst->data != nullptr,
             "dequantize_into: dst must be a contiguous float tensor with storage, got ",
             dst ? dst->describe() : std::string("null"));
    const QuantTraits& q = quant_traits(t);
    const int64_t n = dst->nelements();
    RT_CHECK(q.block_elems > 0 && n % q.block_elems == 0, "dequantize_into: ", dst->describe(),
             " is not whole ", q.name, " blocks");
    const size_t bytes = size_t(n / q.block_elems) * size_t(q.block_bytes);
    DeviceScope scope(ex_.device);
    DeviceBuffer raw(ex_.alloc, bytes);
    RT_CUDA_CHECK(cudaMemcpyAsync(raw.data(), host_blocks, bytes, cudaMemcpyHostToDevice, ex_.stream));
    launch_dequantize(t, raw.as<uint8_t>(), dst->dtype, dst->data, n, ex_.stream);
    // The staging block goes back to the allocator when this returns: the decode must have read it.
    finish();
  }

  CudaAllocator& allocator() { return *ex_.alloc; }
  size_t tuned_gemms() const { return ex_.lt_tuned->size(); }
  size_t cached_gemms() const { return ex_.gemm_cache->hits; }
  size_t softmax_chunks() const { return *ex_.softmax_chunks; }
  bool softmax_supported() const { return softmax_epilogue_supported(ex_.device); }
  bool hopper_attention() const { return ex_.opts.hopper_attention && attention_sm90_available(ex_.device); }

  void restart_profile() {
    if (profile_) profile_->restart();
  }

 private:
  // A list whose recording failed this often runs eagerly from then on.
  static constexpr int kMaxCaptureFailures = 3;
  // How long past LtTuned::kSettleSeconds recording waits for a timed GEMM's second timing.
  static constexpr double kSettleWaitSeconds = 10.0;

  void launch_all(const std::vector<Tensor*>& nodes) {
    for (Tensor* n : nodes)
      if (n->op != Op::View && n->op != Op::AuxOutput) run(n);
  }

  // A fused-loss GEMM timed once and due for its second timing: recording now would skip that timing.
  bool tuning_pending() const {
    const auto now = std::chrono::steady_clock::now();
    for (const LtTuned& e : *ex_.lt_tuned)
      if (!e.settled &&
          std::chrono::duration<double>(now - e.first).count() < LtTuned::kSettleSeconds + kSettleWaitSeconds)
        return true;
    return false;
  }

  // Records the launches of nodes into r; false (r unchanged but for its failure count) when a launcher
  // could not be recorded — nothing ran then, and the caller runs the list eagerly.
  bool capture(const std::vector<Tensor*>& nodes, CudaReplay& r, uint64_t signature) {
    std::string why;
    cudaGraph_t g = nullptr;
    ex_.alloc->begin_capture();
    cudaError_t e = cudaStreamBeginCapture(ex_.stream, cudaStreamCaptureModeRelaxed);
    if (e == cudaSuccess) {
      try {
        launch_all(nodes);
      } catch (const std::exception& x) {
        why = x.what();
      }
      e = cudaStreamEndCapture(ex_.stream, &g);
      if (why.empty() && e != cudaSuccess) why = "cudaStreamEndCapture: " + cuda_error_text(e);
    } else {
      why = "cudaStreamBeginCapture: " + cuda_error_text(e);
    }
    CudaAllocator::Blocks blocks = ex_.alloc->end_capture();
    cudaGraphExec_t exec = nullptr;
    if (why.empty() && g) {
      e = cudaGraphInstantiate(&exec, g, 0);
      if (e != cudaSuccess) {
        why = "cudaGraphInstantiate: " + cuda_error_text(e);
        exec = nullptr;
      }
    } else if (why.empty()) {
      why = "the capture gave no graph";
    }
    if (g) (void)cudaGraphDestroy(g);
    if (!exec) {
      (void)cudaGetLastError();
      ex_.alloc->give_back(blocks);
      ++r.failures;
      ++graph_stats_.failures;
      graph_stats_.last_failure = why;
      return false;
    }
    r.exec = exec;
    r.signature = signature;
    r.blocks = std::move(blocks);
    ++graph_stats_.captures;
    return true;
  }

  // Pinned host memory that write() stages copies through between two waits for the stream (a training
  // step's inputs): handed out front to back, reused after the next wait, when every copy from it has run.
  // Writes of more than kMaxBytes between waits (loading a model) go from pageable memory.
  class Staging {
   public:
    static constexpr size_t kMinCopy = size_t(64) << 10;  // smaller copies the driver stages itself
    static constexpr size_t kMaxBytes = size_t(256) << 20;
    ~Staging() {
      for (Block& b : blocks_) (void)cudaFreeHost(b.p);
    }
    void* take(size_t bytes) {
      if (bytes < kMinCopy) return nullptr;
      const size_t need = (bytes + 255) / 256 * 256;
      for (; cur_ < blocks_.size(); ++cur_) {
        Block& b = blocks_[cur_];
        if (b.size - b.used >= need) {
          void* p = static_cast<char*>(b.p) + b.used;
          b.used += need;
          ++takes_;
          return p;
        }
      }
      if (total_ + need > kMaxBytes) return nullptr;
      const size_t size = std::max(need, size_t(8) << 20);
      void* p = nullptr;
      if (cudaHostAlloc(&p, size, cudaHostAllocDefault) != cudaSuccess) {
        (void)cudaGetLastError();
        return nullptr;
      }
      total_ += size;
      blocks_.push_back({p, size, need});
      cur_ = blocks_.size() - 1;
      ++takes_;
      return p;
    }
    void reset() {
      for (Block& b : blocks_) b.used = 0;
      cur_ = 0;
    }
    // Copies staged so far: none since a point in the stream means every staged copy was queued before it.
    size_t takes() const { return takes_; }

   private:
    struct Block {
      void* p;
      size_t size, used;
    };
    std::vector<Block> blocks_;
    size_t cur_ = 0, total_ = 0, takes_ = 0;
  };

  CudaGraphStats graph_stats_;
  Staging stage_;
  std::unique_ptr<OpProfile> profile_;
  // Waits for the stream, then reports a device-side error if a kernel recorded one.
  void finish() {
    count_host_wait();
    RT_CUDA_CHECK(
        cudaMemcpyAsync(host_error_, ex_.dev_error, sizeof(DeviceError), cudaMemcpyDeviceToHost, ex_.stream));
    RT_CUDA_CHECK(cudaStreamSynchronize(ex_.stream));
    error_copy_queued_ = false;
    stage_.reset();  // every staged copy has landed
    if (profile_) profile_->collect();
    marks_->run_finished(true);
    report_recorded_error();
  }

  // Throws the fault in the host copy of the record, if any, and clears both copies. The copy must have
  // landed; the clearing memset is queued before any later kernel, which may then record a fault of its own.
  void report_recorded_error() {
    if (host_error_->flag == 0) return;
    DeviceError e = *host_error_;
    *host_error_ = DeviceError{};
    RT_CUDA_CHECK(cudaMemsetAsync(ex_.dev_error, 0, sizeof(DeviceError), ex_.stream));
    if (e.kind == kErrTeacherLogprob)
      RT_FAIL(
          op_name(Op(e.op)), ": teacher logprob NaN or +inf at row ", e.value, " slot ", e.bound,
          " (a valid slot needs a finite logprob; padding slots need mask 0 or logprob -inf; found on the",
          " CUDA device, reported at the next run, synchronize or read)");
    if (e.kind == kErrNotFinite)
      RT_FAIL(op_name(Op(e.op)), ": row ", e.value, " holds NaN or +inf (only finite values and -inf are",
              " allowed; found on the CUDA device, reported at the next run, synchronize or read)");
    const char* what = e.kind == kErrLabelOutOfRange ? "label " : "id ";
    const char* tail = e.kind == kErrLabelOutOfRange ? " and is not ignore_index" : "";
    RT_FAIL(op_name(Op(e.op)), ": ", what, e.value, " is outside [0, ", e.bound, ")", tail,
            " (found on the CUDA device; reported at the next run, synchronize or read)");
  }

  void release() {
    workspace_.reset();
    ex_.workspace = nullptr;
    if (ex_.lt) (void)cublasLtDestroy(ex_.lt);
    ex_.lt = nullptr;
    if (ex_.stream) (void)cudaStreamDestroy(ex_.stream);
    ex_.stream = nullptr;
    if (ex_.dev_error) (void)cudaFree(ex_.dev_error);
    ex_.dev_error = nullptr;
    if (host_error_) (void)cudaFreeHost(host_error_);
    host_error_ = nullptr;
    if (error_event_) (void)cudaEventDestroy(error_event_);
    error_event_ = nullptr;
  }

  // Reads from 1 MiB to 64 MiB go through the pool of pinned buffers.
  static constexpr size_t kPinnedReadMin = size_t(1) << 20, kPinnedReadMax = size_t(64) << 20;
  CudaExec ex_;
  DeviceError* host_error_ = nullptr;  // pinned host copy of the device record
  PinnedReads reads_;
  cudaEvent_t error_event_ = nullptr;  // behind the last copy of the record that run_nodes queued
  bool error_copy_queued_ = false;     // that copy may not have landed yet
  size_t stage_mark_ = 0;              // Staging::takes() when the event was recorded
  std::unique_ptr<StreamMarks> marks_;
  std::unique_ptr<DeviceBuffer> workspace_;
};

CudaBackend& as_cuda(Backend& b, const char* what) {
  auto* c = dynamic_cast<CudaBackend*>(&b);
  RT_CHECK(c != nullptr, what, ": backend '", b.name(), "' is not a CUDA backend");
  return *c;
}

}  // namespace
}  // namespace cuda

bool cuda_available(std::string* why_not) {
  return cuda::device_usable(0, why_not);
}

std::unique_ptr<Backend> make_cuda_backend(int device, const CudaOptions& options) {
  return std::make_unique<cuda::CudaBackend>(device, options);
}

CudaMemoryStats cuda_memory_stats(Backend& backend) {
  return cuda::as_cuda(backend, "cuda_memory_stats").allocator().stats();
}

void cuda_reset_peak(Backend& backend) {
  cuda::CudaBackend& be = cuda::as_cuda(backend, "cuda_reset_peak");
  be.allocator().reset_peak();
  be.restart_profile();
}

void cuda_empty_cache(Backend& backend) {
  cuda::as_cuda(backend, "cuda_empty_cache").allocator().empty_cache();
}

namespace {
// The value of a switch that is 0 or 1: v unchanged when the variable is unset or empty.
bool flag_from_env(const char* name, bool v) {
  const char* e = std::getenv(name);
  if (!e || !*e) return v;
  RT_CHECK((e[0] == '0' || e[0] == '1') && !e[1], "cuda backend: ", name, "=", e, " must be 0 or 1");
  return e[0] == '1' || v;
}
}  // namespace

CudaOptions cuda_options_from_env(CudaOptions o) {
  if (const char* e = std::getenv("RETORT_GEMM_TUNE"); e && *e) {
    RT_CHECK(e[0] >= '0' && e[0] <= '2' && !e[1], "cuda backend: RETORT_GEMM_TUNE=", e,
             " must be 0 (off), 1 (accumulating GEMMs) or 2 (all)");
    o.gemm_tune = GemmTune(e[0] - '0');
  }
  if (const char* e = std::getenv("RETORT_GEMM_CACHE"); e && *e) o.gemm_cache = e;
  o.op_profile = flag_from_env("RETORT_OP_PROFILE", o.op_profile);
  o.chunk_profile = flag_from_env("RETORT_CHUNK_PROFILE", o.chunk_profile);
  return o;
}

bool cuda_has_kernel(Op op) {
  RT_CHECK(size_t(op) < size_t(kOpCount), "cuda_has_kernel: op ", int(op), " is outside the op list");
  return cuda::launcher_table()[size_t(op)] != nullptr;
}

size_t cuda_tuned_gemms(Backend& backend) {
  return cuda::as_cuda(backend, "cuda_tuned_gemms").tuned_gemms();
}

size_t cuda_cached_gemms(Backend& backend) {
  return cuda::as_cuda(backend, "cuda_cached_gemms").cached_gemms();
}

CudaGraphStats cuda_graph_stats(Backend& backend) {
  return cuda::as_cuda(backend, "cuda_graph_stats").graph_stats();
}

bool cuda_hopper_attention(Backend& backend) {
  return cuda::as_cuda(backend, "cuda_hopper_attention").hopper_attention();
}

CudaSoftmaxEpilogueStats cuda_softmax_epilogue_stats(Backend& backend) {
  CudaSoftmaxEpilogueStats s;
  auto& be = cuda::as_cuda(backend, "cuda_softmax_epilogue_stats");
  s.supported = be.softmax_supported();
  s.chunks = be.softmax_chunks();
  s.fallback_rows = cuda::softmax_fallback_rows();
  return s;
}

}  // namespace retort
