#include "op_table.h"

namespace retort {

namespace {

OpTable build_table() {
  OpTable t{};
  register_view_ops(t);
  register_elementwise_ops(t);
  register_reduce_ops(t);
  register_matmul_ops(t);
  register_get_rows_ops(t);
  register_set_rows_ops(t);
  register_softmax_ops(t);
  register_norm_ops(t);
  register_fused_layer_ops(t);
  register_rope_ops(t);
  register_loss_ops(t);
  register_fused_ops(t);
  register_topk_ops(t);
  register_attention_ops(t);
  register_optim_ops(t);
  register_collective_ops(t);
  return t;
}

}  // namespace

const OpInfo& op_info(Op op) {
  static const OpTable table = build_table();
  return table[size_t(op)];
}

const char* op_name(Op op) {
  return size_t(op) < size_t(kOpCount) ? kOpNames[size_t(op)] : "?";
}

}  // namespace retort
