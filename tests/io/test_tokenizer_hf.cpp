// Tokenizer::load_hf / from_hf_json: Hugging Face tokenizer.json files written here from a small vocabulary,
// in each supported pre-tokenizer configuration, and one broken field at a time. (bindings/tests/
// test_tokenizers_hf.py compares retort with the `tokenizers` package itself on real files and corpora.)
#include <gtest/gtest.h>

#include "io/file.h"
#include "io/json.h"
#include "io/tokenizer.h"
#include "io/unicode_classes.h"
#include "io_test_util.h"
#include "retort.h"

namespace retort::test {
namespace {

std::string spell(std::string_view bytes) {
  static const auto map = Tokenizer::gpt2_byte_to_unicode();
  std::string s;
  for (unsigned char b : bytes) io::utf8_append(s, map[b]);
  return s;
}

const char* kByteLevel =
    R"({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true})";
const char* kByteLevelNoRegex =
    R"({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false})";
const char* kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+)";
const char* kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+)";
const char* kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+)";

std::string split_then_byte_level(const char* regex) {
  return std::string(R"({"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": ")") +
         regex + R"("}, "behavior": "Isolated", "invert": false}, )" + kByteLevelNoRegex + "]}";
}

// The parts of a tokenizer.json that the tests vary.
struct HfParts {
  std::string pre_tokenizer = kByteLevel;
  std::string normalizer = "null";
  std::string post_processor = "null";
  std::string decoder =
      R"({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true})";
  std::string model_extra = "";  // more "key": value, pairs inside "model"
  bool merges_as_pairs = true;
};

// Specials first (ids 0.., in the vocabulary and in added_tokens, as Hugging Face's trainer writes them),
// then the 256 bytes, then one token per merge.
const std::vector<std::string> kSpecials = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
const std::vector<std::pair<std::string, std::string>> kMerges = {
    {"h", "e"}, {" ", "t"}, {" t", "he"}, {"e", "r"}, {"he", "r"}, {"1", "2"}, {"12", "3"}, {"'", "s"}};

std::string hf_json(const HfParts& p = {}) {
  std::string vocab, added, merges;
  int id = 0;
  auto add_vocab = [&](const std::string& spelled) {
    if (!vocab.empty()) vocab += ", ";
    io::append_json_string(vocab, spelled);
    vocab += ": " + std::to_string(id++);
  };
  for (const std::string& s : kSpecials) {
    if (!added.empty()) added += ", ";
    added += R"({"id": )" + std::to_string(id) + R"(, "content": )";
    io::append_json_string(added, s);
    added +=
        R"(, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true})";
    add_vocab(s);
  }
  for (int b = 0; b < 256; ++b) add_vocab(spell(std::string(1, char(b))));
  for (auto& [a, b] : kMerges) {
    add_vocab(spell(a + b));
    if (!merges.empty()) merges += ", ";
    if (p.merges_as_pairs) {
      merges += "[";
      io::append_json_string(merges, spell(a));
      merges += ", ";
      io::append_json_string(merges, spell(b));
      merges += "]";
    } else {
      io::append_json_string(merges, spell(a) + " " + spell(b));
    }
  }
  return R"({"version": "1.0", "truncation": null, "padding": null, "added_tokens": [)" + added +
         R"(], "normalizer": )" + p.normalizer + R"(, "pre_tokenizer": )" + p.pre_tokenizer +
         R"(, "post_processor": )" + p.post_processor + R"(, "decoder": )" + p.decoder +
         R"(, "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null, )"
         R"("end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, )" +
         p.model_extra + R"("vocab": {)" + vocab + R"(}, "merges": [)" + merges + "]}}";
}

Tokenizer from_json(const std::string& json, const std::string& config = "") {
  return Tokenizer::from_hf_json(json, config, "mem/tokenizer.json");
}

TEST(TokenizerHf, EachPreTokenizerConfiguration) {
  struct Config {
    std::string json;
    PreTokenizer pre;
  };
  const Config configs[] = {
      {kByteLevel, PreTokenizer::Gpt2},
      {std::string(
           R"({"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": true}, )") +
           kByteLevel + "]}",
       PreTokenizer::Smollm},
      {split_then_byte_level(kLlama3Regex), PreTokenizer::Llama3},
      {split_then_byte_level(kQwen2Regex), PreTokenizer::Qwen2},
      {split_then_byte_level(kGpt2Regex), PreTokenizer::Gpt2},
  };
  const std::string text = "HELLO'S there 12345 her\r\n\r\n\tthe<|im_start|>'s";
  for (const Config& c : configs) {
    Tokenizer tok = from_json(hf_json({.pre_tokenizer = c.json}));
    EXPECT_EQ(tok.pre_tokenizer(), c.pre) << c.json;
    EXPECT_EQ(tok.vocab_size(), 3 + 256 + int64_t(kMerges.size()));
    EXPECT_EQ(tok.special_ids(), (std::vector<int32_t>{0, 1, 2}));
    EXPECT_EQ(tok.token_type(1), TokenType::Control);
    // The same vocabulary through from_spec encodes the same.
    TokenizerSpec spec = tok.to_spec();
    EXPECT_EQ(spec.pre, c.pre);
    Tokenizer again = Tokenizer::from_spec(spec);
    EXPECT_EQ(tok.encode(text, true), again.encode(text, true));
    EXPECT_EQ(tok.decode(tok.encode(text, true)), text);
    EXPECT_EQ(tok.bos_id(), -1);
    EXPECT_FALSE(tok.add_bos());
  }
  Tokenizer tok = from_json(hf_json());
  const int32_t the = tok.token_id(" the");
  EXPECT_EQ(tok.encode(" the"), (std::vector<int32_t>{the}));
  EXPECT_EQ(tok.encode("x<|im_end|>", true), (std::vector<int32_t>{3 + 'x', 2}));
}

TEST(TokenizerHf, MergesAsStringsOrPairsAndIgnoreMerges) {
  Tokenizer pairs = from_json(hf_json({.merges_as_pairs = true}));
  Tokenizer strings = from_json(hf_json({.merges_as_pairs = false}));
  const std::string text = "the her 123's";
  EXPECT_EQ(pairs.encode(text), strings.encode(text));
  EXPECT_EQ(pairs.merges().size(), kMerges.size());
  EXPECT_FALSE(pairs.ignore_merges());
  EXPECT_TRUE(from_json(hf_json({.model_extra = R"("ignore_merges": true, )"})).ignore_merges());
}

TEST(TokenizerHf, AddedTokensExtendTheVocabularyAndKeepTheirKind) {
  std::string json = hf_json();
  // A special and a non-special added token with ids past the vocabulary.
  const int next = 3 + 256 + int(kMerges.size());
  std::string extra = R"({"id": )" + std::to_string(next) +
                      R"(, "content": "<tool>", "special": true}, {"id": )" + std::to_string(next + 1) +
                      R"(, "content": "<user-defined>", "special": false}, )";
  const std::string key = R"("added_tokens": [)";
  json.insert(json.find(key) + key.size(), extra);
  Tokenizer tok = from_json(json);
  EXPECT_EQ(tok.vocab_size(), next + 2);
  EXPECT_EQ(tok.token_type(next), TokenType::Control);
  EXPECT_EQ(tok.token_type(next + 1), TokenType::UserDefined);
  EXPECT_EQ(tok.encode("<tool><user-defined>", true), (std::vector<int32_t>{next, next + 1}));
  EXPECT_EQ(tok.decode({next + 1}), "<user-defined>");
}

TEST(TokenizerHf, BosAndEosFromTheConfigOrTheTemplate) {
  ScratchDir dir;
  const std::string path = dir.file("tokenizer.json");
  std::string json = hf_json();
  io::write_file_atomic(path, json.data(), json.size());
  Tokenizer plain = Tokenizer::load_hf(path);
  EXPECT_EQ(plain.bos_id(), -1);
  EXPECT_EQ(plain.eos_id(), -1);

  std::string config =
      R"({"add_bos_token": true, "bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>", "lstrip": false}, "chat_template": "x"})";
  io::write_file_atomic(dir.file("tokenizer_config.json"), config.data(), config.size());
  Tokenizer tok = Tokenizer::load_hf(path);
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_TRUE(tok.add_bos());

  config = R"({"bos_token": null, "eos_token": "he"})";  // an ordinary token, by its text
  io::write_file_atomic(dir.file("tokenizer_config.json"), config.data(), config.size());
  tok = Tokenizer::load_hf(path);
  EXPECT_EQ(tok.bos_id(), -1);
  EXPECT_EQ(tok.eos_id(), tok.token_id("he"));

  // Llama 3 style: the post-processor puts BOS before each text.
  const std::string templ =
      R"({"type": "Sequence", "processors": [{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true}, )"
      R"({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}], )"
      R"("pair": [], "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [0], "tokens": ["<|endoftext|>"]}}}]})";
  tok = from_json(hf_json({.post_processor = templ}));
  EXPECT_EQ(tok.bos_id(), 0);
  EXPECT_TRUE(tok.add_bos());
  EXPECT_EQ(tok.encode("he"), (std::vector<int32_t>{tok.token_id("he")})) << "encode never adds BOS";
}

TEST(TokenizerHf, BadFilesNameTheFieldAtFault) {
  const std::string good = hf_json();
  auto bad = [&](const std::string& from, const std::string& to, const std::vector<std::string>& needles) {
    std::string json = good;
    size_t at = json.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    json.replace(at, from.size(), to);
    std::vector<std::string> all = needles;
    all.push_back("mem/tokenizer.json");
    expect_error([&] { from_json(json); }, all);
  };
  bad(R"("type": "BPE")", R"("type": "WordPiece")", {"model.type", "\"WordPiece\" is not supported"});
  bad(R"("normalizer": null)", R"("normalizer": {"type": "NFC"})",
      {"normalizer", "\"NFC\" changes the text"});
  bad(R"("decoder": {"type": "ByteLevel")", R"("decoder": {"type": "WordPiece")",
      {"decoder.type", "WordPiece"});
  bad(R"("pre_tokenizer": {)", R"("pre_tokenizer": null, "x": {)", {"pre_tokenizer: missing"});
  bad(R"("pre_tokenizer": {"type": "ByteLevel")", R"("pre_tokenizer": {"type": "Metaspace")",
      {"pre_tokenizer.type", "\"Metaspace\" is not supported"});
  bad(R"("add_prefix_space": false, "trim_offsets": true, "use_regex": true}, "post)",
      R"("add_prefix_space": true, "trim_offsets": true, "use_regex": true}, "post)",
      {"pre_tokenizer.add_prefix_space", "true is not supported"});
  bad(R"("use_regex": true}, "post)", R"("use_regex": false}, "post)",
      {"pre_tokenizer.use_regex", "unsplit"});
  bad(R"("use_regex": true}, "post)", R"("use_regex": 1}, "post)",
      {"pre_tokenizer.use_regex", "expected bool, got integer"});
  bad(kByteLevel, split_then_byte_level(R"(\\p{L}+|\\s+)"),
      {"pre_tokenizer.pretokenizers[0].pattern.Regex", "\"\\p{L}+|\\s+\"", "not one retort implements"});
  bad(kByteLevel,
      R"({"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": false}, )" +
          std::string(kByteLevel) + "]}",
      {"pre_tokenizer.pretokenizers[0].individual_digits", "must be true"});
  bad(kByteLevel, R"({"type": "Sequence", "pretokenizers": []})",
      {"pre_tokenizer.pretokenizers", "sequence of 0"});
  {
    std::string s = split_then_byte_level(kLlama3Regex);
    std::string isolated = R"("behavior": "Isolated")";
    s.replace(s.find(isolated), isolated.size(), R"("behavior": "Removed")");
    bad(kByteLevel, s, {"pre_tokenizer.pretokenizers[0].behavior", "\"Removed\""});
    bad(kByteLevel,
        R"({"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "x"}, "behavior": "Isolated", "invert": false}, )" +
            std::string(kByteLevel) + "]}",
        {"pre_tokenizer.pretokenizers[0].pattern.Regex"});
    std::string with_regex = split_then_byte_level(kLlama3Regex);
    with_regex.replace(with_regex.rfind("\"use_regex\": false"), 18, "\"use_regex\": true");
    bad(kByteLevel, with_regex, {"pre_tokenizer.pretokenizers[1].use_regex", "split again"});
  }
  bad(R"("byte_fallback": false)", R"("byte_fallback": true)", {"model.byte_fallback"});
  bad(R"("dropout": null)", R"("dropout": 0.1)", {"model.dropout"});
  bad(R"("continuing_subword_prefix": null)", R"("continuing_subword_prefix": "##")",
      {"model.continuing_subword_prefix"});
  bad(R"("<|endoftext|>": 0)", R"("<|endoftext|>": "0")",
      {"model.vocab[\"<|endoftext|>\"]", "expected integer, got string"});
  bad(R"("<|endoftext|>": 0)", R"("<|endoftext|>": 99999)",
      {"model.vocab[\"<|endoftext|>\"]", "id 99999 is out of range"});
  bad(R"("<|im_end|>": 2)", R"("<|im_end|>": 1)",
      {"model.vocab[\"<|im_end|>\"]", "id 1 is also given to \"<|im_start|>\""});
  bad(R"("!": 36, )", "", {"model.vocab", "no token has id 36"});
  bad(R"("merges": [[)", R"("merges": [7, [)", {"model.merges[0]", "expected \"a b\" or [\"a\", \"b\"]"});
  bad(R"("merges": [[)", R"("merges": ["x y", [)",
      {"merge 0", "the merged token \"xy\" is not an ordinary token"});
  bad(R"("merges": [[)", R"("merges": [["a b", "c"], [)", {"model.merges[0]", "contains a space"});
  bad(R"("vocab": {)", R"("vocab": 1, "vocab2": {)", {"model.vocab", "expected object, got integer"});
  bad(R"({"id": 1, "content")", R"({"id": 0, "content")", {"added_tokens[1].id", "id 0 is listed twice"});
  bad(R"({"id": 1, "content")", R"({"id": -1, "content")", {"added_tokens[1].id", "out of range"});
  bad(R"("content": "<|im_start|>")", R"("content": "")", {"added_tokens[1].content", "is empty"});
  bad(R"("content": "<|im_start|>", "single_word": false, "lstrip": false)",
      R"("content": "<|im_start|>", "single_word": false, "lstrip": true)", {"added_tokens[1].lstrip"});
  bad(R"("special": true})", R"("special": "yes"})", {"added_tokens[0].special", "expected bool"});
  bad(R"("post_processor": null)", R"("post_processor": {"type": "RobertaProcessing"})",
      {"post_processor.type", "RobertaProcessing"});
  bad(R"("post_processor": null)",
      R"("post_processor": {"type": "TemplateProcessing", "single": [{"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "</s>", "type_id": 0}}], "special_tokens": {}})",
      {"post_processor.single[1]", "after the text"});
  bad(R"("post_processor": null)",
      R"("post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}], "special_tokens": {}})",
      {"post_processor.special_tokens", "no entry for \"<s>\""});
  bad(R"({"version")", R"([{"version")", {"malformed JSON"});
  expect_error([&] { from_json("[]"); }, {"mem/tokenizer.json", "(document)", "expected object, got array"});
  expect_error([&] { from_json(good.substr(0, good.size() / 2)); }, {"mem/tokenizer.json", "malformed JSON"});

  // unk_token with missing byte tokens: Hugging Face would emit the unknown token where retort drops bytes.
  {
    std::string json = good;
    json.replace(json.find(R"("unk_token": null)"), 17, R"("unk_token": "<|endoftext|>")");
    EXPECT_NO_THROW(from_json(json)) << "harmless while every byte has a token";
    const std::string byte4 = "\"" + spell("\x04") + "\": 7, ";
    ASSERT_NE(json.find(byte4), std::string::npos);
    json.erase(json.find(byte4), byte4.size());
    // Renumber would be needed for a dense vocabulary: instead move the last token into the gap.
    const std::string last = spell("'s") + "\": " + std::to_string(3 + 256 + kMerges.size() - 1);
    json.replace(json.find(last), last.size(), spell("'s") + "\": 7");
    expect_error([&] { from_json(json); }, {"model.unk_token", "1 bytes have no token"});
  }

  // tokenizer_config.json faults name that file.
  expect_error([&] { from_json(good, R"({"bos_token": "<s>"})"); },
               {"tokenizer_config.json", "bos_token", "\"<s>\" is not a token"});
  expect_error([&] { from_json(good, R"({"eos_token": 2})"); },
               {"tokenizer_config.json", "eos_token", "expected a string or"});
  expect_error([&] { from_json(good, R"({"add_bos_token": "yes"})"); },
               {"tokenizer_config.json", "add_bos_token"});
  expect_error([&] { from_json(good, "{"); }, {"tokenizer_config.json", "malformed JSON"});
  ScratchDir dir;
  expect_error([&] { Tokenizer::load_hf(dir.file("nope.json")); }, {"nope.json", "cannot open"});
}

}  // namespace
}  // namespace retort::test
