// golden_inputs PATH: writes the golden test's inputs (tests/data/golden/inputs.safetensors): each model's
// initial parameters, an evaluation batch and the training batches, with the configs and the training
// recipe as metadata for tools/golden/make_golden.py. The file is committed; run this only to change it
// (then regenerate the fixtures, see tools/golden/README.md).
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "golden_spec.h"

using namespace retort;

namespace {

std::string num(double x) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", x);
  return buf;
}

std::string config_json(const TransformerConfig& c, const Transformer& m) {
  std::string order;
  for (const Tensor* p : m.parameters()) order += (order.empty() ? "" : ",") + p->name;
  return "{\"vocab\":" + std::to_string(c.vocab) + ",\"context\":" + std::to_string(c.context) +
         ",\"layers\":" + std::to_string(c.layers) + ",\"d_model\":" + std::to_string(c.d_model) +
         ",\"heads\":" + std::to_string(c.heads) + ",\"kv_heads\":" + std::to_string(c.kv_heads) +
         ",\"d_ff\":" + std::to_string(c.d_ff) + ",\"rope_theta\":" + num(c.rope_theta) +
         ",\"norm_eps\":" + num(c.norm_eps) + ",\"tie_embeddings\":" + (c.tie_embeddings ? "true" : "false") +
         ",\"param_order\":\"" + order + "\"}";
}

std::string train_json(const golden::TrainSpec& t) {
  return "{\"steps\":" + std::to_string(t.steps) + ",\"warmup\":" + std::to_string(t.warmup) +
         ",\"total\":" + std::to_string(t.total) + ",\"lr_max\":" + num(t.lr_max) +
         ",\"lr_min\":" + num(t.lr_min) + ",\"beta1\":" + num(t.beta1) + ",\"beta2\":" + num(t.beta2) +
         ",\"eps\":" + num(t.eps) + ",\"weight_decay\":" + num(t.weight_decay) + ",\"clip\":" + num(t.clip) +
         "}";
}

// Parameters scaled so that activations are O(1) (unlike the N(0, 0.02) training init, under which the
// attention is nearly uniform and the logits nearly flat, which would test little): weights N(0, 1/fan_in),
// norm weights 1 + N(0, 0.2^2) so that a wrong use of them shows.
void init_params(Transformer& m, std::mt19937_64& rng) {
  for (Tensor* p : m.parameters()) {
    std::vector<float> v(static_cast<size_t>(p->nelements()));
    const bool is_norm = p->n_dims() == 1;
    const double fan_in = double(p->ne[0]);
    std::normal_distribution<float> d(
        0.0f, is_norm ? 0.2f : float(p->name == "tok_emb" ? 0.5 : 1.0 / std::sqrt(fan_in)));
    for (float& x : v) x = (is_norm ? 1.0f : 0.0f) + d(rng);
    set_data(p, v);
  }
}

// Sequences that follow t' = (5 t + 3) mod vocab except for a random token now and then: learnable, so
// the training loss falls, yet not trivially so.
void fill_sequences(std::mt19937_64& rng, int64_t n_seq, int64_t vocab, std::vector<int64_t>& tokens,
                    std::vector<int64_t>& targets) {
  std::uniform_int_distribution<int64_t> tok(0, vocab - 1);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int64_t s = 0; s < n_seq; ++s) {
    std::vector<int64_t> seq(static_cast<size_t>(golden::kSeq + 1));
    seq[0] = tok(rng);
    for (size_t i = 1; i < seq.size(); ++i) seq[i] = u(rng) < 0.15 ? tok(rng) : (5 * seq[i - 1] + 3) % vocab;
    for (int64_t t = 0; t < golden::kSeq; ++t) {
      tokens.push_back(seq[size_t(t)]);
      targets.push_back(seq[size_t(t + 1)]);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: golden_inputs PATH (tests/data/golden/inputs.safetensors)\n");
    return 2;
  }
  try {
    CpuBackend be(1);
    Context ctx(be);
    std::mt19937_64 rng(20261123);
    std::vector<std::pair<std::string, const Tensor*>> out;
    std::map<std::string, std::string> meta;
    std::string names;
    std::vector<std::unique_ptr<Transformer>> models;
    for (const auto& spec : golden::model_specs()) {
      models.push_back(std::make_unique<Transformer>(ctx, spec.config, 0));
      Transformer& m = *models.back();
      init_params(m, rng);
      for (const Tensor* p : m.parameters()) out.emplace_back(golden::param_key(spec.name, p->name), p);
      meta[spec.name + ".config"] = config_json(m.config(), m);
      names += (names.empty() ? "" : ",") + spec.name;
    }
    const golden::TrainSpec tr;
    const int64_t V = golden::model_specs()[0].config.vocab, B = golden::kBatch, T = golden::kSeq;
    std::vector<int64_t> x, y, tx, ty;
    fill_sequences(rng, B, V, x, y);
    // A few ignored targets, so that the mean counts only the others.
    y[3] = y[T + 7] = y[T + 8] = golden::kIgnoreIndex;
    fill_sequences(rng, tr.steps * B, V, tx, ty);
    Tensor* tokens = ctx.input(DType::I32, {B, T}, "tokens");
    Tensor* targets = ctx.input(DType::I32, {B, T}, "targets");
    Tensor* train_tokens = ctx.input(DType::I32, {tr.steps, B, T}, "train_tokens");
    Tensor* train_targets = ctx.input(DType::I32, {tr.steps, B, T}, "train_targets");
    set_data_int(tokens, x);
    set_data_int(targets, y);
    set_data_int(train_tokens, tx);
    set_data_int(train_targets, ty);
    out.emplace_back("tokens", tokens);
    out.emplace_back("targets", targets);
    out.emplace_back("train_tokens", train_tokens);
    out.emplace_back("train_targets", train_targets);
    meta["models"] = names;
    meta["train"] = train_json(tr);
    meta["ignore_index"] = std::to_string(golden::kIgnoreIndex);
    meta["description"] =
        "retort golden test inputs (tests/nn/golden_inputs.cpp): initial parameters per model, evaluation "
        "batch tokens/targets [B, T], training batches train_tokens/train_targets [steps, B, T]";
    save_safetensors(argv[1], out, meta);
    std::printf("wrote %s\n", argv[1]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "golden_inputs: %s\n", e.what());
    return 1;
  }
  return 0;
}
