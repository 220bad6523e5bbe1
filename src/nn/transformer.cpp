#include "transformer.h"

#include <climits>
#include <functional>
#include <cmath>
#include <map>
#include <random>
#include <sstream>

#include "../core/error.h"
#include "../ops/ops.h"

namespace retort {

TransformerConfig TransformerConfig::resolved() const {
  TransformerConfig c = *this;
  // Token ids and positions are int32; the bound also keeps d_model * 8 below and every shape product exact.
  for (auto [name, v] : {std::pair<const char*, int64_t>{"vocab", c.vocab},
                         {"context", c.context},
                         {"layers", c.layers},
                         {"d_model", c.d_model},
                         {"heads", c.heads},
                         {"kv_heads", c.kv_heads},
                         {"d_ff", c.d_ff}})
    RT_CHECK(v <= INT32_MAX, "transformer: ", name, " = ", v, " is larger than 2^31 - 1");
  RT_CHECK(c.vocab >= 1, "transformer: vocab must be >= 1, got ", c.vocab);
  RT_CHECK(c.context >= 1, "transformer: context must be >= 1, got ", c.context);
  RT_CHECK(c.layers >= 1, "transformer: layers must be >= 1, got ", c.layers);
  RT_CHECK(c.heads >= 1, "transformer: heads must be >= 1, got ", c.heads);
  RT_CHECK(c.d_model >= 2 && c.d_model % c.heads == 0, "transformer: d_model ", c.d_model,
           " must be a positive multiple of heads ", c.heads);
  RT_CHECK(c.head_dim() % 2 == 0, "transformer: head_dim = d_model / heads = ", c.head_dim(),
           " must be even (RoPE rotates pairs)");
  if (c.kv_heads == 0) c.kv_heads = c.heads;
  RT_CHECK(c.kv_heads >= 1 && c.heads % c.kv_heads == 0, "transformer: kv_heads ", c.kv_heads,
           " must divide heads ", c.heads);
  // SwiGLU has three d_ff-wide matrices where a plain MLP has two 4·d_model ones: 8/3·d_model keeps the
  // parameter count of the plain MLP; a multiple of 32 keeps the matmul rows aligned.
  if (c.d_ff == 0) c.d_ff = (c.d_model * 8 / 3 + 31) / 32 * 32;
  RT_CHECK(c.d_ff >= 1, "transformer: d_ff must be >= 1, got ", c.d_ff);
  RT_CHECK(c.rope_theta > 0 && std::isfinite(c.rope_theta), "transformer: rope_theta must be > 0, got ",
           c.rope_theta);
  RT_CHECK(c.norm_eps > 0, "transformer: norm_eps must be > 0, got ", c.norm_eps);
  RT_CHECK(is_float(c.compute_dtype), "transformer: compute_dtype must be f32, bf16 or f16, got ",
           dtype_name(c.compute_dtype));
  return c;
}

std::string TransformerConfig::describe() const {
  std::ostringstream os;
  os << "layers=" << layers << " d_model=" << d_model << " heads=" << heads << " kv_heads=" << kv_heads
     << " d_ff=" << d_ff << " vocab=" << vocab << " context=" << context
     << (tie_embeddings ? " tied" : " untied") << (qkv_bias ? " qkv_bias" : "");
  return os.str();
}

bool same_architecture(const TransformerConfig& a, const TransformerConfig& b) {
  return a.vocab == b.vocab && a.layers == b.layers && a.d_model == b.d_model && a.heads == b.heads &&
         a.kv_heads == b.kv_heads && a.d_ff == b.d_ff && a.rope_theta == b.rope_theta &&
         a.norm_eps == b.norm_eps && a.tie_embeddings == b.tie_embeddings && a.qkv_bias == b.qkv_bias;
}

std::vector<ParamSpec> transformer_parameters(const TransformerConfig& config) {
  const TransformerConfig c = config.resolved();
  const int64_t hd = c.head_dim();
  // GPT-2's init: small normal weights, and the projections that write into the residual stream scaled down
  // by 1/sqrt(2·layers), since each block adds two of them and the stream's variance would otherwise grow
  // with depth.
  const float std0 = 0.02f;
  const float std_resid = std0 / std::sqrt(2.0f * float(c.layers));
  using I = ParamSpec::Init;
  std::vector<ParamSpec> v;
  v.push_back({"tok_emb", {c.vocab, c.d_model}, I::Normal, std0});
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string p = "layer" + std::to_string(l) + ".";
    v.push_back({p + "attn_norm", {c.d_model}, I::Ones, 0});
    v.push_back({p + "wq", {c.heads * hd, c.d_model}, I::Normal, std0});
    v.push_back({p + "wk", {c.kv_heads * hd, c.d_model}, I::Normal, std0});
    v.push_back({p + "wv", {c.kv_heads * hd, c.d_model}, I::Normal, std0});
    if (c.qkv_bias) {
      v.push_back({p + "bq", {c.heads * hd}, I::Zeros, 0});
      v.push_back({p + "bk", {c.kv_heads * hd}, I::Zeros, 0});
      v.push_back({p + "bv", {c.kv_heads * hd}, I::Zeros, 0});
    }
    v.push_back({p + "wo", {c.d_model, c.heads * hd}, I::Normal, std_resid});
    v.push_back({p + "mlp_norm", {c.d_model}, I::Ones, 0});
    v.push_back({p + "w_gate", {c.d_ff, c.d_model}, I::Normal, std0});
    v.push_back({p + "w_up", {c.d_ff, c.d_model}, I::Normal, std0});
    v.push_back({p + "w_down", {c.d_model, c.d_ff}, I::Normal, std_resid});
  }
  v.push_back({"final_norm", {c.d_model}, I::Ones, 0});
  if (!c.tie_embeddings) v.push_back({"lm_head", {c.vocab, c.d_model}, I::Normal, std0});
  return v;
}

Transformer::Transformer(Context& ctx, const TransformerConfig& config, uint64_t seed, bool init)
    : config_(config.resolved()), ctx_(&ctx) {
  std::mt19937_64 rng(seed);
  std::map<std::string, Tensor*> by_name;
  for (const ParamSpec& spec : transformer_parameters(config_)) {
    Tensor* t = ctx.param(DType::F32, spec.shape, spec.name);
    if (init) {
      std::vector<float> v(size_t(t->nelements()), spec.init == ParamSpec::Init::Ones ? 1.0f : 0.0f);
      if (spec.init == ParamSpec::Init::Normal) {
        std::normal_distribution<float> dist(0.0f, spec.stddev);
        for (float& x : v) x = dist(rng);
      }
      set_data(t, v);
    }
    params_.push_back(t);
    by_name[spec.name] = t;
  }
  auto get = [&](const std::string& name) {
    auto it = by_name.find(name);
    return it == by_name.end() ? nullptr : it->second;
  };
  tok_emb_ = get("tok_emb");
  for (int64_t l = 0; l < config_.layers; ++l) {
    const std::string p = "layer" + std::to_string(l) + ".";
    blocks_.push_back({get(p + "attn_norm"), get(p + "wq"), get(p + "wk"), get(p + "wv"), get(p + "bq"),
                       get(p + "bk"), get(p + "bv"), get(p + "wo"), get(p + "mlp_norm"), get(p + "w_gate"),
                       get(p + "w_up"), get(p + "w_down")});
  }
  final_norm_ = get("final_norm");
  lm_head_ = config_.tie_embeddings ? tok_emb_ : get("lm_head");
}

int64_t Transformer::parameter_count() const {
  int64_t n = 0;
  for (const Tensor* p : params_) n += p->nelements();
  return n;
}

Tensor* Transformer::lowp(Context& ctx, Tensor* x) {
  if (x->dtype == config_.compute_dtype) return x;
  const auto f = frozen_.find(x);
  return f != frozen_.end() ? f->second : cast(ctx, x, config_.compute_dtype);
}

void Transformer::freeze_weights() {
  const DType cd = config_.compute_dtype;
  if (cd == DType::F32) return;
  for (Tensor* p : params_) {
    if (p->n_dims() != 2 || frozen_.count(p)) continue;  // the norms and biases are read in f32
    Tensor* copy = ctx_->tensor(cd, p->shape(), p->name + " (" + dtype_name(cd) + ")");
    set_data(copy, get_data(p));
    frozen_[p] = copy;
  }
}

// In f32 this is exactly the plain matmul (the f32 graph is the one the golden test pins, node for node).
Tensor* Transformer::mm(Context& ctx, Tensor* a, Tensor* b, bool transpose_a, bool transpose_b, bool lowp_out) {
  const DType cd = config_.compute_dtype;
  if (cd == DType::F32) return matmul(ctx, a, b, transpose_a, transpose_b);
  return matmul_lowp(ctx, lowp(ctx, a), lowp(ctx, b), transpose_a, transpose_b, lowp_out ? cd : DType::F32);
}

bool uses_flash_attention(const TransformerConfig& config, const Backend& backend) {
  if (backend.is_host()) return true;
  const TransformerConfig c = config.resolved();
  const int64_t hd = c.head_dim();
  return c.compute_dtype != DType::F32 && (hd == 16 || hd == 32 || hd == 64 || hd == 96 || hd == 128);
}

// h [B*T, d_model] -> the heads' output [B*T, H*hd], before the out projection. Shapes in comments are
// outermost first.
Tensor* Transformer::attention(Context& ctx, const TransformerBlock& blk, Tensor* h, Tensor* positions,
                               int64_t B, int64_t T) {
  const TransformerConfig& c = config_;
  const int64_t H = c.heads, KV = c.kv_heads, hd = c.head_dim();
  h = lowp(ctx, h);  // one cast shared by the three projections
  // Without a bias the projections write 16 bits, which rope and flash_attention read as they are.
  auto proj = [&](Tensor* w, Tensor* bias) {
    Tensor* y = mm(ctx, h, w, false, true, bias == nullptr);
    return bias ? add(ctx, y, bias) : y;
  };
  Tensor* q = proj(blk.wq, blk.bq);  // [B*T, H*hd]
  Tensor* k = proj(blk.wk, blk.bk);  // [B*T, KV*hd]
  Tensor* v = proj(blk.wv, blk.bv);  // [B*T, KV*hd]
  q = rope(ctx, reshape(ctx, q, {B, T, H, hd}), positions, RopeMode::Normal, c.rope_theta);
  k = rope(ctx, reshape(ctx, k, {B, T, KV, hd}), positions, RopeMode::Normal, c.rope_theta);
  v = reshape(ctx, v, {B, T, KV, hd});
  const DType cd = c.compute_dtype;
  if (uses_flash_attention(c, ctx.backend())) {
    // Fused: reads q, k, v where the projections put them, no [T, T] scores, no repeated kv heads.
    auto in_dtype = [&](Tensor* x) { return x->dtype == cd && x->is_contiguous() ? x : cast(ctx, x, cd); };
    Tensor* out = flash_attention(ctx, in_dtype(q), in_dtype(k), in_dtype(v), 1.0f / std::sqrt(float(hd)));
    return reshape(ctx, out, {B * T, H * hd});
  }
  if (KV != H) {
    // Grouped-query attention: query head h reads kv head h / (H/KV). Repeating each kv head H/KV times in
    // place ([B*T, KV, 1, hd] -> [B*T, KV, H/KV, hd]) lines the heads up for a plain batched matmul; the
    // gradient of repeat sums the copies back.
    auto widen = [&](Tensor* x) {
      Tensor* x4 = reshape(ctx, x->is_contiguous() ? x : contiguous(ctx, x), {B * T, KV, 1, hd});
      const int64_t ne[kMaxDims] = {hd, H / KV, KV, B * T};
      return reshape(ctx, repeat(ctx, x4, ne), {B, T, H, hd});
    };
    k = widen(k);
    v = widen(v);
  }
  // [B, T, H, hd] -> [B, H, T, hd]: heads become a batch dim of the matmuls (ggml dims 1 and 2 swap). The
  // copy that makes them contiguous is also the cast to the compute dtype (one pass, not two).
  auto heads_major = [&](Tensor* x) { return cast(ctx, permute(ctx, x, 0, 2, 1, 3), cd); };
  Tensor* qh = heads_major(q);
  Tensor* kh = heads_major(k);
  Tensor* vh = heads_major(v);
  Tensor* scores = mm(ctx, qh, kh, false, true);  // [B, H, T_q, T_k]
  Tensor* probs = causal_softmax(ctx, scores, 1.0f / std::sqrt(float(hd)));
  Tensor* out = mm(ctx, probs, vh, false, false);  // [B, H, T, hd]
  // Back to [B, T, H, hd], then heads side by side: [B*T, H*hd] (cast on the way, like heads_major).
  return reshape(ctx, cast(ctx, permute(ctx, out, 0, 2, 1, 3), cd), {B * T, H * hd});
}

// SwiGLU's activation silu(gate(h)) * up(h) (blocks() applies the down projection). In 16 bits gate and up
// come out of their GEMMs in 16 bits and the activation is one fused pass that writes the down projection's
// operand directly.
Tensor* Transformer::mlp(Context& ctx, const TransformerBlock& blk, Tensor* h) {
  const DType cd = config_.compute_dtype;
  h = lowp(ctx, h);                                    // one cast shared by gate and up
  Tensor* gate = mm(ctx, h, blk.w_gate, false, true, true);  // [B*T, d_ff]
  Tensor* up = mm(ctx, h, blk.w_up, false, true, true);      // [B*T, d_ff]
  return cd == DType::F32 ? mul(ctx, silu(ctx, gate), up) : swiglu(ctx, gate, up, cd);
}

// The blocks over the residual stream x [B*T, d_model] (f32), ending with the final norm. In f32 each norm is
// rms_norm then mul and each residual add its own node (the graph the golden test pins). In 16 bits every
// norm is one fused node that also does the residual add before it and writes its result in the compute
// dtype, ready for the GEMMs that read it: add_rms_norm gives the new stream (f32) and the next input. A
// frozen model (forward only) adds each projection into the stream in its GEMM instead (matmul_add: the
// stream is the GEMM's C), so its norms read one f32 tensor, not two.
Tensor* Transformer::blocks(Context& ctx, Tensor* x, const std::function<Tensor*(size_t, Tensor*)>& attn) {
  const float eps = config_.norm_eps;
  const DType cd = config_.compute_dtype;
  if (cd == DType::F32) {
    for (size_t l = 0; l < blocks_.size(); ++l) {
      const TransformerBlock& blk = blocks_[l];
      Tensor* att = attn(l, mul(ctx, rms_norm(ctx, x, eps), blk.attn_norm));
      x = add(ctx, x, mm(ctx, att, blk.wo, false, true));
      Tensor* act = mlp(ctx, blk, mul(ctx, rms_norm(ctx, x, eps), blk.mlp_norm));
      x = add(ctx, x, mm(ctx, act, blk.w_down, false, true));
    }
    return mul(ctx, rms_norm(ctx, x, eps), final_norm_);  // [B*T, d_model]
  }
  // x + y·wᵀ and the norm of it in the compute dtype: the new stream and the next GEMMs' input.
  const auto residual = [&](Tensor* x, Tensor* y, Tensor* w, Tensor* norm) {
    if (frozen_.empty()) return add_rms_norm(ctx, x, mm(ctx, y, w, false, true), norm, eps, cd);
    Tensor* sum = matmul_add(ctx, lowp(ctx, y), lowp(ctx, w), x, false, true);
    return AddRmsNorm{rms_norm_affine(ctx, sum, norm, eps, cd), sum};
  };
  Tensor* h = rms_norm_affine(ctx, x, blocks_[0].attn_norm, eps, cd);
  for (size_t l = 0; l < blocks_.size(); ++l) {
    const TransformerBlock& blk = blocks_[l];
    const AddRmsNorm a = residual(x, attn(l, h), blk.wo, blk.mlp_norm);
    Tensor* next_norm = l + 1 < blocks_.size() ? blocks_[l + 1].attn_norm : final_norm_;
    const AddRmsNorm m = residual(a.sum, mlp(ctx, blk, a.y), blk.w_down, next_norm);
    x = m.sum;
    h = m.y;
  }
  return h;  // [B*T, d_model] in the compute dtype
}

Tensor* Transformer::forward(Context& ctx, Tensor* tokens) {
  return mm(ctx, hidden(ctx, tokens), lm_head_, false, true);  // [B*T, vocab]
}

Tensor* Transformer::head_input(Context& ctx, Tensor* hidden) {
  RT_CHECK(hidden != nullptr, "transformer.head_input: hidden is null");
  return lowp(ctx, hidden);
}

Tensor* Transformer::head_weight(Context& ctx) {
  RT_CHECK(&ctx == ctx_, "transformer.head_weight: ctx must be the context that holds the parameters");
  return lowp(ctx, lm_head_);
}

Tensor* Transformer::hidden(Context& ctx, Tensor* tokens) {
  RT_CHECK(&ctx == ctx_, "transformer.forward: ctx must be the context that holds the parameters");
  RT_CHECK(tokens != nullptr, "transformer.forward: tokens is null");
  RT_CHECK(is_int(tokens->dtype) && tokens->n_dims() <= 2 && tokens->ne[2] == 1 && tokens->ne[3] == 1,
           "transformer.forward: tokens must be an integer tensor [B, T], got ", tokens->describe());
  const int64_t T = tokens->ne[0], B = tokens->ne[1];
  RT_CHECK(T <= config_.context, "transformer.forward: tokens ", tokens->describe(), " has T = ", T,
           " positions, more than the model's context ", config_.context);
  Tensor* ids = tokens->is_contiguous() ? tokens : contiguous(ctx, tokens);
  ids = reshape(ctx, ids, {B * T});

  // Positions 0..T-1, shared by every sequence of the batch and every layer.
  Tensor* positions = ctx.input(DType::I32, {T}, "positions");
  std::vector<int64_t> pos(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) pos[size_t(t)] = t;
  set_data_int(positions, pos);

  Tensor* x = get_rows(ctx, tok_emb_, ids);  // the residual stream [B*T, d_model]
  return blocks(ctx, x, [&](size_t l, Tensor* h) { return attention(ctx, blocks_[l], h, positions, B, T); });
}

DType default_compute_dtype(const Backend& backend) {
  return backend.is_host() ? DType::F32 : DType::BF16;
}

Tensor* lm_loss(Context& ctx, Tensor* logits, Tensor* targets, int64_t ignore_index) {
  RT_CHECK(logits != nullptr && targets != nullptr, "lm_loss: null operand");
  RT_CHECK(targets->nelements() == logits->nrows(), "lm_loss: targets ", targets->describe(),
           " must have one ", "label per row of logits ", logits->describe());
  Tensor* labels = targets;
  if (targets->ne[0] != logits->nrows()) {
    labels = reshape(ctx, targets->is_contiguous() ? targets : contiguous(ctx, targets), {logits->nrows()});
  }
  return cross_entropy(ctx, logits, labels, ignore_index);
}

}  // namespace retort
