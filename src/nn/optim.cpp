#include "optim.h"

#include <bit>
#include <cmath>
#include <numbers>
#include <unordered_set>

#include "../core/error.h"

namespace retort {

namespace {

// Written as !(x >= lo) rather than x < lo so that NaN options are rejected too.
void check_range(bool ok, const char* who, const char* what, float value, const char* expected) {
  RT_CHECK(ok, who, ": ", what, " = ", value, " is out of range (expected ", expected, ")");
}

// Every parameter must be a trainable, contiguous float tensor on one backend, listed once.
void check_params(const std::vector<Tensor*>& params, const char* who) {
  RT_CHECK(!params.empty(), who, ": no parameters to optimize");
  std::unordered_set<const Tensor*> seen;
  Backend* backend = nullptr;
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor* p = params[i];
    RT_CHECK(p != nullptr, who, ": parameter ", i, " is null");
    RT_CHECK(p->has(kParam), who, ": tensor ", p->describe(),
             " is not a parameter (create trainable tensors with Context::param)");
    RT_CHECK(is_float(p->dtype) && p->is_contiguous(), who, ": parameter ", p->describe(),
             " must be a contiguous float tensor");
    RT_CHECK(seen.insert(p).second, who, ": parameter ", p->describe(), " is listed twice");
    Backend* b = &p->backend();
    RT_CHECK(!backend || b == backend, who, ": parameter ", p->describe(), " is on another ", b->name(),
             " backend than parameter 0; one optimizer updates the parameters of one backend");
    backend = b;
  }
}

void check_adamw(const AdamWConfig& config) {
  check_range(config.lr >= 0 && std::isfinite(config.lr), "AdamW", "lr", config.lr, ">= 0");
  check_range(config.beta1 >= 0 && config.beta1 < 1, "AdamW", "beta1", config.beta1, "in [0, 1)");
  check_range(config.beta2 >= 0 && config.beta2 < 1, "AdamW", "beta2", config.beta2, "in [0, 1)");
  check_range(config.eps > 0 && std::isfinite(config.eps), "AdamW", "eps", config.eps, "> 0");
  check_range(config.weight_decay >= 0 && std::isfinite(config.weight_decay), "AdamW", "weight_decay",
              config.weight_decay, ">= 0");
}

void check_sgd(const SgdConfig& config) {
  check_range(config.lr >= 0 && std::isfinite(config.lr), "SGD", "lr", config.lr, ">= 0");
  check_range(config.momentum >= 0 && config.momentum < 1, "SGD", "momentum", config.momentum, "in [0, 1)");
  check_range(config.weight_decay >= 0 && std::isfinite(config.weight_decay), "SGD", "weight_decay",
              config.weight_decay, ">= 0");
}

// The gradient norm of every parameter gradient of graph as one grad_norm op in a scratch context: the total
// sum of squares (read back), scaling the gradients in place when max_norm > 0.
double sum_squares(const Graph& graph, double max_norm, const char* who) {
  std::vector<OptSlot> slots;
  for (Tensor* p : graph.params())
    if (const Tensor* g = graph.grad(p)) slots.push_back({nullptr, g, nullptr, nullptr});
  if (slots.empty()) return 0.0;
  Context tmp(graph.ctx().backend());
  Tensor* table = optimizer_table(tmp, slots, who);
  Tensor* scratch = optimizer_scratch(tmp, table);
  Tensor* norm = grad_norm_op(tmp, optimizer_stats(tmp), table, scratch, nullptr, max_norm, max_norm > 0);
  tmp.backend().run(norm);
  return std::bit_cast<double>(get_data_int(scratch).back());
}

}  // namespace

Optimizer::Optimizer(const std::vector<Tensor*>& params, float lr, int64_t n_hparams, const char* who)
    : who_(who), lr_(lr) {
  check_params(params, who);
  params_ = params;
  state_ = std::make_unique<Context>(params[0]->backend());
  hparams_ = state_->tensor(DType::F32, {n_hparams}, std::string(who) + ".hparams");
}

Optimizer::~Optimizer() = default;

void Optimizer::set_steps(int64_t s) {
  // The bias correction 1 - beta^step is 0 at step 0 and above 1 for a negative step: NaN parameters.
  RT_CHECK(s >= 0, who_, "::set_steps: the step count must be >= 0, got ", s);
  step_ = s;
}

void Optimizer::begin_step(float lr) {
  RT_CHECK(!std::isnan(lr), who_, ".step: learning rate is NaN");
  set_data(hparams_, hparams_for(lr < 0 ? lr_ : lr, step_ + 1));
  begun_ = true;
}

void Optimizer::end_step(bool applied) {
  RT_CHECK(begun_, who_, ".end_step: no step was begun (call begin_step before the graph runs)");
  begun_ = false;
  if (applied) ++step_;
}

std::vector<OptSlot> Optimizer::slots_of(const Graph& graph) const {
  std::vector<OptSlot> slots;
  for (size_t i = 0; i < params_.size(); ++i)
    // Like PyTorch, a parameter without a gradient (it does not reach this loss) is left alone.
    if (const Tensor* g = graph.grad(params_[i])) slots.push_back(slot(i, g));
  return slots;
}

void Optimizer::step(const Graph& graph, float lr) {
  std::vector<OptSlot> slots = slots_of(graph);
  std::vector<const void*> grads;
  for (const OptSlot& s : slots) grads.push_back(s.grad->data);
  // The table holds the gradients' addresses: one per set of accumulators.
  Tensor*& update = eager_[grads];
  if (!slots.empty() && !update)
    update = update_op(optimizer_stats(*state_), optimizer_table(*state_, slots, who_));
  begin_step(lr);
  if (update) state_->backend().run(update);
  end_step(true);
}

Tensor* Optimizer::append_step(Graph& graph, Tensor* loss, double max_norm) {
  RT_CHECK(!graph.params().empty(), who_,
           ".append_step: the graph has no backward pass (call graph.backward(loss) first)");
  const std::vector<OptSlot> slots = slots_of(graph);
  RT_CHECK(!slots.empty(), who_, ".append_step: none of the optimizer's parameters gets a gradient in graph");
  Tensor* table = optimizer_table(*state_, slots, who_);
  Tensor* norm = grad_norm_op(*state_, optimizer_stats(*state_), table, optimizer_scratch(*state_, table),
                              loss, max_norm, false);
  Tensor* update = update_op(norm, table);
  update->flags |= kOutput;
  graph.forward(update);
  return update;
}

Tensor* Optimizer::append_step(Graph& graph, Tensor* loss, double max_norm,
                               const std::vector<const Tensor*>& grads,
                               const std::vector<const Tensor*>& norm_grads) {
  RT_CHECK(grads.size() == params_.size(), who_, ".append_step: ", grads.size(), " gradients for ",
           params_.size(), " parameters");
  RT_CHECK(!norm_grads.empty(), who_, ".append_step: no gradients to take the norm of");
  std::vector<OptSlot> slots, norm_slots;
  for (size_t i = 0; i < params_.size(); ++i) slots.push_back(slot(i, grads[i]));
  for (const Tensor* g : norm_grads) norm_slots.push_back({nullptr, g, nullptr, nullptr});
  Tensor* norm_table = optimizer_table(*state_, norm_slots, who_);
  Tensor* norm = grad_norm_op(*state_, optimizer_stats(*state_), norm_table,
                              optimizer_scratch(*state_, norm_table), loss, max_norm, false);
  Tensor* update = update_op(norm, optimizer_table(*state_, slots, who_));
  update->flags |= kOutput;
  graph.forward(update);
  return update;
}

AdamW::AdamW(const std::vector<Tensor*>& params, const AdamWConfig& config)
    : Optimizer((check_adamw(config), params), config.lr, kAdamWHparams, "AdamW"), config_(config) {
  for (Tensor* p : params_) {
    // Context::tensor zero-fills, which is the correct initial state of both moments.
    m_.push_back(state_->tensor(DType::F32, p->shape(), p->name + ".adam_m"));
    v_.push_back(state_->tensor(DType::F32, p->shape(), p->name + ".adam_v"));
  }
}

OptSlot AdamW::slot(size_t i, const Tensor* grad) const {
  return {params_[i], grad, m_[i], v_[i]};
}

Tensor* AdamW::update_op(Tensor* stats, Tensor* table) {
  return adamw_step_op(*state_, stats, table, hparams(), config_.beta1, config_.beta2, config_.eps);
}

std::vector<float> AdamW::hparams_for(float lr, int64_t t) const {
  // In double on the host, then rounded once: the bias corrections of late steps are close to 1.
  const double bc1 = 1.0 - std::pow(double(config_.beta1), double(t));
  const double bc2 = 1.0 - std::pow(double(config_.beta2), double(t));
  return {lr, float(lr / bc1), float(1.0 / std::sqrt(bc2)), 1.0f - lr * config_.weight_decay};
}

Sgd::Sgd(const std::vector<Tensor*>& params, const SgdConfig& config)
    : Optimizer((check_sgd(config), params), config.lr, 1, "SGD"), config_(config) {
  // Plain SGD keeps no state.
  for (Tensor* p : params_)
    buf_.push_back(config.momentum > 0 ? state_->tensor(DType::F32, p->shape(), p->name + ".sgd_momentum")
                                       : nullptr);
}

OptSlot Sgd::slot(size_t i, const Tensor* grad) const {
  return {params_[i], grad, buf_[i], nullptr};
}

Tensor* Sgd::update_op(Tensor* stats, Tensor* table) {
  return sgd_step_op(*state_, stats, table, hparams(), config_.momentum, config_.weight_decay);
}

std::vector<float> Sgd::hparams_for(float lr, int64_t) const {
  return {lr};
}

double grad_norm(const Graph& graph) {
  return std::sqrt(sum_squares(graph, 0.0, "grad_norm"));
}

void check_finite_gradients(const Graph& graph, const std::string& where) {
  for (Tensor* p : graph.params()) {
    const Tensor* g = graph.grad(p);
    if (!g) continue;
    const std::vector<float> gv = get_data(g);
    for (size_t i = 0; i < gv.size(); ++i)
      RT_CHECK(std::isfinite(gv[i]), where, ": the gradient of parameter ", p->describe(), " is ", gv[i],
               " at element ", i, " (the first non-finite value; a NaN or inf input upstream?)");
  }
}

double clip_grad_norm(const Graph& graph, double max_norm) {
  RT_CHECK(max_norm > 0 && std::isfinite(max_norm), "clip_grad_norm: max_norm = ", max_norm,
           " must be a finite number > 0");
  // The op leaves a non-finite norm unscaled: scaling by max_norm / inf would zero the finite gradients and
  // keep the NaNs, hiding the fault; the caller should skip the step instead.
  return std::sqrt(sum_squares(graph, max_norm, "clip_grad_norm"));
}

float cosine_lr(int64_t step, int64_t warmup, int64_t total, float lr_max, float lr_min) {
  RT_CHECK(step >= 0, "cosine_lr: step = ", step, " must be >= 0");
  RT_CHECK(warmup >= 0 && total >= 1 && warmup <= total,
           "cosine_lr: need 0 <= warmup <= total and total >= 1, ", "got warmup = ", warmup,
           ", total = ", total);
  RT_CHECK(lr_min >= 0 && lr_max >= lr_min && std::isfinite(lr_max),
           "cosine_lr: need 0 <= lr_min <= lr_max, ", "got lr_min = ", lr_min, ", lr_max = ", lr_max);
  if (step < warmup) return float(double(lr_max) * double(step) / double(warmup));
  if (step >= total) return lr_min;
  const double progress = double(step - warmup) / double(total - warmup);
  return float(lr_min + 0.5 * (double(lr_max) - lr_min) * (1.0 + std::cos(std::numbers::pi * progress)));
}

}  // namespace retort
