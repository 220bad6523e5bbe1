// Byte-level BPE tokenizer with GPT-2's pre-tokenization. It loads GPT-2's own vocabulary (encoder.json +
// vocab.bpe), trains a vocabulary of a chosen size on a corpus, and saves/loads itself in a small checksummed
// file. Every byte string is encodable (the 256 single bytes are tokens), and decode(encode(text)) == text
// for any bytes, valid UTF-8 or not.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace retort {

struct BpeTrainOptions {
  int64_t vocab_size = 4096;  // final size, special tokens included; >= 256 + number of special tokens
  int64_t min_frequency = 2;  // a pair seen fewer times (weighted by word counts) is never merged
  std::vector<std::string> special_tokens = {"<|endoftext|>"};  // appended after the learned tokens
};

class Tokenizer {
 public:
  struct Merge {
    int32_t left, right, result;  // bytes(result) == bytes(left) + bytes(right)
  };

  // GPT-2's vocabulary: encoder.json (token string -> id, in GPT-2's byte-to-unicode alphabet) and vocab.bpe
  // ("#version" line, then one merge "a b" per line, best first). Throws retort::Error naming the file and
  // the fault (malformed JSON, unknown symbol in a merge, missing byte token, duplicate id, ...).
  static Tokenizer load_gpt2(const std::string& encoder_json_path, const std::string& vocab_bpe_path);
  // Trains merges on corpus: pre-tokenizes it, counts pieces, and repeatedly merges the most frequent
  // adjacent pair (ties: the smaller (left id, right id)). Deterministic. Stops early, with a smaller
  // vocabulary, when no pair reaches min_frequency. Ids 0..255 are the bytes, then the merges' new tokens,
  // then the specials. Throws retort::Error on bad options.
  static Tokenizer train(std::string_view corpus, const BpeTrainOptions& options = {});
  // Loads a file written by save(). Throws retort::Error naming the file and the fault (wrong magic, version,
  // truncation, checksum mismatch, inconsistent tables).
  static Tokenizer load(const std::string& path);
  // Writes the vocabulary atomically (temporary file, fsync, rename), with a versioned header and a checksum.
  void save(const std::string& path) const;

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Token ids of text. With allow_special, exact occurrences of special-token strings ("<|endoftext|>")
  // become their ids; without it they are ordinary text. Thread-safe (pieces are cached behind a lock).
  std::vector<int32_t> encode(std::string_view text, bool allow_special = false) const;
  // The bytes of the tokens, concatenated. Throws retort::Error on an id outside [0, vocab_size()).
  std::string decode(const std::vector<int32_t>& ids) const;
  std::string decode(const int32_t* ids, size_t n) const;

  int64_t vocab_size() const { return int64_t(tokens_.size()); }
  // The bytes of token id (throws retort::Error when out of range).
  const std::string& token_bytes(int32_t id) const;
  // The id of an ordinary token with exactly these bytes, or -1.
  int32_t token_id(std::string_view bytes) const;
  // The id of a special token ("<|endoftext|>"), or -1.
  int32_t special_id(std::string_view name) const;
  // special_id("<|endoftext|>").
  int32_t eot_id() const { return special_id("<|endoftext|>"); }
  const std::vector<int32_t>& special_ids() const { return special_ids_; }
  const std::vector<Merge>& merges() const { return merges_; }

  // GPT-2's byte-to-unicode alphabet: the printable bytes map to themselves, the other 68 to U+0100 onwards.
  static std::array<uint32_t, 256> gpt2_byte_to_unicode();

 private:
  Tokenizer();
  // Builds the lookup tables from tokens_, merges_ and special_ids_, checking they are consistent; errors are
  // reported against `source` (a file name, or "trained vocabulary").
  void build(const std::string& source);
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  std::vector<int32_t> bpe(std::string_view piece) const;
  void encode_ordinary(std::string_view text, std::vector<int32_t>& out) const;

  std::vector<std::string> tokens_;  // id -> bytes
  std::vector<Merge> merges_;        // rank order
  std::vector<int32_t> special_ids_;
  std::unordered_map<std::string, int32_t> ids_;      // ordinary tokens: bytes -> id
  std::unordered_map<uint64_t, int32_t> merge_rank_;  // (left << 32 | right) -> rank
  std::array<int32_t, 256> byte_id_{};
  struct Cache;
  std::unique_ptr<Cache> cache_;
};

}  // namespace retort
