// The fused layers (rms_norm_affine, add_rms_norm, swiglu): one case list per op, run on every backend
// (tests/ops/test_fused_layers.cpp on the CPU, tests/cuda/test_cuda_fused_layers.cpp on the GPU). Each case is
// an OpCase (harness.h): fresh random inputs, the forward against a float64 reference, every input's gradient
// against central differences of it, and the output arena poisoned with NaN before the run. Shapes cover one
// row, one element per row, rows not a multiple of any block, and rows longer than a CUDA block (1024).
#pragma once
#include <cmath>
#include <string>
#include <vector>

#include "harness.h"
#include "ops/ops.h"

namespace retort::test {

struct RowShape {
  std::string name;
  Shape shape;  // outermost first; the last entry is the row length
};

inline std::vector<RowShape> fused_layer_shapes() {
  return {{"one_row", {1, 8}}, {"n1", {5, 1}}, {"odd", {13, 7}}, {"batched", {2, 3, 40}}, {"wide", {3, 1100}}};
}

inline int64_t row_len(const RowShape& s) { return s.shape.back(); }

// y = s r w per row, s = x (+ delta), r = (mean(s²) + eps)^-1/2; with delta the case's output is s ⊙ y, so the
// gradients flow into both outputs (y and the residual sum) with different weights.
inline Vec rms_norm_affine_reference(int64_t n, float eps, bool with_delta, const std::vector<Ref>& in) {
  const Vec &x = in[0].v, &w = in[1].v;
  Vec out(x.size());
  for (size_t r = 0; r < x.size() / size_t(n); ++r) {
    std::vector<double> s(static_cast<size_t>(n));
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) {
      const size_t k = r * size_t(n) + size_t(i);
      s[size_t(i)] = x[k] + (with_delta ? in[2].v[k] : 0.0);
      ss += s[size_t(i)] * s[size_t(i)];
    }
    const double inv = 1.0 / std::sqrt(ss / double(n) + double(eps));
    for (int64_t i = 0; i < n; ++i) {
      const double y = s[size_t(i)] * inv * w[size_t(i)];
      out[r * size_t(n) + size_t(i)] = with_delta ? s[size_t(i)] * y : y;
    }
  }
  return out;
}

// Tolerances: f32 output to f32 rounding; a 16-bit output adds one rounding (2^-9 relative for bf16, 2^-12 for
// f16, so nmse ~1e-5 and ~1e-7). The gradients do not see that rounding (they are computed from the f32 s),
// except through the 16-bit y in s ⊙ y.
inline OpCase rms_norm_affine_case(const RowShape& s, DType out, bool with_delta) {
  const int64_t n = row_len(s);
  // A one-element row normalizes to ±1 whatever x is, so x's gradient is gy w r eps / (x² + eps): with a
  // small eps only cancellation noise is left to compare. A large eps there gives it a size worth checking.
  const float eps = n == 1 ? 0.5f : 1e-5f;
  OpCase c;
  c.name = std::string(with_delta ? "add_rms_norm_" : "rms_norm_affine_") + s.name + "_" + dtype_name(out);
  c.inputs = {{s.shape, DType::F32}, {{n}, DType::F32, true, 0.5, 1.5}};
  if (with_delta) c.inputs.push_back({s.shape, DType::F32});
  c.build = [eps, out, with_delta](Context& ctx, const std::vector<Tensor*>& x) {
    if (!with_delta) return rms_norm_affine(ctx, x[0], x[1], eps, out);
    const AddRmsNorm r = add_rms_norm(ctx, x[0], x[2], x[1], eps, out);
    return mul(ctx, r.sum, r.y);
  };
  c.reference = [n, eps, with_delta](const std::vector<Ref>& in) {
    return rms_norm_affine_reference(n, eps, with_delta, in);
  };
  // Sample the wide shape's gradients (its reference is O(n) per element).
  if (n > 500) c.grad_samples = 48;
  c.fd_step = 1e-5;
  c.grad_tol = 1e-6;
  if (out == DType::BF16) c.fwd_tol = 2e-5, c.grad_tol = with_delta ? 4e-5 : 1e-6;
  if (out == DType::F16) c.fwd_tol = 2e-7, c.grad_tol = with_delta ? 1e-6 : 1e-6;
  return c;
}

inline double silu_d(double g) { return g / (1.0 + std::exp(-g)); }

// swiglu with gate and up in dtype in, the result in out.
inline OpCase swiglu_case(const RowShape& s, DType in, DType out) {
  OpCase c;
  c.name = "swiglu_" + s.name + "_" + dtype_name(in) + "_to_" + dtype_name(out);
  c.inputs = {{s.shape, in, true, -4.0, 4.0}, {s.shape, in}};
  c.build = [out](Context& ctx, const std::vector<Tensor*>& x) { return swiglu(ctx, x[0], x[1], out); };
  c.reference = [](const std::vector<Ref>& r) {
    Vec y(r[0].v.size());
    for (size_t i = 0; i < y.size(); ++i) y[i] = silu_d(r[0].v[i]) * r[1].v[i];
    return y;
  };
  c.fd_step = 1e-5;
  if (out == DType::BF16) c.fwd_tol = 2e-5;
  if (out == DType::F16) c.fwd_tol = 2e-7;
  // Gradients come back in the inputs' dtype: one 16-bit rounding each.
  if (in == DType::BF16) c.grad_tol = 3e-5;
  if (in == DType::F16) c.grad_tol = 5e-7;
  return c;
}

// matmul_lowp with a 16-bit result: x Wᵀ for x [M, K], W [N, K] in dtype dt, the result in out (f32 or dt).
inline OpCase matmul_lowp_case(int64_t M, int64_t K, int64_t N, DType dt, DType out) {
  OpCase c;
  c.name = "matmul_lowp_" + std::to_string(M) + "x" + std::to_string(K) + "x" + std::to_string(N) + "_" +
           dtype_name(dt) + "_to_" + dtype_name(out);
  c.inputs = {{{M, K}, dt}, {{N, K}, dt}};
  c.build = [out](Context& ctx, const std::vector<Tensor*>& x) {
    return matmul_lowp(ctx, x[0], x[1], false, true, out);
  };
  c.reference = [M, K, N](const std::vector<Ref>& r) {
    Vec y(size_t(M * N));
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double acc = 0;
        for (int64_t k = 0; k < K; ++k) acc += r[0].at(k, i) * r[1].at(k, j);
        y[size_t(i * N + j)] = acc;
      }
    return y;
  };
  if (M * K * N > 100000) c.grad_samples = 32;
  // One 16-bit rounding of the result (none for f32: the accumulation is f32 over K terms); the gradient
  // GEMMs read the upstream gradient rounded to dt.
  c.fwd_tol = out == DType::BF16 ? 2e-5 : out == DType::F16 ? 2e-7 : 1e-10;
  c.grad_tol = dt == DType::BF16 ? 3e-5 : 3e-7;
  return c;
}

}  // namespace retort::test
