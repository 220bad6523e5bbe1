// retort.losses: each loss of the loss backend as a plain function over arrays. A call wraps its inputs
// (NumPy arrays, DLPack producers such as PyTorch CUDA tensors, or retort Tensors) without copying where it
// can, builds a one-loss graph on the inputs' backend, runs it with the GIL released, and returns the loss
// and, when asked, the gradient with respect to the student's logits, per-row values and log-sum-exps.
// Results are NumPy arrays when the call ran on the CPU, retort Tensors (DLPack-ready, kept alive with their
// graph) when it ran on a device.
#include "loss_call.h"

namespace retort::py {

namespace {

const char* const kResults =
    "\n\nInputs are NumPy arrays, DLPack producers (PyTorch, CuPy, JAX: CUDA tensors are used in place on "
    "retort.cuda(device)) or retort Tensors; backend overrides where the call runs. Returns the loss; with "
    "return_grad or any return_* flag, a LossResult(loss, grad, per_row, lse, hard, soft) with None for what "
    "was not asked for. grad is d(loss)/d(logits), written by the loss's own pass (no [N, V] f32 temporary) "
    "in "
    "grad_dtype (default: the logits' dtype; 'f32' for full precision); inplace_grad writes it over the "
    "logits themselves and returns them as grad (they must be usable without a copy: contiguous, writable, "
    "on the device the call runs on). Results are NumPy arrays on the CPU and retort "
    "Tensors (use DLPack) on a device. Raises retort.Error (a ValueError) naming the op on bad shapes, "
    "dtypes, options, or a label/id out of range.";

std::string doc(const char* text) {
  return std::string(text) + kResults;
}

}  // namespace

void bind_losses(pyb::module_& m) {
  pyb::module_ losses = m.def_submodule(
      "losses",
      "The loss backend as plain functions over arrays: cross_entropy, topk_kd, topk_kl_gathered, distill, "
      "entropy, selective_log_softmax. Logits are [N, V] (N rows of V; reshape [B, T, V] first), f32, bf16 "
      "or "
      "f16, strided views welcome; math is f32. Keyword names match the C++ options. For graph building "
      "(losses inside a model) use the nodes in retort.ops.");

  losses.attr("_result_types") = pyb::dict();  // LossCall's namedtuple classes, one per field list

  losses.def(
      "cross_entropy",
      [](pyb::handle logits, pyb::handle labels, int64_t ignore_index, float label_smoothing, float z_loss,
         float softcap, pyb::handle reduction, bool return_per_row, bool return_lse, bool return_grad,
         pyb::handle grad_dtype, bool inplace_grad, pyb::handle backend) {
        LossCall c("cross_entropy_loss", {logits, labels}, backend);
        c.set_grad_dtype(grad_dtype);
        Tensor* x = c.input(logits, "logits");
        Tensor* y = c.input(labels, "labels");
        CrossEntropyOptions o{ignore_index,   label_smoothing, z_loss, softcap, parse_reduction(reduction),
                              return_per_row, return_lse};
        LossOutputs out = cross_entropy_loss(c.ctx(), x, y, o);
        if (return_grad || inplace_grad) c.row_grad(out.loss, o.reduction, x, logits, inplace_grad);
        return c.finish(out.loss, o.reduction, out);
      },
      pyb::arg("logits"), pyb::arg("labels"), pyb::kw_only(), pyb::arg("ignore_index") = -100,
      pyb::arg("label_smoothing") = 0.0f, pyb::arg("z_loss") = 0.0f, pyb::arg("softcap") = 0.0f,
      pyb::arg("reduction") = "mean", pyb::arg("return_per_row") = false, pyb::arg("return_lse") = false,
      pyb::arg("return_grad") = false, pyb::arg("grad_dtype") = pyb::none(), pyb::arg("inplace_grad") = false,
      pyb::arg("backend") = pyb::none(),
      doc("Cross-entropy of logits [N, V] against integer labels [N]. Per row: (1 - label_smoothing) * "
          "(lse - z[label]) + label_smoothing * mean_j(lse - z_j) + z_loss * lse^2, where z are the logits "
          "(softcapped to softcap * tanh(z / softcap) first when softcap > 0) and lse their log-sum-exp. "
          "Rows "
          "whose label is ignore_index count for nothing; reduction 'mean' divides by the other rows (0 when "
          "there are none), 'sum' adds, 'none' returns [N]. return_lse gives every row's lse.")
          .c_str());

  losses.def(
      "topk_kd",
      [](pyb::handle logits, pyb::handle ids, pyb::handle logprobs, pyb::handle mask, pyb::handle labels,
         float beta, const std::string& divergence, float skew_alpha, float temperature, bool normalize_topk,
         float w_hard, float w_soft, int64_t ignore_index, pyb::handle reduction, bool return_per_row,
         bool return_lse, bool return_parts, bool return_grad, pyb::handle grad_dtype, bool inplace_grad,
         pyb::handle backend) {
        LossCall c("topk_kd", {logits, ids, logprobs, mask, labels}, backend);
        c.set_grad_dtype(grad_dtype);
        Tensor* x = c.input(logits, "logits");
        Tensor* ti = c.input(ids, "teacher_ids");
        Tensor* tl = c.input(logprobs, "teacher_logprobs");
        Tensor* mk = c.input(mask, "mask", true);
        Tensor* y = c.input(labels, "labels", true);
        TopKDistillOptions o{parse_divergence(divergence),
                             beta,
                             skew_alpha,
                             temperature,
                             normalize_topk,
                             w_hard,
                             w_soft,
                             ignore_index,
                             parse_reduction(reduction),
                             return_per_row,
                             return_lse,
                             return_parts};
        LossOutputs out = topk_kd(c.ctx(), x, ti, tl, mk, y, o);
        if (return_grad || inplace_grad) c.row_grad(out.loss, o.reduction, x, logits, inplace_grad);
        return c.finish(out.loss, o.reduction, out);
      },
      pyb::arg("logits"), pyb::arg("teacher_ids"), pyb::arg("teacher_logprobs"),
      pyb::arg("mask") = pyb::none(), pyb::arg("labels") = pyb::none(), pyb::kw_only(),
      pyb::arg("beta") = 0.0f, pyb::arg("divergence") = "kl", pyb::arg("skew_alpha") = 0.1f,
      pyb::arg("temperature") = 1.0f, pyb::arg("normalize_topk") = false, pyb::arg("w_hard") = 0.0f,
      pyb::arg("w_soft") = 1.0f, pyb::arg("ignore_index") = -100, pyb::arg("reduction") = "mean",
      pyb::arg("return_per_row") = false, pyb::arg("return_lse") = false, pyb::arg("return_parts") = false,
      pyb::arg("return_grad") = false, pyb::arg("grad_dtype") = pyb::none(), pyb::arg("inplace_grad") = false,
      pyb::arg("backend") = pyb::none(),
      doc("Top-K distillation of student logits [N, V] against a teacher's top K per row: teacher_ids int "
          "[N, K], teacher_logprobs float [N, K], mask [N, K] (nonzero = valid; optional), labels int [N] "
          "(optional unless w_hard > 0). A slot with mask 0 or logprob -inf is padding. P is the teacher "
          "over "
          "its valid slots (renormalized at temperature T != 1), Q = softmax(z / T) read at the slots (or "
          "renormalized over them with normalize_topk). Per row: w_hard * CE(z, label) at T = 1 + w_soft * "
          "T^2 "
          "* D(P, Q). divergence picks D: 'kl' (the default) is forward KL(P||Q) at beta = 0, reverse "
          "KL(Q||P) at beta = 1, the generalized JSD between; 'tvd' is 0.5 * sum |p - q|; 'skew_kl' is "
          "KL(P || a P + (1 - a) Q) and 'skew_reverse_kl' KL(Q || (1 - a) P + a Q), a = skew_alpha "
          "(DistiLLM). "
          "Rows labelled ignore_index count for nothing; 'mean' divides by the other rows (all N "
          "without labels). return_parts gives the unweighted hard and soft parts.")
          .c_str());

  losses.def(
      "topk_kl_gathered",
      [](pyb::handle student, pyb::handle logprobs, pyb::handle mask, float temperature,
         pyb::handle reduction, bool return_per_row, bool return_lse, bool return_grad,
         pyb::handle grad_dtype, bool inplace_grad, pyb::handle backend) {
        LossCall c("topk_kl_gathered", {student, logprobs, mask}, backend);
        c.set_grad_dtype(grad_dtype);
        Tensor* s = c.input(student, "student_gathered");
        Tensor* tl = c.input(logprobs, "teacher_logprobs");
        Tensor* mk = c.input(mask, "mask", true);
        TopKKLOptions o{temperature, parse_reduction(reduction), return_per_row, return_lse};
        LossOutputs out = topk_kl_gathered(c.ctx(), s, tl, mk, o);
        if (return_grad || inplace_grad) c.row_grad(out.loss, o.reduction, s, student, inplace_grad);
        return c.finish(out.loss, o.reduction, out);
      },
      pyb::arg("student_gathered"), pyb::arg("teacher_logprobs"), pyb::arg("mask") = pyb::none(),
      pyb::kw_only(), pyb::arg("temperature") = 1.0f, pyb::arg("reduction") = "mean",
      pyb::arg("return_per_row") = false, pyb::arg("return_lse") = false, pyb::arg("return_grad") = false,
      pyb::arg("grad_dtype") = pyb::none(), pyb::arg("inplace_grad") = false,
      pyb::arg("backend") = pyb::none(),
      doc("Forward KL(P||Q) * T^2 where the student's logits are already gathered at the teacher's ids: "
          "student_gathered [N, K], Q = softmax over the valid slots of student_gathered / T, P from "
          "teacher_logprobs [N, K] (mask [N, K] optional, as in topk_kd). 'mean' divides by all N rows. "
          "return_lse gives the log-sum-exp over the valid slots of student_gathered / T.")
          .c_str());

  losses.def(
      "distill",
      [](pyb::handle student, pyb::handle teacher, pyb::handle labels, float beta,
         const std::string& divergence, float skew_alpha, float temperature, float w_hard, float w_soft,
         int64_t ignore_index, pyb::handle reduction, bool return_per_row, bool return_lse, bool return_parts,
         bool return_grad, pyb::handle grad_dtype, bool inplace_grad, pyb::handle backend) {
        LossCall c("distill", {student, teacher, labels}, backend);
        c.set_grad_dtype(grad_dtype);
        Tensor* s = c.input(student, "student");
        Tensor* t = c.input(teacher, "teacher");
        Tensor* y = c.input(labels, "labels", true);
        DistillOptions o{parse_divergence(divergence),
                         beta,
                         skew_alpha,
                         temperature,
                         w_hard,
                         w_soft,
                         ignore_index,
                         parse_reduction(reduction),
                         return_per_row,
                         return_lse,
                         return_parts};
        LossOutputs out = distill(c.ctx(), s, t, y, o);
        if (return_grad || inplace_grad) c.row_grad(out.loss, o.reduction, s, student, inplace_grad);
        return c.finish(out.loss, o.reduction, out);
      },
      pyb::arg("student"), pyb::arg("teacher"), pyb::arg("labels") = pyb::none(), pyb::kw_only(),
      pyb::arg("beta") = 0.0f, pyb::arg("divergence") = "kl", pyb::arg("skew_alpha") = 0.1f,
      pyb::arg("temperature") = 1.0f, pyb::arg("w_hard") = 0.0f, pyb::arg("w_soft") = 1.0f,
      pyb::arg("ignore_index") = -100, pyb::arg("reduction") = "mean", pyb::arg("return_per_row") = false,
      pyb::arg("return_lse") = false, pyb::arg("return_parts") = false, pyb::arg("return_grad") = false,
      pyb::arg("grad_dtype") = pyb::none(), pyb::arg("inplace_grad") = false,
      pyb::arg("backend") = pyb::none(),
      doc("Full-vocabulary distillation: P = softmax(teacher / T), Q = softmax(student / T), student and "
          "teacher [N, V], labels int [N] (optional unless w_hard > 0). Per row: w_hard * CE(student, label) "
          "at T = 1 + w_soft * T^2 * D(P, Q), D as in topk_kd (divergence, beta and "
          "skew_alpha). The gradient is with respect to the student.")
          .c_str());

  losses.def(
      "entropy",
      [](pyb::handle logits, float temperature, pyb::handle reduction, bool return_grad,
         pyb::handle grad_dtype, bool inplace_grad, pyb::handle backend) {
        LossCall c("entropy", {logits}, backend);
        c.set_grad_dtype(grad_dtype);
        Tensor* x = c.input(logits, "logits");
        const Reduction r = parse_reduction(reduction);
        Tensor* e = entropy(c.ctx(), x, temperature, r);
        if (return_grad || inplace_grad) c.row_grad(e, r, x, logits, inplace_grad);
        return c.finish(e, r);
      },
      pyb::arg("logits"), pyb::kw_only(), pyb::arg("temperature") = 1.0f, pyb::arg("reduction") = "none",
      pyb::arg("return_grad") = false, pyb::arg("grad_dtype") = pyb::none(), pyb::arg("inplace_grad") = false,
      pyb::arg("backend") = pyb::none(),
      doc("Entropy of softmax(logits / temperature) per row of logits [N, V]: [N] under reduction 'none' "
          "(the "
          "default), else the mean or sum over rows. return_grad needs 'mean' or 'sum'.")
          .c_str());

  losses.def(
      "selective_log_softmax",
      [](pyb::handle logits, pyb::handle ids, pyb::handle grad_output, pyb::handle grad_dtype,
         pyb::handle backend) {
        LossCall c("selective_log_softmax", {logits, ids, grad_output}, backend);
        c.set_grad_dtype(grad_dtype);
        Tensor* x = c.input(logits, "logits");
        Tensor* i = c.input(ids, "ids");
        Tensor* v = selective_log_softmax(c.ctx(), x, i);
        if (grad_output.is_none()) return c.finish(v, Reduction::None);
        Tensor* go = c.input(grad_output, "grad_output");
        c.direct_grad("grad", selective_log_softmax_grad(c.ctx(), v, go, c.grad_dtype_or(x->dtype)), x);
        c.set_values(v);
        return c.finish(sum(c.ctx(), mul(c.ctx(), v, go)), Reduction::Sum);  // the surrogate sum(values * g)
      },
      pyb::arg("logits"), pyb::arg("ids"), pyb::kw_only(), pyb::arg("grad_output") = pyb::none(),
      pyb::arg("grad_dtype") = pyb::none(), pyb::arg("backend") = pyb::none(),
      "log softmax(logits)[ids] for logits [N, V] and integer ids [N, K]: f32 [N, K] (a NumPy array on the "
      "CPU, a retort Tensor on a device). With grad_output [N, K] (the gradient of some loss with respect to "
      "that output): a LossResult whose values field holds the output, grad the gradient with respect to "
      "the logits ([N, V] in grad_dtype, default the logits' dtype, from one pass over them) and loss "
      "sum(values * grad_output). Raises retort.Error on bad "
      "shapes or an id outside [0, V).");

  // The fused linear losses (lm-head matmul + loss in chunks) are in fused.cpp.
  bind_fused(m);
}

}  // namespace retort::py
