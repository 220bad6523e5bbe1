#include "context.h"

#include <cmath>
#include <cstdint>
#include <cstring>

#include "checked.h"
#include "error.h"
#include "op_table.h"

namespace retort {

Tensor* Context::tensor(DType dtype, const Shape& shape, const std::string& name) {
  const char* what = name.empty() ? "tensor" : name.c_str();
  int64_t ne[kMaxDims];
  shape_to_ne(shape, ne, what);
  const size_t bytes = check_shape_bytes(ne, dtype, what);
  Tensor& t = tensors_.emplace_back();
  t.dtype = dtype;
  t.ctx = this;
  t.name = name;
  for (int d = 0; d < kMaxDims; ++d) t.ne[d] = ne[d];
  set_contiguous_strides(&t);
  t.buffer = backend_->alloc(bytes);
  t.data = t.buffer->data();
  backend_->fill_zero(t.data, bytes);
  return &t;
}

Tensor* Context::param(DType dtype, const Shape& shape, const std::string& name) {
  RT_CHECK(is_float(dtype), "param '", name, "': parameters must be f32, bf16 or f16, got ",
           dtype_name(dtype));
  Tensor* t = tensor(dtype, shape, name);
  t->flags |= kParam;
  return t;
}

Tensor* Context::input(DType dtype, const Shape& shape, const std::string& name) {
  Tensor* t = tensor(dtype, shape, name);
  t->flags |= kInput;
  return t;
}

namespace {

// Storage a leaf borrows: it frees nothing itself, it only keeps the real owner alive.
class ExternalBuffer : public Buffer {
 public:
  ExternalBuffer(void* data, size_t size, std::shared_ptr<void> owner) : owner_(std::move(owner)) {
    data_ = data;
    size_ = size;
  }

 private:
  std::shared_ptr<void> owner_;
};

}  // namespace

Tensor* Context::wrap(DType dtype, const Shape& shape, void* data, std::shared_ptr<void> owner,
                      const std::vector<size_t>& byte_strides, const std::string& name) {
  const char* what = name.empty() ? "wrap" : name.c_str();
  RT_CHECK(data != nullptr, what, ": cannot wrap a null address");
  int64_t ne[kMaxDims];
  shape_to_ne(shape, ne, what);
  check_shape_bytes(ne, dtype, what);
  RT_CHECK(byte_strides.empty() || byte_strides.size() == shape.size(), what, ": ", byte_strides.size(),
           " strides for a shape of ", shape.size(), " dims");
  // Kernels load elements through typed pointers: every element must be aligned to its size.
  const size_t es = dtype_size(dtype);
  RT_CHECK(reinterpret_cast<uintptr_t>(data) % es == 0, what, ": address is not aligned to ", es, " bytes");
  for (size_t s : byte_strides)
    RT_CHECK(s % es == 0, what, ": byte stride ", s, " is not a multiple of the element size ", es);
  // The record is checked before it joins the context, so a refused wrap leaves nothing behind.
  Tensor probe;
  probe.dtype = dtype;
  probe.name = name;
  for (int d = 0; d < kMaxDims; ++d) probe.ne[d] = ne[d];
  set_contiguous_strides(&probe);
  for (size_t i = 0; i < byte_strides.size(); ++i) probe.nb[byte_strides.size() - 1 - i] = byte_strides[i];
  const size_t span = probe.nbytes();
  RT_CHECK(span <= size_t(kMaxTensorBytes), what, ": strides span ", span,
           " bytes, more than the 2^48 bytes a backend can address");
  Tensor& t = tensors_.emplace_back(std::move(probe));
  t.ctx = this;
  t.data = data;
  t.buffer = std::make_shared<ExternalBuffer>(data, span, std::move(owner));
  return &t;
}

Tensor* Context::node(Op op, DType dtype, const int64_t ne[kMaxDims]) {
  // Op constructors check their operands; this catches a result shape they computed too large to hold.
  check_shape_bytes(ne, dtype, op_name(op));
  Tensor& t = tensors_.emplace_back();
  t.op = op;
  t.dtype = dtype;
  t.ctx = this;
  for (int d = 0; d < kMaxDims; ++d) t.ne[d] = ne[d];
  set_contiguous_strides(&t);
  return &t;
}

Tensor* Context::view_node(Tensor* src, const int64_t ne[kMaxDims], const size_t nb[kMaxDims],
                           size_t offset) {
  Tensor* t = node(Op::View, src->dtype, ne);
  for (int d = 0; d < kMaxDims; ++d) t->nb[d] = nb[d];
  t->src[0] = src;
  Tensor* root = src->view_src ? src->view_src : src;
  t->view_src = root;
  t->view_offs = checked_add(src->view_src ? src->view_offs : 0, offset, "view offset");
  // The view constructors keep a view inside its source; a view that escapes it is a retort bug.
  RT_ASSERT(checked_add(t->view_offs, t->nbytes(), "view span") <= root->nbytes());
  if (root->data) t->data = static_cast<char*>(root->data) + t->view_offs;
  return t;
}

namespace {

// Visits the elements in runs that are contiguous in storage, in the order of the logical (contiguous)
// index: f(first element's index, its byte offset, elements in the run). A run is a whole innermost row when
// its elements are adjacent, else one element (a row-at-a-time copy of a strided view instead of one call per
// element).
template <typename F>
void for_each_run(const Tensor* t, F&& f) {
  const bool rows = t->nb[0] == t->elsize();
  const int64_t run = rows ? t->ne[0] : 1;
  int64_t i = 0;
  for (int64_t i3 = 0; i3 < t->ne[3]; ++i3)
    for (int64_t i2 = 0; i2 < t->ne[2]; ++i2)
      for (int64_t i1 = 0; i1 < t->ne[1]; ++i1)
        for (int64_t i0 = 0; i0 < t->ne[0]; i0 += run, i += run)
          f(i, size_t(i0 * t->nb[0] + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3]), run);
}

void check_placed(const Tensor* t, const char* what) {
  RT_CHECK(t->data != nullptr, what, ": tensor ", t->describe(),
           " has no storage yet (a graph node is placed when its graph is computed)");
}

// Host copy of the bytes t spans (from its first element), read from the backend.
std::vector<uint8_t> read_span(const Tensor* t) {
  std::vector<uint8_t> span(t->nbytes());
  t->backend().read(span.data(), t->data, span.size());
  return span;
}

}  // namespace

void get_bytes(const Tensor* t, void* out, size_t n) {
  check_placed(t, "get_bytes");
  RT_CHECK(n == size_t(t->nelements()) * t->elsize(), "get_bytes: tensor ", t->describe(), " holds ",
           size_t(t->nelements()) * t->elsize(), " bytes, the buffer ", n);
  if (t->is_contiguous()) {
    t->backend().read(out, t->data, n);
    return;
  }
  const std::vector<uint8_t> bytes = get_bytes(t);
  std::memcpy(out, bytes.data(), n);
}

TensorRead::TensorRead(const Tensor* t) {
  check_placed(t, "read_later");
  bytes_ = size_t(t->nelements()) * t->elsize();
  if (t->is_contiguous()) {
    pending_ = t->backend().read_later(t->data, bytes_);
    return;
  }
  // A strided view: gathered now (a host wait); its bytes are then ready.
  struct Gathered : PendingRead {
    std::vector<uint8_t> bytes;
    const void* wait() override { return bytes.data(); }
  };
  auto g = std::make_unique<Gathered>();
  g->bytes = get_bytes(t);
  pending_ = std::move(g);
}

const void* TensorRead::wait() {
  RT_CHECK(pending_ != nullptr, "TensorRead::wait: nothing was read (a default-constructed TensorRead)");
  if (!data_) data_ = pending_->wait();
  return data_;
}

TensorRead read_later(const Tensor* t) {
  return TensorRead(t);
}

std::vector<uint8_t> get_bytes(const Tensor* t) {
  check_placed(t, "get_bytes");
  std::vector<uint8_t> out(size_t(t->nelements()) * t->elsize());
  if (t->is_contiguous()) {
    t->backend().read(out.data(), t->data, out.size());
    return out;
  }
  std::vector<uint8_t> span = read_span(t);
  const size_t es = t->elsize();
  for_each_run(t, [&](int64_t i, size_t off, int64_t n) {
    std::memcpy(out.data() + size_t(i) * es, span.data() + off, size_t(n) * es);
  });
  return out;
}

void set_bytes(Tensor* t, const void* bytes, size_t n) {
  check_placed(t, "set_bytes");
  size_t es = t->elsize();
  RT_CHECK(n == size_t(t->nelements()) * es, "set_data: tensor ", t->describe(), " holds ", t->nelements(),
           " elements (", size_t(t->nelements()) * es, " bytes), got ", n, " bytes");
  if (t->is_contiguous()) {
    t->backend().write(t->data, bytes, n);
    return;
  }
  std::vector<uint8_t> span = read_span(t);
  const uint8_t* src = static_cast<const uint8_t*>(bytes);
  for_each_run(t, [&](int64_t i, size_t off, int64_t n) {
    std::memcpy(span.data() + off, src + size_t(i) * es, size_t(n) * es);
  });
  t->backend().write(t->data, span.data(), span.size());
}

void set_data(Tensor* t, const std::vector<float>& values) {
  RT_CHECK(is_float(t->dtype), "set_data: tensor ", t->describe(),
           " is not a float tensor; use set_data_int");
  RT_CHECK(int64_t(values.size()) == t->nelements(), "set_data: tensor ", t->describe(), " holds ",
           t->nelements(), " elements, got ", values.size());
  std::vector<uint8_t> bytes(values.size() * t->elsize());
  for (size_t i = 0; i < values.size(); ++i) store_f32(bytes.data(), t->dtype, int64_t(i), values[i]);
  set_bytes(t, bytes.data(), bytes.size());
}

void set_data_int(Tensor* t, const std::vector<int64_t>& values) {
  RT_CHECK(is_int(t->dtype), "set_data_int: tensor ", t->describe(), " is not an integer tensor");
  RT_CHECK(int64_t(values.size()) == t->nelements(), "set_data_int: tensor ", t->describe(), " holds ",
           t->nelements(), " elements, got ", values.size());
  std::vector<uint8_t> bytes(values.size() * t->elsize());
  for (size_t i = 0; i < values.size(); ++i) {
    if (t->dtype == DType::I32) {
      RT_CHECK(values[i] >= INT32_MIN && values[i] <= INT32_MAX, "set_data_int: value ", values[i],
               " does not fit in i32 tensor ", t->describe());
      reinterpret_cast<int32_t*>(bytes.data())[i] = int32_t(values[i]);
    } else {
      reinterpret_cast<int64_t*>(bytes.data())[i] = values[i];
    }
  }
  set_bytes(t, bytes.data(), bytes.size());
}

void copy_data(Tensor* dst, const Tensor* src) {
  check_placed(dst, "copy_data");
  check_placed(src, "copy_data");
  RT_CHECK(dst->dtype == src->dtype && dst->nelements() == src->nelements() && dst->is_contiguous() &&
               src->is_contiguous(),
           "copy_data: ", src->describe(), " cannot be copied into ", dst->describe(),
           " (same dtype and element count, both contiguous)");
  if (&dst->backend() == &src->backend()) {
    dst->backend().copy(dst->data, src->data, dst->nbytes());
    return;
  }
  const std::vector<uint8_t> bytes = get_bytes(src);
  set_bytes(dst, bytes.data(), bytes.size());
}

std::vector<float> get_data(const Tensor* t) {
  check_placed(t, "get_data");
  std::vector<float> out(size_t(t->nelements()));
  if (t->dtype == DType::F32 && t->is_contiguous()) {  // straight into the result: no second buffer
    t->backend().read(out.data(), t->data, out.size() * sizeof(float));
    return out;
  }
  const std::vector<uint8_t> bytes = get_bytes(t);
  // One loop per dtype (the conversion inlined), not a type switch per element.
  const auto convert = [&](auto load) {
    for (size_t i = 0; i < out.size(); ++i) out[i] = load(int64_t(i));
  };
  const uint8_t* p = bytes.data();
  switch (t->dtype) {
    case DType::F32: std::memcpy(out.data(), p, bytes.size()); break;
    case DType::BF16: convert([p](int64_t i) { return load_f32(p, DType::BF16, i); }); break;
    case DType::F16: convert([p](int64_t i) { return load_f32(p, DType::F16, i); }); break;
    case DType::I32: convert([p](int64_t i) { return load_f32(p, DType::I32, i); }); break;
    case DType::I64: convert([p](int64_t i) { return load_f32(p, DType::I64, i); }); break;
  }
  return out;
}

std::vector<int64_t> get_data_int(const Tensor* t) {
  RT_CHECK(is_int(t->dtype), "get_data_int: tensor ", t->describe(), " is not an integer tensor");
  std::vector<uint8_t> bytes = get_bytes(t);
  std::vector<int64_t> out(size_t(t->nelements()));
  for (size_t i = 0; i < out.size(); ++i) out[i] = load_i64(bytes.data(), t->dtype, int64_t(i));
  return out;
}

}  // namespace retort
