// Writes small vocabularies in GPT-2's format (encoder.json, a NUL byte, vocab.bpe) into the directory given as
// argv[1]: the seed corpus of fuzz_gpt2_vocab. Each has the 256 byte tokens in GPT-2's byte-to-unicode alphabet
// and a few merges; one has an <|endoftext|> token.
// SOURCES: src/core/error.cpp src/io/file.cpp src/core/atomic_file.cpp src/io/json.cpp src/io/unicode_classes.cpp
// SOURCES: src/io/pretokenize.cpp src/io/special_matcher.cpp src/io/tokenizer.cpp
// SOURCES: src/io/tokenizer_files.cpp src/io/tokenizer_hf.cpp src/io/bpe_train.cpp
// SOURCES: src/io/crc32.cpp
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/tokenizer.h"

int main(int argc, char** argv) {
  if (argc != 2) return std::fprintf(stderr, "usage: seeds_gpt2_vocab DIR\n"), 2;
  const std::string dir = argv[1];
  std::string corpus;
  for (int i = 0; i < 30; ++i) corpus += "the quick brown fox jumps over the lazy dog " + std::to_string(i) + "\n";
  try {
    int n = 0;
    for (int64_t vocab : {260, 300}) {
      retort::BpeTrainOptions o;
      o.vocab_size = vocab;
      o.special_tokens = vocab == 300 ? std::vector<std::string>{"<|endoftext|>"} : std::vector<std::string>{};
      const retort::Tokenizer tok = retort::Tokenizer::train(corpus, o);
      // encoder.json: token text (GPT-2's alphabet) -> id; vocab.bpe: "#version" then merges, best first.
      std::string enc = "{", bpe = "#version: 0.2\n";
      for (int32_t id = 0; id < tok.vocab_size(); ++id) {
        std::string t;
        for (char c : tok.token_text(id)) {
          if (c == '"' || c == '\\') t += '\\';
          t += c;
        }
        enc += (id ? ", \"" : "\"") + t + "\": " + std::to_string(id);
      }
      enc += "}";
      for (const retort::Tokenizer::Merge& m : tok.merges())
        bpe += tok.token_text(m.left) + " " + tok.token_text(m.right) + "\n";
      std::ofstream(dir + "/vocab" + std::to_string(n++) + ".bin", std::ios::binary) << enc << '\0' << bpe;
    }
  } catch (const retort::Error& e) {
    return std::fprintf(stderr, "seeds_gpt2_vocab: %s\n", e.what()), 1;
  }
  return 0;
}
