// The collective as a graph op: data parallelism sums gradient buckets (and the loss) over the ranks of a
// process group inside the training graph, so a step keeps its single host wait. Placed right after the
// ops that finish a bucket's gradients (Graph::schedule_early), it runs while the rest of backward computes
// (on the GPU on the collective's own stream).
#pragma once
#include <vector>

#include "../core/collective.h"
#include "../core/context.h"
#include "../core/tensor.h"

namespace retort {

// Up to this many tensors per all_reduce node (the others' slots hold weight, order and staging).
inline constexpr int kAllReduceMaxTensors = kMaxSrc - 3;
// ip[3] of an all_reduce node in gather mode (all_gather_op) and in row-gather mode (gather_rows_op).
inline constexpr int64_t kAllGatherMode = 1, kGatherRowsMode = 2;

// Sums tensors (1..kAllReduceMaxTensors contiguous f32 tensors of ctx's backend, leaves or nodes) over
// comm's ranks in place: each is first multiplied by weight (an f32 [1] leaf the caller sets before each
// run, e.g. this rank's share of the step's tokens; null: 1), packed into a staging leaf made here in the
// wire dtype (F32, or BF16 to halve the bytes sent; summed in f32 either way), summed, and unpacked; a
// single tensor with an F32 wire and no weight is summed where it lies, with no staging (src[3] null). The
// node aliases tensors[0] and runs after `after` (an earlier all_reduce node, or null), so every rank issues
// its calls in the same order. With join, work after the node sees every sum issued so far; without, only
// later all_reduce nodes are ordered after it (a join must come before anything reads the sums). Throws
// retort::Error on an empty or too long list, a tensor that is not contiguous f32, a bad wire dtype or
// weight, or a communicator of another backend.
Tensor* all_reduce_op(Context& ctx, Collective& comm, const std::vector<Tensor*>& tensors, Tensor* weight,
                      Tensor* after, DType wire, bool join);

// ZeRO-1's parameter exchange, an all_reduce node in gather mode: tensors (1..kAllReduceMaxTensors contiguous
// f32 leaves, every rank the same list) are seen as one run of `total` elements cut into comm.size() slices
// of `slice` elements (slice * size >= total); this rank's slice is packed into staging (an f32 leaf of at
// least slice * size elements, which gather nodes may share), gathered from every rank, and unpacked into
// all of tensors. The node runs after `after` (any node: the update that wrote this rank's slice) and joins,
// so work after it reads the gathered values. Throws retort::Error on a bad list, slice or staging.
Tensor* all_gather_op(Context& ctx, Collective& comm, const std::vector<Tensor*>& tensors, Tensor* staging,
                      int64_t slice, Tensor* after);

// The sparse half of an embedding's gradient exchange, an all_reduce node in row-gather mode: every rank's
// gradient rows (rows: contiguous f32 [d, ...], N rows) and the ids they scatter to (ids: contiguous i32, N
// elements), gathered in rank order into leaves made here. The node is the gathered rows, f32 [d, size() * N]
// (rank r's rows at r * N), and its src[3] the gathered ids, i32 [size() * N]; scattering them
// (get_rows_back) gives every rank the same sum. It runs after `after` (an earlier all_reduce node, or null)
// and joins, so rows and ids may live in memory that later steps reuse. Throws retort::Error on rows or ids
// of another shape or dtype, or a communicator of another backend.
Tensor* gather_rows_op(Context& ctx, Collective& comm, Tensor* rows, Tensor* ids, Tensor* after);

// The communicator an all_reduce node calls.
inline Collective& all_reduce_comm(const Tensor* node) {
  return *reinterpret_cast<Collective*>(static_cast<intptr_t>(node->ip[0]));
}

}  // namespace retort
