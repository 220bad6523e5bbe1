// Data parallelism inside a training graph: the gradients summed over the ranks in buckets, each bucket's
// all_reduce placed right after the op that finishes its last gradient, so it runs while the rest of
// backward computes; then the loss (and its parts), with a join, before the optimizer reads anything.
#pragma once
#include <cstdint>
#include <vector>

#include "../core/collective.h"
#include "../core/graph.h"

namespace retort {

inline constexpr int64_t kDefaultBucketMiB = 25;

struct GradSync {
  // f32 [1]: this rank's share of the step's valid tokens (n_rank / n_world), set before each run. Each
  // rank's loss and gradients are means over its own tokens; weighted this way their sum is the mean over
  // every rank's tokens, as one process with the whole batch would compute it.
  Tensor* weight = nullptr;
  // The loss summed over the ranks (aliases the loss): what the optimizer's non-finite check must read, so
  // every rank makes the same skip decision.
  Tensor* loss = nullptr;
  int buckets = 0;
};

// Appends the all-reduce of every parameter gradient of graph (which must have its backward pass) and of
// loss and parts (f32 scalars) over comm. Buckets hold up to bucket_bytes of f32 gradients (and at most
// kAllReduceMaxTensors tensors), in the order backward finishes them, and travel as wire (F32 or BF16).
// Throws retort::Error on a graph without gradients or a bad bucket size.
GradSync append_grad_sync(Graph& graph, Collective& comm, Tensor* loss, const std::vector<Tensor*>& parts,
                          DType wire, int64_t bucket_bytes);

}  // namespace retort
