#include "../../core/op_table.h"
#include "../ops.h"

namespace retort {
void register_cross_entropy_ops(OpTable&) {}
}  // namespace retort
