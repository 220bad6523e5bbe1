// libFuzzer harness for GPT-2's vocabulary files (Tokenizer::load_gpt2): the input is encoder.json and, after
// the first NUL byte, vocab.bpe, each written to a scratch file. Any input must either load or throw
// retort::Error; a loaded vocabulary encodes and decodes a few strings, and an id out of range, a lossy plain
// round trip, a crash, a sanitizer report, any other exception or a retort internal error is a finding.
// Run it with tools/fuzz.sh (seeds: tests/fuzz/seeds_gpt2_vocab.cpp, small vocabularies in GPT-2's format).
//
// SOURCES: src/core/error.cpp src/io/file.cpp src/core/atomic_file.cpp src/io/json.cpp src/io/unicode_classes.cpp
// SOURCES: src/io/pretokenize.cpp src/io/special_matcher.cpp src/io/tokenizer.cpp
// SOURCES: src/io/tokenizer_files.cpp src/io/tokenizer_hf.cpp src/io/bpe_train.cpp
// SOURCES: src/io/crc32.cpp
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <utility>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_util.h"
#include "io/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* kName = "fuzz_gpt2_vocab";
  const std::string_view all(reinterpret_cast<const char*>(data), size);
  const size_t nul = all.find('\0');
  const std::string_view enc = all.substr(0, nul), bpe = nul == std::string_view::npos ? "" : all.substr(nul + 1);
  // Two scratch files of this process (fuzz::scratch_file keeps one path per process).
  static const std::string base = (std::getenv("TMPDIR") && *std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") +
                                  std::string("/fuzz_gpt2_vocab_") + std::to_string(::getpid());
  static const std::string enc_path = base + ".json", bpe_path = base + ".bpe";
  for (auto [path, text] : {std::pair{&enc_path, enc}, std::pair{&bpe_path, bpe}}) {
    std::FILE* f = std::fopen(path->c_str(), "wb");
    if (!f || (!text.empty() && std::fwrite(text.data(), 1, text.size(), f) != text.size()) || std::fclose(f) != 0)
      fuzz::finding(kName, "setup", "cannot write " + *path);
  }
  try {
    const retort::Tokenizer tok = retort::Tokenizer::load_gpt2(enc_path, bpe_path);
    const std::vector<uint8_t> missing = tok.missing_bytes();
    const std::string texts[] = {"", "Hello world! It's 2024 -- caf\xC3\xA9 \xF0\x9F\x98\x80 \r\n\t x",
                                 std::string(all.substr(0, 200))};
    for (const std::string& text : texts) {
      const std::vector<int32_t> ids = tok.encode(text);
      for (int32_t id : ids)
        if (id < 0 || id >= tok.vocab_size()) fuzz::finding(kName, "id out of range", std::to_string(id));
      std::string expect;
      for (char c : text)
        if (std::find(missing.begin(), missing.end(), uint8_t(c)) == missing.end()) expect += c;
      if (tok.decode(ids) != expect) fuzz::finding(kName, "lossy round trip", text);
    }
  } catch (const retort::Error& e) {
    fuzz::check_error(kName, e);
  }
  return 0;
}
