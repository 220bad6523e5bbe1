// Optimizers (SGD with momentum, AdamW), global-norm gradient clipping and the cosine learning-rate schedule.
// Updates run on the backend that holds the parameters, as multi-tensor ops (src/ops/optim_ops.h).
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "../core/context.h"
#include "../core/graph.h"
#include "../ops/optim_ops.h"

namespace retort {

// What AdamW and Sgd share: the update as multi-tensor graph ops (src/ops/optim_ops.h) over every parameter
// at once, run now (step) or as the last ops of a training graph (append_step), where the gradient norm, the
// clip and the skip of a non-finite step happen on the device with no host synchronization.
class Optimizer {
 public:
  virtual ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter from graph.grad(p), queued now (the host does not wait). lr < 0 means the
  // configured rate. A parameter with no gradient in graph (it does not reach the loss) is left unchanged,
  // as in PyTorch; the step count advances once. Throws retort::Error on a NaN lr or a gradient that does
  // not match its parameter, before anything is updated.
  void step(const Graph& graph, float lr = -1.0f);

  // The update as the last ops of a training graph: appends to graph (which must have its backward pass) the
  // global L2 gradient norm over this optimizer's parameters and the update, which scales the gradients by
  // min(1, max_norm / norm) as it reads them (max_norm 0: no clipping; the accumulators keep their values)
  // and is skipped on the device when the norm, or loss when given, is not finite. Returns the step's stats
  // node, f32 [4] = {loss, norm, clip scale, 1 applied / 0 skipped} (indices kStatLoss.. in optim_ops.h),
  // marked as an output; it aliases the stats, so reading it waits for the update. Each step is then
  // begin_step(lr), graph.compute(), a read of the stats, end_step(applied). Throws retort::Error on a graph
  // without gradients for these parameters, a loss that is not one float, or a bad max_norm.
  Tensor* append_step(Graph& graph, Tensor* loss, double max_norm);
  // The same for an optimizer over pieces of parameters (ZeRO-1: leaves aliasing the part of each parameter
  // this rank updates): grads[i] is params()[i]'s gradient (a leaf aliasing that part of the summed
  // accumulator), and the norm that clips and checks the step is taken over norm_grads (every whole
  // gradient, so that every rank computes the same). Throws as above, and when grads does not match params().
  Tensor* append_step(Graph& graph, Tensor* loss, double max_norm, const std::vector<const Tensor*>& grads,
                      const std::vector<const Tensor*>& norm_grads);
  // Writes the learning rate of step steps() + 1 (lr < 0: the configured one) and what derives from it
  // into the update's inputs, without waiting for the device. Throws retort::Error on a NaN lr.
  void begin_step(float lr);
  // Counts the step begun when the device applied it (the stats read back say so).
  void end_step(bool applied);

  int64_t steps() const { return step_; }
  // Sets the step count (from a checkpoint); throws retort::Error unless s >= 0.
  void set_steps(int64_t s);
  const std::vector<Tensor*>& params() const { return params_; }

 protected:
  // Checks params (see AdamW) and makes the state context and the hparams leaf of n_hparams floats.
  Optimizer(const std::vector<Tensor*>& params, float lr, int64_t n_hparams, const char* who);
  // The table entry of parameter i with its gradient and this optimizer's state.
  virtual OptSlot slot(size_t i, const Tensor* grad) const = 0;
  // The update op over table reading stats (or a grad_norm node over it).
  virtual Tensor* update_op(Tensor* stats, Tensor* table) = 0;
  // hparams' contents for step t at learning rate lr.
  virtual std::vector<float> hparams_for(float lr, int64_t t) const = 0;
  Tensor* hparams() const { return hparams_; }

  std::vector<Tensor*> params_;
  std::unique_ptr<Context> state_;
  const char* who_;

 private:
  // The table over the parameters that have a gradient in graph (empty when none has).
  std::vector<OptSlot> slots_of(const Graph& graph) const;
  float lr_;
  Tensor* hparams_ = nullptr;
  int64_t step_ = 0;
  bool begun_ = false;
  // step()'s update per graph it has seen, by the gradient addresses its table holds (a graph made later at
  // the same addresses finds the table it can use).
  std::map<std::vector<const void*>, Tensor*> eager_;
};

struct AdamWConfig {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.01f;
};

// AdamW with decoupled weight decay (on every parameter given) and bias correction; m and v are f32 on the
// parameters' backend.
class AdamW final : public Optimizer {
 public:
  // Throws retort::Error on a bad option (lr < 0, betas outside [0, 1), eps <= 0, weight_decay < 0, NaN), on
  // an empty list, and on a tensor that is not a contiguous float parameter (Context::param) or is listed
  // twice.
  AdamW(const std::vector<Tensor*>& params, const AdamWConfig& config);
  const AdamWConfig& config() const { return config_; }
  // Optimizer state, for checkpoints: m and v per parameter, in the order given.
  const std::vector<Tensor*>& m() const { return m_; }
  const std::vector<Tensor*>& v() const { return v_; }

 private:
  OptSlot slot(size_t i, const Tensor* grad) const override;
  Tensor* update_op(Tensor* stats, Tensor* table) override;
  std::vector<float> hparams_for(float lr, int64_t t) const override;
  std::vector<Tensor*> m_, v_;
  AdamWConfig config_;
};

struct SgdConfig {
  float lr = 1e-2f, momentum = 0.0f, weight_decay = 0.0f;
};

// buf = momentum * buf + (grad + weight_decay * p); p -= lr * buf (plain SGD when momentum is 0).
class Sgd final : public Optimizer {
 public:
  // Throws retort::Error on a bad option (lr < 0, momentum outside [0, 1), weight_decay < 0, NaN) and on bad
  // parameters (as AdamW).
  Sgd(const std::vector<Tensor*>& params, const SgdConfig& config);

 private:
  OptSlot slot(size_t i, const Tensor* grad) const override;
  Tensor* update_op(Tensor* stats, Tensor* table) override;
  std::vector<float> hparams_for(float lr, int64_t t) const override;
  std::vector<Tensor*> buf_;
  SgdConfig config_;
};

// The global L2 norm of every parameter gradient in graph (NaN or inf when any gradient is). One multi-tensor
// op and one read.
double grad_norm(const Graph& graph);

// Throws retort::Error, starting with `where`, naming the first parameter whose gradient holds a NaN or an
// infinity, the element and its value; returns when every gradient is finite. Reads the gradients back.
void check_finite_gradients(const Graph& graph, const std::string& where);

// Scales every parameter gradient so their global L2 norm is at most max_norm; returns the norm before.
// A non-finite norm is returned without scaling anything (skip that step). Throws unless max_norm > 0. It
// reads the norm back (one host wait); a training step clips inside the update instead (append_step).
double clip_grad_norm(const Graph& graph, double max_norm);

// Linear warmup from 0 to lr_max over warmup steps, then cosine decay to lr_min at total steps: step 0 gives
// 0 (when warmup > 0), step warmup gives lr_max, step >= total gives lr_min. Throws unless step >= 0,
// 0 <= warmup <= total, total >= 1 and 0 <= lr_min <= lr_max.
float cosine_lr(int64_t step, int64_t warmup, int64_t total, float lr_max, float lr_min = 0.0f);

}  // namespace retort
