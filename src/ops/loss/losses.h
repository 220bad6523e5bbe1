// The loss backend's row losses as graph nodes: cross-entropy with its LM-training options, top-K and
// full-vocabulary distillation, entropy and selective log-softmax. Each is one node; when it is
// differentiated, its forward pass also writes the logits gradient (see "The loss backend" in DESIGN.md and
// row_kernels.h), so a loss that is the graph's loss costs one pass over the logits for forward and backward
// together.
//
// Shapes are written outermost first: logits [N, V] are N rows of V logits (2-D; reshape [B, T, V] first).
// Math is f32 whatever the storage (f32, bf16, f16; strided views welcome); outputs are f32.
// Extra outputs (per_row, lse, hard, soft) are computed only when asked for in the options. They are marked
// as outputs, so the planner keeps them; hard and soft are views: add them to the graph with Graph::forward
// like any other result you read. They carry no gradient (backward through them throws). Teacher inputs
// (teacher logits, logprobs, mask) are constants: backward throws retort::Error if one of them is a parameter
// or computed from one.
#pragma once
#include <cstdint>

#include "../../core/context.h"
#include "../../core/tensor.h"

namespace retort {

enum class Reduction : int64_t {
  Mean,  // over the valid rows (label != ignore_index); 0 when there are none
  Sum,
  None,  // one value per row, 0 for ignored rows
};

struct LossOutputs {
  Tensor* loss = nullptr;     // f32 scalar (Mean / Sum) or [N] (None)
  Tensor* per_row = nullptr;  // f32 [N] per-row loss (return_per_row; the loss itself under None)
  Tensor* lse = nullptr;      // f32 [N] per-row log-sum-exp of the student at the loss's temperature
  Tensor* hard = nullptr;  // distillation: cross-entropy part, unweighted, reduced like loss (return_parts)
  Tensor* soft = nullptr;  // distillation: divergence × T² part, unweighted, reduced like loss (return_parts)
};

struct CrossEntropyOptions {
  int64_t ignore_index = -100;
  float label_smoothing = 0.0f;  // eps in [0, 1]: (1 − eps)·CE + eps·mean_j(−log q_j)
  float z_loss = 0.0f;           // >= 0: adds z_loss·lse² per row
  float softcap = 0.0f;          // > 0: logits become c·tanh(z/c) before everything; 0: off
  Reduction reduction = Reduction::Mean;
  bool return_per_row = false;
  bool return_lse = false;  // LSE of the (softcapped) logits, every row, ignored ones too
};

// Cross-entropy of logits [N, V] against integer labels [N] (i32 / i64). Throws retort::Error on bad shapes
// or options at build time, and at run time for a label outside [0, V) that is not ignore_index.
LossOutputs cross_entropy_loss(Context& ctx, Tensor* logits, Tensor* labels,
                               const CrossEntropyOptions& opts = {});

// The divergence D(P, Q) between teacher P and student Q that a distillation loss takes.
enum class Divergence : int64_t {
  Kl,             // by beta: 0 forward KL(P‖Q), 1 reverse KL(Q‖P), between the generalized JSD (TRL/GKD)
  Tvd,            // total variation distance ½·Σ |p − q|
  SkewKl,         // skew forward KL(P ‖ α·P + (1 − α)·Q) (DistiLLM), α = skew_alpha
  SkewReverseKl,  // skew reverse KL(Q ‖ (1 − α)·P + α·Q) (DistiLLM), α = skew_alpha
};

struct TopKDistillOptions {
  Divergence divergence = Divergence::Kl;
  float beta = 0.0f;  // Divergence::Kl: 0 forward KL(P‖Q); 1 reverse KL(Q‖P); between: generalized JSD
  float skew_alpha = 0.1f;      // the skew divergences' α in [0, 1] (0: plain KL)
  float temperature = 1.0f;     // > 0: student z/T; teacher renormalized over its valid slots at T ≠ 1;
                                // the soft loss and its gradient are multiplied by T²
  bool normalize_topk = false;  // Q = softmax over the valid teacher slots instead of over V
  float w_hard = 0.0f;          // weight of CE(z, label) at T = 1 (needs labels)
  float w_soft = 1.0f;          // weight of the divergence
  int64_t ignore_index = -100;  // rows with this label contribute nothing
  Reduction reduction = Reduction::Mean;
  bool return_per_row = false;
  bool return_lse = false;    // LSE_V(z/T), every row
  bool return_parts = false;  // hard and soft
};

// Top-K distillation of student logits [N, V] against a teacher's top-K: ids int [N, K], logprobs float [N,
// K], mask [N, K] (any dtype, nonzero = valid; may be null), labels int [N] (may be null unless w_hard > 0).
// A slot with mask 0 or logprob −inf is padding; a row without valid slots has no divergence. Mean divides by
// the rows whose label != ignore_index (all N without labels). Throws retort::Error at build time on bad
// shapes, K > V, T <= 0, beta or skew_alpha outside [0, 1], an unknown divergence, negative weights; at run
// time on a label or a valid slot's id outside [0, V).
LossOutputs topk_kd(Context& ctx, Tensor* logits, Tensor* teacher_ids, Tensor* teacher_logprobs, Tensor* mask,
                    Tensor* labels, const TopKDistillOptions& opts = {});

struct TopKKLOptions {
  float temperature = 1.0f;
  Reduction reduction = Reduction::Mean;  // Mean over all N rows
  bool return_per_row = false;
  bool return_lse = false;  // LSE over the valid slots of the gathered logits / T (0 for a row without any)
};

// Forward KL(P‖Q)·T² where the student logits are already gathered at the teacher ids: student [N, K],
// Q = softmax over the valid slots of student/T; P from teacher_logprobs [N, K] as in topk_kd; mask may be
// null. Throws retort::Error on bad shapes or T <= 0.
LossOutputs topk_kl_gathered(Context& ctx, Tensor* student_gathered, Tensor* teacher_logprobs, Tensor* mask,
                             const TopKKLOptions& opts = {});

struct DistillOptions {
  Divergence divergence = Divergence::Kl;  // as in topk_kd
  float beta = 0.0f;                       // as in topk_kd
  float skew_alpha = 0.1f;                 // as in topk_kd
  float temperature = 1.0f;
  float w_hard = 0.0f;
  float w_soft = 1.0f;
  int64_t ignore_index = -100;
  Reduction reduction = Reduction::Mean;
  bool return_per_row = false;
  bool return_lse = false;  // LSE_V(student/T)
  bool return_parts = false;
};

// Full-vocabulary distillation: P = softmax(teacher/T), Q = softmax(student/T), student and teacher [N, V],
// labels int [N] or null. Per row w_hard·CE(student, label) at T = 1 + w_soft·T²·D(P, Q), D as in topk_kd.
// Throws retort::Error on bad shapes or options (build time) and labels out of range (run time).
LossOutputs distill(Context& ctx, Tensor* student, Tensor* teacher, Tensor* labels,
                    const DistillOptions& opts = {});

// Entropy of softmax(logits/T) per row: [N] under Reduction::None, else the mean or sum over rows (a scalar).
// Throws retort::Error on bad shapes or T <= 0.
Tensor* entropy(Context& ctx, Tensor* logits, float temperature = 1.0f,
                Reduction reduction = Reduction::None);

// log softmax(logits)[ids]: logits [N, V], ids int [N, K] -> f32 [N, K]. Ids outside [0, V) throw at run time
// before anything is computed. The backward is one dense pass over the logits with the scatter fused in.
Tensor* selective_log_softmax(Context& ctx, Tensor* logits, Tensor* ids);

// The gradient of a reduced row loss with respect to its student logits, d(loss)/d(logits) [N, V], written by
// the loss's own forward pass with no graph backward and no f32 [N, V] accumulator: into a new tensor of
// dtype (f32, bf16 or f16), or with in_place over the student logits themselves (contiguous, of dtype, not a
// view; nothing may read them after the loss). loss: LossOutputs::loss of cross_entropy_loss, topk_kd,
// topk_kl_gathered or distill, or entropy's result, under Mean or Sum. Throws retort::Error otherwise, or
// when the gradient of that loss was already asked for. A graph backward through the same loss is then
// refused.
Tensor* logits_grad(Context& ctx, Tensor* loss, DType dtype = DType::F32, bool in_place = false);

// The gradient of selective_log_softmax's output `values` [N, K] with respect to its logits, given the
// gradient of the output, grad_output [N, K] (float): [N, V] of dtype, in one pass over the logits.
Tensor* selective_log_softmax_grad(Context& ctx, Tensor* values, Tensor* grad_output,
                                   DType dtype = DType::F32);

}  // namespace retort
