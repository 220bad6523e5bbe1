// Fused linear losses: the lm-head matmul and a loss of losses.h as ONE graph node that never holds the
// [N, V] logits. The rows are processed in chunks (see "Fused linear losses" in DESIGN.md and
// chunk_scheduler.h): per chunk the logits hidden_c · Wᵀ (+ bias) are computed into a bounded scratch, the
// row loss runs on them and, when the node is differentiated, writes the logits gradient in place, from which
// the gradients of hidden, W and bias are accumulated before the next chunk. A loss that is the graph's loss
// gets all its gradients from its forward pass; its backward only scales them by the upstream gradient.
//
// Shapes are outermost first: hidden [N, H] (reshape [B, T, H] first), W [V, H] (the nn.Linear layout: one
// row per vocabulary entry), bias [V] or null. Inputs may be f32, bf16 or f16 (strided views welcome); the
// GEMMs accumulate in f32, the losses are f32, the gradients are f32. Each function equals its unfused
// composition, loss(matmul(hidden, W, false, true) + bias, ...), up to f32 rounding, and the result does not
// depend on the chunk size beyond f32 rounding.
//
// Extra outputs (per_row, lse, hard, soft) work as in losses.h: asked for in the options, marked as outputs,
// views to add to the graph with Graph::forward; they carry no gradient. Teacher inputs (logprobs, mask,
// teacher hidden / W / bias) are constants: backward throws retort::Error if one of them needs a gradient.
//
// Reduction::None and selective log-softmax have an upstream gradient per row (per element), which the
// forward cannot know: their backward is a second chunked pass that recomputes the logits.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>

#include "losses.h"

namespace retort {

// logits_budget 0 (the default): derived from the memory free on the backend the op runs on, read when a
// fused op first runs there (so every later step chunks alike): an eighth of it, at least 32 MiB and at most
// 1 GiB on a GPU (on an 80 GB H100: 1 GiB, chunks of 8,192 rows of GPT-2's vocabulary in bf16; with 4 GB
// free, 512 MiB; larger budgets measured no faster: bench/HISTORY.md, session 19) or 256 MiB on the CPU (its
// scratch cache: larger chunks gain nothing there). Set a budget for runs that must chunk alike on every
// machine (results depend on the chunk size only through f32 rounding).
inline constexpr size_t kFusedLinearAutoBudget = 0;
inline constexpr size_t kFusedLinearAutoMin = size_t(32) << 20;
inline constexpr size_t kFusedLinearAutoMaxGpu = size_t(1) << 30, kFusedLinearAutoMaxCpu = size_t(256) << 20;
// The automatic budget for `free_bytes` of free memory (0: unknown) and a backend's cap.
constexpr size_t fused_linear_auto_budget(size_t free_bytes, size_t cap) {
  const size_t b = free_bytes / 8;
  return b < kFusedLinearAutoMin ? kFusedLinearAutoMin : b > cap ? cap : b;
}

struct FusedLinearOptions {
  // Bytes of chunk logits, and only those (hence the name): the student's, plus the teacher's when computed
  // online, the CUDA executor's 16-bit copy of their gradient, and the zero-padded weight copies made for
  // them. At most budget / (es·Vp·(1 or 2)) rows fit (es = 4 for f32 logits, 2 for 16-bit ones, see
  // logits_dtype; Vp = V rounded up to 128; the K-sparse top-K path: budget / (4·K)); the chunks are the
  // fewest that allows, evened out and rounded up to a multiple of 128 rows where that still fits, at least 1
  // row and at most N. Not counted:
  // the gradients themselves (f32, shaped like hidden, W and bias), per-row vectors, and a backend's own
  // temporaries (on the CPU: GEMM packing buffers, an 8 MiB staging block for dW, and the chunk's hidden rows
  // as f32 on the K-sparse path).
  // (0: automatic, from the backend's free memory; see kFusedLinearAutoBudget.)
  size_t logits_budget = kFusedLinearAutoBudget;
  int64_t chunk_rows = 0;  // > 0: exactly this many rows per chunk, overriding the budget (tests, tuning)
  // Which gradients flow. Off: no gradient reaches that input through this loss, as if it were detached
  // (e.g. a frozen lm-head tied to a trained embedding). On: produced when the input needs one.
  bool grad_hidden = true;
  bool grad_weight = true;
  bool grad_bias = true;
  // The dtype the chunk logits (and an online teacher's) are kept in: F32, BF16 or F16 (anything else throws
  // retort::Error naming the op). Unset, the default: the inputs' own dtype when the GEMM operands (hidden
  // and W, and an online teacher's hidden and W) all share one 16-bit dtype, else F32 — what PyTorch's 16-bit
  // training does. A 16-bit logits row takes 2 bytes per entry instead of 4 (+ 2 for the CUDA executor's
  // 16-bit gradient copy), so a budget holds 3x the rows (fewer passes over the f32 dW in its accumulating
  // GEMM) and the row loss moves a third of the bytes.
  // What it changes where it applies: each logit is the f32-accumulated GEMM rounded to 16 bits (the bias
  // is then added in f32 and the sum rounded again); the row loss reads them into f32 math; the logits
  // gradient is written in 16 bits over them, in place, and the gradient GEMMs read it from there. Loss and
  // LSE then differ from the f32 path by about 2^-9·|logit| (~1e-3 relative); the gradients by as much.
  // It applies when the backend supports it: the CUDA backend, when the GEMM operands are all of the logits
  // dtype. Everywhere else the logits stay f32 and the results are those of F32: for selective log-softmax
  // (its backward needs f32 log-probabilities), on the K-sparse top-K path (which has no logits block), and
  // on the CPU, whose executor always keeps f32 logits, with one exception: asked for BF16, its gradient
  // GEMMs read the f32 logits gradient rounded to bf16 beside bf16 hidden states and weights (the bf16 GEMM,
  // twice the f32 rate on an AMD CPU with AVX-512 BF16), so the loss is F32's and the gradients differ from
  // F32's by bf16 rounding.
  std::optional<DType> logits_dtype;
};

// Cross-entropy of hidden · Wᵀ (+ bias) against integer labels [N]; options as cross_entropy_loss. Throws
// retort::Error on bad shapes or options (build time) and labels out of range (run time).
LossOutputs fused_linear_cross_entropy(Context& ctx, Tensor* hidden, Tensor* weight, Tensor* bias,
                                       Tensor* labels, const CrossEntropyOptions& opts = {},
                                       const FusedLinearOptions& fused = {});

// Top-K distillation of the student logits hidden · Wᵀ (+ bias) against a teacher's top-K, as topk_kd:
// ids int [N, K], logprobs float [N, K], mask [N, K] or null, labels int [N] or null. With normalize_topk
// on, w_hard = 0, no return_lse and no hard part asked for with labels, the loss reads only the K student
// logits at the teacher ids: they are computed as K dot products per row, and the gradients as K-sparse
// updates, with no full-vocabulary GEMM (dW then accumulates per vocabulary entry in row order, so it is
// the same for every chunk size).
LossOutputs fused_linear_topk_kd(Context& ctx, Tensor* hidden, Tensor* weight, Tensor* bias,
                                 Tensor* teacher_ids, Tensor* teacher_logprobs, Tensor* mask, Tensor* labels,
                                 const TopKDistillOptions& opts = {}, const FusedLinearOptions& fused = {});

// Full-vocabulary distillation against an online teacher: student logits hidden · Wᵀ (+ bias), teacher
// logits teacher_hidden [N, Ht] · teacher_weightᵀ [V, Ht] (+ teacher_bias [V] or null), computed chunk by
// chunk beside the student's; options and labels as distill.
LossOutputs fused_linear_distill(Context& ctx, Tensor* hidden, Tensor* weight, Tensor* bias,
                                 Tensor* teacher_hidden, Tensor* teacher_weight, Tensor* teacher_bias,
                                 Tensor* labels, const DistillOptions& opts = {},
                                 const FusedLinearOptions& fused = {});

// Entropy of softmax((hidden · Wᵀ + bias) / T) per row, reduced as entropy().
Tensor* fused_linear_entropy(Context& ctx, Tensor* hidden, Tensor* weight, Tensor* bias,
                             float temperature = 1.0f, Reduction reduction = Reduction::None,
                             const FusedLinearOptions& fused = {});

// log softmax(hidden · Wᵀ + bias)[ids]: ids int [N, K] -> f32 [N, K], as selective_log_softmax.
Tensor* fused_linear_selective_log_softmax(Context& ctx, Tensor* hidden, Tensor* weight, Tensor* bias,
                                           Tensor* ids, const FusedLinearOptions& fused = {});

// The teacher head: the top K of each row of hidden · Wᵀ as log-probabilities, with their ids, the summed
// negative log-likelihood of the targets and optionally the row LSE, in chunks, without the [N, V] logits.
struct TopKLogprobsOutputs {
  Tensor* logprobs = nullptr;  // f32 [N, K]: z − LSE(z), best first
  Tensor* ids = nullptr;       // i32 [N, K]: their vocabulary ids (equal logits: smaller id first)
  Tensor* nll_sum = nullptr;  // f32 scalar: Σ over rows with a target ≠ ignore_index of LSE(z) − z_target;
                              // null when no targets were given
  Tensor* lse = nullptr;  // f32 [N]: LSE(z) per row (return_lse), else null
};

struct TopKLogprobsOptions {
  int64_t ignore_index = -100;  // targets with this value add nothing to nll_sum
  bool return_lse = false;
};

// logits z = hidden [N, H] · weight [V, H]ᵀ, chunk by chunk (fused.logits_budget / chunk_rows as for the
// losses; the chunk logits are f32 unless fused.logits_dtype asks for 16 bits), one pass over each chunk's
// logits giving the top K, the LSE and the target logit of every row. Equals topk_logprobs(z, k) and
// cross_entropy_loss(z, targets, Sum) of the same logits (the same ids and order; values up to f32 rounding).
// targets: int [N] or null. Forward only: backward through any output throws retort::Error. Throws
// retort::Error at build time on bad shapes or dtypes, K outside [1, V]; at run time on a target outside
// [0, V) that is not ignore_index, and on NaN or +inf logits.
TopKLogprobsOutputs fused_linear_topk_logprobs(Context& ctx, Tensor* hidden, Tensor* weight, int64_t k,
                                               Tensor* targets, const TopKLogprobsOptions& opts = {},
                                               const FusedLinearOptions& fused = {});

}  // namespace retort
