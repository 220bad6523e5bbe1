// Language-model batches from token shards: (inputs [B, T], targets [B, T]) with targets[b][t] the token
// after inputs[b][t] — position t's label is token t+1, the alignment rule every loader and cache keeps
// (DESIGN.md, "Alignment"). Deterministic: the same shards, shape and seed give the same batches on every
// machine.
//
// The shards are one stream: shard i's tokens follow shard i−1's, and a token's global position is its index
// in that stream. Each shard is cut into windows of T+1 tokens at stride T (starting at the shard's first
// token; windows never cross a shard boundary, a shard's short tail is unused). An epoch visits every window
// once, in an order shuffled by (seed, epoch), or in stream order without shuffle. Batches run on across
// epoch boundaries. Each batch also reports the global position of every row's first input token, which is
// what a teacher top-K cache is indexed by.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shards.h"

namespace retort {

struct BatchLoaderOptions {
  int64_t batch = 8;      // B > 0
  int64_t seq_len = 256;  // T > 0
  uint64_t seed = 0;
  bool shuffle = true;  // false: windows in stream order, every epoch alike
  bool verify_checksums = true;
  // Data parallelism: each step's global batch is batch x world windows, and rank r gets rows
  // [r*batch, (r+1)*batch) of it, so the ranks never share a window and miss none.
  int rank = 0, world = 1;
};

struct Batch {
  int64_t B = 0, T = 0;
  std::vector<int32_t> inputs;   // [B, T], row-major
  std::vector<int32_t> targets;  // [B, T]: targets[b*T + t] == token at starts[b] + t + 1
  std::vector<int64_t> starts;   // [B]: global position of inputs[b*T]
};

class BatchLoader {
 public:
  // Opens (maps and validates) every shard. Throws retort::Error on a bad file, bad options, or shards too
  // short to hold a single window of T+1 tokens.
  BatchLoader(const std::vector<std::string>& shard_paths, const BatchLoaderOptions& options);

  Batch next();
  // The same into caller buffers: inputs and targets [B*T], starts [B] (may be null).
  void next(int32_t* inputs, int32_t* targets, int64_t* starts = nullptr);

  int64_t batch() const { return opt_.batch; }
  int64_t seq_len() const { return opt_.seq_len; }
  int64_t windows() const { return windows_; }  // windows per epoch
  int64_t tokens() const { return total_tokens_; }
  // Global position of the first token of window w (stream order, 0 <= w < windows()).
  int64_t window_start(int64_t w) const;
  // Tokens [pos, pos + n) of the stream; throws retort::Error when the range leaves a shard.
  void read_tokens(int64_t pos, int64_t n, int32_t* out) const;

  // Where the loader stands, for resuming: epochs begun so far (from 0) and windows used in the current one
  // by the whole world (the same on every rank).
  int64_t epoch() const { return epoch_; }
  int64_t cursor() const { return cursor_; }
  // Continue as if `cursor` windows of `epoch` had been consumed. Throws retort::Error out of range.
  void seek(int64_t epoch, int64_t cursor);

 private:
  void start_epoch(int64_t e);

  BatchLoaderOptions opt_;
  std::vector<std::unique_ptr<TokenShard>> shards_;
  std::vector<int64_t> base_;          // global position of each shard's first token
  std::vector<int64_t> first_window_;  // index of each shard's first window; one extra entry: windows_
  int64_t windows_ = 0, total_tokens_ = 0;
  std::vector<int64_t> order_;  // this epoch's window order
  int64_t epoch_ = 0, cursor_ = 0;
  std::vector<int32_t> scratch_;
};

}  // namespace retort
