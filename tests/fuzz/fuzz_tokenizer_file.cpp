// libFuzzer harness for retort's own tokenizer file (Tokenizer::from_bytes, what Tokenizer::load and a
// checkpoint's embedded tokenizer read): any input must either load or throw retort::Error. A loaded
// tokenizer encodes and decodes a few strings (and the input's own first bytes); an id out of range, a lossy
// plain round trip, a crash, a sanitizer report, any other exception or a retort internal error is a finding.
// The harness writes the right CRC-32 into the header first (the file format's layout: 40-byte header for version
// 1, 48 for version 2, the checksum in its last 4 bytes), so mutations reach the checks behind the checksum.
// Run it with tools/fuzz.sh (seeds: tests/fuzz/seeds_tokenizer_file.cpp, files written by Tokenizer::save).
//
// SOURCES: src/core/error.cpp src/io/file.cpp src/core/atomic_file.cpp src/io/json.cpp src/io/unicode_classes.cpp
// SOURCES: src/io/pretokenize.cpp src/io/special_matcher.cpp src/io/tokenizer.cpp
// SOURCES: src/io/tokenizer_files.cpp src/io/tokenizer_hf.cpp src/io/bpe_train.cpp
// SOURCES: src/io/crc32.cpp
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "io/file.h"
#include "io/tokenizer.h"

namespace {

void finding(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_tokenizer_file: %s: %s\n", what, detail.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> file(data, data + size);
  if (size >= 12) {
    const size_t header = file[8] == 1 && file[9] == 0 && file[10] == 0 && file[11] == 0 ? 40 : 48;
    if (size >= header) {
      const uint32_t crc = retort::io::crc32_update(retort::io::crc32(file.data(), header - 4), file.data() + header,
                                                    size - header);
      for (int i = 0; i < 4; ++i) file[header - 4 + size_t(i)] = uint8_t(crc >> (8 * i));
    }
  }
  try {
    const retort::Tokenizer tok = retort::Tokenizer::from_bytes(file, "fuzz.tok");
    const std::vector<uint8_t> missing = tok.missing_bytes();
    const std::string texts[] = {
        "",
        "Hello world! It's 2024 -- caf\xC3\xA9 \xE6\x97\xA5 \xF0\x9F\x98\x80 \r\n\t x",
        "<|endoftext|>a<|im_start|>hi<|im_end|>",
        std::string(reinterpret_cast<const char*>(data), std::min<size_t>(size, 256)),
    };
    for (const std::string& text : texts)
      for (bool allow : {false, true}) {
        const std::vector<int32_t> ids = tok.encode(text, allow);
        for (int32_t id : ids)
          if (id < 0 || id >= tok.vocab_size()) finding("id out of range", std::to_string(id));
        const std::string back = tok.decode(ids);
        if (!allow) {
          std::string expect;
          for (char c : text)
            if (std::find(missing.begin(), missing.end(), uint8_t(c)) == missing.end()) expect += c;
          if (back != expect) finding("lossy round trip", text);
        }
      }
  } catch (const retort::Error& e) {
    // RT_ASSERT's message; a file's fault starts with the file's name instead.
    if (std::string_view(e.what()).starts_with("retort internal error")) finding("internal", e.what());
  }
  return 0;
}
