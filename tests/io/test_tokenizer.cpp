#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <thread>

#include "io/file.h"
#include "io/json.h"
#include "io/pretokenize.h"
#include "io/tokenizer.h"
#include "io/unicode_classes.h"
#include "io_test_util.h"
#include "retort.h"

namespace retort::test {
namespace {

// One place that loads GPT-2's tokenizer (once per process: it takes ~0.2 s), or skips the test.
const Tokenizer* gpt2_or_null() {
  static const std::unique_ptr<Tokenizer> tok = []() -> std::unique_ptr<Tokenizer> {
    auto enc = find_data_file("gpt2/encoder.json");
    auto bpe = find_data_file("gpt2/vocab.bpe");
    if (!enc || !bpe) return nullptr;
    return std::make_unique<Tokenizer>(Tokenizer::load_gpt2(*enc, *bpe));
  }();
  return tok.get();
}
#define RT_REQUIRE_GPT2(var)                                                                     \
  const Tokenizer* var = gpt2_or_null();                                                         \
  if (var == nullptr)                                                                            \
    GTEST_SKIP() << "GPT-2 vocabulary (gpt2/encoder.json, gpt2/vocab.bpe) not found (looked in " \
                 << data_search_path() << ")";

// A slice of the corpus (first `bytes` bytes), or empty when the corpus is absent.
std::string corpus_slice(const std::string& name, size_t bytes) {
  auto p = find_data_file("corpus/" + name);
  if (!p) return "";
  std::string s = io::read_text_file(*p);
  return s.substr(0, bytes);
}

const std::string kExotic =
    "Hello world! It's 2024 -- the caf\xC3\xA9 costs \xE2\x82\xAC"
    "3.50.\n\n\t  Indented\r\n"
    "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xF0\x9F\x98\x80\xF0\x9F\x98\x80 x\xC2\xA0y \xFF\xFE\x80 bad "
    "bytes, "
    "<|endoftext|> and <|endoftext|>s   ";

// ---- GPT-2 ----------------------------------------------------------------------------------------------

TEST(TokenizerGpt2, KnownIds) {
  RT_REQUIRE_GPT2(tok);
  EXPECT_EQ(tok->vocab_size(), 50257);
  EXPECT_EQ(tok->merges().size(), 50000u);
  EXPECT_EQ(tok->encode("Hello world"), (std::vector<int32_t>{15496, 995}));
  EXPECT_EQ(tok->eot_id(), 50256);
  EXPECT_EQ(tok->token_bytes(50256), "<|endoftext|>");
  EXPECT_EQ(tok->encode("\n"), (std::vector<int32_t>{198}));
  EXPECT_EQ(tok->encode(" the"), (std::vector<int32_t>{262}));
  EXPECT_EQ(tok->encode(","), (std::vector<int32_t>{11}));
  EXPECT_EQ(tok->encode("The"), (std::vector<int32_t>{464}));
  EXPECT_EQ(tok->token_id(" world"), 995);
  EXPECT_EQ(tok->token_id("<|endoftext|>"), -1) << "the special token is not an ordinary token";
  // Byte tokens: GPT-2 numbers the printable bytes first ('!' is 0) and the moved ones after.
  EXPECT_EQ(tok->token_id("!"), 0);
  EXPECT_EQ(tok->token_id(std::string(1, '\0')), 188);
  EXPECT_EQ(tok->token_id(" "), 220);
}

TEST(TokenizerGpt2, SpecialTokensOnlyWhenAllowed) {
  RT_REQUIRE_GPT2(tok);
  std::string text = "a<|endoftext|>b";
  std::vector<int32_t> with = tok->encode(text, /*allow_special=*/true);
  ASSERT_EQ(with.size(), 3u);
  EXPECT_EQ(with[1], 50256);
  std::vector<int32_t> without = tok->encode(text);
  EXPECT_EQ(std::count(without.begin(), without.end(), 50256), 0);
  EXPECT_EQ(tok->decode(with), text);
  EXPECT_EQ(tok->decode(without), text);
}

TEST(TokenizerGpt2, RoundTripsExoticTextAndCorpusSlice) {
  RT_REQUIRE_GPT2(tok);
  EXPECT_EQ(tok->decode(tok->encode(kExotic)), kExotic);
  EXPECT_EQ(tok->decode(tok->encode(kExotic, true)), kExotic);
  for (const char* name : {"austen.txt", "kjv.txt"}) {
    std::string slice = corpus_slice(name, 200000);
    if (slice.empty())
      GTEST_SKIP() << "corpus/" << name << " not found (looked in " << data_search_path() << ")";
    std::vector<int32_t> ids = tok->encode(slice);
    EXPECT_EQ(tok->decode(ids), slice) << name;
    // English prose: GPT-2 gets well under half a token per byte.
    EXPECT_LT(double(ids.size()) / double(slice.size()), 0.35) << name;
  }
}

TEST(TokenizerGpt2, EveryMergeIsAppliedAsOneToken) {
  // Each merge result, encoded on its own, is that single token: the BPE loop reproduces the merge table.
  RT_REQUIRE_GPT2(tok);
  int checked = 0;
  for (size_t r = 0; r < tok->merges().size(); r += 97) {
    const std::string& s = tok->token_bytes(tok->merges()[r].result);
    // Only tokens that GPT-2's pre-tokenizer keeps whole (a token like "!\n" straddles two pieces).
    if (io::gpt2_pretokenize(s).size() != 1) continue;
    EXPECT_EQ(tok->encode(s), (std::vector<int32_t>{tok->merges()[r].result})) << "merge " << r;
    ++checked;
  }
  EXPECT_GT(checked, 400);
}

TEST(TokenizerGpt2, SaveLoadKeepsEncodings) {
  RT_REQUIRE_GPT2(tok);
  ScratchDir dir;
  std::string p = dir.file("gpt2.tok");
  tok->save(p);
  Tokenizer back = Tokenizer::load(p);
  EXPECT_EQ(back.vocab_size(), tok->vocab_size());
  EXPECT_EQ(back.eot_id(), 50256);
  EXPECT_EQ(back.encode(kExotic, true), tok->encode(kExotic, true));
  EXPECT_EQ(back.encode("Hello world"), (std::vector<int32_t>{15496, 995}));
}

// ---- a synthetic GPT-2-format vocabulary (no data needed) -----------------------------------------------

// Writes encoder.json / vocab.bpe for the 256 byte tokens plus the merges given as pairs of GPT-2-alphabet
// strings; returns the paths.
std::pair<std::string, std::string> write_mini_gpt2(
    const ScratchDir& dir, const std::vector<std::pair<std::string, std::string>>& merges,
    bool with_eot = true) {
  auto map = Tokenizer::gpt2_byte_to_unicode();
  std::vector<std::string> toks;
  for (int b = 0; b < 256; ++b) {
    std::string s;
    io::utf8_append(s, map[size_t(b)]);
    toks.push_back(s);
  }
  std::string bpe = "#version: 0.2\n";
  for (auto& [a, b] : merges) {
    toks.push_back(a + b);
    bpe += a + " " + b + "\n";
  }
  if (with_eot) toks.push_back("<|endoftext|>");
  std::string json = "{";
  for (size_t i = 0; i < toks.size(); ++i) {
    if (i) json += ", ";
    io::append_json_string(json, toks[i]);
    json += ": " + std::to_string(i);
  }
  json += "}";
  std::string enc = dir.file("encoder.json"), voc = dir.file("vocab.bpe");
  io::write_file_atomic(enc, json.data(), json.size());
  io::write_file_atomic(voc, bpe.data(), bpe.size());
  return {enc, voc};
}

const std::string kG = "\xC4\xA0";  // 'Ġ', GPT-2's stand-in for the space byte

TEST(TokenizerMiniGpt2, LoadsAndEncodesWithMergePriority) {
  ScratchDir dir;
  auto [enc, voc] = write_mini_gpt2(dir, {{"h", "e"}, {kG, "t"}, {kG + "t", "he"}, {"e", "r"}, {"he", "r"}});
  Tokenizer tok = Tokenizer::load_gpt2(enc, voc);
  EXPECT_EQ(tok.vocab_size(), 256 + 5 + 1);
  EXPECT_EQ(tok.token_id(" the"), 258);
  EXPECT_EQ(tok.encode(" the"), (std::vector<int32_t>{258}));
  // "her": "h e" (rank 0) beats "e r" (rank 3), then "he r" applies.
  EXPECT_EQ(tok.encode("her"), (std::vector<int32_t>{260}));
  EXPECT_EQ(tok.token_bytes(260), "her");
  EXPECT_EQ(tok.eot_id(), 261);
  EXPECT_EQ(tok.decode(tok.encode(kExotic, true)), kExotic);
}

TEST(TokenizerMiniGpt2, MalformedFilesAreRejected) {
  ScratchDir dir;
  {
    auto [enc, voc] = write_mini_gpt2(dir, {{"h", "e"}});
    io::write_file_atomic(voc, "#version: 0.2\nh q\n", 18);  // "hq" is not a token
    expect_error([&] { Tokenizer::load_gpt2(enc, voc); }, {voc, "line 2", "not a token"});
    io::write_file_atomic(voc, "#version: 0.2\nhe\n", 17);
    expect_error([&] { Tokenizer::load_gpt2(enc, voc); }, {voc, "line 2", "two symbols"});
    io::write_file_atomic(voc, "#version: 0.2\nh e\nh e\n", 22);
    expect_error([&] { Tokenizer::load_gpt2(enc, voc); }, {voc, "repeats"});
  }
  {
    auto [enc, voc] = write_mini_gpt2(dir, {{"h", "e"}});
    std::string bad = "{\"a\": 0, \"b\": 0}";
    io::write_file_atomic(enc, bad.data(), bad.size());
    expect_error([&] { Tokenizer::load_gpt2(enc, voc); }, {enc, "id 0 is given to two tokens"});
    bad = "{\"a\": 0, \"b\": 7}";
    io::write_file_atomic(enc, bad.data(), bad.size());
    expect_error([&] { Tokenizer::load_gpt2(enc, voc); }, {enc, "has id 7"});
    bad = "{\"a\": 0, \"b\": \"1\"}";
    io::write_file_atomic(enc, bad.data(), bad.size());
    expect_error([&] { Tokenizer::load_gpt2(enc, voc); }, {enc, "not an integer"});
    bad = "{\"a\": 0, \" \": 1}";  // a raw space is outside GPT-2's alphabet
    io::write_file_atomic(enc, bad.data(), bad.size());
    expect_error([&] { Tokenizer::load_gpt2(enc, voc); }, {enc, "outside GPT-2's byte alphabet"});
    bad = "{\"a\": 0, \"b\": 1}";  // too few tokens: most bytes have none
    io::write_file_atomic(enc, bad.data(), bad.size());
    io::write_file_atomic(voc, "#version: 0.2\n", 14);
    expect_error([&] { Tokenizer::load_gpt2(enc, voc); }, {"no token for byte"});
    bad = "[1, 2]";
    io::write_file_atomic(enc, bad.data(), bad.size());
    expect_error([&] { Tokenizer::load_gpt2(enc, voc); }, {enc, "expected a JSON object"});
  }
  expect_error([&] { Tokenizer::load_gpt2(dir.file("nope.json"), dir.file("nope.bpe")); },
               {"nope.json", "cannot open"});
}

// ---- training -------------------------------------------------------------------------------------------

const std::string kSmallCorpus =
    "the cat sat on the mat. the cat ate the rat. that rat sat there, then the cat sat on that rat's hat.\n"
    "There the hatter sat; the matter that mattered was the hat.\n";

TEST(TokenizerTrain, FirstMergeIsTheMostFrequentPair) {
  Tokenizer tok =
      Tokenizer::train(kSmallCorpus, {.vocab_size = 300, .min_frequency = 2, .special_tokens = {}});
  // Brute force over the pre-tokenized pieces: the most frequent adjacent byte pair, ties to the smaller
  // pair.
  std::map<std::pair<int, int>, int64_t> counts;
  for (std::string_view p : io::gpt2_pretokenize(kSmallCorpus))
    for (size_t i = 0; i + 1 < p.size(); ++i) ++counts[{uint8_t(p[i]), uint8_t(p[i + 1])}];
  std::pair<int, int> best{};
  int64_t best_n = -1;
  for (auto& [pr, n] : counts)
    if (n > best_n) best = pr, best_n = n;  // map order: the first maximum is the smallest pair
  ASSERT_FALSE(tok.merges().empty());
  EXPECT_EQ(tok.merges()[0].left, best.first);
  EXPECT_EQ(tok.merges()[0].right, best.second);
  EXPECT_EQ(tok.merges()[0].result, 256);
  // Every id below 256 is its byte.
  for (int b = 0; b < 256; ++b) ASSERT_EQ(tok.token_bytes(b), std::string(1, char(b)));
}

TEST(TokenizerTrain, StopsEarlyWhenPairsRunOut) {
  Tokenizer tok = Tokenizer::train("abab abab", {.vocab_size = 10000, .min_frequency = 2});
  EXPECT_LT(tok.vocab_size(), 270);
  EXPECT_EQ(tok.eot_id(), tok.vocab_size() - 1);
  EXPECT_EQ(tok.encode("abab"), (std::vector<int32_t>{tok.token_id("abab")}));
}

TEST(TokenizerTrain, DeterministicRoundTripAndSaveLoad) {
  std::string corpus = corpus_slice("kjv.txt", 300000);
  if (corpus.empty()) {  // still a real test, just a smaller one
    for (int i = 0; i < 20; ++i) corpus += kSmallCorpus;
    corpus += kExotic;
  }
  BpeTrainOptions opts{.vocab_size = 1024};
  Tokenizer a = Tokenizer::train(corpus, opts);
  Tokenizer b = Tokenizer::train(corpus, opts);
  ASSERT_EQ(a.merges().size(), b.merges().size());
  for (size_t i = 0; i < a.merges().size(); ++i) {
    ASSERT_EQ(a.merges()[i].left, b.merges()[i].left) << i;
    ASSERT_EQ(a.merges()[i].right, b.merges()[i].right) << i;
  }
  std::vector<int32_t> ids = a.encode(corpus);
  EXPECT_EQ(a.decode(ids), corpus);
  EXPECT_LT(ids.size(), corpus.size() / 2) << "a 1k vocabulary should at least halve English text";
  EXPECT_EQ(a.decode(a.encode(kExotic, true)), kExotic);
  for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < a.vocab_size());

  ScratchDir dir;
  std::string p = dir.file("bpe.tok");
  a.save(p);
  Tokenizer c = Tokenizer::load(p);
  EXPECT_EQ(c.vocab_size(), a.vocab_size());
  EXPECT_EQ(c.encode(corpus), ids);
  EXPECT_EQ(c.eot_id(), a.eot_id());
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"bpe.tok"});
}

TEST(TokenizerTrain, ConcurrentEncodesAgreeWithSerial) {
  // encode() is const and shares its piece cache across threads behind a lock.
  std::string corpus = corpus_slice("austen.txt", 200000);
  if (corpus.empty()) corpus = std::string(kSmallCorpus) + kSmallCorpus + kExotic;
  Tokenizer tok = Tokenizer::train(corpus, {.vocab_size = 600});
  const size_t parts = 4, len = corpus.size() / parts;
  std::vector<std::vector<int32_t>> serial(parts), parallel(parts);
  Tokenizer fresh = Tokenizer::train(corpus, {.vocab_size = 600});  // its cache starts empty
  for (size_t i = 0; i < parts; ++i) serial[i] = tok.encode(corpus.substr(i * len, len));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < parts; ++i)
    threads.emplace_back([&, i] { parallel[i] = fresh.encode(corpus.substr(i * len, len)); });
  for (auto& t : threads) t.join();
  EXPECT_EQ(parallel, serial);
}

TEST(TokenizerTrain, BadOptionsThrow) {
  expect_error([] { Tokenizer::train("abc", {.vocab_size = 200}); },
               {"Tokenizer::train", "vocab_size", "200"});
  expect_error([] { Tokenizer::train("abc", {.vocab_size = 256}); }, {"vocab_size"});  // + 1 special
  expect_error([] { Tokenizer::train("abc", {.vocab_size = 300, .min_frequency = 0}); }, {"min_frequency"});
  expect_error(
      [] {
        Tokenizer::train("abc", {.vocab_size = 300, .special_tokens = {"<a>", "<a>"}});
      },
      {"listed twice"});
}

TEST(TokenizerTrain, DecodeRejectsBadIds) {
  Tokenizer tok = Tokenizer::train(kSmallCorpus, {.vocab_size = 280});
  expect_error(
      [&] {
        tok.decode({1, 2, int32_t(tok.vocab_size())});
      },
      {"token id", "outside the vocabulary"});
  expect_error([&] { tok.decode({-1}); }, {"token id -1"});
}

// ---- the file format ------------------------------------------------------------------------------------

class TokenizerFile : public ::testing::Test {
 protected:
  void SetUp() override {
    Tokenizer tok = Tokenizer::train(kSmallCorpus, {.vocab_size = 300});
    path = dir.file("t.tok");
    tok.save(path);
    size = slurp(path).size();
  }
  ScratchDir dir;
  std::string path;
  size_t size = 0;
};

TEST_F(TokenizerFile, WrongMagic) {
  flip_byte(path, 0);
  expect_error([&] { Tokenizer::load(path); }, {path, "wrong magic", "not a retort tokenizer file"});
}

TEST_F(TokenizerFile, WrongVersion) {
  patch_le32(path, 8, 99);
  expect_error([&] { Tokenizer::load(path); }, {path, "unsupported version 99"});
}

TEST_F(TokenizerFile, Truncated) {
  truncate_to(path, size - 10);
  expect_error([&] { Tokenizer::load(path); }, {path, "truncated"});
  truncate_to(path, 20);
  expect_error([&] { Tokenizer::load(path); }, {path, "truncated"});
  truncate_to(path, 3);
  expect_error([&] { Tokenizer::load(path); }, {path, "truncated"});
}

TEST_F(TokenizerFile, TrailingBytes) {
  std::vector<uint8_t> b = slurp(path);
  b.push_back(0);
  spit(path, b);
  expect_error([&] { Tokenizer::load(path); }, {path, "size mismatch"});
}

TEST_F(TokenizerFile, FlippedPayloadByteFailsTheChecksum) {
  for (size_t off : {size_t(40), size / 2, size - 1}) {
    SetUp();
    flip_byte(path, off, 0x10);
    expect_error([&] { Tokenizer::load(path); }, {path, "checksum mismatch"});
  }
}

TEST_F(TokenizerFile, AbsurdCountsAreRejectedBeforeAllocating) {
  patch_le32(path, 16, 0xFFFFFFFFu);  // token count
  expect_error([&] { Tokenizer::load(path); }, {path, "do not fit"});
}

// ---- speed and the whole corpus (slower)

// Sanitizer and unoptimized builds run ~20x slower: the speed bound is for optimized builds only.
#if defined(__SANITIZE_ADDRESS__) || !defined(NDEBUG)
constexpr double kEncodeSecondsLimit = 300.0;
#else
constexpr double kEncodeSecondsLimit = 20.0;
#endif
// -------------------------------------------------------------------

TEST(TokenizerFullCorpus, Gpt2RoundTripsWholeCorpusInSeconds) {
  RT_REQUIRE_GPT2(tok);
  for (const char* name : {"kjv.txt", "austen.txt"}) {
    RT_REQUIRE_DATA(path, std::string("corpus/") + name);
    std::string text = io::read_text_file(path);
    Tokenizer fresh =
        Tokenizer::load_gpt2(*find_data_file("gpt2/encoder.json"), *find_data_file("gpt2/vocab.bpe"));
    auto t0 = std::chrono::steady_clock::now();
    std::vector<int32_t> ids = fresh.encode(text);  // cold cache
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(fresh.decode(ids), text) << name;
    std::printf("[          ] %s: %zu bytes -> %zu GPT-2 tokens in %.2f s (%.1f MB/s)\n", name, text.size(),
                ids.size(), secs, double(text.size()) / secs / 1e6);
    EXPECT_LT(secs, kEncodeSecondsLimit) << "encoding " << name << " should take seconds";
  }
}

}  // namespace
}  // namespace retort::test
