#include "batch_loader.h"

#include <algorithm>

#include "../core/checked.h"
#include "../core/error.h"

namespace retort {

namespace {

// SplitMix64: a tiny, fully specified generator, so shuffles are identical on every platform and standard
// library (std::shuffle and the std distributions are implementation-defined).
struct SplitMix64 {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, bound), bound > 0: rejection removes the modulo bias.
  uint64_t below(uint64_t bound) {
    uint64_t threshold = (0 - bound) % bound;
    for (;;) {
      uint64_t r = next();
      if (r >= threshold) return r % bound;
    }
  }
};

}  // namespace

BatchLoader::BatchLoader(const std::vector<std::string>& shard_paths, const BatchLoaderOptions& options)
    : opt_(options) {
  RT_CHECK(opt_.batch > 0, "BatchLoader: batch must be > 0, got ", opt_.batch);
  RT_CHECK(opt_.world >= 1 && opt_.rank >= 0 && opt_.rank < opt_.world, "BatchLoader: rank ", opt_.rank,
           " of a world of ", opt_.world, " (expected 0 <= rank < world, world >= 1)");
  checked_mul(opt_.batch, int64_t(opt_.world), "BatchLoader: batch x world");
  RT_CHECK(opt_.seq_len > 0, "BatchLoader: seq_len must be > 0, got ", opt_.seq_len);
  RT_CHECK(!shard_paths.empty(), "BatchLoader: no shard files given");
  // A batch is B x T int32 inputs and targets held in memory: refuse sizes no machine can hold before any
  // arithmetic on them (T + 1, B * T) can overflow.
  checked_bytes(checked_mul(checked_mul(opt_.batch, opt_.seq_len, "BatchLoader: batch x seq_len"), int64_t(4),
                            "BatchLoader: batch x seq_len"),
                "BatchLoader: a batch of ", opt_.batch, " x ", opt_.seq_len, " int32 tokens");
  const int64_t T = opt_.seq_len;
  for (const std::string& p : shard_paths) {
    shards_.push_back(std::make_unique<TokenShard>(p, opt_.verify_checksums));
    const int64_t n = shards_.back()->size();
    base_.push_back(total_tokens_);
    first_window_.push_back(windows_);
    total_tokens_ += n;
    windows_ += n >= T + 1 ? (n - 1) / T : 0;
  }
  first_window_.push_back(windows_);
  RT_CHECK(windows_ > 0, "BatchLoader: no shard of the ", shard_paths.size(), " given (", total_tokens_,
           " tokens in all) holds a window of seq_len + 1 = ", T + 1,
           " tokens; use a smaller seq_len or more data");
  start_epoch(0);
}

void BatchLoader::start_epoch(int64_t e) {
  epoch_ = e;
  cursor_ = 0;
  order_.resize(size_t(windows_));
  for (int64_t w = 0; w < windows_; ++w) order_[size_t(w)] = w;
  if (!opt_.shuffle) return;
  // A fresh stream per epoch, so the order of epoch e does not depend on how earlier epochs were consumed.
  SplitMix64 rng{opt_.seed ^ (0xD1B54A32D192ED03ull * (uint64_t(e) + 1))};
  for (int64_t i = windows_ - 1; i > 0; --i) std::swap(order_[size_t(i)], order_[rng.below(uint64_t(i + 1))]);
}

int64_t BatchLoader::window_start(int64_t w) const {
  RT_CHECK(w >= 0 && w < windows_, "BatchLoader: window ", w, " is outside [0, ", windows_, ")");
  // The shard whose window range holds w: the last first_window_ entry <= w.
  size_t s =
      size_t(std::upper_bound(first_window_.begin(), first_window_.end() - 1, w) - first_window_.begin()) - 1;
  return base_[s] + (w - first_window_[s]) * opt_.seq_len;
}

void BatchLoader::read_tokens(int64_t pos, int64_t n, int32_t* out) const {
  RT_CHECK(pos >= 0 && pos < total_tokens_, "BatchLoader: position ", pos, " is outside the ", total_tokens_,
           " tokens of the shards");
  size_t s = size_t(std::upper_bound(base_.begin(), base_.end(), pos) - base_.begin()) - 1;
  shards_[s]->read(pos - base_[s], n, out);
}

void BatchLoader::next(int32_t* inputs, int32_t* targets, int64_t* starts) {
  const int64_t T = opt_.seq_len;
  scratch_.resize(size_t(T + 1));
  // Every rank walks the whole global batch of B x world windows and keeps its own B: together the ranks
  // see what one process with the world's batch would, and the position to resume from is the same for all.
  const int64_t first = int64_t(opt_.rank) * opt_.batch;
  for (int64_t g = 0; g < opt_.batch * opt_.world; ++g) {
    if (cursor_ == windows_) start_epoch(checked_add(epoch_, int64_t(1), "BatchLoader: epoch"));
    const int64_t w = order_[size_t(cursor_++)];
    const int64_t b = g - first;
    if (b < 0 || b >= opt_.batch) continue;
    const int64_t start = window_start(w);
    read_tokens(start, T + 1, scratch_.data());
    // The alignment rule: the input at t is token start+t, its target the next token, start+t+1.
    std::copy(scratch_.begin(), scratch_.begin() + T, inputs + b * T);
    std::copy(scratch_.begin() + 1, scratch_.end(), targets + b * T);
    if (starts != nullptr) starts[b] = start;
  }
}

Batch BatchLoader::next() {
  Batch out;
  out.B = opt_.batch;
  out.T = opt_.seq_len;
  out.inputs.resize(size_t(out.B * out.T));
  out.targets.resize(size_t(out.B * out.T));
  out.starts.resize(size_t(out.B));
  next(out.inputs.data(), out.targets.data(), out.starts.data());
  return out;
}

void BatchLoader::seek(int64_t epoch, int64_t cursor) {
  RT_CHECK(epoch >= 0 && cursor >= 0 && cursor <= windows_, "BatchLoader: seek(", epoch, ", ", cursor,
           ") is out of range (cursor must be in [0, ", windows_, "])");
  start_epoch(epoch);
  cursor_ = cursor;
}

}  // namespace retort
