// topk_kd and topk_kl_gathered: bad input (shapes, dtypes, options, ids and labels out of range, a teacher
// that is a parameter). Their values, gradients, options and edge cases are the case lists of
// tests/ops/loss_cases_topk.cpp, run on every backend (test_loss_cases.cpp here).
#include <gtest/gtest.h>

#include "test_losses_ref.h"

namespace retort::test {
namespace {

// ---- bad input ----------------------------------------------------------------------------------------

TEST(TopKDistill, BadInputThrows) {
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.tensor(DType::F32, {4, 6}, "logits");
  Tensor* ids = ctx.tensor(DType::I32, {4, 3}, "ids");
  Tensor* lp = ctx.tensor(DType::F32, {4, 3}, "lp");
  Tensor* y = ctx.tensor(DType::I32, {4}, "labels");
  TopKDistillOptions o;
  auto call = [&](const TopKDistillOptions& opts) { topk_kd(ctx, x, ids, lp, nullptr, y, opts); };
  o.temperature = -1;
  expect_error([&] { call(o); }, {"topk_kd", "temperature", "-1", "[4, 6]"});
  o.temperature = 0;
  expect_error([&] { call(o); }, {"topk_kd", "temperature", "[4, 6]"});
  o = {};
  o.beta = -0.1f;
  expect_error([&] { call(o); }, {"topk_kd", "beta", "[4, 6]"});
  o.beta = 1.5f;
  expect_error([&] { call(o); }, {"topk_kd", "beta", "1.5", "[4, 6]"});
  o = {};
  o.divergence = Divergence::SkewReverseKl;
  o.skew_alpha = -0.2f;
  expect_error([&] { call(o); }, {"topk_kd", "skew_alpha", "-0.2", "[4, 6]"});
  o = {};
  o.w_soft = -1;
  expect_error([&] { call(o); }, {"topk_kd", "w_soft", "[4, 6]"});
  o = {};
  o.w_hard = 0.5f;
  expect_error([&] { topk_kd(ctx, x, ids, lp, nullptr, nullptr, o); },
               {"topk_kd", "w_hard", "labels", "[4, 6]"});
  Tensor* ids8 = ctx.tensor(DType::I32, {4, 8});
  expect_error(
      [&] {
        topk_kd(ctx, x, ids8, ctx.tensor(DType::F32, {4, 8}), nullptr, y);
      },
      {"topk_kd", "K = 8", "V = 6", "[4, 8]", "[4, 6]"});
  expect_error(
      [&] {
        topk_kd(ctx, x, ctx.tensor(DType::I32, {5, 3}), ctx.tensor(DType::F32, {5, 3}), nullptr, y);
      },
      {"topk_kd", "[5, 3]", "[4, 6]"});
  expect_error(
      [&] {
        topk_kd(ctx, x, ids, ctx.tensor(DType::F32, {4, 2}), nullptr, y);
      },
      {"topk_kd", "[4, 2]", "[4, 3]"});
  expect_error(
      [&] {
        topk_kd(ctx, x, ids, lp, ctx.tensor(DType::I32, {4, 2}), y);
      },
      {"topk_kd", "mask", "[4, 2]"});
  expect_error([&] { topk_kd(ctx, x, ids, lp, nullptr, ctx.tensor(DType::I32, {3})); },
               {"topk_kd", "labels", "[3]"});
  expect_error([&] { topk_kd(ctx, x, lp, lp, nullptr, y); }, {"topk_kd", "teacher_ids", "f32[4, 3]"});
  expect_error([&] { topk_kd(ctx, x, ids, ids, nullptr, y); }, {"topk_kd", "teacher_logprobs", "i32[4, 3]"});

  // Run time: an id out of range in a valid slot, and a label out of range.
  set_data(lp, std::vector<float>(12, -1.0f));
  set_data_int(ids, {0, 1, 2, 3, 4, 5, 0, 6, 1, 2, 2, 2});
  set_data_int(y, {0, 1, 2, 3});
  {
    Tensor* loss = topk_kd(ctx, x, ids, lp, nullptr, y).loss;
    Graph g(ctx);
    g.forward(loss);
    expect_error([&] { g.compute(); }, {"topk_kd", "teacher id 6", "row 2", "[4, 6]", "[4, 3]"});
    // The same id masked out is padding: no error.
    Tensor* mask = ctx.tensor(DType::I32, {4, 3});
    set_data_int(mask, {1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1});
    Tensor* ok = topk_kd(ctx, x, ids, lp, mask, y).loss;
    Graph g2(ctx);
    g2.forward(ok);
    EXPECT_NO_THROW(g2.compute());
    set_data_int(y, {0, 1, 2, 7});
    expect_error([&] { g2.compute(); }, {"topk_kd", "label 7", "row 3"});
  }

  // A teacher tensor that is a parameter: backward refuses to treat it as differentiable.
  Tensor* xp = ctx.param(DType::F32, {4, 6}, "student");
  Tensor* lpp = ctx.param(DType::F32, {4, 3}, "teacher_lp");
  Graph g(ctx);
  expect_error([&] { g.backward(topk_kd(ctx, xp, ids, lpp, nullptr, nullptr).loss); },
               {"topk_kd", "teacher_logprobs", "constant"});
}

TEST(TopKKLGathered, BadInputThrows) {
  Context ctx(default_cpu_backend());
  Tensor* s = ctx.tensor(DType::F32, {4, 3});
  Tensor* lp = ctx.tensor(DType::F32, {4, 3});
  TopKKLOptions o;
  o.temperature = -2;
  expect_error([&] { topk_kl_gathered(ctx, s, lp, nullptr, o); },
               {"topk_kl_gathered", "temperature", "[4, 3]"});
  expect_error(
      [&] {
        topk_kl_gathered(ctx, s, ctx.tensor(DType::F32, {4, 2}), nullptr);
      },
      {"topk_kl_gathered", "[4, 2]", "[4, 3]"});
  expect_error(
      [&] {
        topk_kl_gathered(ctx, s, lp, ctx.tensor(DType::F32, {3, 3}));
      },
      {"topk_kl_gathered", "[3, 3]"});
}

}  // namespace
}  // namespace retort::test
