// distill and entropy: bad input. Their values, gradients, options and edge cases are the case lists of
// tests/ops/loss_cases_distill.cpp and loss_cases_ce.cpp, run on every backend (test_loss_cases.cpp here).
#include <gtest/gtest.h>

#include "test_losses_ref.h"

namespace retort::test {
namespace {

TEST(Distill, BadInputThrows) {
  Context ctx(default_cpu_backend());
  Tensor* s = ctx.tensor(DType::F32, {4, 6}, "student");
  Tensor* t = ctx.tensor(DType::F32, {4, 6}, "teacher");
  Tensor* y = ctx.tensor(DType::I32, {4}, "labels");
  DistillOptions o;
  o.temperature = -0.5f;
  expect_error([&] { distill(ctx, s, t, y, o); }, {"distill", "temperature", "[4, 6]"});
  o = {};
  o.beta = 2;
  expect_error([&] { distill(ctx, s, t, y, o); }, {"distill", "beta", "[4, 6]"});
  o = {};
  o.divergence = Divergence::SkewKl;
  o.skew_alpha = 1.5f;
  expect_error([&] { distill(ctx, s, t, y, o); }, {"distill", "skew_alpha", "[0, 1]", "[4, 6]"});
  o = {};
  o.divergence = Divergence(7);
  expect_error([&] { distill(ctx, s, t, y, o); }, {"distill", "unknown divergence", "[4, 6]"});
  o = {};
  o.w_hard = 1;
  expect_error([&] { distill(ctx, s, t, nullptr, o); }, {"distill", "w_hard", "labels"});
  expect_error([&] { distill(ctx, s, ctx.tensor(DType::F32, {4, 7}), y); }, {"distill", "[4, 7]", "[4, 6]"});
  expect_error([&] { distill(ctx, s, ctx.tensor(DType::F32, {3, 6}), y); }, {"distill", "[3, 6]", "[4, 6]"});
  expect_error([&] { distill(ctx, s, t, ctx.tensor(DType::I32, {5})); }, {"distill", "labels", "[5]"});
  set_data_int(y, {0, -1, 6, 1});
  DistillOptions ig;
  ig.ignore_index = -1;
  Tensor* loss = distill(ctx, s, t, y, ig).loss;
  Graph g(ctx);
  g.forward(loss);
  expect_error([&] { g.compute(); }, {"distill", "label 6", "row 2", "[4, 6]"});

  // The teacher is a constant: a teacher parameter makes backward throw.
  Tensor* sp = ctx.param(DType::F32, {4, 6}, "sp");
  Tensor* tp = ctx.param(DType::F32, {4, 6}, "tp");
  Graph g2(ctx);
  expect_error([&] { g2.backward(distill(ctx, sp, tp, nullptr).loss); }, {"distill", "teacher", "constant"});
  // ... and so does one computed from a parameter.
  Graph g3(ctx);
  expect_error([&] { g3.backward(distill(ctx, sp, scale(ctx, sp, 2.0f), nullptr).loss); },
               {"distill", "teacher"});
}

// ---- entropy ------------------------------------------------------------------------------------------

TEST(Entropy, BadInputThrows) {
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.tensor(DType::F32, {4, 6});
  expect_error([&] { entropy(ctx, x, 0.0f); }, {"entropy", "temperature", "[4, 6]"});
  expect_error([&] { entropy(ctx, x, -1.0f); }, {"entropy", "temperature", "[4, 6]"});
  expect_error([&] { entropy(ctx, ctx.tensor(DType::F32, {2, 4, 6})); }, {"entropy", "[2, 4, 6]"});
  expect_error([&] { entropy(ctx, ctx.tensor(DType::I64, {4, 6})); }, {"entropy", "i64[4, 6]"});
}

}  // namespace
}  // namespace retort::test
