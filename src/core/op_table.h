// The op registry: for each Op its CPU kernel and backward rule (its name is in the op list, op_list.h). Each
// op family registers its entries from its own file (src/ops/*.cpp); tests/core/test_op_table.cpp checks that
// no entry is missing.
#pragma once
#include <array>
#include <functional>

#include "context.h"
#include "op.h"
#include "tensor.h"

namespace retort {

class ThreadPool;

// Computes node from its sources on the CPU; all data pointers are host addresses.
using CpuKernel = void (*)(Tensor* node, ThreadPool& pool);

// What a backward rule can do: create ops in the graph's context and hand gradients to sources.
class BackwardCtx {
 public:
  BackwardCtx(Context& ctx, std::function<bool(const Tensor*)> needs,
              std::function<void(Tensor*, Tensor*)> add,
              std::function<Tensor*(const Tensor*)> grad_of = nullptr)
      : ctx(ctx), needs_(std::move(needs)), add_(std::move(add)), grad_of_(std::move(grad_of)) {}
  Context& ctx;
  // True when src needs a gradient (it is a parameter or depends on one).
  bool needs(const Tensor* src) const { return src && needs_(src); }
  // Adds g to src's gradient (summed if src gets gradients from several consumers).
  void add(Tensor* src, Tensor* g) {
    if (needs(src)) add_(src, g);
  }
  // The complete gradient of a node's aux output (null when none flows into it), for the rules of ops with
  // grads_through_aux.
  Tensor* grad_of(const Tensor* aux) const { return grad_of_ ? grad_of_(aux) : nullptr; }

 private:
  std::function<bool(const Tensor*)> needs_;
  std::function<void(Tensor*, Tensor*)> add_;
  std::function<Tensor*(const Tensor*)> grad_of_;
};

// Emits the ops that compute the sources' gradients of node, given the gradient of node.
using BackwardRule = void (*)(BackwardCtx& bc, Tensor* node, Tensor* grad);

// An op's entry; its name and the backends that run it come from the op list (op.h).
struct OpInfo {
  CpuKernel cpu = nullptr;
  BackwardRule backward = nullptr;
  bool differentiable =
      true;  // false: backward() refuses to differentiate through it (integer ops, *Back ops)
  // Optional: asked by Graph::backward for an extra output (Op::AuxOutput) that is a parameter's whole
  // gradient. Returning true promises that the owner will ADD into that output's storage instead of
  // overwriting it, so the graph points the output at the parameter's f32 accumulator and drops the
  // Accumulate node (for an lm head that saves a read and a write of [V, H] f32 per step).
  bool (*accumulate_aux)(Tensor* aux) = nullptr;
  // True when an aux output is a differentiable result of its own (add_rms_norm's residual sum): the backward
  // rule then also runs when only an aux output has a gradient (its grad argument is null then) and reads the
  // aux outputs' gradients with BackwardCtx::grad_of.
  bool grads_through_aux = false;
};

using OpTable = std::array<OpInfo, kOpCount>;

const OpInfo& op_info(Op op);
// The op's name from the op list; "?" for a value outside it.
const char* op_name(Op op);

// Registration hooks, one per op family file.
void register_view_ops(OpTable& t);
void register_elementwise_ops(OpTable& t);
void register_reduce_ops(OpTable& t);
void register_matmul_ops(OpTable& t);
void register_get_rows_ops(OpTable& t);
void register_set_rows_ops(OpTable& t);
void register_softmax_ops(OpTable& t);
void register_norm_ops(OpTable& t);
void register_fused_layer_ops(OpTable& t);
void register_rope_ops(OpTable& t);
void register_loss_ops(OpTable& t);
void register_fused_ops(OpTable& t);
void register_topk_ops(OpTable& t);
void register_attention_ops(OpTable& t);
void register_optim_ops(OpTable& t);
void register_collective_ops(OpTable& t);

}  // namespace retort
