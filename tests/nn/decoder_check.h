// Helpers shared by the decoder tests on the CPU (tests/nn/test_decoder.cpp) and on CUDA (tests/cuda): a
// small model with grouped-query attention, non-zero q/k/v biases and an untied head; the full forward's
// logits; and feeding a decoder in pieces.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "harness.h"

namespace retort::test {

inline TransformerConfig small(int64_t context) {
  TransformerConfig c;
  c.vocab = 37;
  c.context = context;
  c.layers = 2;
  c.d_model = 24;
  c.heads = 6;
  c.kv_heads = 2;  // grouped-query: 3 query heads per kv head
  c.d_ff = 40;
  c.tie_embeddings = false;
  c.qkv_bias = true;
  return c;
}

// A model whose biases are not zero (their init), so that a bias the decoder dropped would show.
inline std::unique_ptr<Transformer> make_model(Context& ctx, const TransformerConfig& c, uint64_t seed) {
  auto m = std::make_unique<Transformer>(ctx, c, seed);
  std::mt19937_64 rng(seed + 1);
  std::normal_distribution<float> d(0.0f, 0.3f);
  for (const TransformerBlock& b : m->blocks())
    for (Tensor* t : {b.bq, b.bk, b.bv}) {
      std::vector<float> v(static_cast<size_t>(t->nelements()));
      for (float& x : v) x = d(rng);
      set_data(t, v);
    }
  return m;
}

inline std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, int32_t(vocab - 1));
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

// forward's logits [B*T, vocab] for tokens [B, T].
inline std::vector<float> full_logits(Context& ctx, Transformer& m, const std::vector<int32_t>& toks,
                                      int64_t B) {
  const int64_t T = int64_t(toks.size()) / B;
  Tensor* tokens = ctx.input(DType::I32, {B, T}, "tokens");
  set_data_int(tokens, std::vector<int64_t>(toks.begin(), toks.end()));
  Tensor* logits = m.forward(ctx, tokens);
  logits->flags |= kOutput;
  Graph g(ctx);
  g.forward(logits);
  g.compute();
  return get_data(logits);
}

// Tokens [from, to) of each of B sequences of length T, sequence by sequence.
inline std::vector<int32_t> cut(const std::vector<int32_t>& toks, int64_t B, int64_t from, int64_t to) {
  const int64_t T = int64_t(toks.size()) / B;
  std::vector<int32_t> out;
  for (int64_t b = 0; b < B; ++b)
    out.insert(out.end(), toks.begin() + b * T + from, toks.begin() + b * T + to);
  return out;
}

// max |a - b| over max |b|.
inline double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    diff = std::max(diff, double(std::fabs(a[i] - b[i])));
    scale = std::max(scale, double(std::fabs(b[i])));
  }
  return diff / scale;
}

// Feeds the sequences in pieces of the given sizes (per sequence) and returns the logits of every position,
// [B, T, vocab], in forward's row order.
inline std::vector<float> decode_all(Decoder& d, const std::vector<int32_t>& toks, int64_t B,
                                     const std::vector<int64_t>& pieces, int64_t vocab) {
  const int64_t T = int64_t(toks.size()) / B;
  std::vector<float> out(size_t(B * T * vocab));
  int64_t at = 0;
  for (int64_t n : pieces) {
    const std::vector<float> l = d.feed(cut(toks, B, at, at + n), true);
    EXPECT_EQ(l.size(), size_t(B * n * vocab));
    for (int64_t b = 0; b < B; ++b)
      std::copy_n(l.begin() + b * n * vocab, n * vocab, out.begin() + (b * T + at) * vocab);
    at += n;
  }
  EXPECT_EQ(at, T);
  EXPECT_EQ(d.position(), T);
  return out;
}

}  // namespace retort::test
