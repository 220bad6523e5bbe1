// topk_logprobs on CUDA against the CPU backend, on every case of tests/ops/topk_cases.h (the list the CPU
// test checks against float64): the ids exactly equal — both select on the same stored values, larger value
// first and equal values by smaller id — and the logprobs within 1e-5 + 2^-21·|lp| (four f32 ulps of the
// result beyond a fixed 1e-5: CUDA sums exp2 terms (2 ulp each) in f32, per thread and then in a tree, and
// rounds x − max and the log separately; the CPU sums in double and rounds once; the sums differ by about
// 1e-6 relative at V = 151,936). Also a batch of many rows, NaN / +inf reported at the synchronize, K above
// the kernel's limit. Without a usable device every test skips with the reason.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "cuda_test_util.h"
#include "topk_cases.h"

namespace retort::test {
namespace {

class CudaTopK : public CudaTest, public ::testing::WithParamInterface<TopKCase> {};
class CudaTopKOps : public CudaTest {};

void expect_same(const TopKCase& c, const TopKResult& gpu, const TopKResult& cpu) {
  ASSERT_EQ(gpu.ids.size(), cpu.ids.size());
  ASSERT_EQ(gpu.logprobs.size(), cpu.logprobs.size());
  int bad_ids = 0, bad_lp = 0;
  double worst = 0;
  for (size_t i = 0; i < cpu.ids.size(); ++i) {
    if (gpu.ids[i] != cpu.ids[i] && bad_ids++ < 5)
      ADD_FAILURE() << "row " << i / size_t(c.k) << " slot " << i % size_t(c.k) << ": id " << gpu.ids[i]
                    << ", the CPU's " << cpu.ids[i];
    const double w = cpu.logprobs[i], g = gpu.logprobs[i];
    const double tol = 1e-5 + std::ldexp(std::abs(w), -21);
    const bool ok = std::isinf(w) ? g == w : std::abs(g - w) <= tol;
    if (std::isfinite(w) && std::isfinite(g)) worst = std::max(worst, std::abs(g - w));
    if (!ok && bad_lp++ < 5)
      ADD_FAILURE() << "row " << i / size_t(c.k) << " slot " << i % size_t(c.k) << ": logprob " << g
                    << ", the CPU's " << w << " (tolerance " << tol << ")";
  }
  EXPECT_EQ(bad_ids, 0);
  EXPECT_EQ(bad_lp, 0);
  ::testing::Test::RecordProperty("max_abs_logprob_diff", std::to_string(worst));
}

TEST_P(CudaTopK, MatchesCpu) {
  const TopKCase& c = GetParam();
  expect_same(c, run_topk(cuda_backend(), c), run_topk(default_cpu_backend(), c));
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaTopK, ::testing::ValuesIn(topk_cases()),
                         [](const ::testing::TestParamInfo<TopKCase>& i) { return i.param.name; });

TEST_F(CudaTopKOps, ManyRows) {
  // Enough rows for several blocks per SM, teacher-cache's shape of work at small scale.
  for (DType dt : {DType::BF16, DType::F32}) {
    TopKCase c{std::string("many_rows_") + dtype_name(dt),
               600,
               49152,
               64,
               dt,
               TopKFill::Normal,
               TopKLayout::Contiguous};
    SCOPED_TRACE(c.name);
    expect_same(c, run_topk(cuda_backend(), c), run_topk(default_cpu_backend(), c));
  }
}

TEST_F(CudaTopKOps, NanAndPlusInfAreReportedAtTheSynchronize) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (DType dt : {DType::F32, DType::BF16, DType::F16})
    for (float bad : {nan, -nan, inf}) {
      Context ctx(cuda_backend());
      Tensor* x = ctx.input(dt, {4, 5000}, "logits");
      std::vector<float> v(4 * 5000, 0.5f);
      v[1 * 5000 + 7] = -inf;  // fine
      v[2 * 5000 + 4321] = bad;
      set_data(x, v);
      const TopKLogprobs o = topk_logprobs(ctx, x, 8);
      Graph g(ctx);
      g.forward(o.logprobs);
      const std::string msg = error_of([&] {
        g.compute();
        cuda_backend().synchronize();
      });
      EXPECT_NE(msg.find("topk_logprobs"), std::string::npos) << msg;
      EXPECT_NE(msg.find("row 2"), std::string::npos) << msg;
      EXPECT_NE(msg.find("NaN or +inf"), std::string::npos) << msg;
    }
  // The record was cleared: the backend runs the next graph without a stale error.
  const TopKCase ok{"after_error", 3, 300, 5};
  expect_same(ok, run_topk(cuda_backend(), ok), run_topk(default_cpu_backend(), ok));
}

TEST_F(CudaTopKOps, KAboveTheKernelLimitThrows) {
  Context ctx(cuda_backend());
  Tensor* x = ctx.input(DType::F32, {2, 5000}, "logits");
  const TopKLogprobs o = topk_logprobs(ctx, x, 2049);
  Graph g(ctx);
  g.forward(o.logprobs);
  const std::string msg = error_of([&] { g.compute(); });
  EXPECT_NE(msg.find("K = 2049"), std::string::npos) << msg;
  EXPECT_NE(msg.find("2048"), std::string::npos) << msg;
}

}  // namespace
}  // namespace retort::test
