// Graph op constructors. Each checks shapes and dtypes (throwing retort::Error that names the op, the shapes
// and what was expected) and returns a new node in ctx; nothing is computed until Graph::compute().
// Shapes follow ggml: dim 0 is the innermost (a row); "rows" are everything else.
#pragma once
#include <cstdint>

#include "../core/context.h"
#include "../core/tensor.h"

namespace retort {

// ---- views (share storage; no copy) and copies ----------------------------------------------------------
// Same elements, new shape (outermost first). Throws unless x is contiguous and the element counts match.
Tensor* reshape(Context& ctx, Tensor* x, const Shape& shape);
// Reorders dims: axes[i] (ggml order) says which dim of the result dim i of x becomes. Like ggml_permute.
Tensor* permute(Context& ctx, Tensor* x, int a0, int a1, int a2, int a3);
// Swaps dims 0 and 1 (ggml order).
Tensor* transpose(Context& ctx, Tensor* x);
// The window [start, start + len) of dim `dim` (ggml order). Throws if it runs past the end.
Tensor* slice(Context& ctx, Tensor* x, int dim, int64_t start, int64_t len);
// A contiguous copy of x, converted to dtype (default: x's dtype).
Tensor* contiguous(Context& ctx, Tensor* x);
Tensor* cast(Context& ctx, Tensor* x, DType dtype);
// Joins a and b along dim (ggml order); other dims must match.
Tensor* concat(Context& ctx, Tensor* a, Tensor* b, int dim);
// A node filled with value, shaped like ne (ggml order). Throws for an integer dtype the value does not fit.
Tensor* fill(Context& ctx, DType dtype, const int64_t ne[kMaxDims], float value);

// ---- elementwise ------------------------------------------------------------------------------------------
// b is broadcast over a: each dim of b is 1 or equal to a's. The result has a's shape and dtype.
Tensor* add(Context& ctx, Tensor* a, Tensor* b);
Tensor* sub(Context& ctx, Tensor* a, Tensor* b);
Tensor* mul(Context& ctx, Tensor* a, Tensor* b);
Tensor* div(Context& ctx, Tensor* a, Tensor* b);
Tensor* scale(Context& ctx, Tensor* x, float s);
Tensor* neg(Context& ctx, Tensor* x);
Tensor* exp(Context& ctx, Tensor* x);
Tensor* log(Context& ctx, Tensor* x);
Tensor* sqrt(Context& ctx, Tensor* x);
Tensor* rsqrt(Context& ctx, Tensor* x);
Tensor* tanh(Context& ctx, Tensor* x);
Tensor* relu(Context& ctx, Tensor* x);
Tensor* gelu(Context& ctx, Tensor* x);  // tanh approximation
Tensor* silu(Context& ctx, Tensor* x);

// ---- reductions -------------------------------------------------------------------------------------------
// Over dim 0 (each row to one value, ne[0] becomes 1), or over all elements (one value, f32).
Tensor* sum_rows(Context& ctx, Tensor* x);
Tensor* mean_rows(Context& ctx, Tensor* x);
Tensor* max_rows(Context& ctx, Tensor* x);
Tensor* sum(Context& ctx, Tensor* x);
Tensor* mean(Context& ctx, Tensor* x);
Tensor* max(Context& ctx, Tensor* x);
// Broadcasts x to the shape ne (ggml order); each dim of x must be 1 or equal.
Tensor* repeat(Context& ctx, Tensor* x, const int64_t ne[kMaxDims]);
// Sums x down to the broadcast-compatible shape ne (the gradient of repeat).
Tensor* reduce_to(Context& ctx, Tensor* x, const int64_t ne[kMaxDims]);

// ---- linear algebra ---------------------------------------------------------------------------------------
// C = op(A) op(B), batched over dims 2 and 3 (B's batch dims may be 1 and broadcast). With A as [.., M, K]
// (rows M, row length K) and B as [.., K, N], C is [.., M, N]; transpose_a / transpose_b read A as [K, M] or
// B as [N, K] (so matmul(x, W, false, true) is x Wᵀ for W [out, in]). The result is f32.
Tensor* matmul(Context& ctx, Tensor* a, Tensor* b, bool transpose_a = false, bool transpose_b = false);
// matmul for mixed-precision training: a and b must share a 16-bit float dtype (bf16 or f16). The forward is
// matmul's (f32 accumulation, f32 result); the backward also rounds the upstream gradient to that dtype, so
// the two gradient GEMMs run on 16-bit operands too (tensor cores on CUDA) where matmul's would run in f32.
// The gradients it hands back are f32. out = the operands' dtype writes the result in 16 bits (accumulated
// in f32, rounded once), for a consumer that reads 16 bits anyway (no f32 round trip, no cast after).
Tensor* matmul_lowp(Context& ctx, Tensor* a, Tensor* b, bool transpose_a = false, bool transpose_b = false,
                    DType out = DType::F32);
// op(A) op(B) + c in one GEMM (c is its C: no separate add pass), 2-D only: c f32, contiguous, shaped like the
// f32 result. a and b are both f32 (matmul's numerics) or share a 16-bit dtype (matmul_lowp's). The gradient
// of c is the upstream gradient.
Tensor* matmul_add(Context& ctx, Tensor* a, Tensor* b, Tensor* c, bool transpose_a = false,
                   bool transpose_b = false);

// ---- indexing ---------------------------------------------------------------------------------------------
// Rows of table [R, D] at integer ids [N] (i32 or i64) -> [N, D]. Ids outside [0, R) throw at run time.
Tensor* get_rows(Context& ctx, Tensor* table, Tensor* ids);
// Writes the rows of src [.., n, D] into dst [.., R, D] at the integer ids rows [n] (i32 or i64; or
// [B3, B2, n], each batch dim 1 or src's), in place: row i of batch (i2, i3) of src lands in row rows[i] of
// the same batch of dst, converted to dst's dtype; other rows keep their values. dst must be a leaf (or a
// view of one), such as a KV cache; the result aliases it, so read the cache through the result to see the
// write. Ids must be distinct within a batch (which of two rows with one id lands is unspecified). Throws
// on bad shapes or dtypes; an id outside [0, R) throws when the graph runs (on the CPU before any row is
// written; on CUDA at the next synchronize, the rows with good ids written). Not differentiable.
Tensor* set_rows(Context& ctx, Tensor* dst, Tensor* src, Tensor* rows);

// ---- softmax family (over dim 0) --------------------------------------------------------------------------
Tensor* softmax(Context& ctx, Tensor* x);
Tensor* log_softmax(Context& ctx, Tensor* x);
// Attention scores x [batch*heads, T_q, T_k] (rows are queries): softmax(x * scale) with key j hidden from
// query i when j > i + n_past.
Tensor* causal_softmax(Context& ctx, Tensor* x, float scale, int64_t n_past = 0);

// ---- attention --------------------------------------------------------------------------------------------
// softmax(q kᵀ · scale) v per head without storing the [T_q, T_k] scores (flash-style: the backward recomputes
// them from a saved per-row log-sum-exp). q is [B, T_q, H, D] and k, v are [B, T_k, KV, D] (ggml: ne0 = D,
// ne1 = heads, ne2 = T), contiguous, one float dtype; KV divides H and query head h reads kv head h / (H/KV).
// Causal: key j is visible to query i when j <= i + n_past (n_past = T_k − T_q after a KV cache; a negative
// n_past leaves early rows without keys: their output is 0). Returns [B, T_q, H, D] in q's dtype; the gradients
// of q, k and v come in their dtype. CUDA: bf16 and f16 with D in {16, 32, 64, 96, 128}.
Tensor* flash_attention(Context& ctx, Tensor* q, Tensor* k, Tensor* v, float scale, bool causal = true,
                        int64_t n_past = 0);
// The log-sum-exp [B, H, T_q] (f32, of the scaled scores; -inf for a row without keys) that a flash_attention
// node saves for its backward.
Tensor* flash_attention_lse(Tensor* attention);

// ---- top-K selection (over dim 0) -----------------------------------------------------------------------
struct TopKLogprobs {
  Tensor* logprobs = nullptr;  // f32 [N, K]: log softmax(row) at the K largest entries, best first
  Tensor* ids = nullptr;       // i32 [N, K]: their columns; equal values give the smaller id first
};
// The K largest entries of each row of logits [N, V] (f32, bf16 or f16, strided welcome) as log-softmax
// values with their ids, best first; not differentiable. -inf entries are fine (a row of -inf only gives
// logprobs -inf and ids 0..K-1). Throws retort::Error for non-2-D or non-float logits and K outside [1, V]
// (build time), and for a NaN or +inf logit (run time; the CUDA kernel also for K > 2048).
TopKLogprobs topk_logprobs(Context& ctx, Tensor* logits, int64_t k);

// ---- normalization over dim 0 (no affine part: multiply by a weight with mul)
// ------------------------------
Tensor* rms_norm(Context& ctx, Tensor* x, float eps = 1e-6f);
Tensor* layer_norm(Context& ctx, Tensor* x, float eps = 1e-5f);

// ---- fused layers (one pass each; src/ops/fused_layers.cpp) ----------------------------------------------
// rms_norm(x) · w over dim 0 in one pass, written in dtype out (f32, bf16 or f16; the compute dtype of the
// GEMM that reads it); x is any float tensor (the f32 residual stream), w a float vector [ne0]. Math in f32,
// the row statistic in double on the CPU. Gradients: x's in f32, w's summed over rows deterministically.
// Throws for shapes or dtypes that do not fit.
Tensor* rms_norm_affine(Context& ctx, Tensor* x, Tensor* w, float eps, DType out);
struct AddRmsNorm {
  Tensor* y = nullptr;    // rms_norm_affine(sum, w, eps, out)
  Tensor* sum = nullptr;  // x + delta (f32): the residual stream after the add
};
// The residual add fused into the norm that follows it: sum = x + delta (f32) and y = rms_norm_affine(sum)
// from one pass; both are differentiable (sum is an aux output of y's node). delta must be shaped like x.
AddRmsNorm add_rms_norm(Context& ctx, Tensor* x, Tensor* delta, Tensor* w, float eps, DType out);
// silu(gate) · up elementwise in one pass, written in dtype out (math in f32); gate and up are float tensors
// of one shape. Its backward writes dgate and dup (in gate's and up's dtypes) in one pass.
Tensor* swiglu(Context& ctx, Tensor* gate, Tensor* up, DType out);

// ---- rotary position embedding ----------------------------------------------------------------------------
enum class RopeMode : int64_t { Normal = 0, Neox = 2 };
// x is [B, T, heads, d] (ggml: ne0 = d, ne1 = heads, ne2 = T); positions are i32 [T]. Normal rotates pairs
// (2i, 2i+1); Neox rotates (i, i + d/2). d must be even.
Tensor* rope(Context& ctx, Tensor* x, Tensor* positions, RopeMode mode = RopeMode::Normal,
             float theta = 10000.0f);

// ---- plain cross-entropy ----------------------------------------------------------------------------------
// Mean over rows whose label != ignore_index of -log softmax(logits)[label]; logits [N, V], labels int [N].
// Labels outside [0, V) other than ignore_index throw at run time. All rows ignored gives 0.
Tensor* cross_entropy(Context& ctx, Tensor* logits, Tensor* labels, int64_t ignore_index = -100);

}  // namespace retort
