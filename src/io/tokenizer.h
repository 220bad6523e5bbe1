// Byte-level BPE tokenizer: GPT-2's, the ones retort trains, and those of pretrained models that work the
// same way (SmolLM2, Llama 3, Qwen2, ...), read from GGUF's `tokenizer.ggml.*` arrays (TokenizerSpec) or a
// Hugging Face tokenizer.json. Text is split by a pre-tokenizer (pretokenize.h), each piece's bytes become
// byte tokens, and merges join them, lowest rank first. Special tokens ("<|endoftext|>", "<|im_start|>")
// are matched in the text only when encode() is asked to. It saves/loads itself in a small checksummed file.
//
// Missing byte tokens: some vocabularies have no single-byte token for a few bytes (SmolLM2 lacks 21, among
// them 0x04, 0xC0 and 0xF5..0xFF). encode() drops such bytes before merging, as Hugging Face's BPE does
// when it has no unknown token, so encode() never fails and decode(encode(text)) == text holds for every
// text made of bytes the vocabulary has. (llama.cpp drops them after merging instead, so the bytes on
// either side of one never merge; the two differ only inside runs of punctuation and symbols.)
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "pretokenize.h"
#include "special_matcher.h"

namespace retort {

// GGUF's token types (tokenizer.ggml.token_type). Normal tokens are ordinary BPE tokens. Unknown, Control
// and UserDefined tokens are specials: encode() matches their text only with allow_special, decode() gives
// their text. (Hugging Face and llama.cpp split UserDefined tokens — tokenizer.json's non-special added
// tokens — out of the text even when specials are not allowed; retort treats all specials alike.) Unused
// tokens (vocabulary padding such as "[PAD151643]") are never produced by encode(); decode() gives their
// text.
enum class TokenType : int32_t { Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5 };

// A vocabulary as model files describe it (GGUF's tokenizer.ggml.tokens / token_type / merges / pre /
// bos_token_id / eos_token_id / add_bos_token).
struct TokenizerSpec {
  std::vector<std::string> tokens = {};  // id -> token: Normal ones in GPT-2's byte-to-unicode alphabet
                                         // ("Ġthe"), the others as their text ("<|im_start|>")
  std::vector<int32_t> types = {};       // id -> TokenType value; empty: all Normal
  std::vector<std::string> merges = {};  // "a b" in GPT-2's alphabet, best first
  PreTokenizer pre = PreTokenizer::Gpt2;
  int32_t bos = -1, eos = -1;  // -1: none
  bool add_bos = false;        // the model expects BOS before each text (encode() never adds it)
  bool ignore_merges = false;  // a piece that is itself a token becomes that token (Llama 3; HF's flag)
  std::string source = "";     // a file name, for error messages
};

struct BpeTrainOptions {
  int64_t vocab_size = 4096;  // final size, special tokens included; >= 256 + number of special tokens
  int64_t min_frequency = 2;  // a pair seen fewer times (weighted by word counts) is never merged
  std::vector<std::string> special_tokens = {"<|endoftext|>"};  // appended after the learned tokens
  PreTokenizer pre = PreTokenizer::Gpt2;                        // how the corpus is split into pieces
};

// Hugging Face's tokenizer.json for a vocabulary: a BPE model of every token (GPT-2's alphabet for the
// Normal ones) and the merges, the other tokens listed again as added tokens (Control, Unknown and Unused
// ones special), the pre-tokenizer as the `tokenizers` library spells it, a ByteLevel decoder, and a
// TemplateProcessing post-processor adding BOS when spec.add_bos. Tokenizer::load_hf reads it back to the
// same encoding. Throws retort::Error naming spec.source for a vocabulary the format cannot hold (two tokens
// with one spelling, a merge "a b" without one space).
std::string hf_tokenizer_json(const TokenizerSpec& spec);
// tokenizer_config.json for it: bos/eos tokens, add_bos_token, model_max_length, PreTrainedTokenizerFast.
std::string hf_tokenizer_config_json(const TokenizerSpec& spec, int64_t model_max_length);

class Tokenizer {
 public:
  struct Merge {
    int32_t left, right, result;  // bytes(result) == bytes(left) + bytes(right)
  };

  // GPT-2's vocabulary: encoder.json (token string -> id, in GPT-2's byte-to-unicode alphabet) and vocab.bpe
  // ("#version" line, then one merge "a b" per line, best first). Throws retort::Error naming the file and
  // the fault (malformed JSON, unknown symbol in a merge, missing byte token, duplicate id, ...).
  static Tokenizer load_gpt2(const std::string& encoder_json_path, const std::string& vocab_bpe_path);
  // A vocabulary from its model-file description. Throws retort::Error naming spec.source and the token or
  // merge at fault (a character outside GPT-2's alphabet, an unknown type, two tokens with the same bytes, a
  // merge whose halves or result are not tokens, BOS/EOS out of range, ...). Missing byte tokens are allowed.
  static Tokenizer from_spec(const TokenizerSpec& spec);
  // A Hugging Face tokenizer.json with a byte-level BPE model, and BOS/EOS from the tokenizer_config.json
  // next to it when there is one. Throws retort::Error naming the file and the field for anything malformed
  // or unsupported (another model type, a normalizer, an unknown pre-tokenizer regex, ids out of range, ...).
  static Tokenizer load_hf(const std::string& tokenizer_json_path);
  // load_hf from memory: tokenizer.json's text, and tokenizer_config.json's text or "" for none; errors name
  // `source` and `config_source` (default: source + " (tokenizer_config.json)").
  static Tokenizer from_hf_json(std::string_view tokenizer_json, std::string_view config_json,
                                const std::string& source, const std::string& config_source = "");
  // Trains merges on corpus: pre-tokenizes it, counts pieces, and repeatedly merges the most frequent
  // adjacent pair (ties: the smaller (left id, right id)). Deterministic. Stops early, with a smaller
  // vocabulary, when no pair reaches min_frequency. Ids 0..255 are the bytes, then the merges' new tokens,
  // then the specials (Control). Throws retort::Error on bad options.
  static Tokenizer train(std::string_view corpus, const BpeTrainOptions& options = {});
  // Loads a file written by save() (version 2, or version 1 from older builds). Throws retort::Error naming
  // the file and the fault (wrong magic, version, truncation, checksum mismatch, inconsistent tables).
  static Tokenizer load(const std::string& path);
  // load() from memory: the bytes of such a file; name stands for the file in error messages.
  static Tokenizer from_bytes(std::span<const uint8_t> bytes, const std::string& name);
  // Writes the vocabulary, token types, pre-tokenizer and BOS/EOS atomically (temporary file, fsync, rename),
  // with a versioned header and a checksum.
  void save(const std::string& path) const;
  // The bytes save() writes (to embed the tokenizer in another file, e.g. a checkpoint).
  std::vector<uint8_t> to_bytes() const;
  // The model-file description of this vocabulary; from_spec(to_spec()) encodes identically.
  TokenizerSpec to_spec() const;

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Token ids of text. With allow_special, occurrences of special tokens' text become their ids (leftmost
  // first, the longest at a position); without it they are ordinary text. Never adds BOS (see add_bos()).
  // Linear time. Thread-safe (pieces are cached behind a lock).
  std::vector<int32_t> encode(std::string_view text, bool allow_special = false) const;
  // The bytes of the tokens (a special's text), concatenated. Throws retort::Error on an id outside
  // [0, vocab_size()).
  std::string decode(const std::vector<int32_t>& ids) const;
  std::string decode(const int32_t* ids, size_t n) const;

  int64_t vocab_size() const { return int64_t(tokens_.size()); }
  // The bytes decode() gives for token id (throws retort::Error when out of range).
  const std::string& token_bytes(int32_t id) const;
  // Token id as model files spell it: GPT-2's alphabet for a Normal token ("Ġworld"), the text otherwise.
  std::string token_text(int32_t id) const;
  // token_text's inverse: the id of the token model files spell `text` ("Ġworld", "<|im_start|>"), or -1.
  int32_t token_from_text(std::string_view text) const;
  TokenType token_type(int32_t id) const;
  // Whether id is an Unknown, Control or UserDefined token (throws retort::Error when out of range).
  bool is_special(int32_t id) const;
  // The id of an ordinary token with exactly these bytes, or -1.
  int32_t token_id(std::string_view bytes) const;
  // The id of a special token ("<|endoftext|>"), or -1.
  int32_t special_id(std::string_view name) const;
  // special_id("<|endoftext|>").
  int32_t eot_id() const { return special_id("<|endoftext|>"); }
  const std::vector<int32_t>& special_ids() const { return special_ids_; }
  const std::vector<Merge>& merges() const { return merges_; }
  // Bytes with no single-byte token (encode() drops them); empty for GPT-2's and trained vocabularies.
  std::vector<uint8_t> missing_bytes() const;

  int32_t bos_id() const { return bos_; }  // -1: none
  int32_t eos_id() const { return eos_; }  // -1: none
  bool add_bos() const { return add_bos_; }
  bool ignore_merges() const { return ignore_merges_; }
  PreTokenizer pre_tokenizer() const { return pre_; }

  // GPT-2's byte-to-unicode alphabet: the printable bytes map to themselves, the other 68 to U+0100 onwards.
  static std::array<uint32_t, 256> gpt2_byte_to_unicode();

 private:
  Tokenizer();
  // Builds the lookup tables from tokens_, types_, merges_ and the options, checking they are consistent;
  // errors are reported against `source` (a file name, or "trained vocabulary"). GPT-2's files and trained
  // vocabularies must have all 256 byte tokens (require_all_bytes); models' vocabularies may lack some.
  void build(const std::string& source, bool require_all_bytes);
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  std::vector<int32_t> bpe(std::string_view piece) const;
  void encode_ordinary(std::string_view text, std::vector<int32_t>& out) const;

  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
  };

  std::vector<std::string> tokens_;  // id -> bytes (Normal) or text (the other types)
  std::vector<TokenType> types_;     // id -> type
  std::vector<Merge> merges_;        // rank order
  std::vector<int32_t> special_ids_;
  PreTokenizer pre_ = PreTokenizer::Gpt2;
  int32_t bos_ = -1, eos_ = -1;
  bool add_bos_ = false, ignore_merges_ = false;
  std::unordered_map<std::string, int32_t, Hash, std::equal_to<>> ids_;  // Normal tokens: bytes -> id
  std::unordered_map<uint64_t, int32_t> merge_rank_;                     // (left << 32 | right) -> rank
  std::array<int32_t, 256> byte_id_{};                                   // -1: no token for that byte
  io::SpecialMatcher specials_;
  struct Cache;
  std::unique_ptr<Cache> cache_;
};

}  // namespace retort
