// The CUDA ChunkExecutor (cuda_chunk_exec.cu): the fused linear losses' chunk loop (chunk_scheduler.h) on a
// CUDA backend's stream. Host-only header.
#pragma once
#include <memory>

#include "../../ops/loss/chunk_scheduler.h"
#include "../cuda_internal.h"

namespace retort::cuda {

// An executor on ex's stream, allocator, cuBLASLt handle and workspace. `op` names the node in device-side
// errors (bad labels or ids, reported at the next synchronize or read). `grad_dtype`: the dtype the logits
// gradient is stored in for the gradient GEMMs. F32: in place over the f32 logits, as the contract says. BF16
// or F16 (when hidden and weight are both that dtype): the row kernel writes the gradient straight into a
// 16-bit shadow buffer [rows, Vp] instead, which the gradient GEMMs then read on the tensor-core path
// (cuBLASLt wants A and B of one type), and which scale_rows and column_sums read in place of the logits
// block. This is what torch / Liger do for bf16 heads; it rounds d(loss)/d(logits) to 16 bits before the
// GEMMs. With 16-bit logits (FusedLinearOptions::logits_dtype, when hidden and W, and an online teacher's,
// are all of that dtype: supports_16bit_logits) no shadow is used: the GEMM writes the logits in 16 bits and
// the row kernel writes the gradient over them in the same dtype. grad_factor: a device f32 that multiplies
// every gradient besides the mean's 1 / count (FusedLinearProblem::grad_factor), or null.
std::unique_ptr<loss::ChunkExecutor> make_cuda_chunk_executor(CudaExec& ex, Op op,
                                                              DType grad_dtype = DType::F32,
                                                              const float* grad_factor = nullptr);

}  // namespace retort::cuda
