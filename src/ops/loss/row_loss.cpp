// The row-loss adapter (row_loss.h): options into and out of a node's slots, their checks, and the CPU
// row-loss entry.
#include "row_loss.h"

#include <cmath>

#include "../../core/error.h"
#include "../../core/tensor.h"

namespace retort::loss {

const char* loss_kind_name(LossKind k) {
  switch (k) {
    case LossKind::CrossEntropy:
      return "cross_entropy";
    case LossKind::TopK:
      return "topk_kd";
    case LossKind::Distill:
      return "distill";
    case LossKind::Entropy:
      return "entropy";
    case LossKind::SelectiveLogSoftmax:
      return "selective_log_softmax";
    case LossKind::TopKLogprobs:
      return "topk_logprobs";
  }
  return "?";
}

namespace {

// Every loss op and its kind: a new loss kind adds its ops here, and losses.cpp and fused_linear.cpp find
// them through loss_kind_of and is_fused_linear_loss.
struct LossOp {
  Op op;
  LossKind kind;
  bool fused;
};
constexpr LossOp kLossOps[] = {
    {Op::CrossEntropyLoss, LossKind::CrossEntropy, false},
    {Op::TopKDistill, LossKind::TopK, false},
    {Op::TopKKLGathered, LossKind::TopK, false},
    {Op::Distill, LossKind::Distill, false},
    {Op::Entropy, LossKind::Entropy, false},
    {Op::SelectiveLogSoftmax, LossKind::SelectiveLogSoftmax, false},
    {Op::SelectiveLogSoftmaxBack, LossKind::SelectiveLogSoftmax, false},
    {Op::FusedLinearCrossEntropy, LossKind::CrossEntropy, true},
    {Op::FusedLinearTopKDistill, LossKind::TopK, true},
    {Op::FusedLinearDistill, LossKind::Distill, true},
    {Op::FusedLinearEntropy, LossKind::Entropy, true},
    {Op::FusedLinearSelectiveLogSoftmax, LossKind::SelectiveLogSoftmax, true},
    {Op::FusedLinearTopKLogprobs, LossKind::TopKLogprobs, true},
};

const LossOp* find_loss_op(Op op) {
  for (const LossOp& l : kLossOps)
    if (l.op == op) return &l;
  return nullptr;
}

}  // namespace

LossKind loss_kind_of(Op op) {
  const LossOp* l = find_loss_op(op);
  RT_ASSERT(l != nullptr);
  return l->kind;
}

bool is_fused_linear_loss(Op op) {
  const LossOp* l = find_loss_op(op);
  return l != nullptr && l->fused;
}

Block Block::sub_rows(int64_t r0, int64_t n) const {
  Block b = *this;
  if (!empty()) b.data = row(r0);
  b.rows = n;
  return b;
}

Block Block::dense(void* data, DType dtype, int64_t rows, int64_t cols) {
  size_t es = dtype_size(dtype);
  return {data, dtype, rows, cols, es * size_t(cols), es};
}

RowOut RowOut::sub_rows(int64_t r0, int64_t n) const {
  RowOut o = *this;
  auto at = [r0](float* p) { return p ? p + r0 : nullptr; };
  o.loss = at(loss);
  o.lse = at(lse);
  o.hard = at(hard);
  o.soft = at(soft);
  o.grad = grad.sub_rows(r0, n);
  return o;
}

CrossEntropySide CrossEntropySide::sub_rows(int64_t r0, int64_t n) const {
  CrossEntropySide s = *this;
  s.labels = labels.sub_rows(r0, n);
  return s;
}

TopKSide TopKSide::sub_rows(int64_t r0, int64_t n) const {
  TopKSide s = *this;
  s.ids = ids.sub_rows(r0, n);
  s.logprobs = logprobs.sub_rows(r0, n);
  s.mask = mask.sub_rows(r0, n);
  s.labels = labels.sub_rows(r0, n);
  return s;
}

DistillSide DistillSide::sub_rows(int64_t r0, int64_t n) const {
  DistillSide s = *this;
  s.teacher = teacher.sub_rows(r0, n);
  s.labels = labels.sub_rows(r0, n);
  return s;
}

SelectiveSide SelectiveSide::sub_rows(int64_t r0, int64_t n) const {
  SelectiveSide s = *this;
  s.ids = ids.sub_rows(r0, n);
  s.values = values.sub_rows(r0, n);
  if (lse) s.lse = lse + r0;
  return s;
}

TopKLogprobsSide TopKLogprobsSide::sub_rows(int64_t r0, int64_t n) const {
  TopKLogprobsSide s = *this;
  s.labels = labels.sub_rows(r0, n);
  s.logprobs = logprobs.sub_rows(r0, n);
  s.ids = ids.sub_rows(r0, n);
  s.row0 = row0 + r0;
  return s;
}

LossSpec LossSpec::sub_rows(int64_t r0, int64_t n) const {
  LossSpec s = *this;
  switch (kind) {
    case LossKind::CrossEntropy:
      s.ce = ce.sub_rows(r0, n);
      break;
    case LossKind::TopK:
      s.topk = topk.sub_rows(r0, n);
      break;
    case LossKind::Distill:
      s.distill = distill.sub_rows(r0, n);
      break;
    case LossKind::Entropy:
      break;
    case LossKind::SelectiveLogSoftmax:
      s.selective = selective.sub_rows(r0, n);
      break;
    case LossKind::TopKLogprobs:
      s.topk_lp = topk_lp.sub_rows(r0, n);
      break;
  }
  return s;
}

// Option checks.

void check_reduction(const char* op, Reduction r, const std::string& context) {
  RT_CHECK(r == Reduction::Mean || r == Reduction::Sum || r == Reduction::None, op, ": unknown reduction ",
           int64_t(r), context);
}

void check_temperature(const char* op, float t, const std::string& context) {
  RT_CHECK(std::isfinite(t) && t > 0.0f, op, ": temperature must be a finite number > 0, got ", t, context);
}

namespace {

void check_weight(const char* op, const char* name, float w, const std::string& context) {
  RT_CHECK(std::isfinite(w) && w >= 0.0f, op, ": ", name, " must be a finite number >= 0, got ", w, context);
}

// The options topk_kd and distill share: divergence, temperature, weights.
template <typename O>
void check_distill_options(const char* op, const O& o, bool has_labels, const std::string& context) {
  check_reduction(op, o.reduction, context);
  check_temperature(op, o.temperature, context);
  RT_CHECK(o.divergence == Divergence::Kl || o.divergence == Divergence::Tvd ||
               o.divergence == Divergence::SkewKl || o.divergence == Divergence::SkewReverseKl,
           op, ": unknown divergence ", int64_t(o.divergence), context);
  RT_CHECK(o.beta >= 0.0f && o.beta <= 1.0f, op,
           ": beta must be in [0, 1] (0 forward KL, 1 reverse KL), got ", o.beta, context);
  RT_CHECK(o.skew_alpha >= 0.0f && o.skew_alpha <= 1.0f, op, ": skew_alpha must be in [0, 1], got ",
           o.skew_alpha, context);
  check_weight(op, "w_hard", o.w_hard, context);
  check_weight(op, "w_soft", o.w_soft, context);
  RT_CHECK(o.w_hard == 0.0f || has_labels, op, ": w_hard = ", o.w_hard, " needs labels, got none", context);
}

template <typename O>
void set_distill_options(Tensor* node, const O& o) {
  node->ip[kIpIgnore] = o.ignore_index;
  node->ip[kIpDivergence] = int64_t(o.divergence);
  node->fp[kFpTemp] = o.temperature;
  node->fp[kFpBeta] = o.beta;
  node->fp[kFpSkew] = o.skew_alpha;
  node->fp[kFpHard] = o.w_hard;
  node->fp[kFpSoft] = o.w_soft;
}

DivergenceSpec divergence_from_slots(const Tensor* node) {
  return {Divergence(node->ip[kIpDivergence]), node->fp[kFpBeta], node->fp[kFpSkew]};
}

}  // namespace

void check_options(const char* op, const CrossEntropyOptions& o, const std::string& context) {
  check_reduction(op, o.reduction, context);
  RT_CHECK(o.label_smoothing >= 0.0f && o.label_smoothing <= 1.0f, op,
           ": label_smoothing must be in [0, 1], got ", o.label_smoothing, context);
  check_weight(op, "z_loss", o.z_loss, context);
  check_weight(op, "softcap", o.softcap, context);
}

void check_options(const char* op, const TopKDistillOptions& o, bool has_labels, const std::string& context) {
  check_distill_options(op, o, has_labels, context);
}

void check_options(const char* op, const DistillOptions& o, bool has_labels, const std::string& context) {
  check_distill_options(op, o, has_labels, context);
}

// Options in slots.

void set_options(Tensor* node, const CrossEntropyOptions& o) {
  node->ip[kIpIgnore] = o.ignore_index;
  node->fp[kFpSmooth] = o.label_smoothing;
  node->fp[kFpZLoss] = o.z_loss;
  node->fp[kFpCap] = o.softcap;
}

void set_options(Tensor* node, const TopKDistillOptions& o) {
  set_distill_options(node, o);
  node->ip[kIpNormalize] = o.normalize_topk ? 1 : 0;
}

void set_options(Tensor* node, const DistillOptions& o) {
  set_distill_options(node, o);
}

void set_entropy_options(Tensor* node, float temperature) {
  node->fp[kFpTemp] = temperature;
}

LossSpec spec_from_slots(const Tensor* node, LossKind kind) {
  LossSpec s;
  s.kind = kind;
  switch (kind) {
    case LossKind::CrossEntropy:
      s.ce.ignore_index = node->ip[kIpIgnore];
      s.ce.label_smoothing = node->fp[kFpSmooth];
      s.ce.z_loss = node->fp[kFpZLoss];
      s.ce.softcap = node->fp[kFpCap];
      break;
    case LossKind::TopK:
      s.topk.ignore_index = node->ip[kIpIgnore];
      s.topk.normalize_topk = node->ip[kIpNormalize] != 0;
      s.topk.div = divergence_from_slots(node);
      s.topk.temperature = node->fp[kFpTemp];
      s.topk.w_hard = node->fp[kFpHard];
      s.topk.w_soft = node->fp[kFpSoft];
      break;
    case LossKind::Distill:
      s.distill.ignore_index = node->ip[kIpIgnore];
      s.distill.div = divergence_from_slots(node);
      s.distill.temperature = node->fp[kFpTemp];
      s.distill.w_hard = node->fp[kFpHard];
      s.distill.w_soft = node->fp[kFpSoft];
      break;
    case LossKind::Entropy:
      s.entropy.temperature = node->fp[kFpTemp];
      break;
    case LossKind::SelectiveLogSoftmax:
      break;
    case LossKind::TopKLogprobs:
      s.topk_lp.ignore_index = node->ip[kIpIgnore];
      break;
  }
  return s;
}

// The CPU entry.

int64_t check_side(const LossSpec& spec, int64_t rows, int64_t v, const std::string& what) {
  switch (spec.kind) {
    case LossKind::CrossEntropy:
      return check_cross_entropy(spec.ce, v, what);
    case LossKind::TopK:
      return check_topk(spec.topk, rows, v, what);
    case LossKind::Distill:
      return check_distill(spec.distill, rows, v, what);
    case LossKind::Entropy:
      return rows;
    case LossKind::SelectiveLogSoftmax:
      check_ids(spec.selective.ids, v, what);
      return rows;
    case LossKind::TopKLogprobs:
      return check_topk_logprobs(spec.topk_lp, rows, v, what);
  }
  return rows;
}

void row_loss(const LossSpec& spec, const Block& logits, const RowOut& out, ThreadPool& pool) {
  switch (spec.kind) {
    case LossKind::CrossEntropy:
      cross_entropy_rows(logits, spec.ce, out, pool);
      return;
    case LossKind::TopK:
      topk_rows(logits, spec.topk, out, pool);
      return;
    case LossKind::Distill:
      distill_rows(logits, spec.distill, out, pool);
      return;
    case LossKind::Entropy:
      entropy_rows(logits, spec.entropy, out, pool);
      return;
    case LossKind::SelectiveLogSoftmax:
      if (out.grad.empty())
        selective_log_softmax_rows(logits, spec.selective.ids, spec.selective.values, out.lse, pool);
      else
        selective_log_softmax_back_rows(logits, spec.selective.ids, spec.selective.values, spec.selective.lse,
                                        out.grad, pool);
      return;
    case LossKind::TopKLogprobs:
      RT_ASSERT(out.grad.empty());
      topk_logprobs_rows(logits, spec.topk_lp, out, pool);
      return;
  }
}

}  // namespace retort::loss
