// Teacher top-K cache: for each position of a token stream, the teacher's K best next-token candidates (ids,
// log-probabilities, valid flags), written once by a teacher-cache program and memory-mapped by the student's
// training loop. Positions are the global positions of the batch loader's stream (batch_loader.h): the entry
// at position p is the teacher's distribution for the token at p+1, the one predicted from p — so for a batch
// row starting at s, the slice [s, s+T) lines up with that row's targets (DESIGN.md, "Alignment").
//
// Shard layout (little-endian), "<prefix>_00000.topk", "<prefix>_00001.topk", ...:
//   0  "RTTOPKCH"            magic
//   8  u32 version           1
//   12 u32 logprob dtype     1 = f32, 2 = bf16
//   16 u32 vocab size        of the teacher
//   20 u32 K
//   24 u64 first position    global position of the first record
//   32 u64 positions         records in this shard
//   40 u32 record bytes      K·4 (ids) + K·2 or K·4 (logprobs) + K (valid flags), padded to a multiple of 4
//   44 u32 shard index
//   48 u32 records checksum  CRC-32 of all records
//   52 u32, 56 u32           reserved, 0
//   60 u32 header checksum   CRC-32 of bytes 0..60
//   64 records               per position: K × i32 ids, K × logprob, K × u8 valid, zero padding
// Slots are stored in the teacher's order (best first); asking for k < K takes the first k. Invalid slots are
// stored as id 0, logprob −inf, flag 0.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "file.h"

namespace retort {

enum class LogprobDType : uint32_t { F32 = 1, BF16 = 2 };

struct TopKCacheSpec {
  int64_t vocab_size = 0;  // the teacher's vocabulary, > 0
  int64_t k = 0;           // candidates per position, 1 <= k <= vocab_size
  LogprobDType dtype = LogprobDType::BF16;
  int64_t positions_per_shard = int64_t(1) << 18;  // > 0
};

// Streams records into shards; each shard is written atomically (temporary file, fsync, rename) when it is
// full, at a gap in the positions, or at finish(). Destroyed before finish(), it keeps the shards already
// closed and drops the one being written.
class TopKCacheWriter {
 public:
  // Throws retort::Error on a bad spec.
  TopKCacheWriter(std::string prefix, const TopKCacheSpec& spec);
  ~TopKCacheWriter();
  TopKCacheWriter(const TopKCacheWriter&) = delete;
  TopKCacheWriter& operator=(const TopKCacheWriter&) = delete;

  // Appends n positions starting at global position start: ids, logprobs and valid are [n, K] row-major
  // (valid may be null: every slot valid). start must be at or past the end of the previous write; a gap
  // closes the current shard. Throws retort::Error on a valid slot with an id outside [0, vocab) or a NaN or
  // positive logprob (beyond rounding), or positions going backwards.
  void write(int64_t start, int64_t n, const int32_t* ids, const float* logprobs,
             const uint8_t* valid = nullptr);
  // Closes the last shard and returns the paths of every shard written, in order.
  std::vector<std::string> finish();

 private:
  void open_shard(int64_t first_position);
  void close_shard();

  std::string prefix_;
  TopKCacheSpec spec_;
  size_t record_bytes_ = 0;
  std::unique_ptr<io::AtomicFile> file_;
  int64_t shard_first_ = 0, shard_count_ = 0;  // current shard: first position and records so far
  int64_t next_position_ = -1;                 // end of the last write (-1: nothing written yet)
  uint32_t records_crc_ = 0;
  std::vector<std::string> paths_;
  std::vector<uint8_t> record_;
  bool finished_ = false;
};

// The teacher's slots for a batch: [B, T, k] each, row-major.
struct TopKBatch {
  int64_t B = 0, T = 0, K = 0;
  std::vector<int32_t> ids;
  std::vector<float> logprobs;  // −inf in invalid slots
  std::vector<float> mask;      // 1 valid, 0 invalid
};

class TopKCache {
 public:
  // Opens "<prefix>_00000.topk" and the following indices up to the first missing one.
  static TopKCache open(const std::string& prefix, bool verify_checksums = true);
  // Maps and validates every shard: wrong magic, unsupported version, bad header checksum, unknown dtype,
  // truncation, trailing bytes, records checksum mismatch, shards that disagree on vocab/K/dtype or overlap.
  // Every error is a retort::Error naming the file and the fault.
  explicit TopKCache(const std::vector<std::string>& shard_paths, bool verify_checksums = true);
  TopKCache(TopKCache&&) noexcept;
  TopKCache& operator=(TopKCache&&) noexcept;
  ~TopKCache();

  int64_t vocab_size() const { return vocab_; }
  int64_t k() const { return k_; }
  LogprobDType dtype() const { return dtype_; }
  int64_t positions() const;  // records over all shards
  // True when every position of [pos, pos + n) has a record.
  bool covers(int64_t pos, int64_t n) const;
  // Throws retort::Error unless the teacher's vocabulary size equals the student's.
  void check_vocab(int64_t student_vocab) const;

  // Row b, position t, slot j of the outputs holds the teacher's j-th candidate for the token after global
  // position starts[b] + t — the target of the batch loader's inputs[b][t]. k <= this->k(). Throws
  // retort::Error when k is out of range, a position has no record, or a slot marked valid holds an id
  // outside the vocabulary or a NaN or +inf logprob (a -inf one is padding). ids, logprobs, mask: [B*T*k]; a
  // padding slot has id 0, logprob -inf and mask 0, every other one a finite logprob and mask 1.
  void gather(const int64_t* starts, int64_t B, int64_t T, int64_t k, int32_t* ids, float* logprobs,
              float* mask) const;
  // The same, allocated; k <= 0 means all K.
  TopKBatch gather(const std::vector<int64_t>& starts, int64_t T, int64_t k = 0) const;

 private:
  struct Shard;
  const Shard* find(int64_t pos) const;
  std::vector<std::unique_ptr<Shard>> shards_;  // sorted by first position
  int64_t vocab_ = 0, k_ = 0;
  LogprobDType dtype_ = LogprobDType::F32;
  size_t record_bytes_ = 0;
};

}  // namespace retort
