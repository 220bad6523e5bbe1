#include <gtest/gtest.h>

#include <random>

#include "io/pretokenize.h"
#include "io/unicode_classes.h"

namespace retort::test {
namespace {

using Pieces = std::vector<std::string>;

Pieces split(std::string_view s) {
  Pieces out;
  for (std::string_view p : io::gpt2_pretokenize(s)) out.emplace_back(p);
  return out;
}

TEST(Pretokenize, MatchesGpt2PatternOnKnownCases) {
  // Expected splits worked out from GPT-2's pattern by hand (alternatives tried in order, each greedy).
  struct Case {
    std::string text;
    Pieces pieces;
  };
  const Case cases[] = {
      {"Hello world", {"Hello", " world"}},
      {"I'm here", {"I", "'m", " here"}},
      {"don't we'll they're you've he'd it's",
       {"don", "'t", " we", "'ll", " they", "'re", " you", "'ve", " he", "'d", " it", "'s"}},
      {"'S", {"'", "S"}},          // contractions are case-sensitive
      {" 's", {" '", "s"}},        // a space before the apostrophe joins the punctuation
      {"'sam", {"'s", "am"}},      // the contraction matches whatever follows
      {"!'s", {"!'", "s"}},        // punctuation runs greedily over the apostrophe
      {"a  b", {"a", " ", " b"}},  // \s+(?!\S) leaves the last space to the word
      {"a \n\nb", {"a", " \n", "\n", "b"}},
      {"\t\tx", {"\t", "\t", "x"}},
      {"trailing  ", {"trailing", "  "}},  // whitespace at the end is one piece
      {" ", {" "}},
      {"123 4567", {"123", " 4567"}},
      {"3rd", {"3", "rd"}},
      {"hello!!! world?", {"hello", "!!!", " world", "?"}},
      {"x = y+1;", {"x", " =", " y", "+", "1", ";"}},
      {"h\xC3\xA9llo w\xC3\xB6rld", {"h\xC3\xA9llo", " w\xC3\xB6rld"}},  // é ö are letters
      {"\xE6\x97\xA5\xE6\x9C\xAC \xE3\x83\x86", {"\xE6\x97\xA5\xE6\x9C\xAC", " \xE3\x83\x86"}},  // 日本 テ
      {"x\xC2\xBD", {"x", "\xC2\xBD"}},  // ½ is a number (No)
      {"a\xE3\x80\x80"
       "b",
       {"a", "\xE3\x80\x80", "b"}},                  // U+3000 is whitespace
      {"\xF0\x9F\x98\x80!", {"\xF0\x9F\x98\x80!"}},  // an emoji is "other", like punctuation
      {"\xFF\xFE a", {"\xFF\xFE", " a"}},            // invalid UTF-8 bytes are "other" one by one
      {"\xC3", {"\xC3"}},                            // truncated sequence
  };
  for (const Case& c : cases) EXPECT_EQ(split(c.text), c.pieces) << "text: \"" << c.text << "\"";
}

TEST(Pretokenize, PiecesPartitionAnyBytes) {
  std::mt19937_64 g(12345);
  const std::string alphabet[] = {"a",
                                  "Z",
                                  " ",
                                  "  ",
                                  "\n",
                                  "\t",
                                  "'",
                                  "'s",
                                  "9",
                                  "!",
                                  ".",
                                  "\xC3\xA9",
                                  "\xE2\x80\x99",
                                  "\xF0\x9F\x98\x80",
                                  "\xFF",
                                  "\xC3",
                                  "\xE3\x80\x80",
                                  "\xC2\xA0"};
  for (int iter = 0; iter < 500; ++iter) {
    std::string s;
    int n = int(g() % 40);
    for (int i = 0; i < n; ++i) {
      if (g() % 5 == 0)
        s += char(g() & 0xff);  // raw random bytes too
      else
        s += alphabet[g() % std::size(alphabet)];
    }
    std::string joined;
    for (std::string_view p : io::gpt2_pretokenize(s)) {
      ASSERT_FALSE(p.empty());
      joined += p;
    }
    ASSERT_EQ(joined, s);
  }
}

TEST(UnicodeClasses, SpotChecks) {
  EXPECT_TRUE(io::is_unicode_letter('a'));
  EXPECT_TRUE(io::is_unicode_letter(0xE9));     // é
  EXPECT_TRUE(io::is_unicode_letter(0x3B1));    // α
  EXPECT_TRUE(io::is_unicode_letter(0x4E2D));   // 中
  EXPECT_TRUE(io::is_unicode_letter(0x20000));  // CJK extension B
  EXPECT_FALSE(io::is_unicode_letter(0xD7));    // ×
  EXPECT_FALSE(io::is_unicode_letter('1'));
  EXPECT_FALSE(io::is_unicode_letter(0x1F600));  // emoji
  EXPECT_TRUE(io::is_unicode_number(0x661));     // Arabic-Indic one
  EXPECT_TRUE(io::is_unicode_number(0x2165));    // Roman numeral six (Nl)
  EXPECT_TRUE(io::is_unicode_number(0xB2));      // superscript two (No)
  EXPECT_FALSE(io::is_unicode_number('x'));
  EXPECT_TRUE(io::is_unicode_space(0xA0));
  EXPECT_TRUE(io::is_unicode_space(0x2009));
  EXPECT_FALSE(io::is_unicode_space(0x200B));  // zero-width space is not White_Space
  EXPECT_FALSE(io::is_unicode_space(0x1C));
}

TEST(Utf8, DecodeRejectsMalformedSequences) {
  uint32_t cp = 0;
  EXPECT_EQ(io::utf8_decode("\xE2\x82\xAC", 0, cp), 3u);
  EXPECT_EQ(cp, 0x20ACu);
  EXPECT_EQ(io::utf8_decode("\xC0\xAF", 0, cp), 0u);          // overlong '/'
  EXPECT_EQ(io::utf8_decode("\xED\xA0\x80", 0, cp), 0u);      // surrogate
  EXPECT_EQ(io::utf8_decode("\xF4\x90\x80\x80", 0, cp), 0u);  // past U+10FFFF
  EXPECT_EQ(io::utf8_decode("\xE2\x82", 0, cp), 0u);          // truncated
  EXPECT_EQ(io::utf8_decode("\x80", 0, cp), 0u);              // stray continuation
  std::string s;
  for (uint32_t c : {0x41u, 0xE9u, 0x20ACu, 0x1F600u}) io::utf8_append(s, c);
  EXPECT_EQ(s, "A\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80");
}

}  // namespace
}  // namespace retort::test
