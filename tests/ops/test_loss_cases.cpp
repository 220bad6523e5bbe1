// The row losses' case lists (tests/ops/loss_cases.h) on the CPU: each case against its float64 reference,
// its gradients against central differences, and, for the single-pass cases, the unit-seeded backward's
// structure. tests/cuda/test_cuda_loss_cases.cpp runs the same lists on CUDA.
#include <gtest/gtest.h>

#include "loss_cases.h"

namespace retort::test {
namespace {

class LossCases : public ::testing::TestWithParam<LossCase> {};

TEST_P(LossCases, MatchesFloat64Reference) {
  const LossCase& c = GetParam();
  if (c.single_pass)
    check_single_pass(c);  // runs the case unit-seeded as well
  else
    EXPECT_TRUE(run_loss_case(c));
}

std::string param_name(const ::testing::TestParamInfo<LossCase>& i) {
  return case_param_name(i.param);
}

INSTANTIATE_TEST_SUITE_P(CrossEntropy, LossCases, ::testing::ValuesIn(cross_entropy_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(Entropy, LossCases, ::testing::ValuesIn(entropy_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(SelectiveLogSoftmax, LossCases, ::testing::ValuesIn(selective_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(TopKKd, LossCases, ::testing::ValuesIn(topk_kd_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(TopKKlGathered, LossCases, ::testing::ValuesIn(topk_gathered_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(Distill, LossCases, ::testing::ValuesIn(distill_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(FusedCrossEntropy, LossCases, ::testing::ValuesIn(fused_ce_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(FusedTopKKd, LossCases, ::testing::ValuesIn(fused_topk_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(FusedDistill, LossCases, ::testing::ValuesIn(fused_distill_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(FusedEntropy, LossCases, ::testing::ValuesIn(fused_entropy_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(FusedSelectiveLogSoftmax, LossCases, ::testing::ValuesIn(fused_selective_cases()),
                         param_name);

}  // namespace
}  // namespace retort::test
