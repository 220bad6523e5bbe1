// fused_linear_distill (student and online teacher lm-heads), fused_linear_entropy and
// fused_linear_selective_log_softmax beyond their case lists (tests/ops/loss_cases_fused_distill.cpp, run on
// every backend): the unfused composition through the graph at every chunk size, and bad input.
#include <gtest/gtest.h>

#include "test_fused_linear_ref.h"

namespace retort::test {
namespace {

FusedLinearOptions chunked(int64_t rows) {
  FusedLinearOptions f;
  f.chunk_rows = rows;
  return f;
}

TEST(FusedLinearDistill, EqualsUnfusedAndChunkInvariant) {
  const int64_t n = 23, h = 12, ht = 20, v = 157;
  std::vector<LossInput> in = {hidden_in(n, h, DType::F32, -2, 2),
                               weight_in(v, h),
                               bias_in(v),
                               LossInput({n, ht}, DType::BF16, false, -2, 2),
                               LossInput({v, ht}, DType::F32, false),
                               LossInput({v}, DType::F32, false),
                               LossInput({n}, DType::I64, false, -1, double(v))};
  const std::vector<Vec> vals = draw_values("fldist_unfused", in);
  for (double beta : {0.0, 0.7})
    for (Reduction red : {Reduction::Mean, Reduction::None}) {
      DistillOptions o;
      o.beta = float(beta);
      o.temperature = 2.0f;
      o.w_hard = 0.25f;
      o.ignore_index = -1;
      o.reduction = red;
      o.return_lse = true;
      o.return_parts = true;
      const BuildFn unfused = [o](Context& ctx, const std::vector<Tensor*>& x) {
        Tensor* z = add(ctx, matmul(ctx, x[0], x[1], false, true), x[2]);
        Tensor* tz = add(ctx, matmul(ctx, x[3], x[4], false, true), x[5]);
        LossOutputs l = distill(ctx, z, tz, x[6], o);
        return std::vector<Tensor*>{l.loss, l.lse, l.hard, l.soft};
      };
      for (Seed seed : {Seed::Unit, Seed::Weighted}) {
        if (seed == Seed::Unit && red == Reduction::None) continue;
        const GraphResult want = run_graph(in, vals, unfused, seed);
        for (int64_t chunk : chunk_sizes(n)) {
          const BuildFn fused = [o, chunk](Context& ctx, const std::vector<Tensor*>& x) {
            LossOutputs l =
                fused_linear_distill(ctx, x[0], x[1], x[2], x[3], x[4], x[5], x[6], o, chunked(chunk));
            return std::vector<Tensor*>{l.loss, l.lse, l.hard, l.soft};
          };
          expect_close(run_graph(in, vals, fused, seed), want, 1e-11,
                       "distill beta " + std::to_string(beta) + " " + red_name(red) + " chunk " +
                           std::to_string(chunk));
        }
      }
    }
}

TEST(FusedLinearDistill, BadInputThrows) {
  Context ctx(default_cpu_backend());
  Tensor* h = ctx.tensor(DType::F32, {4, 6});
  Tensor* w = ctx.tensor(DType::F32, {10, 6});
  Tensor* th = ctx.tensor(DType::F32, {4, 8});
  Tensor* tw = ctx.tensor(DType::F32, {10, 8});
  expect_error(
      [&] {
        fused_linear_distill(ctx, h, w, nullptr, th, ctx.tensor(DType::F32, {9, 8}), nullptr, nullptr);
      },
      {"fused_linear_distill", "teacher_weight", "[9, 8]", "V = 10"});
  expect_error(
      [&] {
        fused_linear_distill(ctx, h, w, nullptr, th, ctx.tensor(DType::F32, {10, 6}), nullptr, nullptr);
      },
      {"fused_linear_distill", "teacher_weight", "Ht = 8"});
  expect_error(
      [&] {
        fused_linear_distill(ctx, h, w, nullptr, ctx.tensor(DType::F32, {5, 8}), tw, nullptr, nullptr);
      },
      {"fused_linear_distill", "teacher_hidden", "[5, 8]", "N = 4"});
  expect_error(
      [&] { fused_linear_distill(ctx, h, w, nullptr, th, tw, ctx.tensor(DType::F32, {8}), nullptr); },
      {"fused_linear_distill", "teacher_bias", "[8]"});
  DistillOptions o;
  o.beta = -0.1f;
  expect_error([&] { fused_linear_distill(ctx, h, w, nullptr, th, tw, nullptr, nullptr, o); },
               {"fused_linear_distill", "beta"});
  o = {};
  o.w_hard = 0.5f;
  expect_error([&] { fused_linear_distill(ctx, h, w, nullptr, th, tw, nullptr, nullptr, o); },
               {"needs labels"});
  // The teacher is a constant: a teacher weight that is a parameter cannot be differentiated.
  Tensor* hp = ctx.param(DType::F32, {4, 6}, "h");
  Tensor* twp = ctx.param(DType::F32, {10, 8}, "tw");
  Graph g(ctx);
  Tensor* loss = fused_linear_distill(ctx, hp, w, nullptr, th, twp, nullptr, nullptr).loss;
  expect_error([&] { g.backward(loss); }, {"fused_linear_distill", "teacher_weight", "constants"});
}

// ---- entropy ------------------------------------------------------------------------------------------

TEST(FusedLinearEntropy, EqualsUnfusedAndChunkInvariant) {
  const int64_t n = 21, h = 10, v = 129;
  std::vector<LossInput> in = {hidden_in(n, h, DType::BF16, -2, 2), weight_in(v, h)};
  const std::vector<Vec> vals = draw_values("flent_unfused", in);
  for (Reduction red : {Reduction::Mean, Reduction::None}) {
    const Seed seed = red == Reduction::None ? Seed::Weighted : Seed::Unit;
    const GraphResult want = run_graph(
        in, vals,
        [red](Context& ctx, const std::vector<Tensor*>& x) {
          return std::vector<Tensor*>{entropy(ctx, matmul(ctx, x[0], x[1], false, true), 1.3f, red)};
        },
        seed);
    for (int64_t chunk : chunk_sizes(n))
      expect_close(run_graph(
                       in, vals,
                       [red, chunk](Context& ctx, const std::vector<Tensor*>& x) {
                         return std::vector<Tensor*>{
                             fused_linear_entropy(ctx, x[0], x[1], nullptr, 1.3f, red, chunked(chunk))};
                       },
                       seed),
                   want, 1e-11, std::string("entropy ") + red_name(red) + " chunk " + std::to_string(chunk));
  }
}

// ---- selective log-softmax ----------------------------------------------------------------------------

TEST(FusedLinearSelective, EqualsUnfusedAndChunkInvariant) {
  const int64_t n = 19, h = 8, v = 140, k = 5;
  std::vector<LossInput> in = {hidden_in(n, h, DType::F32, -2, 2), weight_in(v, h, DType::F16), bias_in(v),
                               LossInput({n, k}, DType::I32, false, 0, double(v))};
  const std::vector<Vec> vals = draw_values("flsel_unfused", in);
  const GraphResult want = run_graph(
      in, vals,
      [](Context& ctx, const std::vector<Tensor*>& x) {
        Tensor* z = add(ctx, matmul(ctx, x[0], x[1], false, true), x[2]);
        return std::vector<Tensor*>{selective_log_softmax(ctx, z, x[3])};
      },
      Seed::Weighted);
  for (int64_t chunk : chunk_sizes(n))
    expect_close(run_graph(
                     in, vals,
                     [chunk](Context& ctx, const std::vector<Tensor*>& x) {
                       return std::vector<Tensor*>{
                           fused_linear_selective_log_softmax(ctx, x[0], x[1], x[2], x[3], chunked(chunk))};
                     },
                     Seed::Weighted),
                 want, 1e-11, "selective chunk " + std::to_string(chunk));
}

TEST(FusedLinearSelective, BadInputThrows) {
  Context ctx(default_cpu_backend());
  Tensor* h = ctx.tensor(DType::F32, {4, 6});
  Tensor* w = ctx.tensor(DType::F32, {10, 6});
  expect_error(
      [&] {
        fused_linear_selective_log_softmax(ctx, h, w, nullptr, ctx.tensor(DType::I32, {3, 2}));
      },
      {"fused_linear_selective_log_softmax", "ids", "[3, 2]", "N = 4"});
  expect_error(
      [&] {
        fused_linear_selective_log_softmax(ctx, h, w, nullptr, ctx.tensor(DType::F32, {4, 2}));
      },
      {"fused_linear_selective_log_softmax", "ids", "i32"});
  Tensor* ids = ctx.tensor(DType::I32, {4, 2});
  set_data_int(ids, {0, 1, 2, 3, 4, 10, 6, 7});
  Graph g(ctx);
  g.forward(fused_linear_selective_log_softmax(ctx, h, w, nullptr, ids));
  expect_error([&] { g.compute(); }, {"fused_linear_selective_log_softmax", "id 10", "row 2"});
  expect_error([&] { fused_linear_entropy(ctx, h, w, nullptr, 0.0f); },
               {"fused_linear_entropy", "temperature"});
}

}  // namespace
}  // namespace retort::test
