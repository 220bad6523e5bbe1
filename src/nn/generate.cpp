#include "generate.h"

#include <algorithm>
#include <cmath>

#include "../core/error.h"

namespace retort {

void SamplingOptions::check() const {
  RT_CHECK(std::isfinite(temperature) && temperature >= 0,
           "sampling: temperature must be >= 0 (0: greedy), got ", temperature);
  RT_CHECK(top_k >= 0, "sampling: top_k must be >= 0 (0: no cut), got ", top_k);
  RT_CHECK(top_p > 0 && top_p <= 1, "sampling: top_p must be in (0, 1] (1: no cut), got ", top_p);
}

TokenSampler::TokenSampler(const SamplingOptions& opts) : opts_(opts), rng_(opts.seed) {
  opts_.check();
}

int32_t TokenSampler::sample(const float* z, int64_t vocab) {
  RT_CHECK(vocab >= 1, "sampling: the vocabulary is empty");
  if (opts_.temperature == 0) return int32_t(std::max_element(z, z + vocab) - z);
  cand_.resize(size_t(vocab));
  for (int64_t v = 0; v < vocab; ++v) cand_[size_t(v)] = {z[v], int32_t(v)};
  // Most likely first, ties to the smaller id, so a seed gives the same tokens whatever the sort does.
  auto better = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  size_t keep = opts_.top_k > 0 ? std::min(size_t(opts_.top_k), cand_.size()) : cand_.size();
  if (keep < cand_.size())
    std::partial_sort(cand_.begin(), cand_.begin() + std::ptrdiff_t(keep), cand_.end(), better);
  else if (opts_.top_p < 1)
    std::sort(cand_.begin(), cand_.end(), better);
  float mx = cand_[0].first;
  for (size_t j = 1; j < keep; ++j) mx = std::max(mx, cand_[j].first);
  weights_.resize(keep);
  double total = 0;
  for (size_t j = 0; j < keep; ++j)
    total += weights_[j] = std::exp(double(cand_[j].first - mx) / opts_.temperature);
  if (opts_.top_p < 1) {
    double acc = 0;
    for (size_t j = 0; j < keep; ++j) {
      acc += weights_[j] / total;
      if (acc >= opts_.top_p) {
        keep = j + 1;
        break;
      }
    }
  }
  std::discrete_distribution<size_t> dist(weights_.begin(), weights_.begin() + std::ptrdiff_t(keep));
  return cand_[dist(rng_)].second;
}

Generator::Generator(Context& ctx, Transformer& model, const GeneratorOptions& opts)
    : model_(model), opts_(opts) {
  const int64_t context = model.config().context;
  RT_CHECK(opts.max_len >= 0 && opts.max_len <= context, "generator: max_len must be in [0, ", context,
           "] (0: the model's context), got ", opts.max_len);
  opts_.max_len = opts.max_len == 0 ? context : opts.max_len;
  decoder_ = std::make_unique<Decoder>(ctx, model, opts_.max_len, 1, opts.prefill_chunk);
}

std::vector<float> Generator::refill(const std::vector<int32_t>& seq, size_t keep) {
  decoder_->reset();
  return decoder_->feed(std::vector<int32_t>(seq.end() - std::ptrdiff_t(keep), seq.end()));
}

std::vector<int32_t> Generator::generate(const std::vector<int32_t>& prompt, int64_t n,
                                         const SamplingOptions& opts, const std::vector<int32_t>& stop,
                                         const OnToken& on_token) {
  const int64_t V = model_.config().vocab, L = opts_.max_len;
  RT_CHECK(!prompt.empty(), "generate: the prompt is empty (give at least one token, e.g. BOS)");
  RT_CHECK(n >= 0, "generate: the number of new tokens must be >= 0, got ", n);
  for (size_t i = 0; i < prompt.size(); ++i)
    RT_CHECK(prompt[i] >= 0 && prompt[i] < V, "generate: prompt token ", prompt[i], " at index ", i,
             " is outside the vocabulary [0, ", V, ")");
  TokenSampler sampler(opts);
  // The last new token is never fed back, so prompt + n - 1 positions suffice.
  RT_CHECK(opts_.slide || int64_t(prompt.size()) + std::max<int64_t>(n, 1) - 1 <= L, "generate: a prompt of ",
           prompt.size(), " tokens and ", n, " new ones need ", int64_t(prompt.size()) + n - 1,
           " positions, more than max_len ", L, " (use a shorter prompt, fewer tokens, or slide)");
  std::vector<int32_t> out;
  if (n == 0) return out;
  std::vector<int32_t> seq = prompt;
  std::vector<float> logits =
      int64_t(seq.size()) > L ? refill(seq, size_t(L)) : (decoder_->reset(), decoder_->feed(seq));
  for (int64_t i = 0; i < n; ++i) {
    const int32_t next = sampler.sample(logits.data(), V);
    out.push_back(next);
    seq.push_back(next);
    const bool more = !on_token || on_token(next);
    if (!more || std::find(stop.begin(), stop.end(), next) != stop.end() || i + 1 == n) break;
    logits =
        decoder_->position() < L ? decoder_->feed({next}) : refill(seq, size_t(std::max<int64_t>(1, L / 2)));
  }
  return out;
}

}  // namespace retort
