// topk_kd and topk_kl_gathered: every beta / temperature / normalization / hard-loss / reduction combination
// against the float64 reference with finite-difference gradients, the extra outputs, padding (mask and −inf),
// edge shapes, storage dtypes and strided views, the single pass, and bad input.
#include <gtest/gtest.h>

#include <array>

#include <cmath>
#include <limits>

#include "test_losses_ref.h"

namespace retort::test {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

struct TopKCfg {
  TopKRef r;
  bool labels = true;
  bool mask = true;
  int64_t n = 5, v = 9, k = 4;
  DType dt = DType::F32;
  DType lp_dt = DType::F32;
  double lo = -3, hi = 3;
  Out what = Out::Loss;
  bool transposed = false;  // logits read through a transposed view
};

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

// Inputs: logits [n, v], ids [n, k] in [0, v), logprobs [n, k] in [-4, -0.1), mask [n, k] in {0, 1}, labels
// [n] in [-1, v) with ignore_index -1. Missing optional inputs stay in the list but are passed as null.
LossCase topk_case(const std::string& name, TopKCfg cfg) {
  cfg.r.ignore = -1;
  LossCase c;
  c.name = name;
  Shape xs = cfg.transposed ? Shape{cfg.v, cfg.n} : Shape{cfg.n, cfg.v};
  c.inputs = {LossInput(xs, cfg.dt, true, cfg.lo, cfg.hi),
              LossInput({cfg.n, cfg.k}, DType::I32, false, 0, double(cfg.v)),
              LossInput({cfg.n, cfg.k}, cfg.lp_dt, false, -4, -0.1),
              LossInput({cfg.n, cfg.k}, DType::I32, false, 0, 2),
              LossInput({cfg.n}, DType::I32, false, -1, double(cfg.v))};
  c.build = [cfg](Context& ctx, const std::vector<Tensor*>& in) {
    TopKDistillOptions o = opts_of(cfg.r);
    o.return_per_row = cfg.what == Out::PerRow;
    o.return_lse = cfg.what == Out::Lse;
    o.return_parts = cfg.what == Out::Hard || cfg.what == Out::Soft;
    Tensor* x = cfg.transposed ? transpose(ctx, in[0]) : in[0];
    return pick(topk_kd(ctx, x, in[1], in[2], cfg.mask ? in[3] : nullptr, cfg.labels ? in[4] : nullptr, o),
                cfg.what);
  };
  c.reference = [cfg](const std::vector<Ref>& in) {
    return topk_ref(cfg.transposed ? mat_t(in[0]) : mat(in[0]), ints(in[1]), mat(in[2]),
                    cfg.mask ? in[3].v : Vec{}, cfg.labels ? ints(in[4]) : std::vector<int64_t>{}, cfg.r,
                    cfg.what);
  };
  c.fwd_tol = 1e-10;
  c.grad_tol = 1e-8;
  c.check_grad = cfg.what == Out::Loss;
  return c;
}

std::string cfg_name(const TopKRef& r, bool labels) {
  return "topk_b" + std::to_string(int(r.beta * 10)) + "_t" + std::to_string(int(r.t)) +
         (r.normalize ? "_norm" : "") + (r.w_hard > 0 ? "_hard" : "") + (labels ? "_labels" : "") + "_" +
         red_name(r.red);
}

TEST(TopKDistill, Grid) {
  int i = 0;
  for (double beta : {0.0, 0.5, 1.0})
    for (double t : {1.0, 2.0})
      for (bool norm : {false, true})
        for (double w_hard : {0.0, 0.7})
          for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
            TopKCfg cfg;
            cfg.r.beta = beta;
            cfg.r.t = t;
            cfg.r.normalize = norm;
            cfg.r.w_hard = w_hard;
            cfg.r.w_soft = 0.8;
            cfg.r.red = red;
            cfg.labels = w_hard > 0 || (i++ % 2 == 0);  // without labels every row counts
            EXPECT_TRUE(run_case(to_op_case(topk_case(cfg_name(cfg.r, cfg.labels), cfg))));
          }
}

TEST(TopKDistill, Divergences) {
  int i = 0;
  for (const DivCase& d : div_cases())
    for (double t : {1.0, 2.0})
      for (bool norm : {false, true})
        for (double w_hard : {0.0, 0.7}) {
          TopKCfg cfg;
          cfg.r.div = d.div;
          cfg.r.alpha = d.alpha;
          cfg.r.t = t;
          cfg.r.normalize = norm;
          cfg.r.w_hard = w_hard;
          cfg.r.w_soft = 0.8;
          cfg.r.red = std::array{Reduction::Mean, Reduction::Sum, Reduction::None}[size_t(i++ % 3)];
          cfg.labels = w_hard > 0 || i % 2 == 0;
          EXPECT_TRUE(
              run_case(to_op_case(topk_case(std::string(d.name) + "_" + cfg_name(cfg.r, cfg.labels), cfg))));
        }
}

TEST(TopKDistill, NoMask) {
  for (double beta : {0.0, 0.5, 1.0}) {
    TopKCfg cfg;
    cfg.r.beta = beta;
    cfg.r.t = 2;
    cfg.mask = false;
    EXPECT_TRUE(run_case(to_op_case(topk_case("topk_nomask_b" + std::to_string(int(beta * 10)), cfg))));
  }
}

TEST(TopKDistill, ExtraOutputs) {
  for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None})
    for (Out what : {Out::PerRow, Out::Lse, Out::Hard, Out::Soft}) {
      TopKCfg cfg;
      cfg.r.beta = 0.5;
      cfg.r.t = 2;
      cfg.r.w_hard = 0.3;
      cfg.r.red = red;
      cfg.what = what;
      EXPECT_TRUE(run_case(
          to_op_case(topk_case(std::string("topk_out") + std::to_string(int(what)) + red_name(red), cfg))));
    }
  // The hard part is reported even with w_hard = 0, and the normalize_topk fast path still gives the lse.
  TopKCfg cfg;
  cfg.r.normalize = true;
  cfg.what = Out::Hard;
  EXPECT_TRUE(run_case(to_op_case(topk_case("topk_hard_unweighted", cfg))));
  cfg.what = Out::Lse;
  cfg.r.t = 2;
  EXPECT_TRUE(run_case(to_op_case(topk_case("topk_norm_lse", cfg))));
}

TEST(TopKDistill, OneSlotAndAllSlots) {
  for (double beta : {0.0, 0.5, 1.0})
    for (bool norm : {false, true}) {
      TopKCfg cfg;
      cfg.r.beta = beta;
      cfg.r.normalize = norm;
      cfg.r.t = 2;
      cfg.r.w_hard = 0.5;
      cfg.k = 1;
      std::string tag = std::to_string(int(beta * 10)) + (norm ? "n" : "");
      EXPECT_TRUE(run_case(to_op_case(topk_case("topk_k1_" + tag, cfg))));
      // K = V with every id once per row (a permutation), so normalize_topk renormalizes over everything.
      cfg.k = cfg.v = 6;
      cfg.mask = false;
      LossCase c = topk_case("topk_kv_" + tag, cfg);
      Vec ids;
      for (int64_t r = 0; r < cfg.n; ++r)
        for (int64_t k = 0; k < cfg.k; ++k) ids.push_back(double((k * 5 + r) % cfg.k));
      c.inputs[1].values = ids;
      EXPECT_TRUE(run_loss_case(c));
    }
}

TEST(TopKDistill, LongRisingRows) {
  // T = 2 with the hard loss: two running sums (at T and at 1), and the dense gradient's two exponentials.
  for (double t : {1.0, 2.0}) {
    TopKCfg cfg;
    cfg.r.t = t;
    cfg.r.w_hard = 0.5;
    cfg.n = 1;
    cfg.v = 2600;
    cfg.k = 6;
    LossCase c = topk_case("topk_long_rows_t" + std::to_string(int(t)), cfg);
    c.inputs[0].values = rising(cfg.v);
    EXPECT_TRUE(run_loss_case(c));
  }
}

TEST(TopKDistill, SmallAndOddVocabularies) {
  for (int64_t v = 1; v <= 7; ++v) {
    TopKCfg cfg;
    cfg.r.beta = v % 2 ? 0.5 : 1.0;
    cfg.r.w_hard = 0.5;
    cfg.r.t = 2;
    cfg.v = v;
    cfg.k = std::min<int64_t>(3, v);
    EXPECT_TRUE(run_case(to_op_case(topk_case("topk_v" + std::to_string(v), cfg))));
  }
  TopKCfg cfg;
  cfg.r.beta = 0.5;
  cfg.r.w_hard = 0.5;
  cfg.n = 2;
  cfg.v = 1000;
  cfg.k = 16;
  EXPECT_TRUE(run_case(to_op_case(topk_case("topk_v1000", cfg))));
  cfg.r.normalize = true;
  cfg.r.t = 2;
  EXPECT_TRUE(run_case(to_op_case(topk_case("topk_v1000_norm", cfg))));
}

TEST(TopKDistill, HugeLogitsStayFinite) {
  for (double beta : {0.0, 0.5, 1.0})
    for (bool norm : {false, true}) {
      TopKCfg cfg;
      cfg.r.beta = beta;
      cfg.r.normalize = norm;
      cfg.r.w_hard = 0.5;
      cfg.r.t = 2;
      cfg.lo = -1e4;
      cfg.hi = 1e4;
      LossCase c = topk_case("topk_huge_" + std::to_string(int(beta * 10)) + (norm ? "n" : ""), cfg);
      c.fwd_tol = 1e-9;
      c.grad_tol = 1e-6;
      EXPECT_TRUE(run_loss_case(c));
    }
}

TEST(TopKDistill, Bf16F16AndStridedLogits) {
  for (DType dt : {DType::BF16, DType::F16}) {
    TopKCfg cfg;
    cfg.r.beta = 0.5;
    cfg.r.t = 2;
    cfg.r.w_hard = 0.5;
    cfg.dt = dt;
    cfg.lp_dt = dt;  // teacher logprobs in the same storage
    EXPECT_TRUE(run_case(to_op_case(topk_case(std::string("topk_") + dtype_name(dt), cfg))));
    cfg.transposed = true;
    cfg.r.normalize = true;
    EXPECT_TRUE(run_case(to_op_case(topk_case(std::string("topk_t_") + dtype_name(dt), cfg))));
  }
  TopKCfg cfg;
  cfg.transposed = true;
  cfg.r.beta = 1;
  EXPECT_TRUE(run_case(to_op_case(topk_case("topk_transposed", cfg))));
}

// Explicit teacher data: row 0 pads two slots with −inf (and id −1, which must never be read), row 1 is fully
// masked, row 2 pads by mask only (with an out-of-range id), row 3 is ordinary.
LossCase padded_case(const std::string& name, const TopKRef& r, bool use_labels) {
  TopKCfg cfg;
  cfg.r = r;
  cfg.n = 4;
  cfg.v = 7;
  cfg.k = 3;
  cfg.labels = use_labels;
  LossCase c = topk_case(name, cfg);
  c.inputs[1].values = {1, -1, -1, 0, 2, 4, 6, 99, 5, 3, 3, 1};  // a repeated id in row 3 is allowed
  c.inputs[2].values = {-0.5, kNegInf, kNegInf, -1, -2, -3, -0.2, -1.7, kNegInf, -0.3, -2.5, -1.2};
  c.inputs[3].values = {1, 1, 1, 0, 0, 0, 1, 0, 1, 1, 1, 1};
  c.inputs[4].values = {2, 6, -1, 0};
  return c;
}

TEST(TopKDistill, PaddingAndFullyMaskedRows) {
  for (double beta : {0.0, 0.5, 1.0})
    for (double t : {1.0, 2.0})
      for (bool norm : {false, true}) {
        TopKRef r;
        r.beta = beta;
        r.t = t;
        r.normalize = norm;
        r.w_hard = 0.4;
        std::string nm =
            "topk_pad_" + std::to_string(int(beta * 10)) + std::to_string(int(t)) + (norm ? "n" : "");
        EXPECT_TRUE(run_loss_case(padded_case(nm, r, true)));
        r.w_hard = 0;
        r.red = Reduction::None;
        LossCase c = padded_case(nm + "_none", r, false);
        EXPECT_TRUE(run_loss_case(c));
      }
  // The fully masked row alone: no divergence, so a zero loss and gradient (not NaN).
  TopKRef r;
  r.red = Reduction::None;
  LossCase c = padded_case("topk_pad_rows", r, false);
  c.check_grad = false;
  c.reference = [r](const std::vector<Ref>& in) {
    Vec v = topk_ref(mat(in[0]), ints(in[1]), mat(in[2]), in[3].v, {}, r);
    EXPECT_EQ(v[1], 0.0);
    return v;
  };
  EXPECT_TRUE(run_loss_case(c));
}

TEST(TopKDistill, AllRowsIgnoredAndOneValidRow) {
  for (int valid_row : {-1, 1}) {
    TopKCfg cfg;
    cfg.r.beta = 0.5;
    cfg.r.w_hard = 0.5;
    LossCase c = topk_case(valid_row < 0 ? "topk_all_ignored" : "topk_one_valid", cfg);
    Vec labels(size_t(cfg.n), -1.0);
    if (valid_row >= 0) labels[size_t(valid_row)] = 4;
    c.inputs[4].values = labels;
    c.unit_seed = true;
    EXPECT_TRUE(run_loss_case(c));
  }
}

TEST(TopKDistill, SinglePassGradient) {
  for (bool norm : {false, true}) {
    TopKCfg cfg;
    cfg.r.beta = 0.5;
    cfg.r.t = 2;
    cfg.r.normalize = norm;
    cfg.r.w_hard = 0.3;
    check_single_pass(topk_case(norm ? "topk_single_norm" : "topk_single", cfg));
  }
}

// ---- topk_kl_gathered ---------------------------------------------------------------------------------

// The float mask is random in [0, 1); the op sees mask != 0, so the build thresholds it at 0.4 first (an
// explicit 0 / 1 mask is unchanged in meaning).
Tensor* threshold(Context& ctx, Tensor* m) {
  return relu(ctx, sub(ctx, m, fill(ctx, DType::F32, m->ne, 0.4f)));
}

LossCase gathered_case(const std::string& name, double t, Reduction red, bool use_mask, Out what = Out::Loss,
                       DType dt = DType::F32) {
  LossCase c;
  c.name = name;
  c.inputs = {LossInput({5, 6}, dt, true, -3, 3), LossInput({5, 6}, DType::F32, false, -4, -0.1),
              LossInput({5, 6}, DType::F32, false, 0, 1)};
  c.build = [=](Context& ctx, const std::vector<Tensor*>& in) {
    TopKKLOptions o;
    o.temperature = float(t);
    o.reduction = red;
    o.return_per_row = what == Out::PerRow;
    o.return_lse = what == Out::Lse;
    return pick(topk_kl_gathered(ctx, in[0], in[1], use_mask ? threshold(ctx, in[2]) : nullptr, o), what);
  };
  c.reference = [=](const std::vector<Ref>& in) {
    TopKRef r;
    r.t = t;
    r.red = red;
    Vec mask;
    if (use_mask)
      for (double x : in[2].v) mask.push_back(x > 0.4 ? 1.0 : 0.0);
    return topk_ref(mat(in[0]), {}, mat(in[1]), mask, {}, r, what);
  };
  c.check_grad = what == Out::Loss;
  return c;
}

TEST(TopKKLGathered, Grid) {
  for (double t : {1.0, 2.0})
    for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None})
      for (bool use_mask : {false, true}) {
        LossCase c =
            gathered_case("gathered_t" + std::to_string(int(t)) + red_name(red) + (use_mask ? "_mask" : ""),
                          t, red, use_mask);
        EXPECT_TRUE(run_case(to_op_case(c)));
      }
  for (Out what : {Out::PerRow, Out::Lse}) {
    LossCase c = gathered_case("gathered_out" + std::to_string(int(what)), 2, Reduction::Mean, false, what);
    EXPECT_TRUE(run_case(to_op_case(c)));
  }
  EXPECT_TRUE(run_case(
      to_op_case(gathered_case("gathered_bf16", 2, Reduction::Mean, false, Out::Loss, DType::BF16))));
}

TEST(TopKKLGathered, IsTopKDistillNormalizedOnGatheredLogits) {
  // topk_kd with normalize_topk (beta 0, no hard loss) against the gathered form of the reference applied to
  // the student logits gathered at the ids: the two ops compute the same loss.
  LossCase c;
  c.name = "gathered_vs_topk";
  c.inputs = {LossInput({4, 10}, DType::F32, true, -3, 3), LossInput({4, 3}, DType::I32, false, 0, 10),
              LossInput({4, 3}, DType::F32, false, -4, -0.1)};
  c.build = [](Context& ctx, const std::vector<Tensor*>& in) {
    TopKDistillOptions o;
    o.normalize_topk = true;
    o.temperature = 2;
    return topk_kd(ctx, in[0], in[1], in[2], nullptr, nullptr, o).loss;
  };
  c.reference = [](const std::vector<Ref>& in) {
    Mat z = mat(in[0]), g;
    g.rows = 4;
    g.cols = 3;
    std::vector<int64_t> ids = ints(in[1]);
    for (int64_t r = 0; r < 4; ++r)
      for (int64_t k = 0; k < 3; ++k) g.v.push_back(z.at(r, ids[size_t(r * 3 + k)]));
    TopKRef r;
    r.t = 2;
    return topk_ref(g, {}, mat(in[2]), {}, {}, r);  // the gathered form of the reference
  };
  EXPECT_TRUE(run_loss_case(c));
}

TEST(TopKKLGathered, PaddingAndSinglePass) {
  LossCase c = gathered_case("gathered_pad", 2, Reduction::None, true);
  c.inputs[1].values = Vec(30, -1.0);
  c.inputs[1].values[0] = kNegInf;  // −inf padding in a valid-mask slot
  c.inputs[2].values = Vec(30, 1.0);
  for (int k = 0; k < 6; ++k) c.inputs[2].values[size_t(6 + k)] = 0;  // row 1 fully masked
  EXPECT_TRUE(run_loss_case(c));
  check_single_pass(gathered_case("gathered_single", 2, Reduction::Mean, false));
}

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
