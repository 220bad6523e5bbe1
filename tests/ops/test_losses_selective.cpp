// selective_log_softmax: shapes, dtypes and ids out of range. Its values and fused backward (repeated ids,
// K > V, strided views, dtypes, as part of a loss) are the case list of tests/ops/loss_cases_ce.cpp, run on
// every backend (test_loss_cases.cpp here).
#include <gtest/gtest.h>

#include "test_losses_ref.h"

namespace retort::test {
namespace {

TEST(SelectiveLogSoftmax, BadInputThrows) {
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.tensor(DType::F32, {4, 6}, "logits");
  Tensor* ids = ctx.tensor(DType::I32, {4, 2}, "ids");
  expect_error(
      [&] {
        selective_log_softmax(ctx, x, ctx.tensor(DType::I32, {3, 2}));
      },
      {"selective_log_softmax", "[3, 2]", "[4, 6]"});
  expect_error(
      [&] {
        selective_log_softmax(ctx, x, ctx.tensor(DType::F32, {4, 2}));
      },
      {"selective_log_softmax", "ids", "f32[4, 2]"});
  for (int64_t bad : {6, -1}) {
    set_data_int(ids, {0, 1, 2, 3, bad, 5, 0, 0});
    Tensor* out = selective_log_softmax(ctx, x, ids);
    Graph g(ctx);
    g.forward(out);
    expect_error([&] { g.compute(); },
                 {"selective_log_softmax", "id " + std::to_string(bad), "row 2", "[4, 6]"});
  }
}

}  // namespace
}  // namespace retort::test
