// The Smollm, Llama 3 and Qwen2 pre-tokenizers (and GPT-2's again) against the splits Hugging Face's
// `tokenizers` 0.23 makes of the same strings: the expected pieces below were produced by its pre-tokenizers
// (ByteLevel; Sequence[Digits, ByteLevel]; Split with Llama 3's and Qwen2's regex), so a difference here is
// a difference from the reference implementation. Invalid UTF-8 (which Python strings cannot hold), the
// partition property and linear time are checked by hand.
#include <gtest/gtest.h>

#include <chrono>
#include <random>

#include "io/pretokenize.h"
#include "retort.h"

namespace retort::test {
namespace {

using Pieces = std::vector<std::string>;
struct Case {
  std::string text;
  Pieces pieces;
};

Pieces split(PreTokenizer pre, std::string_view s) {
  Pieces out;
  for (std::string_view p : io::pretokenize(pre, s)) out.emplace_back(p);
  return out;
}

void expect_splits(PreTokenizer pre, const std::vector<Case>& cases) {
  for (const Case& c : cases)
    EXPECT_EQ(split(pre, c.text), c.pieces) << pre_tokenizer_name(pre) << " text: \"" << c.text << "\"";
}

TEST(PretokenizeModels, Gpt2MatchesHuggingFace) {
  // clang-format off
  expect_splits(PreTokenizer::Gpt2, {
      {"", {}},
      {"Hello world", {"Hello", " world"}},
      {"a 12 345", {"a", " 12", " 345"}},
      {"year 2024!", {"year", " 2024", "!"}},
      {" 7", {" 7"}},
      {"x  42", {"x", " ", " 42"}},
      {"I'm here", {"I", "'m", " here"}},
      {"HELLO'S WORLD'LL", {"HELLO", "'", "S", " WORLD", "'", "LL"}},
      {"don't '\xC5\xBF" "a x'Ve", {"don", "'t", " '", "\xC5\xBF" "a", " x", "'", "Ve"}},
      {"a\r\n\r\nb", {"a", "\r\n\r", "\n", "b"}},
      {"x \r\n  y", {"x", " \r\n ", " y"}},
      {"\r\n", {"\r\n"}},
      {"line\n\n\n", {"line", "\n\n\n"}},
      {"\t\tx", {"\t", "\t", "x"}},
      {"a\tb", {"a", "\t", "b"}},
      {"h\xC3\xA9llo w\xC3\xB6rld", {"h\xC3\xA9llo", " w\xC3\xB6rld"}},
      {"\xE6\x97\xA5\xE6\x9C\xAC \xE3\x83\x86", {"\xE6\x97\xA5\xE6\x9C\xAC", " \xE3\x83\x86"}},
      {"x\xC2\xBD \xD9\xA3\xD9\xA4\xD9\xA5\xD9\xA6", {"x", "\xC2\xBD", " \xD9\xA3\xD9\xA4\xD9\xA5\xD9\xA6"}},
      {"\xF0\x9F\x98\x80!", {"\xF0\x9F\x98\x80!"}},
      {"hi \xF0\x9F\x98\x80\xF0\x9F\x98\x80 there", {"hi", " \xF0\x9F\x98\x80\xF0\x9F\x98\x80", " there"}},
      {"end   ", {"end", "   "}},
      {"          x", {"         ", " x"}},
      {"1234567", {"1234567"}},
      {"!!!!!\n\n", {"!!!!!", "\n\n"}},
      {".Hello", {".", "Hello"}},
      {"a\xC2\xA0" "b", {"a", "\xC2\xA0", "b"}},
      {"a \xC2\xA0" "b", {"a", " ", "\xC2\xA0", "b"}},
      {"a\xE3\x80\x80" "b", {"a", "\xE3\x80\x80", "b"}},
      {"a\xE2\x80\xA8" "b", {"a", "\xE2\x80\xA8", "b"}},
      {"(x) = {y};\n\tz", {"(", "x", ")", " =", " {", "y", "};", "\n", "\t", "z"}},
      {"3rd 10th", {"3", "rd", " 10", "th"}},
  });
  // clang-format on
}

TEST(PretokenizeModels, SmollmMatchesHuggingFace) {
  // clang-format off
  expect_splits(PreTokenizer::Smollm, {
      {"", {}},
      {"Hello world", {"Hello", " world"}},
      {"a 12 345", {"a", " ", "1", "2", " ", "3", "4", "5"}},
      {"year 2024!", {"year", " ", "2", "0", "2", "4", "!"}},
      {" 7", {" ", "7"}},
      {"x  42", {"x", "  ", "4", "2"}},
      {"I'm here", {"I", "'m", " here"}},
      {"HELLO'S WORLD'LL", {"HELLO", "'", "S", " WORLD", "'", "LL"}},
      {"don't '\xC5\xBF" "a x'Ve", {"don", "'t", " '", "\xC5\xBF" "a", " x", "'", "Ve"}},
      {"a\r\n\r\nb", {"a", "\r\n\r", "\n", "b"}},
      {"x \r\n  y", {"x", " \r\n ", " y"}},
      {"\r\n", {"\r\n"}},
      {"line\n\n\n", {"line", "\n\n\n"}},
      {"\t\tx", {"\t", "\t", "x"}},
      {"a\tb", {"a", "\t", "b"}},
      {"h\xC3\xA9llo w\xC3\xB6rld", {"h\xC3\xA9llo", " w\xC3\xB6rld"}},
      {"\xE6\x97\xA5\xE6\x9C\xAC \xE3\x83\x86", {"\xE6\x97\xA5\xE6\x9C\xAC", " \xE3\x83\x86"}},
      {"x\xC2\xBD \xD9\xA3\xD9\xA4\xD9\xA5\xD9\xA6", {"x", "\xC2\xBD", " ", "\xD9\xA3", "\xD9\xA4", "\xD9\xA5", "\xD9\xA6"}},
      {"\xF0\x9F\x98\x80!", {"\xF0\x9F\x98\x80!"}},
      {"hi \xF0\x9F\x98\x80\xF0\x9F\x98\x80 there", {"hi", " \xF0\x9F\x98\x80\xF0\x9F\x98\x80", " there"}},
      {"end   ", {"end", "   "}},
      {"          x", {"         ", " x"}},
      {"1234567", {"1", "2", "3", "4", "5", "6", "7"}},
      {"!!!!!\n\n", {"!!!!!", "\n\n"}},
      {".Hello", {".", "Hello"}},
      {"a\xC2\xA0" "b", {"a", "\xC2\xA0", "b"}},
      {"a \xC2\xA0" "b", {"a", " ", "\xC2\xA0", "b"}},
      {"a\xE3\x80\x80" "b", {"a", "\xE3\x80\x80", "b"}},
      {"a\xE2\x80\xA8" "b", {"a", "\xE2\x80\xA8", "b"}},
      {"(x) = {y};\n\tz", {"(", "x", ")", " =", " {", "y", "};", "\n", "\t", "z"}},
      {"3rd 10th", {"3", "rd", " ", "1", "0", "th"}},
  });
  // clang-format on
}

TEST(PretokenizeModels, Llama3MatchesHuggingFace) {
  // clang-format off
  expect_splits(PreTokenizer::Llama3, {
      {"", {}},
      {"Hello world", {"Hello", " world"}},
      {"a 12 345", {"a", " ", "12", " ", "345"}},
      {"year 2024!", {"year", " ", "202", "4", "!"}},
      {" 7", {" ", "7"}},
      {"x  42", {"x", " ", " ", "42"}},
      {"I'm here", {"I", "'m", " here"}},
      {"HELLO'S WORLD'LL", {"HELLO", "'S", " WORLD", "'LL"}},
      {"don't '\xC5\xBF" "a x'Ve", {"don", "'t", " '", "\xC5\xBF" "a", " x", "'Ve"}},
      {"a\r\n\r\nb", {"a", "\r\n\r\n", "b"}},
      {"x \r\n  y", {"x", " \r\n", " ", " y"}},
      {"\r\n", {"\r\n"}},
      {"line\n\n\n", {"line", "\n\n\n"}},
      {"\t\tx", {"\t", "\tx"}},
      {"a\tb", {"a", "\tb"}},
      {"h\xC3\xA9llo w\xC3\xB6rld", {"h\xC3\xA9llo", " w\xC3\xB6rld"}},
      {"\xE6\x97\xA5\xE6\x9C\xAC \xE3\x83\x86", {"\xE6\x97\xA5\xE6\x9C\xAC", " \xE3\x83\x86"}},
      {"x\xC2\xBD \xD9\xA3\xD9\xA4\xD9\xA5\xD9\xA6", {"x", "\xC2\xBD", " ", "\xD9\xA3\xD9\xA4\xD9\xA5", "\xD9\xA6"}},
      {"\xF0\x9F\x98\x80!", {"\xF0\x9F\x98\x80!"}},
      {"hi \xF0\x9F\x98\x80\xF0\x9F\x98\x80 there", {"hi", " \xF0\x9F\x98\x80\xF0\x9F\x98\x80", " there"}},
      {"end   ", {"end", "   "}},
      {"          x", {"         ", " x"}},
      {"1234567", {"123", "456", "7"}},
      {"!!!!!\n\n", {"!!!!!\n\n"}},
      {".Hello", {".Hello"}},
      {"a\xC2\xA0" "b", {"a", "\xC2\xA0" "b"}},
      {"a \xC2\xA0" "b", {"a", " ", "\xC2\xA0" "b"}},
      {"a\xE3\x80\x80" "b", {"a", "\xE3\x80\x80" "b"}},
      {"a\xE2\x80\xA8" "b", {"a", "\xE2\x80\xA8" "b"}},
      {"(x) = {y};\n\tz", {"(x", ")", " =", " {", "y", "};\n", "\tz"}},
      {"3rd 10th", {"3", "rd", " ", "10", "th"}},
  });
  // clang-format on
}

TEST(PretokenizeModels, Qwen2MatchesHuggingFace) {
  // clang-format off
  expect_splits(PreTokenizer::Qwen2, {
      {"", {}},
      {"Hello world", {"Hello", " world"}},
      {"a 12 345", {"a", " ", "1", "2", " ", "3", "4", "5"}},
      {"year 2024!", {"year", " ", "2", "0", "2", "4", "!"}},
      {" 7", {" ", "7"}},
      {"x  42", {"x", " ", " ", "4", "2"}},
      {"I'm here", {"I", "'m", " here"}},
      {"HELLO'S WORLD'LL", {"HELLO", "'S", " WORLD", "'LL"}},
      {"don't '\xC5\xBF" "a x'Ve", {"don", "'t", " '", "\xC5\xBF" "a", " x", "'Ve"}},
      {"a\r\n\r\nb", {"a", "\r\n\r\n", "b"}},
      {"x \r\n  y", {"x", " \r\n", " ", " y"}},
      {"\r\n", {"\r\n"}},
      {"line\n\n\n", {"line", "\n\n\n"}},
      {"\t\tx", {"\t", "\tx"}},
      {"a\tb", {"a", "\tb"}},
      {"h\xC3\xA9llo w\xC3\xB6rld", {"h\xC3\xA9llo", " w\xC3\xB6rld"}},
      {"\xE6\x97\xA5\xE6\x9C\xAC \xE3\x83\x86", {"\xE6\x97\xA5\xE6\x9C\xAC", " \xE3\x83\x86"}},
      {"x\xC2\xBD \xD9\xA3\xD9\xA4\xD9\xA5\xD9\xA6", {"x", "\xC2\xBD", " ", "\xD9\xA3", "\xD9\xA4", "\xD9\xA5", "\xD9\xA6"}},
      {"\xF0\x9F\x98\x80!", {"\xF0\x9F\x98\x80!"}},
      {"hi \xF0\x9F\x98\x80\xF0\x9F\x98\x80 there", {"hi", " \xF0\x9F\x98\x80\xF0\x9F\x98\x80", " there"}},
      {"end   ", {"end", "   "}},
      {"          x", {"         ", " x"}},
      {"1234567", {"1", "2", "3", "4", "5", "6", "7"}},
      {"!!!!!\n\n", {"!!!!!\n\n"}},
      {".Hello", {".Hello"}},
      {"a\xC2\xA0" "b", {"a", "\xC2\xA0" "b"}},
      {"a \xC2\xA0" "b", {"a", " ", "\xC2\xA0" "b"}},
      {"a\xE3\x80\x80" "b", {"a", "\xE3\x80\x80" "b"}},
      {"a\xE2\x80\xA8" "b", {"a", "\xE2\x80\xA8" "b"}},
      {"(x) = {y};\n\tz", {"(x", ")", " =", " {", "y", "};\n", "\tz"}},
      {"3rd 10th", {"3", "rd", " ", "1", "0", "th"}},
  });
  // clang-format on
}

TEST(PretokenizeModels, InvalidUtf8IsOtherOneByteAtATime) {
  // Worked out from the patterns by hand: a stray byte is an "other" character, like punctuation.
  expect_splits(PreTokenizer::Llama3, {
                                          {"\xFF"
                                           "abc",
                                           {"\xFF"
                                            "abc"}},  // the optional non-letter prefix
                                          {"a\xFF\xFE\n\nb", {"a", "\xFF\xFE\n\n", "b"}},
                                          {" \xFF", {" \xFF"}},
                                          {"\xC3", {"\xC3"}},
                                          {"1\xFF"
                                           "2",
                                           {"1", "\xFF", "2"}},
                                      });
  expect_splits(PreTokenizer::Qwen2, {{"12\xC3"
                                       "34",
                                       {"1", "2", "\xC3", "3", "4"}}});
  expect_splits(PreTokenizer::Smollm, {
                                          {"1\xFF"
                                           "2",
                                           {"1", "\xFF", "2"}},
                                          {"a \xFF\xFE 9", {"a", " \xFF\xFE", " ", "9"}},
                                      });
}

TEST(PretokenizeModels, PiecesPartitionAnyBytes) {
  std::mt19937_64 g(777);
  const std::string alphabet[] = {"a",
                                  "Z",
                                  " ",
                                  "  ",
                                  "\n",
                                  "\r\n",
                                  "\r",
                                  "\t",
                                  "'",
                                  "'s",
                                  "'LL",
                                  "9",
                                  "12345",
                                  "!",
                                  ".",
                                  "\xC3\xA9",
                                  "\xE2\x80\x99",
                                  "\xF0\x9F\x98\x80",
                                  "\xFF",
                                  "\xC3",
                                  "\xE3\x80\x80",
                                  "\xC2\xA0",
                                  "\xD9\xA3",
                                  "\xC5\xBF"};
  for (PreTokenizer pre :
       {PreTokenizer::Gpt2, PreTokenizer::Smollm, PreTokenizer::Llama3, PreTokenizer::Qwen2}) {
    for (int iter = 0; iter < 1000; ++iter) {
      std::string s;
      int n = int(g() % 40);
      for (int i = 0; i < n; ++i) {
        if (g() % 5 == 0)
          s += char(g() & 0xff);  // raw random bytes too
        else
          s += alphabet[g() % std::size(alphabet)];
      }
      std::string joined;
      for (std::string_view p : io::pretokenize(pre, s)) {
        ASSERT_FALSE(p.empty()) << pre_tokenizer_name(pre);
        joined += p;
      }
      ASSERT_EQ(joined, s) << pre_tokenizer_name(pre);
    }
  }
}

// Sanitizer and unoptimized builds run ~20x slower: the bound is for optimized builds.
#if defined(__SANITIZE_ADDRESS__) || !defined(NDEBUG)
constexpr double kSecondsLimit = 60.0;
#else
constexpr double kSecondsLimit = 3.0;
#endif

TEST(PretokenizeModels, LongRunsTakeLinearTime) {
  // A quadratic scan (re-reading a run for every piece it yields) would take minutes on these.
  const size_t n = 1 << 20;
  const std::string runs[] = {
      std::string(n, ' '), std::string(n, '7'),  std::string(n, 'x'),
      std::string(n, '!'), std::string(n, '\n'), std::string(n / 2, ' ') + "\r\n" + std::string(n / 2, ' '),
      std::string(n, '\'')};
  auto t0 = std::chrono::steady_clock::now();
  for (PreTokenizer pre :
       {PreTokenizer::Gpt2, PreTokenizer::Smollm, PreTokenizer::Llama3, PreTokenizer::Qwen2})
    for (const std::string& s : runs) {
      size_t total = 0, pieces = 0;
      io::pretokenize(pre, s, [&](std::string_view p) { total += p.size(), ++pieces; });
      ASSERT_EQ(total, s.size());
    }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(secs, kSecondsLimit);
}

TEST(PretokenizeModels, NamesParseAndUnknownOnesThrow) {
  EXPECT_EQ(parse_pre_tokenizer("gpt2"), PreTokenizer::Gpt2);
  EXPECT_EQ(parse_pre_tokenizer("default"), PreTokenizer::Gpt2);
  EXPECT_EQ(parse_pre_tokenizer("smollm"), PreTokenizer::Smollm);
  EXPECT_EQ(parse_pre_tokenizer("llama3"), PreTokenizer::Llama3);
  EXPECT_EQ(parse_pre_tokenizer("llama-bpe"), PreTokenizer::Llama3);
  EXPECT_EQ(parse_pre_tokenizer("qwen2"), PreTokenizer::Qwen2);
  for (PreTokenizer p : {PreTokenizer::Gpt2, PreTokenizer::Smollm, PreTokenizer::Llama3, PreTokenizer::Qwen2})
    EXPECT_EQ(parse_pre_tokenizer(pre_tokenizer_name(p)), p);
  try {
    parse_pre_tokenizer("deepseek-llm");
    FAIL() << "expected retort::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("\"deepseek-llm\""), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("supported: gpt2"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace retort::test
