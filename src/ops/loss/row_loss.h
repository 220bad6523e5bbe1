// The row-loss adapter: one loss as a kind, its options and its per-row side data (LossSpec); how every loss
// node, row loss or fused linear loss, keeps those options in its slots; and the one CPU entry that runs a
// spec's row kernel. The unfused loss ops (losses.cpp), the fused linear ops (fused_linear.cpp) and both
// executors go through here, so an option reaches a row kernel by one road per backend (the CUDA one is
// src/cuda/loss/cuda_row_loss.h).
#pragma once
#include <cstdint>
#include <string>

#include "losses.h"
#include "row_kernels.h"

namespace retort {
class ThreadPool;
struct Tensor;
}  // namespace retort

namespace retort::loss {

enum class LossKind { CrossEntropy, TopK, Distill, Entropy, SelectiveLogSoftmax, TopKLogprobs };
const char* loss_kind_name(LossKind k);
// The kind of a loss node's op (a row loss op, its backward, or a fused linear loss op), from the one table
// of loss ops in row_loss.cpp. Asserts that op is one of them.
LossKind loss_kind_of(Op op);
// Whether op is a fused linear loss (a forward op of that table; not FusedLinearBack).
bool is_fused_linear_loss(Op op);

// Selective log-softmax's side data. Forward: values receives log softmax(z)[ids] [rows, K] (f32) and out.lse
// the row LSE. Backward (the executor's row_loss is given out.grad): values is the upstream gradient
// [rows, K] and lse the forward's row LSE.
struct SelectiveSide {
  Block ids;                   // [rows, K] i32 / i64
  Block values;                // [rows, K]
  const float* lse = nullptr;  // [rows] (backward)
  SelectiveSide sub_rows(int64_t r0, int64_t n) const;
};

// The loss and its per-row side data (only the member of `kind` is used). For distillation, distill.teacher
// is the teacher's logits block; with an online teacher the scheduler fills it per chunk.
struct LossSpec {
  LossKind kind = LossKind::CrossEntropy;
  CrossEntropySide ce;
  TopKSide topk;
  DistillSide distill;
  EntropySide entropy;
  SelectiveSide selective;
  TopKLogprobsSide topk_lp;
  LossSpec sub_rows(int64_t r0, int64_t n) const;
};

// Options in a node's slots.
// Slots every loss node shares (row losses and fused linear losses); a fused node keeps its own integers
// from kIpFirstFree on.
inline constexpr int kIpReduction = 0, kIpGrad = 1, kIpIgnore = 2, kIpNormalize = 3, kIpDivergence = 4;
inline constexpr int kIpFirstFree = 5;
inline constexpr int kFpTemp = 0, kFpBeta = 1, kFpHard = 2, kFpSoft = 3, kFpSmooth = 4, kFpZLoss = 5,
                     kFpCap = 6, kFpSkew = 7;

// Checks the options of loss op `op`; errors end with `context` (the op's inputs, e.g. " (logits f32[4,
// 6])").
void check_options(const char* op, const CrossEntropyOptions& o, const std::string& context);
// has_labels: labels were given (w_hard > 0 needs them).
void check_options(const char* op, const TopKDistillOptions& o, bool has_labels, const std::string& context);
void check_options(const char* op, const DistillOptions& o, bool has_labels, const std::string& context);
void check_temperature(const char* op, float t, const std::string& context);
void check_reduction(const char* op, Reduction r, const std::string& context);

// Stores the options in node's slots (the reduction is the caller's: it shapes the node).
void set_options(Tensor* node, const CrossEntropyOptions& o);
void set_options(Tensor* node, const TopKDistillOptions& o);
void set_options(Tensor* node, const DistillOptions& o);
void set_entropy_options(Tensor* node, float temperature);

// The spec of a loss of `kind` with the options node's slots hold; the side data blocks are left empty for
// the caller, who knows where the node keeps them.
LossSpec spec_from_slots(const Tensor* node, LossKind kind);

// The CPU row-loss entry.
// Checks spec's side data for `rows` rows of v logits (labels and ids in range, finite teacher logprobs) and
// returns the number of rows that count (label != ignore_index; all rows for losses without labels). Throws
// retort::Error naming `what` before anything is computed.
int64_t check_side(const LossSpec& spec, int64_t rows, int64_t v, const std::string& what);
// The row kernel of spec.kind on logits, by the contract of row_kernels.h. Selective log-softmax: forward
// without out.grad, backward (spec.selective.values the upstream gradient) with it.
void row_loss(const LossSpec& spec, const Block& logits, const RowOut& out, ThreadPool& pool);

}  // namespace retort::loss
