// bgemm, the CPU GEMM in bf16: against a float64 reference of the bf16-rounded operands, with each kernel
// (AVX-512 BF16 pairs where the CPU has them; the f32 fallbacks, Portable and Avx2, forced by the kernel
// argument) over odd shapes that cross the tile and cache blocks, K odd (vdpbf16ps takes k in pairs), every
// transpose, f32 / bf16 / f16 storage, accumulate into C, and thread counts.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "harness.h"
#include "ops/matmul_kernel.h"

namespace retort::test {
namespace {

const gemm::Kernel kKernels[] = {gemm::Kernel::Portable, gemm::Kernel::Avx2, gemm::Kernel::Avx512,
                                 gemm::Kernel::Avx512Bf16};

// An operand stored [rows, cols] row-major in dtype dt (read transposed when trans), and its values rounded
// to bf16 as float64 (what bgemm multiplies).
struct Stored {
  std::vector<char> bytes;
  std::vector<double> rounded;  // element (r, c) of the stored matrix at r * cols + c
  int64_t rows = 0, cols = 0;
  DType dt = DType::F32;

  gemm::Operand operand(bool trans) const {
    const int64_t es = int64_t(dtype_size(dt));
    // op(x)(r, c): untransposed rows step by cols elements; transposed, the other way round.
    return {bytes.data(), dt, trans ? es : es * cols, trans ? es * cols : es};
  }
};

Stored make_stored(int64_t rows, int64_t cols, DType dt, const std::string& seed) {
  reseed(seed);
  Vec v = random_vec(rows * cols);
  Stored s;
  s.rows = rows, s.cols = cols, s.dt = dt;
  s.bytes.resize(size_t(rows * cols) * dtype_size(dt));
  for (int64_t i = 0; i < rows * cols; ++i) {
    store_f32(s.bytes.data(), dt, i, float(v[size_t(i)]));
    const float stored_value = load_f32(s.bytes.data(), dt, i);
    s.rounded.push_back(double(bf16_to_f32(f32_to_bf16(stored_value))));
  }
  return s;
}

// C = A B (or C += A B) with kernel; compares every element with the float64 product of the rounded
// operands. The bound: any order of f32 sums of K exact products errs by at most about K u sum |a b| (u =
// 2^-24); (K + 2) u sum |a b| + C's own rounding. Also returns C for cross-checks.
std::vector<float> check_bgemm(gemm::Kernel kernel, int64_t m, int64_t n, int64_t k, bool ta, bool tb,
                               DType da, DType db, ThreadPool* pool, bool accumulate = false) {
  const std::string what = std::string(gemm::kernel_name(kernel)) + " " + std::to_string(m) + "x" +
                           std::to_string(n) + "x" + std::to_string(k) + (ta ? " ta" : "") +
                           (tb ? " tb" : "") + " A " + dtype_name(da) + " B " + dtype_name(db) +
                           (accumulate ? " +=" : "") + (pool ? " pool" : "");
  SCOPED_TRACE(what);
  const Stored a = make_stored(ta ? k : m, ta ? m : k, da, "bgemm_a" + std::to_string(m * 31 + k));
  const Stored b = make_stored(tb ? n : k, tb ? k : n, db, "bgemm_b" + std::to_string(n * 17 + k));
  const int64_t ldc = n + 5;  // padded C: the kernel must respect ldc and leave the padding alone
  reseed("bgemm_c" + std::to_string(m + n + k));
  Vec c0 = random_vec(m * ldc);
  std::vector<float> c(c0.begin(), c0.end());
  gemm::bgemm(m, n, k, a.operand(ta), b.operand(tb), c.data(), ldc, pool, kernel, accumulate);
  const double u = std::ldexp(1.0, -24);
  int64_t bad = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = accumulate ? double(float(c0[size_t(i * ldc + j)])) : 0.0, mag = std::fabs(s);
      for (int64_t p = 0; p < k; ++p) {
        const double x = a.rounded[size_t(ta ? p * m + i : i * k + p)];
        const double y = b.rounded[size_t(tb ? j * k + p : p * n + j)];
        s += x * y;
        mag += std::fabs(x * y);
      }
      const double got = c[size_t(i * ldc + j)];
      const double tol = double(k + 2) * u * mag + u * std::fabs(s) + 1e-30;
      if (!(std::fabs(got - s) <= tol) && bad++ < 5)
        ADD_FAILURE() << "C[" << i << ", " << j << "] = " << got << ", want " << s << " (tol " << tol << ")";
    }
    for (int64_t j = n; j < ldc; ++j)
      if (c[size_t(i * ldc + j)] != float(c0[size_t(i * ldc + j)]) && bad++ < 5)
        ADD_FAILURE() << "padding of row " << i << " overwritten";
  }
  EXPECT_EQ(bad, 0);
  return c;
}

bool skip_unavailable(gemm::Kernel kernel) {
  if (gemm::kernel_available(kernel)) return false;
  std::printf("[  SKIPPED ] bgemm %s: not supported by this CPU\n", gemm::kernel_name(kernel));
  return true;
}

TEST(MatmulBf16, EveryKernelAcrossTilesAndBlocks) {
  ThreadPool pool(2);
  // Small odd shapes and K = 1, 2, 3 (a lone last step of a pair); shapes past the 8 x 32 tile; K odd across
  // several KC blocks (a shorter odd last block); M across MC blocks; N across NC blocks (column split with
  // few rows); the whole-B path (tall C, few columns, long K).
  struct S {
    int64_t m, n, k;
    bool pool;
  };
  const S shapes[] = {{1, 1, 1, false},     {3, 5, 2, false},      {7, 9, 3, false},    {9, 33, 17, false},
                      {8, 32, 16, false},   {17, 65, 31, false},   {13, 31, 513, true}, {400, 50, 601, true},
                      {10, 3100, 37, true}, {60, 3100, 300, true}, {500, 96, 520, true}};
  for (gemm::Kernel kernel : kKernels) {
    if (skip_unavailable(kernel)) continue;
    for (const S& s : shapes)
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          check_bgemm(kernel, s.m, s.n, s.k, ta, tb, DType::BF16, DType::BF16, s.pool ? &pool : nullptr);
          check_bgemm(kernel, s.m, s.n, s.k, ta, tb, DType::F32, DType::BF16, s.pool ? &pool : nullptr);
        }
  }
}

TEST(MatmulBf16, TheFusedLossShapesWithF32Gradients) {
  // The lm head's three GEMMs as the CPU chunk executor calls them: logits = h Wᵀ (h, W bf16), dh = G W (G
  // the f32 gradient of the logits, rounded while packed), dW += Gᵀ h (accumulated into the f32 gradient).
  ThreadPool pool(2);
  const int64_t rows = 37, v = 515, h = 72;
  for (gemm::Kernel kernel : kKernels) {
    if (skip_unavailable(kernel)) continue;
    check_bgemm(kernel, rows, v, h, false, true, DType::BF16, DType::BF16, &pool);        // logits
    check_bgemm(kernel, rows, h, v, false, false, DType::F32, DType::BF16, &pool);        // dh
    check_bgemm(kernel, v, h, rows, true, false, DType::F32, DType::BF16, &pool, true);   // dW +=
    check_bgemm(kernel, v, h, rows, true, false, DType::F32, DType::F16, nullptr, true);  // f16 storage
    check_bgemm(kernel, v, h, rows, true, false, DType::F16, DType::F32, &pool);
  }
}

TEST(MatmulBf16, AccumulateAndThreadsDoNotChangeTheResult) {
  // Each element of C is summed by one thread in a fixed order: 1 and 2 threads agree bit for bit, and
  // C += A B equals C0 + (A B) up to the one rounding of that final add.
  ThreadPool pool(2);
  for (gemm::Kernel kernel : kKernels) {
    if (skip_unavailable(kernel)) continue;
    for (bool ta : {false, true}) {
      const auto one = check_bgemm(kernel, 300, 200, 301, ta, true, DType::F32, DType::BF16, nullptr);
      const auto two = check_bgemm(kernel, 300, 200, 301, ta, true, DType::F32, DType::BF16, &pool);
      EXPECT_EQ(one, two) << gemm::kernel_name(kernel);
      check_bgemm(kernel, 300, 200, 301, ta, true, DType::F32, DType::BF16, &pool, true);
      check_bgemm(kernel, 5, 3100, 301, ta, false, DType::BF16, DType::BF16, &pool, true);
    }
  }
}

TEST(MatmulBf16, RoundsItsOperandsWhereSgemmDoesNot) {
  // 1 + 2^-12 is an f32 but not a bf16 (8 significant bits): bgemm multiplies 1, sgemm 1 + 2^-12. A kernel
  // that skipped the rounding would pass the float64 checks above only if they compared unrounded values.
  const int64_t m = 9, n = 33, k = 5;
  std::vector<float> a(size_t(m * k), 1.0f + std::ldexp(1.0f, -12)), b(size_t(k * n), 1.0f);
  const gemm::Operand oa{a.data(), DType::F32, 4 * k, 4}, ob{b.data(), DType::F32, 4 * n, 4};
  for (gemm::Kernel kernel : kKernels) {
    if (skip_unavailable(kernel)) continue;
    std::vector<float> c(size_t(m * n), -1.0f);
    gemm::bgemm(m, n, k, oa, ob, c.data(), n, nullptr, kernel);
    for (float x : c) ASSERT_EQ(x, float(k)) << gemm::kernel_name(kernel);
  }
  std::vector<float> c(size_t(m * n));
  gemm::sgemm(m, n, k, oa, ob, c.data(), n, nullptr, gemm::best_kernel());
  EXPECT_GT(c[0], float(k));
}

TEST(MatmulBf16, KernelsAgree) {
  // The AVX-512 pairs and the f32 fallback multiply the same rounded values: their results differ only by the
  // order of the f32 sums.
  if (!gemm::kernel_available(gemm::Kernel::Avx512Bf16)) {
    std::printf("[  SKIPPED ] avx512-bf16 not supported by this CPU: nothing to compare\n");
    return;
  }
  ThreadPool pool(2);
  const auto x =
      check_bgemm(gemm::Kernel::Avx512Bf16, 77, 300, 255, false, true, DType::F32, DType::BF16, &pool);
  const auto y = check_bgemm(gemm::best_kernel(), 77, 300, 255, false, true, DType::F32, DType::BF16, &pool);
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, double(std::fabs(x[i] - y[i])));
  EXPECT_LT(worst, 1e-4);
}

}  // namespace
}  // namespace retort::test
