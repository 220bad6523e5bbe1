// Writes small valid tokenizer files (Tokenizer::save) into the directory given as argv[1]: the seed corpus of
// fuzz_tokenizer_file: byte-level BPE trained on a few sentences, with specials, and with other pre-tokenizers.
// SOURCES: src/core/error.cpp src/io/file.cpp src/core/atomic_file.cpp src/io/json.cpp src/io/unicode_classes.cpp
// SOURCES: src/io/pretokenize.cpp src/io/special_matcher.cpp src/io/tokenizer.cpp
// SOURCES: src/io/tokenizer_files.cpp src/io/tokenizer_hf.cpp src/io/bpe_train.cpp
// SOURCES: src/io/crc32.cpp
#include <cstdio>
#include <string>

#include "core/error.h"
#include "io/tokenizer.h"

int main(int argc, char** argv) {
  if (argc != 2) return std::fprintf(stderr, "usage: seeds_tokenizer_file DIR\n"), 2;
  const std::string dir = argv[1];
  std::string corpus;
  for (int i = 0; i < 40; ++i)
    corpus += "It is a truth universally acknowledged, that a single man in possession of a good fortune " +
              std::to_string(1811 + i) + " must be in want of a wife.\n";
  try {
    retort::BpeTrainOptions o;
    o.vocab_size = 300;
    retort::Tokenizer::train(corpus, o).save(dir + "/gpt2_300.tok");
    o.special_tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    o.vocab_size = 280;
    retort::Tokenizer::train(corpus, o).save(dir + "/specials.tok");
    o.pre = retort::PreTokenizer::Llama3;
    retort::Tokenizer::train(corpus, o).save(dir + "/llama3.tok");
    o.special_tokens = {};
    o.vocab_size = 256;
    o.pre = retort::PreTokenizer::Gpt2;
    retort::Tokenizer::train(corpus, o).save(dir + "/bytes.tok");
  } catch (const retort::Error& e) {
    return std::fprintf(stderr, "seeds_tokenizer_file: %s\n", e.what()), 1;
  }
  return 0;
}
