// Plain cross-entropy with integer labels and ignore_index: the mean over valid rows of
// logsumexp(row) - row[label]. The unfused reference for the fused losses: every row of logits [.., V] is
// one prediction, labels have the logits' shape without the V dim. Per-row losses are combined in row order,
// so the result does not depend on the thread count.
#include <cmath>
#include <limits>
#include <vector>

#include "../../core/error.h"
#include "../../core/op_table.h"
#include "../cpu_util.h"
#include "../ops.h"

namespace retort {

namespace {

// The label of logits row r (labels' dims 0..2 are the logits' dims 1..3, so the coordinates line up).
inline int64_t label_at(const Tensor* labels, const Tensor* logits, int64_t r) {
  int64_t i1, i2, i3;
  cpu::row_coords(logits, r, i1, i2, i3);
  return load_i64(labels->ptr(i1, i2, i3), labels->dtype, 0);
}

// Counts the rows that take part, checking every label first (so no bad label reaches the row kernels).
int64_t count_valid(const char* op, const Tensor* logits, const Tensor* labels, int64_t ignore_index) {
  const int64_t vocab = logits->ne[0];
  int64_t valid = 0;
  for (int64_t r = 0; r < logits->nrows(); ++r) {
    const int64_t y = label_at(labels, logits, r);
    if (y == ignore_index) continue;
    RT_CHECK(y >= 0 && y < vocab, op, ": label ", y, " at row ", r, " of labels ", labels->describe(),
             " is outside [0, ", vocab, ") for logits ", logits->describe(), " (and is not ignore_index ",
             ignore_index, ")");
    ++valid;
  }
  return valid;
}

// max and log(sum(exp(v - max))) of a row.
void row_lse(const float* v, int64_t n, float& max, double& log_sum) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) m = std::max(m, v[i]);
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(v[i] - m);
  max = m;
  log_sum = std::log(s);
}

void cpu_cross_entropy(Tensor* t, ThreadPool& pool) {
  const Tensor* logits = t->src[0];
  const Tensor* labels = t->src[1];
  const int64_t ignore = t->ip[0];
  const int64_t vocab = logits->ne[0];
  const int64_t rows = logits->nrows();
  const int64_t valid = count_valid("cross_entropy", logits, labels, ignore);
  std::vector<double> loss(size_t(rows), 0.0);
  cpu::for_rows(pool, rows, vocab, 1, [&](int64_t r, float* buf) {
    const int64_t y = label_at(labels, logits, r);
    if (y == ignore) return;
    cpu::load_row(logits, r, buf);
    float m;
    double log_sum;
    row_lse(buf, vocab, m, log_sum);
    // (m + log_sum) - x[y], written so the large m cancels before it meets the small terms.
    loss[size_t(r)] = double(m - buf[y]) + log_sum;
  });
  double total = 0;
  for (double l : loss) total += l;
  // All rows ignored: 0, not 0/0, so a padded micro-batch leaves the running loss finite.
  store_f32(t->data, t->dtype, 0, valid ? float(total / double(valid)) : 0.0f);
}

// d/dlogits = (softmax(row) - onehot(label)) * grad / n_valid for valid rows, 0 for ignored ones.
void cpu_cross_entropy_back(Tensor* t, ThreadPool& pool) {
  const Tensor* logits = t->src[0];
  const Tensor* labels = t->src[1];
  const Tensor* g = t->src[2];
  const int64_t ignore = t->ip[0];
  const int64_t vocab = logits->ne[0];
  const int64_t valid = count_valid("cross_entropy_back", logits, labels, ignore);
  const float coef = valid ? float(double(load_f32(g->data, g->dtype, 0)) / double(valid)) : 0.0f;
  cpu::for_rows(pool, logits->nrows(), vocab, 1, [&](int64_t r, float* buf) {
    const int64_t y = label_at(labels, logits, r);
    if (y == ignore) {
      std::fill(buf, buf + vocab, 0.0f);
    } else {
      cpu::load_row(logits, r, buf);
      float m;
      double log_sum;
      row_lse(buf, vocab, m, log_sum);
      const float lse = float(log_sum);
      for (int64_t i = 0; i < vocab; ++i) buf[i] = std::exp(buf[i] - m - lse) * coef;
      buf[y] -= coef;
    }
    cpu::store_row(t, r, buf);
  });
}

void back_cross_entropy(BackwardCtx& bc, Tensor* t, Tensor* g) {
  Tensor* logits = t->src[0];
  Tensor* d = bc.ctx.node(Op::CrossEntropyBack, DType::F32, logits->ne);
  d->src[0] = logits;
  d->src[1] = t->src[1];
  d->src[2] = g;
  d->ip[0] = t->ip[0];
  bc.add(logits, d);
}

}  // namespace

Tensor* cross_entropy(Context& ctx, Tensor* logits, Tensor* labels, int64_t ignore_index) {
  RT_CHECK(logits && labels, "cross_entropy: null operand");
  RT_CHECK(is_float(logits->dtype), "cross_entropy: logits must be a float tensor [N, V], got ",
           logits->describe());
  RT_CHECK(is_int(labels->dtype), "cross_entropy: labels must be i32 or i64, got ", labels->describe(),
           " (logits ", logits->describe(), ")");
  bool match = labels->ne[3] == 1;
  for (int d = 0; d < kMaxDims - 1; ++d) match &= labels->ne[d] == logits->ne[d + 1];
  RT_CHECK(match, "cross_entropy: labels ", labels->describe(), " must have the shape of logits ",
           logits->describe(), " without its last dim V (one label per row)");
  const int64_t one[kMaxDims] = {1, 1, 1, 1};
  Tensor* t = ctx.node(Op::CrossEntropy, DType::F32, one);
  t->src[0] = logits;
  t->src[1] = labels;
  t->ip[0] = ignore_index;
  return t;
}

void register_cross_entropy_ops(OpTable& t) {
  t[size_t(Op::CrossEntropy)] = {"cross_entropy", cpu_cross_entropy, back_cross_entropy, true};
  t[size_t(Op::CrossEntropyBack)] = {"cross_entropy_back", cpu_cross_entropy_back, nullptr, false};
}

}  // namespace retort
