// Plain cross-entropy with integer labels and ignore_index: the mean over valid rows of logsumexp(row) −
// row[label], for logits of any rank [.., V] (labels have the logits' shape without V). It is the loss
// backend's cross-entropy node (cross_entropy_loss, losses.h) over the rows, so there is one cross-entropy
// op, one kernel per backend and one single-pass gradient.
#include "../../core/error.h"
#include "../ops.h"
#include "losses.h"

namespace retort {

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
  // The row loss takes 2-D logits and 1-D labels, through their strides; higher ranks become rows.
  Tensor* x = logits;
  Tensor* y = labels;
  if (x->n_dims() > 2) x = reshape(ctx, x->is_contiguous() ? x : contiguous(ctx, x), {x->nrows(), x->ne[0]});
  if (y->n_dims() > 1) y = reshape(ctx, y->is_contiguous() ? y : contiguous(ctx, y), {y->nelements()});
  CrossEntropyOptions o;
  o.ignore_index = ignore_index;
  return cross_entropy_loss(ctx, x, y, o).loss;
}

}  // namespace retort
