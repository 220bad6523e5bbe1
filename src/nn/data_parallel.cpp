#include "data_parallel.h"

#include <algorithm>
#include <unordered_map>

#include "../core/error.h"
#include "../ops/collective_ops.h"

namespace retort {

GradSync append_grad_sync(Graph& graph, Collective& comm, Tensor* loss, const std::vector<Tensor*>& parts,
                          DType wire, int64_t bucket_bytes) {
  RT_CHECK(bucket_bytes >= 1, "data parallel: bucket size ", bucket_bytes, " bytes must be >= 1");
  RT_CHECK(!graph.params().empty(), "data parallel: the graph has no gradients to sum (call backward first)");
  Context& ctx = graph.ctx();
  std::unordered_map<const Tensor*, size_t> pos;
  for (size_t i = 0; i < graph.nodes().size(); ++i) pos[graph.nodes()[i]] = i;
  std::vector<Tensor*> writers;
  for (const Tensor* p : graph.params()) {
    Tensor* w = graph.grad_writer(p);
    RT_ASSERT(w != nullptr && pos.count(w));
    writers.push_back(w);
  }
  // In the order backward finishes them: the first bucket can start while most of backward is still to run.
  std::stable_sort(writers.begin(), writers.end(), [&](Tensor* a, Tensor* b) { return pos[a] < pos[b]; });
  GradSync sync;
  sync.weight = ctx.tensor(DType::F32, {1}, "data_parallel.weight");
  std::vector<Tensor*> bucket_nodes;
  Tensor* prev = nullptr;
  std::vector<Tensor*> bucket;
  int64_t bytes = 0;
  auto flush = [&] {
    if (bucket.empty()) return;
    prev = all_reduce_op(ctx, comm, bucket, sync.weight, prev, wire, false);
    bucket_nodes.push_back(prev);
    bucket.clear();
    bytes = 0;
  };
  for (Tensor* w : writers) {
    const int64_t b = w->nelements() * 4;
    if (!bucket.empty() && (bytes + b > bucket_bytes || bucket.size() == size_t(kAllReduceMaxTensors))) flush();
    bucket.push_back(w);
    bytes += b;
  }
  flush();
  std::vector<Tensor*> scalars{loss};
  scalars.insert(scalars.end(), parts.begin(), parts.end());
  // The loss and its parts in f32 whatever the wire: they are a handful of floats, and they are reported.
  sync.loss = all_reduce_op(ctx, comm, scalars, sync.weight, prev, DType::F32, true);
  graph.forward(sync.loss);
  for (Tensor* n : bucket_nodes) graph.schedule_early(n);
  sync.buckets = int(bucket_nodes.size());
  return sync;
}

}  // namespace retort
