// Token shards: a tokenized corpus on disk as a few files of raw token ids, memory-mapped when read.
//
// File layout (little-endian):
//   0  "RTTOKSHD"        magic
//   8  u32 version       1
//   12 u32 dtype         1 = u16, 2 = u32 (token ids)
//   16 u64 count         number of tokens
//   24 u32 reserved      0
//   28 u32 checksum      CRC-32 of bytes 0..28 followed by the tokens
//   32 tokens            count × 2 or 4 bytes
// Readers check the magic, version, dtype, that the file holds exactly count tokens, and the checksum, and
// name the file and the fault when anything is off.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "file.h"

namespace retort {

class Tokenizer;

enum class TokenDType : uint32_t { U16 = 1, U32 = 2 };
const char* token_dtype_name(TokenDType t);  // "u16", "u32"
size_t token_dtype_size(TokenDType t);
// U16 when every id of a vocabulary of this size fits in 16 bits, else U32.
TokenDType token_dtype_for_vocab(int64_t vocab_size);

// Writes tokens to path atomically. Throws retort::Error (naming path) on a token that does not fit dtype.
void write_token_shard(const std::string& path, std::span<const int32_t> tokens, TokenDType dtype);

// One shard, memory-mapped read-only and validated on open.
class TokenShard {
 public:
  // Throws retort::Error naming path and the fault: wrong magic, unsupported version, unknown dtype,
  // truncated, count mismatch, checksum mismatch (skipped when verify_checksum is false).
  explicit TokenShard(const std::string& path, bool verify_checksum = true);

  int64_t size() const { return count_; }
  TokenDType dtype() const { return dtype_; }
  const std::string& path() const { return map_.path(); }
  // Token i; throws retort::Error when i is outside [0, size()).
  int32_t at(int64_t i) const;
  // Copies tokens [begin, begin + n) into out; throws retort::Error when the range is outside the shard.
  void read(int64_t begin, int64_t n, int32_t* out) const;
  std::vector<int32_t> read_all() const;

 private:
  io::MappedFile map_;
  TokenDType dtype_ = TokenDType::U16;
  int64_t count_ = 0;
};

struct ShardWriteOptions {
  double val_fraction = 0.1;  // the last fraction of the tokens, in [0, 1), is the validation split
  int64_t tokens_per_shard = int64_t(1) << 24;  // > 0
};

struct ShardSet {
  std::vector<std::string> train, val;  // paths, in order
  int64_t train_tokens = 0, val_tokens = 0;
};

// Splits tokens into train (the head) and validation (the tail, so no training window overlaps it) and writes
// each as "<prefix>_train_00000.bin", ... and "<prefix>_val_00000.bin", ... (u16 or u32 from vocab_size),
// removing higher-numbered shards of the same names left by an earlier run.
// Throws retort::Error on bad options, no tokens, or a token outside [0, vocab_size).
ShardSet write_shards(std::span<const int32_t> tokens, const std::string& prefix, int64_t vocab_size,
                      const ShardWriteOptions& options = {});
// Encodes text (special tokens allowed, so "<|endoftext|>" separators become the end-of-text id) and writes
// it with write_shards.
ShardSet tokenize_to_shards(const Tokenizer& tokenizer, std::string_view text, const std::string& prefix,
                            const ShardWriteOptions& options = {});
// The shards write_shards made for a split ("train", "val"): "<prefix>_<split>_00000.bin" onwards, up to the
// first missing index.
std::vector<std::string> list_shards(const std::string& prefix, const std::string& split);

}  // namespace retort
