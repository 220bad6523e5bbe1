// Matmul on CUDA (cuBLASLt and the fallback kernel): every transpose combination, broadcast batches, odd and
// degenerate sizes, views that are not matrix-like, misaligned views, bf16 / f16 / mixed inputs, TF32, and
// gradients against finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "cuda_test_util.h"
#include "matmul_add_cases.h"

namespace retort::test {
namespace {

class CudaMatmul : public CudaTest {};

// The float64 reference of op(A) op(B) with B's batch dims broadcast; A, B in ggml order as stored.
Vec ref_matmul(const Ref& a, const Ref& b, bool ta, bool tb) {
  const int64_t M = ta ? a.ne[0] : a.ne[1], K = ta ? a.ne[1] : a.ne[0];
  const int64_t N = tb ? b.ne[1] : b.ne[0];
  Ref c;
  c.ne[0] = N;
  c.ne[1] = M;
  c.ne[2] = a.ne[2];
  c.ne[3] = a.ne[3];
  c.v.assign(size_t(c.size()), 0.0);
  for (int64_t i3 = 0; i3 < c.ne[3]; ++i3)
    for (int64_t i2 = 0; i2 < c.ne[2]; ++i2)
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
          double s = 0;
          for (int64_t k = 0; k < K; ++k) {
            const double av = ta ? a.at(m, k, i2, i3) : a.at(k, m, i2, i3);
            const int64_t j2 = i2 % b.ne[2], j3 = i3 % b.ne[3];
            const double bv = tb ? b.at(k, n, j2, j3) : b.at(n, k, j2, j3);
            s += av * bv;
          }
          c.at(n, m, i2, i3) = s;
        }
  return c.v;
}

// Shape (outermost first) of an operand read as [rows, cols] (or transposed), with batch dims in front.
Shape operand_shape(int64_t b3, int64_t b2, int64_t rows, int64_t cols, bool trans) {
  return trans ? Shape{b3, b2, cols, rows} : Shape{b3, b2, rows, cols};
}

OpCase matmul_case(const std::string& name, int64_t M, int64_t N, int64_t K, bool ta, bool tb, int64_t b2,
                   int64_t b3, bool broadcast_b, DType dt = DType::F32) {
  OpCase c;
  c.name = name;
  c.inputs = {{operand_shape(b3, b2, M, K, ta), dt},
              {operand_shape(broadcast_b ? 1 : b3, broadcast_b ? 1 : b2, K, N, tb), dt}};
  c.build = [ta, tb](Context& ctx, const std::vector<Tensor*>& in) {
    return matmul(ctx, in[0], in[1], ta, tb);
  };
  c.reference = [ta, tb](const std::vector<Ref>& in) { return ref_matmul(in[0], in[1], ta, tb); };
  c.fwd_tol = 1e-11;  // f32 products and sums, no TF32
  c.grad_tol = 1e-8;
  return c;
}

TEST_F(CudaMatmul, EveryTransposeComboAndBatchBroadcastMatchesFloat64) {
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb)
      for (bool bc : {false, true}) {
        OpCase c = matmul_case("cuda_mm_t" + std::to_string(ta) + std::to_string(tb) + (bc ? "_bc" : ""), 5,
                               7, 3, ta, tb, 3, 2, bc);
        EXPECT_TRUE(run_case(c, &cuda_backend())) << c.name;
      }
}

TEST_F(CudaMatmul, OddAndDegenerateSizes) {
  const int64_t sizes[][3] = {{1, 1, 1}, {1, 9, 4}, {9, 1, 4}, {7, 6, 1}, {33, 65, 17}, {129, 31, 70}};
  for (auto& s : sizes)
    for (int t = 0; t < 4; ++t) {
      OpCase c = matmul_case("cuda_mm_" + std::to_string(s[0]) + "x" + std::to_string(s[1]) + "x" +
                                 std::to_string(s[2]) + "_" + std::to_string(t),
                             s[0], s[1], s[2], t & 1, t >> 1, 1, 1, false);
      c.check_grad = s[0] * s[2] < 600;  // finite differences over big operands take long
      EXPECT_TRUE(run_case(c, &cuda_backend())) << c.name;
    }
}

// Batched with batch dims that are not one strided run: A permuted so dims 2 and 3 swap places, B broadcast
// only along dim 3 (one cuBLASLt call per i3).
TEST_F(CudaMatmul, PermutedBatchesAndPartialBroadcast) {
  OpCase c;
  c.name = "cuda_mm_perm_batches";
  c.inputs = {{Shape{3, 4, 5, 6}}, {Shape{1, 3, 6, 7}}};
  c.build = [](Context& ctx, const std::vector<Tensor*>& in) {
    Tensor* a = permute(ctx, in[0], 0, 1, 3, 2);  // [4, 3, 5, 6]: batch dims swapped, rows still contiguous
    // B [1, 3, 6, 7] broadcasts along dim 3 only.
    return matmul(ctx, a, in[1]);
  };
  c.reference = [](const std::vector<Ref>& in) {
    Ref a;  // the permuted A, materialized
    const Ref& x = in[0];
    a.ne[0] = x.ne[0];
    a.ne[1] = x.ne[1];
    a.ne[2] = x.ne[3];
    a.ne[3] = x.ne[2];
    a.v.resize(x.v.size());
    for (int64_t i3 = 0; i3 < x.ne[3]; ++i3)
      for (int64_t i2 = 0; i2 < x.ne[2]; ++i2)
        for (int64_t i1 = 0; i1 < x.ne[1]; ++i1)
          for (int64_t i0 = 0; i0 < x.ne[0]; ++i0) a.at(i0, i1, i3, i2) = x.at(i0, i1, i2, i3);
    return ref_matmul(a, in[1], false, false);
  };
  c.fwd_tol = 1e-11;
  c.grad_tol = 1e-8;
  EXPECT_TRUE(run_case(c, &cuda_backend()));
}

// Operands whose dims 0 and 1 are both strided (a permute moving dim 2 inward) need a contiguous copy first;
// a slice starting at an odd element is misaligned for vector loads.
TEST_F(CudaMatmul, NonMatrixLikeAndMisalignedViews) {
  OpCase c;
  c.name = "cuda_mm_views";
  c.inputs = {{Shape{4, 5, 3}}, {Shape{9, 6}}};
  c.build = [](Context& ctx, const std::vector<Tensor*>& in) {
    // x ne {3, 5, 4} -> ne {5, 4, 3} with strides (12, 60, 4) bytes: neither dim 0 nor dim 1 is contiguous.
    Tensor* a = permute(ctx, in[0], 2, 0, 1, 3);
    Tensor* a2 = slice(ctx, a, 2, 1, 1);  // one batch: ne {5, 4}, A [M = 4, K = 5]
    // ne {3, 5} starting at element (1, 2) of a row of 6: 52 bytes in, so only 4-byte aligned.
    Tensor* b = slice(ctx, slice(ctx, in[1], 0, 1, 3), 1, 2, 5);
    return matmul(ctx, a2, b);
  };
  c.reference = [](const std::vector<Ref>& in) {
    const Ref& x = in[0];  // ne {3, 5, 4}
    Ref a;                 // a(i0 = k, i1 = m) = x(1, k, m)
    a.ne[0] = 5;
    a.ne[1] = 4;
    a.v.resize(20);
    for (int64_t m = 0; m < 4; ++m)
      for (int64_t k = 0; k < 5; ++k) a.at(k, m) = x.at(1, k, m);
    Ref b;
    b.ne[0] = 3;
    b.ne[1] = 5;
    b.v.resize(15);
    for (int64_t k = 0; k < 5; ++k)
      for (int64_t n = 0; n < 3; ++n) b.at(n, k) = in[1].at(1 + n, 2 + k);
    return ref_matmul(a, b, false, false);
  };
  c.fwd_tol = 1e-11;
  c.grad_tol = 1e-8;
  EXPECT_TRUE(run_case(c, &cuda_backend()));
}

TEST_F(CudaMatmul, HalfPrecisionAndMixedInputsAccumulateInF32) {
  for (DType dt : {DType::BF16, DType::F16})
    for (int t = 0; t < 4; ++t) {
      OpCase c = matmul_case(std::string("cuda_mm_") + dtype_name(dt) + std::to_string(t), 17, 24, 40, t & 1,
                             t >> 1, 2, 1, t == 3, dt);
      // The reference sees the rounded inputs, and products of bf16 / f16 values are exact in f32: only the
      // order of the f32 accumulation differs. The gradients are f32 matmuls of f32 and bf16 / f16 operands.
      c.fwd_tol = 1e-11;
      c.grad_tol = 1e-8;
      EXPECT_TRUE(run_case(c, &cuda_backend())) << c.name;
    }
  OpCase mixed;
  mixed.name = "cuda_mm_mixed";
  mixed.inputs = {{Shape{6, 10}, DType::BF16}, {Shape{10, 5}, DType::F32}};
  mixed.build = [](Context& ctx, const std::vector<Tensor*>& in) { return matmul(ctx, in[0], in[1]); };
  mixed.reference = [](const std::vector<Ref>& in) { return ref_matmul(in[0], in[1], false, false); };
  mixed.fwd_tol = 1e-11;
  mixed.grad_tol = 1e-8;
  EXPECT_TRUE(run_case(mixed, &cuda_backend()));
}

TEST_F(CudaMatmul, FallbackKernelAndTf32MatchTheReference) {
  CudaOptions simple;
  simple.simple_gemm = true;
  auto fallback = make_cuda_backend(0, simple);
  CudaOptions tf32;
  tf32.allow_tf32 = true;
  auto fast = make_cuda_backend(0, tf32);
  for (int t = 0; t < 4; ++t) {
    OpCase c = matmul_case("cuda_mm_fallback" + std::to_string(t), 19, 23, 37, t & 1, t >> 1, 2, 2, t == 1);
    EXPECT_TRUE(run_case(c, fallback.get())) << c.name;
    OpCase f = matmul_case("cuda_mm_tf32" + std::to_string(t), 64, 48, 96, t & 1, t >> 1, 1, 1, false);
    f.fwd_tol = 1e-5;  // TF32 keeps 10 mantissa bits of each input (about 5e-4 relative per product)
    f.check_grad = false;
    EXPECT_TRUE(run_case(f, fast.get())) << f.name;
  }
}

TEST_F(CudaMatmul, LargeBatchedMatchesTheCpu) {
  for (int t = 0; t < 4; ++t)
    for (DType dt : {DType::F32, DType::BF16}) {
      CompareCase c;
      c.name = std::string("cuda_mm_large_") + dtype_name(dt) + std::to_string(t);
      const bool ta = t & 1, tb = t >> 1;
      c.inputs = {{operand_shape(2, 3, 96, 200, ta), dt}, {operand_shape(1, 3, 200, 130, tb), dt}};
      c.build = [ta, tb](Context& ctx, const std::vector<Tensor*>& in) {
        return matmul(ctx, in[0], in[1], ta, tb);
      };
      c.tol = 1e-11;       // both accumulate exact products in f32; only the order differs
      c.grad_tol = 1e-11;  // the gradients are f32 matmuls (and a reduce_to over B's broadcast batch)
      EXPECT_TRUE(compare_with_cpu(c));
    }
}

// Graph::backward hands a matmul the other addend of a gradient sum as its C, and a weight-gradient matmul writes
// into its accumulator in place: both GEMM paths (cuBLASLt with beta 1, and the fallback kernel that adds C
// after) must give the CPU's gradients, accumulate over two runs, and start again after zero_grad.
TEST_F(CudaMatmul, GradientMatmulsAddTheirAddendOnBothGemmPaths) {
  reseed("cuda_matmul_addend");
  const int64_t R = 37, I = 24, O = 19;
  auto floats = [](int64_t n) {
    const Vec v = random_vec(n);
    return std::vector<float>(v.begin(), v.end());
  };
  const std::vector<float> xv = floats(R * I), w1v = floats(O * I), w2v = floats(O * I), uv = floats(R * O),
                           vv = floats(R * O);
  // {dx, dw1, dw2} after one run, two runs, and a run after zero_grad.
  auto grads = [&](Backend& be) {
    Context ctx(be);
    auto param = [&](const Shape& s, const std::vector<float>& v, const char* name) {
      Tensor* p = ctx.param(DType::F32, s, name);
      set_data(p, v);
      return p;
    };
    Tensor* x = param({R, I}, xv, "x");
    Tensor* w1 = param({O, I}, w1v, "w1");
    Tensor* w2 = param({O, I}, w2v, "w2");
    Tensor* u = ctx.input(DType::F32, {R, O}, "u");
    Tensor* v = ctx.input(DType::F32, {R, O}, "v");
    set_data(u, uv);
    set_data(v, vv);
    Tensor* loss = add(ctx, sum(ctx, mul(ctx, matmul(ctx, x, w1, false, true), u)),
                       sum(ctx, mul(ctx, matmul(ctx, x, w2, false, true), v)));
    Graph g(ctx);
    g.backward(loss);
    int addends = 0;
    for (const Tensor* n : g.nodes()) addends += n->op == Op::Matmul && n->src[2] != nullptr;
    EXPECT_EQ(addends, 3);
    std::vector<std::vector<float>> out;
    auto read = [&] {
      for (const Tensor* p : {x, w1, w2}) out.push_back(get_data(g.grad(p)));
    };
    g.compute();
    read();
    g.compute();
    read();
    g.zero_grad();
    g.compute();
    read();
    return out;
  };
  const auto want = grads(default_cpu_backend());
  CudaOptions simple;
  simple.simple_gemm = true;
  auto fallback = make_cuda_backend(0, simple);
  for (Backend* be : {&cuda_backend(), fallback.get()}) {
    const auto got = grads(*be);
    ASSERT_EQ(got.size(), want.size());
    for (size_t t = 0; t < got.size(); ++t) {
      ASSERT_EQ(got[t].size(), want[t].size());
      for (size_t i = 0; i < got[t].size(); ++i)
        EXPECT_NEAR(got[t][i], want[t][i], 1e-4 * (1.0 + std::fabs(want[t][i])))
            << (be == fallback.get() ? "fallback" : "cuBLASLt") << " gradient " << t << " at " << i;
    }
  }
}

// matmul_add's case list (ops/matmul_add_cases.h) on both GEMM paths: cuBLASLt with beta 1, and the fallback
// kernel that adds C after.
TEST_F(CudaMatmul, MatmulAddCasesOnBothGemmPaths) {
  CudaOptions simple;
  simple.simple_gemm = true;
  auto fallback = make_cuda_backend(0, simple);
  for (Backend* be : {&cuda_backend(), fallback.get()})
    for (const OpCase& c : matmul_add_cases()) EXPECT_TRUE(run_case(c, be)) << c.name;
}

}  // namespace
}  // namespace retort::test
