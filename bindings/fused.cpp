// The fused linear losses (src/ops/loss/fused_linear.h): the lm-head matmul hidden · weightᵀ (+ bias) and a
// loss as one node that never holds the [N, V] logits. retort.losses gets them as plain functions over arrays
// (gradients for hidden, weight and bias on request), retort.ops as graph nodes. Positional arguments follow
// the C++ functions without ctx; bias (and teacher_bias) are keywords; the loss options and the
// FusedLinearOptions (memory_budget, chunk_rows, grad_hidden, grad_weight, grad_bias) are keywords with the
// C++ names.
#include "loss_call.h"
#include "op_args.h"

namespace retort::py {

namespace {

const std::vector<std::string> kSlots = {"grad_hidden", "grad_weight", "grad_bias"};

const char* const kFusedResults =
    "\n\nhidden is [N, H], weight [V, H] (one row per vocabulary entry, like nn.Linear), bias [V]; f32, bf16 "
    "or f16. memory_budget bounds the chunk's logits in bytes (0, the default: an eighth of the backend's "
    "free "
    "memory, 32 MiB to 1 GiB on a GPU, to 256 MiB on the CPU; chunk_rows > 0 fixes the chunk instead); "
    "grad_hidden / grad_weight / grad_bias switch single gradients off. Inputs are NumPy arrays, DLPack "
    "producers or retort Tensors; backend overrides where the call runs. Returns the loss; with return_grad "
    "or "
    "any return_* flag, a LossResult(loss, grad_hidden, grad_weight, grad_bias, per_row, lse, hard, soft) "
    "with None for what was not asked for; each gradient in grad_dtype (default: its input's dtype; dW is "
    "accumulated in f32 and cast once). logits_dtype: the chunk logits' dtype (default: the inputs' when "
    "hidden and weight share a 16-bit dtype, else f32; a CUDA speed option, the CPU keeps f32). NumPy arrays "
    "on the CPU, retort Tensors on a "
    "device. "
    "Raises retort.Error naming the op on bad shapes, dtypes, options, or a label/id out of range.";

std::string fdoc(const char* text) {
  return std::string(text) + kFusedResults;
}

FusedLinearOptions fused_opts(size_t memory_budget, int64_t chunk_rows, pyb::handle logits_dtype, bool gh,
                              bool gw, bool gb) {
  return FusedLinearOptions{memory_budget, chunk_rows, gh, gw, gb, parse_dtype_opt(logits_dtype)};
}

// The trainable inputs of a plain fused call: hidden, weight and (optional) bias.
struct Student {
  Tensor *hidden, *weight, *bias;
};
Student students(LossCall& c, pyb::handle hidden, pyb::handle weight, pyb::handle bias, bool want,
                 const FusedLinearOptions& f) {
  return {c.student(hidden, "hidden", want && f.grad_hidden, "grad_hidden"),
          c.student(weight, "weight", want && f.grad_weight, "grad_weight"),
          c.student(bias, "bias", want && f.grad_bias, "grad_bias", true)};
}

}  // namespace

void bind_fused(pyb::module_& m) {
  pyb::module_ losses = m.attr("losses");
  pyb::module_ ops = m.attr("ops");
  const size_t kBudget = kFusedLinearAutoBudget;

  // ---- plain functions --------------------------------------------------------------------------------
  losses.def(
      "fused_linear_cross_entropy",
      [](pyb::handle hidden, pyb::handle weight, pyb::handle labels, pyb::handle bias, int64_t ignore_index,
         float label_smoothing, float z_loss, float softcap, pyb::handle reduction, bool return_per_row,
         bool return_lse, size_t memory_budget, int64_t chunk_rows, pyb::handle logits_dtype, bool gh,
         bool gw, bool gb, bool return_grad, pyb::handle grad_dtype, pyb::handle backend) {
        LossCall c("fused_linear_cross_entropy", {hidden, weight, labels, bias}, backend, kSlots);
        c.set_grad_dtype(grad_dtype);
        const FusedLinearOptions f = fused_opts(memory_budget, chunk_rows, logits_dtype, gh, gw, gb);
        const Student s = students(c, hidden, weight, bias, return_grad, f);
        Tensor* y = c.input(labels, "labels");
        CrossEntropyOptions o{ignore_index,   label_smoothing, z_loss, softcap, parse_reduction(reduction),
                              return_per_row, return_lse};
        LossOutputs out = fused_linear_cross_entropy(c.ctx(), s.hidden, s.weight, s.bias, y, o, f);
        return c.finish(out.loss, o.reduction, out);
      },
      pyb::arg("hidden"), pyb::arg("weight"), pyb::arg("labels"), pyb::kw_only(),
      pyb::arg("bias") = pyb::none(), pyb::arg("ignore_index") = -100, pyb::arg("label_smoothing") = 0.0f,
      pyb::arg("z_loss") = 0.0f, pyb::arg("softcap") = 0.0f, pyb::arg("reduction") = "mean",
      pyb::arg("return_per_row") = false, pyb::arg("return_lse") = false, pyb::arg("memory_budget") = kBudget,
      pyb::arg("chunk_rows") = 0, pyb::arg("logits_dtype") = pyb::none(), pyb::arg("grad_hidden") = true,
      pyb::arg("grad_weight") = true, pyb::arg("grad_bias") = true, pyb::arg("return_grad") = false,
      pyb::arg("grad_dtype") = pyb::none(), pyb::arg("backend") = pyb::none(),
      fdoc("Cross-entropy of the logits hidden @ weight.T (+ bias) against integer labels [N], without "
           "materializing them; options as retort.losses.cross_entropy.")
          .c_str());

  losses.def(
      "fused_linear_topk_kd",
      [](pyb::handle hidden, pyb::handle weight, pyb::handle ids, pyb::handle logprobs, pyb::handle mask,
         pyb::handle labels, pyb::handle bias, float beta, const std::string& divergence, float skew_alpha,
         float temperature, bool normalize_topk, float w_hard, float w_soft, int64_t ignore_index,
         pyb::handle reduction, bool return_per_row, bool return_lse, bool return_parts, size_t memory_budget,
         int64_t chunk_rows, pyb::handle logits_dtype, bool gh, bool gw, bool gb, bool return_grad,
         pyb::handle grad_dtype, pyb::handle backend) {
        LossCall c("fused_linear_topk_kd", {hidden, weight, ids, logprobs, mask, labels, bias}, backend,
                   kSlots);
        c.set_grad_dtype(grad_dtype);
        const FusedLinearOptions f = fused_opts(memory_budget, chunk_rows, logits_dtype, gh, gw, gb);
        const Student s = students(c, hidden, weight, bias, return_grad, f);
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
        LossOutputs out = fused_linear_topk_kd(c.ctx(), s.hidden, s.weight, s.bias, ti, tl, mk, y, o, f);
        return c.finish(out.loss, o.reduction, out);
      },
      pyb::arg("hidden"), pyb::arg("weight"), pyb::arg("teacher_ids"), pyb::arg("teacher_logprobs"),
      pyb::arg("mask") = pyb::none(), pyb::arg("labels") = pyb::none(), pyb::kw_only(),
      pyb::arg("bias") = pyb::none(), pyb::arg("beta") = 0.0f, pyb::arg("divergence") = "kl",
      pyb::arg("skew_alpha") = 0.1f, pyb::arg("temperature") = 1.0f, pyb::arg("normalize_topk") = false,
      pyb::arg("w_hard") = 0.0f, pyb::arg("w_soft") = 1.0f, pyb::arg("ignore_index") = -100,
      pyb::arg("reduction") = "mean", pyb::arg("return_per_row") = false, pyb::arg("return_lse") = false,
      pyb::arg("return_parts") = false, pyb::arg("memory_budget") = kBudget, pyb::arg("chunk_rows") = 0,
      pyb::arg("logits_dtype") = pyb::none(), pyb::arg("grad_hidden") = true, pyb::arg("grad_weight") = true,
      pyb::arg("grad_bias") = true, pyb::arg("return_grad") = false, pyb::arg("grad_dtype") = pyb::none(),
      pyb::arg("backend") = pyb::none(),
      fdoc("Top-K distillation of the student logits hidden @ weight.T (+ bias) against a teacher's top K; "
           "inputs and options as retort.losses.topk_kd. With normalize_topk, w_hard = 0, no lse and no hard "
           "part, only the K logits at the teacher ids are computed (K dot products per row).")
          .c_str());

  losses.def(
      "fused_linear_distill",
      [](pyb::handle hidden, pyb::handle weight, pyb::handle t_hidden, pyb::handle t_weight,
         pyb::handle labels, pyb::handle bias, pyb::handle t_bias, float beta, const std::string& divergence,
         float skew_alpha, float temperature, float w_hard, float w_soft, int64_t ignore_index,
         pyb::handle reduction, bool return_per_row, bool return_lse, bool return_parts, size_t memory_budget,
         int64_t chunk_rows, pyb::handle logits_dtype, bool gh, bool gw, bool gb, bool return_grad,
         pyb::handle grad_dtype, pyb::handle backend) {
        LossCall c("fused_linear_distill", {hidden, weight, t_hidden, t_weight, labels, bias, t_bias},
                   backend, kSlots);
        c.set_grad_dtype(grad_dtype);
        const FusedLinearOptions f = fused_opts(memory_budget, chunk_rows, logits_dtype, gh, gw, gb);
        const Student s = students(c, hidden, weight, bias, return_grad, f);
        Tensor* th = c.input(t_hidden, "teacher_hidden");
        Tensor* tw = c.input(t_weight, "teacher_weight");
        Tensor* tb = c.input(t_bias, "teacher_bias", true);
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
        LossOutputs out = fused_linear_distill(c.ctx(), s.hidden, s.weight, s.bias, th, tw, tb, y, o, f);
        return c.finish(out.loss, o.reduction, out);
      },
      pyb::arg("hidden"), pyb::arg("weight"), pyb::arg("teacher_hidden"), pyb::arg("teacher_weight"),
      pyb::arg("labels") = pyb::none(), pyb::kw_only(), pyb::arg("bias") = pyb::none(),
      pyb::arg("teacher_bias") = pyb::none(), pyb::arg("beta") = 0.0f, pyb::arg("divergence") = "kl",
      pyb::arg("skew_alpha") = 0.1f, pyb::arg("temperature") = 1.0f, pyb::arg("w_hard") = 0.0f,
      pyb::arg("w_soft") = 1.0f, pyb::arg("ignore_index") = -100, pyb::arg("reduction") = "mean",
      pyb::arg("return_per_row") = false, pyb::arg("return_lse") = false, pyb::arg("return_parts") = false,
      pyb::arg("memory_budget") = kBudget, pyb::arg("chunk_rows") = 0, pyb::arg("logits_dtype") = pyb::none(),
      pyb::arg("grad_hidden") = true, pyb::arg("grad_weight") = true, pyb::arg("grad_bias") = true,
      pyb::arg("return_grad") = false, pyb::arg("grad_dtype") = pyb::none(),
      pyb::arg("backend") = pyb::none(),
      fdoc("Full-vocabulary distillation against an online teacher: student logits hidden @ weight.T (+ "
           "bias), "
           "teacher logits teacher_hidden [N, Ht] @ teacher_weight.T [V, Ht] (+ teacher_bias), both computed "
           "chunk by chunk; options as retort.losses.distill. Teacher inputs get no gradient.")
          .c_str());

  losses.def(
      "fused_linear_entropy",
      [](pyb::handle hidden, pyb::handle weight, pyb::handle bias, float temperature, pyb::handle reduction,
         size_t memory_budget, int64_t chunk_rows, pyb::handle logits_dtype, bool gh, bool gw, bool gb,
         bool return_grad, pyb::handle grad_dtype, pyb::handle backend) {
        LossCall c("fused_linear_entropy", {hidden, weight, bias}, backend, kSlots);
        c.set_grad_dtype(grad_dtype);
        const FusedLinearOptions f = fused_opts(memory_budget, chunk_rows, logits_dtype, gh, gw, gb);
        const Student s = students(c, hidden, weight, bias, return_grad, f);
        const Reduction r = parse_reduction(reduction);
        return c.finish(fused_linear_entropy(c.ctx(), s.hidden, s.weight, s.bias, temperature, r, f), r);
      },
      pyb::arg("hidden"), pyb::arg("weight"), pyb::kw_only(), pyb::arg("bias") = pyb::none(),
      pyb::arg("temperature") = 1.0f, pyb::arg("reduction") = "none", pyb::arg("memory_budget") = kBudget,
      pyb::arg("chunk_rows") = 0, pyb::arg("logits_dtype") = pyb::none(), pyb::arg("grad_hidden") = true,
      pyb::arg("grad_weight") = true, pyb::arg("grad_bias") = true, pyb::arg("return_grad") = false,
      pyb::arg("grad_dtype") = pyb::none(), pyb::arg("backend") = pyb::none(),
      fdoc("Entropy of softmax((hidden @ weight.T + bias) / temperature) per row, reduced as "
           "retort.losses.entropy (return_grad needs 'mean' or 'sum').")
          .c_str());

  losses.def(
      "fused_linear_selective_log_softmax",
      [](pyb::handle hidden, pyb::handle weight, pyb::handle ids, pyb::handle bias, pyb::handle grad_output,
         size_t memory_budget, int64_t chunk_rows, pyb::handle logits_dtype, bool gh, bool gw, bool gb,
         pyb::handle grad_dtype, pyb::handle backend) {
        LossCall c("fused_linear_selective_log_softmax", {hidden, weight, ids, bias, grad_output}, backend,
                   kSlots);
        c.set_grad_dtype(grad_dtype);
        const FusedLinearOptions f = fused_opts(memory_budget, chunk_rows, logits_dtype, gh, gw, gb);
        const Student s = students(c, hidden, weight, bias, !grad_output.is_none(), f);
        Tensor* i = c.input(ids, "ids");
        Tensor* v = fused_linear_selective_log_softmax(c.ctx(), s.hidden, s.weight, s.bias, i, f);
        if (grad_output.is_none()) return c.finish(v, Reduction::None);
        // The gradients of sum(values * grad_output): the vector-Jacobian product with grad_output.
        Tensor* go = c.input(grad_output, "grad_output");
        RT_CHECK(go->ne[0] == v->ne[0] && go->ne[1] == v->ne[1] && is_float(go->dtype),
                 "fused_linear_selective_log_softmax: grad_output ", go->describe(),
                 " must be a float tensor shaped like the output ", v->describe());
        c.set_values(v);
        return c.finish(sum(c.ctx(), mul(c.ctx(), v, go)), Reduction::Sum);
      },
      pyb::arg("hidden"), pyb::arg("weight"), pyb::arg("ids"), pyb::kw_only(), pyb::arg("bias") = pyb::none(),
      pyb::arg("grad_output") = pyb::none(), pyb::arg("memory_budget") = kBudget, pyb::arg("chunk_rows") = 0,
      pyb::arg("logits_dtype") = pyb::none(), pyb::arg("grad_hidden") = true, pyb::arg("grad_weight") = true,
      pyb::arg("grad_bias") = true, pyb::arg("grad_dtype") = pyb::none(), pyb::arg("backend") = pyb::none(),
      "log softmax(hidden @ weight.T + bias)[ids] for integer ids [N, K]: f32 [N, K] (NumPy on the CPU, a "
      "retort Tensor on a device), without materializing the logits. With grad_output [N, K] (the gradient "
      "of some loss with respect to that output): a LossResult whose values field holds the output, "
      "grad_hidden"
      " / grad_weight / grad_bias the gradients (in grad_dtype, default each input's dtype) and loss "
      "sum(values * grad_output).");

  // ---- graph nodes --------------------------------------------------------------------------------------
  ops.def(
      "fused_linear_cross_entropy",
      [](pyb::handle hidden, pyb::handle weight, pyb::handle labels, pyb::handle bias, int64_t ignore_index,
         float label_smoothing, float z_loss, float softcap, pyb::handle reduction, bool return_per_row,
         bool return_lse, size_t memory_budget, int64_t chunk_rows, pyb::handle logits_dtype, bool gh,
         bool gw, bool gb) {
        OpArgs a("fused_linear_cross_entropy", {hidden, weight, labels, bias});
        Tensor* h = a.get(hidden, "hidden");
        Tensor* w = a.get(weight, "weight");
        Tensor* y = a.get(labels, "labels");
        Tensor* b = a.get(bias, "bias", true);
        CrossEntropyOptions o{ignore_index,   label_smoothing, z_loss, softcap, parse_reduction(reduction),
                              return_per_row, return_lse};
        return loss_tuple(
            a,
            fused_linear_cross_entropy(a.ctx(), h, w, b, y, o,
                                       fused_opts(memory_budget, chunk_rows, logits_dtype, gh, gw, gb)),
            o.reduction);
      },
      pyb::arg("hidden"), pyb::arg("weight"), pyb::arg("labels"), pyb::kw_only(),
      pyb::arg("bias") = pyb::none(), pyb::arg("ignore_index") = -100, pyb::arg("label_smoothing") = 0.0f,
      pyb::arg("z_loss") = 0.0f, pyb::arg("softcap") = 0.0f, pyb::arg("reduction") = "mean",
      pyb::arg("return_per_row") = false, pyb::arg("return_lse") = false, pyb::arg("memory_budget") = kBudget,
      pyb::arg("chunk_rows") = 0, pyb::arg("logits_dtype") = pyb::none(), pyb::arg("grad_hidden") = true,
      pyb::arg("grad_weight") = true, pyb::arg("grad_bias") = true,
      "Fused lm-head cross-entropy node (see retort.losses.fused_linear_cross_entropy); returns LossOutputs. "
      "Gradients flow to hidden, weight and bias when they are parameters or computed from one.");
  ops.def(
      "fused_linear_topk_kd",
      [](pyb::handle hidden, pyb::handle weight, pyb::handle ids, pyb::handle logprobs, pyb::handle mask,
         pyb::handle labels, pyb::handle bias, float beta, const std::string& divergence, float skew_alpha,
         float temperature, bool normalize_topk, float w_hard, float w_soft, int64_t ignore_index,
         pyb::handle reduction, bool return_per_row, bool return_lse, bool return_parts, size_t memory_budget,
         int64_t chunk_rows, pyb::handle logits_dtype, bool gh, bool gw, bool gb) {
        OpArgs a("fused_linear_topk_kd", {hidden, weight, ids, logprobs, mask, labels, bias});
        Tensor* h = a.get(hidden, "hidden");
        Tensor* w = a.get(weight, "weight");
        Tensor* ti = a.get(ids, "teacher_ids");
        Tensor* tl = a.get(logprobs, "teacher_logprobs");
        Tensor* mk = a.get(mask, "mask", true);
        Tensor* y = a.get(labels, "labels", true);
        Tensor* b = a.get(bias, "bias", true);
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
        return loss_tuple(
            a,
            fused_linear_topk_kd(a.ctx(), h, w, b, ti, tl, mk, y, o,
                                 fused_opts(memory_budget, chunk_rows, logits_dtype, gh, gw, gb)),
            o.reduction);
      },
      pyb::arg("hidden"), pyb::arg("weight"), pyb::arg("teacher_ids"), pyb::arg("teacher_logprobs"),
      pyb::arg("mask") = pyb::none(), pyb::arg("labels") = pyb::none(), pyb::kw_only(),
      pyb::arg("bias") = pyb::none(), pyb::arg("beta") = 0.0f, pyb::arg("divergence") = "kl",
      pyb::arg("skew_alpha") = 0.1f, pyb::arg("temperature") = 1.0f, pyb::arg("normalize_topk") = false,
      pyb::arg("w_hard") = 0.0f, pyb::arg("w_soft") = 1.0f, pyb::arg("ignore_index") = -100,
      pyb::arg("reduction") = "mean", pyb::arg("return_per_row") = false, pyb::arg("return_lse") = false,
      pyb::arg("return_parts") = false, pyb::arg("memory_budget") = kBudget, pyb::arg("chunk_rows") = 0,
      pyb::arg("logits_dtype") = pyb::none(), pyb::arg("grad_hidden") = true, pyb::arg("grad_weight") = true,
      pyb::arg("grad_bias") = true,
      "Fused lm-head top-K distillation node (see retort.losses.fused_linear_topk_kd); returns LossOutputs.");
  ops.def(
      "fused_linear_distill",
      [](pyb::handle hidden, pyb::handle weight, pyb::handle t_hidden, pyb::handle t_weight,
         pyb::handle labels, pyb::handle bias, pyb::handle t_bias, float beta, const std::string& divergence,
         float skew_alpha, float temperature, float w_hard, float w_soft, int64_t ignore_index,
         pyb::handle reduction, bool return_per_row, bool return_lse, bool return_parts, size_t memory_budget,
         int64_t chunk_rows, pyb::handle logits_dtype, bool gh, bool gw, bool gb) {
        OpArgs a("fused_linear_distill", {hidden, weight, t_hidden, t_weight, labels, bias, t_bias});
        Tensor* h = a.get(hidden, "hidden");
        Tensor* w = a.get(weight, "weight");
        Tensor* th = a.get(t_hidden, "teacher_hidden");
        Tensor* tw = a.get(t_weight, "teacher_weight");
        Tensor* y = a.get(labels, "labels", true);
        Tensor* b = a.get(bias, "bias", true);
        Tensor* tb = a.get(t_bias, "teacher_bias", true);
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
        return loss_tuple(
            a,
            fused_linear_distill(a.ctx(), h, w, b, th, tw, tb, y, o,
                                 fused_opts(memory_budget, chunk_rows, logits_dtype, gh, gw, gb)),
            o.reduction);
      },
      pyb::arg("hidden"), pyb::arg("weight"), pyb::arg("teacher_hidden"), pyb::arg("teacher_weight"),
      pyb::arg("labels") = pyb::none(), pyb::kw_only(), pyb::arg("bias") = pyb::none(),
      pyb::arg("teacher_bias") = pyb::none(), pyb::arg("beta") = 0.0f, pyb::arg("divergence") = "kl",
      pyb::arg("skew_alpha") = 0.1f, pyb::arg("temperature") = 1.0f, pyb::arg("w_hard") = 0.0f,
      pyb::arg("w_soft") = 1.0f, pyb::arg("ignore_index") = -100, pyb::arg("reduction") = "mean",
      pyb::arg("return_per_row") = false, pyb::arg("return_lse") = false, pyb::arg("return_parts") = false,
      pyb::arg("memory_budget") = kBudget, pyb::arg("chunk_rows") = 0, pyb::arg("logits_dtype") = pyb::none(),
      pyb::arg("grad_hidden") = true, pyb::arg("grad_weight") = true, pyb::arg("grad_bias") = true,
      "Fused online-teacher distillation node (see retort.losses.fused_linear_distill); returns "
      "LossOutputs.");
  ops.def(
      "fused_linear_entropy",
      [](pyb::handle hidden, pyb::handle weight, pyb::handle bias, float temperature, pyb::handle reduction,
         size_t memory_budget, int64_t chunk_rows, pyb::handle logits_dtype, bool gh, bool gw, bool gb) {
        OpArgs a("fused_linear_entropy", {hidden, weight, bias});
        Tensor* h = a.get(hidden, "hidden");
        Tensor* w = a.get(weight, "weight");
        Tensor* b = a.get(bias, "bias", true);
        const Reduction r = parse_reduction(reduction);
        return a.out(fused_linear_entropy(a.ctx(), h, w, b, temperature, r,
                                          fused_opts(memory_budget, chunk_rows, logits_dtype, gh, gw, gb)),
                     r == Reduction::None ? 1 : 0);
      },
      pyb::arg("hidden"), pyb::arg("weight"), pyb::kw_only(), pyb::arg("bias") = pyb::none(),
      pyb::arg("temperature") = 1.0f, pyb::arg("reduction") = "none", pyb::arg("memory_budget") = kBudget,
      pyb::arg("chunk_rows") = 0, pyb::arg("logits_dtype") = pyb::none(), pyb::arg("grad_hidden") = true,
      pyb::arg("grad_weight") = true, pyb::arg("grad_bias") = true,
      "Fused lm-head entropy node ([N] under 'none', else 0-d).");
  ops.def(
      "fused_linear_selective_log_softmax",
      [](pyb::handle hidden, pyb::handle weight, pyb::handle ids, pyb::handle bias, size_t memory_budget,
         int64_t chunk_rows, pyb::handle logits_dtype, bool gh, bool gw, bool gb) {
        OpArgs a("fused_linear_selective_log_softmax", {hidden, weight, ids, bias});
        Tensor* h = a.get(hidden, "hidden");
        Tensor* w = a.get(weight, "weight");
        Tensor* i = a.get(ids, "ids");
        Tensor* b = a.get(bias, "bias", true);
        return a.out(
            fused_linear_selective_log_softmax(
                a.ctx(), h, w, b, i, fused_opts(memory_budget, chunk_rows, logits_dtype, gh, gw, gb)),
            2);
      },
      pyb::arg("hidden"), pyb::arg("weight"), pyb::arg("ids"), pyb::kw_only(), pyb::arg("bias") = pyb::none(),
      pyb::arg("memory_budget") = kBudget, pyb::arg("chunk_rows") = 0, pyb::arg("logits_dtype") = pyb::none(),
      pyb::arg("grad_hidden") = true, pyb::arg("grad_weight") = true, pyb::arg("grad_bias") = true,
      "Fused lm-head selective log-softmax node: [N, K] f32.");
}

}  // namespace retort::py
