// Tokenizer::load_hf: a Hugging Face tokenizer.json with a byte-level BPE model becomes a TokenizerSpec.
// Every field is checked before it is used, and anything that would make Hugging Face tokenize differently
// from retort (a normalizer, another model type, a pre-tokenizer retort does not implement, added tokens that
// strip whitespace) is an error naming the file and the field rather than a silent difference. `truncation`
// and `padding` shape batches rather than tokenize text, and are ignored.
#include <algorithm>
#include <filesystem>
#include <optional>

#include "../core/error.h"
#include "file.h"
#include "json.h"
#include "tokenizer.h"
#include "tokenizer_text.h"

namespace retort {

namespace {

using io::Json;
using Kind = io::Json::Kind;

// The Split regexes of Llama 3's and Qwen2's tokenizer.json, and GPT-2's (which ByteLevel applies itself).
constexpr std::string_view kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Checked access to a parsed JSON document; errors are "<source>: <field>: <what>", the field written as a
// path ("pre_tokenizer.pretokenizers[1].use_regex").
class Fields {
 public:
  explicit Fields(std::string source) : source_(std::move(source)) {}
  const std::string& source() const { return source_; }

  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    io::file_error(source_, field + ": " + what);
  }
  // obj[key], which must exist and be of kind k.
  const Json& get(const Json& obj, std::string_view key, const std::string& field, Kind k) const {
    const Json* v = obj.find(key);
    if (v == nullptr) fail(field, "missing");
    expect(*v, field, k);
    return *v;
  }
  // obj[key] of kind k, or nullptr when it is absent or null.
  const Json* opt(const Json& obj, std::string_view key, const std::string& field, Kind k) const {
    const Json* v = obj.find(key);
    if (v == nullptr || v->is(Kind::Null)) return nullptr;
    expect(*v, field, k);
    return v;
  }
  bool opt_bool(const Json& obj, std::string_view key, const std::string& field, bool absent) const {
    const Json* v = opt(obj, key, field, Kind::Bool);
    return v ? v->boolean : absent;
  }
  void expect(const Json& v, const std::string& field, Kind k) const {
    if (!v.is(k))
      fail(field, std::string("expected ") + io::json_kind_name(k) + ", got " + io::json_kind_name(v.kind));
  }
  // The "type" of a component object ("ByteLevel", "Sequence", ...).
  const std::string& type_of(const Json& obj, const std::string& field) const {
    expect(obj, field, Kind::Object);
    return get(obj, "type", field + ".type", Kind::String).string;
  }

 private:
  std::string source_;
};

std::string in_quotes(std::string_view s) {
  std::string out = "\"";  // appended piecewise: GCC 12 warns (-Wrestrict) on "\"" + std::string + "\""
  out += io::printable(s);
  out += '"';
  return out;
}

// A ByteLevel pre-tokenizer: no prefix space (retort never adds one), and GPT-2's regex on or off as the
// surrounding sequence needs.
void check_byte_level(const Fields& f, const Json& pt, const std::string& field, bool want_regex) {
  if (f.type_of(pt, field) != "ByteLevel")
    f.fail(field + ".type", "expected ByteLevel, got " + in_quotes(f.type_of(pt, field)));
  if (f.opt_bool(pt, "add_prefix_space", field + ".add_prefix_space", true))
    f.fail(field + ".add_prefix_space", "true is not supported (retort never adds a prefix space)");
  bool regex = f.opt_bool(pt, "use_regex", field + ".use_regex", true);
  if (regex != want_regex)
    f.fail(field + ".use_regex",
           want_regex
               ? "false leaves the text unsplit, which retort does not support"
               : "true would split again after the Split pre-tokenizer, which retort does not support");
}

PreTokenizer parse_pre_tokenizer_field(const Fields& f, const Json& root) {
  const std::string field = "pre_tokenizer";
  const Json* pt = f.opt(root, "pre_tokenizer", field, Kind::Object);
  if (pt == nullptr) f.fail(field, "missing: a byte-level BPE needs a ByteLevel pre-tokenizer");
  const std::string& type = f.type_of(*pt, field);
  if (type == "ByteLevel") {
    check_byte_level(f, *pt, field, true);
    return PreTokenizer::Gpt2;
  }
  const char* supported =
      "supported: ByteLevel, Sequence[Digits(individual_digits), ByteLevel], Sequence[Split(the Llama 3, "
      "Qwen2 or GPT-2 regex), ByteLevel(use_regex=false)]";
  if (type != "Sequence") f.fail(field + ".type", in_quotes(type) + " is not supported (" + supported + ")");
  const Json& items = f.get(*pt, "pretokenizers", field + ".pretokenizers", Kind::Array);
  if (items.items.size() != 2)
    f.fail(field + ".pretokenizers",
           "a sequence of " + std::to_string(items.items.size()) + " is not supported (" + supported + ")");
  const std::string first = field + ".pretokenizers[0]", second = field + ".pretokenizers[1]";
  const std::string& t0 = f.type_of(items.items[0], first);
  if (t0 == "Digits") {
    if (!f.opt_bool(items.items[0], "individual_digits", first + ".individual_digits", false))
      f.fail(first + ".individual_digits", "must be true (digit runs are not supported)");
    check_byte_level(f, items.items[1], second, true);
    return PreTokenizer::Smollm;
  }
  if (t0 != "Split") f.fail(first + ".type", in_quotes(t0) + " is not supported (" + supported + ")");
  const Json& split = items.items[0];
  const Json& pattern = f.get(split, "pattern", first + ".pattern", Kind::Object);
  const Json* regex = f.opt(pattern, "Regex", first + ".pattern.Regex", Kind::String);
  if (regex == nullptr) f.fail(first + ".pattern", "only a Regex pattern is supported");
  const std::string& behavior = f.get(split, "behavior", first + ".behavior", Kind::String).string;
  if (behavior != "Isolated")
    f.fail(first + ".behavior", in_quotes(behavior) + " is not supported (only Isolated)");
  if (f.opt_bool(split, "invert", first + ".invert", false))
    f.fail(first + ".invert", "true is not supported");
  PreTokenizer pre;
  if (regex->string == kLlama3Regex) {
    pre = PreTokenizer::Llama3;
  } else if (regex->string == kQwen2Regex) {
    pre = PreTokenizer::Qwen2;
  } else if (regex->string == kGpt2Regex) {
    pre = PreTokenizer::Gpt2;
  } else {
    f.fail(first + ".pattern.Regex", "the pattern " + in_quotes(regex->string) +
                                         " is not one retort implements (Llama 3's, Qwen2's, GPT-2's)");
  }
  check_byte_level(f, items.items[1], second, false);
  return pre;
}

// Normalizers rewrite the text before it is split; retort tokenizes the text as given.
void check_normalizer(const Fields& f, const Json& root) {
  const Json* n = f.opt(root, "normalizer", "normalizer", Kind::Object);
  if (n == nullptr) return;
  const std::string& type = f.type_of(*n, "normalizer");
  if (type == "Sequence" && f.get(*n, "normalizers", "normalizer.normalizers", Kind::Array).items.empty())
    return;
  f.fail("normalizer",
         in_quotes(type) + " changes the text before tokenization, which retort does not support");
}

void check_decoder(const Fields& f, const Json& root) {
  const Json* d = f.opt(root, "decoder", "decoder", Kind::Object);
  if (d == nullptr) return;
  const std::string& type = f.type_of(*d, "decoder");
  if (type != "ByteLevel") f.fail("decoder.type", in_quotes(type) + " is not supported (only ByteLevel)");
}

// The post-processor decides what Hugging Face adds around a text: a leading special token is BOS.
// Returns its id, or nullopt when nothing is added.
std::optional<int32_t> template_bos(const Fields& f, const Json& pp, const std::string& field, int64_t n) {
  const std::string& type = f.type_of(pp, field);
  if (type == "ByteLevel") return std::nullopt;
  if (type == "Sequence") {
    std::optional<int32_t> bos;
    const Json& list = f.get(pp, "processors", field + ".processors", Kind::Array);
    for (size_t i = 0; i < list.items.size(); ++i)
      if (auto b = template_bos(f, list.items[i], field + ".processors[" + std::to_string(i) + "]", n))
        bos = b;
    return bos;
  }
  if (type != "TemplateProcessing")
    f.fail(field + ".type", in_quotes(type) + " is not supported (ByteLevel, TemplateProcessing, Sequence)");
  const Json& single = f.get(pp, "single", field + ".single", Kind::Array);
  const Json& specials = f.get(pp, "special_tokens", field + ".special_tokens", Kind::Object);
  std::optional<int32_t> bos;
  for (size_t i = 0; i < single.items.size(); ++i) {
    const std::string at = field + ".single[" + std::to_string(i) + "]";
    f.expect(single.items[i], at, Kind::Object);
    const Json* st = f.opt(single.items[i], "SpecialToken", at + ".SpecialToken", Kind::Object);
    if (st == nullptr) continue;
    if (i != 0) f.fail(at, "a special token after the text is not supported (only a leading BOS)");
    const std::string& name = f.get(*st, "id", at + ".SpecialToken.id", Kind::String).string;
    const Json* entry = specials.find(name);
    if (entry == nullptr) f.fail(field + ".special_tokens", "no entry for " + in_quotes(name));
    const std::string ef = field + ".special_tokens." + name + ".ids";
    const Json& ids = f.get(*entry, "ids", ef, Kind::Array);
    if (ids.items.size() != 1 || !ids.items[0].is(Kind::Int) || ids.items[0].integer < 0 ||
        ids.items[0].integer >= n)
      f.fail(ef, "expected one token id in [0, " + std::to_string(n) + ")");
    bos = int32_t(ids.items[0].integer);
  }
  return bos;
}

// The id of the token spelled `text` in a tokenizer_config.json: a special token with that text, else an
// ordinary token with those bytes; -1 when there is none.
int32_t find_token(const TokenizerSpec& spec, std::string_view text) {
  for (size_t id = 0; id < spec.tokens.size(); ++id)
    if (spec.types[id] != int32_t(TokenType::Normal) && spec.tokens[id] == text) return int32_t(id);
  const std::string spelled = io::bytes_to_gpt2_text(text);
  for (size_t id = 0; id < spec.tokens.size(); ++id)
    if (spec.types[id] == int32_t(TokenType::Normal) && spec.tokens[id] == spelled) return int32_t(id);
  return -1;
}

// tokenizer_config.json's bos_token / eos_token: a string, {"content": string}, or null. Returns the token's
// id, -1 for null or absent.
int32_t config_token(const Fields& f, const Json& config, const char* key, const TokenizerSpec& spec) {
  const Json* v = config.find(key);
  if (v == nullptr || v->is(Kind::Null)) return -1;
  const std::string* text = nullptr;
  if (v->is(Kind::String)) {
    text = &v->string;
  } else if (v->is(Kind::Object)) {
    text = &f.get(*v, "content", std::string(key) + ".content", Kind::String).string;
  } else {
    f.fail(key, std::string("expected a string or {\"content\": ...}, got ") + io::json_kind_name(v->kind));
  }
  int32_t id = find_token(spec, *text);
  if (id < 0) f.fail(key, in_quotes(*text) + " is not a token of the vocabulary");
  return id;
}

// The byte values no single-byte Normal token spells.
size_t count_missing_bytes(const TokenizerSpec& spec) {
  std::vector<bool> have(256, false);
  std::string bytes;
  for (size_t id = 0; id < spec.tokens.size(); ++id)
    if (spec.types[id] == int32_t(TokenType::Normal) && spec.tokens[id].size() <= 2 &&
        io::gpt2_text_to_bytes(spec.tokens[id], bytes) && bytes.size() == 1)
      have[uint8_t(bytes[0])] = true;
  return size_t(std::count(have.begin(), have.end(), false));
}

}  // namespace

Tokenizer Tokenizer::from_hf_json(std::string_view tokenizer_json, std::string_view config_json,
                                  const std::string& source, const std::string& config_source) {
  Fields f(source);
  const Json root = io::parse_json(tokenizer_json, source);
  f.expect(root, "(document)", Kind::Object);
  check_normalizer(f, root);
  check_decoder(f, root);

  // ---- the model
  const Json& model = f.get(root, "model", "model", Kind::Object);
  const std::string& mtype = f.get(model, "type", "model.type", Kind::String).string;
  if (mtype != "BPE") f.fail("model.type", in_quotes(mtype) + " is not supported (only BPE)");
  if (const Json* d = model.find("dropout");
      d != nullptr && !d->is(Kind::Null) && !(d->is(Kind::Int) && d->integer == 0))
    f.fail("model.dropout", "must be null (BPE dropout is random; retort's encoding is deterministic)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (const Json* v = f.opt(model, key, std::string("model.") + key, Kind::String); v && !v->string.empty())
      f.fail(std::string("model.") + key, "is not supported by a byte-level BPE");
  if (f.opt_bool(model, "byte_fallback", "model.byte_fallback", false))
    f.fail("model.byte_fallback", "true is not supported (a SentencePiece-style vocabulary)");
  const Json* unk = f.opt(model, "unk_token", "model.unk_token", Kind::String);
  const Json& vocab = f.get(model, "vocab", "model.vocab", Kind::Object);
  const Json& merges = f.get(model, "merges", "model.merges", Kind::Array);
  const Json* added = f.opt(root, "added_tokens", "added_tokens", Kind::Array);
  const size_t n_added = added ? added->items.size() : 0;

  // ---- tokens: the vocabulary, then the added tokens, which may reuse its ids or extend it. Ids must be
  // 0..n-1 without gaps, so an id of at most (vocabulary + added tokens) is checked before anything is sized.
  const size_t limit = vocab.keys.size() + n_added;
  TokenizerSpec spec;
  spec.source = source;
  spec.tokens.resize(limit);
  spec.types.assign(limit, 0);  // 0: no token yet
  for (size_t i = 0; i < vocab.keys.size(); ++i) {
    const Json& v = vocab.items[i];
    const std::string field = "model.vocab[" + in_quotes(vocab.keys[i]) + "]";
    f.expect(v, field, Kind::Int);
    if (v.integer < 0 || uint64_t(v.integer) >= limit)
      f.fail(field,
             "id " + std::to_string(v.integer) + " is out of range [0, " + std::to_string(limit) + ")");
    const size_t id = size_t(v.integer);
    if (spec.types[id] != 0)
      f.fail(field, "id " + std::to_string(id) + " is also given to " + in_quotes(spec.tokens[id]));
    spec.tokens[id] = vocab.keys[i];
    spec.types[id] = int32_t(TokenType::Normal);
  }
  std::vector<bool> from_added(limit, false);
  for (size_t i = 0; i < n_added; ++i) {
    const std::string field = "added_tokens[" + std::to_string(i) + "]";
    const Json& t = added->items[i];
    f.expect(t, field, Kind::Object);
    const Json& idv = f.get(t, "id", field + ".id", Kind::Int);
    if (idv.integer < 0 || uint64_t(idv.integer) >= limit)
      f.fail(field + ".id",
             "id " + std::to_string(idv.integer) + " is out of range [0, " + std::to_string(limit) + ")");
    const size_t id = size_t(idv.integer);
    if (from_added[id]) f.fail(field + ".id", "id " + std::to_string(id) + " is listed twice");
    const std::string& content = f.get(t, "content", field + ".content", Kind::String).string;
    if (content.empty()) f.fail(field + ".content", "is empty");
    // These options strip or bound the text around a match; retort matches the content exactly.
    for (const char* key : {"lstrip", "rstrip", "single_word"})
      if (f.opt_bool(t, key, field + "." + key, false)) f.fail(field + "." + key, "true is not supported");
    const bool special = f.opt_bool(t, "special", field + ".special", false);
    from_added[id] = true;
    spec.tokens[id] = content;
    spec.types[id] = int32_t(special ? TokenType::Control : TokenType::UserDefined);
  }
  size_t n = limit;
  while (n > 0 && spec.types[n - 1] == 0) --n;
  for (size_t id = 0; id < n; ++id)
    if (spec.types[id] == 0)
      f.fail("model.vocab", "no token has id " + std::to_string(id) + " (ids must be 0.." +
                                std::to_string(n - 1) + " without gaps)");
  spec.tokens.resize(n);
  spec.types.resize(n);

  // ---- merges: "a b" strings, or [a, b] pairs (tokenizers >= 0.20)
  spec.merges.reserve(merges.items.size());
  for (size_t r = 0; r < merges.items.size(); ++r) {
    const Json& m = merges.items[r];
    const std::string field = "model.merges[" + std::to_string(r) + "]";
    if (m.is(Kind::String)) {
      spec.merges.push_back(m.string);
      continue;
    }
    if (!m.is(Kind::Array) || m.items.size() != 2 || !m.items[0].is(Kind::String) ||
        !m.items[1].is(Kind::String))
      f.fail(field, "expected \"a b\" or [\"a\", \"b\"]");
    const std::string &a = m.items[0].string, &b = m.items[1].string;
    if (a.find(' ') != std::string::npos || b.find(' ') != std::string::npos)
      f.fail(field, "a half contains a space, which GPT-2's byte alphabet never does");
    spec.merges.push_back(a + " " + b);
  }
  spec.pre = parse_pre_tokenizer_field(f, root);
  spec.ignore_merges = f.opt_bool(model, "ignore_merges", "model.ignore_merges", false);
  std::optional<int32_t> bos;
  if (const Json* pp = f.opt(root, "post_processor", "post_processor", Kind::Object))
    bos = template_bos(f, *pp, "post_processor", int64_t(n));
  spec.add_bos = bos.has_value();
  spec.bos = bos.value_or(-1);

  if (unk != nullptr)
    if (size_t missing = count_missing_bytes(spec))
      f.fail("model.unk_token",
             "is set while " + std::to_string(missing) +
                 " bytes have no token: Hugging Face would encode them as the unknown token, "
                 "retort drops them");

  if (!config_json.empty()) {
    Fields c(config_source.empty() ? source + " (tokenizer_config.json)" : config_source);
    const Json config = io::parse_json(config_json, c.source());
    c.expect(config, "(document)", Kind::Object);
    if (int32_t b = config_token(c, config, "bos_token", spec); b >= 0) spec.bos = b;
    if (int32_t e = config_token(c, config, "eos_token", spec); e >= 0) spec.eos = e;
    spec.add_bos = c.opt_bool(config, "add_bos_token", "add_bos_token", spec.add_bos);
  }
  return from_spec(spec);
}

Tokenizer Tokenizer::load_hf(const std::string& tokenizer_json_path) {
  std::string json = io::read_text_file(tokenizer_json_path);
  std::filesystem::path config_path =
      std::filesystem::path(tokenizer_json_path).parent_path() / "tokenizer_config.json";
  std::string config;
  std::error_code ec;
  if (std::filesystem::is_regular_file(config_path, ec)) config = io::read_text_file(config_path.string());
  return from_hf_json(json, config, tokenizer_json_path, config_path.string());
}

}  // namespace retort
