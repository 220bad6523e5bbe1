// The float64 RoPE reference shared by the CPU and CUDA rope tests.
#pragma once
#include <cmath>

#include "harness.h"

namespace retort::test {

// Reference on x with ne = {d, heads, T, B} and positions [T].
inline Vec ref_rope(const Ref& x, const Ref& pos, bool neox, double theta) {
  Ref out = x;
  const int64_t d = x.ne[0], half = d / 2;
  for (int64_t b = 0; b < x.ne[3]; ++b)
    for (int64_t t = 0; t < x.ne[2]; ++t)
      for (int64_t h = 0; h < x.ne[1]; ++h)
        for (int64_t i = 0; i < half; ++i) {
          const double a = pos.v[size_t(t)] * std::pow(theta, -2.0 * double(i) / double(d));
          const int64_t j = neox ? i : 2 * i, k = neox ? i + half : 2 * i + 1;
          const double x0 = x.at(j, h, t, b), x1 = x.at(k, h, t, b);
          out.at(j, h, t, b) = x0 * std::cos(a) - x1 * std::sin(a);
          out.at(k, h, t, b) = x0 * std::sin(a) + x1 * std::cos(a);
        }
  return out.v;
}

}  // namespace retort::test
