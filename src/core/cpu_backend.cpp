#include "cpu_backend.h"

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "checked.h"
#include "error.h"
#include "op_table.h"

namespace retort {

namespace {

class HostBuffer : public Buffer {
 public:
  explicit HostBuffer(size_t bytes) {
    // Checked before the round-up below, which would wrap a size near 2^64 to 0.
    RT_CHECK(bytes <= size_t(kMaxTensorBytes), "cpu backend: cannot allocate ", bytes,
             " bytes, more than the 2^48 bytes a backend can address");
    // 64-byte alignment for vector loads; aligned_alloc needs a multiple of the alignment.
    size_t n = (bytes + 63) / 64 * 64;
    data_ = std::aligned_alloc(64, n ? n : 64);
    if (!data_) RT_FAIL("cpu backend: cannot allocate ", bytes, " bytes");
    size_ = bytes;
  }
  ~HostBuffer() override { std::free(data_); }
};

}  // namespace

std::shared_ptr<Buffer> CpuBackend::alloc(size_t bytes) {
  return std::make_shared<HostBuffer>(bytes);
}
void CpuBackend::write(void* dst, const void* src, size_t bytes) {
  std::memcpy(dst, src, bytes);
}
void CpuBackend::read(void* dst, const void* src, size_t bytes) {
  count_host_wait();  // nothing to wait for here, but counted like a device's, so CPU tests pin the count
  std::memcpy(dst, src, bytes);
}
void CpuBackend::copy(void* dst, const void* src, size_t bytes) {
  std::memmove(dst, src, bytes);
}
void CpuBackend::fill_bytes(void* dst, uint8_t value, size_t bytes) {
  std::memset(dst, value, bytes);
}

void CpuBackend::run(Tensor* node) {
  const OpInfo& info = op_info(node->op);
  RT_CHECK(info.cpu != nullptr, "cpu backend: op ", op_name(node->op), " has no CPU kernel");
  info.cpu(node, pool_);
}

CpuBackend& default_cpu_backend() {
  static CpuBackend backend;
  return backend;
}

}  // namespace retort
