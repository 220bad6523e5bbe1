// fused_linear_topk_kd beyond its case list (tests/ops/loss_cases_fused_topk.cpp, run on every backend): the
// dense and K-sparse paths against the unfused composition through the graph, chunk-size independence
// (bitwise for the sparse path), exact zeros when every row is ignored, and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "test_fused_linear_ref.h"

namespace retort::test {
namespace {

FusedLinearOptions chunked(int64_t rows) {
  FusedLinearOptions f;
  f.chunk_rows = rows;
  return f;
}

// The sparse path (normalize_topk, no hard loss) and the dense path on the same values agree with the
// unfused composition, through the graph, for every chunk size; the sparse path's weight gradient is the
// same to the bit for every chunk size (each vocabulary row accumulates its updates in row order).
TEST(FusedLinearTopK, EqualsUnfusedAndChunkInvariant) {
  const int64_t n = 29, h = 16, v = 203, k = 8;
  std::vector<LossInput> in = {hidden_in(n, h, DType::F32, -2, 2),
                               weight_in(v, h),
                               bias_in(v),
                               LossInput({n, k}, DType::I64, false, 0, double(v)),
                               LossInput({n, k}, DType::F32, false, -6, -0.1),
                               LossInput({n, k}, DType::I32, false, 0, 4),
                               LossInput({n}, DType::I32, false, -1, double(v))};
  const std::vector<Vec> vals = draw_values("fltopk_unfused", in);
  for (bool normalize : {true, false})
    for (Reduction red : {Reduction::Mean, Reduction::None}) {
      TopKDistillOptions o;
      o.normalize_topk = normalize;
      o.beta = 0.3f;
      o.temperature = 1.5f;
      o.ignore_index = -1;
      o.reduction = red;
      o.return_per_row = true;
      o.return_parts = true;
      const BuildFn unfused = [o](Context& ctx, const std::vector<Tensor*>& x) {
        Tensor* z = add(ctx, matmul(ctx, x[0], x[1], false, true), x[2]);
        LossOutputs l = topk_kd(ctx, z, x[3], x[4], x[5], x[6], o);
        return std::vector<Tensor*>{l.loss, l.per_row, l.soft};
      };
      // Parts with labels need the dense path; without return_parts the sparse one runs (normalize on).
      TopKDistillOptions sparse_o = o;
      sparse_o.return_parts = false;
      const BuildFn unfused_sparse = [sparse_o](Context& ctx, const std::vector<Tensor*>& x) {
        Tensor* z = add(ctx, matmul(ctx, x[0], x[1], false, true), x[2]);
        LossOutputs l = topk_kd(ctx, z, x[3], x[4], x[5], x[6], sparse_o);
        return std::vector<Tensor*>{l.loss, l.per_row};
      };
      for (Seed seed : {Seed::Unit, Seed::Weighted}) {
        if (seed == Seed::Unit && red == Reduction::None) continue;
        const GraphResult want = run_graph(in, vals, unfused, seed);
        const GraphResult want_sparse = run_graph(in, vals, unfused_sparse, seed);
        GraphResult first;
        for (int64_t chunk : chunk_sizes(n)) {
          const std::string what = std::string(normalize ? "norm " : "") + red_name(red) + " chunk " +
                                   std::to_string(chunk) + (seed == Seed::Unit ? " unit" : " weighted");
          const BuildFn dense = [o, chunk](Context& ctx, const std::vector<Tensor*>& x) {
            LossOutputs l =
                fused_linear_topk_kd(ctx, x[0], x[1], x[2], x[3], x[4], x[5], x[6], o, chunked(chunk));
            return std::vector<Tensor*>{l.loss, l.per_row, l.soft};
          };
          expect_close(run_graph(in, vals, dense, seed), want, 1e-11, "dense " + what);
          const BuildFn sparse = [sparse_o, chunk](Context& ctx, const std::vector<Tensor*>& x) {
            LossOutputs l =
                fused_linear_topk_kd(ctx, x[0], x[1], x[2], x[3], x[4], x[5], x[6], sparse_o, chunked(chunk));
            return std::vector<Tensor*>{l.loss, l.per_row};
          };
          const GraphResult got = run_graph(in, vals, sparse, seed);
          expect_close(got, want_sparse, 1e-11, (normalize ? "sparse " : "dense ") + what);
          if (!normalize) continue;
          if (first.grads.empty()) {
            first = got;
            continue;
          }
          ASSERT_EQ(got.grads.size(), 3u);
          EXPECT_EQ(got.grads[1], first.grads[1]) << "sparse dW depends on the chunk size: " << what;
          EXPECT_EQ(got.grads[2], first.grads[2]) << "sparse dbias depends on the chunk size: " << what;
        }
      }
    }
}

TEST(FusedLinearTopK, AllRowsIgnored) {
  // Both paths: loss 0 and all-zero gradients (the sparse path must not scatter the ignored rows' slots).
  std::vector<LossInput> in = {hidden_in(5, 3),
                               weight_in(7, 3),
                               bias_in(7),
                               LossInput({5, 2}, DType::I32, false, 0, 7),
                               LossInput({5, 2}, DType::F32, false, -3, -0.5),
                               LossInput({5}, DType::I32, false, 0, 1, Vec(5, -1.0))};
  const std::vector<Vec> vals = draw_values("fltopk_ignored", in);
  for (bool normalize : {false, true}) {
    const GraphResult g = run_graph(
        in, vals,
        [normalize](Context& ctx, const std::vector<Tensor*>& x) {
          TopKDistillOptions o;
          o.normalize_topk = normalize;
          o.ignore_index = -1;
          o.reduction = Reduction::Sum;  // no 1/0 scale to hide a gradient row that was not zeroed
          return std::vector<Tensor*>{
              fused_linear_topk_kd(ctx, x[0], x[1], x[2], x[3], x[4], nullptr, x[5], o, chunked(2)).loss};
        },
        Seed::Unit);
    EXPECT_EQ(g.outs[0], Vec{0.0});
    for (const Vec& gr : g.grads)
      for (double x : gr) EXPECT_EQ(x, 0.0);
  }
}

TEST(FusedLinearTopK, BadInputThrows) {
  Context ctx(default_cpu_backend());
  Tensor* h = ctx.tensor(DType::F32, {4, 6});
  Tensor* w = ctx.tensor(DType::F32, {10, 6});
  Tensor* ids = ctx.tensor(DType::I32, {4, 3});
  Tensor* lp = ctx.tensor(DType::F32, {4, 3});
  expect_error(
      [&] {
        fused_linear_topk_kd(ctx, h, w, nullptr, ctx.tensor(DType::I32, {4, 11}),
                             ctx.tensor(DType::F32, {4, 11}), nullptr, nullptr);
      },
      {"fused_linear_topk_kd", "K = 11", "V = 10"});
  expect_error(
      [&] {
        fused_linear_topk_kd(ctx, h, w, nullptr, ctx.tensor(DType::I32, {5, 3}), lp, nullptr, nullptr);
      },
      {"fused_linear_topk_kd", "teacher_ids", "[5, 3]", "N = 4"});
  expect_error(
      [&] {
        fused_linear_topk_kd(ctx, h, w, nullptr, ids, ctx.tensor(DType::F32, {4, 2}), nullptr, nullptr);
      },
      {"fused_linear_topk_kd", "teacher_logprobs", "[4, 2]"});
  expect_error([&] { fused_linear_topk_kd(ctx, h, w, nullptr, lp, lp, nullptr, nullptr); },
               {"fused_linear_topk_kd", "teacher_ids", "i32"});
  expect_error(
      [&] {
        fused_linear_topk_kd(ctx, h, w, nullptr, ids, lp, ctx.tensor(DType::I32, {4, 4}), nullptr);
      },
      {"fused_linear_topk_kd", "mask"});
  TopKDistillOptions o;
  o.beta = 1.5f;
  expect_error([&] { fused_linear_topk_kd(ctx, h, w, nullptr, ids, lp, nullptr, nullptr, o); },
               {"fused_linear_topk_kd", "beta", "[4, 6]"});
  o = {};
  o.temperature = 0;
  expect_error([&] { fused_linear_topk_kd(ctx, h, w, nullptr, ids, lp, nullptr, nullptr, o); },
               {"temperature"});
  o = {};
  o.w_hard = 1;
  expect_error([&] { fused_linear_topk_kd(ctx, h, w, nullptr, ids, lp, nullptr, nullptr, o); },
               {"w_hard", "needs labels"});
  // An id out of range on a valid slot throws at run time, on both paths.
  Tensor* bad = ctx.tensor(DType::I32, {4, 3});
  set_data_int(bad, {0, 1, 2, 3, 4, 5, 6, 10, 8, 9, 0, 1});
  for (bool normalize : {false, true}) {
    o = {};
    o.normalize_topk = normalize;
    Graph g(ctx);
    g.forward(fused_linear_topk_kd(ctx, h, w, nullptr, bad, lp, nullptr, nullptr, o).loss);
    expect_error([&] { g.compute(); }, {"fused_linear_topk_kd", "teacher id 10", "row 2"});
  }
  // Issue 25: a NaN (or +inf) teacher logprob in a valid slot gave a finite loss with NaN gradients, on the
  // dense and the K-sparse path alike; now it is an error naming the slot, and a masked one is padding.
  Tensor* good_ids = ctx.tensor(DType::I32, {4, 3});
  set_data_int(good_ids, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1});
  Tensor* mask = ctx.tensor(DType::F32, {4, 3});
  set_data(mask, {1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1});
  for (float v : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    std::vector<float> lpv(12, -1.5f);
    lpv[7] = v;
    set_data(lp, lpv);
    for (bool normalize : {false, true}) {
      o = {};
      o.normalize_topk = normalize;
      Graph g(ctx);
      g.forward(fused_linear_topk_kd(ctx, h, w, nullptr, good_ids, lp, nullptr, nullptr, o).loss);
      expect_error([&] { g.compute(); }, {"fused_linear_topk_kd", "teacher logprob", "row 2 slot 1"});
      Graph gm(ctx);
      gm.forward(fused_linear_topk_kd(ctx, h, w, nullptr, good_ids, lp, mask, nullptr, o).loss);
      EXPECT_NO_THROW(gm.compute());
    }
    Graph gu(ctx);
    gu.forward(topk_kd(ctx, ctx.tensor(DType::F32, {4, 10}), good_ids, lp, nullptr, nullptr).loss);
    expect_error([&] { gu.compute(); }, {"topk_kd", "teacher logprob", "row 2 slot 1"});
  }
}

}  // namespace
}  // namespace retort::test
