// fused_linear_distill (student and online teacher lm-heads), fused_linear_entropy and
// fused_linear_selective_log_softmax: float64 references with finite-difference gradients, the unfused
// composition through the graph at every chunk size, edge cases and bad input.
#include <gtest/gtest.h>

#include <array>

#include "test_fused_linear_ref.h"

namespace retort::test {
namespace {

FusedLinearOptions chunked(int64_t rows) {
  FusedLinearOptions f;
  f.chunk_rows = rows;
  return f;
}

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

struct Cfg {
  DistillRef r;
  bool bias = true, teacher_bias = true, labels = true;
  int64_t n = 7, h = 4, ht = 6, v = 11, chunk = 3;
  DType dt = DType::F32, teacher_dt = DType::F32;
  Out what = Out::Loss;
};

// Inputs: hidden [n, h], weight [v, h], bias [v], teacher hidden [n, ht], teacher weight [v, ht], teacher
// bias [v] (constants), labels [n] in [-1, v) with ignore_index -1.
LossCase distill_case(const std::string& name, Cfg cfg) {
  cfg.r.ignore = -1;
  LossCase c;
  c.name = name;
  c.inputs = {hidden_in(cfg.n, cfg.h, cfg.dt, -2, 2),
              weight_in(cfg.v, cfg.h, cfg.dt),
              bias_in(cfg.v, cfg.dt),
              LossInput({cfg.n, cfg.ht}, cfg.teacher_dt, false, -2, 2),
              LossInput({cfg.v, cfg.ht}, cfg.teacher_dt, false, -1, 1),
              LossInput({cfg.v}, cfg.teacher_dt, false, -1, 1),
              LossInput({cfg.n}, DType::I32, false, -1, double(cfg.v))};
  c.inputs[2].param = cfg.bias;
  c.build = [cfg](Context& ctx, const std::vector<Tensor*>& in) {
    DistillOptions o = opts_of(cfg.r);
    o.return_per_row = cfg.what == Out::PerRow;
    o.return_lse = cfg.what == Out::Lse;
    o.return_parts = cfg.what == Out::Hard || cfg.what == Out::Soft;
    return pick(fused_linear_distill(ctx, in[0], in[1], cfg.bias ? in[2] : nullptr, in[3], in[4],
                                     cfg.teacher_bias ? in[5] : nullptr, cfg.labels ? in[6] : nullptr, o,
                                     chunked(cfg.chunk)),
                cfg.what);
  };
  c.reference = [cfg](const std::vector<Ref>& in) {
    return distill_ref(head_ref(in[0], in[1], cfg.bias ? &in[2] : nullptr),
                       head_ref(in[3], in[4], cfg.teacher_bias ? &in[5] : nullptr),
                       cfg.labels ? ints(in[6]) : std::vector<int64_t>{}, cfg.r, cfg.what);
  };
  c.fwd_tol = 1e-10;
  c.grad_tol = 1e-8;
  c.check_grad = cfg.what == Out::Loss;
  return c;
}

TEST(FusedLinearDistill, Grid) {
  int i = 0;
  for (double beta : {0.0, 0.5, 1.0})
    for (double t : {1.0, 2.0})
      for (double w_hard : {0.0, 0.3}) {
        Cfg cfg;
        cfg.r.beta = beta;
        cfg.r.t = t;
        cfg.r.w_hard = w_hard;
        cfg.r.red = std::array{Reduction::Mean, Reduction::Sum, Reduction::None}[size_t(i++ % 3)];
        cfg.labels = w_hard > 0 || i % 2 == 0;
        cfg.bias = i % 3 != 0;
        cfg.teacher_bias = i % 2 == 0;
        const std::string name = "fldist_b" + std::to_string(int(beta * 10)) + "_t" + std::to_string(int(t)) +
                                 (w_hard > 0 ? "_hard" : "") + (cfg.labels ? "_labels" : "") + "_" +
                                 red_name(cfg.r.red);
        EXPECT_TRUE(run_case(to_op_case(distill_case(name, cfg))));
      }
}

TEST(FusedLinearDistill, Divergences) {
  int i = 0;
  for (const DivCase& d : div_cases())
    for (double t : {1.0, 2.0}) {
      Cfg cfg;
      cfg.r.div = d.div;
      cfg.r.alpha = d.alpha;
      cfg.r.t = t;
      cfg.r.w_hard = t == 1.0 ? 0.3 : 0.0;
      cfg.r.red = std::array{Reduction::Mean, Reduction::Sum, Reduction::None}[size_t(i++ % 3)];
      cfg.labels = cfg.r.w_hard > 0 || i % 2 == 0;
      EXPECT_TRUE(run_case(to_op_case(distill_case(
          std::string("fldist_") + d.name + "_t" + std::to_string(int(t)) + "_" + red_name(cfg.r.red),
          cfg))));
    }
}

TEST(FusedLinearDistill, ExtraOutputsDtypesSinglePass) {
  for (Out what : {Out::PerRow, Out::Lse, Out::Hard, Out::Soft}) {
    Cfg cfg;
    cfg.r.w_hard = 0.5;
    cfg.r.t = 1.5;
    cfg.what = what;
    EXPECT_TRUE(run_case(to_op_case(distill_case("fldist_out" + std::to_string(int(what)), cfg))));
  }
  // A bf16 student and an f16 teacher, and a teacher of another width (Ht = 9 vs H = 4).
  Cfg cfg;
  cfg.dt = DType::BF16;
  cfg.teacher_dt = DType::F16;
  cfg.ht = 9;
  cfg.r.beta = 0.5;
  cfg.r.w_hard = 0.2;
  check_single_pass(distill_case("fldist_single", cfg));
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

TEST(FusedLinearEntropy, AgainstReference) {
  for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None})
    for (double t : {1.0, 0.7}) {
      LossCase c;
      c.name = std::string("flent_") + red_name(red) + std::to_string(int(t * 10));
      c.inputs = {hidden_in(7, 5, DType::F32, -2, 2), weight_in(13, 5), bias_in(13)};
      c.build = [red, t](Context& ctx, const std::vector<Tensor*>& in) {
        return fused_linear_entropy(ctx, in[0], in[1], in[2], float(t), red, chunked(3));
      };
      c.reference = [red, t](const std::vector<Ref>& in) {
        return entropy_ref(head_ref(in[0], in[1], &in[2]), t, red);
      };
      EXPECT_TRUE(run_case(to_op_case(c)));
      if (red != Reduction::None) check_single_pass(c);
    }
}

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

TEST(FusedLinearSelective, AgainstReference) {
  for (int64_t k : {int64_t(1), int64_t(3), int64_t(9)}) {
    LossCase c;
    c.name = "flsel_k" + std::to_string(k);
    c.inputs = {hidden_in(6, 4, DType::F32, -2, 2), weight_in(9, 4), bias_in(9),
                LossInput({6, k}, DType::I64, false, 0, 9)};
    c.build = [](Context& ctx, const std::vector<Tensor*>& in) {
      return fused_linear_selective_log_softmax(ctx, in[0], in[1], in[2], in[3], chunked(4));
    };
    c.reference = [k](const std::vector<Ref>& in) {
      return selective_ref(head_ref(in[0], in[1], &in[2]), ints(in[3]), k);
    };
    EXPECT_TRUE(run_case(to_op_case(c)));
  }
}

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
