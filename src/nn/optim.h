// Optimizers (SGD with momentum, AdamW), global-norm gradient clipping and the cosine learning-rate schedule.
// Updates run on the backend that holds the parameters.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "../core/context.h"
#include "../core/graph.h"

namespace retort {

struct AdamWConfig {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.01f;
};

// AdamW with decoupled weight decay and bias correction; m and v are f32 on the parameters' backend.
class AdamW {
 public:
  // Throws retort::Error on a bad option (lr < 0, betas outside [0, 1), eps <= 0, weight_decay < 0, NaN), on
  // an empty list, and on a tensor that is not a contiguous float parameter (Context::param) or is listed
  // twice.
  AdamW(const std::vector<Tensor*>& params, const AdamWConfig& config);
  // One update of every parameter from graph.grad(p). lr < 0 means config.lr. A parameter with no gradient
  // in graph (it does not reach the loss) is left unchanged, as in PyTorch; the step count advances once.
  void step(const Graph& graph, float lr = -1.0f);
  int64_t steps() const { return step_; }
  const AdamWConfig& config() const { return config_; }
  // Optimizer state, for checkpoints: m and v per parameter, in the order given.
  const std::vector<Tensor*>& m() const { return m_; }
  const std::vector<Tensor*>& v() const { return v_; }
  // Sets the step count (from a checkpoint); throws retort::Error unless s >= 0.
  void set_steps(int64_t s);

 private:
  std::vector<Tensor*> params_, m_, v_;
  std::unique_ptr<Context> state_;
  AdamWConfig config_;
  int64_t step_ = 0;
};

struct SgdConfig {
  float lr = 1e-2f, momentum = 0.0f, weight_decay = 0.0f;
};

class Sgd {
 public:
  // Throws retort::Error on a bad option (lr < 0, momentum outside [0, 1), weight_decay < 0, NaN) and on bad
  // parameters (as AdamW).
  Sgd(const std::vector<Tensor*>& params, const SgdConfig& config);
  // buf = momentum * buf + (grad + weight_decay * p); p -= lr * buf (plain SGD when momentum is 0).
  void step(const Graph& graph, float lr = -1.0f);

 private:
  std::vector<Tensor*> params_, buf_;
  std::unique_ptr<Context> state_;
  SgdConfig config_;
};

// The global L2 norm of every parameter gradient in graph (NaN or inf when any gradient is).
double grad_norm(const Graph& graph);

// Throws retort::Error, starting with `where`, naming the first parameter whose gradient holds a NaN or an
// infinity, the element and its value; returns when every gradient is finite. Reads the gradients back.
void check_finite_gradients(const Graph& graph, const std::string& where);

// Scales every parameter gradient so their global L2 norm is at most max_norm; returns the norm before.
// A non-finite norm is returned without scaling anything (skip that step). Throws unless max_norm > 0.
double clip_grad_norm(const Graph& graph, double max_norm);

// Linear warmup from 0 to lr_max over warmup steps, then cosine decay to lr_min at total steps: step 0 gives
// 0 (when warmup > 0), step warmup gives lr_max, step >= total gives lr_min. Throws unless step >= 0,
// 0 <= warmup <= total, total >= 1 and 0 <= lr_min <= lr_max.
float cosine_lr(int64_t step, int64_t warmup, int64_t total, float lr_max, float lr_min = 0.0f);

}  // namespace retort
