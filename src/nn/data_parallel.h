// Data parallelism inside a training graph: the gradients summed over the ranks in buckets, each bucket's
// all_reduce placed right after the op that finishes its last gradient, so it runs while the rest of
// backward computes; then the loss (and its parts), with a join, before the optimizer reads anything. An
// embedding's scatter part travels sparsely where that moves fewer bytes: every rank's gradient rows and ids
// are gathered and scattered on every rank, and a tied lm-head's dense part is summed in a bucket of its own
// as soon as the fused loss has made it.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "../core/collective.h"
#include "../core/graph.h"
#include "../dist/tcp_group.h"

namespace retort {

inline constexpr int64_t kDefaultBucketMiB = 25;

struct GradSync {
  // f32 [1]: this rank's share of the step's valid tokens (n_rank / n_world), set before each run: the
  // graph's backward seed (Graph::backward(loss, weight)), so the gradients come out weighted and are summed
  // as they are. Each rank's loss is a mean over its own tokens; weighted the same way, the sum over the
  // ranks is the mean over every rank's tokens, as one process with the whole batch would compute it.
  Tensor* weight = nullptr;
  // The loss summed over the ranks (aliases the loss): what the optimizer's non-finite check must read, so
  // every rank makes the same skip decision.
  Tensor* loss = nullptr;
  int buckets = 0;  // all_reduce buckets of gradients (the loss's not counted)
  int sparse = 0;   // embeddings whose scatter rows were gathered instead of summed
};

// Whether an embedding's scatter part ([rows, dim] gradient rows per rank, i32 ids) travels more cheaply
// gathered from world ranks than its [vocab, dim] table summed in the wire dtype (by the bytes moved).
bool sparse_embedding_exchange(int64_t world, int64_t rows, int64_t vocab, int64_t dim, DType wire);

// Appends the all-reduce of every parameter gradient of graph (which must have its backward pass, seeded
// with this rank's weight, which GradSync::weight then is) and of loss and parts (f32 scalars) over comm. A
// bucket of one gradient in f32 is summed in place; others are packed. Buckets hold up to bucket_bytes of f32
// gradients (and at most kAllReduceMaxTensors tensors), in the order backward finishes them, and travel as
// wire (F32 or BF16). An embedding whose gradient is an in-place scatter by i32 ids (plus a tied head's part)
// is exchanged sparsely when sparse_embedding_exchange says so: its rows (f32) are gathered and scattered on
// every rank, and the head's part, if any, gets a bucket of its own. Throws retort::Error on a graph without
// gradients or a bad bucket size, or an unseeded backward.
GradSync append_grad_sync(Graph& graph, Collective& comm, Tensor* loss, const std::vector<Tensor*>& parts,
                          DType wire, int64_t bucket_bytes);

}  // namespace retort

namespace retort {

// ZeRO-1: each rank keeps AdamW's state for, and updates, only its share of the parameters. The parameters
// (those with a gradient in the graph) are grouped as gradient buckets are (at most kAllReduceMaxTensors
// tensors, about bucket_bytes), each group's elements seen as one run cut into comm.size() equal slices;
// rank r owns slice r of every group. After the update, each group is gathered from its owners.
struct ZeroShard {
  std::vector<Tensor*> params;            // this rank's pieces of the parameters: leaves aliasing them
  std::vector<const Tensor*> grads;       // the same pieces of their summed gradients
  std::vector<const Tensor*> full_grads;  // every whole gradient, for the global norm
  std::vector<std::vector<Tensor*>> groups;
  std::vector<int64_t> slices;  // elements per rank, per group
  Tensor* staging = nullptr;    // shared by the gathers, which run one after another
  int64_t owned = 0, total = 0;  // elements this rank updates, of all
  // Per piece: its parameter and first element there, its group and first element in this rank's slice.
  std::vector<Tensor*> piece_param;
  std::vector<int64_t> piece_off, piece_group, piece_at;
};

// Cuts the parameters of graph (which must have its backward pass; f32 parameters only) among comm's ranks.
// Throws retort::Error on a graph without gradients, a parameter that is not f32, or a bad bucket size.
ZeroShard zero_shard(Graph& graph, Collective& comm, int64_t bucket_bytes);
// Appends to graph the gather of every group after `after` (the update that wrote this rank's slices) and
// returns the last; the next step's forward reads the gathered parameters.
Tensor* append_param_gather(Graph& graph, Collective& comm, const ZeroShard& shard, Tensor* after);
// The whole moments (m and v of each of params, in that order: 2 x params.size() vectors) from every rank's
// slices over host, on rank 0 (empty on the others): what a checkpoint holds, so that it resumes at any world
// size. moments[i] is the optimizer's state i over the pieces (AdamW's m or v). Every rank must call it.
std::vector<std::vector<float>> gather_moments(const ZeroShard& shard, const std::vector<Tensor*>& m,
                                               const std::vector<Tensor*>& v, dist::TcpGroup& host,
                                               const std::vector<Tensor*>& params);
// Fills this rank's pieces of m and v from whole moments: read(p, false) gives parameter p's m, read(p,
// true) its v (p's element count each).
void scatter_moments(const ZeroShard& shard, const std::vector<Tensor*>& m, const std::vector<Tensor*>& v,
                     const std::function<std::vector<float>(const Tensor*, bool)>& read);

}  // namespace retort
