// distill (full-vocabulary KL / JSD) and entropy: against float64 references with finite-difference
// gradients, extra outputs, edge cases, storage dtypes, strided views, the single pass, and bad input.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <limits>

#include "test_losses_ref.h"

namespace retort::test {
namespace {

struct DistillCfg {
  DistillRef r;
  bool labels = true;
  int64_t n = 5, v = 9;
  DType dt = DType::F32, teacher_dt = DType::F32;
  double lo = -3, hi = 3;
  Out what = Out::Loss;
  bool transposed = false;
};

DistillOptions opts_of(const DistillRef& r) {
  DistillOptions o;
  o.divergence = r.div;
  o.beta = float(r.beta);
  o.skew_alpha = float(r.alpha);
  o.temperature = float(r.t);
  o.w_hard = float(r.w_hard);
  o.w_soft = float(r.w_soft);
  o.ignore_index = r.ignore;
  o.reduction = r.red;
  return o;
}

// Inputs: student [n, v] (param), teacher [n, v] (constant), labels [n] in [-1, v) with ignore_index -1.
LossCase distill_case(const std::string& name, DistillCfg cfg) {
  cfg.r.ignore = -1;
  LossCase c;
  c.name = name;
  Shape xs = cfg.transposed ? Shape{cfg.v, cfg.n} : Shape{cfg.n, cfg.v};
  c.inputs = {LossInput(xs, cfg.dt, true, cfg.lo, cfg.hi),
              LossInput({cfg.n, cfg.v}, cfg.teacher_dt, false, cfg.lo, cfg.hi),
              LossInput({cfg.n}, DType::I32, false, -1, double(cfg.v))};
  c.build = [cfg](Context& ctx, const std::vector<Tensor*>& in) {
    DistillOptions o = opts_of(cfg.r);
    o.return_per_row = cfg.what == Out::PerRow;
    o.return_lse = cfg.what == Out::Lse;
    o.return_parts = cfg.what == Out::Hard || cfg.what == Out::Soft;
    Tensor* x = cfg.transposed ? transpose(ctx, in[0]) : in[0];
    return pick(distill(ctx, x, in[1], cfg.labels ? in[2] : nullptr, o), cfg.what);
  };
  c.reference = [cfg](const std::vector<Ref>& in) {
    return distill_ref(cfg.transposed ? mat_t(in[0]) : mat(in[0]), mat(in[1]),
                       cfg.labels ? ints(in[2]) : std::vector<int64_t>{}, cfg.r, cfg.what);
  };
  c.check_grad = cfg.what == Out::Loss;
  return c;
}

std::string tag(const DistillRef& r, bool labels) {
  return "distill_b" + std::to_string(int(r.beta * 10)) + "_t" + std::to_string(int(r.t)) +
         (r.w_hard > 0 ? "_hard" : "") + (labels ? "_labels" : "") + "_" + red_name(r.red);
}

TEST(Distill, Grid) {
  int i = 0;
  for (double beta : {0.0, 0.5, 1.0, 0.1})
    for (double t : {1.0, 2.0})
      for (double w_hard : {0.0, 0.6})
        for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
          DistillCfg cfg;
          cfg.r.beta = beta;
          cfg.r.t = t;
          cfg.r.w_hard = w_hard;
          cfg.r.w_soft = 0.9;
          cfg.r.red = red;
          cfg.labels = w_hard > 0 || (i++ % 2 == 0);
          EXPECT_TRUE(run_case(to_op_case(distill_case(tag(cfg.r, cfg.labels), cfg))));
        }
}

TEST(Distill, Divergences) {
  int i = 0;
  for (const DivCase& d : div_cases())
    for (double t : {1.0, 2.0})
      for (double w_hard : {0.0, 0.6}) {
        DistillCfg cfg;
        cfg.r.div = d.div;
        cfg.r.alpha = d.alpha;
        cfg.r.t = t;
        cfg.r.w_hard = w_hard;
        cfg.r.w_soft = 0.9;
        cfg.r.red = std::array{Reduction::Mean, Reduction::Sum, Reduction::None}[size_t(i++ % 3)];
        cfg.labels = w_hard > 0 || i % 2 == 0;
        EXPECT_TRUE(
            run_case(to_op_case(distill_case(std::string(d.name) + "_" + tag(cfg.r, cfg.labels), cfg))));
      }
  // Long rows cross every vector width and tail of the CPU kernel's loops.
  for (const DivCase& d : div_cases()) {
    DistillCfg cfg;
    cfg.r.div = d.div;
    cfg.r.alpha = d.alpha;
    cfg.r.t = 2;
    cfg.r.w_hard = 0.5;
    cfg.n = 2;
    cfg.v = 1000;
    EXPECT_TRUE(run_case(to_op_case(distill_case(std::string(d.name) + "_v1000", cfg))));
  }
}

TEST(Distill, ExtraOutputs) {
  for (Reduction red : {Reduction::Mean, Reduction::None})
    for (Out what : {Out::PerRow, Out::Lse, Out::Hard, Out::Soft}) {
      DistillCfg cfg;
      cfg.r.beta = 0.5;
      cfg.r.t = 2;
      cfg.r.w_hard = 0.4;
      cfg.r.red = red;
      cfg.what = what;
      EXPECT_TRUE(run_case(to_op_case(
          distill_case(std::string("distill_out") + std::to_string(int(what)) + red_name(red), cfg))));
    }
}

TEST(Distill, SmallAndOddVocabularies) {
  for (int64_t v = 1; v <= 7; ++v) {
    DistillCfg cfg;
    cfg.r.beta = v % 3 == 0 ? 0.0 : v % 3 == 1 ? 0.5 : 1.0;
    cfg.r.t = 2;
    cfg.r.w_hard = 0.5;
    cfg.v = v;
    EXPECT_TRUE(run_case(to_op_case(distill_case("distill_v" + std::to_string(v), cfg))));
  }
  for (double beta : {0.0, 0.5}) {
    DistillCfg cfg;
    cfg.r.beta = beta;
    cfg.r.w_hard = 0.5;
    cfg.n = 2;
    cfg.v = 1000;
    EXPECT_TRUE(run_case(to_op_case(distill_case("distill_v1000_" + std::to_string(int(beta * 10)), cfg))));
  }
}

TEST(Distill, LongRisingRows) {
  for (double beta : {0.0, 0.5, 1.0}) {
    DistillCfg cfg;
    cfg.r.beta = beta;
    cfg.r.t = 2;
    cfg.r.w_hard = 0.5;
    cfg.n = 1;
    cfg.v = 2600;
    LossCase c = distill_case("distill_long_rows_" + std::to_string(int(beta * 10)), cfg);
    c.inputs[0].values = rising(cfg.v);
    EXPECT_TRUE(run_loss_case(c));
  }
}

TEST(Distill, HugeLogitsStayFinite) {
  for (double beta : {0.0, 0.5, 1.0}) {
    DistillCfg cfg;
    cfg.r.beta = beta;
    cfg.r.t = 2;
    cfg.r.w_hard = 0.3;
    cfg.lo = -1e4;
    cfg.hi = 1e4;
    LossCase c = distill_case("distill_huge_" + std::to_string(int(beta * 10)), cfg);
    c.fwd_tol = 1e-9;
    c.grad_tol = 1e-6;
    EXPECT_TRUE(run_loss_case(c));
  }
}

TEST(Distill, TeacherWithMinusInfinityLogits) {
  // A teacher that rules tokens out (−inf logits, e.g. a padded vocabulary): forward KL and JSD stay finite.
  for (double beta : {0.0, 0.5}) {
    DistillCfg cfg;
    cfg.r.beta = beta;
    cfg.n = 2;
    cfg.v = 5;
    LossCase c = distill_case("distill_teacher_inf_" + std::to_string(int(beta * 10)), cfg);
    const double inf = std::numeric_limits<double>::infinity();
    c.inputs[1].values = {0.5, -inf, 1.0, -inf, -0.3, -inf, 2.0, 0.1, 0.7, -1.0};
    EXPECT_TRUE(run_loss_case(c));
  }
}

TEST(Distill, Bf16F16AndStridedLogits) {
  for (DType dt : {DType::BF16, DType::F16}) {
    DistillCfg cfg;
    cfg.r.beta = 0.5;
    cfg.r.t = 2;
    cfg.r.w_hard = 0.5;
    cfg.dt = dt;
    cfg.teacher_dt = dt;
    EXPECT_TRUE(run_case(to_op_case(distill_case(std::string("distill_") + dtype_name(dt), cfg))));
    cfg.transposed = true;
    cfg.r.beta = 1;
    EXPECT_TRUE(run_case(to_op_case(distill_case(std::string("distill_t_") + dtype_name(dt), cfg))));
  }
}

TEST(Distill, AllRowsIgnoredOneValidRowAndSinglePass) {
  for (int valid_row : {-1, 3}) {
    DistillCfg cfg;
    cfg.r.beta = 0.5;
    cfg.r.w_hard = 0.5;
    LossCase c = distill_case(valid_row < 0 ? "distill_all_ignored" : "distill_one_valid", cfg);
    Vec labels(size_t(cfg.n), -1.0);
    if (valid_row >= 0) labels[size_t(valid_row)] = 2;
    c.inputs[2].values = labels;
    c.unit_seed = true;
    EXPECT_TRUE(run_loss_case(c));
  }
  for (double beta : {0.0, 0.5, 1.0}) {
    DistillCfg cfg;
    cfg.r.beta = beta;
    cfg.r.t = 2;
    cfg.r.w_hard = 0.2;
    check_single_pass(distill_case("distill_single_" + std::to_string(int(beta * 10)), cfg));
  }
  for (const DivCase& d : div_cases()) {
    DistillCfg cfg;
    cfg.r.div = d.div;
    cfg.r.alpha = d.alpha;
    cfg.r.w_hard = 0.2;
    check_single_pass(distill_case(std::string("distill_single_") + d.name, cfg));
  }
}

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

// entropy's values and gradients are the case list of tests/ops/loss_cases_ce.cpp (test_loss_cases.cpp).

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
