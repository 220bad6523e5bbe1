#include "shards.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>

#include "../core/error.h"
#include "tokenizer.h"

namespace retort {

namespace {

constexpr char kMagic[] = "RTTOKSHD";
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 32;
constexpr size_t kCrcOffset = 28;

std::string shard_name(const std::string& prefix, const std::string& split, size_t index) {
  char num[16];
  std::snprintf(num, sizeof num, "%05zu", index);
  return prefix + "_" + split + "_" + num + ".bin";
}

}  // namespace

const char* token_dtype_name(TokenDType t) {
  return t == TokenDType::U16 ? "u16" : "u32";
}
size_t token_dtype_size(TokenDType t) {
  return t == TokenDType::U16 ? 2 : 4;
}
TokenDType token_dtype_for_vocab(int64_t vocab_size) {
  return vocab_size <= 65536 ? TokenDType::U16 : TokenDType::U32;
}

void write_token_shard(const std::string& path, std::span<const int32_t> tokens, TokenDType dtype) {
  RT_CHECK(dtype == TokenDType::U16 || dtype == TokenDType::U32, path, ": unknown token dtype ",
           uint32_t(dtype));
  const int64_t max_id = dtype == TokenDType::U16 ? 65535 : INT32_MAX;
  std::vector<uint8_t> body(tokens.size() * token_dtype_size(dtype));
  for (size_t i = 0; i < tokens.size(); ++i) {
    int32_t t = tokens[i];
    if (t < 0 || t > max_id)
      io::file_error(path, "token " + std::to_string(i) + " is " + std::to_string(t) +
                               ", which does not fit " + token_dtype_name(dtype));
    if (dtype == TokenDType::U16)
      io::store_le16(body.data() + 2 * i, uint16_t(t));
    else
      io::store_le32(body.data() + 4 * i, uint32_t(t));
  }
  std::vector<uint8_t> header;
  io::append_bytes(header, kMagic, 8);
  io::append_le32(header, kVersion);
  io::append_le32(header, uint32_t(dtype));
  io::append_le64(header, tokens.size());
  io::append_le32(header, 0);
  io::append_le32(header, io::crc32_update(io::crc32(header), body.data(), body.size()));
  io::write_file_atomic(path, [&](io::FileWriter& w) {
    w.write(header);
    w.write(body);
  });
}

TokenShard::TokenShard(const std::string& path, bool verify_checksum) : map_(path) {
  io::ByteReader r(map_.bytes(), path);
  r.expect_magic(std::string_view(kMagic, 8), "retort token shard");
  uint32_t version = r.u32("version");
  if (version != kVersion)
    r.fail("unsupported version ", version, " (this build reads token shards of version ", kVersion, ")");
  uint32_t dtype = r.u32("dtype");
  if (dtype != uint32_t(TokenDType::U16) && dtype != uint32_t(TokenDType::U32))
    r.fail("unknown token dtype ", dtype, " (1 = u16, 2 = u32)");
  dtype_ = TokenDType(dtype);
  uint64_t count = r.u64("token count");
  uint32_t reserved = r.u32("reserved");
  uint32_t crc = r.u32("checksum");
  if (reserved != 0) r.fail("reserved header field is ", reserved, ", expected 0 (corrupt header)");
  const size_t es = token_dtype_size(dtype_);
  const uint64_t have = r.remaining();
  // Compare in tokens first, so an absurd count cannot overflow the byte count.
  if (count > have / es)
    r.fail("truncated: the header says ", count, " ", token_dtype_name(dtype_), " tokens (", count, " x ", es,
           " bytes), but the file holds ", have, " bytes after the header");
  if (count * es != have)
    r.fail("count mismatch: the header says ", count, " ", token_dtype_name(dtype_), " tokens (", count * es,
           " bytes), but the file holds ", have, " bytes after the header");
  count_ = int64_t(count);
  if (verify_checksum) {
    uint32_t got = io::crc32_update(io::crc32(map_.data(), kCrcOffset), map_.data() + kHeaderBytes, have);
    if (got != crc)
      r.fail("checksum mismatch: the CRC-32 is ", got, ", the header says ", crc, " (corrupt file)");
  }
}

int32_t TokenShard::at(int64_t i) const {
  RT_CHECK(i >= 0 && i < count_, path(), ": token index ", i, " is outside [0, ", count_, ")");
  const uint8_t* p = map_.data() + kHeaderBytes;
  return dtype_ == TokenDType::U16 ? int32_t(io::load_le16(p + 2 * i)) : int32_t(io::load_le32(p + 4 * i));
}

void TokenShard::read(int64_t begin, int64_t n, int32_t* out) const {
  RT_CHECK(begin >= 0 && n >= 0 && begin <= count_ && n <= count_ - begin, path(), ": token range [", begin,
           ", ", begin + n, ") is outside [0, ", count_, ")");
  const uint8_t* p = map_.data() + kHeaderBytes;
  if (dtype_ == TokenDType::U16) {
    for (int64_t i = 0; i < n; ++i) out[i] = int32_t(io::load_le16(p + 2 * (begin + i)));
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = int32_t(io::load_le32(p + 4 * (begin + i)));
  }
}

std::vector<int32_t> TokenShard::read_all() const {
  std::vector<int32_t> out(static_cast<size_t>(count_));
  read(0, count_, out.data());
  return out;
}

ShardSet write_shards(std::span<const int32_t> tokens, const std::string& prefix, int64_t vocab_size,
                      const ShardWriteOptions& options) {
  RT_CHECK(vocab_size > 0 && vocab_size <= int64_t(INT32_MAX) + 1,
           "write_shards: vocab_size must be in [1, 2^31], got ", vocab_size);
  RT_CHECK(std::isfinite(options.val_fraction) && options.val_fraction >= 0 && options.val_fraction < 1,
           "write_shards: val_fraction must be in [0, 1), got ", options.val_fraction);
  RT_CHECK(options.tokens_per_shard > 0, "write_shards: tokens_per_shard must be > 0, got ",
           options.tokens_per_shard);
  RT_CHECK(!tokens.empty(), "write_shards: no tokens to write to ", prefix);
  for (size_t i = 0; i < tokens.size(); ++i)
    RT_CHECK(tokens[i] >= 0 && tokens[i] < vocab_size, "write_shards: token ", i, " is ", tokens[i],
             ", outside the vocabulary [0, ", vocab_size, ")");
  const TokenDType dtype = token_dtype_for_vocab(vocab_size);
  const int64_t n = int64_t(tokens.size());
  const int64_t n_val = int64_t(std::floor(double(n) * options.val_fraction));
  ShardSet set;
  set.train_tokens = n - n_val;
  set.val_tokens = n_val;
  auto write_split = [&](std::span<const int32_t> part, const std::string& split,
                         std::vector<std::string>& out) {
    for (size_t begin = 0, idx = 0; begin < part.size(); begin += size_t(options.tokens_per_shard), ++idx) {
      size_t len = std::min(part.size() - begin, size_t(options.tokens_per_shard));
      out.push_back(shard_name(prefix, split, idx));
      write_token_shard(out.back(), part.subspan(begin, len), dtype);
    }
    // Shards left over from an earlier, longer run would otherwise be picked up by list_shards.
    for (size_t idx = out.size();; ++idx) {
      std::string stale = shard_name(prefix, split, idx);
      if (::unlink(stale.c_str()) != 0) break;
    }
  };
  write_split(tokens.first(size_t(set.train_tokens)), "train", set.train);
  write_split(tokens.subspan(size_t(set.train_tokens)), "val", set.val);
  return set;
}

ShardSet tokenize_to_shards(const Tokenizer& tokenizer, std::string_view text, const std::string& prefix,
                            const ShardWriteOptions& options) {
  std::vector<int32_t> ids = tokenizer.encode(text, /*allow_special=*/true);
  return write_shards(ids, prefix, tokenizer.vocab_size(), options);
}

std::vector<std::string> list_shards(const std::string& prefix, const std::string& split) {
  std::vector<std::string> out;
  for (size_t i = 0;; ++i) {
    std::string p = shard_name(prefix, split, i);
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0) break;
    out.push_back(p);
  }
  return out;
}

}  // namespace retort
