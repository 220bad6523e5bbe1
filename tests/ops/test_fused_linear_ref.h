// Helpers for the fused linear loss tests: the float64 lm-head (z = hidden · Wᵀ + bias) feeding the row-loss
// references of test_losses_ref.h, and a runner that builds two graphs from the same input values — e.g.
// the fused node and its unfused composition, or the fused node at two chunk sizes — and returns their
// outputs and gradients for comparison.
#pragma once
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "test_losses_ref.h"

namespace retort::test {

// Input values drawn once (seeded by key) for the LossInputs, as stored in their dtype.
std::vector<Vec> draw_values(const std::string& key, const std::vector<LossInput>& inputs);

enum class Seed {
  None,      // forward only
  Unit,      // backward(outs[0]): the graph's constant-1 seed (outs[0] must be a scalar)
  Weighted,  // backward(Σ w·outs[0]) with fixed random weights w (a non-unit upstream gradient)
};

struct GraphResult {
  std::vector<Vec> outs;   // the values of every output build returned
  std::vector<Vec> grads;  // the gradient of each param input, in input order
  std::vector<Op> ops;     // the ops of the graph's nodes, in execution order
};

// Builds the graph from inputs with the given values (float inputs with param = true are parameters), runs
// it with poisoned memory and returns what it produced. build returns the outputs; the first is the loss.
using BuildFn = std::function<std::vector<Tensor*>(Context&, const std::vector<Tensor*>&)>;
GraphResult run_graph(const std::vector<LossInput>& inputs, const std::vector<Vec>& values,
                      const BuildFn& build, Seed seed);

// EXPECTs every output and gradient of a and b to agree within nmse tol, and to be finite.
void expect_close(const GraphResult& a, const GraphResult& b, double tol, const std::string& what);

// A LossCase reference input of the lm-head: hidden [N, H], weight [V, H], bias [V].
inline LossInput hidden_in(int64_t n, int64_t h, DType dt = DType::F32, double lo = -1, double hi = 1) {
  return LossInput(Shape{n, h}, dt, true, lo, hi);
}
inline LossInput weight_in(int64_t v, int64_t h, DType dt = DType::F32, double lo = -1, double hi = 1) {
  return LossInput(Shape{v, h}, dt, true, lo, hi);
}
inline LossInput bias_in(int64_t v, DType dt = DType::F32) {
  return LossInput(Shape{v}, dt, true, -0.5, 0.5);
}

// The chunk sizes every invariance test runs: one row, odd sizes, all rows.
std::vector<int64_t> chunk_sizes(int64_t n);

}  // namespace retort::test
