// Text generation from a Transformer: choosing the next token from its logits (temperature, top-k, top-p,
// greedy) and the loop that feeds each choice back through a KV-cached Decoder.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "decoder.h"

namespace retort {

struct SamplingOptions {
  float temperature = 1.0f;  // logits are divided by it; 0 takes the most likely token (greedy)
  int64_t top_k = 0;         // keep the k most likely tokens (0: all)
  float top_p = 1.0f;        // then the smallest set whose probability reaches top_p (1: all)
  uint64_t seed = 0;         // the sampler's random stream; the same seed gives the same tokens
  // Throws retort::Error naming the field unless temperature >= 0, top_k >= 0 and 0 < top_p <= 1.
  void check() const;
};

// Picks tokens from rows of logits under one SamplingOptions, with its own seeded random stream.
class TokenSampler {
 public:
  // Throws retort::Error on bad options (SamplingOptions::check).
  explicit TokenSampler(const SamplingOptions& opts);
  // The next token for logits [vocab]: the argmax at temperature 0 (the first of equal maxima), else a draw
  // from softmax(logits / temperature) cut to top_k, then to top_p, and renormalized.
  int32_t sample(const float* logits, int64_t vocab);

 private:
  SamplingOptions opts_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> cand_;
  std::vector<double> weights_;
};

struct GeneratorOptions {
  int64_t max_len = 0;         // positions the KV cache holds (0: the model's context)
  int64_t prefill_chunk = 64;  // prompt tokens per prefill step (Decoder)
  // When prompt and continuation outgrow max_len: false makes generate() throw before it runs anything; true
  // starts a fresh cache from the newest max_len / 2 tokens whenever it fills (the prompt keeps its newest
  // max_len), so the model always sees between max_len / 2 and max_len tokens.
  bool slide = false;
};

// Generates continuations of prompts with a KV-cached Decoder (batch 1) that it keeps between calls.
class Generator {
 public:
  // Called with each new token as soon as it is chosen; returning false ends the generation there.
  using OnToken = std::function<bool(int32_t)>;

  // A generator for model, whose parameters live in ctx. Throws retort::Error on bad options.
  Generator(Context& ctx, Transformer& model, const GeneratorOptions& opts = {});
  // Continues prompt (at least one token) by up to n tokens, sampled under opts, and returns them. A token in
  // stop ends the generation after it is appended (it is the last one returned); so does on_token returning
  // false. Throws retort::Error on an empty prompt, a token outside the vocabulary, bad options, or (without
  // slide) prompt.size() + n - 1 > max_len.
  std::vector<int32_t> generate(const std::vector<int32_t>& prompt, int64_t n,
                                const SamplingOptions& opts = {}, const std::vector<int32_t>& stop = {},
                                const OnToken& on_token = nullptr);
  int64_t max_len() const { return decoder_->max_len(); }
  Decoder& decoder() { return *decoder_; }

 private:
  // Starts a fresh cache from the newest tokens of seq and returns the logits after them.
  std::vector<float> refill(const std::vector<int32_t>& seq, size_t keep);

  Transformer& model_;
  GeneratorOptions opts_;
  std::unique_ptr<Decoder> decoder_;
};

}  // namespace retort
