// The graph operations, made from the one list in op_list.h. Each op's shape rule, CPU kernel and backward
// rule live in src/ops/<family>.cpp; src/core/op_table.cpp gathers them, and a test checks that the table is
// complete.
#pragma once
#include <cstdint>

namespace retort {

// The backends that run an op (see op_list.h).
enum class OpKernels : uint8_t { Every, CpuOnly, Structural };

enum class Op : uint16_t {
#define RT_OP(e, name, kernels) e,
#include "op_list.h"
#undef RT_OP
  Count
};

inline constexpr int kOpCount = static_cast<int>(Op::Count);

// The op's name, as errors and the API use it ("add", "fused_linear_cross_entropy").
inline constexpr const char* kOpNames[kOpCount] = {
#define RT_OP(e, name, kernels) name,
#include "op_list.h"
#undef RT_OP
};

// Which backends run each op.
inline constexpr OpKernels kOpKernels[kOpCount] = {
#define RT_OP(e, name, kernels) OpKernels::kernels,
#include "op_list.h"
#undef RT_OP
};

// Ops whose node writes into src[0]'s storage and aliases it (view_src / view_offs say where), so the
// planner gives it no memory and later readers of the node see the write.
inline constexpr bool writes_into_src0(Op op) {
  return op == Op::Accumulate || op == Op::SetRows || op == Op::GradNorm || op == Op::AdamWStep ||
         op == Op::SgdStep || op == Op::AllReduce;
}

enum class ViewKind : int64_t { Reshape, Permute, Slice };

}  // namespace retort
