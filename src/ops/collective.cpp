#include "collective_ops.h"

#include <algorithm>
#include <cstring>

#include "../core/checked.h"
#include "../core/error.h"
#include "../core/op_table.h"

namespace retort {

Tensor* all_reduce_op(Context& ctx, Collective& comm, const std::vector<Tensor*>& tensors, Tensor* weight,
                      Tensor* after, DType wire, bool join) {
  RT_CHECK(!tensors.empty() && tensors.size() <= size_t(kAllReduceMaxTensors), "all_reduce: ", tensors.size(),
           " tensors given, expected 1 to ", kAllReduceMaxTensors);
  RT_CHECK(wire == DType::F32 || wire == DType::BF16, "all_reduce: wire dtype ", dtype_name(wire),
           " (f32 or bf16 expected)");
  int64_t total = 0;
  for (Tensor* t : tensors) {
    RT_CHECK(t && t->dtype == DType::F32 && t->is_contiguous(), "all_reduce: ",
             t ? t->describe() : std::string("null"), " must be a contiguous f32 tensor");
    RT_CHECK(&t->backend() == &ctx.backend(), "all_reduce: ", t->describe(), " lives on ",
             t->backend().name(), ", the graph on ", ctx.backend().name());
    total = checked_add(total, t->nelements(), "all_reduce");
  }
  RT_CHECK(!weight || (weight->is_leaf() && weight->dtype == DType::F32 && weight->nelements() == 1),
           "all_reduce: the weight must be an f32 leaf of one element, got ", weight->describe());
  RT_CHECK(!after || after->op == Op::AllReduce, "all_reduce: `after` must be an all_reduce node, got ",
           after->describe());
  // One f32 tensor with nothing to scale is summed where it lies; the others are packed into one buffer.
  const bool in_place = tensors.size() == 1 && wire == DType::F32 && !weight;
  Tensor* staging = in_place ? nullptr : ctx.tensor(wire, {total}, "all_reduce.staging");
  Tensor* n = ctx.node(Op::AllReduce, DType::F32, tensors[0]->ne);
  n->src[0] = tensors[0];
  n->src[1] = weight;
  n->src[2] = after;
  n->src[3] = staging;
  for (size_t i = 1; i < tensors.size(); ++i) n->src[3 + i] = tensors[i];
  n->ip[0] = static_cast<int64_t>(reinterpret_cast<intptr_t>(&comm));
  n->ip[1] = join ? 1 : 0;
  n->ip[2] = int64_t(wire);
  return n;
}

Tensor* all_gather_op(Context& ctx, Collective& comm, const std::vector<Tensor*>& tensors, Tensor* staging,
                      int64_t slice, Tensor* after) {
  RT_CHECK(!tensors.empty() && tensors.size() <= size_t(kAllReduceMaxTensors), "all_gather: ", tensors.size(),
           " tensors given, expected 1 to ", kAllReduceMaxTensors);
  int64_t total = 0;
  for (Tensor* t : tensors) {
    RT_CHECK(t && t->is_leaf() && t->dtype == DType::F32 && t->is_contiguous(), "all_gather: ",
             t ? t->describe() : std::string("null"), " must be a contiguous f32 leaf");
    RT_CHECK(&t->backend() == &ctx.backend(), "all_gather: ", t->describe(), " lives on ",
             t->backend().name(), ", the graph on ", ctx.backend().name());
    total = checked_add(total, t->nelements(), "all_gather");
  }
  const int64_t need = checked_mul(slice, int64_t(comm.size()), "all_gather");
  RT_CHECK(slice >= 1 && need >= total, "all_gather: ", comm.size(), " slices of ", slice,
           " elements do not cover the tensors' ", total);
  RT_CHECK(staging && staging->is_leaf() && staging->dtype == DType::F32 && staging->nelements() >= need,
           "all_gather: the staging must be an f32 leaf of at least ", need, " elements, got ",
           staging ? staging->describe() : std::string("null"));
  Tensor* n = ctx.node(Op::AllReduce, DType::F32, tensors[0]->ne);
  n->src[0] = tensors[0];
  n->src[2] = after;
  n->src[3] = staging;
  for (size_t i = 1; i < tensors.size(); ++i) n->src[3 + i] = tensors[i];
  n->ip[0] = static_cast<int64_t>(reinterpret_cast<intptr_t>(&comm));
  n->ip[1] = 1;
  n->ip[2] = int64_t(DType::F32);
  n->ip[3] = kAllGatherMode;
  n->ip[4] = slice;
  n->ip[5] = total;
  return n;
}

Tensor* gather_rows_op(Context& ctx, Collective& comm, Tensor* rows, Tensor* ids, Tensor* after) {
  RT_CHECK(rows && ids, "gather_rows: null rows or ids");
  RT_CHECK(rows->dtype == DType::F32 && rows->is_contiguous(), "gather_rows: rows ", rows->describe(),
           " must be a contiguous f32 tensor");
  const int64_t d = rows->ne[0], n = rows->nrows();
  RT_CHECK(ids->dtype == DType::I32 && ids->is_contiguous() && ids->nelements() == n, "gather_rows: ids ",
           ids->describe(), " must be contiguous i32 with one id per row of ", rows->describe());
  for (const Tensor* t : {rows, ids})
    RT_CHECK(&t->backend() == &ctx.backend(), "gather_rows: ", t->describe(), " lives on ",
             t->backend().name(), ", the graph on ", ctx.backend().name());
  RT_CHECK(!after || after->op == Op::AllReduce, "gather_rows: `after` must be an all_reduce node, got ",
           after->describe());
  const int64_t all = checked_mul(n, int64_t(comm.size()), "gather_rows");
  checked_mul(all, d, "gather_rows");
  Tensor* out = ctx.tensor(DType::F32, {all, d}, "gather_rows.rows");
  Tensor* out_ids = ctx.tensor(DType::I32, {all}, "gather_rows.ids");
  Tensor* node = ctx.node(Op::AllReduce, DType::F32, out->ne);
  node->src[0] = out;
  node->src[2] = after;
  node->src[3] = out_ids;
  node->src[4] = rows;
  node->src[5] = ids;
  node->ip[0] = static_cast<int64_t>(reinterpret_cast<intptr_t>(&comm));
  node->ip[1] = 1;
  node->ip[2] = int64_t(DType::F32);
  node->ip[3] = kGatherRowsMode;
  return node;
}

namespace {

// Row-gather mode: this rank's rows and ids gathered from where they lie.
void cpu_gather_rows(Tensor* node) {
  Collective& comm = all_reduce_comm(node);
  const Tensor* rows = node->src[4];
  const Tensor* ids = node->src[5];
  comm.all_gather(rows->data, node->src[0]->data, rows->nbytes());
  comm.all_gather(ids->data, node->src[3]->data, ids->nbytes());
}

// Gather mode: this rank's slice of the tensors' run into staging, gathered in place, unpacked everywhere.
void cpu_all_gather(Tensor* node) {
  Collective& comm = all_reduce_comm(node);
  float* staging = static_cast<float*>(node->src[3]->data);
  const int64_t slice = node->ip[4], total = node->ip[5], lo = comm.rank() * slice;
  std::vector<const Tensor*> ts;
  for (int i = 0; i < kMaxSrc; ++i)
    if ((i == 0 || i > 3) && node->src[i]) ts.push_back(node->src[i]);
  int64_t at = 0;
  for (const Tensor* t : ts) {
    const float* x = static_cast<const float*>(t->data);
    for (int64_t j = 0; j < t->nelements(); ++j)
      if (at + j >= lo && at + j < lo + slice) staging[at + j] = x[j];
    at += t->nelements();
  }
  for (int64_t j = std::max(total, lo); j < lo + slice; ++j) staging[j] = 0.0f;  // the padding of the last
  comm.all_gather(staging + lo, staging, size_t(slice) * sizeof(float));
  at = 0;
  for (const Tensor* t : ts) {
    std::memcpy(t->data, staging + at, size_t(t->nelements()) * sizeof(float));
    at += t->nelements();
  }
}

void cpu_all_reduce(Tensor* node, ThreadPool&) {
  if (node->ip[3] == kAllGatherMode) return cpu_all_gather(node);
  if (node->ip[3] == kGatherRowsMode) return cpu_gather_rows(node);
  Collective& comm = all_reduce_comm(node);
  Tensor* staging = node->src[3];
  if (!staging) return comm.all_reduce_sum(node->src[0]->data, node->src[0]->nelements(), DType::F32);
  const DType wire = staging->dtype;
  const float w = node->src[1] ? *static_cast<const float*>(node->src[1]->data) : 1.0f;
  int64_t at = 0;
  for (int i = 0; i < kMaxSrc; ++i) {
    if (i >= 1 && i <= 3) continue;
    const Tensor* t = node->src[i];
    if (!t) continue;
    const float* x = static_cast<const float*>(t->data);
    for (int64_t j = 0; j < t->nelements(); ++j) store_f32(staging->data, wire, at + j, x[j] * w);
    at += t->nelements();
  }
  comm.all_reduce_sum(staging->data, at, wire);
  at = 0;
  for (int i = 0; i < kMaxSrc; ++i) {
    if (i >= 1 && i <= 3) continue;
    Tensor* t = node->src[i];
    if (!t) continue;
    float* x = static_cast<float*>(t->data);
    for (int64_t j = 0; j < t->nelements(); ++j) x[j] = load_f32(staging->data, wire, at + j);
    at += t->nelements();
  }
}

}  // namespace

void register_collective_ops(OpTable& t) {
  t[size_t(Op::AllReduce)] = {cpu_all_reduce, nullptr, false};
}

}  // namespace retort
