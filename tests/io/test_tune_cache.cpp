// The tune cache file (src/cuda/tune_cache.h): round trip, signatures, merging, and every malformed line.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "io/file.h"
#include "cuda/tune_cache.h"
#include "io_test_util.h"

namespace retort::test {
namespace {

using namespace retort::io;
using namespace retort::cuda;

void put(const std::string& path, const std::string& text) {
  spit(path, std::vector<uint8_t>(text.begin(), text.end()));
}

TEST(TuneCache, MissingFileIsEmpty) {
  ScratchDir dir;
  EXPECT_TRUE(read_tune_cache(dir.file("none.txt"), "sig").empty());
}

TEST(TuneCache, RoundTripUnderItsSignatureOnly) {
  ScratchDir dir;
  const std::string p = dir.file("c.txt");
  const std::vector<TuneEntry> in = {{{3, -1, 4, 1099511627776}, {8, 5, 2}}, {{7}, {0}}};
  write_tune_cache(p, "NVIDIA H100 80GB HBM3 sm 132 lt 130000", in);
  const auto out = read_tune_cache(p, "NVIDIA H100 80GB HBM3 sm 132 lt 130000");
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].key, in[0].key);
  EXPECT_EQ(out[0].value, in[0].value);
  EXPECT_EQ(out[1].key, in[1].key);
  EXPECT_EQ(out[1].value, in[1].value);
  EXPECT_TRUE(read_tune_cache(p, "another GPU").empty());
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"c.txt"});  // no temporary file left
}

TEST(TuneCache, MergesUnderTheSameSignatureAndReplacesAnother) {
  ScratchDir dir;
  const std::string p = dir.file("c.txt");
  write_tune_cache(p, "a", {{{1, 2}, {10}}, {{3, 4}, {30}}});
  write_tune_cache(p, "a", {{{3, 4}, {31}}, {{5, 6}, {50}}});  // the new value of {3, 4} wins
  auto out = read_tune_cache(p, "a");
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].key, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(out[0].value, std::vector<int64_t>{10});
  EXPECT_EQ(out[1].key, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(out[1].value, std::vector<int64_t>{31});
  EXPECT_EQ(out[2].value, std::vector<int64_t>{50});
  write_tune_cache(p, "b", {{{9}, {90}}});  // another signature: the file is replaced
  EXPECT_TRUE(read_tune_cache(p, "a").empty());
  out = read_tune_cache(p, "b");
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].value, std::vector<int64_t>{90});
}

TEST(TuneCache, MalformedFilesNameTheFileAndLine) {
  ScratchDir dir;
  const std::string p = dir.file("bad.txt");
  put(p, "not a cache\n");
  expect_error([&] { read_tune_cache(p, "s"); }, {p, "not a retort tune cache"});
  put(p, "");
  expect_error([&] { read_tune_cache(p, "s"); }, {p, "not a retort tune cache"});
  put(p, "retort tune cache 1\n");
  expect_error([&] { read_tune_cache(p, "s"); }, {p, "line 2", "signature"});
  const std::string head = "retort tune cache 1\nsignature s\n";
  for (const char* line :
       {"1 2 3", "1 2 : ", " : 4", "1 x : 4", "1 2 : 4 5y", "1 2 : 99999999999999999999", "1,2 : 3"}) {
    put(p, head + "5 : 6\n" + line + "\n");
    expect_error([&] { read_tune_cache(p, "s"); }, {p, "line 4", "expected"});
  }
  put(p, head + "5 6 : 7\n5 6 : 8\n");
  expect_error([&] { read_tune_cache(p, "s"); }, {p, "line 4", "repeated"});
  std::string long_key = head;
  for (int i = 0; i < 65; ++i) long_key += std::to_string(i) + " ";
  put(p, long_key + ": 1\n");
  expect_error([&] { read_tune_cache(p, "s"); }, {p, "line 3"});
  // A malformed file is not overwritten silently either.
  put(p, "garbage\n");
  expect_error([&] { write_tune_cache(p, "s", {{{1}, {2}}}); }, {p, "not a retort tune cache"});
  // Blank lines and a missing final newline are fine.
  put(p, head + "\n1 2 : 3\n\n4 : 5 6");
  const auto out = read_tune_cache(p, "s");
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[1].value, (std::vector<int64_t>{5, 6}));
}

TEST(TuneCache, BadEntriesAndSignaturesAreRefused) {
  ScratchDir dir;
  const std::string p = dir.file("c.txt");
  expect_error([&] { write_tune_cache(p, "two\nlines", {{{1}, {2}}}); }, {p, "newline"});
  expect_error([&] { write_tune_cache(p, "s", {{{}, {2}}}); }, {p, "entry"});
  expect_error([&] { write_tune_cache(p, "s", {{{1}, {}}}); }, {p, "entry"});
  EXPECT_TRUE(dir.entries().empty());
  expect_error([&] { write_tune_cache(dir.file("no/such/dir/c.txt"), "s", {{{1}, {2}}}); }, {"no/such/dir"});
}

}  // namespace
}  // namespace retort::test
