// The optimizer as graph ops (like ggml's OPT_STEP_ADAMW, but over every parameter at once): the global
// gradient norm with its clip scale, and the AdamW and SGD updates. Each is one node that reads and writes
// leaves (parameters, gradient accumulators, optimizer state) through a table of chunks, so a step costs a
// few kernel launches whatever the number of parameters, and nothing is read back to the host: the norm,
// the clip scale and whether the step may be applied stay on the device, in a small stats leaf the update
// reads. src/nn/optim.h builds these for AdamW and Sgd; most callers want that, not these.
#pragma once
#include <vector>

#include "../core/context.h"
#include "../core/tensor.h"

namespace retort {

// Elements per chunk of the table: the unit of work of a thread (CPU) or a block (CUDA), and of the norm's
// partial sums, so the norm does not depend on the thread count or the device.
inline constexpr int64_t kOptChunk = int64_t(1) << 16;

// Row layout of a chunk table (I64 [chunks, kOptCols]): addresses are of the chunk's first element.
enum OptCol : int { kOptParam = 0, kOptGrad, kOptState1, kOptState2, kOptCount, kOptDType, kOptCols };

// The stats leaf (F32 [kOptStats]) grad_norm_op writes and the updates read.
enum OptStat : int { kStatLoss = 0, kStatNorm, kStatScale, kStatOk, kOptStats };

// One tensor set of the table: a parameter (may be null for a norm over gradients only), its f32 gradient,
// and up to two f32 state tensors of its shape (AdamW's m and v, SGD's momentum; null when absent).
struct OptSlot {
  Tensor* param = nullptr;
  const Tensor* grad = nullptr;
  Tensor* state1 = nullptr;
  Tensor* state2 = nullptr;
};

// A chunk table over slots, made in ctx (a leaf on ctx's backend, written once: the tensors' addresses do not
// change). Throws retort::Error, starting with `who`, on an empty list, a gradient or state that is not a
// contiguous f32 leaf with the parameter's element count, a parameter that is not a contiguous float leaf, or
// a tensor on another backend than ctx's.
Tensor* optimizer_table(Context& ctx, const std::vector<OptSlot>& slots, const char* who);

// A stats leaf in ctx: {loss 0, norm 0, scale 1, ok 1}, what an update reads when no norm runs before it.
Tensor* optimizer_stats(Context& ctx);
// The scratch grad_norm_op needs for table (I64 [chunks + 1]: per-chunk sums of squares as doubles, then
// their total).
Tensor* optimizer_scratch(Context& ctx, const Tensor* table);

// Writes into stats {loss (0 without one), the global L2 norm of every gradient of table, the clip scale
// min(1, max_norm / norm) (1 when max_norm is 0 or the norm is not finite), ok: 1 when the norm and the loss
// are finite}; with apply, also scales the gradients by it in place (clip_grad_norm). The total sum of
// squares (double) is left in scratch's last element. The node aliases stats.
// max_norm is kept as a double (in ip[1]'s bits), so the scale is float(max_norm / norm) exactly as a caller
// computing it in double would. Throws retort::Error on bad operands or a max_norm that is negative or not
// finite.
Tensor* grad_norm_op(Context& ctx, Tensor* stats, Tensor* table, Tensor* scratch, Tensor* loss,
                     double max_norm, bool apply);

// AdamW over table (m = state1, v = state2) with the gradient scaled by stats' scale, skipped entirely when
// stats' ok is 0. hparams (F32 [kAdamWHparams]) holds what changes every step, written by the host before
// each run (no synchronization): {lr, lr / (1 - beta1^t), 1 / sqrt(1 - beta2^t), 1 - lr * weight_decay}.
// The node aliases stats.
inline constexpr int64_t kAdamWHparams = 4;
Tensor* adamw_step_op(Context& ctx, Tensor* stats, Tensor* table, Tensor* hparams, float beta1, float beta2,
                      float eps);

// SGD over table (momentum buffer = state1, or none): d = g·scale + weight_decay·p; buf = momentum·buf + d
// when there is one; p -= lr·d (or buf). hparams F32 [1] = {lr}. Skipped when stats' ok is 0. Aliases stats.
Tensor* sgd_step_op(Context& ctx, Tensor* stats, Tensor* table, Tensor* hparams, float momentum,
                    float weight_decay);

}  // namespace retort
