// Writes small valid checkpoints (tied and untied, with qkv biases, with and without AdamW state) into the
// directory given as argv[1]: the seed corpus of fuzz_checkpoint, made by the library's own writer.
// SOURCES: src/core/*.cpp src/ops/*.cpp src/ops/loss/*.cpp src/io/*.cpp src/nn/*.cpp src/cuda/cuda_stub.cpp
#include <cstdio>
#include <string>

#include "core/cpu_backend.h"
#include "nn/lm.h"
#include "nn/optim.h"
#include "nn/transformer.h"

int main(int argc, char** argv) {
  if (argc != 2) return std::fprintf(stderr, "usage: seeds_checkpoint DIR\n"), 2;
  const std::string dir = argv[1];
  try {
    retort::CpuBackend backend(1);
    int i = 0;
    for (bool tied : {true, false})
      for (bool bias : {false, true}) {
        retort::Context ctx(backend);
        retort::TransformerConfig c;
        c.vocab = 11;
        c.context = 4;
        c.layers = 1;
        c.d_model = 4;
        c.heads = 2;
        c.kv_heads = bias ? 1 : 2;
        c.d_ff = 6;
        c.tie_embeddings = tied;
        c.qkv_bias = bias;
        retort::Transformer model(ctx, c, 1);
        retort::AdamW opt(model.parameters(), retort::AdamWConfig{});
        retort::TrainState st;
        st.step = 0;
        retort::save_checkpoint(dir + "/ck" + std::to_string(i++) + ".safetensors", model,
                                bias ? &opt : nullptr, st, {{"tokenizer", "seed"}});
      }
  } catch (const retort::Error& e) {
    return std::fprintf(stderr, "seeds_checkpoint: %s\n", e.what()), 1;
  }
  return 0;
}
