// Writes small valid token shards (u16 and u32, empty, one token, a few windows) into the directory given as
// argv[1]: the seed corpus of fuzz_token_shard, made by the library's own writer.
// SOURCES: src/io/shards.cpp src/io/file.cpp src/core/atomic_file.cpp src/core/error.cpp
// SOURCES: src/io/json.cpp src/io/unicode_classes.cpp src/io/pretokenize.cpp src/io/special_matcher.cpp
// SOURCES: src/io/tokenizer.cpp src/io/tokenizer_files.cpp src/io/tokenizer_hf.cpp src/io/bpe_train.cpp
// SOURCES: src/io/crc32.cpp
#include <cstdio>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/shards.h"

int main(int argc, char** argv) {
  if (argc != 2) return std::fprintf(stderr, "usage: seeds_token_shard DIR\n"), 2;
  const std::string dir = argv[1];
  try {
    std::vector<int32_t> toks;
    for (int i = 0; i < 300; ++i) toks.push_back((i * 37 + 11) % 50000);
    retort::write_token_shard(dir + "/u16.bin", toks, retort::TokenDType::U16);
    for (int32_t& t : toks) t += 70000;
    retort::write_token_shard(dir + "/u32.bin", toks, retort::TokenDType::U32);
    retort::write_token_shard(dir + "/empty.bin", {}, retort::TokenDType::U16);
    retort::write_token_shard(dir + "/one.bin", std::vector<int32_t>{7}, retort::TokenDType::U32);
    retort::write_token_shard(dir + "/short.bin", std::vector<int32_t>{1, 2, 3, 4, 5, 6},
                              retort::TokenDType::U16);
  } catch (const retort::Error& e) {
    return std::fprintf(stderr, "seeds_token_shard: %s\n", e.what()), 1;
  }
  return 0;
}
