// Float64 references for the row losses (straight from the formulas, sharing nothing with the kernels) and a
// case runner for what the harness's run_case cannot express: explicit input values (−inf padding, fully
// masked rows, all rows ignored), and a backward seeded with the graph's own constant 1 (the single-pass
// path).
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "harness.h"

namespace retort::test {

// A row-major matrix view of a reference input: rows = ne[1], cols = ne[0].
struct Mat {
  int64_t rows = 0, cols = 0;
  Vec v;
  double at(int64_t r, int64_t c) const { return v[size_t(r * cols + c)]; }
  const double* row(int64_t r) const { return v.data() + r * cols; }
};
Mat mat(const Ref& r);
// The matrix a transposed view of r presents: element (i, j) = r.at(i, j), rows = ne[0].
Mat mat_t(const Ref& r);
// The float64 lm-head of the fused losses: z[r, j] = Σ_h hidden[r, h]·w[j, h] (+ bias[j]), hidden [N, H],
// w [V, H], bias [V] or null.
Mat head_ref(const Ref& hidden, const Ref& w, const Ref* bias);
std::vector<int64_t> ints(const Ref& r);

enum class Out { Loss, PerRow, Lse, Hard, Soft };
// The output of a loss a test looks at.
Tensor* pick(const LossOutputs& o, Out what);
const char* red_name(Reduction r);

// Log-sum-exp of x[0..n) / t, computed stably in double.
double lse_ref(const double* x, int64_t n, double t = 1.0);

struct CeRef {
  int64_t ignore = -100;
  double eps = 0, z_loss = 0, cap = 0;
  Reduction red = Reduction::Mean;
};
Vec ce_ref(const Mat& z, const std::vector<int64_t>& labels, const CeRef& o, Out what = Out::Loss);

struct TopKRef {
  Divergence div = Divergence::Kl;
  double beta = 0, alpha = 0.1, t = 1, w_hard = 0, w_soft = 1;
  bool normalize = false;
  int64_t ignore = -100;
  Reduction red = Reduction::Mean;
};
// ids: row-major [N, K] or empty (gathered: slot k is column k of z); mask: [N, K] or empty; labels: [N] or
// empty.
Vec topk_ref(const Mat& z, const std::vector<int64_t>& ids, const Mat& logprobs, const Vec& mask,
             const std::vector<int64_t>& labels, const TopKRef& o, Out what = Out::Loss);

struct DistillRef {
  Divergence div = Divergence::Kl;
  double beta = 0, alpha = 0.1, t = 1, w_hard = 0, w_soft = 1;
  int64_t ignore = -100;
  Reduction red = Reduction::Mean;
};
Vec distill_ref(const Mat& z, const Mat& teacher, const std::vector<int64_t>& labels, const DistillRef& o,
                Out what = Out::Loss);

// The divergences beyond the KL family, with their parameters: every distillation suite (row and fused, CPU
// and CUDA) runs each of them.
struct DivCase {
  const char* name;
  Divergence div;
  double alpha;
};
inline const std::vector<DivCase>& div_cases() {
  static const std::vector<DivCase> cases = {{"tvd", Divergence::Tvd, 0.1},
                                             {"skew_kl_a1", Divergence::SkewKl, 0.1},
                                             {"skew_kl_a6", Divergence::SkewKl, 0.6},
                                             {"skew_rkl_a1", Divergence::SkewReverseKl, 0.1},
                                             {"skew_rkl_a6", Divergence::SkewReverseKl, 0.6}};
  return cases;
}

Vec entropy_ref(const Mat& z, double t, Reduction red);
Vec selective_ref(const Mat& z, const std::vector<int64_t>& ids, int64_t k);

// A row of v logits rising from −4 by 0.003 per entry: its maximum is the last entry, so an online pass
// rescales its running sums all the way (and a long row crosses every vector width and tail).
Vec rising(int64_t v);

// An input of a LossCase: random in [lo, hi) (ints: [lo, hi)) unless values are given (ggml order).
struct LossInput {
  LossInput(Shape shape, DType dtype = DType::F32, bool param = false, double lo = -1.0, double hi = 1.0,
            Vec values = {})
      : shape(std::move(shape)), dtype(dtype), param(param), lo(lo), hi(hi), values(std::move(values)) {}
  Shape shape;
  DType dtype = DType::F32;
  bool param = false;
  double lo = -1.0, hi = 1.0;
  Vec values;
};

// Another backend against the CPU backend, on normalized MSE, for outputs and gradients alike, whatever the
// storage dtype: both backends read the same stored values and every loss output and gradient is f32, so a
// bf16 or f16 input changes nothing here. What differs is the order of the sums (the CPU in double, CUDA in
// f32 trees) and the 2-ulp exp2 approximation on the device: about 1e-13 in practice.
inline constexpr double kCpuTol = 1e-9;

struct LossCase {
  std::string name;
  std::vector<LossInput> inputs;
  std::function<Tensor*(Context&, const std::vector<Tensor*>&)> build;
  std::function<Vec(const std::vector<Ref>&)> reference;
  double fwd_tol = 1e-10;
  double grad_tol = 1e-8;
  double fd_step = 1e-6;
  bool check_grad = true;
  // true: backward(out) on the scalar loss itself (the graph seeds it with its constant 1: single pass);
  // false: backward(Σ w·out) with random weights w (a non-unit upstream gradient).
  bool unit_seed = false;
  // With unit_seed, > 0: the seed is an f32 leaf holding this value instead of the constant 1
  // (Graph::backward(out, seed), a data-parallel rank's weight), which fused losses fold into their
  // gradients.
  float leaf_seed = 0;
  // The CPU also checks that the unit-seeded backward multiplies by nothing and that 3·loss gives three times
  // the gradient (check_single_pass); the case's output must be a scalar.
  bool single_pass = false;
  // Gradients against central differences of the reference: off where an input the gradient is taken of
  // holds −inf. fd_samples > 0 differences only that many elements per gradient, picked at random (rows too
  // long to difference whole); fd_samples < 0 none (rows too long for even that).
  bool fd = true;
  int64_t fd_samples = 0;
  // Another backend against the CPU backend (nmse), outputs and gradients; against the reference it is held
  // to the looser of these and fwd_tol / grad_tol.
  double backend_tol = kCpuTol, backend_grad_tol = kCpuTol;
  // Non-empty: what the CUDA backend does not support in this case; the CUDA test skips it with this reason.
  std::string cuda_unsupported;
};

// The case's random seed (drawn from its name), printed with every failure so a case can be rerun alone.
uint64_t case_seed(const LossCase& c);
// "name (seed N)", for SCOPED_TRACE.
std::string case_trace(const LossCase& c);
// gtest's printer for a case given as a test parameter: its name and seed, not its bytes.
void PrintTo(const LossCase& c, std::ostream* os);
// The case's name as a gtest parameter name (letters, digits and underscores).
std::string case_param_name(const LossCase& c);
// The elements of an input of n values whose gradient is differenced (c.fd, c.fd_samples), the same on every
// backend.
std::vector<size_t> fd_elements(const LossCase& c, size_t n);

// Runs the case on the CPU: forward vs reference (nmse), every output and gradient finite, gradients of the
// param inputs vs central differences of the reference. EXPECTs inside; returns false on any failure.
bool run_loss_case(const LossCase& c);

// The same case for the harness's run_case (random inputs only; non-param float inputs are not
// differentiated).
OpCase to_op_case(const LossCase& c);

// The single-pass gradient (backward on the loss itself: no multiply by the upstream in the graph) matches
// finite differences and equals a third of the gradient of 3·loss. The case's output must be a scalar.
void check_single_pass(const LossCase& c);

// Runs fn, expecting retort::Error whose message contains every string in parts.
void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts);

}  // namespace retort::test
