// Greedy text generation in llama.cpp (CPU), to check that a model retort exported runs there and to compare
// its continuation with retort's. Built and run by tools/llamacpp_export_compare.sh.
//   complete MODEL.gguf PROMPT N_TOKENS   ->  prints the prompt's ids, then each generated id and its text
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "llama.h"

static int fail(const char* what) {
  std::fprintf(stderr, "complete: %s\n", what);
  return 1;
}

int main(int argc, char** argv) {
  if (argc != 4) return fail("usage: complete MODEL.gguf PROMPT N_TOKENS");
  const std::string prompt = argv[2];
  const int n_new = std::atoi(argv[3]);
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (!model) return fail("cannot load the model");
  const llama_vocab* vocab = llama_model_get_vocab(model);
  std::vector<llama_token> ids(prompt.size() + 16);
  const int n = llama_tokenize(vocab, prompt.data(), int32_t(prompt.size()), ids.data(), int32_t(ids.size()),
                               false, false);
  if (n <= 0) return fail("tokenization failed");
  ids.resize(size_t(n));
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = uint32_t(n + n_new);
  cp.n_batch = cp.n_ctx;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) return fail("cannot create a context");
  std::printf("prompt ids:");
  for (llama_token t : ids) std::printf(" %d", t);
  std::printf("\ngenerated ids:");
  std::string text;
  llama_batch batch = llama_batch_get_one(ids.data(), int32_t(ids.size()));
  const int n_vocab = llama_vocab_n_tokens(vocab);
  llama_token next = 0;
  for (int i = 0; i < n_new; ++i) {
    if (llama_decode(ctx, batch) != 0) return fail("llama_decode failed");
    const float* logits = llama_get_logits_ith(ctx, -1);
    next = 0;
    for (int v = 1; v < n_vocab; ++v)
      if (logits[v] > logits[next]) next = v;
    std::printf(" %d", next);
    if (llama_vocab_is_eog(vocab, next)) break;  // retort's generate stops there too, printing nothing of it
    char piece[256];
    const int len = llama_token_to_piece(vocab, next, piece, sizeof piece, 0, false);
    if (len > 0) text.append(piece, size_t(len));
    batch = llama_batch_get_one(&next, 1);
  }
  std::printf("\ntext: %s%s\n", prompt.c_str(), text.c_str());
  llama_free(ctx);
  llama_model_free(model);
  return 0;
}
