#include "topk_cache.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "../core/checked.h"
#include "../core/dtype.h"
#include "../core/error.h"

namespace retort {

namespace {

constexpr char kMagic[] = "RTTOPKCH";
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 64;
constexpr size_t kHeaderCrcOffset = 60;
// Log-probabilities are <= 0; a teacher's log-softmax in f32 can round a near-certain token to a hair above.
constexpr float kMaxLogprob = 1e-3f;

size_t logprob_size(LogprobDType d) {
  return d == LogprobDType::F32 ? 4 : 2;
}
const char* logprob_name(LogprobDType d) {
  return d == LogprobDType::F32 ? "f32" : "bf16";
}

size_t record_bytes_for(int64_t k, LogprobDType d) {
  size_t raw = size_t(k) * (4 + logprob_size(d) + 1);
  return (raw + 3) / 4 * 4;  // keep every record's ids 4-byte aligned in the map
}

std::string shard_path(const std::string& prefix, size_t index) {
  char num[16];
  std::snprintf(num, sizeof num, "%05zu", index);
  return prefix + "_" + num + ".topk";
}

bool exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0;
}

}  // namespace

// ---- writer ---------------------------------------------------------------------------------------------

TopKCacheWriter::TopKCacheWriter(std::string prefix, const TopKCacheSpec& spec)
    : prefix_(std::move(prefix)), spec_(spec) {
  RT_CHECK(spec.vocab_size > 0 && spec.vocab_size <= INT32_MAX,
           "TopKCacheWriter: vocab_size must be in [1, 2^31), got ", spec.vocab_size);
  RT_CHECK(spec.k >= 1 && spec.k <= spec.vocab_size,
           "TopKCacheWriter: k must be in [1, vocab_size = ", spec.vocab_size, "], got ", spec.k);
  RT_CHECK(spec.k <= (int64_t(1) << 24), "TopKCacheWriter: k = ", spec.k, " is absurdly large");
  RT_CHECK(spec.dtype == LogprobDType::F32 || spec.dtype == LogprobDType::BF16,
           "TopKCacheWriter: unknown logprob dtype ", uint32_t(spec.dtype));
  RT_CHECK(spec.positions_per_shard > 0, "TopKCacheWriter: positions_per_shard must be > 0, got ",
           spec.positions_per_shard);
  record_bytes_ = record_bytes_for(spec.k, spec.dtype);
  record_.assign(record_bytes_, 0);
}

TopKCacheWriter::~TopKCacheWriter() = default;  // an open AtomicFile removes its temporary file

void TopKCacheWriter::open_shard(int64_t first_position) {
  file_ = std::make_unique<io::AtomicFile>(shard_path(prefix_, paths_.size()));
  std::vector<uint8_t> placeholder(kHeaderBytes, 0);  // the header is written last, when counts are known
  file_->writer().write(placeholder);
  shard_first_ = first_position;
  shard_count_ = 0;
  records_crc_ = 0;
}

void TopKCacheWriter::close_shard() {
  std::vector<uint8_t> h;
  io::append_bytes(h, kMagic, 8);
  io::append_le32(h, kVersion);
  io::append_le32(h, uint32_t(spec_.dtype));
  io::append_le32(h, uint32_t(spec_.vocab_size));
  io::append_le32(h, uint32_t(spec_.k));
  io::append_le64(h, uint64_t(shard_first_));
  io::append_le64(h, uint64_t(shard_count_));
  io::append_le32(h, uint32_t(record_bytes_));
  io::append_le32(h, uint32_t(paths_.size()));
  io::append_le32(h, records_crc_);
  io::append_le32(h, 0);
  io::append_le32(h, 0);
  io::append_le32(h, io::crc32(h));
  file_->writer().write_at(0, h.data(), h.size());
  file_->commit();
  paths_.push_back(file_->path());
  file_.reset();
}

void TopKCacheWriter::write(int64_t start, int64_t n, const int32_t* ids, const float* logprobs,
                            const uint8_t* valid) {
  RT_CHECK(!finished_, "TopKCacheWriter(", prefix_, "): write after finish()");
  RT_CHECK(start >= 0 && n >= 0, "TopKCacheWriter(", prefix_, "): bad range start = ", start, ", n = ", n);
  // The end position and the slot count must be exact; the reader refuses positions past INT64_MAX / 2.
  RT_CHECK(checked_add(start, n, "TopKCacheWriter(", prefix_, ")") <= INT64_MAX / 2, "TopKCacheWriter(",
           prefix_, "): positions [", start, ", ", start + n, ") run past 2^62");
  checked_mul(n, spec_.k, "TopKCacheWriter(", prefix_, "): n x K");
  RT_CHECK(start >= next_position_, "TopKCacheWriter(", prefix_, "): positions must increase; got start ",
           start, " after writing up to ", next_position_);
  const int64_t K = spec_.k;
  // Validate the whole block before writing any of it, so a bad call leaves the cache as it was. A branch-free
  // pass first (it vectorizes: a teacher's batch is millions of slots); the loop that names the culprit runs
  // only when it finds one.
  int bad = 0;
  const uint64_t vocab = uint64_t(spec_.vocab_size);
  for (int64_t i = 0; i < n * K; ++i) {
    const int wrong = int(uint32_t(ids[i]) >= vocab) | int(!(logprobs[i] <= kMaxLogprob));
    bad |= wrong & int(valid == nullptr || valid[i] != 0);
  }
  for (int64_t i = 0; bad && i < n * K; ++i) {
    if (valid != nullptr && valid[i] == 0) continue;
    RT_CHECK(ids[i] >= 0 && ids[i] < spec_.vocab_size, "TopKCacheWriter(", prefix_, "): position ",
             start + i / K, " slot ", i % K, " has id ", ids[i], ", outside the vocabulary [0, ",
             spec_.vocab_size, ")");
    RT_CHECK(!std::isnan(logprobs[i]) && logprobs[i] <= kMaxLogprob, "TopKCacheWriter(", prefix_,
             "): position ", start + i / K, " slot ", i % K, " has logprob ", logprobs[i],
             " (log-probabilities are <= 0)");
  }
  if (file_ && start != next_position_) close_shard();  // a gap: the next shard starts at `start`
  const size_t lp = logprob_size(spec_.dtype);
  for (int64_t p = 0; p < n; ++p) {
    if (!file_) open_shard(start + p);
    uint8_t* ids_out = record_.data();
    uint8_t* lp_out = ids_out + 4 * K;
    uint8_t* valid_out = lp_out + lp * size_t(K);
    if (valid == nullptr) {  // every slot valid: straight copies and one conversion loop
      std::memcpy(ids_out, ids + p * K, 4 * size_t(K));  // the host is little-endian (file.h)
      const float* l = logprobs + p * K;
      if (spec_.dtype == LogprobDType::F32) {
        std::memcpy(lp_out, l, 4 * size_t(K));
      } else {
        uint16_t h[256];
        for (int64_t j0 = 0; j0 < K; j0 += 256) {
          const int64_t m = std::min<int64_t>(256, K - j0);
          for (int64_t j = 0; j < m; ++j) h[j] = f32_to_bf16(l[j0 + j]);
          std::memcpy(lp_out + 2 * j0, h, 2 * size_t(m));
        }
      }
      std::memset(valid_out, 1, size_t(K));
    }
    for (int64_t j = 0; valid != nullptr && j < K; ++j) {
      const int64_t i = p * K + j;
      const bool ok = valid[i] != 0;
      const float l = ok ? logprobs[i] : -std::numeric_limits<float>::infinity();
      io::store_le32(ids_out + 4 * j, uint32_t(ok ? ids[i] : 0));
      if (spec_.dtype == LogprobDType::F32) {
        uint32_t bits;
        std::memcpy(&bits, &l, 4);
        io::store_le32(lp_out + 4 * j, bits);
      } else {
        io::store_le16(lp_out + 2 * j, f32_to_bf16(l));
      }
      valid_out[j] = ok ? 1 : 0;
    }
    file_->writer().write(record_.data(), record_bytes_);
    records_crc_ = io::crc32_update(records_crc_, record_.data(), record_bytes_);
    if (++shard_count_ == spec_.positions_per_shard) close_shard();
  }
  next_position_ = start + n;
}

std::vector<std::string> TopKCacheWriter::finish() {
  RT_CHECK(!finished_, "TopKCacheWriter(", prefix_, "): finish() called twice");
  if (file_) close_shard();
  finished_ = true;
  // Shards of an earlier, longer cache under the same prefix would otherwise be opened with this one.
  for (size_t i = paths_.size(); ::unlink(shard_path(prefix_, i).c_str()) == 0; ++i) {
  }
  return paths_;
}

// ---- reader ---------------------------------------------------------------------------------------------

struct TopKCache::Shard {
  io::MappedFile map;
  int64_t first = 0, count = 0;
  const uint8_t* records = nullptr;
};

TopKCache TopKCache::open(const std::string& prefix, bool verify_checksums) {
  std::vector<std::string> paths;
  for (size_t i = 0; exists(shard_path(prefix, i)); ++i) paths.push_back(shard_path(prefix, i));
  RT_CHECK(!paths.empty(), "teacher top-K cache: no shard found at ", shard_path(prefix, 0));
  return TopKCache(paths, verify_checksums);
}

TopKCache::TopKCache(TopKCache&&) noexcept = default;
TopKCache& TopKCache::operator=(TopKCache&&) noexcept = default;
TopKCache::~TopKCache() = default;

TopKCache::TopKCache(const std::vector<std::string>& shard_paths, bool verify_checksums) {
  RT_CHECK(!shard_paths.empty(), "teacher top-K cache: no shard files given");
  for (const std::string& path : shard_paths) {
    auto s = std::make_unique<Shard>();
    s->map = io::MappedFile(path);
    io::ByteReader r(s->map.bytes(), path);
    r.expect_magic(std::string_view(kMagic, 8), "retort teacher top-K cache");
    uint32_t version = r.u32("version");
    if (version != kVersion)
      r.fail("unsupported version ", version, " (this build reads top-K caches of version ", kVersion, ")");
    uint32_t dtype = r.u32("logprob dtype"), vocab = r.u32("vocab size"), k = r.u32("K");
    uint64_t first = r.u64("first position"), count = r.u64("positions");
    uint32_t rec = r.u32("record bytes");
    r.u32("shard index");
    uint32_t records_crc = r.u32("records checksum");
    uint32_t res0 = r.u32("reserved"), res1 = r.u32("reserved");
    uint32_t header_crc = r.u32("header checksum");
    uint32_t got = io::crc32(s->map.data(), kHeaderCrcOffset);
    if (got != header_crc)
      r.fail("header checksum mismatch: the CRC-32 of the header is ", got, ", it says ", header_crc,
             " (corrupt header)");
    if (dtype != uint32_t(LogprobDType::F32) && dtype != uint32_t(LogprobDType::BF16))
      r.fail("unknown logprob dtype ", dtype, " (1 = f32, 2 = bf16)");
    if (vocab == 0 || k == 0 || k > vocab) r.fail("bad sizes: K = ", k, " with vocabulary size ", vocab);
    if (res0 != 0 || res1 != 0) r.fail("reserved header fields are not 0");
    if (rec != record_bytes_for(k, LogprobDType(dtype)))
      r.fail("record size ", rec, " does not match K = ", k, " ", logprob_name(LogprobDType(dtype)),
             " (expected ", record_bytes_for(k, LogprobDType(dtype)), ")");
    if (first > uint64_t(INT64_MAX) / 2 || count > uint64_t(INT64_MAX) / 2) r.fail("absurd position range");
    const uint64_t have = r.remaining();
    if (count > have / rec)
      r.fail("truncated: the header says ", count, " positions of ", rec, " bytes, but the file holds ", have,
             " bytes of records");
    if (count * rec != have)
      r.fail("size mismatch: the header says ", count, " positions of ", rec, " bytes (", count * rec,
             " bytes), but the file holds ", have, " bytes of records");
    s->records = s->map.data() + kHeaderBytes;
    if (verify_checksums) {
      uint32_t rc = io::crc32(s->records, size_t(have));
      if (rc != records_crc)
        r.fail("checksum mismatch: the CRC-32 of the records is ", rc, ", the header says ", records_crc,
               " (corrupt file)");
    }
    if (shards_.empty()) {
      vocab_ = vocab;
      k_ = k;
      dtype_ = LogprobDType(dtype);
      record_bytes_ = rec;
    } else if (vocab != vocab_ || k != k_ || LogprobDType(dtype) != dtype_) {
      r.fail("vocabulary ", vocab, ", K = ", k, ", ", logprob_name(LogprobDType(dtype)), " differ from ",
             vocab_, ", K = ", k_, ", ", logprob_name(dtype_), " in ", shards_.front()->map.path());
    }
    s->first = int64_t(first);
    s->count = int64_t(count);
    shards_.push_back(std::move(s));
  }
  std::sort(shards_.begin(), shards_.end(), [](const auto& a, const auto& b) { return a->first < b->first; });
  for (size_t i = 1; i < shards_.size(); ++i) {
    const Shard& a = *shards_[i - 1];
    const Shard& b = *shards_[i];
    RT_CHECK(a.first + a.count <= b.first, b.map.path(), ": positions [", b.first, ", ", b.first + b.count,
             ") overlap those of ", a.map.path(), " [", a.first, ", ", a.first + a.count, ")");
  }
}

int64_t TopKCache::positions() const {
  int64_t n = 0;
  for (const auto& s : shards_) n += s->count;
  return n;
}

const TopKCache::Shard* TopKCache::find(int64_t pos) const {
  auto it = std::upper_bound(shards_.begin(), shards_.end(), pos,
                             [](int64_t p, const std::unique_ptr<Shard>& s) { return p < s->first; });
  if (it == shards_.begin()) return nullptr;
  const Shard* s = (it - 1)->get();
  return pos < s->first + s->count ? s : nullptr;
}

bool TopKCache::covers(int64_t pos, int64_t n) const {
  while (n > 0) {
    const Shard* s = find(pos);
    if (s == nullptr) return false;
    int64_t take = std::min(n, s->first + s->count - pos);
    pos += take;
    n -= take;
  }
  return true;
}

void TopKCache::check_vocab(int64_t student_vocab) const {
  RT_CHECK(student_vocab == vocab_, shards_.front()->map.path(),
           ": the teacher top-K cache has vocabulary size ", vocab_, ", but the student's is ", student_vocab,
           " (was it made with another tokenizer?)");
}

void TopKCache::gather(const int64_t* starts, int64_t B, int64_t T, int64_t k, int32_t* ids, float* logprobs,
                       float* mask) const {
  const std::string& name = shards_.front()->map.path();
  RT_CHECK(k >= 1 && k <= k_, name, ": asked for k = ", k, " teacher slots, but the cache holds K = ", k_);
  RT_CHECK(B >= 0 && T >= 0, name, ": gather with B = ", B, ", T = ", T);
  checked_mul(checked_mul(B, T, name, ": gather B x T"), k, name, ": gather B x T x k");
  const size_t lp = logprob_size(dtype_);
  const Shard* s = nullptr;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      const int64_t pos = checked_add(starts[b], t, name, ": gather from start ", starts[b]);
      if (s == nullptr || pos < s->first || pos >= s->first + s->count) s = find(pos);
      RT_CHECK(s != nullptr, name, ": no teacher record for position ", pos, " (batch row ", b, ", t = ", t,
               "); the cache holds ", positions(), " positions");
      const uint8_t* rec = s->records + size_t(pos - s->first) * record_bytes_;
      const uint8_t* lp_in = rec + 4 * k_;
      const uint8_t* valid_in = lp_in + lp * size_t(k_);
      const size_t o = size_t((b * T + t) * k);
      for (int64_t j = 0; j < k; ++j) {
        int32_t id = int32_t(io::load_le32(rec + 4 * j));
        float l;
        if (dtype_ == LogprobDType::F32) {
          uint32_t bits = io::load_le32(lp_in + 4 * j);
          std::memcpy(&l, &bits, 4);
        } else {
          l = bf16_to_f32(io::load_le16(lp_in + 2 * j));
        }
        // A logprob of -inf is padding whatever its flag says (the losses read it so too): handed on masked,
        // so every slot marked valid has a finite logprob.
        const bool ok = valid_in[j] != 0 && l != -std::numeric_limits<float>::infinity();
        // Checksums catch corruption, not a file crafted with a bad id: never hand the loss an id it would
        // index out of bounds with.
        RT_CHECK(!ok || (id >= 0 && id < vocab_), s->map.path(), ": position ", pos, " slot ", j, " has id ",
                 id, ", outside the vocabulary [0, ", vocab_, ")");
        RT_CHECK(!ok || (!std::isnan(l) && l != std::numeric_limits<float>::infinity()), s->map.path(),
                 ": position ", pos, " slot ", j, " has logprob ", l,
                 " (a valid slot holds a finite logprob; the writer refuses anything else)");
        ids[o + size_t(j)] = ok ? id : 0;
        logprobs[o + size_t(j)] = ok ? l : -std::numeric_limits<float>::infinity();
        mask[o + size_t(j)] = ok ? 1.0f : 0.0f;
      }
    }
  }
}

TopKBatch TopKCache::gather(const std::vector<int64_t>& starts, int64_t T, int64_t k) const {
  TopKBatch out;
  out.B = int64_t(starts.size());
  out.T = T;
  out.K = k <= 0 ? k_ : k;
  RT_CHECK(T >= 0, shards_.front()->map.path(), ": gather with T = ", T);
  RT_CHECK(out.K <= k_, shards_.front()->map.path(), ": asked for k = ", out.K,
           " teacher slots, but the cache holds K = ", k_);
  const size_t n = size_t(checked_mul(checked_mul(out.B, T, shards_.front()->map.path(), ": gather B x T"),
                                      out.K, shards_.front()->map.path(), ": gather B x T x K"));
  checked_bytes(checked_mul(int64_t(n), int64_t(12), shards_.front()->map.path(), ": gather"),
                shards_.front()->map.path(), ": gather of ", n, " teacher slots");
  out.ids.resize(n);
  out.logprobs.resize(n);
  out.mask.resize(n);
  gather(starts.data(), out.B, T, out.K, out.ids.data(), out.logprobs.data(), out.mask.data());
  return out;
}

}  // namespace retort
