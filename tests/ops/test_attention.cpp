// flash_attention on the CPU: the shared case list (attention_cases.h) in f32 and bf16, the saved
// log-sum-exp, agreement with the unfused composition the transformer used before, and bad input.
#include <gtest/gtest.h>

#include <cmath>

#include "attention_cases.h"
#include "expect_error.h"
#include "harness.h"

namespace retort::test {
namespace {

TEST(FlashAttention, EveryCaseF32) {
  for (const AttentionShape& s : attention_shapes()) run_case(attention_case(s, DType::F32));
}

TEST(FlashAttention, EveryCaseBF16AndF16) {
  for (const AttentionShape& s : attention_shapes()) {
    run_case(attention_case(s, DType::BF16));
    run_case(attention_case(s, DType::F16));
  }
}

// Head dims that are no multiple of the CPU tiles' 16 lanes (zero-padded there; the CUDA kernels take only
// the dims of the shared list), over several query and key tiles with tails, causal and not.
TEST(FlashAttention, PaddedHeadDimsOnTheCpu) {
  for (DType dt : {DType::F32, DType::BF16}) {
    run_case(attention_case({"d24_gqa3_tiles", 2, 70, 70, 3, 1, 24}, dt));
    run_case(attention_case({"d40_noncausal", 1, 67, 130, 2, 2, 40, false}, dt));
    run_case(attention_case({"d2_kv_cache", 1, 9, 75, 2, 1, 2, true, 66}, dt));
  }
}

// The log-sum-exp it saves: of the scaled scores over the visible keys, -inf for a row without one.
TEST(FlashAttention, SavesTheLogSumExp) {
  const AttentionShape s{"lse", 1, 6, 4, 2, 1, 16, true, -2};
  reseed("flash_lse");
  Context ctx(default_cpu_backend());
  Tensor* q = ctx.input(DType::F32, {1, 6, 2, 16}, "q");
  Tensor* k = ctx.input(DType::F32, {1, 4, 1, 16}, "k");
  Tensor* v = ctx.input(DType::F32, {1, 4, 1, 16}, "v");
  std::vector<Ref> refs(3);
  for (Tensor* t : {q, k, v}) {
    Vec x = random_vec(t->nelements());
    set_data(t, std::vector<float>(x.begin(), x.end()));
  }
  Tensor* out = flash_attention(ctx, q, k, v, 0.25f, true, -2);
  Tensor* lse = flash_attention_lse(out);
  lse->flags |= kOutput;
  Graph g(ctx);
  g.forward(out);
  g.forward(lse);
  g.set_poison(true);
  g.compute();
  const std::vector<float> qv = get_data(q), kv = get_data(k), got = get_data(lse);
  ASSERT_EQ(got.size(), 12u);
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 6; ++i) {
      const int64_t n = std::clamp<int64_t>(i - 2 + 1, 0, 4);
      double l = 0;
      for (int64_t j = 0; j < n; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < 16; ++d) dot += double(qv[size_t((i * 2 + h) * 16 + d)]) * kv[size_t(j * 16 + d)];
        l += std::exp(0.25 * dot);
      }
      const float e = got[size_t(h * 6 + i)];
      if (n == 0)
        EXPECT_EQ(e, -INFINITY) << "row " << i;
      else
        EXPECT_NEAR(e, std::log(l), 1e-5) << "head " << h << " row " << i;
    }
}

// The same attention composed of unfused ops (head-major copies, repeated kv heads, [T, T] scores, causal
// softmax): forward and every gradient agree to f32 rounding.
TEST(FlashAttention, EqualsTheUnfusedComposition) {
  const int64_t B = 2, T = 24, H = 4, KV = 2, D = 16;
  const float scale = 1.0f / std::sqrt(float(D));
  auto run = [&](bool fused) {
    reseed("flash_vs_unfused");
    Context ctx(default_cpu_backend());
    Tensor* q = ctx.param(DType::F32, {B, T, H, D}, "q");
    Tensor* k = ctx.param(DType::F32, {B, T, KV, D}, "k");
    Tensor* v = ctx.param(DType::F32, {B, T, KV, D}, "v");
    for (Tensor* t : {q, k, v}) {
      Vec x = random_vec(t->nelements());
      set_data(t, std::vector<float>(x.begin(), x.end()));
    }
    Tensor* out;
    if (fused) {
      out = flash_attention(ctx, q, k, v, scale);
    } else {
      auto widen = [&](Tensor* x) {
        const int64_t ne[kMaxDims] = {D, H / KV, KV, B * T};
        return reshape(ctx, repeat(ctx, reshape(ctx, x, {B * T, KV, 1, D}), ne), {B, T, H, D});
      };
      auto heads_major = [&](Tensor* x) { return contiguous(ctx, permute(ctx, x, 0, 2, 1, 3)); };
      Tensor* probs = causal_softmax(ctx, matmul(ctx, heads_major(q), heads_major(widen(k)), false, true), scale);
      out = contiguous(ctx, permute(ctx, matmul(ctx, probs, heads_major(widen(v))), 0, 2, 1, 3));
    }
    Tensor* w = ctx.input(DType::F32, {B, T, H, D}, "w");
    Vec wv = random_vec(w->nelements());
    set_data(w, std::vector<float>(wv.begin(), wv.end()));
    out->flags |= kOutput;
    Graph g(ctx);
    g.forward(out);
    g.backward(sum(ctx, mul(ctx, out, w)));
    g.compute();
    return std::vector<Vec>{to_f64(get_data(out)), to_f64(get_data(g.grad(q))), to_f64(get_data(g.grad(k))),
                            to_f64(get_data(g.grad(v)))};
  };
  const std::vector<Vec> a = run(true), b = run(false);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_LE(nmse(a[i], b[i]), 1e-11) << "output " << i;
}

TEST(FlashAttention, BadInput) {
  Context ctx(default_cpu_backend());
  Tensor* q = ctx.input(DType::F32, {1, 4, 6, 8}, "q");
  Tensor* k = ctx.input(DType::F32, {1, 4, 4, 8}, "k");
  Tensor* k3 = ctx.input(DType::F32, {1, 4, 3, 8}, "k3");
  Tensor* kb = ctx.input(DType::BF16, {1, 4, 3, 8}, "kb");
  Tensor* kd = ctx.input(DType::F32, {1, 4, 3, 4}, "kd");
  Tensor* ids = ctx.input(DType::I32, {1, 4, 3, 8}, "ids");
  expect_error([&] { flash_attention(ctx, q, k, k, 1.0f); }, {"flash_attention", "KV dividing H", "f32[4, 4, 8]"});
  expect_error([&] { flash_attention(ctx, q, k3, kb, 1.0f); }, {"flash_attention", "share a dtype"});
  expect_error([&] { flash_attention(ctx, q, kd, kd, 1.0f); }, {"flash_attention", "same B and D"});
  expect_error([&] { flash_attention(ctx, q, ids, ids, 1.0f); }, {"flash_attention", "k must be f32"});
  expect_error([&] { flash_attention(ctx, q, k3, k3, NAN); }, {"flash_attention", "scale must be finite"});
  expect_error([&] { flash_attention(ctx, permute(ctx, q, 0, 2, 1, 3), k3, k3, 1.0f); },
               {"flash_attention", "contiguous"});
  expect_error([&] { flash_attention(ctx, nullptr, k3, k3, 1.0f); }, {"flash_attention", "q is null"});
  expect_error([&] { flash_attention_lse(q); }, {"flash_attention_lse"});
}

}  // namespace
}  // namespace retort::test
