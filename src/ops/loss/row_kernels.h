// Row losses: the one contract every loss kernel follows — the CPU kernels here, the CUDA kernels, and the
// chunked fused-linear scheduler, which calls the same kernels on a chunk of rows at a time.
//
// Contract. A row kernel gets a block of logits [rows, V] (f32, bf16 or f16; rows and elements may be
// strided) and the per-row side data of its loss, and for every row writes
//   - the per-row loss (f32) into out.loss (the weighted total: w_hard·hard + w_soft·soft for distillation),
//   - the per-row log-sum-exp (f32) into out.lse: LSE_j(z_j / T) of the student row at the loss's temperature
//     (T = 1 and after the softcap for cross-entropy; over the valid slots for the gathered top-K loss),
//   - for the distillation losses, the unweighted hard (cross-entropy at T = 1) and soft (divergence × T²)
//     parts into out.hard / out.soft,
//   - when out.grad is set, d(loss)/d(logits) multiplied by out.grad_scale, the reduction factor known before
//     the pass (1 / number of valid rows for a mean, 1 for a sum, times any weight). The gradient block may
//     alias the logits block exactly (same data, dtype and strides): each row is read before it is written.
// Any out pointer may be null (not wanted); a null lse is not computed unless the loss needs it. Ignored rows
// (label == ignore_index) get loss 0, hard/soft 0, a zero gradient row, and their lse only when asked for.
//
// Math is in f32. The softmax normalizers come from one online pass over the row (running max and sum, both
// temperatures at once where a loss needs two); a second pass writes the gradient. Losses that need the
// normalized probabilities of every element (reverse KL and JSD over the full vocabulary) take one more pass
// over the row, which on the CPU is an f32 copy in cache, so each row is read from memory once either way.
//
// Validation is separate from computation: check_* scans the side data once (labels and ids in range), throws
// retort::Error before anything is computed, and returns the number of valid rows, so a caller that chunks
// the rows knows the mean's scale before the first chunk. The *_rows functions trust their input.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "../../core/dtype.h"
#include "losses.h"

namespace retort {
class ThreadPool;
}

namespace retort::loss {

// A strided 2-D block: element (r, c) lives at data + r * row_stride + c * col_stride (bytes).
struct Block {
  void* data = nullptr;
  DType dtype = DType::F32;
  int64_t rows = 0, cols = 0;
  size_t row_stride = 0, col_stride = 0;

  bool empty() const { return data == nullptr; }
  char* row(int64_t r) const { return static_cast<char*>(data) + size_t(r) * row_stride; }
  // The rows [r0, r0 + n) (an empty block stays empty).
  Block sub_rows(int64_t r0, int64_t n) const;
  // A contiguous row-major block.
  static Block dense(void* data, DType dtype, int64_t rows, int64_t cols);
};

// Where a row kernel writes. Pointers index the block's rows: out.loss[r] is row r.
struct RowOut {
  float* loss = nullptr;  // [rows] per-row loss
  float* lse = nullptr;   // [rows] per-row log-sum-exp
  float* hard = nullptr;  // [rows] distillation: unweighted cross-entropy (0 unless labels are given)
  float* soft = nullptr;  // [rows] distillation: unweighted divergence × T²
  Block grad;             // [rows, V] float; empty: no gradient
  float grad_scale = 1.0f;
  // The same outputs for the rows [r0, r0 + n).
  RowOut sub_rows(int64_t r0, int64_t n) const;
};

// Cross-entropy.
// Row loss with s = softcap > 0 ? c·tanh(z/c) : z, lse = LSE(s), y = label:
//   (1 − eps)·(lse − s_y) + eps·(lse − mean_j s_j) + z_loss·lse²
struct CrossEntropySide {
  Block labels;  // [rows, 1] i32 / i64
  int64_t ignore_index = -100;
  float label_smoothing = 0.0f;  // eps in [0, 1]
  float z_loss = 0.0f;
  float softcap = 0.0f;  // 0: off
  CrossEntropySide sub_rows(int64_t r0, int64_t n) const;
};
// what: the op and shapes for messages. Returns the number of rows whose label != ignore_index.
int64_t check_cross_entropy(const CrossEntropySide& side, int64_t v, const std::string& what);
void cross_entropy_rows(const Block& logits, const CrossEntropySide& side, const RowOut& out,
                        ThreadPool& pool);

// Divergences.
// D(P, Q) over a row's slots (top-K) or its vocabulary (full), as a sum of per-entry terms of the teacher
// log p and the student log q; each kernel also needs dD/d(log q) per entry (the chain rule through the
// softmax does the rest, the same for every divergence):
//   Kl, beta = 0: Σ p (log p − log q);  beta = 1: Σ q (log q − log p);  otherwise, m = beta·p + (1 − beta)·q:
//       beta·Σ p (log p − log m) + (1 − beta)·Σ q (log q − log m)
//   Tvd: ½·Σ |p − q|;  dD/d(log q) = ½·sign(q − p)·q
//   SkewKl: Σ p (log p − log m), m = α·p + (1 − α)·q;  dD/d(log q) = −(1 − α)·p·q / m
//   SkewReverseKl: Σ q (log q − log m), m = (1 − α)·p + α·q;  dD/d(log q) = q·(log q − log m + 1 − α·q / m)
// A term whose weight (p or q) is 0 is 0, so 0·log 0 never makes a NaN.
struct DivergenceSpec {
  Divergence kind = Divergence::Kl;
  float beta = 0.0f;   // Kl
  float alpha = 0.1f;  // SkewKl, SkewReverseKl
  // Forward KL, whose gradient needs no row-wide sum: the kernels' fast paths take only it.
  constexpr bool forward_kl() const { return kind == Divergence::Kl && beta == 0.0f; }
};

// Top-K distillation.
// Slot k of a row is valid when mask[k] != 0 (or no mask) and logprob[k] != −inf; other slots are padding and
// are never read beyond that. With S the valid slots and x = z/T:
//   teacher log p_k = logprob_k (T = 1), or logprob_k/T − LSE_{S}(logprob/T) (T ≠ 1: renormalized over S)
//   student log q_k = x_{id_k} − LSE_S(x_id) (normalize_topk) or x_{id_k} − LSE_V(x) (full-vocabulary Q)
//   D = the divergence above over the valid slots S
//   soft = T²·D (0 when S is empty); hard = LSE(z) − z_label (T = 1); loss = w_hard·hard + w_soft·soft.
// With normalize_topk on, no labels needed and no lse asked for, only the K gathered logits are read.
struct TopKSide {
  Block ids;       // [rows, K] i32 / i64; empty: the logits block itself is [rows, K], slot k = column k
  Block logprobs;  // [rows, K] float: teacher log-probabilities at the ids
  Block mask;      // [rows, K] any dtype, nonzero = valid; empty: all slots valid
  Block labels;    // [rows, 1] int; empty: every row counts and there is no hard loss
  int64_t ignore_index = -100;
  DivergenceSpec div;
  float temperature = 1.0f, w_hard = 0.0f, w_soft = 1.0f;
  bool normalize_topk = false;  // always on when ids is empty
  TopKSide sub_rows(int64_t r0, int64_t n) const;
};
int64_t check_topk(const TopKSide& side, int64_t rows, int64_t v, const std::string& what);
void topk_rows(const Block& logits, const TopKSide& side, const RowOut& out, ThreadPool& pool);

// Full-vocabulary distillation.
// P = softmax(teacher/T), Q = softmax(student/T) over all V; D as above with the sums over V; soft = T²·D,
// hard = LSE(z) − z_label at T = 1.
struct DistillSide {
  Block teacher;  // [rows, V] float
  Block labels;   // [rows, 1] int; empty: every row counts, no hard loss
  int64_t ignore_index = -100;
  DivergenceSpec div;
  float temperature = 1.0f, w_hard = 0.0f, w_soft = 1.0f;
  DistillSide sub_rows(int64_t r0, int64_t n) const;
};
int64_t check_distill(const DistillSide& side, int64_t rows, int64_t v, const std::string& what);
void distill_rows(const Block& logits, const DistillSide& side, const RowOut& out, ThreadPool& pool);

// Entropy.
// loss = H(softmax(z/T)) = −Σ q log q; the gradient is −(1/T)·q_j·(log q_j + H).
struct EntropySide {
  float temperature = 1.0f;
};
void entropy_rows(const Block& logits, const EntropySide& side, const RowOut& out, ThreadPool& pool);

// Top-K log-probabilities (the teacher head of fused_linear_topk_logprobs; forward only, no gradient).
// Per row: the K largest logits as log-probabilities z − LSE(z) (f32) with their ids, best first, equal
// values by smaller id (topk_logprobs's order) into logprobs / ids; out.lse = LSE(z); out.loss = LSE(z) −
// z_label for a row whose label is not ignore_index, 0 for the others (and for every row without labels). NaN
// or +inf in a row throws retort::Error naming `op` and the row (row0 + r); -inf is an ordinary value, as in
// topk_logprobs.
struct TopKLogprobsSide {
  int64_t k = 0;
  Block labels;  // [rows, 1] int; empty: no loss
  int64_t ignore_index = -100;
  Block logprobs;  // out: [rows, K] f32
  Block ids;       // out: [rows, K] i32
  const char* op = "fused_linear_topk_logprobs";
  int64_t row0 = 0;  // of the first row, for messages
  TopKLogprobsSide sub_rows(int64_t r0, int64_t n) const;
};
int64_t check_topk_logprobs(const TopKLogprobsSide& side, int64_t rows, int64_t v, const std::string& what);
void topk_logprobs_rows(const Block& logits, const TopKLogprobsSide& side, const RowOut& out,
                        ThreadPool& pool);

// Selective log-softmax.
// out[r, k] = z_{ids[r, k]} − LSE(z); lse[r] = LSE(z) when lse is not null.
void check_ids(const Block& ids, int64_t v, const std::string& what);
void selective_log_softmax_rows(const Block& logits, const Block& ids, const Block& out, float* lse,
                                ThreadPool& pool);
// grad[r, j] = Σ_k g[r, k]·[ids[r, k] = j] − exp(z_j − lse[r])·Σ_k g[r, k]: one dense pass per row with the
// scatter added in before the row is stored (no atomics, no second pass). grad may alias the logits.
void selective_log_softmax_back_rows(const Block& logits, const Block& ids, const Block& g, const float* lse,
                                     const Block& grad, ThreadPool& pool);

}  // namespace retort::loss
