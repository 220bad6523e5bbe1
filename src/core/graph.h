// A graph: the nodes needed for some roots in execution order, the gradient ops emitted by backward(), and
// the memory plan. Built lazily: nothing runs until compute().
#pragma once
#include <memory>
#include <unordered_map>
#include <vector>

#include "backend.h"
#include "context.h"
#include "planner.h"

namespace retort {

class Graph {
 public:
  // New nodes (gradients) are created in ctx; the graph runs on ctx.backend().
  explicit Graph(Context& ctx) : ctx_(&ctx) {}

  // Adds root and every node it depends on, in dependency order. May be called for several roots.
  void forward(Tensor* root);
  // Emits gradient ops for every parameter the scalar loss depends on. Parameter gradients accumulate into
  // f32 accumulators (grad()) each run; call zero_grad() to reset them. Throws retort::Error if loss is null,
  // not a single float element, not in this graph, or no parameter reaches it. seed (an f32 leaf of one
  // element, set before each run, or null for 1) is d(objective)/d(loss): every gradient is multiplied by it
  // (a data-parallel rank's share of the step's tokens, so that the ranks' gradients sum to the whole
  // batch's). Throws retort::Error on a seed of another kind.
  void backward(Tensor* loss, Tensor* seed = nullptr);
  // The leaf backward() was seeded with, or null.
  Tensor* seed() const { return seed_; }
  // The gradient of t: the accumulator for a parameter, the gradient node otherwise; nullptr if none. A
  // zero_grad() still pending is carried out first, so the accumulator reads as zero.
  Tensor* grad(const Tensor* t) const;
  // Zeroes every parameter gradient accumulator. Lazily: the next compute() has the ops that add straight
  // into an accumulator overwrite it instead (no clearing pass, no read of the old values) and clears only
  // the others; grad() clears them all if it comes first. A compute() that throws leaves the zero_grad()
  // pending.
  void zero_grad();
  // Parameters that reach the loss, in the order backward() found them.
  const std::vector<Tensor*>& params() const { return params_; }
  const std::vector<Tensor*>& nodes() const { return nodes_; }
  // The node that last writes parameter p's gradient accumulator in a run (null when p has none): what a
  // gradient all-reduce must wait for.
  Tensor* grad_writer(const Tensor* p) const;
  // Moves node, a step of this graph, to run right after the last of its sources instead of where it was
  // added (a collective then overlaps the rest of backward). Throws retort::Error when node is not a step.
  void schedule_early(Tensor* node);
  // Moves node, a step whose sources were rewired to steps that now come after it, to run right after the
  // last of them. Throws retort::Error when node is not a step or a step that reads it would then run first.
  void schedule_late(Tensor* node);
  Context& ctx() const { return *ctx_; }

  // Plans memory (cached until the graph changes) and returns the plan; peak bytes are known before running.
  const Plan& plan();
  // Places every node and runs them in order on the backend.
  void compute();
  // When on, compute() fills the arena with NaN bytes first, so an element no kernel wrote shows up (tests).
  void set_poison(bool on) { poison_ = on; }

 private:
  void visit(Tensor* t);
  Context* ctx_;
  std::vector<Tensor*> nodes_;
  std::unordered_map<const Tensor*, int> index_;
  std::unordered_map<const Tensor*, Tensor*> grads_;
  std::vector<Tensor*> params_;
  std::vector<Tensor*> accumulators_;
  std::vector<Tensor*> in_place_;  // per accumulator: the op output that adds into it, or null (Accumulate)
  std::unordered_map<const Tensor*, Tensor*> writers_;  // parameter -> its accumulator's writer
  mutable bool zero_pending_ = false;
  void clear_pending_zero() const;
  bool has_backward_ = false;
  Tensor* seed_ = nullptr;
  bool poison_ = false;
  std::unique_ptr<Plan> plan_;
  std::shared_ptr<Buffer> arena_;
  std::unique_ptr<Replay> replay_;  // the backend's recording of the nodes' launches (run_nodes)
};

}  // namespace retort
