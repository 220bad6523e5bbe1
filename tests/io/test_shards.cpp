#include <gtest/gtest.h>

#include <numeric>
#include <set>

#include "io/batch_loader.h"
#include "io/file.h"
#include "io/shards.h"
#include "io/tokenizer.h"
#include "io_test_util.h"
#include "retort.h"

namespace retort::test {
namespace {

// A token stream where every position is recoverable from its value: token at global position p is
// (p * 7 + 3) % vocab — distinct neighbours, so an off-by-one anywhere shows.
std::vector<int32_t> ramp(int64_t n, int64_t vocab, int64_t offset = 0) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = int32_t(((offset + i) * 7 + 3) % vocab);
  return v;
}

// ---- the shard file -------------------------------------------------------------------------------------

TEST(TokenShard, RoundTripsU16AndU32) {
  ScratchDir dir;
  std::vector<int32_t> small = {0, 1, 65535, 42, 7};
  write_token_shard(dir.file("a.bin"), small, TokenDType::U16);
  TokenShard a(dir.file("a.bin"));
  EXPECT_EQ(a.dtype(), TokenDType::U16);
  EXPECT_EQ(a.read_all(), small);
  EXPECT_EQ(slurp(dir.file("a.bin")).size(), 32u + 2 * small.size());
  std::vector<int32_t> big = {0, 65536, 100000, INT32_MAX, 3};
  write_token_shard(dir.file("b.bin"), big, TokenDType::U32);
  TokenShard b(dir.file("b.bin"));
  EXPECT_EQ(b.dtype(), TokenDType::U32);
  EXPECT_EQ(b.size(), 5);
  EXPECT_EQ(b.at(3), INT32_MAX);
  std::vector<int32_t> mid(2);
  b.read(1, 2, mid.data());
  EXPECT_EQ(mid, (std::vector<int32_t>{65536, 100000}));
  write_token_shard(dir.file("e.bin"), {}, TokenDType::U16);
  EXPECT_EQ(TokenShard(dir.file("e.bin")).size(), 0);
}

TEST(TokenShard, RangeAndValueErrors) {
  ScratchDir dir;
  std::string p = dir.file("s.bin");
  expect_error(
      [&] {
        write_token_shard(p, std::vector<int32_t>{1, 70000}, TokenDType::U16);
      },
      {p, "token 1 is 70000", "u16"});
  expect_error([&] { write_token_shard(p, std::vector<int32_t>{-1}, TokenDType::U32); },
               {p, "token 0 is -1"});
  EXPECT_TRUE(dir.entries().empty());
  write_token_shard(p, std::vector<int32_t>{1, 2, 3}, TokenDType::U16);
  TokenShard s(p);
  expect_error([&] { s.at(3); }, {p, "index 3", "[0, 3)"});
  std::vector<int32_t> out(4);
  expect_error([&] { s.read(1, 3, out.data()); }, {p, "[1, 4)"});
}

class TokenShardFile : public ::testing::Test {
 protected:
  void SetUp() override {
    path = dir.file("shard.bin");
    write_token_shard(path, ramp(1000, 50000), TokenDType::U16);
  }
  ScratchDir dir;
  std::string path;
};

TEST_F(TokenShardFile, WrongMagic) {
  flip_byte(path, 2);
  expect_error([&] { TokenShard s(path); }, {path, "wrong magic", "not a retort token shard file"});
}
TEST_F(TokenShardFile, WrongVersion) {
  patch_le32(path, 8, 2);
  expect_error([&] { TokenShard s(path); }, {path, "unsupported version 2"});
}
TEST_F(TokenShardFile, UnknownDtype) {
  patch_le32(path, 12, 7);
  expect_error([&] { TokenShard s(path); }, {path, "unknown token dtype 7"});
}
TEST_F(TokenShardFile, Truncated) {
  truncate_to(path, 32 + 2 * 999);
  expect_error([&] { TokenShard s(path); }, {path, "truncated", "1000 u16 tokens"});
  truncate_to(path, 20);
  expect_error([&] { TokenShard s(path); }, {path, "truncated", "token count"});
  truncate_to(path, 0);
  expect_error([&] { TokenShard s(path); }, {path, "truncated"});
}
TEST_F(TokenShardFile, CountMismatch) {
  patch_le64(path, 16, 900);  // fewer than the file holds
  expect_error([&] { TokenShard s(path); }, {path, "count mismatch", "900"});
  patch_le64(path, 16, 0xFFFFFFFFFFFFull);  // absurd: must not overflow into a pass
  expect_error([&] { TokenShard s(path); }, {path, "truncated"});
}
TEST_F(TokenShardFile, FlippedTokenByteFailsTheChecksum) {
  flip_byte(path, 32 + 777);
  expect_error([&] { TokenShard s(path); }, {path, "checksum mismatch"});
  TokenShard unchecked(path, /*verify_checksum=*/false);  // the caller may opt out
  EXPECT_EQ(unchecked.size(), 1000);
}
TEST_F(TokenShardFile, FlippedChecksumByteFailsTheChecksum) {
  flip_byte(path, 29);
  expect_error([&] { TokenShard s(path); }, {path, "checksum mismatch"});
}
TEST_F(TokenShardFile, ReservedFieldMustBeZero) {
  patch_le32(path, 24, 1);
  expect_error([&] { TokenShard s(path); }, {path, "reserved"});
}

// ---- corpus -> shards -----------------------------------------------------------------------------------

TEST(WriteShards, SplitsTailAsValidationAndChunks) {
  ScratchDir dir;
  std::vector<int32_t> toks = ramp(1050, 300);
  ShardSet set = write_shards(toks, dir.file("c"), 300, {.val_fraction = 0.2, .tokens_per_shard = 400});
  EXPECT_EQ(set.train_tokens, 840);
  EXPECT_EQ(set.val_tokens, 210);
  ASSERT_EQ(set.train.size(), 3u);  // 400 + 400 + 40
  ASSERT_EQ(set.val.size(), 1u);
  EXPECT_EQ(set.train[0], dir.file("c_train_00000.bin"));
  EXPECT_EQ(list_shards(dir.file("c"), "train"), set.train);
  EXPECT_EQ(list_shards(dir.file("c"), "val"), set.val);
  std::vector<int32_t> back;
  for (const auto& p : set.train) {
    TokenShard s(p);
    EXPECT_EQ(s.dtype(), TokenDType::U16);
    auto v = s.read_all();
    back.insert(back.end(), v.begin(), v.end());
  }
  for (const auto& p : set.val) {
    auto v = TokenShard(p).read_all();
    back.insert(back.end(), v.begin(), v.end());
  }
  EXPECT_EQ(back, toks);
  // A rerun with fewer shards removes the stale ones.
  ShardSet again = write_shards(toks, dir.file("c"), 300, {.val_fraction = 0.2, .tokens_per_shard = 1000});
  EXPECT_EQ(again.train.size(), 1u);
  EXPECT_EQ(list_shards(dir.file("c"), "train").size(), 1u);
  EXPECT_EQ(TokenShard(dir.file("c_train_00000.bin")).dtype(), TokenDType::U16);
  EXPECT_EQ(write_shards(toks, dir.file("d"), 70000, {}).train.size(), 1u);
  EXPECT_EQ(TokenShard(dir.file("d_train_00000.bin")).dtype(), TokenDType::U32);
}

TEST(WriteShards, BadInputThrows) {
  ScratchDir dir;
  std::vector<int32_t> toks = {1, 2, 3};
  expect_error([&] { write_shards(toks, dir.file("x"), 3, {}); }, {"write_shards", "token 2 is 3", "[0, 3)"});
  expect_error([&] { write_shards(toks, dir.file("x"), 10, {.val_fraction = 1.0}); }, {"val_fraction"});
  expect_error([&] { write_shards(toks, dir.file("x"), 10, {.tokens_per_shard = 0}); }, {"tokens_per_shard"});
  expect_error([&] { write_shards({}, dir.file("x"), 10, {}); }, {"no tokens"});
}

TEST(WriteShards, TokenizeToShardsRoundTripsText) {
  const std::string text = "In the beginning<|endoftext|>the text was tokenized, sharded and read back.";
  Tokenizer tok = Tokenizer::train(text, {.vocab_size = 300});
  ScratchDir dir;
  ShardSet set = tokenize_to_shards(tok, text, dir.file("t"), {.val_fraction = 0.0});
  ASSERT_EQ(set.train.size(), 1u);
  EXPECT_TRUE(set.val.empty());
  std::vector<int32_t> ids = TokenShard(set.train[0]).read_all();
  EXPECT_EQ(std::count(ids.begin(), ids.end(), tok.eot_id()), 1)
      << "the separator becomes the end-of-text id";
  EXPECT_EQ(tok.decode(ids), text);
}

// ---- batch loader ---------------------------------------------------------------------------------------

class Loader : public ::testing::Test {
 protected:
  void SetUp() override {
    // Three shards of 1000, 37 (too short for one window at T=64) and 700 tokens: one stream of 1737.
    int64_t at = 0;
    for (int64_t n : {1000, 37, 700}) {
      std::string name = "s";  // (not "s" + ...: GCC 12 warns falsely about that concatenation)
      name += std::to_string(paths.size()) + ".bin";
      paths.push_back(dir.file(name));
      write_token_shard(paths.back(), ramp(n, 5000, at), TokenDType::U16);
      at += n;
    }
    stream = ramp(at, 5000);
  }
  ScratchDir dir;
  std::vector<std::string> paths;
  std::vector<int32_t> stream;
};

TEST_F(Loader, TargetsAreInputsShiftedByOne) {
  BatchLoader loader(paths, {.batch = 4, .seq_len = 64, .seed = 1});
  for (int step = 0; step < 20; ++step) {
    Batch b = loader.next();
    ASSERT_EQ(b.inputs.size(), 4u * 64);
    for (int64_t r = 0; r < b.B; ++r) {
      const int64_t s = b.starts[size_t(r)];
      for (int64_t t = 0; t < b.T; ++t) {
        // The alignment rule: position t's input is stream token s+t, its target token s+t+1.
        ASSERT_EQ(b.inputs[size_t(r * b.T + t)], stream[size_t(s + t)]);
        ASSERT_EQ(b.targets[size_t(r * b.T + t)], stream[size_t(s + t + 1)]);
        if (t + 1 < b.T) {
          ASSERT_EQ(b.targets[size_t(r * b.T + t)], b.inputs[size_t(r * b.T + t + 1)]);
        }
      }
    }
  }
}

TEST_F(Loader, WindowsStayInsideShardsAndEpochsCoverEachOnce) {
  BatchLoader loader(paths, {.batch = 5, .seq_len = 64, .seed = 9});
  // Shard 0: (1000 − 1) / 64 = 15 windows; shard 1: none; shard 2 (base 1037): (700 − 1) / 64 = 10.
  ASSERT_EQ(loader.windows(), 25);
  EXPECT_EQ(loader.tokens(), 1737);
  EXPECT_EQ(loader.window_start(0), 0);
  EXPECT_EQ(loader.window_start(14), 14 * 64);
  EXPECT_EQ(loader.window_start(15), 1037);
  EXPECT_EQ(loader.window_start(24), 1037 + 9 * 64);
  std::multiset<int64_t> seen;
  for (int i = 0; i < 5; ++i) {
    Batch b = loader.next();
    seen.insert(b.starts.begin(), b.starts.end());
  }
  EXPECT_EQ(loader.epoch(), 0);
  EXPECT_EQ(loader.cursor(), 25);
  std::multiset<int64_t> all;
  for (int64_t w = 0; w < 25; ++w) all.insert(loader.window_start(w));
  EXPECT_EQ(seen, all) << "one epoch visits every window exactly once";
  loader.next();
  EXPECT_EQ(loader.epoch(), 1);
  EXPECT_EQ(loader.cursor(), 5);
}

TEST_F(Loader, DeterministicGivenSeedAndResumable) {
  BatchLoaderOptions o{.batch = 3, .seq_len = 32, .seed = 1234};
  BatchLoader a(paths, o), b(paths, o);
  std::vector<Batch> first;
  for (int i = 0; i < 40; ++i) {  // several epochs (31 + 21 = 52 windows each)
    Batch x = a.next(), y = b.next();
    ASSERT_EQ(x.starts, y.starts);
    ASSERT_EQ(x.inputs, y.inputs);
    ASSERT_EQ(x.targets, y.targets);
    first.push_back(x);
  }
  o.seed = 1235;
  BatchLoader c(paths, o);
  int same = 0;
  for (int i = 0; i < 10; ++i) same += c.next().starts == first[size_t(i)].starts;
  EXPECT_LT(same, 3) << "another seed gives another order";
  // Seeking to a saved (epoch, cursor) continues exactly where a run left off.
  BatchLoader d(paths, {.batch = 3, .seq_len = 32, .seed = 1234});
  for (int i = 0; i < 20; ++i) d.next();
  int64_t e = d.epoch(), cur = d.cursor();
  BatchLoader resumed(paths, {.batch = 3, .seq_len = 32, .seed = 1234});
  resumed.seek(e, cur);
  for (int i = 20; i < 40; ++i) ASSERT_EQ(resumed.next().starts, first[size_t(i)].starts) << i;
}

TEST_F(Loader, UnshuffledIsStreamOrder) {
  BatchLoader loader(paths, {.batch = 25, .seq_len = 64, .shuffle = false});
  Batch b = loader.next();
  for (int64_t w = 0; w < 25; ++w) EXPECT_EQ(b.starts[size_t(w)], loader.window_start(w));
  EXPECT_EQ(loader.next().starts, b.starts) << "every epoch alike";
}

TEST_F(Loader, BadOptionsAndFilesThrow) {
  expect_error([&] { BatchLoader l(paths, {.batch = 0}); }, {"BatchLoader", "batch"});
  expect_error([&] { BatchLoader l(paths, {.seq_len = 0}); }, {"BatchLoader", "seq_len"});
  expect_error([&] { BatchLoader l({}, {}); }, {"no shard"});
  expect_error([&] { BatchLoader l(paths, {.seq_len = 1000}); }, {"seq_len + 1 = 1001"});
  BatchLoader ok(paths, {.seq_len = 8});
  expect_error([&] { ok.seek(0, ok.windows() + 1); }, {"seek"});
  flip_byte(paths[2], 100);
  expect_error([&] { BatchLoader l(paths, {.seq_len = 8}); }, {paths[2], "checksum mismatch"});
}

TEST(LoaderCorpus, Gpt2ShardsOfTheCorpusRoundTrip) {
  RT_REQUIRE_DATA(enc, "gpt2/encoder.json");
  RT_REQUIRE_DATA(voc, "gpt2/vocab.bpe");
  RT_REQUIRE_DATA(kjv, "corpus/kjv.txt");
  Tokenizer tok = Tokenizer::load_gpt2(enc, voc);
  std::string text = io::read_text_file(kjv).substr(0, 100000);
  ScratchDir dir;
  ShardSet set =
      tokenize_to_shards(tok, text, dir.file("kjv"), {.val_fraction = 0.1, .tokens_per_shard = 5000});
  EXPECT_EQ(TokenShard(set.train[0]).dtype(), TokenDType::U16);  // 50257 ids fit 16 bits
  BatchLoader loader(set.train, {.batch = 2, .seq_len = 128, .seed = 3});
  Batch b = loader.next();
  std::string window = tok.decode(b.inputs.data(), 128);
  EXPECT_NE(text.find(window), std::string::npos) << "a window decodes to a piece of the text";
}

}  // namespace
}  // namespace retort::test
