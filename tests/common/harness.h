// Test harness in the spirit of ggml's test-backend-ops: each case builds a graph from fresh random inputs,
// checks the forward result against a float64 reference, and checks autodiff gradients against central
// finite differences of that float64 reference. Each case states its own tolerances.
#pragma once
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "retort.h"

namespace retort::test {

using Vec = std::vector<double>;

// A float64 array with a shape in ggml order (ne[0] innermost), for references.
struct Ref {
  int64_t ne[4] = {1, 1, 1, 1};
  Vec v;
  int64_t size() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  double& at(int64_t i0, int64_t i1 = 0, int64_t i2 = 0, int64_t i3 = 0) {
    return v[size_t(i0 + ne[0] * (i1 + ne[1] * (i2 + ne[2] * i3)))];
  }
  double at(int64_t i0, int64_t i1 = 0, int64_t i2 = 0, int64_t i3 = 0) const {
    return v[size_t(i0 + ne[0] * (i1 + ne[1] * (i2 + ne[2] * i3)))];
  }
};

// Deterministic per-test random numbers (seeded from the test name, so every case draws fresh values).
std::mt19937_64& rng();
void reseed(const std::string& key);
// The seed reseed(key) sets, for failure messages.
uint64_t seed_of(const std::string& key);
Vec random_vec(int64_t n, double lo = -1.0, double hi = 1.0);
std::vector<int64_t> random_ints(int64_t n, int64_t lo, int64_t hi);  // [lo, hi)

// ‖a − b‖² / ‖b‖² (normalized MSE, as ggml reports); NaN anywhere gives +inf.
double nmse(const Vec& a, const Vec& b);
double max_abs_diff(const Vec& a, const Vec& b);
Vec to_f64(const std::vector<float>& v);

struct Input {
  Shape shape;                 // outermost first
  DType dtype = DType::F32;
  bool differentiable = true;  // float inputs become parameters when true
  double lo = -1.0, hi = 1.0;  // range of the random values (or ints for integer inputs: [lo, hi))
};

struct OpCase {
  std::string name;
  std::vector<Input> inputs;
  // Builds the op under test from the input tensors (already filled).
  std::function<Tensor*(Context&, const std::vector<Tensor*>&)> build;
  // The float64 reference: input values (ggml order, contiguous) to the output values (same order).
  std::function<Vec(const std::vector<Ref>&)> reference;
  double fwd_tol = 1e-10;     // on nmse
  double grad_tol = 1e-6;     // on nmse of analytic vs numeric gradients
  double fd_step = 1e-6;      // central-difference step
  bool check_grad = true;
  // Elements of each gradient checked by central differences: all when 0, else this many picked at random
  // (for inputs whose reference is too costly to difference element by element).
  int64_t grad_samples = 0;
};

// Runs a case on the CPU backend (or the given one); EXPECTs inside. Returns false if anything failed.
bool run_case(const OpCase& c, Backend* backend = nullptr);

// Poisons a node's output region before compute to show unwritten elements: runs g with NaN-filled arena.
// (Graph::compute places nodes; this helper fills the arena via a first run's plan.)

}  // namespace retort::test
