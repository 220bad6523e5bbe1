// vec_math: exp / log / affine exp / sums / max / dot / axpy of both implementations against float64 on fresh
// random inputs over the whole float range the row kernels use, the documented edge values, every tail
// length, misaligned starts, and in-place use.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ops/vec_math.h"

namespace retort::test {
namespace {

using vmath::Impl;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<Impl> impls() {
  std::vector<Impl> v{Impl::Portable};
  if (vmath::impl_available(Impl::Avx2)) v.push_back(Impl::Avx2);
  if (vmath::impl_available(Impl::Avx512)) v.push_back(Impl::Avx512);
  return v;
}

// Relative error of a float result against a double reference, in units of FLT_EPSILON / 2 (~ulps).
double ulps(float got, double want) {
  if (want == 0.0) return got == 0.0f ? 0.0 : kInf;
  return std::fabs(double(got) - want) / std::fabs(want) / double(std::numeric_limits<float>::epsilon() / 2);
}

std::vector<float> uniform(std::mt19937& gen, int64_t n, float lo, float hi) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& e : x) e = u(gen);
  return x;
}

TEST(VecMath, ExpMatchesFloat64) {
  std::mt19937 gen(11);
  for (Impl impl : impls()) {
    SCOPED_TRACE(vmath::impl_name(impl));
    // Normal results only (the AVX2 version returns no subnormals: documented).
    std::vector<float> x = uniform(gen, 100003, -87.0f, 88.7f);
    std::vector<float> small = uniform(gen, 10007, -1.0f, 1.0f);
    x.insert(x.end(), small.begin(), small.end());
    std::vector<float> y = x;
    vmath::exp(y.data(), int64_t(y.size()), impl);
    double worst = 0;
    for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, ulps(y[i], std::exp(double(x[i]))));
    EXPECT_LE(worst, 4.0) << "max relative error in half-ulps";
  }
}

TEST(VecMath, LogMatchesFloat64) {
  std::mt19937 gen(12);
  for (Impl impl : impls()) {
    SCOPED_TRACE(vmath::impl_name(impl));
    std::vector<float> e = uniform(gen, 100003, -140.0f, 127.0f);  // subnormal to huge
    std::vector<float> x(e.size());
    for (size_t i = 0; i < e.size(); ++i) x[i] = std::exp2(e[i]);
    std::vector<float> near1 = uniform(gen, 10007, 0.5f, 2.0f);  // log near 0: relative error is hardest
    x.insert(x.end(), near1.begin(), near1.end());
    std::vector<float> y = x;
    vmath::log(y.data(), int64_t(y.size()), impl);
    double worst = 0, worst_abs = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double want = std::log(double(x[i]));
      // Near x = 1 the result is tiny and its error is measured absolutely (in units of FLT_EPSILON).
      if (std::fabs(want) < 0.01)
        worst_abs =
            std::max(worst_abs, std::fabs(double(y[i]) - want) / std::numeric_limits<float>::epsilon());
      else
        worst = std::max(worst, ulps(y[i], want));
    }
    EXPECT_LE(worst, 4.0) << "max relative error in half-ulps";
    EXPECT_LE(worst_abs, 0.02) << "max absolute error near log 1 = 0, in FLT_EPSILON";
  }
}

TEST(VecMath, EdgeValues) {
  for (Impl impl : impls()) {
    SCOPED_TRACE(vmath::impl_name(impl));
    float e[] = {-kInf, -200.0f, -88.0f, 0.0f, -0.0f, 89.0f, kInf, kNaN, 1.0f};
    vmath::exp(e, 9, impl);
    EXPECT_EQ(e[0], 0.0f);
    EXPECT_LT(e[1], 1e-38f);
    EXPECT_GE(e[1], 0.0f);
    EXPECT_LT(e[2], 1.2e-38f);
    EXPECT_EQ(e[3], 1.0f);
    EXPECT_EQ(e[4], 1.0f);
    EXPECT_EQ(e[5], kInf);
    EXPECT_EQ(e[6], kInf);
    EXPECT_TRUE(std::isnan(e[7]));
    EXPECT_NEAR(e[8], 2.718281828f, 1e-6f);
    // Around the overflow threshold ln(FLT_MAX) = 88.7228391: finite up to it, +inf above, never NaN.
    float o[64];
    o[0] = 88.72270f;
    for (int i = 1; i < 64; ++i) o[i] = std::nextafter(o[i - 1], 100.0f);
    float oe[64];
    std::memcpy(oe, o, sizeof(o));
    vmath::exp(oe, 64, impl);
    for (int i = 0; i < 64; ++i) {
      const double want = std::exp(double(o[i]));
      if (want > double(std::numeric_limits<float>::max()))
        EXPECT_EQ(oe[i], kInf) << "x = " << o[i];
      else
        EXPECT_LE(ulps(oe[i], want), 4.0) << "x = " << o[i];
    }
    float l[] = {0.0f, -0.0f, -1.0f, kInf, kNaN, 1.0f, 1e-45f, 3.4e38f};
    vmath::log(l, 8, impl);
    EXPECT_EQ(l[0], -kInf);
    EXPECT_EQ(l[1], -kInf);
    EXPECT_TRUE(std::isnan(l[2]));
    EXPECT_EQ(l[3], kInf);
    EXPECT_TRUE(std::isnan(l[4]));
    EXPECT_EQ(l[5], 0.0f);
    EXPECT_NEAR(l[6], std::log(double(1e-45f)), 1e-4);  // the smallest subnormal
    EXPECT_NEAR(l[7], std::log(double(3.4e38f)), 1e-4);
  }
}

// Every length from 0 to 40 at every start offset mod 8: the tails, the masked lanes and unaligned loads. A
// result depends only on its input, whatever its position.
TEST(VecMath, TailsOffsetsAndInPlace) {
  std::mt19937 gen(13);
  const std::vector<float> src = uniform(gen, 64, -30.0f, 5.0f);
  for (Impl impl : impls()) {
    SCOPED_TRACE(vmath::impl_name(impl));
    std::vector<float> one(src.size());
    for (size_t i = 0; i < src.size(); ++i) {
      float v = src[i];
      vmath::exp(&v, 1, impl);
      one[i] = v;
    }
    for (int64_t off = 0; off < 8; ++off)
      for (int64_t n = 0; n <= 40; ++n) {
        SCOPED_TRACE("offset " + std::to_string(off) + ", n " + std::to_string(n));
        // Poisoned guards around the range show stray writes.
        std::vector<float> buf(size_t(n + 16), kNaN);
        std::memcpy(buf.data() + off, src.data() + off, size_t(n) * sizeof(float));
        vmath::exp(buf.data() + off, n, impl);
        for (int64_t i = 0; i < off; ++i) EXPECT_TRUE(std::isnan(buf[size_t(i)]));
        for (int64_t i = 0; i < n; ++i) EXPECT_EQ(buf[size_t(off + i)], one[size_t(off + i)]);
        for (int64_t i = off + n; i < n + 16; ++i) EXPECT_TRUE(std::isnan(buf[size_t(i)]));

        // exp_affine out of place, then accumulated on top, against float64.
        std::vector<float> out(size_t(n + 16), 0.25f);
        const float m = 1.5f, scale = 0.7f, shift = 0.3f, a = -2.0f, c = 0.125f;
        vmath::exp_affine(src.data() + off, out.data() + off, n, m, scale, shift, a, c, false, impl);
        const double total =
            vmath::exp_affine(src.data() + off, out.data() + off, n, m, scale, shift, 1.0f, 0.0f, true, impl);
        double want_total = 0;
        for (int64_t i = 0; i < n; ++i) want_total += out[size_t(off + i)];
        EXPECT_NEAR(total, want_total, 1e-12 * (1.0 + std::fabs(want_total))) << "the returned sum";
        for (int64_t i = 0; i < n + 16; ++i) {
          if (i < off || i >= off + n) {
            EXPECT_EQ(out[size_t(i)], 0.25f);
            continue;
          }
          const double e = std::exp((double(src[size_t(i)]) - m) * scale - shift);
          EXPECT_NEAR(out[size_t(i)], a * e + c + e, 1e-6 * (std::fabs(a * e) + std::fabs(c) + e) + 1e-30);
        }

        // Sums and max of the range against float64.
        double se = 0, s = 0, mx = -kInf;
        for (int64_t i = 0; i < n; ++i) {
          const double x = src[size_t(off + i)];
          se += std::exp((x - m) * scale);
          s += x;
          mx = std::max(mx, x);
        }
        EXPECT_NEAR(vmath::sum_exp(src.data() + off, n, m, scale, impl), se, 1e-6 * se + 1e-30);
        EXPECT_NEAR(vmath::sum(src.data() + off, n, impl), s, 1e-12 * (1.0 + std::fabs(s)));
        EXPECT_EQ(vmath::max(src.data() + off, n, impl), float(mx));
      }
  }
}

TEST(VecMath, DotAndAxpy) {
  std::mt19937 gen(14);
  for (Impl impl : impls()) {
    SCOPED_TRACE(vmath::impl_name(impl));
    for (int64_t n : {0, 1, 7, 8, 9, 15, 16, 17, 40, 257, 2048}) {
      SCOPED_TRACE("n " + std::to_string(n));
      const std::vector<float> a = uniform(gen, n, -1.0f, 1.0f), b = uniform(gen, n, -1.0f, 1.0f);
      double want = 0, mag = 0;
      for (int64_t i = 0; i < n; ++i) {
        want += double(a[size_t(i)]) * b[size_t(i)];
        mag += std::fabs(double(a[size_t(i)]) * b[size_t(i)]);
      }
      EXPECT_NEAR(vmath::dot(a.data(), b.data(), n, impl), want, 1e-6 * mag + 1e-30);
      std::vector<float> y = b, y0 = b;
      y.push_back(kNaN);  // a guard: axpy writes n values only
      vmath::axpy(-0.75f, a.data(), y.data(), n, impl);
      for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(y[size_t(i)], y0[size_t(i)] - 0.75 * a[size_t(i)], 1e-6);
      EXPECT_TRUE(std::isnan(y.back()));
    }
  }
}

TEST(VecMath, MaxSkipsNaNAndSumExpSkipsMinusInf) {
  for (Impl impl : impls()) {
    SCOPED_TRACE(vmath::impl_name(impl));
    std::vector<float> x(37, -kInf);
    EXPECT_EQ(vmath::max(x.data(), 37, impl), -kInf);
    EXPECT_EQ(vmath::sum_exp(x.data(), 37, 0.0f, 1.0f, impl), 0.0f);
    x[3] = kNaN;
    x[20] = -5.0f;
    x[36] = -7.0f;
    EXPECT_EQ(vmath::max(x.data(), 37, impl), -5.0f);
    x[3] = -kInf;
    EXPECT_NEAR(vmath::sum_exp(x.data(), 37, -5.0f, 1.0f, impl), 1.0 + std::exp(-2.0), 1e-6);
    x[5] = kNaN;  // a NaN shows in the sum
    EXPECT_TRUE(std::isnan(vmath::sum_exp(x.data(), 37, -5.0f, 1.0f, impl)));
    EXPECT_EQ(vmath::max(nullptr, 0, impl), -kInf);
    EXPECT_EQ(vmath::sum(nullptr, 0, impl), 0.0);
  }
}

}  // namespace
}  // namespace retort::test
