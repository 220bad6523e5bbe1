// libFuzzer harness for Tokenizer::from_hf_json: the input is a Hugging Face tokenizer.json and, after the
// first NUL byte if there is one, a tokenizer_config.json. When it loads, a few strings (and the input's own
// first bytes) are encoded and decoded. A retort::Error is the expected answer to a bad file; a crash, a
// sanitizer report, any other exception, a retort internal error, an id out of range or a lossy round trip
// is a finding.
// Run it with tools/fuzz.sh (seeds: tests/fuzz/seeds_tokenizer_json.cpp; real tokenizer.json files, such as
// the ones `RETORT_SAVE_TOKENIZERS=DIR pytest bindings/tests/test_tokenizers_hf.py` saves, make better seeds:
// copy them into build-fuzz/corpus/tokenizer_json/).
//
// SOURCES: src/core/error.cpp src/io/file.cpp src/core/atomic_file.cpp src/io/json.cpp src/io/unicode_classes.cpp
// SOURCES: src/io/pretokenize.cpp src/io/special_matcher.cpp src/io/tokenizer.cpp
// SOURCES: src/io/tokenizer_files.cpp src/io/tokenizer_hf.cpp src/io/bpe_train.cpp
// SOURCES: src/io/crc32.cpp
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "io/tokenizer.h"

namespace {

void finding(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_tokenizer_json: %s: %s\n", what, detail.c_str());
  std::abort();
}

// text without the bytes the vocabulary has no token for (what encode() drops).
std::string without(std::string_view text, const std::vector<uint8_t>& missing) {
  std::string out;
  for (char c : text)
    if (std::find(missing.begin(), missing.end(), uint8_t(c)) == missing.end()) out += c;
  return out;
}

void exercise(const retort::Tokenizer& tok, std::string_view input) {
  const std::string texts[] = {
      "",
      "Hello world! It's 2024 -- HELLO'S \r\n\r\n\t caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x98\x80 x",
      "<|endoftext|>a<|im_start|>user\nhi<|im_end|>\n<pad><s></s>",
      "\xFF\xFE\x80 \x04\x00 12345678 '''   ",
      std::string(input.substr(0, 256)),
  };
  const std::vector<uint8_t> missing = tok.missing_bytes();
  for (const std::string& text : texts) {
    for (bool allow : {false, true}) {
      std::vector<int32_t> ids = tok.encode(text, allow);
      for (int32_t id : ids)
        if (id < 0 || id >= tok.vocab_size()) finding("id out of range", std::to_string(id));
      std::string back = tok.decode(ids);
      // With specials, a special's text may hold bytes that have no token: only the plain path is exact.
      if (!allow && back != without(text, missing)) finding("lossy round trip", text);
      if (allow && missing.empty() && back != text) finding("lossy round trip with specials", text);
    }
  }
  // The model-file description rebuilds an equal tokenizer.
  retort::Tokenizer again = retort::Tokenizer::from_spec(tok.to_spec());
  if (again.encode(texts[1], true) != tok.encode(texts[1], true)) finding("to_spec", "encodes differently");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view all(reinterpret_cast<const char*>(data), size);
  size_t nul = all.find('\0');
  std::string_view json = all.substr(0, nul),
                   config = nul == std::string_view::npos ? "" : all.substr(nul + 1);
  try {
    retort::Tokenizer tok = retort::Tokenizer::from_hf_json(json, config, "fuzz/tokenizer.json");
    exercise(tok, all);
  } catch (const retort::Error& e) {
    // RT_ASSERT's message; a file's fault starts with the source name instead (and may quote these words).
    if (std::string_view(e.what()).starts_with("retort internal error")) finding("internal", e.what());
  }
  return 0;
}
