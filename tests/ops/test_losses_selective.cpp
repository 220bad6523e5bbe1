// selective_log_softmax: values against float64, the fused backward against central differences (including
// repeated ids, K > V and strided upstream gradients), storage dtypes, views, and ids out of range.
#include <gtest/gtest.h>

#include "test_losses_ref.h"

namespace retort::test {
namespace {

OpCase selective_case(const std::string& name, int64_t n, int64_t v, int64_t k, DType dt = DType::F32,
                      double lo = -3, double hi = 3) {
  OpCase c;
  c.name = name;
  c.inputs = {{Shape{n, v}, dt, true, lo, hi}, {Shape{n, k}, DType::I32, false, 0, double(v)}};
  c.build = [](Context& ctx, const std::vector<Tensor*>& in) {
    return selective_log_softmax(ctx, in[0], in[1]);
  };
  c.reference = [k](const std::vector<Ref>& in) { return selective_ref(mat(in[0]), ints(in[1]), k); };
  return c;
}

TEST(SelectiveLogSoftmax, MatchesReference) {
  EXPECT_TRUE(run_case(selective_case("sel_basic", 5, 9, 3)));
  EXPECT_TRUE(run_case(selective_case("sel_k1", 4, 7, 1)));
  EXPECT_TRUE(run_case(selective_case("sel_k_gt_v", 3, 4, 9)));  // ids repeat: the scatter adds them
  for (int64_t v = 1; v <= 7; ++v)
    EXPECT_TRUE(run_case(selective_case("sel_v" + std::to_string(v), 3, v, 2)));
  EXPECT_TRUE(run_case(selective_case("sel_v1000", 2, 1000, 5)));
  for (DType dt : {DType::BF16, DType::F16})
    EXPECT_TRUE(run_case(selective_case(std::string("sel_") + dtype_name(dt), 4, 10, 3, dt)));
  OpCase huge = selective_case("sel_huge", 3, 8, 4, DType::F32, -1e4, 1e4);
  huge.fwd_tol = 1e-9;
  huge.grad_tol = 1e-5;  // the backward's exp(z − lse) with |z| ~ 1e4 carries lse's f32 rounding
  EXPECT_TRUE(run_case(huge));
}

TEST(SelectiveLogSoftmax, StridedLogitsAndIds) {
  OpCase c;
  c.name = "sel_strided";
  c.inputs = {{Shape{9, 5}, DType::F32, true, -3, 3}, {Shape{6, 5}, DType::I64, false, 0, 9}};
  // Logits through a transposed view [5, 9], ids as a column window [5, 2] of a [5, 6] tensor... built from a
  // transposed [6, 5] so its rows are strided as well.
  c.build = [](Context& ctx, const std::vector<Tensor*>& in) {
    Tensor* ids = slice(ctx, transpose(ctx, in[1]), 0, 1, 2);  // [5, 2]
    return selective_log_softmax(ctx, transpose(ctx, in[0]), ids);
  };
  c.reference = [](const std::vector<Ref>& in) {
    Mat z = mat_t(in[0]);
    Mat idt = mat_t(in[1]);  // [5, 6]
    std::vector<int64_t> ids;
    for (int64_t r = 0; r < 5; ++r)
      for (int64_t k = 1; k < 3; ++k) ids.push_back(int64_t(idt.at(r, k)));
    return selective_ref(z, ids, 2);
  };
  EXPECT_TRUE(run_case(c));
}

TEST(SelectiveLogSoftmax, UsedTwiceAndAsPartOfALoss) {
  // Two consumers of the same output: the graph sums their gradients before the fused backward runs once.
  LossCase c;
  c.name = "sel_policy_loss";
  c.inputs = {LossInput({4, 8}, DType::F32, true, -2, 2), LossInput({4, 3}, DType::I32, false, 0, 8)};
  c.build = [](Context& ctx, const std::vector<Tensor*>& in) {
    Tensor* lp = selective_log_softmax(ctx, in[0], in[1]);
    return add(ctx, sum(ctx, mul(ctx, lp, lp)), scale(ctx, sum(ctx, lp), -0.5f));
  };
  c.reference = [](const std::vector<Ref>& in) {
    Vec lp = selective_ref(mat(in[0]), ints(in[1]), 3);
    double s = 0;
    for (double x : lp) s += x * x - 0.5 * x;
    return Vec{s};
  };
  c.unit_seed = true;
  EXPECT_TRUE(run_loss_case(c));
}

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
