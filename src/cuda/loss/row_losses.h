// CUDA row-loss kernels: the device side of the row-loss contract in DESIGN.md ("Row losses").
// A block of logits [rows, V] (f32, bf16 or f16; row stride in elements) and per-row side data in; per-row
// loss and log-sum-exp (f32) out; optionally the gradient of the reduced loss w.r.t. the logits, written to
// `grad` (which may alias the logits: every element is read before it is written, by the same thread) already
// scaled by `scale` × (*scale_dev if given). Rows are independent: the fused linear scheduler calls these on
// chunks. Host-only header: no CUDA types, so .cpp files can include it.
#pragma once
#include <cstdint>

#include "../../core/dtype.h"

namespace retort::cuda {

struct RowBlock {
  const void* logits = nullptr;
  DType dtype = DType::F32;
  int64_t rows = 0, V = 0, stride = 0;  // stride: elements between consecutive rows
  void* grad = nullptr;                 // nullptr: forward only
  DType grad_dtype = DType::F32;
  int64_t grad_stride = 0;
  float scale = 1.0f;                // gradient multiplier known before the pass
  const float* scale_dev = nullptr;  // optional device scalar multiplied in (e.g. 1 / valid rows)
  float* loss = nullptr;             // [rows] per-row loss (f32), may be nullptr
  float* lse = nullptr;              // [rows] per-row log-sum-exp of the (transformed) logits, may be nullptr
};

struct CrossEntropyRows {
  const void* labels = nullptr;  // [rows] i32 or i64
  DType label_dtype = DType::I32;
  int64_t ignore_index = -100;
  float label_smoothing = 0.0f, z_loss = 0.0f, softcap = 0.0f;
  // Top-K distillation's dense part (distill_rows.cu): with row_coef, the gradient's softmax term is
  // scale·row_coef[r]·p (instead of scale·(1 + 2·z_loss·lse)·p) and the label column's is −scale·hit_weight.
  const float* row_coef = nullptr;
  float hit_weight = 1.0f;
};

struct EntropyRows {
  float temperature = 1.0f;
};

struct SelectiveRows {
  const void* ids = nullptr;  // [rows, K] i32 or i64, row stride = K
  DType id_dtype = DType::I32;
  int64_t K = 0;
  // forward: [rows, K] log-probabilities. A backward may pass them (its p at the ids) or nullptr: p is then
  // recomputed from the logits, which the gradient must not alias.
  float* out = nullptr;
  const float* upstream = nullptr;  // backward: [rows, K] gradient of the output (nullptr: forward only)
};

// Each launches on `stream` (a cudaStream_t passed as void*) and returns at once; errors throw retort::Error.
// A device error flag (`error_flag`, int, may be nullptr) is set to 1 + row for a label or id out of range.
void cross_entropy_rows(const RowBlock& b, const CrossEntropyRows& o, int* error_flag, void* stream);
void entropy_rows(const RowBlock& b, const EntropyRows& o, void* stream);
void selective_log_softmax_rows(const RowBlock& b, const SelectiveRows& o, int* error_flag, void* stream);

// Number of rows whose label != ignore_index, written as 1 / max(count, 1) × weight into *inv_count (device),
// and the count into *count (device, may be nullptr).
void count_valid_rows(const void* labels, DType label_dtype, int64_t rows, int64_t ignore_index, float weight,
                      float* inv_count, int* count, void* stream);
// out[0] = sum(values[0..n)) × (*scale_dev if given) × scale, deterministic (one block, fixed order).
void sum_rows_scalar(const float* values, int64_t n, const float* scale_dev, float scale, float* out,
                     void* stream);

}  // namespace retort::cuda
