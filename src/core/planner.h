// The memory planner: places every intermediate of an ordered node list in one arena by liveness.
#pragma once
#include <cstddef>
#include <vector>

#include "tensor.h"

namespace retort {

struct PlanSlot {
  Tensor* tensor;  // the node that owns the storage (never a view)
  size_t offset;   // bytes from the arena base
  size_t size;     // bytes, rounded up to the alignment
  int first;       // index of the step that writes it
  int last;        // index of the last step that reads it (or a view of it); INT_MAX for outputs
};

struct Plan {
  std::vector<PlanSlot> slots;
  size_t arena_bytes = 0;  // peak: the arena size the plan needs
  size_t naive_bytes = 0;  // what giving every intermediate its own memory would take
};

inline constexpr size_t kPlanAlignment = 256;

// Plans storage for nodes (in execution order) that own storage: not leaves, not views, not in-place.
// Two slots overlap in memory only if their [first, last] step ranges are disjoint.
Plan plan_memory(const std::vector<Tensor*>& nodes, size_t alignment = kPlanAlignment);

// The tensor whose storage t uses: t itself, or the root of its view chain.
Tensor* storage_root(Tensor* t);

}  // namespace retort
