// CUDA against the CPU backend on random shapes, in f32, bf16 and f16, with contiguous and strided inputs:
// outputs and gradients compared by normalized MSE. Tolerances (next to each use):
//   f32:  1e-10 — the same f32 math; only the order of sums (CPU: double, CUDA: f32 trees) and 1-2 ulp of
//         expf / tanhf differ.
//   f16:  1e-6  — outputs are rounded to f16 (2^-11 relative); an ulp flip where the f32 results straddle a
//         rounding boundary costs at most (2^-11)^2 = 2.4e-7 per flipped element.
//   bf16: 5e-5  — the same with 2^-8: (2^-8)^2 = 1.5e-5 per flipped element.
#include <gtest/gtest.h>

#include <random>

#include "cuda_test_util.h"

namespace retort::test {
namespace {

class CudaVsCpu : public CudaTest {};

double tol_for(DType dt) {
  return dt == DType::F32 ? 1e-10 : dt == DType::F16 ? 1e-6 : 5e-5;
}

// Random shapes of 1 to 4 dims (outermost first); the innermost runs up to max_inner.
std::vector<Shape> random_shapes(const std::string& key, int count, int64_t max_inner) {
  std::mt19937_64 gen(std::hash<std::string>{}(key));
  std::vector<Shape> out;
  for (int i = 0; i < count; ++i) {
    const int dims = 1 + int(gen() % 4);
    Shape s;
    for (int d = 0; d < dims - 1; ++d) s.push_back(1 + int64_t(gen() % 4));
    s.push_back(1 + int64_t(gen() % uint64_t(max_inner)));
    out.push_back(s);
  }
  return out;
}

// When strided, the op reads x through a transposed view: the input is created with dims 0 and 1 swapped.
Shape stored_shape(Shape s, bool strided) {
  if (strided && s.size() >= 2) std::swap(s[s.size() - 1], s[s.size() - 2]);
  return s;
}
Tensor* view_of(Context& ctx, Tensor* x, bool strided) {
  return strided && x->n_dims() >= 2 ? transpose(ctx, x) : x;
}

const DType kFloatTypes[] = {DType::F32, DType::BF16, DType::F16};

TEST_F(CudaVsCpu, UnaryAndBinaryOps) {
  using U = Tensor* (*)(Context&, Tensor*);
  const std::pair<const char*, U> unary[] = {{"neg", neg},   {"exp", exp},   {"tanh", tanh}, {"relu", relu},
                                             {"gelu", gelu}, {"silu", silu}, {"sqrt", sqrt}, {"log", log}};
  using B = Tensor* (*)(Context&, Tensor*, Tensor*);
  const std::pair<const char*, B> binary[] = {{"add", add}, {"sub", sub}, {"mul", mul}, {"div", div}};
  int k = 0;
  for (DType dt : kFloatTypes)
    for (bool strided : {false, true})
      for (const Shape& s : random_shapes("unary", 4, 300)) {
        for (auto& [name, op] : unary) {
          CompareCase c;
          c.name = std::string("cmp_") + name + std::to_string(k++);
          const bool positive = std::string(name) == "sqrt" || std::string(name) == "log";
          c.inputs = {{stored_shape(s, strided), dt, true, positive ? 0.1 : -2.0, 2.0}};
          auto f = op;
          c.build = [f, strided](Context& ctx, const std::vector<Tensor*>& in) {
            return f(ctx, view_of(ctx, in[0], strided));
          };
          c.tol = c.grad_tol = tol_for(dt);
          EXPECT_TRUE(compare_with_cpu(c)) << name << " " << dtype_name(dt);
        }
        for (auto& [name, op] : binary) {
          CompareCase c;
          c.name = std::string("cmp_") + name + std::to_string(k++);
          Shape bs = s;  // broadcast: every other dim of b becomes 1
          for (size_t d = 0; d < bs.size(); d += 2) bs[d] = 1;
          c.inputs = {{stored_shape(s, strided), dt, true, -2, 2}, {bs, DType::F32, true, 0.5, 2}};
          auto f = op;
          c.build = [f, strided](Context& ctx, const std::vector<Tensor*>& in) {
            return f(ctx, view_of(ctx, in[0], strided), in[1]);
          };
          c.tol = c.grad_tol = tol_for(dt);
          EXPECT_TRUE(compare_with_cpu(c)) << name << " " << dtype_name(dt);
        }
      }
}

TEST_F(CudaVsCpu, ReductionsSoftmaxAndNorms) {
  using U = Tensor* (*)(Context&, Tensor*);
  const std::pair<const char*, U> ops[] = {
      {"sum_rows", sum_rows},
      {"mean_rows", mean_rows},
      {"max_rows", max_rows},
      {"sum", sum},
      {"mean", mean},
      {"max", max},
      {"softmax", softmax},
      {"log_softmax", log_softmax},
      {"causal", [](Context& ctx, Tensor* x) { return causal_softmax(ctx, x, 0.5f, 1); }},
      {"rms_norm", [](Context& ctx, Tensor* x) { return rms_norm(ctx, x, 1e-5f); }},
      {"layer_norm", [](Context& ctx, Tensor* x) { return layer_norm(ctx, x, 1e-5f); }},
  };
  int k = 0;
  for (DType dt : kFloatTypes)
    for (bool strided : {false, true})
      for (const Shape& s : random_shapes("rows", 3, 3000)) {
        for (auto& [name, op] : ops) {
          CompareCase c;
          c.name = std::string("cmp_") + name + std::to_string(k++);
          c.inputs = {{stored_shape(s, strided), dt, true, -3, 3}};
          auto f = op;
          c.build = [f, strided](Context& ctx, const std::vector<Tensor*>& in) {
            return f(ctx, view_of(ctx, in[0], strided));
          };
          // Reductions give f32 outputs whatever the input; the softmax family and norms store in dt.
          c.tol = c.grad_tol = tol_for(dt);
          EXPECT_TRUE(compare_with_cpu(c)) << name << " " << dtype_name(dt) << (strided ? " strided" : "");
        }
      }
}

TEST_F(CudaVsCpu, IndexingRopeCrossEntropyAndStructure) {
  int k = 0;
  for (DType dt : kFloatTypes) {
    const double tol = tol_for(dt);
    {  // embedding lookup with repeated ids (its gradient is the deterministic scatter)
      CompareCase c;
      c.name = "cmp_get_rows" + std::to_string(k++);
      c.inputs = {{Shape{50, 70}, dt}, {Shape{3, 40}, DType::I64, false, 0, 50}};
      c.build = [](Context& ctx, const std::vector<Tensor*>& in) { return get_rows(ctx, in[0], in[1]); };
      c.tol = c.grad_tol = tol;
      EXPECT_TRUE(compare_with_cpu(c));
    }
    for (RopeMode mode : {RopeMode::Normal, RopeMode::Neox}) {
      CompareCase c;
      c.name = "cmp_rope" + std::to_string(k++);
      c.inputs = {{Shape{2, 9, 4, 64}, dt}, {Shape{9}, DType::I32, false, 0, 4096}};
      c.build = [mode](Context& ctx, const std::vector<Tensor*>& in) {
        return rope(ctx, in[0], in[1], mode, 10000.0f);
      };
      c.tol = c.grad_tol = tol;
      EXPECT_TRUE(compare_with_cpu(c));
    }
    {  // cross-entropy over a vocabulary that is not a multiple of any block size, through a strided view
      CompareCase c;
      c.name = "cmp_ce" + std::to_string(k++);
      c.inputs = {{Shape{2, 7, 1013}, dt, true, -6, 6}, {Shape{2, 7}, DType::I32, false, 0, 1001}};
      c.build = [](Context& ctx, const std::vector<Tensor*>& in) {
        return cross_entropy(ctx, slice(ctx, in[0], 0, 0, 1001), in[1], 17);
      };
      c.tol = 1e-10;  // the loss is f32 whatever the logits' dtype
      c.grad_tol = 1e-10;
      EXPECT_TRUE(compare_with_cpu(c));
    }
    {  // concat along each dim, cast, and a permuted contiguous copy
      for (int dim = 0; dim < 3; ++dim) {
        CompareCase c;
        c.name = "cmp_concat" + std::to_string(k++);
        c.inputs = {{Shape{3, 4, 5}, dt}, {Shape{3, 4, 5}, dt}};
        c.build = [dim](Context& ctx, const std::vector<Tensor*>& in) {
          return cast(ctx, concat(ctx, in[0], in[1], dim), DType::F32);
        };
        c.tol = c.grad_tol = 0;  // pure copies: bit-exact
        EXPECT_TRUE(compare_with_cpu(c));
      }
      CompareCase c;
      c.name = "cmp_permute" + std::to_string(k++);
      c.inputs = {{Shape{2, 3, 4, 5}, dt}};
      c.build = [](Context& ctx, const std::vector<Tensor*>& in) {
        return contiguous(ctx, permute(ctx, in[0], 3, 1, 0, 2));
      };
      c.tol = c.grad_tol = 0;
      EXPECT_TRUE(compare_with_cpu(c));
    }
  }
}

}  // namespace
}  // namespace retort::test
