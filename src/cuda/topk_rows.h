// The device top-K row pass (cuda_topk.cu), shared by the topk_logprobs op and the fused teacher head's
// chunk executor (loss/cuda_row_loss.cu), so both select a row's top K with the same kernel: larger value
// first, equal values by smaller id, the CPU's order. Host-only header.
#pragma once
#include <cstdint>

#include "../core/dtype.h"
#include "../core/op.h"

namespace retort::cuda {

struct CudaExec;

// The largest K the kernel selects.
inline constexpr int64_t kTopKRowsMaxK = 2048;

struct TopKRowsArgs {
  const void* logits = nullptr;  // [rows, V] f32, bf16 or f16: elements contiguous
  DType dtype = DType::F32;
  int64_t rows = 0, V = 0;
  int64_t row_stride = 0;  // bytes between rows
  int64_t K = 0;
  float* logprobs = nullptr;  // [rows, K] contiguous: z − LSE(z), best first
  int32_t* ids = nullptr;     // [rows, K] contiguous
  // Optional: per-row LSE(z) and, with labels (i32 / i64, label_stride bytes apart), LSE(z) − z_label (0
  // for a label equal to ignore_index; labels are checked before, a bad one reads as ignored here).
  float* lse = nullptr;
  float* nll = nullptr;
  const void* labels = nullptr;
  DType label_dtype = DType::I32;
  int64_t label_stride = 0;
  int64_t ignore_index = -100;
  Op op = Op::TopKLogprobs;  // names the op in the device error record (NaN or +inf in a row)
  int64_t row0 = 0;          // added to the row in that record
};

// Queues the row pass on ex's stream. Throws retort::Error for K above kTopKRowsMaxK or a layout it cannot
// read.
void topk_rows(CudaExec& ex, const TopKRowsArgs& a);

}  // namespace retort::cuda
