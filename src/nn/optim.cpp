#include "optim.h"

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

// The learning rate of one step: the explicit one when given (>= 0), else the configured one.
float step_lr(float lr, float config_lr, const char* who) {
  RT_CHECK(!std::isnan(lr), who, ".step: learning rate is NaN");
  return lr < 0 ? config_lr : lr;
}

// The gradient accumulator of p, checked against p; nullptr when p does not reach the graph's loss.
const Tensor* grad_of(const Graph& graph, const Tensor* p, const char* who) {
  const Tensor* g = graph.grad(p);
  if (!g) return nullptr;
  RT_CHECK(g->dtype == DType::F32 && g->nelements() == p->nelements() && g->is_contiguous(), who,
           ": gradient ", g->describe(), " does not match parameter ", p->describe());
  RT_CHECK(&g->backend() == &p->backend(), who, ": gradient of ", p->describe(),
           " lives on another backend than the parameter");
  return g;
}

}  // namespace

AdamW::AdamW(const std::vector<Tensor*>& params, const AdamWConfig& config) : config_(config) {
  check_range(config.lr >= 0 && std::isfinite(config.lr), "AdamW", "lr", config.lr, ">= 0");
  check_range(config.beta1 >= 0 && config.beta1 < 1, "AdamW", "beta1", config.beta1, "in [0, 1)");
  check_range(config.beta2 >= 0 && config.beta2 < 1, "AdamW", "beta2", config.beta2, "in [0, 1)");
  check_range(config.eps > 0 && std::isfinite(config.eps), "AdamW", "eps", config.eps, "> 0");
  check_range(config.weight_decay >= 0 && std::isfinite(config.weight_decay), "AdamW", "weight_decay",
              config.weight_decay, ">= 0");
  check_params(params, "AdamW");
  params_ = params;
  state_ = std::make_unique<Context>(params[0]->backend());
  for (Tensor* p : params_) {
    // Context::tensor zero-fills, which is the correct initial state of both moments.
    m_.push_back(state_->tensor(DType::F32, p->shape(), p->name + ".adam_m"));
    v_.push_back(state_->tensor(DType::F32, p->shape(), p->name + ".adam_v"));
  }
}

void AdamW::set_steps(int64_t s) {
  // The bias correction 1 - beta^step is 0 at step 0 and above 1 for a negative step: NaN parameters.
  RT_CHECK(s >= 0, "AdamW::set_steps: the step count must be >= 0, got ", s);
  step_ = s;
}

void AdamW::step(const Graph& graph, float lr) {
  AdamWParams o;
  o.lr = step_lr(lr, config_.lr, "AdamW");
  o.beta1 = config_.beta1;
  o.beta2 = config_.beta2;
  o.eps = config_.eps;
  o.weight_decay = config_.weight_decay;
  // Check every gradient before touching any parameter, so a bad graph leaves the model unchanged.
  std::vector<const Tensor*> grads;
  for (Tensor* p : params_) grads.push_back(grad_of(graph, p, "AdamW"));
  o.step = ++step_;
  for (size_t i = 0; i < params_.size(); ++i) {
    // Like PyTorch, a parameter without a gradient (it does not reach this loss) is left alone.
    if (!grads[i]) continue;
    params_[i]->backend().adamw_update(params_[i], grads[i], m_[i], v_[i], o);
  }
}

Sgd::Sgd(const std::vector<Tensor*>& params, const SgdConfig& config) : config_(config) {
  check_range(config.lr >= 0 && std::isfinite(config.lr), "SGD", "lr", config.lr, ">= 0");
  check_range(config.momentum >= 0 && config.momentum < 1, "SGD", "momentum", config.momentum, "in [0, 1)");
  check_range(config.weight_decay >= 0 && std::isfinite(config.weight_decay), "SGD", "weight_decay",
              config.weight_decay, ">= 0");
  check_params(params, "SGD");
  params_ = params;
  state_ = std::make_unique<Context>(params[0]->backend());
  // Plain SGD keeps no state; the backend takes a null momentum buffer to mean none.
  for (Tensor* p : params_)
    buf_.push_back(config.momentum > 0 ? state_->tensor(DType::F32, p->shape(), p->name + ".sgd_momentum")
                                       : nullptr);
}

void Sgd::step(const Graph& graph, float lr) {
  SgdParams o;
  o.lr = step_lr(lr, config_.lr, "SGD");
  o.momentum = config_.momentum;
  o.weight_decay = config_.weight_decay;
  std::vector<const Tensor*> grads;
  for (Tensor* p : params_) grads.push_back(grad_of(graph, p, "SGD"));
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!grads[i]) continue;
    params_[i]->backend().sgd_update(params_[i], grads[i], buf_[i], o);
  }
}

double grad_norm(const Graph& graph) {
  double total = 0;
  for (Tensor* p : graph.params())
    if (Tensor* g = graph.grad(p)) total += g->backend().sum_squares(g);
  return std::sqrt(total);
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
  const double norm = grad_norm(graph);
  // A non-finite norm is returned unscaled: scaling by max_norm / inf would zero the finite gradients and
  // keep the NaNs, hiding the fault; the caller should skip the step instead.
  if (std::isfinite(norm) && norm > max_norm) {
    const float s = float(max_norm / norm);
    for (Tensor* p : graph.params())
      if (Tensor* g = graph.grad(p)) g->backend().scale(g, s);
  }
  return norm;
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
