// hf_tokenizer_json / hf_tokenizer_config_json: a vocabulary as a Hugging Face tokenizer.json, written in the
// shapes tokenizer_hf.cpp accepts, so the `tokenizers` library and Tokenizer::load_hf encode alike.
#include <set>

#include "../core/error.h"
#include "json.h"
#include "tokenizer.h"
#include "tokenizer_text.h"

namespace retort {

namespace {

// The Split regexes tokenizer_hf.cpp recognizes (Llama 3's and Qwen2's).
constexpr std::string_view kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::string quoted(std::string_view s) {
  std::string out;
  io::append_json_string(out, s);
  return out;
}

std::string byte_level(bool use_regex) {
  return std::string(
             R"({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": )") +
         (use_regex ? "true}" : "false}");
}

std::string pre_tokenizer_json(PreTokenizer pre) {
  switch (pre) {
    case PreTokenizer::Gpt2:
      return byte_level(true);
    case PreTokenizer::Smollm:
      return R"({"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": true}, )" +
             byte_level(true) + "]}";
    case PreTokenizer::Llama3:
    case PreTokenizer::Qwen2:
      return R"({"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": )" +
             quoted(pre == PreTokenizer::Llama3 ? kLlama3Regex : kQwen2Regex) +
             R"(}, "behavior": "Isolated", "invert": false}, )" + byte_level(false) + "]}";
  }
  RT_FAIL("hf_tokenizer_json: unknown pre-tokenizer ", int(pre));
}

TokenType type_of(const TokenizerSpec& spec, size_t id) {
  return spec.types.empty() ? TokenType::Normal : TokenType(spec.types[id]);
}

}  // namespace

std::string hf_tokenizer_json(const TokenizerSpec& spec) {
  RT_CHECK(spec.types.empty() || spec.types.size() == spec.tokens.size(), spec.source,
           ": tokenizer.json export: ", spec.types.size(), " token types for ", spec.tokens.size(),
           " tokens");
  // tokenizer.json maps strings to ids, so one spelling cannot name two tokens.
  std::set<std::string_view> seen;
  for (size_t id = 0; id < spec.tokens.size(); ++id)
    if (!seen.insert(spec.tokens[id]).second)
      RT_FAIL(spec.source, ": tokenizer.json export: token ", id, " \"", io::printable(spec.tokens[id]),
              "\" has the spelling of an earlier token; Hugging Face needs unique token strings");
  std::string added, vocab;
  for (size_t id = 0; id < spec.tokens.size(); ++id) {
    // Every token is in the model's vocabulary, the specials too: `tokenizers` gives an added token that is
    // not there a fresh id past the vocabulary, whatever id added_tokens says.
    vocab += (vocab.empty() ? "" : ", ") + quoted(spec.tokens[id]) + ": " + std::to_string(id);
    const TokenType t = type_of(spec, id);
    if (t == TokenType::Normal) continue;
    added += std::string(added.empty() ? "" : ",\n    ") + "{\"id\": " + std::to_string(id) +
             ", \"content\": " + quoted(spec.tokens[id]) +
             R"(, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": )" +
             (t == TokenType::UserDefined ? "false}" : "true}");
  }
  std::string merges;
  for (const std::string& m : spec.merges) {
    const size_t sp = m.find(' ');
    RT_CHECK(
        sp != std::string::npos && sp > 0 && sp + 1 < m.size() && m.find(' ', sp + 1) == std::string::npos,
        spec.source, ": tokenizer.json export: merge \"", io::printable(m), "\" is not \"a b\"");
    merges += (merges.empty() ? "" : ", ") + quoted(m);
  }
  std::string post = byte_level(true);
  if (spec.add_bos && spec.bos >= 0) {
    const std::string b = quoted(spec.tokens[size_t(spec.bos)]);
    const std::string special = R"({"SpecialToken": {"id": )" + b + R"(, "type_id": 0}})";
    post = R"({"type": "TemplateProcessing", "single": [)" + special +
           R"(, {"Sequence": {"id": "A", "type_id": 0}}], "pair": [)" + special +
           R"(, {"Sequence": {"id": "A", "type_id": 0}}, )" + special +
           R"(, {"Sequence": {"id": "B", "type_id": 1}}], "special_tokens": {)" + b + ": {\"id\": " + b +
           ", \"ids\": [" + std::to_string(spec.bos) + "], \"tokens\": [" + b + "]}}}";
  }
  std::string out = "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n";
  out += "  \"added_tokens\": [" + (added.empty() ? "" : "\n    " + added + "\n  ") + "],\n";
  out += "  \"normalizer\": null,\n";
  out += "  \"pre_tokenizer\": " + pre_tokenizer_json(spec.pre) + ",\n";
  out += "  \"post_processor\": " + post + ",\n";
  out +=
      "  \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": true, "
      "\"use_regex\": true},\n";
  out +=
      R"(  "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null, )"
      R"("end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": )";
  out += spec.ignore_merges ? "true" : "false";
  out += ",\n    \"vocab\": {" + vocab + "},\n    \"merges\": [" + merges + "]}\n}\n";
  return out;
}

std::string hf_tokenizer_config_json(const TokenizerSpec& spec, int64_t model_max_length) {
  // A special token is named by its text, an ordinary one by its bytes (as tokenizer_hf.cpp looks them up).
  auto token = [&](int32_t id) {
    if (id < 0) return std::string("null");
    std::string bytes;
    if (type_of(spec, size_t(id)) == TokenType::Normal &&
        io::gpt2_text_to_bytes(spec.tokens[size_t(id)], bytes))
      return quoted(bytes);
    return quoted(spec.tokens[size_t(id)]);
  };
  std::string out = "{\n";
  out += "  \"tokenizer_class\": \"PreTrainedTokenizerFast\",\n";
  out += "  \"bos_token\": " + token(spec.bos) + ",\n";
  out += "  \"eos_token\": " + token(spec.eos) + ",\n";
  out += std::string("  \"add_bos_token\": ") + (spec.add_bos ? "true" : "false") + ",\n";
  out += "  \"add_eos_token\": false,\n";
  out += "  \"clean_up_tokenization_spaces\": false,\n";
  out += "  \"model_max_length\": " + std::to_string(model_max_length) + "\n}\n";
  return out;
}

}  // namespace retort
