// fused_linear_topk_logprobs on the CPU: every case of topk_head_cases.h against the float64 reference
// (1e-5 relative: the f32 GEMM's rounding of logits of up to ~1e4, a few ulps) and against the unfused
// composition matmul + topk_logprobs + cross_entropy_loss(Sum) on the same backend (exactly the same ids and
// log-probs where the logits are exact integers, whatever the summation order; elsewhere within 1e-6 of the
// logits' size with near ties free to break either way). Also: results independent of the chunk size up to
// f32 rounding, bad shapes,
// dtypes and K throwing at build time with the op and the shapes, bad targets and NaN at run time, and
// backward through the op refused.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "topk_head_cases.h"
#include "expect_error.h"

namespace retort::test {
namespace {

class FusedTopKHead : public ::testing::TestWithParam<HeadCase> {};

TEST_P(FusedTopKHead, MatchesFloat64Reference) {
  const HeadCase& c = GetParam();
  const HeadInput in = make_head_input(c);
  expect_matches_reference(c, run_head(default_cpu_backend(), c, in), head_reference(c, in), 1e-5,
                           c.fill == HeadFill::Integers);
}

TEST_P(FusedTopKHead, MatchesTopKLogprobsAndCrossEntropy) {
  const HeadCase& c = GetParam();
  const HeadInput in = make_head_input(c);
  const HeadResult fused = run_head(default_cpu_backend(), c, in);
  const HeadResult unfused = run_unfused(default_cpu_backend(), c, in);
  if (c.fill == HeadFill::Integers) {
    // Exact logits: the same selection on the same values gives the same bits.
    EXPECT_EQ(fused.ids, unfused.ids);
    EXPECT_EQ(fused.logprobs, unfused.logprobs);
  }
  expect_close(c, fused, unfused, 1e-6);
}

INSTANTIATE_TEST_SUITE_P(Cases, FusedTopKHead, ::testing::ValuesIn(head_cases()),
                         [](const ::testing::TestParamInfo<HeadCase>& i) { return i.param.name; });

TEST(FusedTopKHeadOps, ResultsDoNotDependOnTheChunkSize) {
  HeadCase c = head_cases()[4];  // v1003_chunks3
  const HeadInput in = make_head_input(c);
  c.chunk_rows = c.n;
  const HeadResult whole = run_head(default_cpu_backend(), c, in);
  for (int64_t rows : {1, 5, 16}) {
    c.chunk_rows = rows;
    SCOPED_TRACE(rows);
    // The GEMM's blocking follows the chunk's rows, so a logit may differ in its last bit.
    expect_close(c, run_head(default_cpu_backend(), c, in), whole, 1e-6);
  }
}

std::string build_error(DType hd, Shape hs, DType wd, Shape ws, int64_t k, DType td, Shape ts) {
  Context ctx(default_cpu_backend());
  Tensor* h = ctx.input(hd, hs, "hidden");
  Tensor* w = ctx.input(wd, ws, "weight");
  Tensor* t = ts.empty() ? nullptr : ctx.input(td, ts, "targets");
  return error_of([&] { (void)fused_linear_topk_logprobs(ctx, h, w, k, t); });
}

TEST(FusedTopKHeadOps, BadInputsThrowNamingTheOpAndShapes) {
  const DType f32 = DType::F32, i32 = DType::I32;
  struct Bad {
    std::string msg;
    std::string want;
  };
  const Bad bad[] = {
      {build_error(f32, {4, 8}, f32, {10, 8}, 11, i32, {4}), "K = 11 must be in [1, V] with V = 10"},
      {build_error(f32, {4, 8}, f32, {10, 8}, 0, i32, {4}), "K = 0 must be in [1, V]"},
      {build_error(f32, {4, 8}, f32, {10, 7}, 3, i32, {4}), "must be [V, H] with H = 8"},
      {build_error(f32, {2, 4, 8}, f32, {10, 8}, 3, i32, {8}), "hidden must be 2-D"},
      {build_error(i32, {4, 8}, f32, {10, 8}, 3, i32, {4}), "hidden must be f32, bf16 or f16"},
      {build_error(f32, {4, 8}, DType::I64, {10, 8}, 3, i32, {4}), "weight must be f32, bf16 or f16"},
      {build_error(f32, {4, 8}, f32, {10, 8}, 3, i32, {5}), "i32[5] must be [N] with N = 4"},
      {build_error(f32, {4, 8}, f32, {10, 8}, 3, f32, {4}), "targets must be i32 or i64"},
  };
  for (const Bad& b : bad) {
    EXPECT_NE(b.msg.find("fused_linear_topk_logprobs"), std::string::npos) << b.msg;
    EXPECT_NE(b.msg.find(b.want), std::string::npos) << b.msg;
  }
}

TEST(FusedTopKHeadOps, RunTimeErrorsNameTheOpAndTheRow) {
  for (int kind = 0; kind < 2; ++kind) {
    Context ctx(default_cpu_backend());
    Tensor* h = ctx.input(DType::F32, {4, 8}, "hidden");
    Tensor* w = ctx.input(DType::F32, {10, 8}, "weight");
    Tensor* t = ctx.input(DType::I32, {4}, "targets");
    std::vector<float> hv(32, 0.25f), wv(80, 0.5f);
    std::vector<int64_t> tv = {1, -100, 3, 9};
    if (kind == 0) {
      tv[2] = 10;  // outside [0, V)
    } else {
      hv[2 * 8 + 5] = std::numeric_limits<float>::quiet_NaN();
    }
    set_data(h, hv);
    set_data(w, wv);
    set_data_int(t, tv);
    const TopKLogprobsOutputs o = fused_linear_topk_logprobs(ctx, h, w, 3, t);
    Graph g(ctx);
    g.forward(o.logprobs);
    const std::string msg = error_of([&] { g.compute(); });
    EXPECT_NE(msg.find("fused_linear_topk_logprobs"), std::string::npos) << msg;
    EXPECT_NE(msg.find(kind == 0 ? "target 10 at row 2 is outside [0, 10)" : "row 2"), std::string::npos)
        << msg;
    if (kind == 1) {
      EXPECT_NE(msg.find("NaN"), std::string::npos) << msg;
    }
  }
}

TEST(FusedTopKHeadOps, BackwardThroughItThrows) {
  for (int out = 0; out < 3; ++out) {
    Context ctx(default_cpu_backend());
    Tensor* h = ctx.param(DType::F32, {4, 8}, "hidden");
    Tensor* w = ctx.input(DType::F32, {10, 8}, "weight");
    Tensor* t = ctx.input(DType::I32, {4}, "targets");
    TopKLogprobsOptions opts;
    opts.return_lse = true;
    const TopKLogprobsOutputs o = fused_linear_topk_logprobs(ctx, h, w, 3, t, opts);
    Tensor* y = out == 0 ? sum(ctx, o.logprobs) : out == 1 ? o.nll_sum : sum(ctx, o.lse);
    Graph g(ctx);
    g.forward(y);
    const std::string msg = error_of([&] { g.backward(y); });
    EXPECT_NE(msg.find("fused_linear_topk_logprobs"), std::string::npos) << out << ": " << msg;
    EXPECT_NE(msg.find("no gradient"), std::string::npos) << out << ": " << msg;
  }
}

}  // namespace
}  // namespace retort::test
