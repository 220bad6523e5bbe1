// matmul: forward against a float64 reference over shapes that cross the GEMM's block sizes, all four
// transpose combinations, batches with broadcast B, strided views, bf16/f16 storage, thread counts; gradients
// against central finite differences; the packed GEMM itself with both micro-kernels; bad shapes throw.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "harness.h"
#include "matmul_add_cases.h"
#include "ops/matmul_kernel.h"

namespace retort::test {
namespace {

// Tolerances. Every operand is converted to f32 exactly (bf16 and f16 values are f32 values), so the only
// error is f32 rounding of the K-term sums: relative error ~ sqrt(K) * 2^-24, an nmse near 1e-13 for these
// sizes (measured: at most 7e-14). 1e-11 leaves room and still catches a single wrong element (that alone
// gives an nmse of order 1 / (M N)).
constexpr double kFwdTol = 1e-11;
// Gradients are themselves matmuls in f32 (nmse ~1e-14), compared with central differences of the float64
// reference, which are exact for a function linear in each element up to rounding (~1e-16 / step).
constexpr double kGradTol = 1e-10;

// op(x) for a stored operand: the reference reads element (r, c) of the [rows, cols] matrix of batch
// (i2, i3), transposed when `trans`.
double elem(const Ref& x, bool trans, int64_t r, int64_t c, int64_t i2, int64_t i3) {
  return trans ? x.at(r, c, i2, i3) : x.at(c, r, i2, i3);
}

// C = op(A) op(B) in float64, batched over dims 2 and 3 with B broadcast. Output in ggml order [.., M, N].
Vec ref_matmul(const Ref& a, const Ref& b, bool ta, bool tb) {
  const int64_t m = ta ? a.ne[0] : a.ne[1], k = ta ? a.ne[1] : a.ne[0], n = tb ? b.ne[1] : b.ne[0];
  Vec out(size_t(n * m * a.ne[2] * a.ne[3]));
  size_t o = 0;
  for (int64_t i3 = 0; i3 < a.ne[3]; ++i3)
    for (int64_t i2 = 0; i2 < a.ne[2]; ++i2)
      for (int64_t r = 0; r < m; ++r)
        for (int64_t c = 0; c < n; ++c) {
          double s = 0;
          for (int64_t p = 0; p < k; ++p)
            s += elem(a, ta, r, p, i2, i3) * elem(b, tb, p, c, i2 % b.ne[2], i3 % b.ne[3]);
          out[o++] = s;
        }
  return out;
}

// The stored shape of an operand read as [rows, cols] (transposed: stored [cols, rows]), with batch dims.
Shape stored(int64_t rows, int64_t cols, bool trans, Shape batch = {}) {
  batch.push_back(trans ? cols : rows);
  batch.push_back(trans ? rows : cols);
  return batch;
}

OpCase plain_case(int64_t m, int64_t n, int64_t k, bool ta, bool tb, DType dt = DType::F32,
                  Shape batch_a = {}, Shape batch_b = {}) {
  OpCase c;
  c.name = "matmul_" + std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) +
           (ta ? "_ta" : "") + (tb ? "_tb" : "") + "_" + dtype_name(dt) + "_b" +
           std::to_string(batch_a.size()) + std::to_string(batch_b.size());
  c.inputs = {{stored(m, k, ta, batch_a), dt}, {stored(k, n, tb, batch_b), dt}};
  c.build = [ta, tb](Context& ctx, const std::vector<Tensor*>& in) {
    return matmul(ctx, in[0], in[1], ta, tb);
  };
  c.reference = [ta, tb](const std::vector<Ref>& in) { return ref_matmul(in[0], in[1], ta, tb); };
  c.fwd_tol = kFwdTol;
  c.grad_tol = kGradTol;
  return c;
}

struct Mnk {
  int64_t m, n, k;
  bool grad;  // finite differences cost O(inputs * M N K): only for small shapes
};

// 1x1x1; odd sizes; sizes just past the micro-tile (6 x 16); sizes crossing the cache blocks (MC = 168,
// KC = 256) and the 16-wide panel edge; a tall-skinny and a short-wide C (the row-split and column-split
// threading paths); a row and a column vector.
const Mnk kShapes[] = {{1, 1, 1, true},       {7, 5, 13, true},     {6, 16, 4, true},
                       {13, 17, 3, true},     {65, 129, 33, false}, {300, 200, 100, false},
                       {170, 40, 520, false}, {5, 700, 300, false}, {1, 33, 70, false},
                       {40, 1, 70, false}};

class MatmulShapes : public ::testing::TestWithParam<int> {};

TEST_P(MatmulShapes, AllTransposesMatchFloat64) {
  const int flags = GetParam();
  const bool ta = flags & 1, tb = flags & 2;
  for (const Mnk& s : kShapes) {
    OpCase c = plain_case(s.m, s.n, s.k, ta, tb);
    c.check_grad = s.grad;
    EXPECT_TRUE(run_case(c));
  }
}

TEST_P(MatmulShapes, BatchedWithBroadcastB) {
  const int flags = GetParam();
  const bool ta = flags & 1, tb = flags & 2;
  // B shared by all batches, by one batch dim, or not at all; gradients reduce over the broadcast dims.
  const std::pair<Shape, Shape> batches[] = {
      {{3}, {1}}, {{2, 3}, {2, 3}}, {{2, 3}, {1, 3}}, {{2, 3}, {2, 1}}, {{2, 3}, {}}};
  for (auto& [ba, bb] : batches) {
    OpCase c = plain_case(5, 7, 4, ta, tb, DType::F32, ba, bb);
    EXPECT_TRUE(run_case(c));
  }
  // Big enough per batch that the threads split each GEMM instead of taking whole batches.
  OpCase big = plain_case(160, 170, 180, ta, tb, DType::F32, {3}, {1});
  big.check_grad = false;
  EXPECT_TRUE(run_case(big));
}

TEST_P(MatmulShapes, Bf16AndF16Inputs) {
  const int flags = GetParam();
  const bool ta = flags & 1, tb = flags & 2;
  for (DType dt : {DType::BF16, DType::F16}) {
    // The reference sees the values as stored (rounded), so the tolerance is the f32 one.
    EXPECT_TRUE(run_case(plain_case(9, 11, 7, ta, tb, dt, {2}, {1})));
    OpCase big = plain_case(70, 90, 300, ta, tb, dt);
    big.check_grad = false;
    EXPECT_TRUE(run_case(big));
  }
}

// Bit 0: transpose A, bit 1: transpose B.
std::string transpose_name(const ::testing::TestParamInfo<int>& info) {
  static const char* const kNames[] = {"NN", "TN", "NT", "TT"};
  return kNames[info.param];
}
INSTANTIATE_TEST_SUITE_P(Ops, MatmulShapes, ::testing::Values(0, 1, 2, 3), transpose_name);

TEST(Matmul, MixedDtypes) {
  OpCase c = plain_case(8, 9, 10, false, true);
  c.name = "matmul_mixed";
  c.inputs[0].dtype = DType::BF16;
  c.inputs[1].dtype = DType::F16;
  EXPECT_TRUE(run_case(c));
}

// Float64 counterparts of the views, for references.
Ref transpose_ref(const Ref& x) {
  Ref t;
  t.ne[0] = x.ne[1];
  t.ne[1] = x.ne[0];
  t.ne[2] = x.ne[2];
  t.ne[3] = x.ne[3];
  t.v.resize(x.v.size());
  for (int64_t i3 = 0; i3 < x.ne[3]; ++i3)
    for (int64_t i2 = 0; i2 < x.ne[2]; ++i2)
      for (int64_t i1 = 0; i1 < t.ne[1]; ++i1)
        for (int64_t i0 = 0; i0 < t.ne[0]; ++i0) t.at(i0, i1, i2, i3) = x.at(i1, i0, i2, i3);
  return t;
}
Ref slice_ref(const Ref& x, int dim, int64_t start, int64_t len) {
  Ref s = x;
  s.ne[dim] = len;
  s.v.assign(size_t(s.size()), 0.0);
  for (int64_t i3 = 0; i3 < s.ne[3]; ++i3)
    for (int64_t i2 = 0; i2 < s.ne[2]; ++i2)
      for (int64_t i1 = 0; i1 < s.ne[1]; ++i1)
        for (int64_t i0 = 0; i0 < s.ne[0]; ++i0) {
          int64_t j[4] = {i0, i1, i2, i3};
          j[dim] += start;
          s.at(i0, i1, i2, i3) = x.at(j[0], j[1], j[2], j[3]);
        }
  return s;
}

TEST(Matmul, TransposedViewsInsteadOfFlags) {
  // A stored [K, M] and viewed as [M, K] by transpose(): dim 0 is no longer contiguous. Same for B.
  for (bool big : {false, true}) {
    const int64_t m = big ? 70 : 6, n = big ? 50 : 5, k = big ? 40 : 4;
    OpCase c;
    c.name = big ? "matmul_views_big" : "matmul_views";
    c.inputs = {{Shape{k, m}}, {Shape{n, k}}};
    c.build = [](Context& ctx, const std::vector<Tensor*>& in) {
      return matmul(ctx, transpose(ctx, in[0]), transpose(ctx, in[1]));
    };
    c.reference = [](const std::vector<Ref>& in) {
      return ref_matmul(transpose_ref(in[0]), transpose_ref(in[1]), false, false);
    };
    c.fwd_tol = kFwdTol;
    c.grad_tol = kGradTol;
    c.check_grad = !big;
    EXPECT_TRUE(run_case(c));
  }
}

TEST(Matmul, SlicedOperands) {
  // Column windows leave rows longer than they are read (row stride > row length); a window of rows offsets
  // the start; a transposed view of a slice has neither dim contiguous.
  for (bool big : {false, true}) {
    const int64_t m = big ? 40 : 5, n = big ? 35 : 6, k = big ? 300 : 7;
    OpCase c;
    c.name = big ? "matmul_slices_big" : "matmul_slices";
    c.inputs = {{Shape{m + 3, k + 4}}, {Shape{n + 2, k + 1}}};
    c.build = [=](Context& ctx, const std::vector<Tensor*>& in) {
      Tensor* a = slice(ctx, slice(ctx, in[0], 0, 3, k), 1, 2, m);  // rows 2.., columns 3..
      Tensor* b = transpose(ctx, slice(ctx, in[1], 0, 1, k));       // [n, k] window, read as [k, n]
      return matmul(ctx, a, b);
    };
    c.reference = [=](const std::vector<Ref>& in) {
      Ref a = slice_ref(slice_ref(in[0], 0, 3, k), 1, 2, m);
      Ref b = transpose_ref(slice_ref(in[1], 0, 1, k));
      return ref_matmul(a, b, false, false);
    };
    c.fwd_tol = kFwdTol;
    c.grad_tol = kGradTol;
    c.check_grad = !big;
    EXPECT_TRUE(run_case(c));
  }
}

TEST(Matmul, PermutedBatchDims) {
  // A stored [M, batch, K] and permuted to [batch, M, K]: the batch stride is smaller than the row stride.
  OpCase c;
  c.name = "matmul_permuted_batch";
  c.inputs = {{Shape{5, 3, 4}}, {Shape{3, 4, 6}}};
  c.build = [](Context& ctx, const std::vector<Tensor*>& in) {
    return matmul(ctx, permute(ctx, in[0], 0, 2, 1, 3), in[1]);
  };
  c.reference = [](const std::vector<Ref>& in) {
    const Ref& x = in[0];  // ne = {K=4, batch=3, M=5}
    Ref a;
    a.ne[0] = x.ne[0];
    a.ne[1] = x.ne[2];
    a.ne[2] = x.ne[1];
    a.v.resize(x.v.size());
    for (int64_t i2 = 0; i2 < a.ne[2]; ++i2)
      for (int64_t i1 = 0; i1 < a.ne[1]; ++i1)
        for (int64_t i0 = 0; i0 < a.ne[0]; ++i0) a.at(i0, i1, i2) = x.at(i0, i2, i1);
    return ref_matmul(a, in[1], false, false);
  };
  c.fwd_tol = kFwdTol;
  c.grad_tol = kGradTol;
  EXPECT_TRUE(run_case(c));
}

TEST(Matmul, ThreadCountsDoNotChangeTheResult) {
  // Three threads split rows, columns and batches unevenly; the result must still match (and the poisoned
  // arena shows any tile no thread wrote).
  for (int threads : {1, 3}) {
    CpuBackend be(threads);
    for (const Mnk& s : {Mnk{301, 77, 260, false}, Mnk{8, 1500, 400, false}}) {
      OpCase c = plain_case(s.m, s.n, s.k, false, true);
      c.name += "_threads" + std::to_string(threads);
      c.check_grad = false;
      EXPECT_TRUE(run_case(c, &be));
    }
    OpCase b = plain_case(7, 9, 5, true, false, DType::F32, {5}, {1});
    b.name += "_threads" + std::to_string(threads);
    EXPECT_TRUE(run_case(b, &be));
  }
}

TEST(Matmul, LinearLayerGradients) {
  // The common use: y = x Wᵀ with W [out, in], over a batch of sequences.
  OpCase c;
  c.name = "matmul_linear";
  c.inputs = {{Shape{2, 3, 6}}, {Shape{4, 6}}};
  c.build = [](Context& ctx, const std::vector<Tensor*>& in) {
    return matmul(ctx, in[0], in[1], false, true);
  };
  c.reference = [](const std::vector<Ref>& in) { return ref_matmul(in[0], in[1], false, true); };
  c.fwd_tol = kFwdTol;
  c.grad_tol = kGradTol;
  EXPECT_TRUE(run_case(c));
}

// ---- the packed GEMM directly, with each micro-kernel
// -------------------------------------------------------

// C = A B, or C += A B with accumulate (C starts at -7 everywhere, its padding included).
void check_gemm(gemm::Kernel kernel, int64_t m, int64_t n, int64_t k, bool ta, bool tb, ThreadPool* pool,
                bool accumulate = false) {
  SCOPED_TRACE(std::string(gemm::kernel_name(kernel)) + " " + std::to_string(m) + "x" + std::to_string(n) +
               "x" + std::to_string(k) + (ta ? " ta" : "") + (tb ? " tb" : "") + (accumulate ? " +=" : ""));
  reseed("gemm" + std::to_string(m * 131 + n * 7 + k));
  Vec av = random_vec(m * k), bv = random_vec(k * n);
  std::vector<float> a(av.begin(), av.end()), b(bv.begin(), bv.end());
  // A is [m, k] row-major, or [k, m] when transposed; B likewise.
  gemm::Operand oa{a.data(), DType::F32, ta ? 4 : 4 * k, ta ? 4 * m : 4};
  gemm::Operand ob{b.data(), DType::F32, tb ? 4 : 4 * n, tb ? 4 * k : 4};
  const int64_t ldc = n + 3;  // a padded C: the kernel must respect ldc and leave the padding alone
  std::vector<float> c(size_t(m * ldc), -7.0f);
  gemm::sgemm(m, n, k, oa, ob, c.data(), ldc, pool, kernel, accumulate);
  Vec got, want;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = accumulate ? -7.0 : 0.0;
      for (int64_t p = 0; p < k; ++p)
        s += double(a[size_t(ta ? p * m + i : i * k + p)]) * double(b[size_t(tb ? j * k + p : p * n + j)]);
      want.push_back(s);
      got.push_back(c[size_t(i * ldc + j)]);
    }
    for (int64_t j = n; j < ldc; ++j) ASSERT_EQ(c[size_t(i * ldc + j)], -7.0f) << "padding overwritten";
  }
  EXPECT_LE(nmse(got, want), kFwdTol);
}

TEST(MatmulKernel, EveryMicroKernelAcrossBlocks) {
  ThreadPool pool(2);
  for (gemm::Kernel kernel : {gemm::Kernel::Portable, gemm::Kernel::Avx2, gemm::Kernel::Avx512}) {
    if (!gemm::kernel_available(kernel)) {
      std::printf("[  SKIPPED ] %s micro-kernel: not supported by this CPU\n", gemm::kernel_name(kernel));
      continue;
    }
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        check_gemm(kernel, 1, 1, 1, ta, tb, nullptr);
        check_gemm(kernel, 13, 31, 9, ta, tb, nullptr);
        check_gemm(kernel, 400, 50, 600, ta, tb,
                   &pool);  // several MC and KC blocks, row split, all of B packed
        check_gemm(kernel, 400, 3100, 300, ta, tb,
                   &pool);                                 // the same with two NC blocks (B packed per block)
        check_gemm(kernel, 10, 3100, 300, ta, tb, &pool);  // two NC blocks, column split
        check_gemm(kernel, 13, 31, 9, ta, tb, nullptr, true);
        check_gemm(kernel, 400, 50, 600, ta, tb, &pool, true);
        check_gemm(kernel, 400, 50, 600, ta, tb, nullptr, true);
        check_gemm(kernel, 10, 3100, 300, ta, tb, &pool, true);
      }
  }
}

TEST(MatmulKernel, ColumnSplitAcrossRaggedBlocksHasNoRace) {
  // A short, wide GEMM (the fused losses' logits chunks) splits B's panels between threads, which share one
  // packed-B buffer. The last NC block is narrower, so its panels fall to other threads at other offsets:
  // before the barrier between blocks, a fast thread packed them over panels a slow one was still reading
  // (wrong sums at 16 threads, seen on a 2-core machine). Many threads, repeated: bitwise the 1-thread
  // result.
  const int64_t m = 44, n = 50257, k = 64;
  reseed("gemm_ragged");
  Vec av = random_vec(m * k), bv = random_vec(n * k);
  std::vector<float> a(av.begin(), av.end()), b(bv.begin(), bv.end());
  const gemm::Operand oa{a.data(), DType::F32, 4 * k, 4}, ob{b.data(), DType::F32, 4, 4 * k};  // B = Wᵀ
  for (gemm::Kernel kernel : {gemm::Kernel::Portable, gemm::Kernel::Avx2, gemm::Kernel::Avx512}) {
    if (!gemm::kernel_available(kernel)) continue;
    std::vector<float> one(size_t(m * n)), many(size_t(m * n));
    gemm::sgemm(m, n, k, oa, ob, one.data(), n, nullptr, kernel);
    ThreadPool pool(16);
    for (int rep = 0; rep < 6; ++rep) {
      std::fill(many.begin(), many.end(), -7.0f);
      gemm::sgemm(m, n, k, oa, ob, many.data(), n, &pool, kernel);
      size_t off = 0;
      for (size_t i = 0; i < one.size(); ++i) off += one[i] != many[i];
      EXPECT_EQ(off, 0u) << gemm::kernel_name(kernel) << " run " << rep << ": " << off << " of " << one.size()
                         << " entries differ from the 1-thread result";
    }
  }
}

TEST(MatmulKernel, WholeBPathDoesNotDependOnThreads) {
  // A weight gradient's shape (tall C, few columns, long k: dWᵀ-like A read down its columns) packs all of B
  // once and runs each row block with k innermost; every C entry still sums its k blocks in order on one
  // thread, so any thread count gives the 1-thread result bit for bit, with and without accumulate.
  const int64_t m = 1000, n = 128, k = 700;
  reseed("gemm_whole_b");
  Vec av = random_vec(m * k), bv = random_vec(k * n), cv = random_vec(m * n);
  std::vector<float> a(av.begin(), av.end()), b(bv.begin(), bv.end()), c0(cv.begin(), cv.end());
  const gemm::Operand oa{a.data(), DType::F32, 4, 4 * m}, ob{b.data(), DType::F32, 4 * n, 4};  // A = Xᵀ
  for (gemm::Kernel kernel : {gemm::Kernel::Portable, gemm::Kernel::Avx2, gemm::Kernel::Avx512}) {
    if (!gemm::kernel_available(kernel)) continue;
    for (bool acc : {false, true}) {
      std::vector<float> one = c0, many;
      gemm::sgemm(m, n, k, oa, ob, one.data(), n, nullptr, kernel, acc);
      for (int threads : {2, 3, 16}) {
        ThreadPool pool(threads);
        many = c0;
        gemm::sgemm(m, n, k, oa, ob, many.data(), n, &pool, kernel, acc);
        size_t off = 0;
        for (size_t i = 0; i < one.size(); ++i) off += one[i] != many[i];
        EXPECT_EQ(off, 0u) << gemm::kernel_name(kernel) << " " << threads << " threads, accumulate " << acc;
      }
    }
  }
}

TEST(MatmulKernel, DotProductPathForFewRows) {
  // Up to gemm::kGemvMaxRows rows of A against B = Wᵀ (columns contiguous) take the dot-product path: K not
  // a multiple of the 8-wide vector, N not a multiple of the 4-column block, f32 and bf16 W, strided A, one
  // thread and several (the column split).
  ThreadPool pool(3);
  for (gemm::Kernel kernel : {gemm::Kernel::Portable, gemm::Kernel::Avx2, gemm::Kernel::Avx512}) {
    if (!gemm::kernel_available(kernel)) continue;
    for (DType wt : {DType::F32, DType::BF16})
      for (int64_t m = 1; m <= gemm::kGemvMaxRows; ++m)
        for (auto [n, k] : {std::pair<int64_t, int64_t>{1, 1}, {7, 13}, {33, 64}, {70000, 11}}) {
          SCOPED_TRACE(std::string(gemm::kernel_name(kernel)) + " " + dtype_name(wt) + " " +
                       std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k));
          reseed("gemv" + std::to_string(m * 131 + n * 7 + k));
          const int64_t lda = k + 5;  // A's rows padded: a strided operand
          Vec av = random_vec(m * lda), wv = random_vec(n * k);
          std::vector<float> a(av.begin(), av.end());
          std::vector<uint16_t> w16(size_t(n * k));
          std::vector<float> w(wv.begin(), wv.end());
          for (size_t i = 0; i < w.size(); ++i) {
            w16[i] = f32_to_bf16(w[i]);
            if (wt == DType::BF16) w[i] = bf16_to_f32(w16[i]);
          }
          const size_t es = dtype_size(wt);
          const gemm::Operand oa{a.data(), DType::F32, 4 * lda, 4};
          const gemm::Operand ob{wt == DType::F32 ? static_cast<const void*>(w.data()) : w16.data(), wt,
                                 int64_t(es), int64_t(es) * k};
          ASSERT_TRUE(gemm::gemv_applies(m, oa, ob));
          const int64_t ldc = n + 2;
          std::vector<float> c(size_t(m * ldc), -7.0f);
          gemm::sgemm(m, n, k, oa, ob, c.data(), ldc, &pool, kernel);
          Vec got, want;
          for (int64_t i = 0; i < m; ++i) {
            for (int64_t j = 0; j < n; ++j) {
              double s = 0;
              for (int64_t p = 0; p < k; ++p)
                s += double(a[size_t(i * lda + p)]) * double(w[size_t(j * k + p)]);
              want.push_back(s);
              got.push_back(c[size_t(i * ldc + j)]);
            }
            for (int64_t j = n; j < ldc; ++j)
              ASSERT_EQ(c[size_t(i * ldc + j)], -7.0f) << "padding overwritten";
          }
          EXPECT_LE(nmse(got, want), kFwdTol);
        }
  }
  // Not for more rows, nor for a B whose columns are strided.
  std::vector<float> x(16);
  const gemm::Operand o{x.data(), DType::F32, 16, 4};
  EXPECT_FALSE(gemm::gemv_applies(gemm::kGemvMaxRows + 1, o, {x.data(), DType::F32, 4, 16}));
  EXPECT_FALSE(gemm::gemv_applies(1, o, o));
}

// ---- bad input
// ----------------------------------------------------------------------------------------------

void expect_error(const std::function<void()>& f, std::initializer_list<const char*> parts) {
  try {
    f();
    ADD_FAILURE() << "expected retort::Error";
  } catch (const Error& e) {
    std::string m = e.what();
    for (const char* p : parts) EXPECT_NE(m.find(p), std::string::npos) << "'" << p << "' not in: " << m;
  }
}

TEST(Matmul, BadShapesThrow) {
  Context ctx(default_cpu_backend());
  Tensor* a = ctx.tensor(DType::F32, {4, 6});
  Tensor* b = ctx.tensor(DType::F32, {5, 3});
  expect_error([&] { matmul(ctx, a, b); }, {"matmul", "[4, 6]", "[5, 3]", "K = 6", "K = 5"});
  // Transposed flags change which dims must agree: Aᵀ is [6, 4], so K = 4 against B's 5.
  expect_error([&] { matmul(ctx, a, b, true, false); }, {"matmul", "transposed", "K = 4"});
  Tensor* b_ok = ctx.tensor(DType::F32, {3, 6});
  EXPECT_NO_THROW(matmul(ctx, a, b_ok, false, true));
  // Batch dims: B's must be 1 or equal to A's; A never broadcasts.
  Tensor* a3 = ctx.tensor(DType::F32, {2, 4, 6});
  Tensor* b3 = ctx.tensor(DType::F32, {3, 6, 5});
  expect_error([&] { matmul(ctx, a3, b3); }, {"matmul", "batch", "[2, 4, 6]", "[3, 6, 5]"});
  expect_error([&] { matmul(ctx, a, ctx.tensor(DType::F32, {2, 6, 5})); }, {"matmul", "batch"});
  // Integer operands.
  expect_error(
      [&] {
        matmul(ctx, ctx.tensor(DType::I32, {4, 6}), ctx.tensor(DType::F32, {6, 2}));
      },
      {"matmul", "float", "i32[4, 6]"});
  expect_error([&] { matmul(ctx, nullptr, b); }, {"matmul"});
}

// matmul_add: its case list (shared with the CUDA suite), and one GEMM node per call (no add pass).
TEST(MatmulAdd, CasesMatchFloat64) {
  for (const OpCase& c : matmul_add_cases()) EXPECT_TRUE(run_case(c)) << c.name;
}

TEST(MatmulAdd, IsOneNodeAndChecksItsAddend) {
  Context ctx(default_cpu_backend());
  Tensor* a = ctx.param(DType::F32, {4, 3}, "a");
  Tensor* b = ctx.param(DType::F32, {5, 3}, "b");
  Tensor* c = ctx.param(DType::F32, {4, 5}, "c");
  Tensor* y = matmul_add(ctx, a, b, c, false, true);
  Graph g(ctx);
  g.forward(y);
  ASSERT_EQ(g.nodes().size(), 1u);
  EXPECT_EQ(g.nodes()[0]->op, Op::Matmul);
  expect_error([&] { matmul_add(ctx, a, b, ctx.param(DType::F32, {5, 4}, "c2"), false, true); },
               {"matmul_add", "[4, 5]", "[5, 4]"});
  expect_error([&] { matmul_add(ctx, a, b, ctx.param(DType::BF16, {4, 5}, "c3"), false, true); },
               {"matmul_add", "f32"});
}

}  // namespace
}  // namespace retort::test
