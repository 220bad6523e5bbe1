// The golden test's setup, shared by the inputs generator (golden_inputs.cpp) and the test
// (test_golden.cpp): the two tiny models, the batch shapes and the training recipe. The reference script
// tools/golden/make_golden.py reads all of it from the inputs file's metadata, so it is stated only here.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "retort.h"

namespace retort::golden {

// Two variants cover both head layouts and both lm heads: "tied" uses grouped-query attention (4 query
// heads on 2 kv heads) and the embedding as the head; "untied" plain multi-head attention and its own head.
struct ModelSpec {
  std::string name;
  TransformerConfig config;
};

inline std::vector<ModelSpec> model_specs() {
  TransformerConfig c;
  c.vocab = 64;
  c.context = 16;
  c.layers = 2;
  c.d_model = 32;
  c.heads = 4;
  c.d_ff = 48;
  c.rope_theta = 10000.0f;
  c.norm_eps = 1e-5f;
  TransformerConfig tied = c, untied = c;
  tied.kv_heads = 2;
  tied.tie_embeddings = true;
  untied.kv_heads = 4;
  untied.tie_embeddings = false;
  return {{"tied", tied.resolved()}, {"untied", untied.resolved()}};
}

inline constexpr int64_t kBatch = 2, kSeq = 16;  // tokens [B, T], T = the context
inline constexpr int64_t kIgnoreIndex = -100;

// examples/train.cpp's step: clip the global gradient norm, lr from cosine_lr (warmup, then cosine to
// lr_min), AdamW with decoupled weight decay on every parameter.
struct TrainSpec {
  int64_t steps = 10, warmup = 2, total = 10;
  float lr_max = 0.01f, lr_min = 0.001f;
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
  float clip = 1.0f;
};

// Tolerances of the comparison, relative to the largest |reference| of each tensor. retort computes in f32
// (sums in double here and there), the reference in float64. Measured (CPU): logits 5e-7, loss < 1e-7,
// gradients 1e-6, training losses 3e-7, gradient norms 3e-6: the tolerances leave a 10-20x margin. Any
// mismatch of the model's math (RoPE pairing, eps placement, head grouping, decay) is O(1e-2) or more.
inline constexpr double kTolLogits = 1e-5, kTolLoss = 1e-6, kTolGrad = 2e-5, kTolTrainLoss = 3e-5;

inline std::string param_key(const std::string& model, const std::string& param) {
  return model + "/params/" + param;
}

}  // namespace retort::golden
