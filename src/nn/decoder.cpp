#include "decoder.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "../core/error.h"
#include "../ops/ops.h"

namespace retort {

namespace {

// The smallest attention window; below it, more graphs would save too little attention work to pay for
// building them.
constexpr int64_t kMinWindow = 64;

}  // namespace

// One static step graph: T new tokens per sequence attending over the first `window` cache positions.
struct Decoder::Step {
  int64_t T = 0, window = 0;
  bool all_logits = false;
  Tensor* tokens = nullptr;     // i32 [batch, T]
  Tensor* positions = nullptr;  // i32 [T]: the new tokens' positions, also the cache rows they write
  Tensor* mask = nullptr;    // f32 [T, window]: 0 where query t may see key j (j <= its position), -inf else
  Tensor* last = nullptr;    // i32 [batch]: the row of each sequence's last real token (T > 1, !all_logits)
  Tensor* logits = nullptr;  // f32 [batch * T, vocab] (all_logits) or [batch, vocab]
  std::unique_ptr<Graph> graph;
};

Decoder::Decoder(Context& ctx, Transformer& model, int64_t max_len, int64_t batch, int64_t prefill_chunk)
    : model_(model), max_len_(max_len), batch_(batch), chunk_(prefill_chunk) {
  RT_CHECK(&ctx == model.ctx_, "decoder: ctx must be the context that holds the model's parameters");
  const TransformerConfig& c = model.config();
  RT_CHECK(max_len >= 1 && max_len <= c.context, "decoder: max_len must be in [1, ", c.context,
           "] (the model's context), got ", max_len);
  RT_CHECK(batch >= 1, "decoder: batch must be >= 1, got ", batch);
  RT_CHECK(prefill_chunk >= 1, "decoder: prefill_chunk must be >= 1, got ", prefill_chunk);
  ctx_ = std::make_unique<Context>(ctx.backend());
  // Keys and values are stored as the attention matmuls read them: in the compute dtype.
  const DType cd = c.compute_dtype;
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string p = "layer" + std::to_string(l);
    k_cache_.push_back(ctx_->tensor(cd, {batch, max_len, c.kv_heads * c.head_dim()}, p + ".k_cache"));
    v_cache_.push_back(ctx_->tensor(cd, {batch, max_len, c.kv_heads * c.head_dim()}, p + ".v_cache"));
  }
}

Decoder::~Decoder() = default;

int64_t Decoder::window_for(int64_t end) const {
  int64_t w = kMinWindow;
  while (w < end && w < max_len_) w *= 2;
  return std::min(w, max_len_);
}

Decoder::Step& Decoder::step_for(int64_t T, int64_t window, bool all_logits) {
  auto& slot = graphs_[{T, window, all_logits}];
  if (!slot) slot = build(T, window, all_logits);
  return *slot;
}

// h [batch*T, d_model] -> the heads' output [batch*T, heads*hd] (before the out projection, which
// Transformer::blocks applies), reading and extending layer `layer`'s cache. Shapes in
// comments are outermost first; B = batch, W = window, r = heads per kv head.
Tensor* Decoder::attention(size_t layer, const TransformerBlock& blk, Tensor* h, const Step& s) {
  Context& ctx = *ctx_;
  Transformer& m = model_;
  const TransformerConfig& c = m.config();
  const int64_t B = batch_, T = s.T, W = s.window, H = c.heads, KV = c.kv_heads, hd = c.head_dim();
  const int64_t r = H / KV;
  h = m.lowp(ctx, h);
  auto proj = [&](Tensor* w, Tensor* bias) {
    Tensor* y = m.mm(ctx, h, w, false, true);
    return bias ? add(ctx, y, bias) : y;
  };
  Tensor* q = proj(blk.wq, blk.bq);  // [B*T, H*hd]
  Tensor* k = proj(blk.wk, blk.bk);  // [B*T, KV*hd]
  Tensor* v = proj(blk.wv, blk.bv);  // [B*T, KV*hd]
  q = rope(ctx, reshape(ctx, q, {B, T, H, hd}), s.positions, RopeMode::Normal, c.rope_theta);
  k = rope(ctx, reshape(ctx, k, {B, T, KV, hd}), s.positions, RopeMode::Normal, c.rope_theta);
  // The new keys and values go into their rows of the cache; reading the cache through set_rows' result
  // orders the reads after the writes.
  Tensor* kc = set_rows(ctx, k_cache_[layer], reshape(ctx, k, {B, T, KV * hd}), s.positions);
  Tensor* vc = set_rows(ctx, v_cache_[layer], reshape(ctx, v, {B, T, KV * hd}), s.positions);
  // The first W positions of a cache [B, max_len, KV*hd] as [B, KV, W, hd]: a strided view, no copy.
  auto window = [&](Tensor* cache) {
    Tensor* w = slice(ctx, reshape(ctx, cache, {B, max_len_, KV, hd}), 2, 0, W);  // [B, W, KV, hd]
    return permute(ctx, w, 0, 2, 1, 3);
  };
  // Grouped-query attention without repeating the cache: the queries of the r heads that share kv head g
  // become r*T rows of one matmul against that head's keys. [B, T, H, hd] -> [B, H, T, hd] is a copy (also
  // the cast to the compute dtype, as in forward); its heads h = g*r + j then split as [B, KV, r*T, hd].
  const DType cd = c.compute_dtype;
  Tensor* qh = reshape(ctx, cast(ctx, permute(ctx, q, 0, 2, 1, 3), cd), {B, KV, r * T, hd});
  Tensor* scores = m.mm(ctx, qh, window(kc), false, true);  // [B, KV, r*T, W]
  scores = reshape(ctx, scores, {B, H, T, W});
  // forward's causal_softmax scales inside the softmax; scaling first gives the same f32 products.
  Tensor* probs = softmax(ctx, add(ctx, scale(ctx, scores, 1.0f / std::sqrt(float(hd))), s.mask));
  probs = reshape(ctx, probs, {B, KV, r * T, W});
  Tensor* out = m.mm(ctx, probs, window(vc), false, false);  // [B, KV, r*T, hd] = [B, H, T, hd]
  out = reshape(ctx, out, {B, H, T, hd});
  return reshape(ctx, cast(ctx, permute(ctx, out, 0, 2, 1, 3), cd), {B * T, H * hd});  // before wo
}

// The step graph mirrors Transformer::hidden and forward, block for block, with attention() above.
std::unique_ptr<Decoder::Step> Decoder::build(int64_t T, int64_t window, bool all_logits) {
  Context& ctx = *ctx_;
  Transformer& m = model_;
  const int64_t B = batch_;
  auto s = std::make_unique<Step>();
  s->T = T;
  s->window = window;
  s->all_logits = all_logits;
  s->tokens = ctx.input(DType::I32, {B, T}, "step_tokens");
  s->positions = ctx.input(DType::I32, {T}, "step_positions");
  s->mask = ctx.input(DType::F32, {T, window}, "step_mask");

  Tensor* x = get_rows(ctx, m.tok_emb_, reshape(ctx, s->tokens, {B * T}));  // [B*T, d_model]
  Tensor* hid = m.blocks(ctx, x, [&](size_t l, Tensor* h) { return attention(l, m.blocks_[l], h, *s); });
  if (!all_logits && T > 1) {
    // Only each sequence's last real token needs the lm head: its row is known only at run time.
    s->last = ctx.input(DType::I32, {B}, "step_last");
    hid = get_rows(ctx, hid, s->last);  // [B, d_model]
  }
  s->logits = m.mm(ctx, hid, m.lm_head_, false, true);
  s->logits->flags |= kOutput;
  s->graph = std::make_unique<Graph>(ctx);
  s->graph->forward(s->logits);
  return s;
}

void Decoder::run(Step& s, const std::vector<int32_t>& tokens, int64_t n_total, int64_t first, int64_t n,
                  bool all_logits, std::vector<float>& out) {
  const int64_t B = batch_, T = s.T, W = s.window, V = model_.config().vocab;
  // Rows past n are padding: token 0 at the positions that follow, so their keys and values land in rows
  // that no real query sees yet and that later steps overwrite before any does.
  std::vector<int64_t> ids(static_cast<size_t>(B * T), 0), pos(static_cast<size_t>(T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < n; ++t) ids[size_t(b * T + t)] = tokens[size_t(b * n_total + first + t)];
  for (int64_t t = 0; t < T; ++t) pos[size_t(t)] = pos_ + t;
  set_data_int(s.tokens, ids);
  set_data_int(s.positions, pos);
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> mask(size_t(T * W));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < W; ++j) mask[size_t(t * W + j)] = j <= pos_ + t ? 0.0f : -inf;
  set_data(s.mask, mask);
  if (s.last) {
    std::vector<int64_t> last(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b) last[size_t(b)] = b * T + n - 1;
    set_data_int(s.last, last);
  }
  s.graph->compute();
  const std::vector<float> logits = get_data(s.logits);
  // The graph gives [B*T, vocab] rows when it keeps every token's logits, else [B, vocab].
  RT_ASSERT(int64_t(logits.size()) == (s.all_logits ? B * T : B) * V);
  for (int64_t b = 0; b < B; ++b) {
    if (all_logits)
      std::copy_n(logits.begin() + b * (s.all_logits ? T : 1) * V, n * V,
                  out.begin() + (b * n_total + first) * V);
    else
      std::copy_n(logits.begin() + b * V, V, out.begin() + b * V);
  }
  pos_ += n;
}

std::vector<float> Decoder::feed(const std::vector<int32_t>& tokens, bool all_logits) {
  const int64_t B = batch_, V = model_.config().vocab;
  const int64_t count = int64_t(tokens.size());
  RT_CHECK(count >= B && count % B == 0, "decoder.feed: ", count, " tokens for ", B,
           " sequences: need n >= 1 new tokens per sequence, batch * n in all");
  const int64_t n = count / B;
  RT_CHECK(pos_ + n <= max_len_, "decoder.feed: ", n, " tokens at position ", pos_, " would pass max_len ",
           max_len_, " (the cache is full; reset() it or make a decoder with a larger max_len)");
  for (int64_t i = 0; i < count; ++i)
    RT_CHECK(tokens[size_t(i)] >= 0 && tokens[size_t(i)] < V, "decoder.feed: token ", tokens[size_t(i)],
             " at index ", i, " is outside the vocabulary [0, ", V, ")");
  std::vector<float> out(size_t(all_logits ? B * n * V : B * V));
  for (int64_t done = 0; done < n;) {
    const int64_t left = n - done;
    // Several tokens go through the prefill graph while its padded rows still fit in the cache; the rest, one
    // by one.
    const bool chunked = chunk_ > 1 && left > 1 && pos_ + chunk_ <= max_len_;
    const int64_t T = chunked ? chunk_ : 1;
    const int64_t take = std::min(left, T);
    Step& s = step_for(T, window_for(pos_ + take), all_logits && T > 1);
    run(s, tokens, n, done, take, all_logits, out);
    done += take;
  }
  return out;
}

}  // namespace retort
