// The loss backend in Python: each loss declared once (its inputs, its options with the C++ names and
// defaults, the C++ call that builds it) and bound by def_loss both as a plain function over arrays in
// retort.losses and as a graph node in retort.ops. A new loss is one entry here.
#include <charconv>
#include <cstdlib>

#include "loss_binding.h"

namespace retort::py {

namespace {

// Defaults are read from the C++ option structs, so Python and C++ cannot disagree on them. A float default
// is shown by its shortest decimal form (0.1, not 0.10000000149011612).
pyb::object num(float v) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return pyb::float_(std::strtod(std::string(buf, r.ptr).c_str(), nullptr));
}
pyb::object integer(int64_t v) {
  return pyb::int_(v);
}
pyb::object boolean(bool v) {
  return pyb::bool_(v);
}
pyb::object reduction_name(Reduction r) {
  return pyb::str(r == Reduction::Mean ? "mean" : r == Reduction::Sum ? "sum" : "none");
}
std::vector<Param> join(std::initializer_list<std::vector<Param>> groups) {
  std::vector<Param> all;
  for (const auto& g : groups) all.insert(all.end(), g.begin(), g.end());
  return all;
}

// ---- option groups: each option is declared here once, with its default -----------------------------------

std::vector<Param> ce_params() {
  const CrossEntropyOptions d;
  return {{"ignore_index", integer(d.ignore_index)},
          {"label_smoothing", num(d.label_smoothing)},
          {"z_loss", num(d.z_loss)},
          {"softcap", num(d.softcap)},
          {"reduction", reduction_name(d.reduction)},
          {"return_per_row", boolean(d.return_per_row)},
          {"return_lse", boolean(d.return_lse)}};
}
CrossEntropyOptions ce_options(const Bound& b) {
  return {b.i64("ignore_index"),           b.f32("label_smoothing"), b.f32("z_loss"),     b.f32("softcap"),
          parse_reduction(b["reduction"]), b.flag("return_per_row"), b.flag("return_lse")};
}

// The divergence options every distillation loss shares; topk adds normalize_topk after temperature.
std::vector<Param> distill_params(bool topk) {
  const TopKDistillOptions d;
  std::vector<Param> p = {{"beta", num(d.beta)},
                          {"divergence", pyb::str(divergence_name(d.divergence))},
                          {"skew_alpha", num(d.skew_alpha)},
                          {"temperature", num(d.temperature)}};
  if (topk) p.push_back({"normalize_topk", boolean(d.normalize_topk)});
  std::vector<Param> rest = {{"w_hard", num(d.w_hard)},
                             {"w_soft", num(d.w_soft)},
                             {"ignore_index", integer(d.ignore_index)},
                             {"reduction", reduction_name(d.reduction)},
                             {"return_per_row", boolean(d.return_per_row)},
                             {"return_lse", boolean(d.return_lse)},
                             {"return_parts", boolean(d.return_parts)}};
  p.insert(p.end(), rest.begin(), rest.end());
  return p;
}
// The options DistillOptions and TopKDistillOptions share, under the same names.
template <class Options>
Options distill_options(const Bound& b) {
  Options o;
  o.divergence = parse_divergence(b.str("divergence"));
  o.beta = b.f32("beta");
  o.skew_alpha = b.f32("skew_alpha");
  o.temperature = b.f32("temperature");
  o.w_hard = b.f32("w_hard");
  o.w_soft = b.f32("w_soft");
  o.ignore_index = b.i64("ignore_index");
  o.reduction = parse_reduction(b["reduction"]);
  o.return_per_row = b.flag("return_per_row");
  o.return_lse = b.flag("return_lse");
  o.return_parts = b.flag("return_parts");
  return o;
}
TopKDistillOptions topk_options(const Bound& b) {
  TopKDistillOptions o = distill_options<TopKDistillOptions>(b);
  o.normalize_topk = b.flag("normalize_topk");
  return o;
}

// entropy's C++ defaults are its function's: temperature 1, Reduction::None.
std::vector<Param> entropy_params() {
  return {{"temperature", num(1.0f)}, {"reduction", reduction_name(Reduction::None)}};
}

std::vector<Param> fused_params() {
  const FusedLinearOptions d;
  return {{"logits_budget", integer(int64_t(d.logits_budget))},
          {"chunk_rows", integer(d.chunk_rows)},
          {"logits_dtype", pyb::none()},
          {"grad_hidden", boolean(d.grad_hidden)},
          {"grad_weight", boolean(d.grad_weight)},
          {"grad_bias", boolean(d.grad_bias)}};
}
FusedLinearOptions fused_options(const Bound& b) {
  return FusedLinearOptions{b.size("logits_budget"), b.i64("chunk_rows"), b.flag("grad_hidden"),
                            b.flag("grad_weight"),   b.flag("grad_bias"), parse_dtype_opt(b["logits_dtype"])};
}

// The trainable inputs of every fused loss; bias is a keyword.
const LossInput kHidden{"hidden", false, false, "grad_hidden"};
const LossInput kWeight{"weight", false, false, "grad_weight"};
const LossInput kBias{"bias", true, true, "grad_bias"};

BuiltLoss outputs(LossOutputs o, Reduction r) {
  return {o, r};
}
BuiltLoss single(Tensor* t, Reduction r) {
  LossOutputs o;
  o.loss = t;
  return {o, r};
}

std::vector<LossSpec> row_losses() {
  std::vector<LossSpec> s;
  s.push_back(
      {"cross_entropy",
       "cross_entropy_loss",
       {{"logits", false, false, "grad"}, {"labels"}},
       ce_params(),
       false,
       false,
       [](Context& ctx, const Operands& t, const Bound& b) {
         const CrossEntropyOptions o = ce_options(b);
         return outputs(cross_entropy_loss(ctx, t("logits"), t("labels"), o), o.reduction);
       },
       "Cross-entropy of logits [N, V] (f32, bf16 or f16, strided views welcome; reshape [B, T, V] "
       "first) against integer labels [N]. Per row: (1 - label_smoothing) * (lse - z[label]) + "
       "label_smoothing * mean_j(lse - z_j) + z_loss * lse^2, where z are the logits (softcapped to "
       "softcap * tanh(z / softcap) first when softcap > 0) and lse their log-sum-exp. Rows whose label "
       "is ignore_index count for nothing; reduction 'mean' divides by the other rows (0 when there are "
       "none), 'sum' adds, 'none' returns [N]. return_lse gives every row's lse."});
  s.push_back(
      {"topk_kd",
       "topk_kd",
       {{"logits", false, false, "grad"},
        {"teacher_ids"},
        {"teacher_logprobs"},
        {"mask", true},
        {"labels", true}},
       distill_params(true),
       false,
       false,
       [](Context& ctx, const Operands& t, const Bound& b) {
         const TopKDistillOptions o = topk_options(b);
         return outputs(
             topk_kd(ctx, t("logits"), t("teacher_ids"), t("teacher_logprobs"), t("mask"), t("labels"), o),
             o.reduction);
       },
       "Top-K distillation of student logits [N, V] against a teacher's top K per row: teacher_ids int "
       "[N, K], teacher_logprobs float [N, K], mask [N, K] (nonzero = valid; optional), labels int [N] "
       "(optional unless w_hard > 0). A slot with mask 0 or logprob -inf is padding. P is the teacher "
       "over its valid slots (renormalized at temperature T != 1), Q = softmax(z / T) read at the slots "
       "(or renormalized over them with normalize_topk). Per row: w_hard * CE(z, label) at T = 1 + "
       "w_soft * T^2 * D(P, Q). divergence picks D: 'kl' (the default) is forward KL(P||Q) at beta = 0, "
       "reverse KL(Q||P) at beta = 1, the generalized JSD between; 'tvd' is 0.5 * sum |p - q|; "
       "'skew_kl' is KL(P || a P + (1 - a) Q) and 'skew_reverse_kl' KL(Q || (1 - a) P + a Q), a = "
       "skew_alpha (DistiLLM). Rows labelled ignore_index count for nothing; 'mean' divides by the "
       "other rows (all N without labels). return_parts gives the unweighted hard and soft parts."});
  s.push_back({"topk_kl_gathered",
               "topk_kl_gathered",
               {{"student_gathered", false, false, "grad"}, {"teacher_logprobs"}, {"mask", true}},
               {{"temperature", num(TopKKLOptions{}.temperature)},
                {"reduction", reduction_name(TopKKLOptions{}.reduction)},
                {"return_per_row", boolean(false)},
                {"return_lse", boolean(false)}},
               false,
               false,
               [](Context& ctx, const Operands& t, const Bound& b) {
                 const TopKKLOptions o{b.f32("temperature"), parse_reduction(b["reduction"]),
                                       b.flag("return_per_row"), b.flag("return_lse")};
                 return outputs(
                     topk_kl_gathered(ctx, t("student_gathered"), t("teacher_logprobs"), t("mask"), o),
                     o.reduction);
               },
               "Forward KL(P||Q) * T^2 where the student's logits are already gathered at the teacher's ids: "
               "student_gathered [N, K], Q = softmax over the valid slots of student_gathered / T, P from "
               "teacher_logprobs [N, K] (mask [N, K] optional, as in topk_kd). 'mean' divides by all N rows. "
               "return_lse gives the log-sum-exp over the valid slots of student_gathered / T."});
  s.push_back(
      {"distill",
       "distill",
       {{"student", false, false, "grad"}, {"teacher"}, {"labels", true}},
       distill_params(false),
       false,
       false,
       [](Context& ctx, const Operands& t, const Bound& b) {
         const DistillOptions o = distill_options<DistillOptions>(b);
         return outputs(distill(ctx, t("student"), t("teacher"), t("labels"), o), o.reduction);
       },
       "Full-vocabulary distillation: P = softmax(teacher / T), Q = softmax(student / T), student and "
       "teacher [N, V], labels int [N] (optional unless w_hard > 0). Per row: w_hard * CE(student, "
       "label) at T = 1 + w_soft * T^2 * D(P, Q), D as in topk_kd (divergence, beta and skew_alpha). "
       "The gradient is with respect to the student."});
  s.push_back(
      {"entropy",
       "entropy",
       {{"logits", false, false, "grad"}},
       entropy_params(),
       false,
       false,
       [](Context& ctx, const Operands& t, const Bound& b) {
         const Reduction r = parse_reduction(b["reduction"]);
         return single(entropy(ctx, t("logits"), b.f32("temperature"), r), r);
       },
       "Entropy of softmax(logits / temperature) per row of logits [N, V]: [N] under reduction 'none' "
       "(the default), else the mean or sum over rows. return_grad needs 'mean' or 'sum'."});
  s.push_back({"selective_log_softmax",
               "selective_log_softmax",
               {{"logits", false, false, "grad"}, {"ids"}},
               {},
               false,
               true,
               [](Context& ctx, const Operands& t, const Bound&) {
                 return single(selective_log_softmax(ctx, t("logits"), t("ids")), Reduction::None);
               },
               "log softmax(logits)[ids] for logits [N, V] and integer ids [N, K]: f32 [N, K]; the gradient "
               "with respect to the logits ([N, V], in grad_dtype, default the logits' dtype) comes from one "
               "pass over them."});
  return s;
}

std::vector<LossSpec> fused_losses() {
  std::vector<LossSpec> s;
  s.push_back({"fused_linear_cross_entropy",
               "fused_linear_cross_entropy",
               {kHidden, kWeight, {"labels"}, kBias},
               join({ce_params(), fused_params()}),
               true,
               false,
               [](Context& ctx, const Operands& t, const Bound& b) {
                 const CrossEntropyOptions o = ce_options(b);
                 return outputs(fused_linear_cross_entropy(ctx, t("hidden"), t("weight"), t("bias"),
                                                           t("labels"), o, fused_options(b)),
                                o.reduction);
               },
               "Cross-entropy of the logits hidden @ weight.T (+ bias) against integer labels [N], without "
               "materializing them; options as cross_entropy."});
  s.push_back(
      {"fused_linear_topk_kd",
       "fused_linear_topk_kd",
       {kHidden, kWeight, {"teacher_ids"}, {"teacher_logprobs"}, {"mask", true}, {"labels", true}, kBias},
       join({distill_params(true), fused_params()}),
       true,
       false,
       [](Context& ctx, const Operands& t, const Bound& b) {
         const TopKDistillOptions o = topk_options(b);
         return outputs(
             fused_linear_topk_kd(ctx, t("hidden"), t("weight"), t("bias"), t("teacher_ids"),
                                  t("teacher_logprobs"), t("mask"), t("labels"), o, fused_options(b)),
             o.reduction);
       },
       "Top-K distillation of the student logits hidden @ weight.T (+ bias) against a teacher's top K; "
       "inputs and options as topk_kd. With normalize_topk, w_hard = 0, no lse and no hard part, only "
       "the K logits at the teacher ids are computed (K dot products per row)."});
  s.push_back(
      {"fused_linear_distill",
       "fused_linear_distill",
       {kHidden,
        kWeight,
        {"teacher_hidden"},
        {"teacher_weight"},
        {"labels", true},
        kBias,
        {"teacher_bias", true, true}},
       join({distill_params(false), fused_params()}),
       true,
       false,
       [](Context& ctx, const Operands& t, const Bound& b) {
         const DistillOptions o = distill_options<DistillOptions>(b);
         return outputs(
             fused_linear_distill(ctx, t("hidden"), t("weight"), t("bias"), t("teacher_hidden"),
                                  t("teacher_weight"), t("teacher_bias"), t("labels"), o, fused_options(b)),
             o.reduction);
       },
       "Full-vocabulary distillation against an online teacher: student logits hidden @ weight.T (+ "
       "bias), teacher logits teacher_hidden [N, Ht] @ teacher_weight.T [V, Ht] (+ teacher_bias), both "
       "computed chunk by chunk; options as distill. Teacher inputs get no gradient."});
  s.push_back({"fused_linear_entropy",
               "fused_linear_entropy",
               {kHidden, kWeight, kBias},
               join({entropy_params(), fused_params()}),
               true,
               false,
               [](Context& ctx, const Operands& t, const Bound& b) {
                 const Reduction r = parse_reduction(b["reduction"]);
                 return single(fused_linear_entropy(ctx, t("hidden"), t("weight"), t("bias"),
                                                    b.f32("temperature"), r, fused_options(b)),
                               r);
               },
               "Entropy of softmax((hidden @ weight.T + bias) / temperature) per row, reduced as entropy "
               "(return_grad needs 'mean' or 'sum')."});
  s.push_back({"fused_linear_selective_log_softmax",
               "fused_linear_selective_log_softmax",
               {kHidden, kWeight, {"ids"}, kBias},
               fused_params(),
               true,
               true,
               [](Context& ctx, const Operands& t, const Bound& b) {
                 return single(fused_linear_selective_log_softmax(ctx, t("hidden"), t("weight"), t("bias"),
                                                                  t("ids"), fused_options(b)),
                               Reduction::None);
               },
               "log softmax(hidden @ weight.T + bias)[ids] for integer ids [N, K]: f32 [N, K], without "
               "materializing the logits."});
  return s;
}

}  // namespace

void bind_losses(pyb::module_& m) {
  pyb::module_ losses = m.def_submodule(
      "losses",
      "The loss backend as plain functions over arrays: cross_entropy, topk_kd, topk_kl_gathered, distill, "
      "entropy, selective_log_softmax and their fused_linear_* forms (the lm-head matmul and the loss in "
      "chunks). Logits are [N, V] (N rows of V; reshape [B, T, V] first), f32, bf16 or f16, strided views "
      "welcome; math is f32. Keyword names match the C++ options. retort.ops has each loss as a graph node, "
      "with the same inputs, options and defaults.");
  losses.attr("_result_types") = pyb::dict();  // LossCall's namedtuple classes, one per field list
  losses.def("_cache_stats", &loss_cache_stats,
             "{'hits': plain calls that ran a kept graph again, 'builds': calls that built one}, over every "
             "loss function of the process (for tests: a repeated call on the CPU with arrays of the same "
             "layouts and the same options reuses its graph).");
  pyb::module_ ops = m.attr("ops");
  for (LossSpec& s : row_losses()) def_loss(losses, ops, std::move(s));
  for (LossSpec& s : fused_losses()) def_loss(losses, ops, std::move(s));
}

}  // namespace retort::py
