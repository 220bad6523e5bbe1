// The transformer LM: causality, gradients against central differences, grouped-query attention against its
// multi-head equivalent, config checks, and that a few AdamW steps learn a simple pattern.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "harness.h"

namespace retort {
namespace {

TransformerConfig tiny(int64_t heads = 2, int64_t kv_heads = 0, bool tied = true) {
  TransformerConfig c;
  c.vocab = 11;  // not a power of two, so no shape lines up by accident
  c.context = 6;
  c.layers = 2;
  c.d_model = 8;
  c.heads = heads;
  c.kv_heads = kv_heads;
  c.d_ff = 12;
  c.tie_embeddings = tied;
  return c;
}

std::vector<int64_t> random_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> d(0, vocab - 1);
  std::vector<int64_t> v(size_t(n), 0);
  for (auto& x : v) x = d(rng);
  return v;
}

std::vector<float> run_logits(Context& ctx, Transformer& m, const std::vector<int64_t>& toks, int64_t B,
                              int64_t T) {
  Tensor* tokens = ctx.input(DType::I32, {B, T}, "tokens");
  set_data_int(tokens, toks);
  Tensor* logits = m.forward(ctx, tokens);
  logits->flags |= kOutput;
  Graph g(ctx);
  g.forward(logits);
  g.compute();
  return get_data(logits);
}

TEST(Transformer, LogitsShapeAndCausality) {
  CpuBackend be(2);
  Context ctx(be);
  Transformer m(ctx, tiny(), 3);
  const int64_t B = 2, T = 6, V = 11;
  auto toks = random_tokens(B * T, V, 1);
  auto a = run_logits(ctx, m, toks, B, T);
  ASSERT_EQ(a.size(), size_t(B * T * V));
  // Changing the token at position 4 of sequence 1 must leave every earlier position (and sequence 0) alone,
  // and change position 4 itself.
  auto toks2 = toks;
  toks2[size_t(1 * T + 4)] = (toks2[size_t(1 * T + 4)] + 1) % V;
  auto b = run_logits(ctx, m, toks2, B, T);
  for (int64_t s = 0; s < B; ++s)
    for (int64_t t = 0; t < T; ++t) {
      double diff = 0;
      for (int64_t v = 0; v < V; ++v) {
        const size_t i = size_t((s * T + t) * V + v);
        diff = std::max(diff, double(std::fabs(a[i] - b[i])));
      }
      if (s == 1 && t >= 4)
        EXPECT_GT(diff, 1e-6) << "position " << t << " should see the changed token";
      else
        EXPECT_EQ(diff, 0.0) << "sequence " << s << " position " << t << " saw a later or foreign token";
    }
}

// Loss gradients against central differences of the same f32 graph. f32 and a step of 1e-2 limit the
// agreement to about 1e-2 relative; a wrong rule (a missing transpose, a dropped term) is off by far more.
void check_gradients(const TransformerConfig& cfg) {
  CpuBackend be(2);
  Context ctx(be);
  Transformer m(ctx, cfg, 5);
  const int64_t B = 2, T = 5;
  Tensor* tokens = ctx.input(DType::I32, {B, T}, "tokens");
  Tensor* targets = ctx.input(DType::I32, {B, T}, "targets");
  set_data_int(tokens, random_tokens(B * T, cfg.vocab, 7));
  set_data_int(targets, random_tokens(B * T, cfg.vocab, 8));
  Tensor* loss = lm_loss(ctx, m.forward(ctx, tokens), targets);
  Graph g(ctx);
  g.backward(loss);
  // Larger weights than the init's 0.02, so attention and the MLP are far from linear.
  std::mt19937_64 rng(11);
  std::normal_distribution<float> nd(0.0f, 0.5f);
  for (Tensor* p : m.parameters()) {
    std::vector<float> v(size_t(p->nelements()));
    for (auto& x : v) x = nd(rng);
    set_data(p, v);
  }
  g.zero_grad();
  g.compute();
  ASSERT_EQ(g.params().size(), m.parameters().size());
  const double h = 1e-2;
  for (Tensor* p : m.parameters()) {
    std::vector<float> base = get_data(p);
    std::vector<float> analytic = get_data(g.grad(p));
    std::vector<double> num, ana;
    // The entries with the largest gradients: f32 rounding of the loss (~1e-6) over 2h puts ~1e-4 of noise on
    // every numeric derivative, which would swamp the small ones.
    std::vector<size_t> order(base.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    const size_t n = std::min<size_t>(6, order.size());
    std::partial_sort(order.begin(), order.begin() + long(n), order.end(),
                      [&](size_t a, size_t b) { return std::fabs(analytic[a]) > std::fabs(analytic[b]); });
    for (size_t k = 0; k < n; ++k) {
      const size_t i = order[k];
      auto at = [&](double delta) {
        std::vector<float> v = base;
        v[i] = float(double(v[i]) + delta);
        set_data(p, v);
        g.zero_grad();
        g.compute();
        return double(get_data(loss)[0]);
      };
      num.push_back((at(h) - at(-h)) / (2 * h));
      ana.push_back(analytic[i]);
    }
    set_data(p, base);
    double err = 0, ref = 0;
    for (size_t k = 0; k < num.size(); ++k) {
      err += (num[k] - ana[k]) * (num[k] - ana[k]);
      ref += num[k] * num[k];
    }
    EXPECT_LT(err, 1e-3 * ref + 1e-10) << p->name << " (" << cfg.describe() << ")";
  }
}

TEST(Transformer, GradientsMatchFiniteDifferences) {
  check_gradients(tiny());
}
TEST(Transformer, GradientsMatchFiniteDifferencesGqaUntied) {
  check_gradients(tiny(4, 2, false));
}
TEST(Transformer, GradientsMatchFiniteDifferencesQkvBias) {
  TransformerConfig c = tiny(4, 2, false);
  c.qkv_bias = true;
  check_gradients(c);
}

// The parameter list a config implies is the one the model holds, name for name and shape for shape (the
// model loaders validate files against the former).
TEST(Transformer, ParameterSpecsMatchTheModel) {
  CpuBackend be(1);
  for (bool bias : {false, true})
    for (bool tied : {true, false}) {
      TransformerConfig c = tiny(4, 2, tied);
      c.qkv_bias = bias;
      Context ctx(be);
      Transformer m(ctx, c, 1);
      const std::vector<ParamSpec> specs = transformer_parameters(c);
      ASSERT_EQ(specs.size(), m.parameters().size()) << c.describe();
      for (size_t i = 0; i < specs.size(); ++i) {
        EXPECT_EQ(specs[i].name, m.parameters()[i]->name);
        EXPECT_EQ(specs[i].shape, m.parameters()[i]->shape());
      }
      EXPECT_EQ(m.blocks()[0].bq != nullptr, bias);
    }
}

// Grouped-query attention with kv_heads = 1 is multi-head attention whose key and value heads are all equal.
TEST(Transformer, GroupedQueryAttentionEqualsRepeatedHeads) {
  CpuBackend be(2);
  Context ctx(be);
  Transformer gqa(ctx, tiny(4, 1), 9);
  Transformer mha(ctx, tiny(4, 4), 10);
  const auto& pg = gqa.parameters();
  const auto& pm = mha.parameters();
  ASSERT_EQ(pg.size(), pm.size());
  for (size_t i = 0; i < pg.size(); ++i) {
    std::vector<float> v = get_data(pg[i]);
    if (pg[i]->nelements() != pm[i]->nelements()) {
      // wk / wv: [1 * hd, d_model] -> the same block for each of the 4 heads.
      std::vector<float> rep;
      for (int r = 0; r < 4; ++r) rep.insert(rep.end(), v.begin(), v.end());
      v = rep;
    }
    set_data(pm[i], v);
  }
  auto toks = random_tokens(2 * 6, 11, 4);
  auto a = run_logits(ctx, gqa, toks, 2, 6);
  auto b = run_logits(ctx, mha, toks, 2, 6);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-5f) << "logit " << i;
}

TEST(Transformer, BadConfigAndInputsThrow) {
  CpuBackend be(1);
  Context ctx(be);
  auto bad = [&](TransformerConfig c) { EXPECT_THROW(Transformer(ctx, c, 0), Error) << c.describe(); };
  TransformerConfig c = tiny();
  c.d_model = 9;  // not a multiple of heads
  bad(c);
  c = tiny(4, 3);  // kv_heads does not divide heads
  bad(c);
  c = tiny();
  c.heads = 8;  // head_dim 1 is odd: RoPE needs pairs
  bad(c);
  c = tiny();
  c.layers = 0;
  bad(c);
  try {
    Transformer(ctx, tiny(4, 3), 0);
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("kv_heads"), std::string::npos) << e.what();
  }
  Transformer m(ctx, tiny(), 0);
  EXPECT_THROW(m.forward(ctx, ctx.input(DType::I32, {1, 7}, "too_long")), Error);
  EXPECT_THROW(m.forward(ctx, ctx.input(DType::F32, {1, 4}, "float_tokens")), Error);
}

// A few AdamW steps on a periodic sequence drive the next-token loss far below chance (ln 11 = 2.4).
TEST(Transformer, LearnsAPeriodicSequence) {
  CpuBackend be(2);
  Context ctx(be);
  TransformerConfig cfg = tiny();
  cfg.d_model = 16;
  Transformer m(ctx, cfg, 1);
  const int64_t B = 4, T = 6;
  Tensor* tokens = ctx.input(DType::I32, {B, T}, "tokens");
  Tensor* targets = ctx.input(DType::I32, {B, T}, "targets");
  Tensor* loss = lm_loss(ctx, m.forward(ctx, tokens), targets);
  Graph g(ctx);
  g.backward(loss);
  AdamWConfig oc;
  oc.lr = 1e-2f;
  AdamW opt(g.params(), oc);
  const int period = 5;
  std::vector<int64_t> x, y;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      x.push_back((b + t) % period);
      y.push_back((b + t + 1) % period);
    }
  set_data_int(tokens, x);
  set_data_int(targets, y);
  double first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    g.zero_grad();
    g.compute();
    last = get_data(loss)[0];
    if (step == 0) first = last;
    opt.step(g);
  }
  EXPECT_NEAR(first, std::log(11.0), 0.3);
  EXPECT_LT(last, 0.2) << "started at " << first;
}

}  // namespace
}  // namespace retort
