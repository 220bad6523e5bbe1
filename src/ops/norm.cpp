// TODO(helper): implement this op family (constructors from ops.h, CPU kernels, backward rules).
#include "../core/op_table.h"
#include "ops.h"

namespace retort {
void register_norm_ops(OpTable&) {}
}  // namespace retort
