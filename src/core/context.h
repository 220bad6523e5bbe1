// A Context owns tensor records and the storage of its leaves, all on one backend. Ops add nodes to it.
#pragma once
#include <deque>
#include <memory>
#include <vector>

#include "backend.h"
#include "tensor.h"

namespace retort {

class Context {
 public:
  explicit Context(Backend& backend) : backend_(&backend) {}
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  Backend& backend() const { return *backend_; }

  // A leaf with its own zeroed storage on the backend. Throws retort::Error on a bad shape.
  Tensor* tensor(DType dtype, const Shape& shape, const std::string& name = "");
  // A trainable leaf (flag kParam).
  Tensor* param(DType dtype, const Shape& shape, const std::string& name);
  // A leaf the caller fills before each run (flag kInput).
  Tensor* input(DType dtype, const Shape& shape, const std::string& name);
  // A leaf over memory the caller owns (a host or device address on this context's backend): no copy. owner
  // is held as long as the leaf exists (e.g. a NumPy array or a DLPack capsule). byte_strides are outermost
  // first like shape (empty: contiguous). Throws retort::Error on a null address, a bad shape, or strides
  // that do not match the shape.
  Tensor* wrap(DType dtype, const Shape& shape, void* data, std::shared_ptr<void> owner,
               const std::vector<size_t>& byte_strides = {}, const std::string& name = "");
  // An unplaced graph node with contiguous strides; ne in ggml order. Used by op constructors.
  Tensor* node(Op op, DType dtype, const int64_t ne[kMaxDims]);
  // A node that aliases src's storage with the given shape and strides (used by view ops).
  Tensor* view_node(Tensor* src, const int64_t ne[kMaxDims], const size_t nb[kMaxDims], size_t offset);

  size_t size() const { return tensors_.size(); }

 private:
  Backend* backend_;
  std::deque<Tensor> tensors_;  // deque: records never move, so Tensor* stays valid
};

// Host <-> tensor data, converting between float (or int) and the tensor's dtype; honours strides.
// Throw retort::Error when the element count or dtype kind does not match.
void set_data(Tensor* t, const std::vector<float>& values);
void set_data_int(Tensor* t, const std::vector<int64_t>& values);
std::vector<float> get_data(const Tensor* t);
std::vector<int64_t> get_data_int(const Tensor* t);
// Copies src's elements into dst: the same dtype and element count, both contiguous. On one backend the copy
// stays there, queued (no host wait); across backends it goes through the host. Throws retort::Error
// otherwise.
void copy_data(Tensor* dst, const Tensor* src);
// Copies t's elements into a contiguous host byte buffer in t's dtype.
std::vector<uint8_t> get_bytes(const Tensor* t);
// The same into n bytes at out (a buffer the caller keeps across reads: no allocation, no zeroing, which for
// large results costs more than the copy). Throws retort::Error when n is not t's byte count.
void get_bytes(const Tensor* t, void* out, size_t n);
// t's bytes (its dtype, contiguous layout) on their way to the host: the copy is queued behind the work
// issued so far and the host waits only in wait(), so a caller can queue the next graph run first and use
// these bytes while the device runs it. The bytes are those t holds when the queued work up to this call
// has run. Must not outlive t's backend.
class TensorRead {
 public:
  TensorRead() = default;
  explicit TensorRead(const Tensor* t);
  // The bytes (valid while this object lives); waits for them the first time. Throws retort::Error for a
  // device fault, like get_bytes, or when nothing was read.
  const void* wait();
  size_t size() const { return bytes_; }
  bool valid() const { return pending_ != nullptr; }

 private:
  std::unique_ptr<PendingRead> pending_;
  const void* data_ = nullptr;
  size_t bytes_ = 0;
};
TensorRead read_later(const Tensor* t);
// Writes raw bytes (t's dtype, contiguous layout) into t.
void set_bytes(Tensor* t, const void* bytes, size_t n);

}  // namespace retort
