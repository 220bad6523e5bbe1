// The backend interface: a small table of what a device must do. CPU and CUDA implement it.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "quant.h"
#include "tensor.h"

namespace retort {

// A block of backend memory; freed when the last owner lets go.
class Buffer {
 public:
  virtual ~Buffer() = default;
  void* data() const { return data_; }
  size_t size() const { return size_; }

 protected:
  void* data_ = nullptr;
  size_t size_ = 0;
};

// What a backend keeps of a node list it ran, to run it again faster (the CUDA backend: a CUDA Graph of the
// list's launches). Owned by the core Graph that ran the list; made and read only by that backend.
class Replay {
 public:
  virtual ~Replay() = default;
};

// Bytes on their way from a backend to the host (Backend::read_later).
class PendingRead {
 public:
  virtual ~PendingRead() = default;
  // Waits until the bytes have landed and returns them, valid while this object lives; reports a device fault
  // like read(). A pending read must not outlive its backend.
  virtual const void* wait() = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // True when data pointers are host addresses.
  virtual bool is_host() const = 0;
  virtual std::shared_ptr<Buffer> alloc(size_t bytes) = 0;
  virtual void write(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void read(void* host_dst, const void* src, size_t bytes) = 0;
  // Queues a copy of [src, src + bytes) into host memory the result owns, behind the work queued so far, and
  // returns at once: the caller can queue more work (even work that overwrites src) before it waits, so the
  // copy and the host's use of it overlap the device's next work. The default reads now.
  virtual std::unique_ptr<PendingRead> read_later(const void* src, size_t bytes);
  // Copies bytes between two addresses of this backend, queued after earlier work (the host does not wait
  // on a device). The default goes through the host.
  virtual void copy(void* dst, const void* src, size_t bytes);
  // Sets every byte of [dst, dst + bytes) to value.
  virtual void fill_bytes(void* dst, uint8_t value, size_t bytes) = 0;
  void fill_zero(void* dst, size_t bytes) { fill_bytes(dst, 0, bytes); }
  // Runs one node whose inputs and output are placed. Throws retort::Error if the op is not supported here.
  virtual void run(Tensor* node) = 0;
  // Runs a graph's placed nodes in order. `signature` changes whenever anything a launch reads from the host
  // changes (the nodes, their parameters, flags and addresses); a backend that records launches may replay
  // them from `replay` when the signature is one it recorded. The default runs each node.
  virtual void run_nodes(const std::vector<Tensor*>& nodes, uint64_t signature, std::unique_ptr<Replay>& replay);
  // Whether run_nodes uses its signature (computing one costs a pass over the nodes).
  virtual bool records_launches() const { return false; }
  // Waits for queued work.
  virtual void synchronize() = 0;
  // The native queue work runs on (a cudaStream_t for CUDA), so other libraries can order their work with
  // ours (DLPack's stream exchange); nullptr when the backend has none or runs synchronously.
  virtual void* stream_handle() const { return nullptr; }

  // Asynchronous backends (a GPU) queue work and return; these let callers order and report it without
  // making the host wait. A host backend has finished its work when a call returns, so they are trivial.
  //
  // Throws retort::Error for a device-side fault (an id out of range) that work already finished has
  // recorded, without waiting for the device. A device backend polls at the start of each run_nodes, so a
  // fault surfaces at a later run even when nobody synchronizes; synchronize() and read() report it always.
  virtual void poll_errors() {}
  // Makes `stream`, another queue of this device (a cudaStream_t), wait for the work queued here so far: an
  // event, not a host wait (a DLPack consumer reading our results on its stream).
  virtual void make_wait(void* stream) { (void)stream; }
  // Makes the work queued here from now on wait for the work queued so far on `stream` (a DLPack consumer
  // releasing our memory while its reads of it may still be queued).
  virtual void wait_for(void* stream) { (void)stream; }
  // Runs release once the work queued so far has finished, without making the host wait: memory another
  // library lent us goes back only when no queued kernel reads it. A device backend runs it at a later
  // run_nodes or synchronize() that finds the work done, or when it goes away; a host backend runs it now.
  virtual void after_queued(std::function<void()> release) { release(); }

  // Decodes n = dst's element count of type t (whole blocks at host_blocks) into dst, a contiguous float
  // tensor this backend holds, in dst's dtype: loading a quantized model file. The host decodes and writes;
  // a GPU copies the blocks over and decodes them there. Throws retort::Error for a type retort cannot
  // decode or a bad dst.
  virtual void dequantize_into(Tensor* dst, QuantType t, const uint8_t* host_blocks);

  // How many times the host has waited for this backend: each read() and synchronize() (on a GPU, the host
  // stops until the device has run everything queued). A training step should wait once, to read its loss;
  // the tests pin that with this count.
  uint64_t host_waits() const { return host_waits_.load(std::memory_order_relaxed); }

 protected:
  void count_host_wait() { host_waits_.fetch_add(1, std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> host_waits_{0};
};

}  // namespace retort
