// Fused linear losses as graph nodes: constructors (shape and option checks), CPU node kernels (the node's
// tensors wired into a FusedLinearProblem and run by the chunk scheduler on the CPU executor), and backward
// rules.
//
// Node layout, shared by the five forward ops and FusedLinearBack:
//   src[0] = hidden [N, H], src[1] = weight [V, H], src[2] = bias [V] or null, then per loss
//     cross-entropy: src[3] = labels
//     top-K:         src[3] = teacher ids, src[4] = teacher logprobs, src[5] = mask, src[6] = labels
//     distill:       src[3] = teacher hidden, src[4] = teacher weight, src[5] = teacher bias, src[6] = labels
//     selective:     src[3] = ids
//     top-K log-probs (the teacher head): src[3] = targets or null; the node is the log-probs [N, K] (K =
//       ne[0]), aux[1] = ids i32 [N, K], aux[2] = the summed nll (f32 scalar, when targets are given). It
//       has no gradient slots: it is forward only.
//   ip and fp: the loss options in the slots every loss node shares (row_loss.h; ip[kIpGrad] holds the
//     gradient bits: which of dhidden / dW / dbias the node writes), then memory budget, chunk rows, the
//     forward op (FusedLinearBack), stats bits (which extra outputs are wanted), allowed-gradient bits
//     (FusedLinearOptions), accumulate bits, the logits dtype.
//   aux[0] = stats f32 [6, N]: row 0 per-row loss, 1 lse, 2 / 3 per-row hard / soft (Reduction::None),
//     element 0 of rows 4 / 5 the reduced hard / soft. One tensor, because a node has four extra outputs and
//     the other three are the gradients: aux[1] = dhidden [N, H], aux[2] = dW [V, H], aux[3] = dbias [V].
// FusedLinearBack (Reduction::None and selective log-softmax, whose upstream gradient is per row or per
// element): src[0..6] as the forward node, src[7] = upstream gradient, src[8] = the forward's stats (the
// selective backward reads its lse); it writes only its aux gradients (its own value is one float, unused
// and never written).
#include "fused_linear.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>

#include "../../core/error.h"
#include "../../core/op_table.h"
#include "../../core/thread_pool.h"
#include "../ops.h"
#include "chunk_scheduler.h"
#include "row_loss.h"

namespace retort {

namespace {

using loss::kIpGrad;
using loss::kIpReduction;
constexpr int kIpBudget = loss::kIpFirstFree, kIpChunk = kIpBudget + 1, kIpKind = kIpBudget + 2,
              kIpStats = kIpBudget + 3, kIpAllow = kIpBudget + 4, kIpAccum = kIpBudget + 5,
              kIpLogits = kIpBudget + 6;
static_assert(kIpLogits < kMaxParams);
constexpr int64_t kLogitsAuto = -1;  // ip[kIpLogits] when FusedLinearOptions::logits_dtype is unset
constexpr int kAuxStats = 0;
constexpr int kAuxHeadIds = 1, kAuxHeadNll = 2;  // the teacher head's outputs
constexpr int kSrcUpstream = 7, kSrcStats = 8, kSrcLossInputs = 7;
constexpr int kSrcFactor = 9;  // a loss's seed folded into its gradients (back_fused)
constexpr int64_t kStatPerRow = 1, kStatLse = 2, kStatParts = 4;
constexpr int64_t kStatRows = 6;
// Gradient i (0 hidden, 1 weight, 2 bias) is bit i of ip[kIpGrad] / ip[kIpAllow], lives in aux[1 + i] and
// belongs to src[i].
constexpr int kGrads = 3;

const char* const* roles(Op op) {
  static const char* const ce[] = {"hidden", "weight", "bias", "labels"};
  static const char* const topk[] = {"hidden",           "weight", "bias",  "teacher_ids",
                                     "teacher_logprobs", "mask",   "labels"};
  static const char* const dist[] = {"hidden",         "weight",       "bias",  "teacher_hidden",
                                     "teacher_weight", "teacher_bias", "labels"};
  static const char* const ids[] = {"hidden", "weight", "bias", "ids"};
  static const char* const head[] = {"hidden", "weight", "bias", "targets"};
  switch (op) {
    case Op::FusedLinearCrossEntropy:
      return ce;
    case Op::FusedLinearTopKDistill:
      return topk;
    case Op::FusedLinearDistill:
      return dist;
    case Op::FusedLinearTopKLogprobs:
      return head;
    default:
      return ids;  // entropy uses the first three
  }
}

Op forward_op(const Tensor* node) {
  return node->op == Op::FusedLinearBack ? Op(node->ip[kIpKind]) : node->op;
}

// "fused_linear_cross_entropy (hidden f32[8, 16], weight f32[50, 16], labels i32[8])", for run-time errors.
// Built on every run (no stream: its locale setup would cost more than the text).
std::string what(const Tensor* node) {
  const Op op = forward_op(node);
  std::string out = std::string(op_name(op)) + " (";
  const char* const* r = roles(op);
  bool first = true;
  for (int i = 0; i < kSrcLossInputs; ++i) {
    const Tensor* s = node->src[size_t(i)];
    if (!s) continue;
    out += (first ? "" : ", ") + std::string(r[i]) + " " + s->describe();
    first = false;
  }
  return out + ")";
}

// Build-time checks.

// Errors name the op, the role and the lm-head's shapes: "fused_linear_topk_kd: beta must be in [0, 1] ...,
// got 1.5 (hidden f32[4, 8], weight f32[6, 8])".
struct Checker {
  const char* op;
  Tensor* hidden;
  Tensor* weight;

  std::string shapes() const {
    return " (hidden " + hidden->describe() + ", weight " + weight->describe() + ")";
  }

  void matrix(const char* role, const Tensor* t, bool want_float) const {
    RT_CHECK(t != nullptr, op, ": ", role, " is null");
    RT_CHECK(t->ne[2] == 1 && t->ne[3] == 1, op, ": ", role, " must be 2-D, got ", t->describe());
    if (want_float)
      RT_CHECK(is_float(t->dtype), op, ": ", role, " must be f32, bf16 or f16, got ", t->describe());
    else
      RT_CHECK(is_int(t->dtype), op, ": ", role, " must be i32 or i64, got ", t->describe());
  }
  void vector(const char* role, const Tensor* t, int64_t len, const char* what_len) const {
    RT_CHECK(is_float(t->dtype), op, ": ", role, " must be f32, bf16 or f16, got ", t->describe());
    RT_CHECK(t->n_dims() == 1 && t->ne[0] == len, op, ": ", role, " ", t->describe(), " must be [", what_len,
             "] with ", what_len, " = ", len, shapes());
  }
  void rows(const char* role, const Tensor* t) const {
    RT_CHECK(t->ne[1] == hidden->ne[1], op, ": ", role, " ", t->describe(), " must have N = ", hidden->ne[1],
             " rows like hidden", shapes());
  }
  void labels(const Tensor* t) const {
    RT_CHECK(is_int(t->dtype), op, ": labels must be i32 or i64, got ", t->describe());
    RT_CHECK(t->n_dims() == 1 && t->ne[0] == hidden->ne[1], op, ": labels ", t->describe(),
             " must be [N] with N = ", hidden->ne[1], shapes());
  }
  void same_slots(const char* role, const Tensor* t, const Tensor* like) const {
    RT_CHECK(t->ne[2] == 1 && t->ne[3] == 1 && t->ne[0] == like->ne[0] && t->ne[1] == like->ne[1], op, ": ",
             role, " ", t->describe(), " must be [N, K] like ", like->describe());
  }
};

// Checks the lm-head and the fused options, and creates the node with src[0..2] and the options set.
Tensor* fused_node(Context& ctx, Op op, const Checker& ck, Tensor* bias, Reduction red,
                   const FusedLinearOptions& f, const int64_t ne[kMaxDims]) {
  RT_CHECK(f.chunk_rows >= 0, ck.op, ": chunk_rows must be >= 0 (0: from the memory budget), got ",
           f.chunk_rows, ck.shapes());
  RT_CHECK(f.logits_budget <= size_t(INT64_MAX), ck.op, ": logits_budget ", f.logits_budget, " is too large");
  RT_CHECK(!f.logits_dtype || is_float(*f.logits_dtype), ck.op,
           ": logits_dtype must be f32, bf16 or f16, got ", f.logits_dtype ? dtype_name(*f.logits_dtype) : "",
           ck.shapes());
  Tensor* t = ctx.node(op, DType::F32, ne);
  t->src[0] = ck.hidden;
  t->src[1] = ck.weight;
  t->src[2] = bias;
  t->ip[kIpReduction] = int64_t(red);
  t->ip[kIpBudget] = int64_t(f.logits_budget);
  t->ip[kIpChunk] = f.chunk_rows;
  t->ip[kIpAllow] = (f.grad_hidden ? 1 : 0) | (f.grad_weight ? 2 : 0) | (f.grad_bias ? 4 : 0);
  t->ip[kIpLogits] = f.logits_dtype ? int64_t(*f.logits_dtype) : kLogitsAuto;
  return t;
}

Checker check_head(const char* op, Tensor* hidden, Tensor* weight, Tensor* bias) {
  RT_CHECK(hidden != nullptr && weight != nullptr, op, ": hidden and weight must not be null");
  Checker ck{op, hidden, weight};
  ck.matrix("hidden", hidden, true);
  ck.matrix("weight", weight, true);
  RT_CHECK(weight->ne[0] == hidden->ne[0], op, ": weight ", weight->describe(),
           " must be [V, H] with H = ", hidden->ne[0], " like hidden ", hidden->describe());
  if (bias) ck.vector("bias", bias, weight->ne[1], "V");
  return ck;
}

Tensor* loss_node(Context& ctx, Op op, const Checker& ck, Tensor* bias, Reduction red,
                  const FusedLinearOptions& f) {
  int64_t ne[kMaxDims] = {1, 1, 1, 1};
  if (red == Reduction::None) ne[0] = ck.hidden->ne[1];
  return fused_node(ctx, op, ck, bias, red, f, ne);
}

Tensor* stats_aux(Context& ctx, Tensor* node) {
  Tensor*& s = node->aux[kAuxStats];
  if (!s) {
    int64_t ne[kMaxDims] = {node->src[0]->ne[1], kStatRows, 1, 1};
    s = ctx.node(Op::AuxOutput, DType::F32, ne);
    s->src[0] = node;
  }
  return s;
}

// A row of the stats as a view: all N elements, or element 0 only (a reduced part).
Tensor* stats_row(Context& ctx, Tensor* stats, int64_t row, bool scalar) {
  Tensor* r = slice(ctx, stats, 1, row, 1);
  if (scalar) r = slice(ctx, r, 0, 0, 1);
  r->flags |= kOutput;
  return r;
}

LossOutputs make_outputs(Context& ctx, Tensor* node, bool per_row, bool lse, bool parts) {
  LossOutputs o;
  o.loss = node;
  const bool none = Reduction(node->ip[kIpReduction]) == Reduction::None;
  if (per_row && none) o.per_row = node;  // under None the loss is the per-row loss
  if (!(per_row && !none) && !lse && !parts) return o;
  Tensor* s = stats_aux(ctx, node);
  s->flags |= kOutput;  // asked for by name, so read after the run: never reuse its memory
  node->ip[kIpStats] = (per_row ? kStatPerRow : 0) | (lse ? kStatLse : 0) | (parts ? kStatParts : 0);
  if (per_row && !none) o.per_row = stats_row(ctx, s, 0, false);
  if (lse) o.lse = stats_row(ctx, s, 1, false);
  if (parts) {
    o.hard = stats_row(ctx, s, none ? 2 : 4, !none);
    o.soft = stats_row(ctx, s, none ? 3 : 5, !none);
  }
  return o;
}

// CPU kernels.

loss::Block matrix(const Tensor* t) {
  if (!t) return {};
  return {t->data, t->dtype, t->ne[1], t->ne[0], t->nb[1], t->nb[0]};
}
loss::Block column(const Tensor* t) {  // a 1-D [N] tensor as N rows of one element
  if (!t) return {};
  return {t->data, t->dtype, t->ne[0], 1, t->nb[0], t->nb[0]};
}
loss::Block row_vector(const Tensor* t) {  // a 1-D [V] tensor as one row of V elements
  if (!t) return {};
  return {t->data, t->dtype, 1, t->ne[0], t->nb[0] * size_t(t->ne[0]), t->nb[0]};
}
float* f32(const Tensor* t) {
  return t ? static_cast<float*>(t->data) : nullptr;
}

// FusedLinearOptions::logits_dtype unset: the GEMM operands' dtype when they all share one 16-bit dtype.
DType auto_logits_dtype(const loss::FusedLinearProblem& p) {
  const DType d = p.hidden.dtype;
  bool same = d != DType::F32 && p.weight.dtype == d;
  if (p.online_teacher()) same = same && p.teacher_hidden.dtype == d && p.teacher_weight.dtype == d;
  return same ? d : DType::F32;
}

// The problem a node describes: inputs, side data and options (outputs are wired by the callers).
loss::FusedLinearProblem inputs_of(const Tensor* node) {
  const Op op = forward_op(node);
  loss::FusedLinearProblem p;
  p.hidden = matrix(node->src[0]);
  p.weight = matrix(node->src[1]);
  p.bias = row_vector(node->src[2]);
  p.reduction = Reduction(node->ip[kIpReduction]);
  p.logits_budget = size_t(node->ip[kIpBudget]);
  p.chunk_rows = node->ip[kIpChunk];
  p.what = what(node);
  p.grad_factor = node->src[kSrcFactor] ? f32(node->src[kSrcFactor]) : nullptr;
  loss::LossSpec& s = p.spec;
  s = loss::spec_from_slots(node, loss::loss_kind_of(op));
  // The side data follows hidden, weight and bias (src[3] on).
  switch (s.kind) {
    case loss::LossKind::CrossEntropy:
      s.ce.labels = column(node->src[3]);
      break;
    case loss::LossKind::TopK:
      s.topk.ids = matrix(node->src[3]);
      s.topk.logprobs = matrix(node->src[4]);
      s.topk.mask = matrix(node->src[5]);
      s.topk.labels = column(node->src[6]);
      break;
    case loss::LossKind::Distill:
      p.teacher_hidden = matrix(node->src[3]);
      p.teacher_weight = matrix(node->src[4]);
      p.teacher_bias = row_vector(node->src[5]);
      s.distill.labels = column(node->src[6]);
      break;
    case loss::LossKind::Entropy:
      break;
    case loss::LossKind::TopKLogprobs:
      s.topk_lp.k = node->ne[0];
      s.topk_lp.labels = column(node->src[3]);
      break;
    case loss::LossKind::SelectiveLogSoftmax:
      s.selective.ids = matrix(node->src[3]);
      break;
  }
  // The teacher head keeps f32 logits unless asked otherwise: its top K and log-probs are what a teacher
  // cache stores, and 16-bit logits would tie and round them.
  const bool head = op == Op::FusedLinearTopKLogprobs;
  p.logits_dtype = node->ip[kIpLogits] != kLogitsAuto ? DType(node->ip[kIpLogits])
                   : head                             ? DType::F32
                                                      : auto_logits_dtype(p);
  return p;
}

// The gradient outputs the node writes (aux[1..3], by ip[kIpGrad]).
void wire_grads(const Tensor* node, loss::FusedLinearProblem& p) {
  const int64_t bits = node->ip[kIpGrad];
  auto dense = [](const Tensor* t) { return loss::Block::dense(t->data, DType::F32, t->ne[1], t->ne[0]); };
  // An accumulator is added into, unless the graph says this run is the first after zero_grad() (kFresh).
  auto adds = [&](int i) {
    const Tensor* a = node->aux[size_t(1 + i)];
    return (node->ip[kIpAccum] & (int64_t(1) << i)) != 0 && !(a && a->has(kFresh));
  };
  p.accumulate_dhidden = adds(0);
  p.accumulate_dweight = adds(1);
  p.accumulate_dbias = adds(2);
  if ((bits & 1) && node->aux[1]) p.dhidden = dense(node->aux[1]);
  if ((bits & 2) && node->aux[2]) p.dweight = dense(node->aux[2]);
  if ((bits & 4) && node->aux[3])
    p.dbias = loss::Block::dense(node->aux[3]->data, DType::F32, 1, node->aux[3]->ne[0]);
}

// Selective log-softmax writes its [N, K] output; the other losses their loss and the asked-for stats.
void wire_forward_outputs(const Tensor* node, loss::FusedLinearProblem& p) {
  const int64_t n = node->src[0]->ne[1];
  const int64_t stats = node->aux[kAuxStats] ? node->ip[kIpStats] : 0;
  float* st = f32(node->aux[kAuxStats]);
  const bool none = p.reduction == Reduction::None;
  if (p.spec.kind == loss::LossKind::SelectiveLogSoftmax) {
    p.spec.selective.values = loss::Block::dense(node->data, DType::F32, n, node->ne[0]);
  } else if (p.spec.kind == loss::LossKind::TopKLogprobs) {
    p.spec.topk_lp.logprobs = loss::Block::dense(node->data, DType::F32, n, node->ne[0]);
    p.spec.topk_lp.ids = loss::Block::dense(node->aux[kAuxHeadIds]->data, DType::I32, n, node->ne[0]);
    p.loss = f32(node->aux[kAuxHeadNll]);
  } else {
    p.loss = f32(node);
    if ((stats & kStatPerRow) && !none) p.per_row = st;
    if (stats & kStatParts) {
      p.hard = st + (none ? 2 : 4) * n;
      p.soft = st + (none ? 3 : 5) * n;
    }
  }
  if (stats & kStatLse) p.lse = st + n;
}

// The recomputing backward reads the upstream gradient (and selective log-softmax its forward's LSE).
void wire_back_inputs(const Tensor* node, loss::FusedLinearProblem& p) {
  const Tensor* up = node->src[kSrcUpstream];
  if (p.spec.kind == loss::LossKind::SelectiveLogSoftmax) {
    p.spec.selective.values = matrix(up);
    p.spec.selective.lse = f32(node->src[kSrcStats]) + node->src[0]->ne[1];
  } else {
    p.row_upstream = column(up);
  }
}

void cpu_fused(Tensor* node, ThreadPool& pool) {
  auto ex = loss::make_cpu_chunk_executor(pool);
  loss::FusedLinearProblem p = loss::problem_from_node(node);
  if (p.grad_factor) p.grad_scale *= *std::exchange(p.grad_factor, nullptr);  // host memory: read it now
  loss::run_fused_linear(*ex, p);
}

// Backward.

bool is_unit_fill(const Tensor* g) {
  return g->op == Op::Fill && g->fp[0] == 1.0f;
}

Tensor* grad_aux(Context& ctx, Tensor* owner, int i) {
  Tensor*& a = owner->aux[size_t(1 + i)];
  if (!a) {
    a = ctx.node(Op::AuxOutput, DType::F32, owner->src[size_t(i)]->ne);
    a->src[0] = owner;
  }
  return a;
}

void back_fused(BackwardCtx& bc, Tensor* node, Tensor* grad) {
  const char* const* r = roles(node->op);
  for (int i = 3; i < kSrcLossInputs; ++i) {
    Tensor* s = node->src[size_t(i)];
    // Every float input beyond the lm-head is teacher data (labels and ids are integers).
    RT_CHECK(!(s && is_float(s->dtype) && bc.needs(s)), op_name(node->op), ": ", r[i], " ", s->describe(),
             " needs a gradient (it is a parameter or computed from one), but teacher inputs are constants: "
             "no gradient flows to them");
  }
  Context& ctx = bc.ctx;
  int64_t bits = 0;
  for (int i = 0; i < kGrads; ++i) {
    Tensor* s = node->src[size_t(i)];
    if (!bc.needs(s)) continue;
    if (node->ip[kIpAllow] >> i & 1)
      bits |= int64_t(1) << i;
    else  // switched off: this loss contributes nothing (the graph still wants a gradient for a parameter)
      bc.add(s, fill(ctx, DType::F32, s->ne, 0.0f));
  }
  if (!bits) return;
  const bool per_row_upstream =
      Reduction(node->ip[kIpReduction]) == Reduction::None || node->op == Op::FusedLinearSelectiveLogSoftmax;
  if (per_row_upstream) {
    // The upstream gradient is not a scalar, and dW = Σ_n u_n·dlogits_nᵀ·hidden_n cannot be rescaled after
    // the fact: a second chunked pass recomputes the logits and takes the upstream row by row.
    int64_t one[kMaxDims] = {1, 1, 1, 1};
    Tensor* b = ctx.node(Op::FusedLinearBack, DType::F32, one);
    for (int i = 0; i < kSrcLossInputs; ++i) b->src[size_t(i)] = node->src[size_t(i)];
    b->ip = node->ip;
    b->fp = node->fp;
    b->ip[kIpKind] = int64_t(node->op);
    b->ip[kIpGrad] = bits;
    b->src[kSrcUpstream] = grad;
    if (node->op == Op::FusedLinearSelectiveLogSoftmax) {
      b->src[kSrcStats] = stats_aux(ctx, node);  // the forward keeps its row LSE for this pass
      node->ip[kIpStats] |= kStatLse;
    }
    for (int i = 0; i < kGrads; ++i)
      if (bits >> i & 1) bc.add(node->src[size_t(i)], grad_aux(ctx, b, i));
    return;
  }
  node->ip[kIpGrad] = bits;  // the forward pass now writes these gradients too
  // A seed that is a one-element f32 leaf (Graph::backward's seed) is known before the forward runs: the
  // forward multiplies it into the gradients it writes, so they need no pass of their own.
  const bool folded = grad->is_leaf() && grad->dtype == DType::F32 && grad->nelements() == 1;
  if (folded) node->src[kSrcFactor] = grad;
  const bool unit = is_unit_fill(grad) || folded;
  for (int i = 0; i < kGrads; ++i) {
    if (!(bits >> i & 1)) continue;
    Tensor* g = grad_aux(ctx, node, i);
    bc.add(node->src[size_t(i)], unit ? g : mul(ctx, g, grad));
  }
}

}  // namespace

loss::FusedLinearProblem loss::problem_from_node(const Tensor* node) {
  RT_ASSERT(node->op == Op::FusedLinearBack || is_fused_linear_loss(node->op));
  FusedLinearProblem p = inputs_of(node);
  if (node->op == Op::FusedLinearBack)
    wire_back_inputs(node, p);
  else
    wire_forward_outputs(node, p);
  wire_grads(node, p);
  return p;
}

// Constructors.

LossOutputs fused_linear_cross_entropy(Context& ctx, Tensor* hidden, Tensor* weight, Tensor* bias,
                                       Tensor* labels, const CrossEntropyOptions& o,
                                       const FusedLinearOptions& f) {
  const Checker ck = check_head("fused_linear_cross_entropy", hidden, weight, bias);
  RT_CHECK(labels != nullptr, ck.op, ": labels are null");
  ck.labels(labels);
  loss::check_options(ck.op, o, ck.shapes());
  Tensor* t = loss_node(ctx, Op::FusedLinearCrossEntropy, ck, bias, o.reduction, f);
  t->src[3] = labels;
  loss::set_options(t, o);
  return make_outputs(ctx, t, o.return_per_row, o.return_lse, false);
}

LossOutputs fused_linear_topk_kd(Context& ctx, Tensor* hidden, Tensor* weight, Tensor* bias,
                                 Tensor* teacher_ids, Tensor* teacher_logprobs, Tensor* mask, Tensor* labels,
                                 const TopKDistillOptions& o, const FusedLinearOptions& f) {
  const Checker ck = check_head("fused_linear_topk_kd", hidden, weight, bias);
  ck.matrix("teacher_ids", teacher_ids, false);
  ck.matrix("teacher_logprobs", teacher_logprobs, true);
  ck.rows("teacher_ids", teacher_ids);
  ck.same_slots("teacher_logprobs", teacher_logprobs, teacher_ids);
  RT_CHECK(teacher_ids->ne[0] <= weight->ne[1], ck.op, ": teacher_ids ", teacher_ids->describe(),
           " has K = ", teacher_ids->ne[0], " slots but the vocabulary has only V = ", weight->ne[1],
           " entries (K must be <= V)", ck.shapes());
  if (mask) ck.same_slots("mask", mask, teacher_ids);
  if (labels) ck.labels(labels);
  loss::check_options(ck.op, o, labels != nullptr, ck.shapes());
  Tensor* t = loss_node(ctx, Op::FusedLinearTopKDistill, ck, bias, o.reduction, f);
  t->src[3] = teacher_ids;
  t->src[4] = teacher_logprobs;
  t->src[5] = mask;
  t->src[6] = labels;
  loss::set_options(t, o);
  return make_outputs(ctx, t, o.return_per_row, o.return_lse, o.return_parts);
}

LossOutputs fused_linear_distill(Context& ctx, Tensor* hidden, Tensor* weight, Tensor* bias,
                                 Tensor* teacher_hidden, Tensor* teacher_weight, Tensor* teacher_bias,
                                 Tensor* labels, const DistillOptions& o, const FusedLinearOptions& f) {
  const Checker ck = check_head("fused_linear_distill", hidden, weight, bias);
  ck.matrix("teacher_hidden", teacher_hidden, true);
  ck.matrix("teacher_weight", teacher_weight, true);
  ck.rows("teacher_hidden", teacher_hidden);
  RT_CHECK(teacher_weight->ne[1] == weight->ne[1] && teacher_weight->ne[0] == teacher_hidden->ne[0], ck.op,
           ": teacher_weight ", teacher_weight->describe(), " must be [V, Ht] with V = ", weight->ne[1],
           " like weight and Ht = ", teacher_hidden->ne[0], " like teacher_hidden ",
           teacher_hidden->describe(), ck.shapes());
  if (teacher_bias) ck.vector("teacher_bias", teacher_bias, weight->ne[1], "V");
  if (labels) ck.labels(labels);
  loss::check_options(ck.op, o, labels != nullptr, ck.shapes());
  Tensor* t = loss_node(ctx, Op::FusedLinearDistill, ck, bias, o.reduction, f);
  t->src[3] = teacher_hidden;
  t->src[4] = teacher_weight;
  t->src[5] = teacher_bias;
  t->src[6] = labels;
  loss::set_options(t, o);
  return make_outputs(ctx, t, o.return_per_row, o.return_lse, o.return_parts);
}

Tensor* fused_linear_entropy(Context& ctx, Tensor* hidden, Tensor* weight, Tensor* bias, float temperature,
                             Reduction reduction, const FusedLinearOptions& f) {
  const Checker ck = check_head("fused_linear_entropy", hidden, weight, bias);
  loss::check_reduction(ck.op, reduction, ck.shapes());
  loss::check_temperature(ck.op, temperature, ck.shapes());
  Tensor* t = loss_node(ctx, Op::FusedLinearEntropy, ck, bias, reduction, f);
  loss::set_entropy_options(t, temperature);
  return t;
}

Tensor* fused_linear_selective_log_softmax(Context& ctx, Tensor* hidden, Tensor* weight, Tensor* bias,
                                           Tensor* ids, const FusedLinearOptions& f) {
  const Checker ck = check_head("fused_linear_selective_log_softmax", hidden, weight, bias);
  ck.matrix("ids", ids, false);
  ck.rows("ids", ids);
  int64_t ne[kMaxDims] = {ids->ne[0], ids->ne[1], 1, 1};
  Tensor* t = fused_node(ctx, Op::FusedLinearSelectiveLogSoftmax, ck, bias, Reduction::None, f, ne);
  t->src[3] = ids;
  return t;
}

TopKLogprobsOutputs fused_linear_topk_logprobs(Context& ctx, Tensor* hidden, Tensor* weight, int64_t k,
                                               Tensor* targets, const TopKLogprobsOptions& o,
                                               const FusedLinearOptions& f) {
  const Checker ck = check_head("fused_linear_topk_logprobs", hidden, weight, nullptr);
  const int64_t n = hidden->ne[1], v = weight->ne[1];
  RT_CHECK(k >= 1 && k <= v, ck.op, ": K = ", k, " must be in [1, V] with V = ", v, ck.shapes());
  RT_CHECK(v <= std::numeric_limits<int32_t>::max(), ck.op, ": V = ", v, " does not fit the i32 ids",
           ck.shapes());
  if (targets) {
    RT_CHECK(is_int(targets->dtype), ck.op, ": targets must be i32 or i64, got ", targets->describe());
    RT_CHECK(targets->n_dims() == 1 && targets->ne[0] == n, ck.op, ": targets ", targets->describe(),
             " must be [N] with N = ", n, ck.shapes());
  }
  int64_t ne[kMaxDims] = {k, n, 1, 1};
  Tensor* t = fused_node(ctx, Op::FusedLinearTopKLogprobs, ck, nullptr, Reduction::Sum, f, ne);
  t->src[3] = targets;
  t->ip[loss::kIpIgnore] = o.ignore_index;
  // Every output is read by name after the run: never reuse its memory.
  t->flags |= kOutput;
  TopKLogprobsOutputs out;
  out.logprobs = t;
  Tensor* ids = ctx.node(Op::AuxOutput, DType::I32, ne);
  ids->src[0] = t;
  ids->flags |= kOutput;
  t->aux[kAuxHeadIds] = out.ids = ids;
  if (targets) {
    int64_t one[kMaxDims] = {1, 1, 1, 1};
    Tensor* nll = ctx.node(Op::AuxOutput, DType::F32, one);
    nll->src[0] = t;
    nll->flags |= kOutput;
    t->aux[kAuxHeadNll] = out.nll_sum = nll;
  }
  if (o.return_lse) out.lse = make_outputs(ctx, t, false, true, false).lse;
  return out;
}

// Graph::backward's offer (OpInfo::accumulate_aux): every gradient output can be added into an accumulator —
// the hidden gradient by its GEMM (beta = 1) or the K-sparse update, the weight gradient by its GEMM, the
// bias gradient by the column sums — so a leaf's gradient needs no Accumulate pass over a copy.
bool accumulate_fused_aux(Tensor* aux) {
  Tensor* owner = aux->src[0];
  for (int i = 0; i < kGrads; ++i)
    if (owner->aux[size_t(1 + i)] == aux) {
      owner->ip[kIpAccum] |= int64_t(1) << i;
      return true;
    }
  return false;
}

void register_fused_ops(OpTable& t) {
  t[size_t(Op::FusedLinearCrossEntropy)] = {cpu_fused, back_fused, true, accumulate_fused_aux};
  t[size_t(Op::FusedLinearTopKDistill)] = {cpu_fused, back_fused, true, accumulate_fused_aux};
  t[size_t(Op::FusedLinearDistill)] = {cpu_fused, back_fused, true, accumulate_fused_aux};
  t[size_t(Op::FusedLinearEntropy)] = {cpu_fused, back_fused, true, accumulate_fused_aux};
  t[size_t(Op::FusedLinearSelectiveLogSoftmax)] = {cpu_fused, back_fused, true, accumulate_fused_aux};
  t[size_t(Op::FusedLinearBack)] = {cpu_fused, nullptr, false, accumulate_fused_aux};
  // A selection has no useful gradient: backward() through the teacher head throws, naming it.
  t[size_t(Op::FusedLinearTopKLogprobs)] = {cpu_fused, nullptr, false};
}

}  // namespace retort
