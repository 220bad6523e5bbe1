// The one list of graph operations, in enum order: RT_OP(Enumerator, "name", kernels). core/op.h expands it
// into the Op enum, the op names and the kernel kinds; each op's shape rule, CPU kernel and backward rule
// live in src/ops/<family>.cpp (core/op_table.cpp gathers them). kernels says which backends run the op:
//   Every       a kernel on every backend (tests/cuda/test_cuda_launchers.cpp holds the CUDA table to it)
//   CpuOnly     only the CPU backend has a kernel; the CUDA backend refuses the node with an error
//   Structural  the node aliases or describes storage; no backend launches anything for it
// No include guard: each expansion includes it once, with its own RT_OP.
RT_OP(None, "leaf", Structural)  // a leaf: parameter, input or constant with its own storage
// structure
// reshape / permute / transpose / slice: aliases src[0]'s storage (ip[0] = ViewKind)
RT_OP(View, "view", Structural)
RT_OP(Cont, "contiguous", Every)  // contiguous copy of src[0], optionally converting dtype
RT_OP(Fill, "fill", Every)        // every element = fp[0]
// src[0] += src[1] in place (src[0] is a leaf accumulator); the node aliases src[0]
RT_OP(Accumulate, "accumulate", Every)
// an extra output written by src[0] (e.g. a loss's gradient or per-row values)
RT_OP(AuxOutput, "aux_output", Structural)
// zeros shaped like the sliced tensor with src[0] written into the slice window
RT_OP(SliceBack, "slice_back", Every)
RT_OP(Concat, "concat", Every)  // src[0] and src[1] joined along dim ip[0] (ggml order)
// elementwise, binary with broadcasting of src[1] over src[0]
RT_OP(Add, "add", Every)
RT_OP(Sub, "sub", Every)
RT_OP(Mul, "mul", Every)
RT_OP(Div, "div", Every)
// elementwise, unary
RT_OP(Scale, "scale", Every)  // x * fp[0]
RT_OP(Neg, "neg", Every)
RT_OP(Exp, "exp", Every)
RT_OP(Log, "log", Every)
RT_OP(Sqrt, "sqrt", Every)
RT_OP(Rsqrt, "rsqrt", Every)
RT_OP(Tanh, "tanh", Every)
RT_OP(Relu, "relu", Every)
RT_OP(Gelu, "gelu", Every)  // tanh approximation
RT_OP(Silu, "silu", Every)
RT_OP(ReluBack, "relu_back", Every)  // grad * (x > 0): src[0] = grad, src[1] = x
RT_OP(GeluBack, "gelu_back", Every)
RT_OP(SiluBack, "silu_back", Every)
// reductions
RT_OP(SumRows, "sum_rows", Every)  // over dim 0 (innermost) -> ne[0] = 1
RT_OP(MeanRows, "mean_rows", Every)
RT_OP(MaxRows, "max_rows", Every)
RT_OP(Sum, "sum", Every)  // over everything -> one element
RT_OP(Mean, "mean", Every)
RT_OP(Max, "max", Every)
RT_OP(Repeat, "repeat", Every)       // broadcast src[0] to this node's shape
RT_OP(ReduceTo, "reduce_to", Every)  // sum src[0] down to this node's (broadcast-compatible) shape
// grad routed to the first arg-max of each reduced group: src = grad, x, y; ip[0] = rows(1)/all(0)
RT_OP(MaxBack, "max_back", Every)
// linear algebra
RT_OP(Matmul, "matmul", Every)  // batched op(A) op(B); ip[0] = transpose A, ip[1] = transpose B
// indexing
RT_OP(GetRows, "get_rows", Every)           // rows of src[0] picked by integer ids src[1]
RT_OP(GetRowsBack, "get_rows_back", Every)  // scatter-add of grad rows src[0] at ids src[1] into ip[0] rows
// src[0] with its rows ids src[2] overwritten by the rows of src[1], in place; aliases src[0]
RT_OP(SetRows, "set_rows", Every)
// softmax family (over dim 0)
RT_OP(Softmax, "softmax", Every)
RT_OP(LogSoftmax, "log_softmax", Every)
// softmax(x * fp[0]) with column j > row i + ip[0] masked out; rows are queries
RT_OP(CausalSoftmax, "causal_softmax", Every)
RT_OP(SoftmaxBack, "softmax_back", Every)         // src = grad, y
RT_OP(LogSoftmaxBack, "log_softmax_back", Every)  // src = grad, y
// attention (src/ops/attention.cpp): src = q [B, T_q, H, D], k, v [B, T_k, KV, D]; ip[0] = causal,
// ip[1] = n_past; fp[0] = scale; aux[0] = log-sum-exp [B, H, T_q] (f32)
RT_OP(FlashAttention, "flash_attention", Every)
// src = q, k, v, o, do, lse; the node is dq, aux = dk, dv
RT_OP(FlashAttentionBack, "flash_attention_back", Every)
// normalization (over dim 0, no affine: multiply by a weight with Mul)
RT_OP(RmsNorm, "rms_norm", Every)  // fp[0] = eps
RT_OP(RmsNormBack, "rms_norm_back", Every)
RT_OP(LayerNorm, "layer_norm", Every)
RT_OP(LayerNormBack, "layer_norm_back", Every)
// fused layers (src/ops/fused_layers.cpp)
// src = x, w, delta?; fp[0] = eps; rms_norm(x (+ delta)) · w in the node's dtype; aux[0] = x + delta (f32)
// when delta is given
RT_OP(RmsNormAffine, "rms_norm_affine", Every)
// src = gy, s, w, gs?; the gradient of s (f32), plus gs
RT_OP(RmsNormAffineBack, "rms_norm_affine_back", Every)
RT_OP(RmsNormAffineBackW, "rms_norm_affine_back_w", Every)  // src = gy, s; the weight's gradient [n] (f32)
RT_OP(Swiglu, "swiglu", Every)           // src = gate, up; silu(gate) · up in the node's dtype
RT_OP(SwigluBack, "swiglu_back", Every)  // src = dy, gate, up; the node is dgate, aux[0] = dup
// src = x [.., T, heads, d], positions (i32 [T]); ip[0] = mode, ip[1] = inverse; fp[0] = theta
RT_OP(Rope, "rope", Every)
// row losses of the loss backend (src/ops/loss/losses.cpp). ip[0] = reduction, ip[1] = 1 when the forward
// also writes the logits gradient (set by the backward rule); aux = per-row loss, lse, hard/soft parts,
// logits gradient (slots fixed, see losses.cpp)
RT_OP(CrossEntropyLoss, "cross_entropy_loss", Every)  // src = logits, labels
RT_OP(TopKDistill, "topk_kd", Every)  // src = logits, teacher ids, teacher logprobs, mask?, labels?
// src = student logits gathered at the teacher ids, teacher logprobs, mask?
RT_OP(TopKKLGathered, "topk_kl_gathered", Every)
RT_OP(Distill, "distill", Every)  // src = student logits, teacher logits, labels?
RT_OP(Entropy, "entropy", Every)  // src = logits
// src = logits, ids; aux[1] = lse (for the backward)
RT_OP(SelectiveLogSoftmax, "selective_log_softmax", Every)
RT_OP(SelectiveLogSoftmaxBack, "selective_log_softmax_back", Every)  // src = logits, ids, grad [N, K], lse
// fused linear losses (src/ops/loss/fused_linear.cpp): src = hidden, weight, bias?, loss inputs; the
// lm-head GEMM and the row loss in chunks; aux = stats, dhidden, dW, dbias (layout in fused_linear.cpp)
RT_OP(FusedLinearCrossEntropy, "fused_linear_cross_entropy", Every)  // + labels
// + teacher ids, teacher logprobs, mask?, labels?
RT_OP(FusedLinearTopKDistill, "fused_linear_topk_kd", Every)
// + teacher hidden, teacher weight, teacher bias?, labels?
RT_OP(FusedLinearDistill, "fused_linear_distill", Every)
RT_OP(FusedLinearEntropy, "fused_linear_entropy", Every)
RT_OP(FusedLinearSelectiveLogSoftmax, "fused_linear_selective_log_softmax", Every)  // + ids
// the teacher head, forward only: + targets?; the node is the top-K log-probs [N, K]; aux[0] = stats,
// aux[1] = ids [N, K], aux[2] = summed nll (layout in fused_linear.cpp)
RT_OP(FusedLinearTopKLogprobs, "fused_linear_topk_logprobs", Every)
// recomputing backward for a per-row (per-element) upstream gradient; ip[6] = forward op
RT_OP(FusedLinearBack, "fused_linear_back", Every)
// selection (src/ops/topk.cpp)
// src = logits [N, V]; ip[0] = K; the K best log-softmax values [N, K]; aux[0] = ids [N, K]
RT_OP(TopKLogprobs, "topk_logprobs", Every)
// the optimizer (src/ops/optim.cpp): multi-tensor ops over a chunk table src[1]; each writes into (or
// reads) the stats leaf src[0] and aliases it
// src = stats, table, scratch, loss?; ip[0] = scale the gradients too, ip[1] = max_norm's bits
RT_OP(GradNorm, "grad_norm", Every)
RT_OP(AdamWStep, "adamw_step", Every)  // src = stats, table, hparams; fp = beta1, beta2, eps
RT_OP(SgdStep, "sgd_step", Every)      // src = stats, table, hparams; fp = momentum, weight_decay
// data parallelism (src/ops/collective.cpp): sums tensors over the ranks of a Collective in place
// src = tensor 0 (aliased), weight?, after?, staging, tensors 1..; ip = Collective*, join, wire
RT_OP(AllReduce, "all_reduce", Every)
