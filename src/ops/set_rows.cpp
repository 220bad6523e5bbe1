// set_rows: rows of a persistent tensor (a KV cache) overwritten in place at positions known only at run
// time. The node aliases its destination, so every reader of the node runs after the write; it has no
// gradient (a cache is state, not a function of the parameters a loss could differentiate).
#include "../core/error.h"
#include "../core/op_table.h"
#include "cpu_util.h"
#include "ops.h"

namespace retort {

namespace {

// The destination row for source row r (dims 1..3 of src): ids broadcast over src's batch dims 2 and 3.
inline int64_t target_row(const Tensor* ids, int64_t i1, int64_t i2, int64_t i3) {
  return load_i64(ids->ptr(i1, ids->ne[1] == 1 ? 0 : i2, ids->ne[2] == 1 ? 0 : i3), ids->dtype, 0);
}

void cpu_set_rows(Tensor* t, ThreadPool& pool) {
  const Tensor* src = t->src[1];
  const Tensor* ids = t->src[2];
  const int64_t rows = t->ne[1];
  // Every id is checked before any row is written, so a bad one leaves the destination as it was.
  for (int64_t r = 0; r < src->nrows(); ++r) {
    int64_t i1, i2, i3;
    cpu::row_coords(src, r, i1, i2, i3);
    const int64_t id = target_row(ids, i1, i2, i3);
    RT_CHECK(id >= 0 && id < rows, "set_rows: id ", id, " at position ", i1, " of rows ", ids->describe(),
             " is outside [0, ", rows, ") (dst ", t->describe(), " has R = ", rows, " rows)");
  }
  cpu::for_rows(pool, src->nrows(), t->ne[0], 1, [&](int64_t r, float* buf) {
    int64_t i1, i2, i3;
    cpu::row_coords(src, r, i1, i2, i3);
    cpu::load_row(src, r, buf);
    cpu::store_row(t, static_cast<char*>(t->ptr(0, target_row(ids, i1, i2, i3), i2, i3)), buf);
  });
}

// True when t's storage is a leaf's (through views and earlier set_rows), i.e. it outlives a graph run.
bool persistent(const Tensor* t) {
  while (t->op == Op::View || t->op == Op::SetRows) t = t->src[0];
  return t->is_leaf();
}

}  // namespace

Tensor* set_rows(Context& ctx, Tensor* dst, Tensor* src, Tensor* rows) {
  RT_CHECK(dst && src && rows, "set_rows: null operand");
  RT_CHECK(is_float(dst->dtype), "set_rows: dst must be a float tensor [.., R, D] (f32, bf16 or f16), got ",
           dst->describe());
  RT_CHECK(persistent(dst), "set_rows: dst ", dst->describe(),
           " must be a leaf (or a view of one) whose storage outlives the graph, such as a cache made with "
           "Context::tensor; a graph intermediate would be overwritten by the memory planner");
  RT_CHECK(is_float(src->dtype), "set_rows: src must be a float tensor [.., n, D], got ", src->describe(),
           " (dst ", dst->describe(), ")");
  RT_CHECK(src->ne[0] == dst->ne[0] && src->ne[2] == dst->ne[2] && src->ne[3] == dst->ne[3], "set_rows: src ",
           src->describe(), " must be [.., n, D] with dst ", dst->describe(),
           "'s row length D and batch dims (dims 0, 2 and 3 equal)");
  RT_CHECK(is_int(rows->dtype), "set_rows: rows must be i32 or i64, got ", rows->describe(), " (src ",
           src->describe(), ")");
  RT_CHECK(rows->ne[0] == src->ne[1] && (rows->ne[1] == 1 || rows->ne[1] == src->ne[2]) &&
               (rows->ne[2] == 1 || rows->ne[2] == src->ne[3]) && rows->ne[3] == 1,
           "set_rows: rows ", rows->describe(),
           " must be [n] (or [B3, B2, n] with each batch dim 1 or src's) "
           "with n = ",
           src->ne[1], ", the row count of src ", src->describe());
  Tensor* t = ctx.node(Op::SetRows, dst->dtype, dst->ne);
  for (int d = 0; d < kMaxDims; ++d) t->nb[d] = dst->nb[d];
  t->src[0] = dst;
  t->src[1] = src;
  t->src[2] = rows;
  t->view_src = dst->view_src ? dst->view_src : dst;
  t->view_offs = dst->view_src ? dst->view_offs : 0;
  if (dst->data) t->data = dst->data;
  return t;
}

void register_set_rows_ops(OpTable& t) {
  t[size_t(Op::SetRows)] = {cpu_set_rows, nullptr, false};
}

}  // namespace retort
