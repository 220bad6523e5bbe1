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

void check_f32_contiguous(const Tensor* t, const char* what) {
  RT_CHECK(t->dtype == DType::F32 && t->is_contiguous(), what, ": expected a contiguous f32 tensor, got ",
           t->describe());
}

}  // namespace

std::shared_ptr<Buffer> CpuBackend::alloc(size_t bytes) {
  return std::make_shared<HostBuffer>(bytes);
}
void CpuBackend::write(void* dst, const void* src, size_t bytes) {
  std::memcpy(dst, src, bytes);
}
void CpuBackend::read(void* dst, const void* src, size_t bytes) {
  std::memcpy(dst, src, bytes);
}
void CpuBackend::fill_bytes(void* dst, uint8_t value, size_t bytes) {
  std::memset(dst, value, bytes);
}

void CpuBackend::run(Tensor* node) {
  const OpInfo& info = op_info(node->op);
  RT_CHECK(info.cpu != nullptr, "cpu backend: op ", op_name(node->op), " has no CPU kernel");
  info.cpu(node, pool_);
}

void CpuBackend::adamw_update(Tensor* p, const Tensor* grad, Tensor* m, Tensor* v, const AdamWParams& o) {
  RT_CHECK(p->is_contiguous() && is_float(p->dtype), "adamw: parameter ", p->describe(),
           " must be a contiguous float tensor");
  check_f32_contiguous(grad, "adamw grad");
  check_f32_contiguous(m, "adamw m");
  check_f32_contiguous(v, "adamw v");
  const float* g = static_cast<const float*>(grad->data);
  float* mm = static_cast<float*>(m->data);
  float* vv = static_cast<float*>(v->data);
  const double bc1 = 1.0 - std::pow(double(o.beta1), double(o.step));
  const double bc2 = 1.0 - std::pow(double(o.beta2), double(o.step));
  const float step_size = float(o.lr / bc1);
  const float inv_sqrt_bc2 = float(1.0 / std::sqrt(bc2));
  const float decay = 1.0f - o.lr * o.weight_decay;
  void* pd = p->data;
  DType dt = p->dtype;
  pool_.parallel_for(
      p->nelements(),
      [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          mm[i] = o.beta1 * mm[i] + (1.0f - o.beta1) * g[i];
          vv[i] = o.beta2 * vv[i] + (1.0f - o.beta2) * g[i] * g[i];
          float w = load_f32(pd, dt, i) * decay;  // decoupled weight decay
          w -= step_size * mm[i] / (std::sqrt(vv[i]) * inv_sqrt_bc2 + o.eps);
          store_f32(pd, dt, i, w);
        }
      },
      4096);
}

void CpuBackend::sgd_update(Tensor* p, const Tensor* grad, Tensor* mom, const SgdParams& o) {
  RT_CHECK(p->is_contiguous() && is_float(p->dtype), "sgd: parameter ", p->describe(),
           " must be a contiguous float tensor");
  check_f32_contiguous(grad, "sgd grad");
  if (mom) check_f32_contiguous(mom, "sgd momentum");
  const float* g = static_cast<const float*>(grad->data);
  float* mb = mom ? static_cast<float*>(mom->data) : nullptr;
  void* pd = p->data;
  DType dt = p->dtype;
  pool_.parallel_for(
      p->nelements(),
      [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          float w = load_f32(pd, dt, i);
          float d = g[i] + o.weight_decay * w;
          if (mb) d = mb[i] = o.momentum * mb[i] + d;
          store_f32(pd, dt, i, w - o.lr * d);
        }
      },
      4096);
}

double CpuBackend::sum_squares(const Tensor* t) {
  check_f32_contiguous(t, "sum_squares");
  const float* x = static_cast<const float*>(t->data);
  double s = 0;
  for (int64_t i = 0; i < t->nelements(); ++i) s += double(x[i]) * x[i];
  return s;
}

void CpuBackend::scale(Tensor* t, float s) {
  check_f32_contiguous(t, "scale");
  float* x = static_cast<float*>(t->data);
  for (int64_t i = 0; i < t->nelements(); ++i) x[i] *= s;
}

CpuBackend& default_cpu_backend() {
  static CpuBackend backend;
  return backend;
}

}  // namespace retort
