// Greedy generation speed of a randomly initialized model: the KV-cached Generator (prefill, then one token
// per step) against the full-context forward per token that generation used before it (the logits of the
// whole window recomputed for every new token), on the same model and backend in the same run.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "retort.h"

using namespace retort;

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The generation of before: a [1, context] forward per token, the text left-aligned in the window.
double full_context_tokens_per_second(Context& ctx, Transformer& model, std::vector<int32_t> seq, int64_t n,
                                      std::vector<int32_t>* out) {
  const int64_t T = model.config().context, V = model.config().vocab;
  Tensor* tokens = ctx.input(DType::I32, {1, T}, "tokens");
  Tensor* logits = model.forward(ctx, tokens);
  logits->flags |= kOutput;
  Graph g(ctx);
  g.forward(logits);
  const auto t0 = Clock::now();
  for (int64_t i = 0; i < n; ++i) {
    std::vector<int64_t> ids(static_cast<size_t>(T), 0);
    const size_t w = std::min(seq.size(), size_t(T));
    for (size_t j = 0; j < w; ++j) ids[j] = seq[seq.size() - w + j];
    set_data_int(tokens, ids);
    g.compute();
    const std::vector<float> all = get_data(logits);
    const float* row = all.data() + (w - 1) * size_t(V);
    const int32_t next = int32_t(std::max_element(row, row + V) - row);
    seq.push_back(next);
    out->push_back(next);
  }
  return double(n) / since(t0);
}

}  // namespace

int main(int argc, char** argv) {
  TransformerConfig c;
  c.vocab = 49152, c.context = 8192, c.layers = 30, c.d_model = 576, c.heads = 9, c.kv_heads = 3;
  c.d_ff = 1536;
  int64_t prompt_len = 20, n = 100, old_tokens = 3, max_len = 0;
  int threads = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string f = argv[i];
    const int64_t v = std::atoll(argv[i + 1]);
    if (f == "--context")
      c.context = v;
    else if (f == "--layers")
      c.layers = v;
    else if (f == "--prompt")
      prompt_len = v;
    else if (f == "--new")
      n = v;
    else if (f == "--old-tokens")
      old_tokens = v;
    else if (f == "--max-len")
      max_len = v;
    else if (f == "--threads")
      threads = int(v);
    else {
      std::fprintf(stderr,
                   "usage: bench_generate [--context N] [--layers N] [--prompt N] [--new N] [--old-tokens N] "
                   "[--max-len N] [--threads N]\n");
      return 2;
    }
  }
  CpuBackend be(threads);
  Context ctx(be);
  Transformer model(ctx, c, 1);
  std::printf("model: %s, %.1fM parameters; cpu, %d threads\n", model.config().describe().c_str(),
              double(model.parameter_count()) / 1e6, be.threads());
  std::vector<int32_t> prompt(static_cast<size_t>(prompt_len));
  for (int64_t i = 0; i < prompt_len; ++i) prompt[size_t(i)] = int32_t((i * 7919 + 13) % c.vocab);

  GeneratorOptions go;
  go.max_len = max_len;
  Generator gen(ctx, model, go);
  SamplingOptions greedy;
  greedy.temperature = 0;
  gen.generate(prompt, 2, greedy);  // builds the prefill and step graphs
  auto t0 = Clock::now();
  Clock::time_point first;
  const std::vector<int32_t> out = gen.generate(prompt, n, greedy, {}, [&](int32_t) {
    if (first == Clock::time_point()) first = Clock::now();
    return true;
  });
  const double total = since(t0);
  const double prefill = std::chrono::duration<double>(first - t0).count();
  std::printf(
      "kv cache (max_len %lld): prompt %lld tokens in %.3f s; %lld new tokens in %.3f s: %.2f tokens/s "
      "(%.2f tokens/s after the first)\n",
      (long long)gen.max_len(), (long long)prompt_len, prefill, (long long)n, total, double(n) / total,
      double(n - 1) / (total - prefill));
  if (old_tokens > 0) {
    std::vector<int32_t> old;
    const double tps = full_context_tokens_per_second(ctx, model, prompt, old_tokens, &old);
    const bool same = std::equal(old.begin(), old.end(), out.begin());
    std::printf(
        "full-context forward per token (T = %lld): %.4f tokens/s over %lld tokens (%s the kv-cache "
        "tokens); kv cache / full = %.0fx\n",
        (long long)c.context, tps, (long long)old_tokens, same ? "same as" : "DIFFERENT from",
        double(n) / total / tps);
  }
  return 0;
}
