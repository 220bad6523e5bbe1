// The fused linear losses (src/ops/loss/fused_linear.h) on the CUDA device: every one of the five forward
// ops, FusedLinearBack and the teacher head (FusedLinearTopKLogprobs) is the chunk scheduler run on the CUDA
// ChunkExecutor, with the node's tensors wired by problem_from_node exactly as the CPU kernel does. When
// hidden and weight are both bf16 (or both f16) the logits gradient is kept in that dtype for the gradient
// GEMMs (cuda_chunk_exec.h says why).
#include "../cuda_common.cuh"
#include "cuda_chunk_exec.h"

namespace retort::cuda {

namespace {

void fused_linear_l(CudaExec& ex, Tensor* node) {
  const loss::FusedLinearProblem p = loss::problem_from_node(node);
  const DType h = p.hidden.dtype;
  const DType grad_dtype = h == p.weight.dtype && (h == DType::BF16 || h == DType::F16) ? h : DType::F32;
  auto exec = make_cuda_chunk_executor(ex, node->op, grad_dtype);
  loss::run_fused_linear(*exec, p);
}

}  // namespace

void register_cuda_fused_ops(CudaOpTable& t) {
  t[size_t(Op::FusedLinearCrossEntropy)] = fused_linear_l;
  t[size_t(Op::FusedLinearTopKDistill)] = fused_linear_l;
  t[size_t(Op::FusedLinearDistill)] = fused_linear_l;
  t[size_t(Op::FusedLinearEntropy)] = fused_linear_l;
  t[size_t(Op::FusedLinearSelectiveLogSoftmax)] = fused_linear_l;
  t[size_t(Op::FusedLinearBack)] = fused_linear_l;
  t[size_t(Op::FusedLinearTopKLogprobs)] = fused_linear_l;
}

}  // namespace retort::cuda
