// The fused linear losses (src/ops/loss/fused_linear.h) on the CUDA device: every forward op (the teacher head
// FusedLinearTopKLogprobs among them) and FusedLinearBack is the chunk scheduler run on the CUDA
// ChunkExecutor, with the node's tensors wired by problem_from_node exactly as the CPU kernel does. When
// hidden and weight are both bf16 (or both f16) the logits gradient is kept in that dtype for the gradient
// GEMMs (cuda_chunk_exec.h says why).
#include <utility>

#include "../../ops/loss/row_loss.h"
#include "../cuda_common.cuh"
#include "cuda_chunk_exec.h"

namespace retort::cuda {

namespace {

void fused_linear_l(CudaExec& ex, Tensor* node) {
  loss::FusedLinearProblem p = loss::problem_from_node(node);
  const DType h = p.hidden.dtype;
  const DType grad_dtype = h == p.weight.dtype && (h == DType::BF16 || h == DType::F16) ? h : DType::F32;
  // The seed is read on the device, so a replayed CUDA Graph sees each step's value.
  auto exec = make_cuda_chunk_executor(ex, node->op, grad_dtype, std::exchange(p.grad_factor, nullptr));
  loss::run_fused_linear(*exec, p);
}

}  // namespace

void register_cuda_fused_ops(CudaOpTable& t) {
  // Every fused linear loss of the loss-op table (src/ops/loss/row_loss.cpp), and their recomputing backward.
  for (int i = 0; i < kOpCount; ++i)
    if (loss::is_fused_linear_loss(Op(i))) t[size_t(i)] = fused_linear_l;
  t[size_t(Op::FusedLinearBack)] = fused_linear_l;
}

}  // namespace retort::cuda
