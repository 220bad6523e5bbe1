// The distillation losses on CUDA beyond their case lists (topk_kd, topk_kl_gathered and distill run the
// CPU's lists in test_cuda_loss_cases.cpp): more top-K slots than the kernel keeps is a clear error. Without
// a usable device every test skips with the reason.
#include <gtest/gtest.h>

#include <string>

#include "cuda/loss/distill_rows.h"  // kMaxTopKSlots (a host-only header)
#include "cuda_loss_check.h"

namespace retort::test {
namespace {

class CudaDistill : public CudaTest {};

TEST_F(CudaDistill, TopKTooManySlotsThrows) {
  Context ctx(cuda_backend());
  // One slot more than the kernel keeps in shared memory: a clear error naming the op and K, not a bad
  // launch.
  const int64_t k = cuda::kMaxTopKSlots + 1;
  Tensor* x = ctx.input(DType::F32, {2, k + 5}, "logits");
  Tensor* ids = ctx.input(DType::I32, {2, k}, "ids");
  Tensor* lp = ctx.input(DType::F32, {2, k}, "lp");
  set_data(x, std::vector<float>(size_t(2 * (k + 5)), 0.0f));
  std::vector<int64_t> idv(size_t(2 * k));
  for (size_t i = 0; i < idv.size(); ++i) idv[i] = int64_t(i) % k;
  set_data_int(ids, idv);
  set_data(lp, std::vector<float>(size_t(2 * k), -9.0f));
  Tensor* loss = topk_kd(ctx, x, ids, lp, nullptr, nullptr).loss;
  Graph g(ctx);
  g.forward(loss);
  const std::string msg = error_of([&] { g.compute(); });
  EXPECT_NE(msg.find("topk_kd"), std::string::npos) << msg;
  EXPECT_NE(msg.find("K = " + std::to_string(k)), std::string::npos) << msg;
}

}  // namespace
}  // namespace retort::test
