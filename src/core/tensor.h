// The tensor record: dtype, up to 4 dims in ggml order (ne[0] innermost), byte strides, and for graph nodes
// the op, its parameters and sources. Storage is a backend buffer (leaves) or a slot the planner assigns
// (nodes).
#pragma once
#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "dtype.h"
#include "op.h"

namespace retort {

class Backend;
class Buffer;
class Context;

inline constexpr int kMaxDims = 4;
inline constexpr int kMaxSrc = 10;
inline constexpr int kMaxParams = 12;

// Shapes in the public API are written outermost first, like NumPy: {rows, cols}.
using Shape = std::vector<int64_t>;

enum TensorFlags : uint32_t {
  kParam = 1u << 0,   // trainable: backward() gives it a gradient accumulator
  kInput = 1u << 1,   // filled by the caller before each run
  kOutput = 1u << 2,  // read by the caller after a run: the planner never reuses its memory
  kLoss = 1u << 3,    // the graph's loss (set by backward)
  // On a gradient output that an op adds straight into a parameter's accumulator (OpInfo::accumulate_aux):
  // set by Graph::compute for the first run after zero_grad(), when the accumulator is logically zero but was
  // not cleared, so the op must overwrite every element instead of adding.
  kFresh = 1u << 4,
};

struct Tensor {
  DType dtype = DType::F32;
  int64_t ne[kMaxDims] = {1, 1, 1, 1};  // elements per dim, ne[0] innermost
  size_t nb[kMaxDims] = {0, 0, 0, 0};   // byte strides

  Op op = Op::None;
  std::array<Tensor*, kMaxSrc> src{};
  std::array<int64_t, kMaxParams> ip{};  // integer op parameters
  std::array<float, kMaxParams> fp{};    // float op parameters
  uint32_t flags = 0;
  // Extra outputs this node writes (each an Op::AuxOutput node whose src[0] is this node).
  std::array<Tensor*, 4> aux{};

  // Views alias view_src (never itself a view) at byte offset view_offs.
  Tensor* view_src = nullptr;
  size_t view_offs = 0;

  void* data = nullptr;            // host or device address, set for leaves at creation, for nodes at run
  std::shared_ptr<Buffer> buffer;  // owning storage of a leaf
  Context* ctx = nullptr;
  std::string name;

  // Queries.
  // Counts and sizes are computed with overflow checks: a tensor whose shape does not fit throws
  // retort::Error.
  int64_t nelements() const;
  int64_t nrows() const;
  size_t elsize() const { return dtype_size(dtype); }
  size_t nbytes() const;  // bytes spanned by the elements, from the first to past the last
  int n_dims() const;     // 1 + index of the outermost dim with ne > 1 (at least 1)
  Shape shape() const;    // outermost first, n_dims() entries
  bool is_contiguous() const;
  bool is_leaf() const { return op == Op::None; }
  bool is_view() const { return op == Op::View || writes_into_src0(op); }
  bool has(TensorFlags f) const { return (flags & f) != 0; }
  Backend& backend() const;
  // "name f32[4, 8]" for error messages.
  std::string describe() const;
  // Address of element (i0, i1, i2, i3).
  void* ptr(int64_t i0, int64_t i1 = 0, int64_t i2 = 0, int64_t i3 = 0) const {
    return static_cast<char*>(data) + i0 * nb[0] + i1 * nb[1] + i2 * nb[2] + i3 * nb[3];
  }
};

// A node Graph::backward pointed at an accumulator's storage (view_src) that is neither a view nor an op
// writing into src[0]: a fused loss's gradient output, or a matmul adding into a parameter's gradient.
inline bool writes_accumulator(const Tensor* t) {
  return t->view_src && t->op != Op::View && !writes_into_src0(t->op);
}

// A node that can take a third operand src[2] (shaped like its result) and give its result + src[2]: a 2-D
// matmul (its GEMM's C) or an embedding's scatter (get_rows_back, its base). Graph::backward gives it one in
// place of a sum of gradients. The result adds no src[2] in a run that overwrites its accumulator (kFresh).
inline bool takes_addend(const Tensor* t) {
  return (t->op == Op::Matmul || t->op == Op::GetRowsBack) && !t->src[2] && !t->view_src && t->ne[2] == 1 &&
         t->ne[3] == 1 && t->is_contiguous();
}

// Shape helpers shared by the op constructors.
bool same_shape(const Tensor* a, const Tensor* b);
// True when b can be broadcast over a (each dim of b is 1 or equal to a's).
bool can_broadcast(const Tensor* b, const Tensor* a);
std::string shape_str(const int64_t ne[kMaxDims]);  // "[rows, cols]" outermost first
// Fills ne (ggml order) from a public shape; throws if it has more than 4 dims, a size < 1, or more elements
// than fit in int64.
void shape_to_ne(const Shape& shape, int64_t ne[kMaxDims], const char* what);
// Elements of ne; throws retort::Error naming `what` and the shape when a dim is < 1 or the count overflows.
int64_t shape_nelements(const int64_t ne[kMaxDims], const char* what);
// Bytes of a contiguous tensor of shape ne and dtype; throws naming `what` and the shape when it is larger
// than a backend can address (kMaxTensorBytes) or a dim is < 1. Every tensor and graph node is checked with
// it when made, so later size arithmetic on a tensor cannot overflow.
size_t check_shape_bytes(const int64_t ne[kMaxDims], DType dtype, const char* what);
void set_contiguous_strides(Tensor* t);

}  // namespace retort
