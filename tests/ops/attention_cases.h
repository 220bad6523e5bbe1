// flash_attention: one case list, run on every backend (tests/ops/test_attention.cpp on the CPU,
// tests/cuda/test_cuda_attention.cpp on the GPU). Each case is an OpCase (harness.h): fresh random q, k, v,
// the forward against a float64 reference, and the gradients of q, k and v against central differences of it.
// Shapes cover T not a multiple of any tile, T = 1, grouped-query ratios 1, 3 and 8, causal and not, a KV
// cache offset (T_k > T_q), rows without a visible key (negative n_past) and head dims 16 to 128.
#pragma once
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "harness.h"
#include "ops/ops.h"

namespace retort::test {

struct AttentionShape {
  std::string name;
  int64_t B, Tq, Tk, H, KV, D;
  bool causal = true;
  int64_t n_past = 0;
};

// out[b, i, h, :] = Σ_j softmax_j(scale q_i·k_j) v_j over the visible keys; 0 for a row without one.
inline Vec attention_reference(const AttentionShape& s, float scale, const std::vector<Ref>& in) {
  const Ref &q = in[0], &k = in[1], &v = in[2];
  Ref out;
  out.ne[0] = s.D;
  out.ne[1] = s.H;
  out.ne[2] = s.Tq;
  out.ne[3] = s.B;
  out.v.assign(size_t(out.size()), 0.0);
  const int64_t group = s.H / s.KV;
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t i = 0; i < s.Tq; ++i) {
        int64_t n = s.Tk;
        if (s.causal) n = std::min<int64_t>(s.Tk, std::max<int64_t>(0, i + s.n_past + 1));
        if (n == 0) continue;
        std::vector<double> p(static_cast<size_t>(n));
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < n; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < s.D; ++d) dot += q.at(d, h, i, b) * k.at(d, h / group, j, b);
          p[size_t(j)] = double(scale) * dot;
          m = std::max(m, p[size_t(j)]);
        }
        double l = 0;
        for (double& x : p) l += (x = std::exp(x - m));
        for (int64_t j = 0; j < n; ++j)
          for (int64_t d = 0; d < s.D; ++d) out.at(d, h, i, b) += p[size_t(j)] / l * v.at(d, h / group, j, b);
      }
  return out.v;
}

inline std::vector<AttentionShape> attention_shapes() {
  return {
      {"mha_causal", 2, 37, 37, 2, 2, 16},
      {"gqa3_causal", 1, 29, 29, 3, 1, 32},
      {"gqa8_causal", 1, 20, 20, 8, 1, 16},
      {"t1", 2, 1, 1, 2, 1, 64},
      {"noncausal", 1, 19, 23, 2, 1, 32},
      {"kv_cache", 1, 5, 21, 4, 2, 16, true, 16},
      {"no_visible_key", 1, 9, 6, 2, 2, 16, true, -3},
      {"d64_two_tiles", 1, 70, 70, 2, 1, 64},
      {"d96", 1, 17, 17, 1, 1, 96},
      {"d128", 1, 33, 33, 2, 2, 128},
      // Head dim 64 is where the CUDA forward takes wgmma on Hopper (64-row query tiles, 128-key steps):
      // key tiles past 128, non-causal with Tq != Tk, a cache offset, rows that see no key, GQA 3.
      {"d64_noncausal", 1, 19, 150, 2, 1, 64, false},
      {"d64_kv_cache", 1, 7, 140, 3, 1, 64, true, 133},
      {"d64_no_visible_key", 1, 9, 6, 2, 2, 64, true, -3},
      {"d64_t200_gqa3", 1, 200, 200, 3, 1, 64},
  };
}

// The OpCase of a shape in dtype dt; tolerances fit f32 (fwd 1e-10, gradients 1e-6) or 16-bit storage.
inline OpCase attention_case(const AttentionShape& s, DType dt) {
  const float scale = 1.0f / std::sqrt(float(s.D));
  OpCase c;
  c.name = "flash_attention_" + s.name + "_" + dtype_name(dt);
  c.inputs = {{{s.B, s.Tq, s.H, s.D}, dt}, {{s.B, s.Tk, s.KV, s.D}, dt}, {{s.B, s.Tk, s.KV, s.D}, dt}};
  c.build = [s, scale](Context& ctx, const std::vector<Tensor*>& x) {
    return flash_attention(ctx, x[0], x[1], x[2], scale, s.causal, s.n_past);
  };
  c.reference = [s, scale](const std::vector<Ref>& in) { return attention_reference(s, scale, in); };
  // Central differences of the whole reference per element: a sample of each gradient beyond small shapes.
  if (s.B * std::max(s.Tq, s.Tk) * s.H * s.D > 600) c.grad_samples = 64;
  if (dt != DType::F32) {
    // Outputs and gradients are stored in 16 bits (one rounding of ~2^-8 relative for bf16).
    c.fwd_tol = dt == DType::BF16 ? 1e-4 : 4e-6;
    c.grad_tol = dt == DType::BF16 ? 3e-4 : 2e-5;
  }
  return c;
}

}  // namespace retort::test
