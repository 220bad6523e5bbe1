// Helpers for the file-format tests: a scratch directory per test, byte-level file surgery (flip, truncate,
// patch), an "expect this call to throw retort::Error mentioning these words" check, and the one place that
// knows where the vendored data (GPT-2's vocabulary, the corpus) lives.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace retort::test {

// A fresh directory under the system temp dir, removed with its contents on destruction.
class ScratchDir {
 public:
  ScratchDir();
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  // Names of the entries in the directory (to check no temporary files are left behind).
  std::vector<std::string> entries() const;

 private:
  std::string path_;
};

std::vector<uint8_t> slurp(const std::string& path);
void spit(const std::string& path, const std::vector<uint8_t>& bytes);
void flip_byte(const std::string& path, size_t offset, uint8_t mask = 0x01);
void truncate_to(const std::string& path, size_t size);
void patch_le32(const std::string& path, size_t offset, uint32_t value);
void patch_le64(const std::string& path, size_t offset, uint64_t value);

// Runs fn, which must throw retort::Error whose message contains every needle. Returns the message.
std::string expect_error(const std::function<void()>& fn, const std::vector<std::string>& needles);

// The vendored data file `rel` ("gpt2/encoder.json", "corpus/kjv.txt"): from /work/shared/data, else from the
// build's unpacked data/ (RETORT_TEST_DATA_DIR), else nothing. $RETORT_DATA_DIR overrides both.
std::optional<std::string> find_data_file(const std::string& rel);
// Where find_data_file looked, for skip messages.
std::string data_search_path();

}  // namespace retort::test

// Skips the test, saying so, unless the data file exists; binds its path to `var`.
#define RT_REQUIRE_DATA(var, rel)                                                                           \
  std::string var;                                                                                          \
  if (auto found_ = ::retort::test::find_data_file(rel)) {                                                  \
    var = *found_;                                                                                          \
  } else {                                                                                                  \
    GTEST_SKIP() << "data file " << (rel) << " not found (looked in " << ::retort::test::data_search_path() \
                 << ")";                                                                                    \
  }
