#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "io/batch_loader.h"
#include "io/shards.h"
#include "io/topk_cache.h"
#include "io_test_util.h"
#include "retort.h"

namespace retort::test {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Random teacher records for n positions: ids in [0, V), logprobs sorted best first, some slots invalid.
struct Records {
  std::vector<int32_t> ids;
  std::vector<float> lp;
  std::vector<uint8_t> valid;
};
Records random_records(int64_t n, int64_t K, int64_t V, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> u(-12.f, -0.01f);
  Records r;
  for (int64_t p = 0; p < n; ++p) {
    float l = -0.05f;
    for (int64_t j = 0; j < K; ++j) {
      r.ids.push_back(int32_t(g() % uint64_t(V)));
      l += u(g) * 0.1f;
      r.lp.push_back(l);
      r.valid.push_back(g() % 7 != 0);
    }
  }
  return r;
}

TEST(TopKCache, RoundTripF32AcrossShards) {
  ScratchDir dir;
  const int64_t n = 1000, K = 5, V = 777;
  Records rec = random_records(n, K, V, 1);
  TopKCacheWriter w(dir.file("c"),
                    {.vocab_size = V, .k = K, .dtype = LogprobDType::F32, .positions_per_shard = 300});
  w.write(0, 450, rec.ids.data(), rec.lp.data(), rec.valid.data());  // crosses a shard boundary
  w.write(450, n - 450, rec.ids.data() + 450 * K, rec.lp.data() + 450 * K, rec.valid.data() + 450 * K);
  std::vector<std::string> paths = w.finish();
  ASSERT_EQ(paths.size(), 4u);  // 300 + 300 + 300 + 100
  EXPECT_EQ(dir.entries().size(), 4u) << "no temporary files left";
  TopKCache c = TopKCache::open(dir.file("c"));
  EXPECT_EQ(c.vocab_size(), V);
  EXPECT_EQ(c.k(), K);
  EXPECT_EQ(c.positions(), n);
  EXPECT_TRUE(c.covers(0, n));
  EXPECT_FALSE(c.covers(1, n));
  std::vector<int64_t> starts = {0, 295, 990 - 7};
  TopKBatch b = c.gather(starts, 7);
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t t = 0; t < 7; ++t)
      for (int64_t j = 0; j < K; ++j) {
        size_t o = size_t((r * 7 + t) * K + j), src = size_t((starts[size_t(r)] + t) * K + j);
        bool ok = rec.valid[src] != 0;
        ASSERT_EQ(b.mask[o], ok ? 1.f : 0.f);
        ASSERT_EQ(b.ids[o], ok ? rec.ids[src] : 0);
        ASSERT_EQ(b.logprobs[o], ok ? rec.lp[src] : kNegInf);  // f32: exact
      }
}

TEST(TopKCache, Bf16LogprobsAndFewerSlots) {
  ScratchDir dir;
  const int64_t n = 64, K = 8, V = 50257;
  Records rec = random_records(n, K, V, 2);
  TopKCacheWriter w(dir.file("b"), {.vocab_size = V, .k = K});  // bf16 by default
  w.write(0, n, rec.ids.data(), rec.lp.data(), nullptr);        // all valid
  w.finish();
  TopKCache c = TopKCache::open(dir.file("b"));
  EXPECT_EQ(c.dtype(), LogprobDType::BF16);
  TopKBatch b = c.gather({10, 20}, 4, /*k=*/3);  // the first 3 of 8 slots
  EXPECT_EQ(b.K, 3);
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t t = 0; t < 4; ++t)
      for (int64_t j = 0; j < 3; ++j) {
        size_t o = size_t((r * 4 + t) * 3 + j), src = size_t((10 + 10 * r + t) * K + j);
        ASSERT_EQ(b.ids[o], rec.ids[src]);
        ASSERT_EQ(b.logprobs[o], bf16_to_f32(f32_to_bf16(rec.lp[src])));
        ASSERT_NEAR(b.logprobs[o], rec.lp[src], std::abs(rec.lp[src]) * 1e-2);
        ASSERT_EQ(b.mask[o], 1.f);
      }
}

TEST(TopKCache, AlignedWithTheBatchLoader) {
  // A token stream over two shards, and a "perfect teacher" whose best candidate at position p is the actual
  // token at p+1, written the way a teacher-cache program would: window by window in stream order.
  ScratchDir dir;
  const int64_t V = 1000, T = 16, K = 4;
  std::vector<std::string> shard_paths;
  std::vector<int32_t> stream;
  std::mt19937_64 g(5);
  for (int64_t n : {300, 200}) {
    std::vector<int32_t> toks;
    for (int64_t i = 0; i < n; ++i) toks.push_back(int32_t(g() % V));
    std::string name = "tok";
    name += std::to_string(shard_paths.size()) + ".bin";
    shard_paths.push_back(dir.file(name));
    write_token_shard(shard_paths.back(), toks, TokenDType::U16);
    stream.insert(stream.end(), toks.begin(), toks.end());
  }
  {
    BatchLoader order(shard_paths, {.batch = 1, .seq_len = T, .shuffle = false});
    TopKCacheWriter w(dir.file("teacher"), {.vocab_size = V, .k = K, .dtype = LogprobDType::F32});
    std::vector<int32_t> in(T), tgt(T), ids(T * K);
    std::vector<float> lp(T * K);
    for (int64_t win = 0; win < order.windows(); ++win) {
      int64_t s = 0;
      order.next(in.data(), tgt.data(), &s);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < K; ++j) {
          ids[size_t(t * K + j)] = j == 0 ? tgt[size_t(t)] : int32_t((tgt[size_t(t)] + j) % V);
          lp[size_t(t * K + j)] = -0.1f * float(j + 1);
        }
      w.write(s, T, ids.data(), lp.data());
    }
    // The second shard's windows start after a gap (shard 0's unused tail): a second cache shard.
    EXPECT_EQ(w.finish().size(), 2u);
  }
  TopKCache cache = TopKCache::open(dir.file("teacher"));
  cache.check_vocab(V);
  BatchLoader loader(shard_paths, {.batch = 4, .seq_len = T, .seed = 77});
  for (int step = 0; step < 30; ++step) {
    Batch b = loader.next();
    TopKBatch tk = cache.gather(b.starts, T);
    for (int64_t r = 0; r < b.B; ++r)
      for (int64_t t = 0; t < T; ++t) {
        // Position t of the teacher slice describes the token at t+1: the row's target at t.
        ASSERT_EQ(tk.ids[size_t((r * T + t) * K)], b.targets[size_t(r * T + t)]) << "row " << r << " t " << t;
        ASSERT_EQ(tk.ids[size_t((r * T + t) * K)], stream[size_t(b.starts[size_t(r)] + t + 1)]);
      }
  }
}

TEST(TopKCache, ReaderErrors) {
  ScratchDir dir;
  Records rec = random_records(50, 4, 100, 3);
  TopKCacheWriter w(dir.file("c"), {.vocab_size = 100, .k = 4, .positions_per_shard = 50});
  w.write(0, 50, rec.ids.data(), rec.lp.data(), rec.valid.data());
  std::string p = w.finish().at(0);
  TopKCache c = TopKCache::open(dir.file("c"));
  expect_error([&] { c.check_vocab(50257); }, {p, "vocabulary size 100", "student's is 50257"});
  expect_error([&] { c.gather({0}, 4, 5); }, {p, "k = 5", "K = 4"});
  expect_error([&] { c.gather({48}, 4); }, {p, "no teacher record for position 50"});
  expect_error([] { TopKCache::open("/nonexistent/prefix"); },
               {"no shard found", "/nonexistent/prefix_00000.topk"});
}

class TopKCacheFile : public ::testing::Test {
 protected:
  void SetUp() override {
    Records rec = random_records(40, 3, 64, 4);
    TopKCacheWriter w(dir.file("c"), {.vocab_size = 64, .k = 3, .positions_per_shard = 1000});
    w.write(0, 40, rec.ids.data(), rec.lp.data(), rec.valid.data());
    path = w.finish().at(0);
    size = slurp(path).size();
  }
  void expect_open_fails(const std::vector<std::string>& needles) {
    std::vector<std::string> n = needles;
    n.push_back(path);
    expect_error([&] { TopKCache c({path}); }, n);
  }
  ScratchDir dir;
  std::string path;
  size_t size = 0;
};

TEST_F(TopKCacheFile, RecordBytesAreAsDocumented) {
  EXPECT_EQ(size, 64u + 40u * 24u);  // K = 3, bf16: 3·4 ids + 3·2 logprobs + 3 flags = 21, padded to 24
}
TEST_F(TopKCacheFile, WrongMagic) {
  flip_byte(path, 0);
  expect_open_fails({"wrong magic", "teacher top-K cache"});
}
TEST_F(TopKCacheFile, WrongVersion) {
  patch_le32(path, 8, 3);
  expect_open_fails({"unsupported version 3"});
}
TEST_F(TopKCacheFile, HeaderFieldFlipFailsTheHeaderChecksum) {
  for (size_t off : {size_t(16), size_t(24), size_t(32), size_t(61)}) {  // vocab, first position, count, crc
    SetUp();
    flip_byte(path, off);
    expect_open_fails({"header checksum mismatch"});
  }
}
TEST_F(TopKCacheFile, RecordFlipFailsTheChecksum) {
  flip_byte(path, 64 + 100);
  expect_open_fails({"checksum mismatch", "records"});
  TopKCache unchecked({path}, /*verify_checksums=*/false);
  EXPECT_EQ(unchecked.positions(), 40);
}
TEST_F(TopKCacheFile, Truncated) {
  truncate_to(path, size - 1);
  expect_open_fails({"truncated", "40 positions"});
  truncate_to(path, 50);
  expect_open_fails({"truncated", "offset 48"});
}
TEST_F(TopKCacheFile, TrailingBytes) {
  std::vector<uint8_t> b = slurp(path);
  b.resize(b.size() + 24, 0);
  spit(path, b);
  expect_open_fails({"size mismatch"});
}
TEST_F(TopKCacheFile, ShardsMustAgreeAndNotOverlap) {
  Records rec = random_records(10, 5, 64, 6);
  TopKCacheWriter w(dir.file("other"), {.vocab_size = 64, .k = 5});
  w.write(100, 10, rec.ids.data(), rec.lp.data());
  std::string other = w.finish().at(0);
  expect_error([&] { TopKCache c({path, other}); }, {other, "K = 5", "differ", path});
  Records rec3 = random_records(10, 3, 64, 7);
  TopKCacheWriter w2(dir.file("overlap"), {.vocab_size = 64, .k = 3});
  w2.write(35, 10, rec3.ids.data(), rec3.lp.data());
  std::string overlap = w2.finish().at(0);
  expect_error([&] { TopKCache c({path, overlap}); }, {overlap, "overlap", "[35, 45)", "[0, 40)"});
}

TEST(TopKCacheWriter, ValidatesInputAndSpec) {
  ScratchDir dir;
  expect_error([&] { TopKCacheWriter w(dir.file("x"), {.vocab_size = 10, .k = 11}); },
               {"k must be in [1, vocab_size = 10]"});
  expect_error([&] { TopKCacheWriter w(dir.file("x"), {.vocab_size = 0, .k = 1}); }, {"vocab_size"});
  expect_error(
      [&] { TopKCacheWriter w(dir.file("x"), {.vocab_size = 10, .k = 2, .positions_per_shard = 0}); },
      {"positions_per_shard"});
  TopKCacheWriter w(dir.file("x"), {.vocab_size = 10, .k = 2});
  std::vector<int32_t> ids = {1, 10};
  std::vector<float> lp = {-1.f, -2.f};
  expect_error([&] { w.write(0, 1, ids.data(), lp.data()); }, {"position 0 slot 1 has id 10"});
  std::vector<uint8_t> valid = {1, 0};  // an invalid slot may hold anything
  w.write(0, 1, ids.data(), lp.data(), valid.data());
  ids = {1, 2};
  lp = {std::nanf(""), -1.f};
  expect_error([&] { w.write(1, 1, ids.data(), lp.data()); }, {"position 1 slot 0 has logprob nan"});
  lp = {0.5f, -1.f};
  expect_error([&] { w.write(1, 1, ids.data(), lp.data()); }, {"logprob 0.5"});
  lp = {kNegInf, -1.f};  // −inf is a legal (padding) logprob
  w.write(1, 1, ids.data(), lp.data());
  expect_error([&] { w.write(0, 1, ids.data(), lp.data()); }, {"positions must increase"});
  EXPECT_EQ(w.finish().size(), 1u);
  expect_error([&] { w.write(5, 1, ids.data(), lp.data()); }, {"after finish"});
  TopKCache c = TopKCache::open(dir.file("x"));
  TopKBatch b = c.gather({0}, 2);
  // The -inf slot is read as padding: masked, id 0.
  EXPECT_EQ(b.ids, (std::vector<int32_t>{1, 0, 0, 2}));
  EXPECT_EQ(b.mask, (std::vector<float>{1, 0, 0, 1}));
  EXPECT_EQ(b.logprobs[1], kNegInf);
  EXPECT_EQ(b.logprobs[2], kNegInf);
}

TEST(TopKCacheWriter, AbandonedWriterLeavesOnlyClosedShardsAndFinishRemovesStaleOnes) {
  ScratchDir dir;
  Records rec = random_records(30, 2, 50, 8);
  {
    TopKCacheWriter w(dir.file("a"), {.vocab_size = 50, .k = 2, .positions_per_shard = 10});
    w.write(0, 25, rec.ids.data(), rec.lp.data());
    // destroyed without finish(): the half-written third shard must not appear
  }
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"a_00000.topk", "a_00001.topk"}));
  TopKCacheWriter w(dir.file("a"), {.vocab_size = 50, .k = 2, .positions_per_shard = 100});
  w.write(0, 5, rec.ids.data(), rec.lp.data());
  EXPECT_EQ(w.finish().size(), 1u);
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"a_00000.topk"}));
  EXPECT_EQ(TopKCache::open(dir.file("a")).positions(), 5);
}

// A crafted record (checksums off, or recomputed by whoever crafted it) with a NaN or +inf logprob in a valid
// slot is refused by the reader: the writer never makes one, and a loss would turn it into NaN gradients.
TEST_F(TopKCacheFile, NonFiniteLogprobInAValidSlotIsRefused) {
  for (uint16_t bits : {uint16_t(0x7FC0), uint16_t(0x7F80)}) {  // bf16 NaN, +inf
    SetUp();
    std::vector<uint8_t> b = slurp(path);
    const size_t rec = 64 + 5 * 24;  // position 5; K = 3 bf16: ids at 0, logprobs at 12, flags at 18
    b[rec + 12 + 2] = uint8_t(bits & 0xFF);
    b[rec + 12 + 3] = uint8_t(bits >> 8);
    b[rec + 18 + 1] = 1;  // slot 1 valid
    spit(path, b);
    TopKCache c({path}, /*verify_checksums=*/false);
    EXPECT_NO_THROW(c.gather({0}, 5));
    expect_error([&] { c.gather({3}, 4); }, {path, "position 5 slot 1", bits == 0x7FC0 ? "nan" : "inf"});
    // The same slot marked invalid is padding: read as -inf, no error.
    b[rec + 18 + 1] = 0;
    spit(path, b);
    TopKCache masked({path}, false);
    const TopKBatch tb = masked.gather({5}, 1);
    EXPECT_EQ(tb.logprobs[1], kNegInf);
    EXPECT_EQ(tb.mask[1], 0.0f);
  }
  // A -inf logprob in a slot marked valid (found by fuzz_topk_cache) is padding, as the losses read it:
  // masked, id 0, whatever id the record holds.
  SetUp();
  std::vector<uint8_t> b = slurp(path);
  const size_t rec = 64 + 7 * 24;
  b[rec + 12 + 0] = 0x80;  // bf16 -inf in slot 0
  b[rec + 12 + 1] = 0xFF;
  b[rec + 18 + 0] = 1;
  b[rec + 0] = 0xFF;  // with an id far outside the vocabulary
  b[rec + 3] = 0x7F;
  spit(path, b);
  TopKCache c({path}, false);
  const TopKBatch tb = c.gather({7}, 1);
  EXPECT_EQ(tb.mask[0], 0.0f);
  EXPECT_EQ(tb.ids[0], 0);
  EXPECT_EQ(tb.logprobs[0], kNegInf);
}

// Issue 25: gather with T = 2^62 overflowed B x T x K and wrote out of bounds.
TEST_F(TopKCacheFile, GatherSizesThatOverflowAreRefused) {
  TopKCache c({path});
  const int64_t k62 = int64_t(1) << 62, kMax = std::numeric_limits<int64_t>::max();
  expect_error([&] { c.gather({0}, k62); }, {path, "gather"});
  expect_error([&] { c.gather({0, 1, 2, 3}, k62 / 2); }, {path, "gather", "overflows"});
  expect_error([&] { c.gather({kMax}, 2); }, {path});
  std::vector<int32_t> ids(4);
  std::vector<float> lp(4), mask(4);
  const int64_t starts[] = {kMax - 1};
  expect_error([&] { c.gather(starts, 1, 4, 1, ids.data(), lp.data(), mask.data()); }, {path});
  expect_error([&] { c.gather(starts, kMax, kMax, 1, ids.data(), lp.data(), mask.data()); },
               {path, "overflows"});
}

// Issue 25: batch x seq_len, seq_len + 1 and the epoch counter overflowed in the loader.
TEST(BatchLoaderSizes, HugeBatchSeqLenAndEpochAreRefused) {
  ScratchDir dir;
  std::vector<int32_t> toks(100);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = int32_t(i % 50);
  const std::string shard = dir.file("t.bin");
  write_token_shard(shard, toks, TokenDType::U16);
  const int64_t k62 = int64_t(1) << 62, kMax = std::numeric_limits<int64_t>::max();
  expect_error([&] { BatchLoader({shard}, {.batch = k62, .seq_len = 8}); }, {"BatchLoader", "overflows"});
  expect_error([&] { BatchLoader({shard}, {.batch = 2, .seq_len = kMax}); }, {"BatchLoader"});
  expect_error([&] { BatchLoader({shard}, {.batch = 1, .seq_len = int64_t(1) << 47}); },
               {"BatchLoader", "2^48"});
  BatchLoader l({shard}, {.batch = 1, .seq_len = 8});
  expect_error([&] { l.seek(0, kMax); }, {"BatchLoader", "seek"});
  l.seek(kMax, l.windows());
  expect_error([&] { l.next(); }, {"BatchLoader", "epoch", "overflows"});
}

}  // namespace
}  // namespace retort::test
