// The collective interface data parallelism needs: sums and copies of buffers across the ranks of a process
// group. Core declares it so that ops (the all_reduce graph op) can call it without knowing the transport;
// src/dist implements it over TCP for the CPU and src/cuda over NCCL for the GPU.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "dtype.h"

namespace retort {

class Backend;

// Buffers are addresses on the backend the collective was made for (host memory for the TCP one, device
// memory for NCCL). Every call is made by every rank in the same order with the same sizes: that is what
// makes the ranks meet. A call is queued after the work already queued on that backend; its results are
// visible to work queued later only once join() has been called (for the CPU, which runs synchronously,
// at once). Every result is bitwise the same on every rank. A peer that dies or does not answer within the
// group's timeout makes the call throw retort::Error naming the rank.
class Collective {
 public:
  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "tcp" or "nccl", for messages and the programs' summary.
  virtual std::string name() const = 0;

  // data[i] = sum over ranks of data[i], n elements of dtype (F32 or BF16; BF16 is summed in f32 and
  // rounded once).
  virtual void all_reduce_sum(void* data, int64_t n, DType dtype) = 0;
  // Copies `bytes` bytes at data on rank root to data on every rank.
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  // recv[r * bytes .. (r+1) * bytes) = rank r's send (bytes each); recv holds size() * bytes.
  virtual void all_gather(const void* send, void* recv, size_t bytes) = 0;
  // recv (n elements) = sum over ranks of send[rank() * n .. (rank()+1) * n); send holds size() * n.
  virtual void reduce_scatter_sum(const void* send, void* recv, int64_t n, DType dtype) = 0;
  // Makes work queued on the backend from now on wait for every collective queued so far.
  virtual void join() {}
  // The native queue the calls run on (a cudaStream_t for NCCL), so work that consumes a result can queue
  // behind it without holding up the backend's own queue; nullptr when calls run synchronously.
  virtual void* stream() const { return nullptr; }
};

}  // namespace retort
