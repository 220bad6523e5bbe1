// The multi-tensor optimizer ops (src/ops/optim_ops.h) against the per-parameter update the backends ran
// before them, written out here expression for expression: on the CPU the same bits, with and without
// clipping, for AdamW and SGD (with and without momentum), f32 and bf16 parameters. Then what the fused step
// adds: the clip and the non-finite check on the device, the skip of a bad step, a norm that does not
// depend on the thread count, and no host wait until the caller reads the stats.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "expect_error.h"
#include "harness.h"

namespace retort::test {
namespace {

// "p3": built by appending (GCC 12 warns falsely on "p" + std::string).
std::string name(const char* prefix, size_t i) {
  std::string s = prefix;
  s += std::to_string(i);
  return s;
}

std::vector<float> to_f32(const Vec& v) {
  return std::vector<float>(v.begin(), v.end());
}

// Parameters of the given sizes and dtypes whose gradients are inputs: loss = Σ_i sum(p_i · c_i) + sum(x),
// so grad(p_i) = c_i, and x (not a parameter) can make the loss NaN while every gradient stays finite.
struct Multi {
  Multi(Backend& be, const std::vector<std::pair<int64_t, DType>>& sizes) : ctx(be), g(ctx) {
    Tensor* loss = nullptr;
    for (size_t i = 0; i < sizes.size(); ++i) {
      const auto [n, dt] = sizes[i];
      Tensor* p = ctx.param(dt, {n}, name("p", i));
      Tensor* c = ctx.input(DType::F32, {n}, name("c", i));
      set_data(p, to_f32(random_vec(n, -1, 1)));
      Tensor* term = sum(ctx, mul(ctx, p, c));
      loss = loss ? add(ctx, loss, term) : term;
      ps.push_back(p);
      cs.push_back(c);
    }
    x = ctx.input(DType::F32, {1}, "x");
    loss = add(ctx, loss, sum(ctx, x));
    loss->flags |= kOutput;
    this->loss = loss;
    g.backward(loss);
  }
  // Fresh gradients in [-scale, scale] (x = 0), then the graph's forward and backward.
  void gradients(double scale) {
    for (Tensor* c : cs) set_data(c, to_f32(random_vec(c->nelements(), -scale, scale)));
    set_data(x, {0.0f});
    g.zero_grad();
    g.compute();
  }
  Context ctx;
  Graph g;
  std::vector<Tensor*> ps, cs;
  Tensor *x = nullptr, *loss = nullptr;
};

// The update of one parameter as the backends ran it before the multi-tensor ops, on the parameter's bytes
// (so bf16 rounding is the same), with the gradient clipped in place first like clip_grad_norm did.
struct RefState {
  std::vector<uint8_t> p;
  DType dt;
  std::vector<float> m, v;
};

void ref_adamw(RefState& s, std::vector<float> g, const AdamWConfig& c, float lr, int64_t t) {
  if (s.m.empty()) s.m.assign(g.size(), 0.0f), s.v.assign(g.size(), 0.0f);
  const double bc1 = 1.0 - std::pow(double(c.beta1), double(t));
  const double bc2 = 1.0 - std::pow(double(c.beta2), double(t));
  const float step_size = float(lr / bc1);
  const float inv_sqrt_bc2 = float(1.0 / std::sqrt(bc2));
  const float decay = 1.0f - lr * c.weight_decay;
  for (size_t i = 0; i < g.size(); ++i) {
    s.m[i] = c.beta1 * s.m[i] + (1.0f - c.beta1) * g[i];
    s.v[i] = c.beta2 * s.v[i] + (1.0f - c.beta2) * g[i] * g[i];
    float w = load_f32(s.p.data(), s.dt, int64_t(i)) * decay;
    w -= step_size * s.m[i] / (std::sqrt(s.v[i]) * inv_sqrt_bc2 + c.eps);
    store_f32(s.p.data(), s.dt, int64_t(i), w);
  }
}

void ref_sgd(RefState& s, const std::vector<float>& g, const SgdConfig& c, float lr) {
  if (s.m.empty() && c.momentum > 0) s.m.assign(g.size(), 0.0f);
  for (size_t i = 0; i < g.size(); ++i) {
    const float w = load_f32(s.p.data(), s.dt, int64_t(i));
    float d = g[i] + c.weight_decay * w;
    if (c.momentum > 0) d = s.m[i] = c.momentum * s.m[i] + d;
    store_f32(s.p.data(), s.dt, int64_t(i), w - lr * d);
  }
}

// The old clip_grad_norm: per-parameter sums of squares in double, added in parameter order; the gradients
// scaled in place by float(max_norm / norm) when the norm is above max_norm. Returns the norm.
double ref_clip(std::vector<std::vector<float>>& grads, double max_norm) {
  double total = 0;
  for (const auto& g : grads) {
    double s = 0;
    for (float f : g) s += double(f) * f;
    total += s;
  }
  const double norm = std::sqrt(total);
  if (max_norm > 0 && std::isfinite(norm) && norm > max_norm)
    for (auto& g : grads)
      for (float& f : g) f *= float(max_norm / norm);
  return norm;
}

std::vector<RefState> ref_states(const Multi& pb) {
  std::vector<RefState> out;
  for (const Tensor* p : pb.ps) out.push_back({get_bytes(p), p->dtype, {}, {}});
  return out;
}

std::vector<std::vector<float>> grads_of(const Multi& pb) {
  std::vector<std::vector<float>> out;
  for (const Tensor* p : pb.ps) out.push_back(get_data(pb.g.grad(p)));
  return out;
}

const std::vector<std::pair<int64_t, DType>> kSmall = {
    {15, DType::F32}, {7, DType::F32}, {300, DType::BF16}, {1000, DType::F32}};

// AdamW now (step) and inside the graph (append_step, clipped or not) equals the per-parameter update bit
// for bit: the same f32 expressions, the clip factor applied as the gradient is read instead of in place
// (g · s rounds the same either way), and the norm summed in the same order (each parameter is one chunk).
TEST(FusedOptimizer, AdamWEqualsThePerParameterUpdateBitForBit) {
  AdamWConfig cfg;
  cfg.lr = 0.05f;
  cfg.beta1 = 0.8f;
  cfg.beta2 = 0.95f;
  cfg.eps = 1e-6f;
  cfg.weight_decay = 0.1f;
  for (double clip : {-1.0, 0.0, 0.5, 1e6}) {  // -1: step(); 0: append_step without clipping
    SCOPED_TRACE(testing::Message() << "clip " << clip);
    reseed("fused_adamw");
    Multi pb(default_cpu_backend(), kSmall);
    AdamW opt(pb.ps, cfg);
    Tensor* stats = clip >= 0 ? opt.append_step(pb.g, pb.loss, clip) : nullptr;
    std::vector<RefState> ref = ref_states(pb);
    bool clipped = false;
    for (int t = 1; t <= 5; ++t) {
      const float lr = cosine_lr(t, 1, 5, cfg.lr, 0.01f);
      if (stats) {
        opt.begin_step(lr);
        pb.gradients(t % 2 ? 2.0 : 0.1);
        const std::vector<float> s = get_data(stats);
        opt.end_step(s[kStatOk] != 0);
        std::vector<std::vector<float>> g = grads_of(pb);
        const double norm = ref_clip(g, clip);
        EXPECT_EQ(s[kStatNorm], float(norm));
        EXPECT_EQ(s[kStatScale], clip > 0 && norm > clip ? float(clip / norm) : 1.0f);
        EXPECT_EQ(s[kStatOk], 1.0f);
        EXPECT_EQ(s[kStatLoss], get_data(pb.loss)[0]);
        clipped = clipped || s[kStatScale] != 1.0f;
        for (size_t i = 0; i < ref.size(); ++i) ref_adamw(ref[i], g[i], cfg, lr, t);
      } else {
        pb.gradients(t % 2 ? 2.0 : 0.1);
        const std::vector<std::vector<float>> g = grads_of(pb);
        opt.step(pb.g, lr);
        for (size_t i = 0; i < ref.size(); ++i) ref_adamw(ref[i], g[i], cfg, lr, t);
      }
      EXPECT_EQ(opt.steps(), t);
      for (size_t i = 0; i < ref.size(); ++i) {
        EXPECT_EQ(get_bytes(pb.ps[i]), ref[i].p) << "parameter " << i << ", step " << t;
        EXPECT_EQ(get_data(opt.m()[i]), ref[i].m) << "m " << i << ", step " << t;
        EXPECT_EQ(get_data(opt.v()[i]), ref[i].v) << "v " << i << ", step " << t;
      }
    }
    EXPECT_EQ(clipped, clip == 0.5) << "the clip cases must clip, the others must not";
  }
}

TEST(FusedOptimizer, SgdEqualsThePerParameterUpdateBitForBit) {
  for (float momentum : {0.0f, 0.9f})
    for (double clip : {-1.0, 0.3}) {
      SCOPED_TRACE(testing::Message() << "momentum " << momentum << " clip " << clip);
      reseed("fused_sgd");
      Multi pb(default_cpu_backend(), kSmall);
      const SgdConfig cfg{0.05f, momentum, 0.02f};
      Sgd opt(pb.ps, cfg);
      Tensor* stats = clip >= 0 ? opt.append_step(pb.g, nullptr, clip) : nullptr;
      std::vector<RefState> ref = ref_states(pb);
      for (int t = 1; t <= 4; ++t) {
        if (stats) opt.begin_step(-1.0f);
        pb.gradients(1.0);
        std::vector<std::vector<float>> g = grads_of(pb);
        if (stats) {
          ref_clip(g, clip);
          opt.end_step(get_data(stats)[kStatOk] != 0);
        } else {
          opt.step(pb.g);
        }
        for (size_t i = 0; i < ref.size(); ++i) ref_sgd(ref[i], g[i], cfg, cfg.lr);
        for (size_t i = 0; i < ref.size(); ++i)
          EXPECT_EQ(get_bytes(pb.ps[i]), ref[i].p) << "parameter " << i << ", step " << t;
      }
      EXPECT_EQ(opt.steps(), 4);
    }
}

// A parameter of several chunks: the norm is summed chunk by chunk (its association differs from one serial
// sum, so equal to 1e-13 relative, not bit for bit) and does not depend on the number of threads: 1 and 3
// threads give the same bits.
TEST(FusedOptimizer, ManyChunksNormIsCloseToSerialAndIndependentOfThreads) {
  const std::vector<std::pair<int64_t, DType>> sizes = {{3 * kOptChunk + 5, DType::F32}, {9, DType::F32}};
  std::vector<std::vector<uint8_t>> results;
  for (int threads : {1, 3}) {
    reseed("fused_chunks");
    CpuBackend be(threads);
    Multi pb(be, sizes);
    AdamWConfig cfg;
    cfg.lr = 0.01f;
    AdamW opt(pb.ps, cfg);
    Tensor* stats = opt.append_step(pb.g, pb.loss, 1.0);
    std::vector<RefState> ref = ref_states(pb);
    opt.begin_step(-1.0f);
    pb.gradients(1.0);
    const std::vector<float> s = get_data(stats);
    opt.end_step(s[kStatOk] != 0);
    std::vector<std::vector<float>> g = grads_of(pb);
    const double norm = ref_clip(g, 1.0);
    EXPECT_NEAR(s[kStatNorm], norm, norm * 1e-7);  // a float of the norm
    EXPECT_NEAR(grad_norm(pb.g), norm, norm * 1e-13);
    EXPECT_LT(s[kStatScale], 1.0f);
    for (size_t i = 0; i < ref.size(); ++i) {
      ref_adamw(ref[i], g[i], cfg, cfg.lr, 1);
      Vec got = to_f64(get_data(pb.ps[i]));
      std::vector<float> want(got.size());
      for (size_t j = 0; j < want.size(); ++j) want[j] = load_f32(ref[i].p.data(), ref[i].dt, int64_t(j));
      EXPECT_LE(max_abs_diff(got, to_f64(want)), 1e-6) << "parameter " << i;
    }
    results.push_back(get_bytes(pb.ps[0]));
  }
  EXPECT_EQ(results[0], results[1]) << "the update must not depend on the thread count";
}

// A finite loss with an infinite gradient (sqrt at 0), and a NaN loss with finite gradients: the device
// skips the whole update (parameters, moments, step count untouched) and says so in the stats; the next good
// step is step 1 again.
TEST(FusedOptimizer, NonFiniteLossOrGradientSkipsTheStep) {
  reseed("fused_nonfinite");
  Context ctx(default_cpu_backend());
  Tensor* p = ctx.param(DType::F32, {4}, "p");
  Tensor* q = ctx.param(DType::F32, {3}, "q");
  Tensor* x = ctx.input(DType::F32, {1}, "x");
  set_data(p, {0.5f, -1, 2, 0.25f});
  Tensor* loss = add(ctx, add(ctx, sum(ctx, mul(ctx, p, p)), sum(ctx, sqrt(ctx, q))), sum(ctx, x));
  loss->flags |= kOutput;
  Graph g(ctx);
  g.backward(loss);
  AdamW opt({p, q}, AdamWConfig{});
  Tensor* stats = opt.append_step(g, loss, 1.0);
  auto run = [&](std::vector<float> qv, float xv) {
    set_data(q, qv);
    set_data(x, {xv});
    opt.begin_step(0.1f);
    g.zero_grad();
    g.compute();
    const std::vector<float> s = get_data(stats);
    opt.end_step(s[kStatOk] != 0);
    return s;
  };
  const auto before = get_bytes(p);
  std::vector<float> s = run({1, 0, 4}, 0.0f);  // d sqrt(q)/dq at 0 is inf; the loss is finite
  EXPECT_TRUE(std::isfinite(s[kStatLoss]));
  EXPECT_TRUE(std::isinf(s[kStatNorm]));
  EXPECT_EQ(s[kStatOk], 0.0f);
  EXPECT_EQ(s[kStatScale], 1.0f);
  expect_error([&] { check_finite_gradients(g, "step 1"); }, {"step 1", "'q'", "inf", "at element 1"});
  s = run({1, 2, 4}, std::numeric_limits<float>::quiet_NaN());  // finite gradients, NaN loss
  EXPECT_TRUE(std::isnan(s[kStatLoss]));
  EXPECT_TRUE(std::isfinite(s[kStatNorm]));
  EXPECT_EQ(s[kStatOk], 0.0f);
  EXPECT_EQ(get_bytes(p), before);
  for (const Tensor* t : {opt.m()[0], opt.v()[0]}) EXPECT_EQ(get_data(t), std::vector<float>(4, 0.0f));
  EXPECT_EQ(opt.steps(), 0);
  // The next good step is AdamW's first: with bias correction each weight moves by lr (eps aside).
  s = run({1, 2, 4}, 0.0f);
  EXPECT_EQ(s[kStatOk], 1.0f);
  EXPECT_EQ(opt.steps(), 1);
  const std::vector<float> after = get_data(p);
  const std::vector<float> b = {0.5f, -1, 2, 0.25f};
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(std::abs(after[i] - b[i] * (1 - 0.1f * 0.01f)), 0.1, 1e-5) << i;
}

// The step queues its work and the host waits only when it reads the stats: the count of host waits does
// not move through begin_step, compute and end_step.
TEST(FusedOptimizer, NoHostWaitUntilTheStatsAreRead) {
  reseed("fused_waits");
  CpuBackend be(2);
  Multi pb(be, kSmall);
  AdamW opt(pb.ps, AdamWConfig{});
  Tensor* stats = opt.append_step(pb.g, pb.loss, 1.0);
  for (Tensor* c : pb.cs) set_data(c, to_f32(random_vec(c->nelements(), -1, 1)));
  const uint64_t w0 = be.host_waits();
  opt.begin_step(0.01f);
  pb.g.zero_grad();
  pb.g.compute();
  EXPECT_EQ(be.host_waits(), w0);
  const std::vector<float> s = get_data(stats);
  EXPECT_EQ(be.host_waits(), w0 + 1);
  opt.end_step(s[kStatOk] != 0);
  EXPECT_EQ(be.host_waits(), w0 + 1);
  // grad_norm and clip_grad_norm read once each, whatever the number of parameters.
  grad_norm(pb.g);
  EXPECT_EQ(be.host_waits(), w0 + 2);
  clip_grad_norm(pb.g, 1.0);
  EXPECT_EQ(be.host_waits(), w0 + 3);
}

// step() keeps its table for the graph it last saw and rebuilds it for another one (the table holds the
// gradients' addresses): two graphs over the same parameters, taken in turn, update from their own grads.
TEST(FusedOptimizer, StepFollowsTheGraphItIsGiven) {
  Context ctx(default_cpu_backend());
  Tensor* p = ctx.param(DType::F32, {2}, "p");
  set_data(p, {1, 1});
  Graph a(ctx), b(ctx);
  a.backward(sum(ctx, p));                  // grad 1
  b.backward(sum(ctx, scale(ctx, p, -3)));  // grad -3
  a.compute();
  b.compute();
  Sgd opt({p}, SgdConfig{0.5f, 0.0f, 0.0f});
  opt.step(a);
  EXPECT_EQ(get_data(p), (std::vector<float>{0.5f, 0.5f}));
  opt.step(b);
  EXPECT_EQ(get_data(p), (std::vector<float>{2.0f, 2.0f}));
  opt.step(a);
  EXPECT_EQ(get_data(p), (std::vector<float>{1.5f, 1.5f}));
}

TEST(FusedOptimizer, BadUseThrows) {
  Context ctx(default_cpu_backend());
  Tensor* p = ctx.param(DType::F32, {2}, "p");
  Tensor* other = ctx.param(DType::F32, {2}, "other");
  AdamW opt({p}, AdamWConfig{});
  Graph none(ctx);
  none.forward(sum(ctx, p));
  expect_error([&] { opt.append_step(none, nullptr, 1.0); }, {"AdamW", "no backward pass"});
  Graph g(ctx);
  g.backward(sum(ctx, other));
  expect_error([&] { opt.append_step(g, nullptr, 1.0); }, {"AdamW", "none of the optimizer's parameters"});
  Graph h(ctx);
  h.backward(sum(ctx, p));
  expect_error([&] { opt.append_step(h, nullptr, -1.0); }, {"grad_norm", "max_norm"});
  expect_error([&] { opt.append_step(h, nullptr, std::nan("")); }, {"grad_norm", "max_norm"});
  expect_error([&] { opt.append_step(h, p, 1.0); }, {"grad_norm", "loss", "single float element"});
  expect_error([&] { opt.end_step(true); }, {"AdamW", "no step was begun"});
  expect_error([&] { opt.begin_step(std::nanf("")); }, {"AdamW", "NaN"});
  // The ops themselves refuse what is not theirs.
  Tensor* stats = optimizer_stats(ctx);
  Tensor* hp = ctx.tensor(DType::F32, {kAdamWHparams}, "hp");
  expect_error([&] { optimizer_table(ctx, {}, "t"); }, {"t", "no tensors"});
  Tensor* bare = optimizer_table(ctx, {{p, h.grad(p), nullptr, nullptr}}, "t");
  expect_error([&] { adamw_step_op(ctx, stats, bare, hp, 0.9f, 0.99f, 1e-8f); }, {"adamw_step", "m and v"});
  Tensor* lr = ctx.tensor(DType::F32, {1}, "lr");
  expect_error([&] { sgd_step_op(ctx, stats, bare, lr, 0.9f, 0.0f); }, {"sgd_step", "momentum buffer"});
  Tensor* small = ctx.tensor(DType::F32, {1}, "small");
  expect_error([&] { adamw_step_op(ctx, small, bare, hp, 0.9f, 0.99f, 1e-8f); }, {"adamw_step", "stats"});
  Tensor* doubled = scale(ctx, p, 2.0f);
  expect_error(
      [&] {
        optimizer_table(ctx, {{p, doubled, nullptr, nullptr}}, "t");
      },
      {"t", "gradient", "leaf"});
  expect_error(
      [&] {
        optimizer_table(ctx, {{p, small, nullptr, nullptr}}, "t");
      },
      {"t", "gradient", "small"});
  expect_error(
      [&] {
        optimizer_table(ctx, {{p, h.grad(p), small, nullptr}}, "t");
      },
      {"t", "optimizer state", "small"});
  CpuBackend be2(1);
  Context elsewhere(be2);
  expect_error(
      [&] {
        optimizer_table(elsewhere, {{p, h.grad(p), nullptr, nullptr}}, "t");
      },
      {"t", "another"});
}

}  // namespace
}  // namespace retort::test
