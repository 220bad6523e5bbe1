// Tokenizer::from_spec (vocabularies as GGUF describes them): token types and specials, missing byte
// tokens, ignore_merges, strict validation, one-pass special matching, and the version 2 file format.
#include <gtest/gtest.h>

#include <chrono>
#include <random>

#include "io/file.h"
#include "io/special_matcher.h"
#include "io/tokenizer.h"
#include "io/unicode_classes.h"
#include "io_test_util.h"
#include "retort.h"

namespace retort::test {
namespace {

// A token's bytes spelled in GPT-2's alphabet, as model files store it.
std::string spell(std::string_view bytes) {
  static const auto map = Tokenizer::gpt2_byte_to_unicode();
  std::string s;
  for (unsigned char b : bytes) io::utf8_append(s, map[b]);
  return s;
}

// A small vocabulary: the byte tokens (except `missing`), the merges (pairs of raw byte strings), then the
// specials as control tokens.
TokenizerSpec mini_spec(const std::vector<std::pair<std::string, std::string>>& merges,
                        const std::vector<std::string>& specials = {"<|endoftext|>"},
                        const std::vector<uint8_t>& missing = {}) {
  TokenizerSpec spec;
  spec.source = "mini.gguf";
  for (int b = 0; b < 256; ++b)
    if (std::find(missing.begin(), missing.end(), uint8_t(b)) == missing.end()) {
      spec.tokens.push_back(spell(std::string(1, char(b))));
      spec.types.push_back(int32_t(TokenType::Normal));
    }
  for (auto& [a, b] : merges) {
    spec.tokens.push_back(spell(a + b));
    spec.types.push_back(int32_t(TokenType::Normal));
    spec.merges.push_back(spell(a) + " " + spell(b));
  }
  for (const std::string& s : specials) {
    spec.tokens.push_back(s);
    spec.types.push_back(int32_t(TokenType::Control));
  }
  return spec;
}

const std::vector<std::pair<std::string, std::string>> kMerges = {{"h", "e"}, {" ", "t"},  {" t", "he"},
                                                                  {"e", "r"}, {"he", "r"}, {"!", "!"}};

TEST(TokenizerSpec, EncodesWithMergePriorityAndAccessors) {
  TokenizerSpec spec = mini_spec(kMerges, {"<|endoftext|>", "<|im_start|>"});
  spec.bos = 263;
  spec.eos = 262;
  spec.add_bos = true;
  spec.pre = PreTokenizer::Smollm;
  Tokenizer tok = Tokenizer::from_spec(spec);
  EXPECT_EQ(tok.vocab_size(), 256 + 6 + 2);
  EXPECT_EQ(tok.encode(" the"), (std::vector<int32_t>{258}));
  EXPECT_EQ(tok.encode("her"), (std::vector<int32_t>{260}));
  EXPECT_EQ(tok.bos_id(), 263);
  EXPECT_EQ(tok.eos_id(), 262);
  EXPECT_TRUE(tok.add_bos());
  EXPECT_EQ(tok.pre_tokenizer(), PreTokenizer::Smollm);
  EXPECT_EQ(tok.special_id("<|im_start|>"), 263);
  EXPECT_TRUE(tok.is_special(262));
  EXPECT_FALSE(tok.is_special(258));
  EXPECT_EQ(tok.token_text(258), "\xC4\xA0the");  // "Ġthe"
  EXPECT_EQ(tok.token_bytes(258), " the");
  EXPECT_EQ(tok.token_text(263), "<|im_start|>");
  EXPECT_EQ(tok.token_from_text("\xC4\xA0the"), 258);
  EXPECT_EQ(tok.token_from_text("<|im_start|>"), 263);
  EXPECT_EQ(tok.token_from_text(" the"), -1) << "a raw space is not a spelling in GPT-2's alphabet";
  EXPECT_TRUE(tok.missing_bytes().empty());
  expect_error([&] { tok.is_special(264); }, {"token id 264", "outside the vocabulary"});

  // to_spec is from_spec's inverse.
  TokenizerSpec back = tok.to_spec();
  EXPECT_EQ(back.tokens, spec.tokens);
  EXPECT_EQ(back.types, spec.types);
  EXPECT_EQ(back.merges, spec.merges);
  EXPECT_EQ(back.bos, 263);
  EXPECT_EQ(back.pre, PreTokenizer::Smollm);
}

TEST(TokenizerSpec, TokenTypes) {
  TokenizerSpec spec = mini_spec(kMerges, {"<c>", "<u>", "<k>", "[PAD9]"});
  const size_t c = 262, u = 263, k = 264, unused = 265;
  spec.types[u] = int32_t(TokenType::UserDefined);
  spec.types[k] = int32_t(TokenType::Unknown);
  spec.types[unused] = int32_t(TokenType::Unused);
  Tokenizer tok = Tokenizer::from_spec(spec);
  EXPECT_EQ(tok.special_ids(), (std::vector<int32_t>{int32_t(c), int32_t(u), int32_t(k)}));
  const std::string text = "a<c>b<u><k>[PAD9]";
  std::vector<int32_t> with = tok.encode(text, true);
  EXPECT_EQ(with, (std::vector<int32_t>{'a', int32_t(c), 'b', int32_t(u), int32_t(k), '[', 'P', 'A', 'D', '9',
                                        ']'}));
  std::vector<int32_t> without = tok.encode(text);
  for (int32_t id : without) EXPECT_LT(id, 256) << "specials are plain text without allow_special";
  EXPECT_EQ(tok.decode(with), text);
  EXPECT_EQ(tok.decode(without), text);
  EXPECT_EQ(tok.decode({int32_t(unused)}), "[PAD9]") << "an unused token decodes to its text";
  EXPECT_EQ(tok.token_type(int32_t(unused)), TokenType::Unused);
  EXPECT_FALSE(tok.is_special(int32_t(unused)));
  EXPECT_EQ(tok.token_from_text("[PAD9]"), int32_t(unused));
}

TEST(TokenizerSpec, MissingByteTokensAreDroppedBeforeMerging) {
  // SmolLM2 has no token for 21 byte values. encode drops them, and (as Hugging Face's BPE does) the bytes
  // on either side may then merge.
  Tokenizer tok = Tokenizer::from_spec(mini_spec(kMerges, {"<|endoftext|>"}, {0x04, 0xFF}));
  EXPECT_EQ(tok.missing_bytes(), (std::vector<uint8_t>{0x04, 0xFF}));
  const int32_t bang2 = tok.token_id("!!");
  ASSERT_GE(bang2, 0);
  EXPECT_EQ(tok.encode("!\x04!"), (std::vector<int32_t>{bang2}));
  EXPECT_EQ(tok.encode("\x04"), (std::vector<int32_t>{}));
  EXPECT_EQ(tok.encode("\xFF\xFF"), (std::vector<int32_t>{}));
  const std::string text = "a\x04 the\xFF her!\x04!";
  EXPECT_EQ(tok.decode(tok.encode(text)), "a the her!!");
  const std::string clean = "the caf\xC3\xA9, 12 rats! <|endoftext|>";
  EXPECT_EQ(tok.decode(tok.encode(clean, true)), clean) << "text without missing bytes round-trips";
}

TEST(TokenizerSpec, IgnoreMergesTakesWholePieceTokens) {
  // "abc" is a token, but the merges never build it from the piece "abc": "b c" (rank 0) fires first, and
  // no merge joins "a" + "bc". With ignore_merges (Llama 3's vocabularies) a piece that is a token is it.
  TokenizerSpec spec = mini_spec({{"b", "c"}, {"a", "b"}, {"ab", "c"}});
  Tokenizer plain = Tokenizer::from_spec(spec);
  spec.ignore_merges = true;
  Tokenizer whole = Tokenizer::from_spec(spec);
  EXPECT_EQ(plain.encode("abc"), (std::vector<int32_t>{'a', plain.token_id("bc")}));
  EXPECT_EQ(whole.encode("abc"), (std::vector<int32_t>{whole.token_id("abc")}));
  EXPECT_EQ(whole.encode(" abc"), plain.encode(" abc")) << "\" abc\" is not a token: merges as usual";
  EXPECT_TRUE(whole.ignore_merges());
}

TEST(TokenizerSpec, BadSpecsThrowNamingSourceAndToken) {
  auto expect_bad = [](const std::function<void(TokenizerSpec&)>& edit,
                       const std::vector<std::string>& needles) {
    TokenizerSpec spec = mini_spec(kMerges);
    edit(spec);
    std::vector<std::string> all = needles;
    all.push_back("mini.gguf");
    expect_error([&] { Tokenizer::from_spec(spec); }, all);
  };
  expect_bad([](TokenizerSpec& s) { s.tokens.clear(), s.types.clear(), s.merges.clear(); },
             {"vocabulary size 0"});
  expect_bad([](TokenizerSpec& s) { s.types.pop_back(); }, {"262 token types for 263 tokens"});
  expect_bad([](TokenizerSpec& s) { s.types[5] = 7; }, {"token 5", "type 7", "supported"});
  expect_bad([](TokenizerSpec& s) { s.types[5] = 0; }, {"token 5", "type 0"});
  expect_bad([](TokenizerSpec& s) { s.tokens[40] = "a b"; }, {"token 40", "\"a b\"", "outside GPT-2's"});
  expect_bad([](TokenizerSpec& s) { s.tokens[40] = "\xFF"; }, {"token 40", "outside GPT-2's"});
  expect_bad([](TokenizerSpec& s) { s.tokens[40] = ""; }, {"token 40 is empty"});
  expect_bad([](TokenizerSpec& s) { s.tokens[258] = s.tokens[256]; },
             {"tokens 256 and 258 have the same bytes"});
  expect_bad([](TokenizerSpec& s) { s.tokens.push_back("<|endoftext|>"), s.types.push_back(3); },
             {"tokens 262 and 263 are the same special token \"<|endoftext|>\""});
  expect_bad([](TokenizerSpec& s) { s.merges[1] = "ab"; },
             {"merge 1", "\"ab\"", "two tokens separated by one space"});
  expect_bad([](TokenizerSpec& s) { s.merges[1] = "a  b"; }, {"merge 1", "one space"});
  expect_bad([](TokenizerSpec& s) { s.merges[1] = "<|endoftext|> a"; },
             {"merge 1", "\"<|endoftext|>\" is not an ordinary token"});
  expect_bad([](TokenizerSpec& s) { s.merges[1] = "x y"; },
             {"merge 1", "the merged token \"xy\" is not an ordinary token"});
  expect_bad([](TokenizerSpec& s) { s.merges.push_back(s.merges[0]); }, {"merge 6 repeats an earlier merge"});
  expect_bad([](TokenizerSpec& s) { std::swap(s.merges[0], s.merges[2]); },
             {"merge 0", "no earlier merge makes"});
  expect_bad([](TokenizerSpec& s) { s.bos = 263; }, {"BOS token id 263 is outside the vocabulary"});
  expect_bad([](TokenizerSpec& s) { s.eos = -2; }, {"EOS token id -2"});
  expect_bad([](TokenizerSpec& s) { s.pre = PreTokenizer(9); }, {"unknown pre-tokenizer 9"});
  TokenizerSpec anon = mini_spec(kMerges);
  anon.source.clear();
  anon.types[3] = 9;
  expect_error([&] { Tokenizer::from_spec(anon); }, {"tokenizer spec", "token 3"});
}

// ---- special tokens: leftmost-longest, one pass ---------------------------------------------------------

TEST(SpecialMatcher, LeftmostLongestAgainstBruteForce) {
  const std::vector<std::string> specials = {"<a>", "<a><b>", "<ab", "b", "<a><b>c", "xx"};
  io::SpecialMatcher m;
  for (size_t i = 0; i < specials.size(); ++i) m.add(specials[i], int32_t(i));
  EXPECT_EQ(m.id_of("<a><b>"), 1);
  EXPECT_EQ(m.id_of("<a><"), -1);
  EXPECT_EQ(m.id_of(""), -1);
  std::mt19937_64 g(3);
  const char alphabet[] = "<>abcx";
  for (int iter = 0; iter < 3000; ++iter) {
    std::string s;
    for (int i = int(g() % 24); i > 0; --i) s += alphabet[g() % 6];
    size_t from = s.empty() ? 0 : g() % (s.size() + 1);
    // Brute force: the first position where any special starts, the longest one there.
    io::SpecialMatcher::Match want;
    for (size_t p = from; p < s.size() && want.id < 0; ++p)
      for (size_t i = 0; i < specials.size(); ++i)
        if (s.compare(p, specials[i].size(), specials[i]) == 0 && specials[i].size() > want.len)
          want = {p, specials[i].size(), int32_t(i)};
    io::SpecialMatcher::Match got = m.find(s, from);
    ASSERT_EQ(got.pos, want.pos) << s << " from " << from;
    ASSERT_EQ(got.id, want.id) << s << " from " << from;
    ASSERT_EQ(got.len, want.len) << s;
  }
}

// Sanitizer and unoptimized builds run ~20x slower: the bound is for optimized builds.
#if defined(__SANITIZE_ADDRESS__) || !defined(NDEBUG)
constexpr double kSpecialSecondsLimit = 30.0;
#else
constexpr double kSpecialSecondsLimit = 1.0;
#endif

TEST(TokenizerSpec, OneMegabyteWithTwentySpecialsEncodesInUnderASecond) {
  std::vector<std::string> specials;
  for (int i = 0; i < 20; ++i) specials.push_back("<|special_" + std::to_string(i) + "|>");
  Tokenizer tok = Tokenizer::from_spec(mini_spec(kMerges, specials));
  std::string text;
  std::mt19937_64 g(5);
  const std::string words[] = {" the", " her", " cat", "!!", "\n", " 12", " <|not special|>"};
  size_t n_special = 0;
  while (text.size() < (size_t(1) << 20)) {
    text += words[g() % std::size(words)];
    // Two kinds occur and 18 never do: the rescanning matcher this replaced searched the rest of the text for
    // every absent special after each occurrence, which takes minutes here.
    if (g() % 16 == 0) text += specials[g() % 2], ++n_special;
  }
  auto t0 = std::chrono::steady_clock::now();
  std::vector<int32_t> ids = tok.encode(text, true);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[          ] %zu bytes with %zu specials (20 kinds) -> %zu tokens in %.3f s\n", text.size(),
              n_special, ids.size(), secs);
  EXPECT_LT(secs, kSpecialSecondsLimit);
  size_t found = 0;
  for (int32_t id : ids) found += tok.is_special(id);
  EXPECT_EQ(found, n_special);
  EXPECT_EQ(tok.decode(ids), text);
}

// ---- the file format, version 2 and version 1 -----------------------------------------------------------

TEST(TokenizerSpec, SaveLoadKeepsTypesPreTokenizerAndIds) {
  TokenizerSpec spec = mini_spec(kMerges, {"<|endoftext|>", "<u>", "[PAD1]"}, {0x04});
  spec.types[spec.types.size() - 2] = int32_t(TokenType::UserDefined);
  spec.types.back() = int32_t(TokenType::Unused);
  spec.pre = PreTokenizer::Llama3;
  spec.bos = 3;
  spec.eos = 260;
  spec.add_bos = true;
  spec.ignore_merges = true;
  Tokenizer tok = Tokenizer::from_spec(spec);
  ScratchDir dir;
  tok.save(dir.file("m.tok"));
  Tokenizer back = Tokenizer::load(dir.file("m.tok"));
  TokenizerSpec a = tok.to_spec(), b = back.to_spec();
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.types, b.types);
  EXPECT_EQ(a.merges, b.merges);
  EXPECT_EQ(b.pre, PreTokenizer::Llama3);
  EXPECT_EQ(b.bos, 3);
  EXPECT_EQ(b.eos, 260);
  EXPECT_TRUE(b.add_bos);
  EXPECT_TRUE(b.ignore_merges);
  EXPECT_EQ(back.missing_bytes(), (std::vector<uint8_t>{0x04}));
  const std::string text = "HELLO'S there\x04<u> 12345<|endoftext|>";
  EXPECT_EQ(back.encode(text, true), tok.encode(text, true));
}

TEST(TokenizerSpec, ReadsVersionOneFiles) {
  // A version 1 file as earlier builds wrote it: 256 byte tokens, one merge, "<|endoftext|>" special.
  std::vector<uint8_t> payload;
  auto add_token = [&](const std::string& t) {
    io::append_le32(payload, uint32_t(t.size()));
    io::append_bytes(payload, t.data(), t.size());
  };
  for (int b = 0; b < 256; ++b) add_token(std::string(1, char(b)));
  add_token("ab");
  add_token("<|endoftext|>");
  for (uint32_t v : {uint32_t('a'), uint32_t('b'), 256u, 257u})
    io::append_le32(payload, v);  // merge, special
  std::vector<uint8_t> file;
  io::append_bytes(file, "RTBPETOK", 8);
  for (uint32_t v : {1u, 1u, 258u, 1u, 1u})
    io::append_le32(file, v);  // version, GPT-2, tokens, merges, specials
  io::append_le64(file, payload.size());
  io::append_le32(file, io::crc32_update(io::crc32(file), payload.data(), payload.size()));
  file.insert(file.end(), payload.begin(), payload.end());
  ScratchDir dir;
  spit(dir.file("v1.tok"), file);
  Tokenizer tok = Tokenizer::load(dir.file("v1.tok"));
  EXPECT_EQ(tok.vocab_size(), 258);
  EXPECT_EQ(tok.eot_id(), 257);
  EXPECT_EQ(tok.token_type(257), TokenType::Control);
  EXPECT_EQ(tok.encode("ab<|endoftext|>", true), (std::vector<int32_t>{256, 257}));
  EXPECT_EQ(tok.bos_id(), -1);
  EXPECT_EQ(tok.pre_tokenizer(), PreTokenizer::Gpt2);
  // Saved again, it is a version 2 file with the same tables.
  tok.save(dir.file("v2.tok"));
  EXPECT_EQ(io::load_le32(slurp(dir.file("v2.tok")).data() + 8), 2u);
  EXPECT_EQ(Tokenizer::load(dir.file("v2.tok")).encode("ab<|endoftext|>", true),
            (std::vector<int32_t>{256, 257}));
}

TEST(TokenizerSpec, CorruptVersionTwoFieldsAreRejected) {
  ScratchDir dir;
  const std::string p = dir.file("t.tok");
  Tokenizer::from_spec(mini_spec(kMerges)).save(p);
  auto reseal = [&] {  // recompute the checksum after a patch, so the field checks themselves are reached
    std::vector<uint8_t> b = slurp(p);
    io::store_le32(b.data() + 44, io::crc32_update(io::crc32(b.data(), 44), b.data() + 48, b.size() - 48));
    spit(p, b);
  };
  patch_le32(p, 12, 7);  // pre-tokenizer
  reseal();
  expect_error([&] { Tokenizer::load(p); }, {p, "unknown pre-tokenizer 7"});
  Tokenizer::from_spec(mini_spec(kMerges)).save(p);
  patch_le32(p, 24, 8);  // flags
  reseal();
  expect_error([&] { Tokenizer::load(p); }, {p, "unknown flags 8"});
  Tokenizer::from_spec(mini_spec(kMerges)).save(p);
  patch_le32(p, 36, 5000);  // BOS
  reseal();
  expect_error([&] { Tokenizer::load(p); }, {p, "BOS token id 5000"});
  Tokenizer::from_spec(mini_spec(kMerges)).save(p);
  std::vector<uint8_t> b = slurp(p);
  b[48] = 9;  // the first token's type
  spit(p, b);
  reseal();
  expect_error([&] { Tokenizer::load(p); }, {p, "token 0 has unknown type 9"});
}

TEST(TokenizerSpec, TrainsWithOtherPreTokenizers) {
  std::string corpus;
  for (int i = 0; i < 30; ++i) corpus += "In 2024 THE CAT'S 12345 hats\r\n\tsat. ";
  for (PreTokenizer pre : {PreTokenizer::Smollm, PreTokenizer::Llama3, PreTokenizer::Qwen2}) {
    Tokenizer tok = Tokenizer::train(corpus, {.vocab_size = 320, .pre = pre});
    EXPECT_EQ(tok.pre_tokenizer(), pre);
    EXPECT_EQ(tok.decode(tok.encode(corpus)), corpus);
    // No token spans a digit boundary that the pre-tokenizer draws.
    if (pre == PreTokenizer::Llama3) continue;
    for (int32_t id : tok.encode("12345"))
      EXPECT_EQ(tok.token_bytes(id).size(), 1u) << pre_tokenizer_name(pre);
  }
}

}  // namespace
}  // namespace retort::test
