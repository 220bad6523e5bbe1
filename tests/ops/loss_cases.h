// The row losses' case lists, one per op, that every backend runs from the same entries:
// tests/ops/test_loss_cases.cpp on the CPU (against the float64 references of test_losses_ref.h, gradients
// against central differences), tests/cuda/test_cuda_loss_cases.cpp on CUDA (against the same references and
// against the CPU backend, at the case's backend_tol). A case names its own tolerances; one a backend cannot
// run says why in cuda_unsupported. Inputs are drawn from the case's name (fresh per case, the seed printed
// with a failure). Tests of what a list cannot express (errors, memory, launch order) stay beside the op's
// other tests.
#pragma once
#include <string>
#include <vector>

#include "test_losses_ref.h"

namespace retort::test {

// What the lists share: a number as a case-name tag (x·scale, rounded), the reductions in turn, and the options
// of a top-K or full-vocabulary distillation from its reference's settings and the output a case looks at.
std::string tag(double x, double scale);
Reduction nth_reduction(int i);
TopKDistillOptions topk_options(const TopKRef& r, Out what);
DistillOptions distill_options(const DistillRef& r, Out what);

// cross_entropy_loss: every option (label smoothing, z-loss, softcap, reduction) and output, f32 / bf16 / f16
// logits contiguous, transposed and sliced, i32 and i64 labels, V = 1..7 up to 128,256, rising and ±1e4
// logits, ignored rows, the single pass, and logits computed by another op.
std::vector<LossCase> cross_entropy_cases();
// entropy: temperatures × reductions, V = 1..7 up to 128,256, dtypes, rising, ±1e4 and near-1e4 logits, −inf
// logits, a transposed view, the single pass.
std::vector<LossCase> entropy_cases();
// selective_log_softmax: K = 1, K > V (repeated ids), V = 1..7 up to 8,192 with K = 300, dtypes, ±1e4,
// strided logits and ids, and as part of a loss (one consumer and two).
std::vector<LossCase> selective_cases();
// topk_kd: beta × temperature × normalize_topk × hard loss × reduction, every divergence (TVD, skew KL and
// skew reverse KL) on short and long rows, every output, i32 and i64 ids, no mask and an int or float mask,
// K = 1, K = V, K = 3000, V = 1..7 up to 100,000, rising and ±1e4 logits, −inf and masked padding, fully
// masked and ignored rows, bf16 / f16 logits and teacher logprobs, a transposed view, the single pass.
std::vector<LossCase> topk_kd_cases();
// topk_kl_gathered: temperature × reduction × mask, outputs, bf16, −inf padding and a fully masked row, the
// single pass, and the same loss as topk_kd with normalize_topk.
std::vector<LossCase> topk_gathered_cases();
// distill: beta × temperature × hard loss × reduction, every divergence on rows of 9, 1,000 and 3,001, every
// output, V = 1..7 up to 128,256 (CUDA's cluster kernel in two and three segments), odd row lengths, rising,
// ±1e4 logits and a teacher with −inf logits, ignored rows, bf16 / f16 student and teacher in either dtype,
// transposed views of one or both, the single pass.
std::vector<LossCase> distill_cases();

// fused_linear_cross_entropy: every option and output, chunks of one row, some rows and all rows, a bias or
// none, bf16 / f16 / mixed heads, strided hidden and weight views, ±1e4 logits, V = 50,257, the single pass,
// and CUDA's softmax-epilogue shapes (bf16, no bias, rows of 16 bytes; rows beyond its range; two losses on
// one head).
std::vector<LossCase> fused_ce_cases();
// fused_linear_topk_kd: beta × temperature × normalize_topk × hard loss × reduction, with and without bias,
// labels and mask; every divergence dense and K-sparse; every output; the single pass in f32 and bf16; CUDA's
// cross-entropy-rows form (duplicate ids, w_hard or w_soft zero, V = 60,000); the K-sparse path in f32 and
// bf16 at every chunk size, H = 5 and 2,056; K = 1, K = V, −inf and masked padding with garbage ids; CUDA's
// softmax-epilogue shapes (with and without labels and mask, V = 50,257, 16-bit chunk logits).
std::vector<LossCase> fused_topk_cases();
// fused_linear_distill against an online teacher: beta × temperature × hard loss × reduction with and
// without either bias and labels; f32 and bf16 heads at chunks of one row, some and all; every divergence in
// f32 and bf16; every output; a bf16 student with an f16 teacher of another width in the single pass.
std::vector<LossCase> fused_distill_cases();
// fused_linear_entropy: reduction × temperature, the single pass.
std::vector<LossCase> fused_entropy_cases();
// fused_linear_selective_log_softmax: K = 1, 3 and 9 (repeated ids), f32 and bf16 heads.
std::vector<LossCase> fused_selective_cases();

// Chunks of `rows` rows with f32 chunk logits whatever the inputs' dtype (the 16-bit default is
// tests/cuda/test_cuda_fused_lowlogits.cpp's).
FusedLinearOptions fused_chunks(int64_t rows);
// 16-bit heads on CUDA keep the logits gradient in 16 bits for the gradient GEMMs (cuda_chunk_exec.h), a
// rounding of 2^-9 relative per element: their gradients are held to 1e-4 there (a wrong one is ~1).
inline constexpr double kHead16GradTol = 1e-4;
void loosen_for_16bit_heads(DType dt, LossCase& c);

// The pieces appended in order: a case's name. (Not "a" + std::string: GCC 12 warns there, -Wrestrict.)
template <typename... Parts>
std::string cat(const Parts&... parts) {
  std::string s;
  (s.append(parts), ...);
  return s;
}

// The single-pass cases of every fused list, seeded with an f32 leaf of 0.37 (LossCase::leaf_seed) instead of
// the constant 1, named "<case>_leafseed": the seed the fused losses fold into the gradients they write.
std::vector<LossCase> fused_leaf_seeded_cases();

// Finds a case of a list by name (for the tests that run cases in a given order); fails the test if absent.
const LossCase& case_named(const std::vector<LossCase>& list, const std::string& name);

}  // namespace retort::test
