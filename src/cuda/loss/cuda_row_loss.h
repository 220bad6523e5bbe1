// The CUDA row-loss entry: a loss::LossSpec (src/ops/loss/row_loss.h) run by its CUDA row kernels
// (row_losses.h, distill_rows.h) on a block of logits. The one place where a loss's options and side data
// become the arguments of its kernels, for the unfused loss ops (cuda_loss_ops.cu) and the chunk executor of
// the fused linear losses (cuda_chunk_exec.cu) alike. Host-only header.
#pragma once
#include <cstddef>
#include <functional>

#include "../../core/op.h"
#include "../../ops/loss/row_loss.h"
#include "distill_rows.h"
#include "row_losses.h"

namespace retort::cuda {

struct CudaExec;

// Device memory for a launch's temporaries, valid until the work queued on the stream has run.
using TempFn = std::function<void*(size_t bytes)>;

// Side data in the row kernels' form: a [rows, K] block, or a [rows, 1] one read as a vector.
SideMatrix side(const loss::Block& b);
SideMatrix side_vec(const loss::Block& b);

// Queues spec's row kernel on ex's stream. b holds the logits (dim-0-contiguous rows), the gradient (or
// none), the gradient's scale and the per-row loss and lse; hard and soft receive the distillation losses'
// parts (may be null). A bad label or id goes to ex's device error record, naming op. Selective
// log-softmax: the forward (b.grad null) writes log softmax(z)[ids] into spec.selective.values (contiguous
// f32); the backward reads the upstream gradient from there and the forward's LSE from spec.selective.lse.
// Throws retort::Error on a layout its kernels cannot read.
void row_loss(CudaExec& ex, const loss::LossSpec& spec, RowBlock& b, float* hard, float* soft, Op op,
              const TempFn& temp);

}  // namespace retort::cuda
