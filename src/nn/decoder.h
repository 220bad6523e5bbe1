// Incremental decoding of a Transformer with a KV cache: each layer's keys and values of the positions seen
// so far stay in a cache, so a new token costs one token's work (plus attention over the cache) instead of a
// forward over the whole sequence.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "../core/context.h"
#include "../core/graph.h"
#include "../core/tensor.h"
#include "transformer.h"

namespace retort {

// Feeds tokens to a model a few at a time and returns their logits, equal (to f32 rounding) to those of
// Transformer::forward on the whole sequence so far. batch sequences advance together, all at the same
// position. The cache ([batch, max_len, kv_heads * head_dim] per layer, keys and values, in the model's
// compute dtype), the step graphs and their inputs live in a context of the decoder's own on the model's
// backend, freed with the decoder; the model's parameters are read, never copied, so every step uses the
// current weights (cached keys and values keep the weights they were made with until reset()).
//
// A step graph is static: it takes a fixed number of new tokens T (1, or prefill_chunk for several tokens at
// once, the unused rows padded) at run-time positions, writes their keys and values into the cache
// (set_rows) and attends over the first W cached positions with a run-time mask that hides the positions
// after each query's. W is the smallest of 64, 128, 256, ... (at most max_len) that covers the positions so
// far, so attention costs O(position), not O(max_len); one graph per (T, W) is built on first use.
class Decoder {
 public:
  // A decoder for model, whose parameters live in ctx (its backend runs the steps). max_len: positions the
  // cache holds, in [1, the model's context]; prefill_chunk: the T of the graph that takes several tokens at
  // once (1: token by token). Throws retort::Error on a bad argument.
  Decoder(Context& ctx, Transformer& model, int64_t max_len, int64_t batch = 1, int64_t prefill_chunk = 64);
  ~Decoder();
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  // Feeds n new tokens per sequence (tokens holds batch * n ids, sequence by sequence) at positions
  // [position(), position() + n). Returns the logits of the last token of each sequence, f32 [batch, vocab];
  // with all_logits, those of every fed token, [batch, n, vocab]. Throws retort::Error, before running
  // anything, when n < 1, the count is not a multiple of batch, an id is outside [0, vocab), or
  // position() + n > max_len.
  std::vector<float> feed(const std::vector<int32_t>& tokens, bool all_logits = false);
  // Forgets every position: the next feed starts at 0 (the cache's rows are overwritten as it refills).
  void reset() { pos_ = 0; }
  // Positions fed so far (the next token's position).
  int64_t position() const { return pos_; }
  int64_t max_len() const { return max_len_; }
  int64_t batch() const { return batch_; }
  int64_t prefill_chunk() const { return chunk_; }
  // The attention window a step covering positions up to `end` (exclusive) uses: the smallest of 64, 128,
  // ... that holds end, capped at max_len.
  int64_t window_for(int64_t end) const;
  // Step graphs built so far (one per (tokens per step, window, all_logits)).
  size_t graphs_built() const { return graphs_.size(); }

 private:
  struct Step;  // one static step graph and its inputs
  Step& step_for(int64_t T, int64_t window, bool all_logits);
  std::unique_ptr<Step> build(int64_t T, int64_t window, bool all_logits);
  Tensor* attention(size_t layer, const TransformerBlock& blk, Tensor* h, const Step& s);
  // Runs one step on tokens [first, first + n) of each sequence (n <= T of the step) and writes their logits
  // into out (laid out as feed returns them).
  void run(Step& s, const std::vector<int32_t>& tokens, int64_t n_total, int64_t first, int64_t n,
           bool all_logits, std::vector<float>& out);

  Transformer& model_;
  std::unique_ptr<Context> ctx_;
  int64_t max_len_, batch_, chunk_;
  int64_t pos_ = 0;
  std::vector<Tensor*> k_cache_, v_cache_;  // per layer: [batch, max_len, kv_heads * head_dim]
  std::map<std::tuple<int64_t, int64_t, bool>, std::unique_ptr<Step>> graphs_;
};

}  // namespace retort
