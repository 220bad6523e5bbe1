// The KV-cached decoder against Transformer::forward on the whole sequence: every position's logits, fed in
// prefill chunks (the last one padded), token by token, or both; with grouped-query attention, q/k/v biases
// and an untied head; across attention windows and up to a full cache. Then its refusals (max_len reached,
// bad tokens), reset, and a bf16 model against its own bf16 forward.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "decoder_check.h"
#include "harness.h"

namespace retort::test {
namespace {

constexpr double kTol = 1e-4;  // f32 throughout: only the order of sums differs from forward

TEST(Decoder, EveryPositionMatchesTheFullForward) {
  CpuBackend be(2);
  Context ctx(be);
  const int64_t T = 150, B = 2, V = 37;  // windows 64, 128 and 150; the cache ends full
  auto m = make_model(ctx, small(T), 3);
  const std::vector<int32_t> toks = random_tokens(B * T, V, 7);
  const std::vector<float> want = full_logits(ctx, *m, toks, B);
  struct Way {
    const char* name;
    int64_t chunk;
    std::vector<int64_t> pieces;
  };
  // Chunks of 16: a prompt of 23 is one full chunk and a padded one; 150 at once ends with single steps
  // (the padding of a chunk at 144 would run past the cache).
  const Way ways[] = {
      {"prompt 23 then one by one", 16,
       [] {
         std::vector<int64_t> p = {23};
         p.resize(128, 1);
         return p;
       }()},
      {"all at once", 16, {150}},
      {"uneven pieces", 16, {1, 40, 17, 2, 63, 1, 26}},
      {"token by token", 1, std::vector<int64_t>(150, 1)},
      {"chunk 64", 64, {70, 80}},
  };
  for (const Way& w : ways) {
    SCOPED_TRACE(w.name);
    Decoder d(ctx, *m, T, B, w.chunk);
    const std::vector<float> got = decode_all(d, toks, B, w.pieces, V);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        const size_t at = size_t((b * T + t) * V);
        const std::vector<float> g(got.begin() + at, got.begin() + at + V),
            e(want.begin() + at, want.begin() + at + V);
        ASSERT_LE(rel_err(g, e), kTol) << "sequence " << b << " position " << t;
      }
  }
}

TEST(Decoder, LastLogitsEqualTheAllLogitsRow) {
  CpuBackend be(2);
  Context ctx(be);
  auto m = make_model(ctx, small(40), 5);
  const std::vector<int32_t> toks = random_tokens(2 * 30, 37, 9);
  Decoder all(ctx, *m, 40, 2, 8), last(ctx, *m, 40, 2, 8);
  const std::vector<float> a = all.feed(toks, true);  // [2, 30, 37]
  const std::vector<float> l = last.feed(toks);       // [2, 37]
  ASSERT_EQ(l.size(), size_t(2 * 37));
  // The same values up to f32 rounding: the lm head of 2 rows takes the CPU GEMM's dot-product path, that of
  // all 60 its packed one.
  std::vector<float> rows;
  for (int64_t b = 0; b < 2; ++b)
    rows.insert(rows.end(), a.begin() + (b * 30 + 29) * 37, a.begin() + (b * 30 + 30) * 37);
  EXPECT_LE(rel_err(l, rows), 1e-6);
}

TEST(Decoder, MaxLenReachedIsAClearErrorAndChangesNothing) {
  CpuBackend be(1);
  Context ctx(be);
  auto m = make_model(ctx, small(20), 1);
  Decoder d(ctx, *m, 12, 1, 4);
  const std::vector<int32_t> toks = random_tokens(12, 37, 2);
  const std::vector<float> first = d.feed(std::vector<int32_t>(toks.begin(), toks.begin() + 10));
  try {
    d.feed({1, 2, 3});
    FAIL() << "feeding past max_len did not throw";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("max_len 12"), std::string::npos) << msg;
    EXPECT_NE(msg.find("position 10"), std::string::npos) << msg;
  }
  EXPECT_EQ(d.position(), 10);
  d.feed({toks[10], toks[11]});  // exactly full is fine
  EXPECT_EQ(d.position(), 12);
  EXPECT_THROW(d.feed({0}), Error);
  // reset: the same tokens again give the same logits (stale rows past the position stay hidden).
  d.reset();
  EXPECT_EQ(d.feed(std::vector<int32_t>(toks.begin(), toks.begin() + 10)), first);
}

TEST(Decoder, RefusesBadArgumentsAndTokens) {
  CpuBackend be(1);
  Context ctx(be);
  auto m = make_model(ctx, small(20), 1);
  EXPECT_THROW(Decoder(ctx, *m, 21), Error);  // more than the context
  EXPECT_THROW(Decoder(ctx, *m, 0), Error);
  EXPECT_THROW(Decoder(ctx, *m, 8, 0), Error);
  EXPECT_THROW(Decoder(ctx, *m, 8, 1, 0), Error);
  Context other(be);
  EXPECT_THROW(Decoder(other, *m, 8), Error);  // not the parameters' context
  Decoder d(ctx, *m, 8, 2, 4);
  EXPECT_THROW(d.feed({}), Error);
  EXPECT_THROW(d.feed({1, 2, 3}), Error);  // not a multiple of the batch
  try {
    d.feed({1, 37});
    FAIL() << "a token outside the vocabulary did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token 37"), std::string::npos) << e.what();
  }
  EXPECT_EQ(d.position(), 0);
}

TEST(Decoder, WindowsAndGraphs) {
  CpuBackend be(1);
  Context ctx(be);
  auto m = make_model(ctx, small(300), 1);
  Decoder d(ctx, *m, 300, 1, 16);
  EXPECT_EQ(d.window_for(1), 64);
  EXPECT_EQ(d.window_for(64), 64);
  EXPECT_EQ(d.window_for(65), 128);
  EXPECT_EQ(d.window_for(257), 300);
  Decoder tiny(ctx, *m, 10);
  EXPECT_EQ(tiny.window_for(3), 10);
  // A prompt in one padded chunk, then single steps in the first window: two graphs.
  d.feed(random_tokens(20, 37, 1));
  for (int i = 0; i < 10; ++i) d.feed({int32_t(i)});
  EXPECT_EQ(d.graphs_built(), 2u);
}

TEST(Decoder, Bf16ModelMatchesItsOwnForward) {
  // The cache holds bf16 keys and values, as forward's attention matmuls read them: the two differ only in
  // the order of f32 sums, then the bf16 roundings that order can flip.
  CpuBackend be(2);
  Context ctx(be);
  TransformerConfig c = small(48);
  c.compute_dtype = DType::BF16;
  auto m = make_model(ctx, c, 4);
  const std::vector<int32_t> toks = random_tokens(48, 37, 5);
  const std::vector<float> want = full_logits(ctx, *m, toks, 1);
  Decoder d(ctx, *m, 48, 1, 16);
  const std::vector<float> got = decode_all(d, toks, 1, {20, 1, 1, 26}, 37);
  EXPECT_LE(rel_err(got, want), 2e-2);
  EXPECT_LE(nmse(to_f64(got), to_f64(want)), 1e-4);
}

}  // namespace
}  // namespace retort::test
