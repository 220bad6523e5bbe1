// tile::gemm (the CPU attention's in-cache GEMM): every implementation this CPU has against a float64
// reference, on every row tail (m 1..13), column widths of 1 to 5 slabs of 16 lanes, k = 0, A read directly
// and transposed (its strides swapped), C rows wider than n (untouched past n), and accumulate.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "ops/tile_gemm.h"

namespace retort::test {
namespace {

using tile::Impl;

TEST(TileGemm, EveryImplAgainstFloat64) {
  std::vector<Impl> impls{Impl::Portable};
  for (Impl i : {Impl::Avx2, Impl::Avx512})
    if (tile::impl_available(i)) impls.push_back(i);
  std::mt19937 gen(24);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (Impl impl : impls)
    for (int64_t m : {1, 2, 3, 4, 5, 6, 7, 12, 13})
      for (int64_t n : {16, 32, 48, 64, 80})
        for (int64_t k : {0, 1, 7, 64})
          for (bool transposed : {false, true})
            for (bool accumulate : {false, true}) {
              // A is [m, k] (ars = k + 3, ats = 1) or, transposed, stored [k, m] (ars = 1, ats = m + 2).
              const int64_t ars = transposed ? 1 : k + 3, ats = transposed ? m + 2 : 1;
              const int64_t ldb = n + 16, ldc = n + 5;
              std::vector<float> a(size_t(std::max<int64_t>(1, transposed ? k * ats : m * ars))),
                  b(size_t(std::max<int64_t>(1, k * ldb))), c(size_t(m * ldc));
              for (float& x : a) x = u(gen);
              for (float& x : b) x = u(gen);
              for (float& x : c) x = u(gen);
              const std::vector<float> c0 = c;
              tile::gemm(m, n, k, a.data(), ars, ats, b.data(), ldb, c.data(), ldc, accumulate, impl);
              for (int64_t r = 0; r < m; ++r)
                for (int64_t j = 0; j < ldc; ++j) {
                  const size_t at = size_t(r * ldc + j);
                  if (j >= n) {
                    ASSERT_EQ(c[at], c0[at]) << "wrote past n at " << r << ", " << j;
                    continue;
                  }
                  double want = accumulate ? c0[at] : 0.0;
                  for (int64_t t = 0; t < k; ++t)
                    want += double(a[size_t(r * ars + t * ats)]) * b[size_t(t * ldb + j)];
                  ASSERT_NEAR(c[at], want, 1e-5 * (1.0 + double(k)))
                      << tile::impl_name(impl) << " m=" << m << " n=" << n << " k=" << k
                      << " transposed=" << transposed << " accumulate=" << accumulate << " at " << r << ", "
                      << j;
                }
            }
}

}  // namespace
}  // namespace retort::test
