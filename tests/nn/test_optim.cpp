// Optimizers against float64 hand-written references over several steps (AdamW with weight decay and bias
// correction, SGD with momentum), gradient clipping, the cosine schedule, and bad options.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numbers>

#include "expect_error.h"
#include "harness.h"

namespace retort::test {
namespace {

std::vector<float> to_f32(const Vec& v) {
  return std::vector<float>(v.begin(), v.end());
}

// Two parameters whose gradients are whatever the caller puts in the inputs c1, c2:
// loss = sum(p1 * c1) + sum(p2 * c2), so grad(p_i) = c_i.
struct Problem {
  explicit Problem(DType dt = DType::F32) : ctx(default_cpu_backend()), g(ctx) {
    p1 = ctx.param(dt, {3, 5}, "p1");
    p2 = ctx.param(dt, {7}, "p2");
    c1 = ctx.input(DType::F32, {3, 5}, "c1");
    c2 = ctx.input(DType::F32, {7}, "c2");
    set_data(p1, to_f32(random_vec(15, -1, 1)));
    set_data(p2, to_f32(random_vec(7, -1, 1)));
    g.backward(add(ctx, sum(ctx, mul(ctx, p1, c1)), sum(ctx, mul(ctx, p2, c2))));
  }
  // Sets the next gradients (fresh random values, or the given ones) and computes them.
  void gradients(double scale = 1.0) {
    set_data(c1, to_f32(random_vec(15, -scale, scale)));
    set_data(c2, to_f32(random_vec(7, -scale, scale)));
    g.zero_grad();
    g.compute();
  }
  std::vector<Tensor*> params() { return {p1, p2}; }
  Context ctx;
  Graph g;
  Tensor *p1, *p2, *c1, *c2;
};

// Float64 AdamW state of one parameter.
struct RefAdamW {
  Vec p, m, v;
  void step(const Vec& g, const AdamWConfig& c, double lr, int64_t t) {
    if (m.empty()) m.assign(p.size(), 0.0), v.assign(p.size(), 0.0);
    const double bc1 = 1 - std::pow(double(c.beta1), double(t));
    const double bc2 = 1 - std::pow(double(c.beta2), double(t));
    for (size_t i = 0; i < p.size(); ++i) {
      m[i] = c.beta1 * m[i] + (1 - double(c.beta1)) * g[i];
      v[i] = c.beta2 * v[i] + (1 - double(c.beta2)) * g[i] * g[i];
      p[i] *= 1 - lr * c.weight_decay;  // decoupled: the decay never passes through the moments
      p[i] -= lr * (m[i] / bc1) / (std::sqrt(v[i] / bc2) + c.eps);
    }
  }
};

TEST(AdamW, MatchesFloat64ReferenceOverSeveralSteps) {
  reseed("adamw_ref");
  Problem pb;
  AdamWConfig cfg;
  cfg.lr = 0.05f;
  cfg.beta1 = 0.8f;
  cfg.beta2 = 0.95f;
  cfg.eps = 1e-6f;
  cfg.weight_decay = 0.1f;
  AdamW opt(pb.params(), cfg);
  RefAdamW ref[2] = {{to_f64(get_data(pb.p1)), {}, {}}, {to_f64(get_data(pb.p2)), {}, {}}};
  for (int t = 1; t <= 8; ++t) {
    pb.gradients(t % 3 == 0 ? 10.0 : 0.5);  // gradients of changing scale exercise the second moment
    for (int i = 0; i < 2; ++i)
      ref[i].step(to_f64(get_data(pb.g.grad(pb.params()[size_t(i)]))), cfg, cfg.lr, t);
    opt.step(pb.g);
    EXPECT_EQ(opt.steps(), t);
    for (int i = 0; i < 2; ++i) {
      Vec got = to_f64(get_data(pb.params()[size_t(i)]));
      EXPECT_LE(max_abs_diff(got, ref[i].p), 2e-6) << "step " << t << " param " << i;
      EXPECT_LE(max_abs_diff(to_f64(get_data(opt.m()[size_t(i)])), ref[i].m), 1e-5) << "m, step " << t;
      EXPECT_LE(max_abs_diff(to_f64(get_data(opt.v()[size_t(i)])), ref[i].v), 1e-4) << "v, step " << t;
    }
  }
}

TEST(AdamW, FirstStepMovesEachWeightByLrThanksToBiasCorrection) {
  // Step 1 with no weight decay: m̂ = g and v̂ = g², so every weight moves by lr * sign(g) (eps aside).
  // Without bias correction the move would be lr * (1 - beta1) / sqrt(1 - beta2), about 0.32 lr.
  reseed("adamw_bias");
  Problem pb;
  AdamWConfig cfg;
  cfg.lr = 0.01f;
  cfg.weight_decay = 0;
  cfg.eps = 1e-10f;
  AdamW opt(pb.params(), cfg);
  auto before = get_data(pb.p1);
  pb.gradients();
  auto g = get_data(pb.g.grad(pb.p1));
  opt.step(pb.g);
  auto after = get_data(pb.p1);
  for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(before[i] - after[i], 0.01 * (g[i] > 0 ? 1 : -1), 2e-7);
}

TEST(AdamW, WeightDecayIsDecoupled) {
  // A zero gradient leaves the moments at zero: the only change is p *= 1 - lr * wd. (Coupled L2 decay would
  // push wd * p through the moments and move each weight by about lr.)
  Problem pb;
  set_data(pb.p2, {1, -2, 3, -4, 0.5f, 0, 8});
  AdamWConfig cfg;
  cfg.lr = 0.1f;
  cfg.weight_decay = 0.5f;
  AdamW opt(pb.params(), cfg);
  set_data(pb.c1, std::vector<float>(15, 0.0f));
  set_data(pb.c2, std::vector<float>(7, 0.0f));
  pb.g.zero_grad();
  pb.g.compute();
  opt.step(pb.g);
  auto p = get_data(pb.p2);
  const float want[] = {1, -2, 3, -4, 0.5f, 0, 8};
  for (size_t i = 0; i < 7; ++i) EXPECT_FLOAT_EQ(p[i], want[i] * 0.95f);
}

TEST(AdamW, LearningRateOverrideAndStepCounter) {
  reseed("adamw_lr");
  Problem pb;
  AdamWConfig cfg;
  cfg.lr = 1.0f;  // never used: every step passes its own
  cfg.weight_decay = 0.05f;
  AdamW opt(pb.params(), cfg);
  opt.set_steps(10);  // resuming: bias correction continues from step 11
  RefAdamW ref{to_f64(get_data(pb.p2)), {}, {}};
  for (int t = 11; t <= 14; ++t) {
    double lr = cosine_lr(t, 2, 20, 0.02f, 0.001f);
    pb.gradients();
    ref.step(to_f64(get_data(pb.g.grad(pb.p2))), cfg, float(lr), t);
    opt.step(pb.g, float(lr));
  }
  EXPECT_EQ(opt.steps(), 14);
  EXPECT_LE(max_abs_diff(to_f64(get_data(pb.p2)), ref.p), 2e-6);
}

TEST(AdamW, StateIsF32ZerosOnTheParametersBackend) {
  Problem pb(DType::BF16);
  AdamW opt(pb.params(), AdamWConfig{});
  ASSERT_EQ(opt.m().size(), 2u);
  ASSERT_EQ(opt.v().size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    for (const Tensor* s : {opt.m()[i], opt.v()[i]}) {
      EXPECT_EQ(s->dtype, DType::F32);
      EXPECT_TRUE(same_shape(s, pb.params()[i]));
      EXPECT_EQ(&s->backend(), &pb.params()[i]->backend());
      EXPECT_NE(s->ctx, &pb.ctx) << "state lives in the optimizer's own context";
      for (float f : get_data(s)) EXPECT_EQ(f, 0.0f);
    }
  }
}

TEST(AdamW, Bf16ParametersFollowTheReferenceToBf16Rounding) {
  reseed("adamw_bf16");
  Problem pb(DType::BF16);
  AdamWConfig cfg;
  cfg.lr = 0.03f;
  AdamW opt(pb.params(), cfg);
  RefAdamW ref{to_f64(get_data(pb.p1)), {}, {}};
  for (int t = 1; t <= 5; ++t) {
    pb.gradients();
    ref.step(to_f64(get_data(pb.g.grad(pb.p1))), cfg, cfg.lr, t);
    opt.step(pb.g);
    // The parameter is rounded to bf16 after every step; the reference follows the rounded values.
    Vec got = to_f64(get_data(pb.p1));
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], ref.p[i], std::abs(ref.p[i]) * 0.008 + 1e-6);
    ref.p = got;
  }
}

TEST(AdamW, ParameterWithoutGradientIsLeftAlone) {
  reseed("adamw_skip");
  Context ctx(default_cpu_backend());
  Tensor* used = ctx.param(DType::F32, {4}, "used");
  Tensor* unused = ctx.param(DType::F32, {4}, "unused");
  set_data(used, {1, 2, 3, 4});
  set_data(unused, {5, 6, 7, 8});
  Graph g(ctx);
  g.backward(sum(ctx, mul(ctx, used, used)));
  g.compute();
  AdamW opt({used, unused}, AdamWConfig{});
  opt.step(g);
  EXPECT_EQ(get_data(unused), (std::vector<float>{5, 6, 7, 8}));
  EXPECT_NE(get_data(used), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(opt.steps(), 1);
}

TEST(AdamW, ConvergesOnAQuadratic) {
  reseed("adamw_quad");
  Context ctx(default_cpu_backend());
  Tensor* p = ctx.param(DType::F32, {10}, "p");
  Tensor* target = ctx.input(DType::F32, {10}, "target");
  Vec tv = random_vec(10, -3, 3);
  set_data(target, to_f32(tv));
  Tensor* d = sub(ctx, p, target);
  Tensor* loss = sum(ctx, mul(ctx, d, d));
  loss->flags |= kOutput;
  Graph g(ctx);
  g.backward(loss);
  AdamWConfig cfg;
  cfg.lr = 0.1f;
  cfg.weight_decay = 0;
  AdamW opt({p}, cfg);
  for (int s = 0; s < 400; ++s) {
    g.zero_grad();
    g.compute();
    opt.step(g, cosine_lr(s, 10, 400, 0.1f, 0.001f));
  }
  EXPECT_LE(max_abs_diff(to_f64(get_data(p)), tv), 1e-3);
}

// ---- SGD --------------------------------------------------------------------------------------------------

TEST(Sgd, MatchesFloat64Reference) {
  struct Case {
    float lr, momentum, wd;
  };
  for (Case k :
       {Case{0.1f, 0.0f, 0.0f}, Case{0.05f, 0.9f, 0.0f}, Case{0.05f, 0.0f, 0.2f}, Case{0.02f, 0.5f, 0.1f}}) {
    SCOPED_TRACE(testing::Message() << "lr " << k.lr << " momentum " << k.momentum << " wd " << k.wd);
    reseed("sgd_ref");
    Problem pb;
    Sgd opt(pb.params(), SgdConfig{k.lr, k.momentum, k.wd});
    Vec p = to_f64(get_data(pb.p1)), buf(p.size(), 0.0);
    for (int t = 1; t <= 6; ++t) {
      pb.gradients();
      Vec gr = to_f64(get_data(pb.g.grad(pb.p1)));
      for (size_t i = 0; i < p.size(); ++i) {
        double d = gr[i] + double(k.wd) * p[i];
        buf[i] = k.momentum * buf[i] + d;
        p[i] -= k.lr * buf[i];
      }
      opt.step(pb.g);
      EXPECT_LE(max_abs_diff(to_f64(get_data(pb.p1)), p), 1e-6) << "step " << t;
    }
  }
}

TEST(Sgd, LearningRateOverride) {
  reseed("sgd_lr");
  Problem pb;
  Sgd opt(pb.params(), SgdConfig{});
  auto before = get_data(pb.p2);
  pb.gradients();
  auto g = get_data(pb.g.grad(pb.p2));
  opt.step(pb.g, 0.25f);
  auto after = get_data(pb.p2);
  for (size_t i = 0; i < g.size(); ++i) EXPECT_FLOAT_EQ(after[i], before[i] - 0.25f * g[i]);
}

// ---- clip_grad_norm ---------------------------------------------------------------------------------------

double global_norm(Problem& pb) {
  double s = 0;
  for (Tensor* p : pb.params())
    for (float f : get_data(pb.g.grad(p))) s += double(f) * f;
  return std::sqrt(s);
}

TEST(ClipGradNorm, ReturnsTheNormAndLeavesSmallGradientsAlone) {
  reseed("clip_small");
  Problem pb;
  pb.gradients();
  double norm = global_norm(pb);
  auto g1 = get_data(pb.g.grad(pb.p1));
  EXPECT_NEAR(clip_grad_norm(pb.g, norm * 1.5), norm, norm * 1e-12);
  EXPECT_EQ(get_data(pb.g.grad(pb.p1)), g1);
}

TEST(ClipGradNorm, ScalesLargeGradientsToMaxNorm) {
  reseed("clip_large");
  Problem pb;
  pb.gradients(5.0);
  double norm = global_norm(pb);
  auto g1 = get_data(pb.g.grad(pb.p1));
  auto g2 = get_data(pb.g.grad(pb.p2));
  EXPECT_NEAR(clip_grad_norm(pb.g, 1.0), norm, norm * 1e-12);
  EXPECT_NEAR(global_norm(pb), 1.0, 1e-6);
  // One factor for every parameter: the direction is kept.
  auto h1 = get_data(pb.g.grad(pb.p1));
  auto h2 = get_data(pb.g.grad(pb.p2));
  for (size_t i = 0; i < g1.size(); ++i) EXPECT_NEAR(h1[i], g1[i] / norm, 1e-6);
  for (size_t i = 0; i < g2.size(); ++i) EXPECT_NEAR(h2[i], g2[i] / norm, 1e-6);
}

TEST(ClipGradNorm, NonFiniteNormIsReportedAndNothingIsScaled) {
  Problem pb;
  std::vector<float> c(15, 1.0f);
  c[3] = std::numeric_limits<float>::infinity();
  set_data(pb.c1, c);
  set_data(pb.c2, std::vector<float>(7, 2.0f));
  pb.g.zero_grad();
  pb.g.compute();
  EXPECT_TRUE(std::isinf(clip_grad_norm(pb.g, 1.0)));
  EXPECT_EQ(get_data(pb.g.grad(pb.p2)), std::vector<float>(7, 2.0f));
}

TEST(ClipGradNorm, BadMaxNormThrows) {
  Problem pb;
  for (double bad : {0.0, -1.0, std::nan(""), std::numeric_limits<double>::infinity()})
    expect_error([&] { clip_grad_norm(pb.g, bad); }, {"clip_grad_norm", "max_norm"});
}

// ---- cosine_lr --------------------------------------------------------------------------------------------

TEST(CosineLr, WarmupThenCosine) {
  const float mx = 1e-3f, mn = 1e-4f;
  EXPECT_FLOAT_EQ(cosine_lr(0, 10, 110, mx, mn), 0.0f);
  EXPECT_FLOAT_EQ(cosine_lr(5, 10, 110, mx, mn), 5e-4f);
  EXPECT_FLOAT_EQ(cosine_lr(9, 10, 110, mx, mn), 9e-4f);
  EXPECT_FLOAT_EQ(cosine_lr(10, 10, 110, mx, mn), mx);
  EXPECT_FLOAT_EQ(cosine_lr(60, 10, 110, mx, mn), 0.5f * (mx + mn));  // halfway down
  const double quarter = mn + 0.5 * (mx - mn) * (1 + std::cos(std::numbers::pi / 4));
  EXPECT_FLOAT_EQ(cosine_lr(35, 10, 110, mx, mn), float(quarter));
  EXPECT_FLOAT_EQ(cosine_lr(110, 10, 110, mx, mn), mn);
  EXPECT_FLOAT_EQ(cosine_lr(1000, 10, 110, mx, mn), mn);
  // Up during warmup, down after, never outside [0, lr_max].
  for (int64_t s = 1; s <= 120; ++s) {
    float a = cosine_lr(s - 1, 10, 110, mx, mn), b = cosine_lr(s, 10, 110, mx, mn);
    if (s <= 10) {
      EXPECT_GT(b, a) << s;
    } else {
      EXPECT_LE(b, a) << s;
    }
    EXPECT_GE(b, 0.0f);
    EXPECT_LE(b, mx);
  }
}

TEST(CosineLr, EdgeSchedules) {
  EXPECT_FLOAT_EQ(cosine_lr(0, 0, 100, 1.0f), 1.0f);  // no warmup: starts at the top
  EXPECT_FLOAT_EQ(cosine_lr(50, 0, 100, 1.0f), 0.5f);
  EXPECT_FLOAT_EQ(cosine_lr(100, 0, 100, 1.0f), 0.0f);    // lr_min defaults to 0
  EXPECT_FLOAT_EQ(cosine_lr(3, 4, 4, 2.0f, 0.5f), 1.5f);  // warmup only
  EXPECT_FLOAT_EQ(cosine_lr(4, 4, 4, 2.0f, 0.5f), 0.5f);
  EXPECT_FLOAT_EQ(cosine_lr(7, 10, 100, 0.3f, 0.3f), 0.21f);  // constant after warmup
  EXPECT_FLOAT_EQ(cosine_lr(70, 10, 100, 0.3f, 0.3f), 0.3f);
}

TEST(CosineLr, BadArgumentsThrow) {
  expect_error([] { cosine_lr(-1, 10, 100, 1.0f); }, {"cosine_lr", "step"});
  expect_error([] { cosine_lr(0, -1, 100, 1.0f); }, {"cosine_lr", "warmup"});
  expect_error([] { cosine_lr(0, 101, 100, 1.0f); }, {"cosine_lr", "warmup = 101", "total = 100"});
  expect_error([] { cosine_lr(0, 0, 0, 1.0f); }, {"cosine_lr", "total"});
  expect_error([] { cosine_lr(0, 1, 10, 1.0f, 2.0f); }, {"cosine_lr", "lr_min"});
  expect_error([] { cosine_lr(0, 1, 10, -1.0f, -2.0f); }, {"cosine_lr", "lr_min"});
  expect_error([] { cosine_lr(0, 1, 10, std::nanf("")); }, {"cosine_lr", "lr_max"});
}

// ---- bad options and parameters ---------------------------------------------------------------------------

TEST(OptimizerOptions, BadAdamWOptionsThrow) {
  Problem pb;
  auto with = [&](auto set) {
    AdamWConfig c;
    set(c);
    return [&pb, c] { AdamW opt(pb.params(), c); };
  };
  const float nan = std::nanf("");
  expect_error(with([](AdamWConfig& c) { c.lr = -1e-3f; }), {"AdamW", "lr"});
  expect_error(with([&](AdamWConfig& c) { c.lr = nan; }), {"AdamW", "lr"});
  expect_error(with([](AdamWConfig& c) { c.beta1 = 1.0f; }), {"AdamW", "beta1", "[0, 1)"});
  expect_error(with([](AdamWConfig& c) { c.beta1 = -0.1f; }), {"AdamW", "beta1"});
  expect_error(with([](AdamWConfig& c) { c.beta2 = 1.5f; }), {"AdamW", "beta2"});
  expect_error(with([&](AdamWConfig& c) { c.beta2 = nan; }), {"AdamW", "beta2"});
  expect_error(with([](AdamWConfig& c) { c.eps = 0.0f; }), {"AdamW", "eps", "> 0"});
  expect_error(with([](AdamWConfig& c) { c.weight_decay = -0.01f; }), {"AdamW", "weight_decay"});
  // The boundary values that are allowed.
  AdamWConfig ok;
  ok.lr = 0;
  ok.beta1 = 0;
  ok.beta2 = 0;
  ok.weight_decay = 0;
  EXPECT_NO_THROW(AdamW(pb.params(), ok));
}

TEST(OptimizerOptions, BadSgdOptionsThrow) {
  Problem pb;
  expect_error([&] { Sgd(pb.params(), SgdConfig{-0.1f, 0.0f, 0.0f}); }, {"SGD", "lr"});
  expect_error([&] { Sgd(pb.params(), SgdConfig{0.1f, 1.0f, 0.0f}); }, {"SGD", "momentum", "[0, 1)"});
  expect_error([&] { Sgd(pb.params(), SgdConfig{0.1f, -0.5f, 0.0f}); }, {"SGD", "momentum"});
  expect_error([&] { Sgd(pb.params(), SgdConfig{0.1f, 0.0f, -1.0f}); }, {"SGD", "weight_decay"});
  expect_error([&] { Sgd(pb.params(), SgdConfig{std::nanf(""), 0.0f, 0.0f}); }, {"SGD", "lr"});
}

TEST(OptimizerOptions, BadParameterListsThrow) {
  Problem pb;
  Tensor* plain = pb.ctx.tensor(DType::F32, {3}, "plain");
  expect_error([&] { AdamW({}, AdamWConfig{}); }, {"AdamW", "no parameters"});
  expect_error([&] { Sgd({}, SgdConfig{}); }, {"SGD", "no parameters"});
  expect_error([&] { AdamW({pb.p1, nullptr}, AdamWConfig{}); }, {"AdamW", "parameter 1 is null"});
  expect_error([&] { AdamW({plain}, AdamWConfig{}); }, {"AdamW", "'plain'", "Context::param"});
  expect_error([&] { Sgd({pb.p1, pb.p2, pb.p1}, SgdConfig{}); }, {"SGD", "'p1'", "twice"});
  CpuBackend other(1);
  Context elsewhere(other);
  Tensor* q = elsewhere.param(DType::F32, {2}, "q");
  expect_error([&] { AdamW({pb.p1, q}, AdamWConfig{}); }, {"AdamW", "'q'", "backend"});
}

TEST(OptimizerOptions, NaNStepLearningRateThrows) {
  Problem pb;
  pb.gradients();
  AdamW adam(pb.params(), AdamWConfig{});
  Sgd sgd(pb.params(), SgdConfig{});
  auto before = get_data(pb.p1);
  expect_error([&] { adam.step(pb.g, std::nanf("")); }, {"AdamW", "NaN"});
  expect_error([&] { sgd.step(pb.g, std::nanf("")); }, {"SGD", "NaN"});
  EXPECT_EQ(get_data(pb.p1), before);
  EXPECT_EQ(adam.steps(), 0);
}

TEST(AdamW, SetStepsRefusesANegativeCount) {
  reseed("adamw_set_steps");
  Problem pb;
  AdamW opt(pb.params(), AdamWConfig{});
  expect_error([&] { opt.set_steps(-5); }, {"set_steps", "-5"});
  EXPECT_EQ(opt.steps(), 0);
  opt.set_steps(7);
  EXPECT_EQ(opt.steps(), 7);
}

// A non-finite gradient is named with its parameter, element and value; finite ones pass silently, and the
// global norm shows the fault instead of hiding it.
TEST(Gradients, FirstNonFiniteValueIsNamed) {
  reseed("finite_gradients");
  Problem pb;
  pb.gradients();
  check_finite_gradients(pb.g, "here");
  EXPECT_TRUE(std::isfinite(grad_norm(pb.g)));
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    std::vector<float> c2 = to_f32(random_vec(7, -1, 1));
    c2[4] = bad;
    c2[6] = bad;
    set_data(pb.c1, to_f32(random_vec(15, -1, 1)));
    set_data(pb.c2, c2);
    pb.g.zero_grad();
    pb.g.compute();
    EXPECT_FALSE(std::isfinite(grad_norm(pb.g)));
    expect_error([&] { check_finite_gradients(pb.g, "step 12"); },
                 {"step 12", "'p2'", "at element 4", std::isnan(bad) ? "nan" : "inf"});
  }
}

}  // namespace
}  // namespace retort::test
