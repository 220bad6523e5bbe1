// fused_linear_topk_kd: the dense path (full-vocabulary GEMMs) and the K-sparse path (K dot products per row)
// against the float64 lm-head + top-K reference with finite-difference gradients, against the unfused
// composition through the graph, chunk-size independence (bitwise for the sparse path), padding whose ids are
// out of range, K = 1 and K = V, and bad input.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <limits>

#include "test_fused_linear_ref.h"

namespace retort::test {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

TopKDistillOptions opts_of(const TopKRef& r) {
  TopKDistillOptions o;
  o.divergence = r.div;
  o.beta = float(r.beta);
  o.skew_alpha = float(r.alpha);
  o.temperature = float(r.t);
  o.normalize_topk = r.normalize;
  o.w_hard = float(r.w_hard);
  o.w_soft = float(r.w_soft);
  o.ignore_index = r.ignore;
  o.reduction = r.red;
  return o;
}

FusedLinearOptions chunked(int64_t rows) {
  FusedLinearOptions f;
  f.chunk_rows = rows;
  return f;
}

struct Cfg {
  TopKRef r;
  bool bias = true, labels = true, mask = true;
  int64_t n = 7, h = 4, v = 11, k = 4, chunk = 3;
  DType dt = DType::F32;
  Out what = Out::Loss;
};

// Inputs: hidden [n, h], weight [v, h], bias [v], ids [n, k], logprobs [n, k], mask [n, k] in {0, 1, 2, 3}
// (nonzero = valid: most slots are, so a row rarely loses its divergence), labels
// [n] in [-1, v) with ignore_index -1; unused optional inputs stay in the list and are passed as null.
LossCase topk_case(const std::string& name, Cfg cfg) {
  cfg.r.ignore = -1;
  LossCase c;
  c.name = name;
  c.inputs = {hidden_in(cfg.n, cfg.h, cfg.dt, -2, 2),
              weight_in(cfg.v, cfg.h, cfg.dt),
              bias_in(cfg.v, cfg.dt),
              LossInput({cfg.n, cfg.k}, DType::I32, false, 0, double(cfg.v)),
              LossInput({cfg.n, cfg.k}, DType::F32, false, -4, -0.1),
              LossInput({cfg.n, cfg.k}, DType::I32, false, 0, 4),
              LossInput({cfg.n}, DType::I32, false, -1, double(cfg.v))};
  c.inputs[2].param = cfg.bias;  // an unused bias is no parameter (it would get no gradient)
  c.build = [cfg](Context& ctx, const std::vector<Tensor*>& in) {
    TopKDistillOptions o = opts_of(cfg.r);
    o.return_per_row = cfg.what == Out::PerRow;
    o.return_lse = cfg.what == Out::Lse;
    o.return_parts = cfg.what == Out::Hard || cfg.what == Out::Soft;
    return pick(
        fused_linear_topk_kd(ctx, in[0], in[1], cfg.bias ? in[2] : nullptr, in[3], in[4],
                             cfg.mask ? in[5] : nullptr, cfg.labels ? in[6] : nullptr, o, chunked(cfg.chunk)),
        cfg.what);
  };
  c.reference = [cfg](const std::vector<Ref>& in) {
    return topk_ref(head_ref(in[0], in[1], cfg.bias ? &in[2] : nullptr), ints(in[3]), mat(in[4]),
                    cfg.mask ? in[5].v : Vec{}, cfg.labels ? ints(in[6]) : std::vector<int64_t>{}, cfg.r,
                    cfg.what);
  };
  c.fwd_tol = 1e-10;
  c.grad_tol = 1e-8;
  c.check_grad = cfg.what == Out::Loss;
  return c;
}

TEST(FusedLinearTopK, Grid) {
  int i = 0;
  for (double beta : {0.0, 0.5, 1.0})
    for (double t : {1.0, 2.0})
      for (bool normalize : {false, true})
        for (double w_hard : {0.0, 0.5}) {
          Cfg cfg;
          cfg.r.beta = beta;
          cfg.r.t = t;
          cfg.r.normalize = normalize;
          cfg.r.w_hard = w_hard;
          cfg.r.red = std::array{Reduction::Mean, Reduction::Sum, Reduction::None}[size_t(i++ % 3)];
          cfg.labels = w_hard > 0 || i % 2 == 0;
          cfg.bias = i % 4 != 1;
          const std::string name = "fltopk_b" + std::to_string(int(beta * 10)) + "_t" +
                                   std::to_string(int(t)) + (normalize ? "_norm" : "") +
                                   (w_hard > 0 ? "_hard" : "") + (cfg.labels ? "_labels" : "") + "_" +
                                   red_name(cfg.r.red);
          EXPECT_TRUE(run_case(to_op_case(topk_case(name, cfg))));
        }
}

// normalize_topk without the hard loss takes the K-sparse path (no full-vocabulary GEMM).
TEST(FusedLinearTopK, Divergences) {
  int i = 0;
  for (const DivCase& d : div_cases())
    for (bool normalize : {false, true})
      for (double w_hard : {0.0, 0.5}) {
        Cfg cfg;
        cfg.r.div = d.div;
        cfg.r.alpha = d.alpha;
        cfg.r.t = i % 2 == 0 ? 1.0 : 2.0;
        cfg.r.normalize = normalize;
        cfg.r.w_hard = w_hard;
        cfg.r.red = std::array{Reduction::Mean, Reduction::Sum, Reduction::None}[size_t(i++ % 3)];
        cfg.labels = w_hard > 0 || i % 2 == 0;
        const std::string name = std::string("fltopk_") + d.name + (normalize ? "_norm" : "") +
                                 (w_hard > 0 ? "_hard" : "") + "_" + red_name(cfg.r.red);
        LossCase c = topk_case(name, cfg);
        // The skew divergences at α = 0.6 are small (M is close to the weighted side), so the f32 rounding
        // of the GEMM's logits is a larger fraction of them than of KL: nmse up to ~3e-9.
        c.fwd_tol = 1e-8;
        EXPECT_TRUE(run_case(to_op_case(c)));
      }
}

TEST(FusedLinearTopK, ExtraOutputs) {
  // lse and the hard part with labels need the full row: the dense path even with normalize_topk on.
  for (bool normalize : {false, true})
    for (Out what : {Out::PerRow, Out::Lse, Out::Hard, Out::Soft})
      for (Reduction red : {Reduction::Mean, Reduction::None}) {
        Cfg cfg;
        cfg.r.normalize = normalize;
        cfg.r.red = red;
        cfg.r.t = 1.5;
        cfg.what = what;
        EXPECT_TRUE(run_case(to_op_case(topk_case(std::string("fltopk_out") + std::to_string(int(what)) +
                                                      (normalize ? "_norm_" : "_") + red_name(red),
                                                  cfg))));
      }
}

TEST(FusedLinearTopK, SinglePassAndDtypes) {
  for (bool normalize : {false, true})
    for (DType dt : {DType::F32, DType::BF16}) {
      Cfg cfg;
      cfg.r.normalize = normalize;
      cfg.r.beta = 0.5;
      cfg.dt = dt;
      check_single_pass(
          topk_case(std::string("fltopk_single_") + dtype_name(dt) + (normalize ? "_norm" : ""), cfg));
    }
}

// K = 1 and K = V, padding given by −inf logprobs and by the mask, whose ids are garbage (out of range): the
// sparse path must never look them up.
TEST(FusedLinearTopK, PaddingAndEdgeK) {
  for (bool normalize : {false, true}) {
    for (int64_t k : {int64_t(1), int64_t(11)}) {
      Cfg cfg;
      cfg.k = k;
      cfg.r.normalize = normalize;
      cfg.r.t = 2;
      EXPECT_TRUE(
          run_case(to_op_case(topk_case("fltopk_k" + std::to_string(k) + (normalize ? "_norm" : ""), cfg))));
    }
    Cfg cfg;
    cfg.n = 4;
    cfg.k = 3;
    cfg.r.normalize = normalize;
    cfg.r.beta = 0.5;
    LossCase c = topk_case(std::string("fltopk_padding") + (normalize ? "_norm" : ""), cfg);
    // Row 0: slot 1 padded by −inf; row 1: fully masked (no divergence); row 2: id 99 and −5 on padding.
    c.inputs[3].values = {0, 5, 2, 3, 3, 1, 99, 7, -5, 10, 9, 8};
    c.inputs[4].values = {-1.0, kNegInf, -0.7, -2, -1, -3, -0.5, -1.5, -2, -0.1, -2.5, -3};
    c.inputs[5].values = {1, 1, 1, 0, 0, 0, 0, 1, 0, 1, 1, 1};
    c.inputs[6].values = {3, -1, 4, 10};
    EXPECT_TRUE(run_loss_case(c));
    c.unit_seed = true;
    EXPECT_TRUE(run_loss_case(c));
  }
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
