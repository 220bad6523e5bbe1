// CUDA row kernels for distillation: top-K distillation against a teacher's top-K (ids over the full
// vocabulary, or the student already gathered at those ids) and full-vocabulary distillation against teacher
// logits. The math is the row-kernel contract of src/ops/loss/row_kernels.h (same slot validity, teacher
// renormalization at T != 1, divergence terms, hard loss at T = 1, ignored rows); the launch conventions are
// those of row_losses.h: logits in a RowBlock (dim-0-contiguous rows), per-row outputs, the gradient written
// already scaled by scale × *scale_dev, launched on a stream and returning at once.
//
// Side data (ids, logprobs, mask, labels) is read through byte strides, so strided views need no copy.
// A label or a valid slot's id out of range, or a valid slot's teacher logprob that is NaN or +inf, is
// recorded in the backend's device error record (reported as retort::Error at the next synchronize or read);
// the kernel then treats that row as ignored (a bad label) or that slot as padding (a bad id or logprob), and
// never reads out of bounds.
// Host-only header: no CUDA types.
#pragma once
#include <cstdint>

#include "../../core/dtype.h"
#include "../../core/op.h"
#include "../../ops/loss/row_kernels.h"
#include "row_losses.h"

namespace retort::cuda {

struct DeviceError;  // cuda_internal.h

// A strided matrix: element (r, c) at data + r * row_stride + c * col_stride (bytes). data nullptr: absent.
// A vector [rows] uses row_stride only.
struct SideMatrix {
  const void* data = nullptr;
  DType dtype = DType::F32;
  int64_t row_stride = 0, col_stride = 0;
};

// Where a kernel records a bad label or id, and the op it names (record may be nullptr: not reported).
struct ErrorSink {
  DeviceError* record = nullptr;
  Op op = Op::None;
};

// The most teacher slots per row: per-slot values and the duplicate-id sort live in shared memory.
inline constexpr int64_t kMaxTopKSlots = 8192;

struct TopKRows {
  SideMatrix ids;       // [rows, K] i32 / i64; absent: gathered (logits are [rows, K], slot k is column k)
  SideMatrix logprobs;  // [rows, K] f32 / bf16 / f16 teacher log-probabilities
  SideMatrix mask;      // [rows, K] any dtype, nonzero = valid; absent: every slot valid
  SideMatrix labels;    // [rows] i32 / i64; absent: every row counts, no hard loss
  int64_t K = 0;
  int64_t ignore_index = -100;
  loss::DivergenceSpec div;
  float temperature = 1.0f, w_hard = 0.0f, w_soft = 1.0f;
  bool normalize_topk = false;  // always on when gathered
  float* hard = nullptr;        // [rows] unweighted cross-entropy part (may be nullptr)
  float* soft = nullptr;        // [rows] unweighted divergence × T² part (may be nullptr)
  // Device workspace of topk_scratch_bytes(rows, K) bytes (16-byte aligned), or nullptr. With it, rows whose
  // gradient's dense part is a plain softmax term (T = 1, forward KL or normalize_topk; labels given; K <=
  // kMaxFastSlots) run as cross-entropy rows (one read of each row; the cluster kernel on Hopper) between a
  // slot-gathering kernel and a slot-fixup kernel.
  void* scratch = nullptr;
};

inline constexpr int64_t kMaxFastSlots = 128;
inline size_t topk_scratch_bytes(int64_t rows, int64_t K) {
  return size_t(rows) * (sizeof(int64_t) + 3 * sizeof(float) + size_t(K) * sizeof(float));
}

struct DistillRows {
  const void* teacher = nullptr;  // [rows, V] f32 / bf16 / f16, dim-0-contiguous rows
  DType teacher_dtype = DType::F32;
  int64_t teacher_stride = 0;  // elements between consecutive teacher rows
  SideMatrix labels;           // [rows] i32 / i64; absent: every row counts, no hard loss
  int64_t ignore_index = -100;
  loss::DivergenceSpec div;
  float temperature = 1.0f, w_hard = 0.0f, w_soft = 1.0f;
  float* hard = nullptr;
  float* soft = nullptr;
};

// Top-K distillation rows (b.V is the vocabulary, or K when gathered). b.lse gets LSE_V(z/T), or, gathered,
// the LSE over the valid slots of z/T (0 for a row without any). Throws retort::Error on a bad block or
// options, K > kMaxTopKSlots, or K beyond the device's shared memory.
void topk_distill_rows(const RowBlock& b, const TopKRows& o, const ErrorSink& err, void* stream);

// Full-vocabulary distillation rows: P = softmax(teacher/T), Q = softmax(z/T). b.lse gets LSE_V(z/T).
void distill_rows(const RowBlock& b, const DistillRows& o, const ErrorSink& err, void* stream);

}  // namespace retort::cuda
