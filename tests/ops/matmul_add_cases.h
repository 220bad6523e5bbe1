// matmul_add's case list, run by the CPU ops suite and by the CUDA suite: op(A) op(B) + C against float64 for
// every transpose pair, odd sizes, f32 operands (with finite-difference gradients, C's included) and 16-bit
// ones (matmul_lowp's numerics: the reference sees the stored values).
#pragma once
#include <string>
#include <vector>

#include "harness.h"

namespace retort::test {

inline std::vector<OpCase> matmul_add_cases() {
  struct Size {
    int64_t m, n, k;
    bool grad;
  };
  const Size sizes[] = {{1, 1, 1, true}, {7, 5, 13, true}, {33, 65, 17, false}, {129, 31, 70, false}};
  std::vector<OpCase> out;
  for (DType dt : {DType::F32, DType::BF16, DType::F16})
    for (const Size& s : sizes)
      for (int t = 0; t < 4; ++t) {
        const bool ta = t & 1, tb = t & 2;
        if (dt != DType::F32 && s.m == 1) continue;
        OpCase c;
        c.name = "matmul_add_" + std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k) +
                 (ta ? "_ta" : "") + (tb ? "_tb" : "") + "_" + dtype_name(dt);
        c.inputs = {{ta ? Shape{s.k, s.m} : Shape{s.m, s.k}, dt},
                    {tb ? Shape{s.n, s.k} : Shape{s.k, s.n}, dt},
                    {Shape{s.m, s.n}, DType::F32}};
        c.build = [ta, tb](Context& ctx, const std::vector<Tensor*>& in) {
          return matmul_add(ctx, in[0], in[1], in[2], ta, tb);
        };
        c.reference = [ta, tb, s](const std::vector<Ref>& in) {
          Vec y(size_t(s.m * s.n));
          for (int64_t r = 0; r < s.m; ++r)
            for (int64_t col = 0; col < s.n; ++col) {
              double acc = in[2].at(col, r);
              for (int64_t p = 0; p < s.k; ++p)
                acc += (ta ? in[0].at(r, p) : in[0].at(p, r)) * (tb ? in[1].at(p, col) : in[1].at(col, p));
              y[size_t(r * s.n + col)] = acc;
            }
          return y;
        };
        c.fwd_tol = 1e-11;  // exact products of f32 values, f32 sums
        c.grad_tol = 1e-8;
        c.check_grad = s.grad && dt == DType::F32;
        out.push_back(std::move(c));
      }
  return out;
}

}  // namespace retort::test
