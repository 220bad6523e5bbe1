// The list of graph operations. Each op's shape rule, CPU kernel and backward rule live in src/ops/<family>.cpp;
// src/core/op_table.cpp gathers them, and a test checks that the table is complete.
#pragma once
#include <cstdint>

namespace retort {

enum class Op : uint16_t {
  None,  // a leaf: parameter, input or constant with its own storage
  // structure
  View,        // reshape / permute / transpose / slice: aliases src[0]'s storage (ip[0] = ViewKind)
  Cont,        // contiguous copy of src[0], optionally converting dtype
  Fill,        // every element = fp[0]
  Accumulate,  // src[0] += src[1] in place (src[0] is a leaf accumulator); the node aliases src[0]
  AuxOutput,   // an extra output written by src[0] (e.g. a loss's gradient or per-row values)
  SliceBack,   // zeros shaped like the sliced tensor with src[0] written into the slice window
  Concat,      // src[0] and src[1] joined along dim ip[0] (ggml order)
  // elementwise, binary with broadcasting of src[1] over src[0]
  Add,
  Sub,
  Mul,
  Div,
  // elementwise, unary
  Scale,  // x * fp[0]
  Neg,
  Exp,
  Log,
  Sqrt,
  Rsqrt,
  Tanh,
  Relu,
  Gelu,  // tanh approximation
  Silu,
  ReluBack,  // grad * (x > 0): src[0] = grad, src[1] = x
  GeluBack,
  SiluBack,
  // reductions
  SumRows,  // over dim 0 (innermost) -> ne[0] = 1
  MeanRows,
  MaxRows,
  Sum,  // over everything -> one element
  Mean,
  Max,
  Repeat,    // broadcast src[0] to this node's shape
  ReduceTo,  // sum src[0] down to this node's (broadcast-compatible) shape
  MaxBack,   // grad routed to the first arg-max of each reduced group: src = grad, x, y; ip[0] =
             // rows(1)/all(0)
  // linear algebra
  Matmul,  // batched op(A) op(B); ip[0] = transpose A, ip[1] = transpose B
  // indexing
  GetRows,      // rows of src[0] picked by integer ids src[1]
  GetRowsBack,  // scatter-add of grad rows src[0] at ids src[1] into ip[0] rows
  SetRows,      // src[0] with its rows ids src[2] overwritten by the rows of src[1], in place; aliases src[0]
  // softmax family (over dim 0)
  Softmax,
  LogSoftmax,
  CausalSoftmax,   // softmax(x * fp[0]) with column j > row i + ip[0] masked out; rows are queries
  SoftmaxBack,     // src = grad, y
  LogSoftmaxBack,  // src = grad, y
  // attention (src/ops/attention.cpp): src = q [B, T_q, H, D], k, v [B, T_k, KV, D]; ip[0] = causal,
  // ip[1] = n_past; fp[0] = scale; aux[0] = log-sum-exp [B, H, T_q] (f32)
  FlashAttention,
  FlashAttentionBack,  // src = q, k, v, o, do, lse; the node is dq, aux = dk, dv
  // normalization (over dim 0, no affine: multiply by a weight with Mul)
  RmsNorm,  // fp[0] = eps
  RmsNormBack,
  LayerNorm,
  LayerNormBack,
  // fused layers (src/ops/fused_layers.cpp)
  RmsNormAffine,       // src = x, w, delta?; fp[0] = eps; rms_norm(x (+ delta)) · w in the node's dtype;
                       // aux[0] = x + delta (f32) when delta is given
  RmsNormAffineBack,   // src = gy, s, w, gs?; the gradient of s (f32), plus gs
  RmsNormAffineBackW,  // src = gy, s; the weight's gradient [n] (f32)
  Swiglu,              // src = gate, up; silu(gate) · up in the node's dtype
  SwigluBack,          // src = dy, gate, up; the node is dgate, aux[0] = dup
  Rope,  // src = x [.., T, heads, d], positions (i32 [T]); ip[0] = mode, ip[1] = inverse; fp[0] = theta
  // row losses of the loss backend (src/ops/loss/losses.cpp). ip[0] = reduction, ip[1] = 1 when the forward
  // also writes the logits gradient (set by the backward rule); aux = per-row loss, lse, hard/soft parts,
  // logits gradient (slots fixed, see losses.cpp)
  CrossEntropyLoss,         // src = logits, labels
  TopKDistill,              // src = logits, teacher ids, teacher logprobs, mask?, labels?
  TopKKLGathered,           // src = student logits gathered at the teacher ids, teacher logprobs, mask?
  Distill,                  // src = student logits, teacher logits, labels?
  Entropy,                  // src = logits
  SelectiveLogSoftmax,      // src = logits, ids; aux[1] = lse (for the backward)
  SelectiveLogSoftmaxBack,  // src = logits, ids, grad [N, K], lse
  // fused linear losses (src/ops/loss/fused_linear.cpp): src = hidden, weight, bias?, loss inputs; the
  // lm-head GEMM and the row loss in chunks; aux = stats, dhidden, dW, dbias (layout in fused_linear.cpp)
  FusedLinearCrossEntropy,         // + labels
  FusedLinearTopKDistill,          // + teacher ids, teacher logprobs, mask?, labels?
  FusedLinearDistill,              // + teacher hidden, teacher weight, teacher bias?, labels?
  FusedLinearEntropy,              //
  FusedLinearSelectiveLogSoftmax,  // + ids
  FusedLinearBack,  // recomputing backward for a per-row (per-element) upstream gradient; ip[6] = forward op
  // selection (src/ops/topk.cpp)
  TopKLogprobs,  // src = logits [N, V]; ip[0] = K; the K best log-softmax values [N, K]; aux[0] = ids [N, K]
  // the optimizer (src/ops/optim.cpp): multi-tensor ops over a chunk table src[1]; each writes into (or
  // reads) the stats leaf src[0] and aliases it
  GradNorm,   // src = stats, table, scratch, loss?; ip[0] = scale the gradients too, ip[1] = max_norm's bits
  AdamWStep,  // src = stats, table, hparams; fp = beta1, beta2, eps
  SgdStep,    // src = stats, table, hparams; fp = momentum, weight_decay
  // data parallelism (src/ops/collective.cpp): sums tensors over the ranks of a Collective in place
  AllReduce,  // src = tensor 0 (aliased), weight?, after?, staging, tensors 1..; ip = Collective*, join, wire
  Count
};

inline constexpr int kOpCount = static_cast<int>(Op::Count);

// Ops whose node writes into src[0]'s storage and aliases it (view_src / view_offs say where), so the
// planner gives it no memory and later readers of the node see the write.
inline constexpr bool writes_into_src0(Op op) {
  return op == Op::Accumulate || op == Op::SetRows || op == Op::GradNorm || op == Op::AdamWStep ||
         op == Op::SgdStep || op == Op::AllReduce;
}

enum class ViewKind : int64_t { Reshape, Permute, Slice };

}  // namespace retort
