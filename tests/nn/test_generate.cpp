// Sampling and the Generator: greedy generation against repeated argmax of the full forward, stop tokens,
// streaming and early stop, seeded sampling, the top-k / top-p cuts and the draw frequencies, sliding past
// max_len, and the refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "harness.h"

namespace retort {
namespace {

TransformerConfig cfg(int64_t context) {
  TransformerConfig c;
  c.vocab = 29;
  c.context = context;
  c.layers = 2;
  c.d_model = 16;
  c.heads = 4;
  c.kv_heads = 2;
  c.d_ff = 24;
  return c;
}

// Greedy continuation by the definition: argmax of forward's last row on the growing sequence.
std::vector<int32_t> argmax_continuation(Context& ctx, Transformer& m, std::vector<int32_t> seq, int64_t n) {
  const int64_t V = m.config().vocab;
  std::vector<int32_t> out;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t T = int64_t(seq.size());
    Tensor* tokens = ctx.input(DType::I32, {1, T}, "tokens");
    set_data_int(tokens, std::vector<int64_t>(seq.begin(), seq.end()));
    Tensor* logits = m.forward(ctx, tokens);
    logits->flags |= kOutput;
    Graph g(ctx);
    g.forward(logits);
    g.compute();
    const std::vector<float> l = get_data(logits);
    const float* row = l.data() + (T - 1) * V;
    const int32_t next = int32_t(std::max_element(row, row + V) - row);
    out.push_back(next);
    seq.push_back(next);
  }
  return out;
}

TEST(Generator, GreedyEqualsRepeatedArgmaxOfTheFullForward) {
  CpuBackend be(2);
  Context ctx(be);
  Transformer m(ctx, cfg(40), 11);
  const std::vector<int32_t> prompt = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5};
  GeneratorOptions o;
  o.prefill_chunk = 4;  // the prompt crosses two chunk boundaries
  Generator gen(ctx, m, o);
  EXPECT_EQ(gen.max_len(), 40);
  SamplingOptions greedy;
  greedy.temperature = 0;
  const std::vector<int32_t> got = gen.generate(prompt, 25, greedy);
  EXPECT_EQ(got, argmax_continuation(ctx, m, prompt, 25));
  // top_k = 1 is greedy at any temperature; so is a tiny top_p.
  SamplingOptions k1;
  k1.top_k = 1;
  k1.seed = 5;
  EXPECT_EQ(gen.generate(prompt, 25, k1), got);
  SamplingOptions p0;
  p0.top_p = 1e-6f;
  EXPECT_EQ(gen.generate(prompt, 25, p0), got);
}

TEST(Generator, StopTokensAndStreaming) {
  CpuBackend be(1);
  Context ctx(be);
  Transformer m(ctx, cfg(40), 2);
  Generator gen(ctx, m);
  SamplingOptions greedy;
  greedy.temperature = 0;
  const std::vector<int32_t> prompt = {1, 2, 3};
  const std::vector<int32_t> all = gen.generate(prompt, 20, greedy);
  ASSERT_EQ(all.size(), 20u);
  // Stopping at the first occurrence of the 5th token: the stop token is the last one returned.
  const int32_t stop = all[4];
  const size_t first = size_t(std::find(all.begin(), all.end(), stop) - all.begin());
  const std::vector<int32_t> cut = gen.generate(prompt, 20, greedy, {99, stop});
  EXPECT_EQ(cut, std::vector<int32_t>(all.begin(), all.begin() + std::ptrdiff_t(first) + 1));
  // The callback sees every token as it comes, and returning false ends the generation.
  std::vector<int32_t> streamed;
  const std::vector<int32_t> seven = gen.generate(prompt, 20, greedy, {}, [&](int32_t t) {
    streamed.push_back(t);
    return streamed.size() < 7;
  });
  EXPECT_EQ(seven, std::vector<int32_t>(all.begin(), all.begin() + 7));
  EXPECT_EQ(streamed, seven);
  EXPECT_TRUE(gen.generate(prompt, 0, greedy).empty());
}

TEST(Generator, SeededSamplingIsReproducible) {
  CpuBackend be(1);
  Context ctx(be);
  Transformer m(ctx, cfg(64), 4);
  Generator gen(ctx, m);
  SamplingOptions o;
  o.temperature = 1.5f;
  o.top_k = 10;
  o.top_p = 0.95f;
  o.seed = 42;
  const std::vector<int32_t> a = gen.generate({7}, 40, o);
  EXPECT_EQ(gen.generate({7}, 40, o), a);
  o.seed = 43;
  EXPECT_NE(gen.generate({7}, 40, o), a);
}

TEST(Generator, SlidesPastMaxLenOrRefuses) {
  CpuBackend be(1);
  Context ctx(be);
  Transformer m(ctx, cfg(16), 6);
  SamplingOptions greedy;
  greedy.temperature = 0;
  const std::vector<int32_t> prompt = {4, 8, 15, 16, 23};
  Generator strict(ctx, m);
  try {
    strict.generate(prompt, 13, greedy);  // 5 + 13 - 1 = 17 positions
    FAIL() << "generating past max_len did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_len 16"), std::string::npos) << e.what();
  }
  const std::vector<int32_t> fits = strict.generate(prompt, 12, greedy);  // 16 positions: exactly full
  GeneratorOptions o;
  o.slide = true;
  Generator sliding(ctx, m, o);
  const std::vector<int32_t> long_run = sliding.generate(prompt, 40, greedy);
  ASSERT_EQ(long_run.size(), 40u);
  EXPECT_EQ(std::vector<int32_t>(long_run.begin(), long_run.begin() + 12), fits);
  // After the slide at 16 positions the model sees the newest 8: token 12 is the argmax after them.
  std::vector<int32_t> seq = prompt;
  seq.insert(seq.end(), long_run.begin(), long_run.begin() + 12);
  const std::vector<int32_t> window(seq.end() - 8, seq.end());
  EXPECT_EQ(long_run[12], argmax_continuation(ctx, m, window, 1)[0]);
  // A prompt longer than the cache keeps its newest max_len tokens.
  std::vector<int32_t> long_prompt(30);
  for (size_t i = 0; i < long_prompt.size(); ++i) long_prompt[i] = int32_t(i % 29);
  const std::vector<int32_t> newest(long_prompt.end() - 16, long_prompt.end());
  EXPECT_EQ(sliding.generate(long_prompt, 1, greedy), argmax_continuation(ctx, m, newest, 1));
}

TEST(Generator, RefusesBadInput) {
  CpuBackend be(1);
  Context ctx(be);
  Transformer m(ctx, cfg(16), 6);
  Generator gen(ctx, m);
  EXPECT_THROW(gen.generate({}, 3), Error);
  EXPECT_THROW(gen.generate({29}, 3), Error);
  EXPECT_THROW(gen.generate({1}, -1), Error);
  SamplingOptions bad;
  bad.temperature = -1;
  EXPECT_THROW(gen.generate({1}, 3, bad), Error);
  bad = {};
  bad.top_p = 0;
  EXPECT_THROW(gen.generate({1}, 3, bad), Error);
  bad = {};
  bad.top_k = -2;
  EXPECT_THROW(gen.generate({1}, 3, bad), Error);
  GeneratorOptions o;
  o.max_len = 17;
  EXPECT_THROW(Generator(ctx, m, o), Error);
}

TEST(TokenSampler, GreedyCutsAndFrequencies) {
  SamplingOptions o;
  o.temperature = 0;
  TokenSampler greedy(o);
  const std::vector<float> tie = {1, 3, 0, 3};
  EXPECT_EQ(greedy.sample(tie.data(), 4), 1);  // the first of equal maxima

  // Probabilities 1/8, 3/8, 4/8 (logits log 1, log 3, log 4) at temperature 1.
  const std::vector<float> z = {0.0f, std::log(3.0f), std::log(4.0f)};
  auto freq = [&](const SamplingOptions& opts) {
    TokenSampler s(opts);
    std::vector<double> f(3, 0.0);
    const int draws = 40000;
    for (int i = 0; i < draws; ++i) f[size_t(s.sample(z.data(), 3))] += 1.0 / draws;
    return f;
  };
  SamplingOptions plain;
  plain.seed = 1;
  std::vector<double> f = freq(plain);
  EXPECT_NEAR(f[0], 0.125, 0.01);
  EXPECT_NEAR(f[1], 0.375, 0.01);
  EXPECT_NEAR(f[2], 0.5, 0.01);
  SamplingOptions k2 = plain;
  k2.top_k = 2;  // 3/7 and 4/7
  f = freq(k2);
  EXPECT_EQ(f[0], 0.0);
  EXPECT_NEAR(f[1], 3.0 / 7, 0.01);
  SamplingOptions p = plain;
  p.top_p = 0.6f;  // 4/8 < 0.6 <= 7/8: the two best
  f = freq(p);
  EXPECT_EQ(f[0], 0.0);
  EXPECT_NEAR(f[2], 4.0 / 7, 0.01);
  SamplingOptions hot = plain;
  hot.temperature = 2;  // p ∝ sqrt(1, 3, 4) = 1, 1.732, 2
  f = freq(hot);
  EXPECT_NEAR(f[0], 1 / 4.732, 0.01);
  EXPECT_THROW(TokenSampler(SamplingOptions{-0.5f}), Error);
}

}  // namespace
}  // namespace retort
