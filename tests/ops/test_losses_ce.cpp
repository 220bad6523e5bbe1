// cross_entropy_loss: bad input. Its values, gradients, options, dtypes, views and edge cases are the case
// list of tests/ops/loss_cases_ce.cpp, run on every backend (test_loss_cases.cpp here).
#include <gtest/gtest.h>

#include "test_losses_ref.h"

namespace retort::test {
namespace {

TEST(CrossEntropyLoss, BadInputThrows) {
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.tensor(DType::F32, {4, 6}, "logits");
  Tensor* y = ctx.tensor(DType::I32, {4}, "labels");
  expect_error([&] { cross_entropy_loss(ctx, x, ctx.tensor(DType::I32, {5})); },
               {"cross_entropy_loss", "[5]", "[4, 6]"});
  expect_error([&] { cross_entropy_loss(ctx, x, ctx.tensor(DType::F32, {4})); },
               {"cross_entropy_loss", "labels"});
  expect_error(
      [&] {
        cross_entropy_loss(ctx, ctx.tensor(DType::F32, {2, 4, 6}), y);
      },
      {"cross_entropy_loss", "[2, 4, 6]"});
  expect_error(
      [&] {
        cross_entropy_loss(ctx, ctx.tensor(DType::I32, {4, 6}), y);
      },
      {"cross_entropy_loss", "i32[4, 6]"});
  CrossEntropyOptions o;
  o.label_smoothing = 1.5f;
  expect_error([&] { cross_entropy_loss(ctx, x, y, o); },
               {"cross_entropy_loss", "label_smoothing", "[4, 6]"});
  o = {};
  o.softcap = -1;
  expect_error([&] { cross_entropy_loss(ctx, x, y, o); }, {"cross_entropy_loss", "softcap", "[4, 6]"});
  o = {};
  o.z_loss = -1;
  expect_error([&] { cross_entropy_loss(ctx, x, y, o); }, {"cross_entropy_loss", "z_loss", "[4, 6]"});

  // Labels out of range throw when the graph runs, naming the op, the shapes and the label.
  for (int64_t bad : {6, -1, -101}) {
    set_data_int(y, {0, 1, bad, -100});
    Tensor* loss = cross_entropy_loss(ctx, x, y).loss;
    Graph g(ctx);
    g.forward(loss);
    expect_error([&] { g.compute(); },
                 {"cross_entropy_loss", "[4, 6]", "label " + std::to_string(bad), "row 2"});
  }
}

}  // namespace
}  // namespace retort::test
