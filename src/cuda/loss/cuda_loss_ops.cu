// The loss backend's graph ops (src/ops/loss/losses.cpp) on the CUDA device. Each launcher reads its node's
// options with the CPU's loss::spec_from_slots, runs them through the one CUDA row-loss entry
// (cuda_row_loss.h, shared with the fused executor) over the node's logits, and reduces the per-row values
// on the device, so nothing waits for the host: the mean's divisor is
// counted on the device (count_valid_rows) and feeds both the loss and the gradient scale.
//
// Single pass: when the backward rule has set ip[kIpGrad], the forward also writes d(loss)/d(logits) into
// aux[kAuxGrad] (f32 [N, V]), already scaled by the reduction; the multiply by a non-unit upstream gradient
// is an ordinary graph op the rule emitted, as on the CPU.
//
// Bad data: a label or a (valid slot's) id out of range is recorded in the backend's device error record and
// reported as retort::Error at the next synchronize or read. Cross-entropy and selective log-softmax, whose
// row kernels only raise a bare flag, get a small check kernel over their labels / ids first.
//
// Layouts: the row kernels want dim-0-contiguous rows; logits (and teacher logits) with another stride are
// copied to a contiguous temporary first. Side data of the distillation kernels is read through its strides.
#include <algorithm>
#include <memory>
#include <vector>

#include "../../ops/loss/losses.h"
#include "../../ops/loss/row_loss.h"
#include "../cuda_common.cuh"
#include "cuda_row_loss.h"

namespace retort::cuda {

namespace {

using loss::kIpGrad;
using loss::kIpIgnore;
using loss::kIpReduction;
constexpr int kAuxRows = 0, kAuxLse = 1, kAuxParts = 2, kAuxGrad = 3;

// Check kernels.

__device__ __forceinline__ long long index_at(const void* p, bool i64, int64_t i) {
  return i64 ? static_cast<const long long*>(p)[i]
             : static_cast<long long>(static_cast<const int32_t*>(p)[i]);
}

// Labels [n] (contiguous): each one not ignore_index must be in [0, v).
__global__ void check_labels_kernel(const void* labels, bool i64, int64_t n, long long ignore, int64_t v,
                                    DeviceError* err, Op op) {
  RT_GRID_LOOP(i, n) {
    const long long y = index_at(labels, i64, i);
    if (y != ignore && (y < 0 || y >= v)) report_error(err, op, kErrLabelOutOfRange, y, v);
  }
}

// Ids [n] (contiguous): each must be in [0, v).
__global__ void check_ids_kernel(const void* ids, bool i64, int64_t n, int64_t v, DeviceError* err, Op op) {
  RT_GRID_LOOP(i, n) {
    const long long id = index_at(ids, i64, i);
    if (id < 0 || id >= v) report_error(err, op, kErrIdOutOfRange, id, v);
  }
}

// Inputs.

// Temporaries of one launch. Freed when the launcher returns, which is safe: the allocator hands a block out
// again only to work queued later on the same stream.
struct Scratch {
  CudaExec& ex;
  std::vector<std::unique_ptr<DeviceBuffer>> bufs;
  void* bytes(size_t n) {
    bufs.push_back(ex.temp(n));
    return bufs.back()->data();
  }
  float* floats(int64_t n) { return static_cast<float*>(bytes(sizeof(float) * size_t(n))); }
};

float* f32(const Tensor* t) {
  return t ? static_cast<float*>(t->data) : nullptr;
}

// A [rows, cols] matrix as the row kernels read it: dim-0-contiguous rows, a row stride in elements.
struct Rows {
  const void* data;
  DType dtype;
  int64_t rows, cols, stride;
};

// t's rows in place when they are dim-0-contiguous and do not overlap, else a contiguous copy (same dtype).
Rows rows_of(Scratch& s, const Tensor* t) {
  const size_t es = t->elsize();
  const int64_t rows = t->ne[1], cols = t->ne[0];
  const bool dim0 = cols == 1 || t->nb[0] == es;
  const bool apart = rows == 1 || (t->nb[1] % es == 0 && t->nb[1] >= size_t(cols) * es);
  if (dim0 && apart) return {t->data, t->dtype, rows, cols, rows == 1 ? cols : int64_t(t->nb[1] / es)};
  void* p = s.bytes(es * size_t(rows * cols));
  const int64_t ne[4] = {cols, rows, 1, 1};
  copy_elements(s.ex, contiguous_desc(p, t->dtype, ne), desc(t));
  return {p, t->dtype, rows, cols, cols};
}

// t's elements contiguous in dtype dt: t itself when it already is, else a converting copy.
const void* contiguous_as(Scratch& s, const Tensor* t, DType dt) {
  if (t->dtype == dt && t->is_contiguous()) return t->data;
  void* p = s.bytes(dtype_size(dt) * size_t(t->nelements()));
  copy_elements(s.ex, contiguous_desc(p, dt, t->ne), desc(t));
  return p;
}

// Outputs, scale and reduction.

Reduction reduction(const Tensor* node) {
  return Reduction(node->ip[kIpReduction]);
}

// Where the row kernels write: the node's outputs, or temporaries for what the reduction consumes.
struct LossOut {
  float* rows = nullptr;  // per-row loss
  float* lse = nullptr;
  float* hard = nullptr;
  float* soft = nullptr;
  void* grad = nullptr;  // [N, V] contiguous, of grad_dtype (may be the logits themselves: logits_grad)
  DType grad_dtype = DType::F32;
};

LossOut wire(Scratch& s, const Tensor* node) {
  const Tensor* x = node->src[0];
  const int64_t n = x->ne[1];
  const bool none = reduction(node) == Reduction::None;
  LossOut o;
  if (none)
    o.rows = f32(node);
  else if (node->aux[kAuxRows])
    o.rows = f32(node->aux[kAuxRows]);
  else
    o.rows = s.floats(n);
  o.lse = f32(node->aux[kAuxLse]);
  if (const Tensor* p = node->aux[kAuxParts]) {
    o.hard = none ? f32(p) : s.floats(2 * n);  // None: hard in row 0 and soft in row 1 of the [2, N] output
    o.soft = o.hard + n;
  }
  if (node->ip[kIpGrad] && node->aux[kAuxGrad]) {
    const Tensor* g = node->aux[kAuxGrad];
    RT_CHECK(is_float(g->dtype) && g->is_contiguous() && same_shape(g, x), "cuda ", op_name(node->op),
             ": the logits gradient ", g->describe(), " must be a contiguous float tensor shaped like ",
             x->describe());
    o.grad = g->data;
    o.grad_dtype = g->dtype;
  }
  return o;
}

// The reduction's factor, also the gradient's scale: 1 / (rows whose label != ignore_index) for a mean,
// counted on the device when there are labels (1 / N without); 1 for a sum or none.
struct Scale {
  float host = 1.0f;
  const float* dev = nullptr;
};

Scale scale_of(Scratch& s, const Tensor* node, const Tensor* labels, const void* contiguous_labels) {
  if (reduction(node) != Reduction::Mean) return {};
  const int64_t n = node->src[0]->ne[1];
  if (!labels) return {1.0f / float(n), nullptr};
  float* inv = s.floats(1);
  count_valid_rows(contiguous_labels, labels->dtype, n, node->ip[kIpIgnore], 1.0f, inv, nullptr, s.ex.stream);
  return {1.0f, inv};
}

RowBlock block_of(const Rows& x, const LossOut& o, const Scale& sc) {
  RowBlock b;
  b.logits = x.data;
  b.dtype = x.dtype;
  b.rows = x.rows;
  b.V = x.cols;
  b.stride = x.stride;
  b.grad = o.grad;
  b.grad_dtype = o.grad_dtype;
  b.grad_stride = x.cols;
  b.scale = sc.host;
  b.scale_dev = sc.dev;
  b.loss = o.rows;
  b.lse = o.lse;
  return b;
}

// Sums the per-row values into the node (and the parts into theirs) unless the reduction is None.
void reduce(Scratch& s, Tensor* node, const LossOut& o, const Scale& sc) {
  if (reduction(node) == Reduction::None) return;
  const int64_t n = node->src[0]->ne[1];
  sum_rows_scalar(o.rows, n, sc.dev, sc.host, f32(node), s.ex.stream);
  if (const Tensor* p = node->aux[kAuxParts]) {
    sum_rows_scalar(o.hard, n, sc.dev, sc.host, f32(p), s.ex.stream);
    sum_rows_scalar(o.soft, n, sc.dev, sc.host, f32(p) + 1, s.ex.stream);
  }
}

bool is_i64(const Tensor* t) {
  return t->dtype == DType::I64;
}

// Launchers.

loss::Block matrix(const Tensor* t) {  // [rows, cols] through its strides
  if (!t) return {};
  return {t->data, t->dtype, t->ne[1], t->ne[0], t->nb[1], t->nb[0]};
}
loss::Block column(const Tensor* t) {  // a 1-D [N] tensor as N rows of one element
  if (!t) return {};
  return {t->data, t->dtype, t->ne[0], 1, t->nb[0], t->nb[0]};
}
loss::Block dense_rows(const Rows& r) {
  const size_t es = dtype_size(r.dtype);
  return {const_cast<void*>(r.data), r.dtype, r.rows, r.cols, size_t(r.stride) * es, es};
}

// The row kernel of the node's spec (options from its slots, side data set by the caller) through the one
// CUDA row-loss entry, then the reduction.
void run(Scratch& s, Tensor* node, const loss::LossSpec& spec, const Rows& xr, const LossOut& o,
         const Scale& sc) {
  RowBlock b = block_of(xr, o, sc);
  row_loss(s.ex, spec, b, o.hard, o.soft, node->op,
           [&s](size_t n) { return s.bytes(std::max<size_t>(n, 1)); });
  reduce(s, node, o, sc);
}

void cross_entropy_loss_l(CudaExec& ex, Tensor* node) {
  const Tensor* x = node->src[0];
  const Tensor* labels = node->src[1];
  Scratch s{ex, {}};
  const Rows xr = rows_of(s, x);
  const int64_t n = xr.rows;
  const void* lab = contiguous_as(s, labels, labels->dtype);
  check_labels_kernel<<<ex.grid_for(n, kBlock), kBlock, 0, ex.stream>>>(
      lab, is_i64(labels), n, node->ip[kIpIgnore], xr.cols, ex.dev_error, node->op);
  RT_CUDA_LAUNCH_CHECK("check_labels_kernel");
  const LossOut o = wire(s, node);
  const Scale sc = scale_of(s, node, labels, lab);
  loss::LossSpec spec = loss::spec_from_slots(node, loss::LossKind::CrossEntropy);
  spec.ce.labels = loss::Block::dense(const_cast<void*>(lab), labels->dtype, n, 1);
  run(s, node, spec, xr, o, sc);
}

// Top-K distillation and its gathered form (no ids: src[1] is null).
void topk_l(CudaExec& ex, Tensor* node) {
  const Tensor* x = node->src[0];
  const Tensor* labels = node->src[4];
  RT_CHECK(node->src[2]->ne[0] <= kMaxTopKSlots, "cuda ", op_name(node->op), ": teacher_logprobs ",
           node->src[2]->describe(), " has K = ", node->src[2]->ne[0],
           " slots per row; the CUDA kernel keeps at most ", kMaxTopKSlots, " in shared memory");
  Scratch s{ex, {}};
  const Rows xr = rows_of(s, x);
  const LossOut o = wire(s, node);
  const Scale sc = scale_of(s, node, labels, labels ? contiguous_as(s, labels, labels->dtype) : nullptr);
  loss::LossSpec spec = loss::spec_from_slots(node, loss::LossKind::TopK);
  spec.topk.ids = matrix(node->src[1]);
  spec.topk.logprobs = matrix(node->src[2]);
  spec.topk.mask = matrix(node->src[3]);
  spec.topk.labels = column(labels);
  run(s, node, spec, xr, o, sc);
}

void distill_l(CudaExec& ex, Tensor* node) {
  const Tensor* x = node->src[0];
  const Tensor* labels = node->src[2];
  Scratch s{ex, {}};
  const Rows xr = rows_of(s, x);
  const Rows wr = rows_of(s, node->src[1]);
  const LossOut o = wire(s, node);
  const Scale sc = scale_of(s, node, labels, labels ? contiguous_as(s, labels, labels->dtype) : nullptr);
  loss::LossSpec spec = loss::spec_from_slots(node, loss::LossKind::Distill);
  spec.distill.teacher = dense_rows(wr);
  spec.distill.labels = column(labels);
  run(s, node, spec, xr, o, sc);
}

void entropy_l(CudaExec& ex, Tensor* node) {
  Scratch s{ex, {}};
  const Rows xr = rows_of(s, node->src[0]);
  const LossOut o = wire(s, node);
  const Scale sc = scale_of(s, node, nullptr, nullptr);
  run(s, node, loss::spec_from_slots(node, loss::LossKind::Entropy), xr, o, sc);
}

void selective_l(CudaExec& ex, Tensor* node) {
  const Tensor* ids = node->src[1];
  Scratch s{ex, {}};
  const Rows xr = rows_of(s, node->src[0]);
  const void* idp = contiguous_as(s, ids, ids->dtype);
  const int64_t k = ids->ne[0];
  RT_CHECK(node->dtype == DType::F32 && node->is_contiguous() && node->ne[0] == k && node->ne[1] == xr.rows,
           "cuda selective_log_softmax: unexpected output ", node->describe(), " for ids ", ids->describe());
  check_ids_kernel<<<ex.grid_for(xr.rows * k, kBlock), kBlock, 0, ex.stream>>>(
      idp, is_i64(ids), xr.rows * k, xr.cols, ex.dev_error, node->op);
  RT_CUDA_LAUNCH_CHECK("check_ids_kernel");
  LossOut o;
  o.lse = f32(node->aux[kAuxLse]);
  loss::LossSpec spec = loss::spec_from_slots(node, loss::LossKind::SelectiveLogSoftmax);
  spec.selective.ids = loss::Block::dense(const_cast<void*>(idp), ids->dtype, xr.rows, k);
  spec.selective.values = loss::Block::dense(node->data, DType::F32, xr.rows, k);
  RowBlock b = block_of(xr, o, Scale{});
  row_loss(ex, spec, b, nullptr, nullptr, node->op,
           [&s](size_t n) { return s.bytes(std::max<size_t>(n, 1)); });
}

// src = logits, ids, upstream gradient [N, K], the forward's lse [N]. The forward checked the ids.
void selective_back_l(CudaExec& ex, Tensor* node) {
  const Tensor* lse = node->src[3];
  Scratch s{ex, {}};
  const Rows xr = rows_of(s, node->src[0]);
  RT_CHECK(is_float(node->dtype) && node->is_contiguous() && node->ne[0] == xr.cols &&
               node->ne[1] == xr.rows && lse->dtype == DType::F32 && lse->is_contiguous(),
           "cuda selective_log_softmax_back: unexpected output ", node->describe(), " or lse ",
           lse->describe());
  LossOut o;
  o.grad = node->data;
  o.grad_dtype = node->dtype;
  loss::LossSpec spec = loss::spec_from_slots(node, loss::LossKind::SelectiveLogSoftmax);
  spec.selective.ids = matrix(node->src[1]);
  spec.selective.values = matrix(node->src[2]);
  spec.selective.lse = f32(lse);
  RowBlock b = block_of(xr, o, Scale{});
  row_loss(ex, spec, b, nullptr, nullptr, node->op,
           [&s](size_t n) { return s.bytes(std::max<size_t>(n, 1)); });
}

}  // namespace

void register_cuda_loss_graph_ops(CudaOpTable& t) {
  t[size_t(Op::CrossEntropyLoss)] = cross_entropy_loss_l;
  t[size_t(Op::TopKDistill)] = topk_l;
  t[size_t(Op::TopKKLGathered)] = topk_l;
  t[size_t(Op::Distill)] = distill_l;
  t[size_t(Op::Entropy)] = entropy_l;
  t[size_t(Op::SelectiveLogSoftmax)] = selective_l;
  t[size_t(Op::SelectiveLogSoftmaxBack)] = selective_back_l;
}

}  // namespace retort::cuda
