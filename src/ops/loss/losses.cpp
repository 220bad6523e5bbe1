// Row losses as graph nodes: constructors (shape and option checks), CPU node kernels (validate the side
// data, then call the row kernels of row_kernels.h and reduce), and backward rules.
//
// How the single pass works: a loss node's backward rule does not emit a gradient computation. It sets
// ip[kIpGrad] on the forward node and hangs an f32 [N, V] AuxOutput on it (aux[kAuxGrad]); the forward kernel
// then writes d(loss)/d(logits) there, already scaled by the reduction, while it computes the loss. The rule
// passes that tensor on, multiplied by the upstream gradient unless the upstream is the constant 1 the graph
// seeds its loss with. Every loss node uses the same slots: src[0] = student logits; the options in the
// slots of row_loss.h (loss::kIp*, loss::kFp*); aux[0] = per-row loss [N], aux[1] = lse [N],
// aux[2] = hard/soft parts ([2] or [2, N]), aux[3] = logits gradient [N, V]. The CPU kernel of every loss is
// one: the node's spec (row_loss.h) run by loss::row_loss.
#include "losses.h"

#include <cmath>
#include <vector>

#include "../../core/error.h"
#include "../../core/op_table.h"
#include "../../core/thread_pool.h"
#include "../ops.h"
#include "row_loss.h"

namespace retort {

namespace {

using loss::kIpGrad;
using loss::kIpReduction;
constexpr int kAuxRows = 0, kAuxLse = 1, kAuxParts = 2, kAuxGrad = 3;

// Role names of each op's sources, for messages.
const char* const* roles(Op op) {
  static const char* const ce[] = {"logits", "labels"};
  static const char* const topk[] = {"logits", "teacher_ids", "teacher_logprobs", "mask", "labels"};
  static const char* const gathered[] = {"student_gathered", "", "teacher_logprobs", "mask"};
  static const char* const dist[] = {"student", "teacher", "labels"};
  static const char* const ids[] = {"logits", "ids", "grad", "lse"};
  switch (op) {
    case Op::CrossEntropyLoss:
      return ce;
    case Op::TopKDistill:
      return topk;
    case Op::TopKKLGathered:
      return gathered;
    case Op::Distill:
      return dist;
    default:
      return ids;  // Entropy uses the first only
  }
}

// "topk_kd (logits f32[5, 10], teacher_ids i32[5, 4], ...)": the op and its inputs, for run-time errors.
// Built on every run (no stream: its locale setup would cost more than the text).
std::string what(const Tensor* node) {
  std::string out = std::string(op_name(node->op)) + " (";
  const char* const* r = roles(node->op);
  bool first = true;
  for (int i = 0; i < 5; ++i) {
    const Tensor* s = node->src[size_t(i)];
    if (!s) continue;
    out += (first ? "" : ", ") + std::string(r[i]) + " " + s->describe();
    first = false;
  }
  return out + ")";
}

// Build-time checks.

void check_matrix(const char* op, const char* role, const Tensor* t, bool want_float) {
  RT_CHECK(t != nullptr, op, ": ", role, " is null");
  RT_CHECK(t->ne[2] == 1 && t->ne[3] == 1, op, ": ", role, " must be 2-D (N rows), got ", t->describe());
  if (want_float)
    RT_CHECK(is_float(t->dtype), op, ": ", role, " must be f32, bf16 or f16, got ", t->describe());
  else
    RT_CHECK(is_int(t->dtype), op, ": ", role, " must be i32 or i64, got ", t->describe());
}

void check_rows(const char* op, const char* role, const Tensor* t, const Tensor* logits) {
  RT_CHECK(t->ne[1] == logits->ne[1], op, ": ", role, " ", t->describe(), " must have N = ", logits->ne[1],
           " rows like ", logits->describe());
}

void check_labels(const char* op, const Tensor* labels, const Tensor* logits) {
  RT_CHECK(is_int(labels->dtype), op, ": labels must be i32 or i64, got ", labels->describe());
  RT_CHECK(labels->n_dims() == 1 && labels->ne[0] == logits->ne[1], op, ": labels ", labels->describe(),
           " must be [N] with N = ", logits->ne[1], " like logits ", logits->describe());
}

void check_same_slots(const char* op, const char* role, const Tensor* t, const Tensor* like) {
  RT_CHECK(t->ne[2] == 1 && t->ne[3] == 1 && t->ne[0] == like->ne[0] && t->ne[1] == like->ne[1], op, ": ",
           role, " ", t->describe(), " must be [N, K] like ", like->describe());
}

// Option errors name the op and the student's shape: "topk_kd: beta must be in [0, 1] ..., got 1.5 (logits
// f32[4, 6])".
std::string context(const Tensor* x) {
  return " (logits " + x->describe() + ")";
}

// Node and outputs.

Tensor* loss_node(Context& ctx, Op op, Tensor* logits, Reduction red) {
  int64_t ne[kMaxDims] = {1, 1, 1, 1};
  if (red == Reduction::None) ne[0] = logits->ne[1];
  Tensor* t = ctx.node(op, DType::F32, ne);
  t->src[0] = logits;
  t->ip[kIpReduction] = int64_t(red);
  return t;
}

Tensor* add_aux(Context& ctx, Tensor* node, int slot, const int64_t ne[kMaxDims]) {
  Tensor* a = ctx.node(Op::AuxOutput, DType::F32, ne);
  a->src[0] = node;
  a->flags |= kOutput;  // asked for by name, so read after the run: never reuse its memory
  node->aux[size_t(slot)] = a;
  return a;
}

LossOutputs make_outputs(Context& ctx, Tensor* node, bool per_row, bool lse, bool parts) {
  LossOutputs o;
  o.loss = node;
  const int64_t n = node->src[0]->ne[1];
  const bool none = Reduction(node->ip[kIpReduction]) == Reduction::None;
  int64_t row_ne[kMaxDims] = {n, 1, 1, 1};
  if (per_row) o.per_row = none ? node : add_aux(ctx, node, kAuxRows, row_ne);
  if (lse) o.lse = add_aux(ctx, node, kAuxLse, row_ne);
  if (parts) {
    // One extra output holds both, hard in row 0 and soft in row 1 (a node has four extra outputs at most).
    int64_t pne[kMaxDims] = {none ? n : 1, 2, 1, 1};
    Tensor* p = add_aux(ctx, node, kAuxParts, pne);
    o.hard = slice(ctx, p, 1, 0, 1);
    o.soft = slice(ctx, p, 1, 1, 1);
    o.hard->flags |= kOutput;
    o.soft->flags |= kOutput;
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
float* f32(const Tensor* t) {
  return t ? static_cast<float*>(t->data) : nullptr;
}

// Wires the node's outputs into a RowOut, lets run() fill it, then reduces. valid is the number of rows that
// count (the mean's divisor, and the gradient's scale 1/valid under Mean).
template <typename Run>
void run_loss(Tensor* node, int64_t valid, Run&& run) {
  const Tensor* x = node->src[0];
  const int64_t n = x->ne[1];
  const Reduction red = Reduction(node->ip[kIpReduction]);
  const bool none = red == Reduction::None;
  std::vector<float> rows_buf, hard_buf, soft_buf;
  loss::RowOut out;
  if (none) {
    out.loss = f32(node);
  } else if (node->aux[kAuxRows]) {
    out.loss = f32(node->aux[kAuxRows]);
  } else {
    rows_buf.resize(size_t(n));
    out.loss = rows_buf.data();
  }
  out.lse = f32(node->aux[kAuxLse]);
  Tensor* parts = node->aux[kAuxParts];
  if (parts && none) {
    out.hard = f32(parts);
    out.soft = f32(parts) + n;
  } else if (parts) {
    hard_buf.resize(size_t(n));
    soft_buf.resize(size_t(n));
    out.hard = hard_buf.data();
    out.soft = soft_buf.data();
  }
  const float inv = red == Reduction::Mean ? (valid > 0 ? 1.0f / float(valid) : 0.0f) : 1.0f;
  if (node->ip[kIpGrad] && node->aux[kAuxGrad]) {
    const Tensor* g = node->aux[kAuxGrad];
    out.grad = loss::Block::dense(g->data, g->dtype, n, x->ne[0]);
    out.grad_scale = inv;
  }
  run(out);
  if (none) return;
  // Rows are summed in order in double, so the result does not depend on the thread count.
  auto reduce = [&](const float* v) {
    double s = 0;
    for (int64_t r = 0; r < n; ++r) s += v[r];
    return float(s * double(inv));
  };
  *f32(node) = reduce(out.loss);
  if (parts) {
    f32(parts)[0] = reduce(out.hard);
    f32(parts)[1] = reduce(out.soft);
  }
}

// The node's options and side data (the gathered top-K node has no ids: src[1] is null).
loss::LossSpec spec_of(const Tensor* node) {
  loss::LossSpec s = loss::spec_from_slots(node, loss::loss_kind_of(node->op));
  switch (s.kind) {
    case loss::LossKind::CrossEntropy:
      s.ce.labels = column(node->src[1]);
      break;
    case loss::LossKind::TopK:
      s.topk.ids = matrix(node->src[1]);
      s.topk.logprobs = matrix(node->src[2]);
      s.topk.mask = matrix(node->src[3]);
      s.topk.labels = column(node->src[4]);
      break;
    case loss::LossKind::Distill:
      s.distill.teacher = matrix(node->src[1]);
      s.distill.labels = column(node->src[2]);
      break;
    case loss::LossKind::Entropy:
      break;
    case loss::LossKind::SelectiveLogSoftmax:
      s.selective.ids = matrix(node->src[1]);
      break;
    case loss::LossKind::TopKLogprobs:  // only as a fused linear op (fused_linear.cpp)
      RT_ASSERT(false);
      break;
  }
  return s;
}

void cpu_row_loss(Tensor* node, ThreadPool& pool) {
  const Tensor* x = node->src[0];
  const loss::LossSpec spec = spec_of(node);
  const int64_t valid = loss::check_side(spec, x->ne[1], x->ne[0], what(node));
  run_loss(node, valid, [&](const loss::RowOut& out) { loss::row_loss(spec, matrix(x), out, pool); });
}

void cpu_selective(Tensor* node, ThreadPool& pool) {
  const Tensor* x = node->src[0];
  loss::LossSpec spec = spec_of(node);
  loss::check_side(spec, x->ne[1], x->ne[0], what(node));
  spec.selective.values = loss::Block::dense(node->data, DType::F32, x->ne[1], node->ne[0]);
  loss::RowOut out;
  out.lse = f32(node->aux[kAuxLse]);
  loss::row_loss(spec, matrix(x), out, pool);
}

// src = logits, ids, upstream gradient [N, K], the forward's lse [N]. The forward checked the ids.
void cpu_selective_back(Tensor* node, ThreadPool& pool) {
  const Tensor* x = node->src[0];
  loss::LossSpec spec = spec_of(node);
  spec.selective.values = matrix(node->src[2]);
  spec.selective.lse = f32(node->src[3]);
  loss::RowOut out;
  out.grad = loss::Block::dense(node->data, node->dtype, x->ne[1], x->ne[0]);
  loss::row_loss(spec, matrix(x), out, pool);
}

// Backward.

bool is_unit_fill(const Tensor* g) {
  return g->op == Op::Fill && g->fp[0] == 1.0f;
}

void back_loss(BackwardCtx& bc, Tensor* node, Tensor* grad) {
  const char* const* r = roles(node->op);
  for (int i = 1; i < 5; ++i) {  // no loss has more than five sources
    Tensor* s = node->src[size_t(i)];
    // Every float input besides the student's logits is teacher data (labels and ids are integers).
    RT_CHECK(!(s && is_float(s->dtype) && bc.needs(s)), op_name(node->op), ": ", r[i], " ", s->describe(),
             " needs a gradient (it is a parameter or computed from one), but teacher inputs are constants: "
             "no gradient flows to them");
  }
  Tensor* x = node->src[0];
  if (!bc.needs(x)) return;
  Tensor*& gz = node->aux[kAuxGrad];
  if (!gz) {
    gz = bc.ctx.node(Op::AuxOutput, DType::F32, x->ne);
    gz->src[0] = node;
  }
  RT_CHECK(gz->dtype == DType::F32 && !gz->view_src, op_name(node->op),
           ": the logits gradient was already asked for as ", gz->describe(),
           " (logits_grad); a graph backward through the same loss needs its own f32 gradient");
  node->ip[kIpGrad] = 1;  // the forward pass now writes gz too
  if (is_unit_fill(grad)) {
    bc.add(x, gz);
    return;
  }
  Tensor* u = grad;
  if (Reduction(node->ip[kIpReduction]) == Reduction::None) {  // one upstream value per row: [N] -> [N, 1]
    if (!u->is_contiguous()) u = contiguous(bc.ctx, u);
    u = reshape(bc.ctx, u, {x->ne[1], 1});
  }
  bc.add(x, mul(bc.ctx, gz, u));
}

// The gradient of selective log-softmax's output `node` given the upstream gradient of that output, in dtype.
Tensor* selective_back_node(Context& ctx, Tensor* node, Tensor* grad, DType dtype) {
  Tensor* x = node->src[0];
  Tensor*& lse = node->aux[kAuxLse];
  if (!lse) {  // the forward keeps its row normalizers for the backward's single pass
    int64_t ne[kMaxDims] = {x->ne[1], 1, 1, 1};
    lse = ctx.node(Op::AuxOutput, DType::F32, ne);
    lse->src[0] = node;
  }
  Tensor* t = ctx.node(Op::SelectiveLogSoftmaxBack, dtype, x->ne);
  t->src[0] = x;
  t->src[1] = node->src[1];
  t->src[2] = grad;
  t->src[3] = lse;
  return t;
}

void back_selective(BackwardCtx& bc, Tensor* node, Tensor* grad) {
  if (bc.needs(node->src[0])) bc.add(node->src[0], selective_back_node(bc.ctx, node, grad, DType::F32));
}

}  // namespace

// Constructors.

LossOutputs cross_entropy_loss(Context& ctx, Tensor* logits, Tensor* labels, const CrossEntropyOptions& o) {
  const char* op = "cross_entropy_loss";
  check_matrix(op, "logits", logits, true);
  RT_CHECK(labels != nullptr, op, ": labels are null");
  check_labels(op, labels, logits);
  loss::check_options(op, o, context(logits));
  Tensor* t = loss_node(ctx, Op::CrossEntropyLoss, logits, o.reduction);
  t->src[1] = labels;
  loss::set_options(t, o);
  return make_outputs(ctx, t, o.return_per_row, o.return_lse, false);
}

LossOutputs topk_kd(Context& ctx, Tensor* logits, Tensor* teacher_ids, Tensor* teacher_logprobs, Tensor* mask,
                    Tensor* labels, const TopKDistillOptions& o) {
  const char* op = "topk_kd";
  check_matrix(op, "logits", logits, true);
  check_matrix(op, "teacher_ids", teacher_ids, false);
  check_matrix(op, "teacher_logprobs", teacher_logprobs, true);
  check_rows(op, "teacher_ids", teacher_ids, logits);
  check_same_slots(op, "teacher_logprobs", teacher_logprobs, teacher_ids);
  RT_CHECK(teacher_ids->ne[0] <= logits->ne[0], op, ": teacher_ids ", teacher_ids->describe(),
           " has K = ", teacher_ids->ne[0], " slots but logits ", logits->describe(),
           " has only V = ", logits->ne[0], " entries (K must be <= V)");
  if (mask) check_same_slots(op, "mask", mask, teacher_ids);
  if (labels) check_labels(op, labels, logits);
  loss::check_options(op, o, labels != nullptr, context(logits));
  Tensor* t = loss_node(ctx, Op::TopKDistill, logits, o.reduction);
  t->src[1] = teacher_ids;
  t->src[2] = teacher_logprobs;
  t->src[3] = mask;
  t->src[4] = labels;
  loss::set_options(t, o);
  return make_outputs(ctx, t, o.return_per_row, o.return_lse, o.return_parts);
}

LossOutputs topk_kl_gathered(Context& ctx, Tensor* student_gathered, Tensor* teacher_logprobs, Tensor* mask,
                             const TopKKLOptions& o) {
  const char* op = "topk_kl_gathered";
  check_matrix(op, "student_gathered", student_gathered, true);
  check_matrix(op, "teacher_logprobs", teacher_logprobs, true);
  check_same_slots(op, "teacher_logprobs", teacher_logprobs, student_gathered);
  if (mask) check_same_slots(op, "mask", mask, student_gathered);
  loss::check_reduction(op, o.reduction, context(student_gathered));
  loss::check_temperature(op, o.temperature, context(student_gathered));
  Tensor* t = loss_node(ctx, Op::TopKKLGathered, student_gathered, o.reduction);
  t->src[2] = teacher_logprobs;
  t->src[3] = mask;
  TopKDistillOptions kl;  // forward KL over the slots
  kl.temperature = o.temperature;
  kl.normalize_topk = true;
  loss::set_options(t, kl);
  return make_outputs(ctx, t, o.return_per_row, o.return_lse, false);
}

LossOutputs distill(Context& ctx, Tensor* student, Tensor* teacher, Tensor* labels, const DistillOptions& o) {
  const char* op = "distill";
  check_matrix(op, "student", student, true);
  check_matrix(op, "teacher", teacher, true);
  RT_CHECK(same_shape(student, teacher), op, ": teacher ", teacher->describe(),
           " must have the shape of student ", student->describe());
  if (labels) check_labels(op, labels, student);
  loss::check_options(op, o, labels != nullptr, context(student));
  Tensor* t = loss_node(ctx, Op::Distill, student, o.reduction);
  t->src[1] = teacher;
  t->src[2] = labels;
  loss::set_options(t, o);
  return make_outputs(ctx, t, o.return_per_row, o.return_lse, o.return_parts);
}

Tensor* entropy(Context& ctx, Tensor* logits, float temperature, Reduction reduction) {
  const char* op = "entropy";
  check_matrix(op, "logits", logits, true);
  loss::check_reduction(op, reduction, context(logits));
  loss::check_temperature(op, temperature, context(logits));
  Tensor* t = loss_node(ctx, Op::Entropy, logits, reduction);
  loss::set_entropy_options(t, temperature);
  return t;
}

Tensor* selective_log_softmax(Context& ctx, Tensor* logits, Tensor* ids) {
  const char* op = "selective_log_softmax";
  check_matrix(op, "logits", logits, true);
  check_matrix(op, "ids", ids, false);
  check_rows(op, "ids", ids, logits);
  int64_t ne[kMaxDims] = {ids->ne[0], ids->ne[1], 1, 1};
  Tensor* t = ctx.node(Op::SelectiveLogSoftmax, DType::F32, ne);
  t->src[0] = logits;
  t->src[1] = ids;
  return t;
}

Tensor* logits_grad(Context& ctx, Tensor* loss, DType dtype, bool in_place) {
  const char* op = "logits_grad";
  RT_CHECK(loss != nullptr, op, ": loss is null");
  const Op k = loss->op;
  RT_CHECK(k == Op::CrossEntropyLoss || k == Op::TopKDistill || k == Op::TopKKLGathered || k == Op::Distill ||
               k == Op::Entropy,
           op, ": ", loss->describe(), " is not the loss of a row loss (cross_entropy_loss, topk_kd, ",
           "topk_kl_gathered, distill, entropy)");
  RT_CHECK(Reduction(loss->ip[kIpReduction]) != Reduction::None, op, ": ", op_name(k),
           " has reduction 'none': a gradient is taken of a single number ('mean' or 'sum')");
  RT_CHECK(is_float(dtype), op, ": dtype must be f32, bf16 or f16, got ", dtype_name(dtype));
  Tensor* x = loss->src[0];
  RT_CHECK(!loss->aux[kAuxGrad], op, ": the logits gradient of this ", op_name(k),
           " was already asked for (by logits_grad or a graph backward)");
  if (in_place)
    RT_CHECK(x->dtype == dtype && x->is_contiguous() && !x->is_view(), op, ": an in-place gradient over ",
             x->describe(), " needs contiguous logits of the gradient's dtype ", dtype_name(dtype),
             " that are not a view");
  Tensor* g = ctx.node(Op::AuxOutput, dtype, x->ne);
  g->src[0] = loss;
  if (in_place) g->view_src = x;  // the forward writes over the logits it has just read (row by row)
  loss->aux[kAuxGrad] = g;
  loss->ip[kIpGrad] = 1;
  return g;
}

Tensor* selective_log_softmax_grad(Context& ctx, Tensor* values, Tensor* grad_output, DType dtype) {
  const char* op = "selective_log_softmax_grad";
  RT_CHECK(values != nullptr && values->op == Op::SelectiveLogSoftmax, op, ": ",
           values ? values->describe() : std::string("null"), " is not the result of selective_log_softmax");
  RT_CHECK(grad_output != nullptr && is_float(grad_output->dtype) && same_shape(grad_output, values), op,
           ": grad_output ", grad_output ? grad_output->describe() : std::string("null"),
           " must be a float tensor shaped like the output ", values->describe());
  RT_CHECK(is_float(dtype), op, ": dtype must be f32, bf16 or f16, got ", dtype_name(dtype));
  return selective_back_node(ctx, values, grad_output, dtype);
}

void register_loss_ops(OpTable& t) {
  t[size_t(Op::CrossEntropyLoss)] = {cpu_row_loss, back_loss, true};
  t[size_t(Op::TopKDistill)] = {cpu_row_loss, back_loss, true};
  t[size_t(Op::TopKKLGathered)] = {cpu_row_loss, back_loss, true};
  t[size_t(Op::Distill)] = {cpu_row_loss, back_loss, true};
  t[size_t(Op::Entropy)] = {cpu_row_loss, back_loss, true};
  t[size_t(Op::SelectiveLogSoftmax)] = {cpu_selective, back_selective, true};
  t[size_t(Op::SelectiveLogSoftmaxBack)] = {cpu_selective_back, nullptr, false};
}

}  // namespace retort
