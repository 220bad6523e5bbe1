// get_rows: rows of a table picked by integer ids (embedding lookup), and its adjoint, a scatter-add of
// gradient rows back into the table's shape. The scatter is race-free and deterministic: every table row sums
// its contributions in the order the ids name it, whatever the thread count, so a resumed run is bit-exact.
#include <vector>

#include "../core/error.h"
#include "../core/op_table.h"
#include "cpu_util.h"
#include "ops.h"

namespace retort {

namespace {

// The id behind output row r (ids may have up to three dims; the output's dims 1..3 are the ids' dims 0..2).
inline int64_t id_at(const Tensor* ids, int64_t r) {
  const int64_t i0 = r % ids->ne[0];
  const int64_t q = r / ids->ne[0];
  const int64_t i1 = q % ids->ne[1];
  const int64_t i2 = q / ids->ne[1];
  return load_i64(ids->ptr(i0, i1, i2), ids->dtype, 0);
}

[[noreturn]] void bad_id(const char* op, const Tensor* ids, int64_t r, int64_t id, int64_t rows) {
  RT_FAIL(op, ": id ", id, " at position ", r, " of ids ", ids->describe(), " is outside [0, ", rows,
          ") (the table has R = ", rows, " rows)");
}

Tensor* get_rows_back(Context& ctx, Tensor* grad, Tensor* ids, int64_t rows) {
  int64_t ne[kMaxDims] = {grad->ne[0], rows, 1, 1};
  Tensor* t = ctx.node(Op::GetRowsBack, DType::F32, ne);
  t->src[0] = grad;
  t->src[1] = ids;
  t->ip[0] = rows;
  return t;
}

void cpu_get_rows(Tensor* t, ThreadPool& pool) {
  const Tensor* table = t->src[0];
  const Tensor* ids = t->src[1];
  const int64_t rows = table->ne[1];
  cpu::for_rows(pool, t->nrows(), t->ne[0], 1, [&](int64_t r, float* buf) {
    int64_t id = id_at(ids, r);
    if (id < 0 || id >= rows) bad_id("get_rows", ids, r, id, rows);
    cpu::load_row(table, id, buf);
    cpu::store_row(t, r, buf);
  });
}

void cpu_get_rows_back(Tensor* t, ThreadPool& pool) {
  const Tensor* g = t->src[0];
  const Tensor* ids = t->src[1];
  const int64_t rows = t->ne[1];
  const int64_t n = g->nrows();
  const int64_t d = t->ne[0];
  // Bucket the gradient rows by target row (a stable counting sort), so each target row is summed by one
  // thread, in the order its ids appear: no atomics, and the same bits for any thread count.
  std::vector<int64_t> start(size_t(rows) + 1, 0);
  std::vector<int64_t> id_of(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) {
    int64_t id = id_at(ids, r);
    if (id < 0 || id >= rows) bad_id("get_rows_back", ids, r, id, rows);
    id_of[size_t(r)] = id;
    ++start[size_t(id) + 1];
  }
  for (int64_t i = 0; i < rows; ++i) start[size_t(i) + 1] += start[size_t(i)];
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::vector<int64_t> fill = start;
  for (int64_t r = 0; r < n; ++r) order[size_t(fill[size_t(id_of[size_t(r)])]++)] = r;

  // Graph::backward's addend (the rest of a gradient sum, possibly this result's own storage: an accumulator)
  // is added after the row's own sum, as the sum node it replaces would; none in a run that starts the
  // accumulator (kFresh).
  const Tensor* addend = t->src[2] && !t->has(kFresh) ? t->src[2] : nullptr;
  RT_ASSERT(!addend || (addend->dtype == DType::F32 && addend->is_contiguous() && t->dtype == DType::F32 &&
                        t->is_contiguous() && addend->nelements() == t->nelements()));
  cpu::for_rows(pool, rows, d, 2, [&](int64_t row, float* buf) {
    float* gb = buf + d;
    std::fill(buf, buf + d, 0.0f);
    for (int64_t k = start[size_t(row)]; k < start[size_t(row) + 1]; ++k) {
      cpu::load_row(g, order[size_t(k)], gb);
      for (int64_t i = 0; i < d; ++i) buf[i] += gb[i];
    }
    if (addend) {
      const float* a = static_cast<const float*>(addend->data) + row * d;
      for (int64_t i = 0; i < d; ++i) buf[i] = a[i] + buf[i];
    }
    cpu::store_row(t, row, buf);
  });
}

void back_get_rows(BackwardCtx& bc, Tensor* t, Tensor* g) {
  Tensor* table = t->src[0];
  bc.add(table, get_rows_back(bc.ctx, g, t->src[1], table->ne[1]));
}

}  // namespace

Tensor* get_rows(Context& ctx, Tensor* table, Tensor* ids) {
  RT_CHECK(table && ids, "get_rows: null operand");
  RT_CHECK(is_float(table->dtype), "get_rows: table must be a float tensor, got ", table->describe());
  RT_CHECK(table->ne[2] == 1 && table->ne[3] == 1, "get_rows: table must be 2-D [R, D], got ",
           table->describe());
  RT_CHECK(is_int(ids->dtype), "get_rows: ids must be i32 or i64, got ", ids->describe(), " (table ",
           table->describe(), ")");
  RT_CHECK(ids->ne[3] == 1, "get_rows: ids may have at most 3 dims (the result adds one), got ",
           ids->describe());
  int64_t ne[kMaxDims] = {table->ne[0], ids->ne[0], ids->ne[1], ids->ne[2]};
  Tensor* t = ctx.node(Op::GetRows, table->dtype, ne);
  t->src[0] = table;
  t->src[1] = ids;
  return t;
}

void register_get_rows_ops(OpTable& t) {
  t[size_t(Op::GetRows)] = {cpu_get_rows, back_get_rows, true};
  t[size_t(Op::GetRowsBack)] = {cpu_get_rows_back, nullptr, false};
}

}  // namespace retort
