#include "tensor.h"

#include "checked.h"
#include "context.h"
#include "error.h"

namespace retort {

int64_t Tensor::nelements() const {
  return shape_nelements(ne, "tensor");
}

int64_t Tensor::nrows() const {
  const int64_t rows[kMaxDims] = {1, ne[1], ne[2], ne[3]};
  return shape_nelements(rows, "tensor");
}

size_t Tensor::nbytes() const {
  size_t n = elsize(), step;
  for (int d = 0; d < kMaxDims; ++d)
    if (ne[d] < 1 || __builtin_mul_overflow(size_t(ne[d] - 1), nb[d], &step) ||
        __builtin_add_overflow(n, step, &n)) [[unlikely]]
      RT_FAIL("tensor ", describe(), ": the bytes its strides span overflow (dim ", d, ")");
  return n;
}

int64_t shape_nelements(const int64_t ne[kMaxDims], const char* what) {
  int64_t n = 1;
  for (int d = 0; d < kMaxDims; ++d) {
    if (ne[d] < 1 || __builtin_mul_overflow(n, ne[d], &n)) [[unlikely]]
      RT_FAIL(what, ": shape ", shape_str(ne), " has a dim < 1 or more elements than fit in int64");
  }
  return n;
}

size_t check_shape_bytes(const int64_t ne[kMaxDims], DType dtype, const char* what) {
  const int64_t n = shape_nelements(ne, what);
  int64_t bytes;
  if (__builtin_mul_overflow(n, int64_t(dtype_size(dtype)), &bytes) || bytes > kMaxTensorBytes) [[unlikely]]
    RT_FAIL(what, ": shape ", shape_str(ne), " of ", dtype_name(dtype), " needs ", n, " elements of ",
            dtype_size(dtype), " bytes, more than the ", kMaxTensorBytes,
            " bytes (2^48) a backend can address");
  return size_t(bytes);
}

int Tensor::n_dims() const {
  for (int d = kMaxDims - 1; d > 0; --d)
    if (ne[d] > 1) return d + 1;
  return 1;
}

Shape Tensor::shape() const {
  Shape s;
  for (int d = n_dims() - 1; d >= 0; --d) s.push_back(ne[d]);
  return s;
}

bool Tensor::is_contiguous() const {
  size_t expect = elsize();
  for (int d = 0; d < kMaxDims; ++d) {
    if (ne[d] != 1 && nb[d] != expect) return false;
    expect *= size_t(ne[d]);
  }
  return true;
}

Backend& Tensor::backend() const {
  RT_ASSERT(ctx != nullptr);
  return ctx->backend();
}

// Plain string appends, not a stream: ops describe their operands on every run (the loss ops' error context),
// and a stream's locale setup costs more than the formatting.
std::string shape_str(const int64_t ne[kMaxDims]) {
  int n = 1;
  for (int d = kMaxDims - 1; d > 0; --d)
    if (ne[d] > 1) {
      n = d + 1;
      break;
    }
  std::string s = "[";
  for (int d = n - 1; d >= 0; --d) {
    s += std::to_string(ne[d]);
    if (d) s += ", ";
  }
  return s + "]";
}

std::string Tensor::describe() const {
  std::string s;
  if (!name.empty()) s = "'" + name + "' ";
  return s + dtype_name(dtype) + shape_str(ne);
}

bool same_shape(const Tensor* a, const Tensor* b) {
  for (int d = 0; d < kMaxDims; ++d)
    if (a->ne[d] != b->ne[d]) return false;
  return true;
}

bool can_broadcast(const Tensor* b, const Tensor* a) {
  for (int d = 0; d < kMaxDims; ++d)
    if (b->ne[d] != 1 && b->ne[d] != a->ne[d]) return false;
  return true;
}

void shape_to_ne(const Shape& shape, int64_t ne[kMaxDims], const char* what) {
  RT_CHECK(!shape.empty() && shape.size() <= size_t(kMaxDims), what, ": a shape needs 1 to 4 dims, got ",
           shape.size());
  for (int d = 0; d < kMaxDims; ++d) ne[d] = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    int64_t v = shape[shape.size() - 1 - i];
    RT_CHECK(v >= 1, what, ": every dim must be >= 1, got ", v, " at position ", shape.size() - 1 - i);
    ne[i] = v;
  }
  shape_nelements(ne, what);
}

void set_contiguous_strides(Tensor* t) {
  t->nb[0] = t->elsize();
  for (int d = 1; d < kMaxDims; ++d) t->nb[d] = t->nb[d - 1] * size_t(t->ne[d - 1]);
}

}  // namespace retort
