// Runs a GGUF model in llama.cpp (CPU) over a text and writes what retort is compared against: llama.cpp's
// tokenization of the text and its logits at every position. Built and run by tools/llamacpp_compare.sh.
//   dump_logits MODEL.gguf TEXT_FILE MAX_TOKENS OUT_PREFIX   ->  OUT_PREFIX.ids (i32), OUT_PREFIX.logits
//   (f32)
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "llama.h"

static int fail(const char* what) {
  std::fprintf(stderr, "dump_logits: %s\n", what);
  return 1;
}

int main(int argc, char** argv) {
  if (argc != 5) return fail("usage: dump_logits MODEL.gguf TEXT_FILE MAX_TOKENS OUT_PREFIX");
  std::ifstream in(argv[2], std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  const int max_tokens = std::atoi(argv[3]);
  const std::string out = argv[4];

  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (!model) return fail("cannot load the model");
  const llama_vocab* vocab = llama_model_get_vocab(model);
  const int n_vocab = llama_vocab_n_tokens(vocab);

  // No BOS/EOS added and no special-token parsing: plain text, as retort encodes it by default.
  std::vector<llama_token> ids(text.size() + 16);
  int n =
      llama_tokenize(vocab, text.data(), int32_t(text.size()), ids.data(), int32_t(ids.size()), false, false);
  if (n < 0) return fail("tokenization failed");
  ids.resize(size_t(n < max_tokens ? n : max_tokens));
  n = int(ids.size());

  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = uint32_t(n);
  cp.n_batch = uint32_t(n);
  cp.n_ubatch = uint32_t(n);
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) return fail("cannot create a context");
  llama_batch batch = llama_batch_init(n, 0, 1);
  for (int i = 0; i < n; ++i) {
    batch.token[i] = ids[size_t(i)];
    batch.pos[i] = i;
    batch.n_seq_id[i] = 1;
    batch.seq_id[i][0] = 0;
    batch.logits[i] = 1;
  }
  batch.n_tokens = n;
  if (llama_decode(ctx, batch) != 0) return fail("llama_decode failed");

  std::FILE* f = std::fopen((out + ".ids").c_str(), "wb");
  std::fwrite(ids.data(), sizeof(llama_token), ids.size(), f);
  std::fclose(f);
  f = std::fopen((out + ".logits").c_str(), "wb");
  for (int i = 0; i < n; ++i) std::fwrite(llama_get_logits_ith(ctx, i), sizeof(float), size_t(n_vocab), f);
  std::fclose(f);
  std::printf("dump_logits: %d tokens, vocabulary %d -> %s.{ids,logits}\n", n, n_vocab, out.c_str());
  llama_batch_free(batch);
  llama_free(ctx);
  llama_model_free(model);
  return 0;
}
