// A Llama-style decoder-only transformer language model built from graph ops: token embedding, pre-norm
// blocks of RMSNorm → causal multi-head attention with RoPE (grouped-query when kv_heads < heads) and
// RMSNorm → SwiGLU MLP, a final RMSNorm and an lm head (tied to the embedding or its own weight).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "../core/backend.h"
#include "../core/context.h"
#include "../core/tensor.h"

namespace retort {

struct TransformerConfig {
  int64_t vocab = 256;    // byte-level by default
  int64_t context = 128;  // longest sequence forward() accepts
  int64_t layers = 4;
  int64_t d_model = 128;
  int64_t heads = 4;
  int64_t kv_heads = 0;  // 0: same as heads (plain multi-head attention); else must divide heads
  int64_t d_ff = 0;      // 0: about 8/3 d_model rounded up to a multiple of 32 (SwiGLU's usual width)
  float rope_theta = 10000.0f;
  float norm_eps = 1e-5f;
  bool tie_embeddings = true;  // lm head = token embedding
  bool qkv_bias = false;       // biases on the q, k and v projections (Qwen2); none elsewhere
  // The dtype the matmuls run in. F32: everything f32. BF16 (or F16): mixed precision. The parameters stay
  // f32 (the optimizer's master weights) and so do RMSNorm, RoPE, softmax and the residual stream; every
  // matmul (q/k/v/o, the attention scores and probs·V, the MLP's gate/up/down, the lm head) reads its
  // operands cast to this dtype, accumulates in f32 and gives f32, and its gradient GEMMs read the upstream
  // gradient cast to it too (matmul_lowp); the gradients reach the f32 parameters through cast's backward.
  // F16 has no loss scaling here: prefer BF16. Not part of the model's identity: checkpoints do not record
  // it (describe() leaves it out), so a checkpoint trained in one compute dtype loads into a model of
  // another.
  DType compute_dtype = DType::F32;

  // The config with the 0 defaults resolved. Throws retort::Error naming the bad field.
  TransformerConfig resolved() const;
  int64_t head_dim() const { return d_model / heads; }
  std::string describe() const;  // "layers=4 d_model=128 heads=4 ..."
};

// The parameters of one block (shapes outermost first; linear weights are [out, in]).
struct TransformerBlock {
  Tensor* attn_norm;     // [d_model]
  Tensor* wq;            // [heads * head_dim, d_model]
  Tensor* wk;            // [kv_heads * head_dim, d_model]
  Tensor* wv;            // [kv_heads * head_dim, d_model]
  Tensor* bq = nullptr;  // [heads * head_dim] when qkv_bias, else null
  Tensor* bk = nullptr;  // [kv_heads * head_dim] when qkv_bias
  Tensor* bv = nullptr;  // [kv_heads * head_dim] when qkv_bias
  Tensor* wo;            // [d_model, heads * head_dim]
  Tensor* mlp_norm;      // [d_model]
  Tensor* w_gate;        // [d_ff, d_model]
  Tensor* w_up;          // [d_ff, d_model]
  Tensor* w_down;        // [d_model, d_ff]
};

// True when two configs describe the same parameters (compute dtype and context aside: neither is a weight).
bool same_architecture(const TransformerConfig& a, const TransformerConfig& b);
// Whether the blocks' attention is the fused flash_attention op on this backend: always on the CPU (its tiled
// kernel takes any head dim and dtype, and never writes the [T, T] scores the composition moves through
// memory); on a GPU in 16-bit compute with a head dim the CUDA kernels take (16, 32, 64, 96, 128), f32 models
// keeping the unfused composition there.
bool uses_flash_attention(const TransformerConfig& config, const Backend& backend);

// One parameter as a config implies it: its name, shape (outermost first) and initialization.
struct ParamSpec {
  enum class Init { Normal, Ones, Zeros };
  std::string name;  // "tok_emb", "layer0.wq", ..., "final_norm", "lm_head"
  Shape shape;
  Init init = Init::Normal;
  float stddev = 0;  // for Init::Normal
};
// Every parameter of a model of config c (resolved first; throws retort::Error on a bad config), in the
// order Transformer::parameters() holds them.
std::vector<ParamSpec> transformer_parameters(const TransformerConfig& c);

class Transformer {
 public:
  // Creates every parameter in ctx (f32) with a seeded init: N(0, 0.02) weights, the residual projections
  // (wo, w_down) scaled by 1/sqrt(2 layers), norm weights 1, biases 0. With init false the parameters are
  // left unset, for a caller that fills every one of them next (loading a model file). Throws retort::Error
  // on a bad config.
  Transformer(Context& ctx, const TransformerConfig& config, uint64_t seed = 0, bool init = true);

  // Logits f32 [B*T, vocab] (row b*T + t predicts the token after position t) for tokens i32 [B, T] with
  // T <= context (the lm head in the compute dtype, like every matmul). Adds nodes to ctx (which must be the
  // parameters' context); throws retort::Error on a bad tokens tensor. Token ids outside [0, vocab) throw
  // when the graph runs.
  Tensor* forward(Context& ctx, Tensor* tokens);
  // The final hidden states [B*T, d_model] (after the final norm, before the lm head), for a fused linear
  // loss that applies lm_head() chunk by chunk instead of materializing the logits: f32, or the compute dtype
  // when that is 16-bit (the fused norm writes the lm head's operand directly).
  Tensor* hidden(Context& ctx, Tensor* tokens);
  // The lm-head weight [vocab, d_model] (the token embedding when tied): the f32 parameter.
  Tensor* lm_head() const { return lm_head_; }
  // The lm head's operands as a fused linear loss should read them: hidden(...) and lm_head() cast to the
  // compute dtype (themselves when it is f32). New nodes in ctx on each call: call once per graph.
  Tensor* head_input(Context& ctx, Tensor* hidden);
  Tensor* head_weight(Context& ctx);

  // For a model that only runs forward (a teacher, eval, generation) with a 16-bit compute dtype: keeps a
  // copy of every matmul weight in the compute dtype, made now, which the forward reads instead of casting
  // the f32 parameter on every run. The f32 parameters stay (checkpoints and init_from_teacher read them);
  // later changes to them are not seen by the copies, so a frozen model cannot be trained (LmTrainer and
  // Python's Trainer refuse it). Nothing to do in f32; idempotent.
  void freeze_weights();
  bool frozen() const { return !frozen_.empty(); }

  const TransformerConfig& config() const { return config_; }
  // Every parameter, in a fixed order (embedding, blocks, final norm, untied head).
  const std::vector<Tensor*>& parameters() const { return params_; }
  int64_t parameter_count() const;

  Tensor* embedding() const { return tok_emb_; }
  Tensor* final_norm() const { return final_norm_; }
  const std::vector<TransformerBlock>& blocks() const { return blocks_; }

 private:
  friend class Decoder;  // builds its cached-attention step graphs from the same blocks and helpers
  // The heads' output [B*T, heads*head_dim] of causal attention over h, before the out projection.
  Tensor* attention(Context& ctx, const TransformerBlock& blk, Tensor* h, Tensor* positions, int64_t B,
                    int64_t T);
  // SwiGLU's activation [B*T, d_ff] (before the down projection) for h.
  Tensor* mlp(Context& ctx, const TransformerBlock& blk, Tensor* h);
  // Every block and the final norm over the residual stream x, with attention attn(layer, normed x) (the
  // training forward's or the decoder's cached one, before the out projection, which blocks() applies).
  Tensor* blocks(Context& ctx, Tensor* x, const std::function<Tensor*(size_t, Tensor*)>& attn);
  // x in the compute dtype (x itself when it is already), and a matmul of two such operands (its result f32,
  // or in the 16-bit compute dtype when lowp_out).
  Tensor* lowp(Context& ctx, Tensor* x);
  Tensor* mm(Context& ctx, Tensor* a, Tensor* b, bool transpose_a, bool transpose_b, bool lowp_out = false);

  TransformerConfig config_;
  Context* ctx_;
  Tensor* tok_emb_;     // [vocab, d_model]
  Tensor* final_norm_;  // [d_model]
  Tensor* lm_head_;     // [vocab, d_model]: tok_emb_ when tied
  std::vector<TransformerBlock> blocks_;
  std::vector<Tensor*> params_;
  std::map<const Tensor*, Tensor*> frozen_;  // f32 parameter -> its compute-dtype copy (freeze_weights)
};

// The compute dtype a run should use on this backend: bf16 on a GPU (tensor-core GEMMs), f32 on the CPU
// (exact f32 results by default; bf16 is asked for explicitly, and only an AMD CPU with AVX-512 BF16 runs it
// faster than f32: elsewhere the casts cost more than the GEMM saves).
DType default_compute_dtype(const Backend& backend);

// Mean next-token cross-entropy of logits [N, vocab] against targets int [N] (or [B, T], flattened);
// targets equal to ignore_index do not count.
Tensor* lm_loss(Context& ctx, Tensor* logits, Tensor* targets, int64_t ignore_index = -100);

}  // namespace retort
