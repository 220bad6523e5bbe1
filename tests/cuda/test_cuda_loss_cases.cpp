// The row losses' case lists (tests/ops/loss_cases.h), the CPU's own, on CUDA: each case against the CPU
// backend (at the case's backend_tol) and against the float64 reference, its gradients against central
// differences (cuda_loss_check.h). A case the CUDA backend does not support skips with its reason; without a
// usable device every test skips with the reason.
#include <gtest/gtest.h>

#include <string>

#include "cuda_loss_check.h"
#include "loss_cases.h"

namespace retort::test {
namespace {

class CudaLossCases : public CudaTest, public ::testing::WithParamInterface<LossCase> {};

TEST_P(CudaLossCases, MatchesCpuAndFloat64Reference) {
  const LossCase& c = GetParam();
  if (!c.cuda_unsupported.empty()) GTEST_SKIP() << "not supported on CUDA: " << c.cuda_unsupported;
  EXPECT_TRUE(check_cuda(c));
}

std::string param_name(const ::testing::TestParamInfo<LossCase>& i) {
  return case_param_name(i.param);
}

INSTANTIATE_TEST_SUITE_P(CrossEntropy, CudaLossCases, ::testing::ValuesIn(cross_entropy_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(Entropy, CudaLossCases, ::testing::ValuesIn(entropy_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(SelectiveLogSoftmax, CudaLossCases, ::testing::ValuesIn(selective_cases()),
                         param_name);
INSTANTIATE_TEST_SUITE_P(TopKKd, CudaLossCases, ::testing::ValuesIn(topk_kd_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(TopKKlGathered, CudaLossCases, ::testing::ValuesIn(topk_gathered_cases()),
                         param_name);
INSTANTIATE_TEST_SUITE_P(Distill, CudaLossCases, ::testing::ValuesIn(distill_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(FusedCrossEntropy, CudaLossCases, ::testing::ValuesIn(fused_ce_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(FusedTopKKd, CudaLossCases, ::testing::ValuesIn(fused_topk_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(FusedDistill, CudaLossCases, ::testing::ValuesIn(fused_distill_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(FusedEntropy, CudaLossCases, ::testing::ValuesIn(fused_entropy_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(FusedSelectiveLogSoftmax, CudaLossCases,
                         ::testing::ValuesIn(fused_selective_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(FusedLeafSeeded, CudaLossCases, ::testing::ValuesIn(fused_leaf_seeded_cases()),
                         param_name);

class CudaLossOrder : public CudaTest {};

// The cluster kernel's shared memory limit is a property of the kernel: rows of 50,304 bf16 values take
// 2 × 100.6 KB on Hopper, rows of 128,256 (three segments) 85.5 KB. A launch with a size used before must
// still be allowed after a launch with a smaller one (once refused with "invalid argument", H100, session
// 16): the list's cases in an order a list cannot state.
TEST_F(CudaLossOrder, CrossEntropyVocabulariesAlternate) {
  const std::vector<LossCase> cs = cross_entropy_cases();
  for (const char* name : {"ce_vocab50304_bf16", "ce_vocab128256_bf16", "ce_vocab50304_bf16",
                           "ce_vocab128256_bf16", "ce_vocab60000_f32"}) {
    const LossCase& c = case_named(cs, name);
    EXPECT_TRUE(check_cuda(c, false));
  }
}

}  // namespace
}  // namespace retort::test
