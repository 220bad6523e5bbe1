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

namespace retort {

ZeroShard zero_shard(Graph& graph, Collective& comm, int64_t bucket_bytes) {
  RT_CHECK(bucket_bytes >= 1, "ZeRO-1: bucket size ", bucket_bytes, " bytes must be >= 1");
  RT_CHECK(!graph.params().empty(), "ZeRO-1: the graph has no gradients (call backward first)");
  Context& ctx = graph.ctx();
  const int64_t N = comm.size(), r = comm.rank();
  ZeroShard z;
  std::vector<Tensor*> group;
  int64_t bytes = 0;
  auto cut = [&] {
    if (group.empty()) return;
    int64_t total = 0;
    for (const Tensor* p : group) total += p->nelements();
    const int64_t slice = (total + N - 1) / N, lo = r * slice, hi = std::min(total, lo + slice);
    int64_t off = 0;
    for (Tensor* p : group) {
      const int64_t a = std::max(lo, off), b = std::min(hi, off + p->nelements());
      if (a < b) {
        float* pd = static_cast<float*>(p->data) + (a - off);
        float* gd = static_cast<float*>(graph.grad(p)->data) + (a - off);
        Tensor* piece = ctx.wrap(DType::F32, {b - a}, pd, nullptr, {}, p->name + ".zero1");
        piece->flags |= kParam;
        z.params.push_back(piece);
        z.grads.push_back(ctx.wrap(DType::F32, {b - a}, gd, nullptr, {}, p->name + ".zero1.grad"));
        z.piece_param.push_back(p);
        z.piece_off.push_back(a - off);
        z.piece_group.push_back(int64_t(z.groups.size()));
        z.piece_at.push_back(a - lo);
        z.owned += b - a;
      }
      off += p->nelements();
    }
    z.groups.push_back(group);
    z.slices.push_back(slice);
    z.total += total;
    group.clear();
    bytes = 0;
  };
  for (Tensor* p : graph.params()) {
    const Tensor* g = graph.grad(p);
    if (!g) continue;
    RT_CHECK(p->dtype == DType::F32 && p->is_contiguous(), "ZeRO-1: parameter ", p->describe(),
             " is not contiguous f32 (the shards are gathered in f32)");
    z.full_grads.push_back(g);
    const int64_t b = p->nelements() * 4;
    if (!group.empty() && (bytes + b > bucket_bytes || group.size() == size_t(kAllReduceMaxTensors))) cut();
    group.push_back(p);
    bytes += b;
  }
  cut();
  int64_t most = 0;
  for (int64_t s : z.slices) most = std::max(most, s);
  z.staging = ctx.tensor(DType::F32, {most * N}, "zero1.staging");
  return z;
}

Tensor* append_param_gather(Graph& graph, Collective& comm, const ZeroShard& shard, Tensor* after) {
  for (size_t i = 0; i < shard.groups.size(); ++i)
    after = all_gather_op(graph.ctx(), comm, shard.groups[i], shard.staging, shard.slices[i], after);
  graph.forward(after);
  return after;
}

}  // namespace retort

namespace retort {

std::vector<std::vector<float>> gather_moments(const ZeroShard& shard, const std::vector<Tensor*>& m,
                                               const std::vector<Tensor*>& v, dist::TcpGroup& host,
                                               const std::vector<Tensor*>& params) {
  RT_ASSERT(m.size() == shard.piece_param.size() && v.size() == m.size());
  // This rank's slices as one run: per group, the m slice then the v slice (zero where a slice is padding).
  std::vector<int64_t> base(shard.slices.size() + 1, 0);
  for (size_t g = 0; g < shard.slices.size(); ++g) base[g + 1] = base[g] + 2 * shard.slices[g];
  const int64_t per = base.back(), N = host.size();
  std::vector<float> mine(size_t(per), 0.0f), all(size_t(per * N));
  for (size_t i = 0; i < m.size(); ++i) {
    const int64_t g = shard.piece_group[i], at = base[size_t(g)] + shard.piece_at[i];
    const std::vector<float> mi = get_data(m[i]), vi = get_data(v[i]);
    std::copy(mi.begin(), mi.end(), mine.begin() + at);
    std::copy(vi.begin(), vi.end(), mine.begin() + at + shard.slices[size_t(g)]);
  }
  host.all_gather(mine.data(), all.data(), size_t(per) * sizeof(float));
  if (host.rank() != 0) return {};
  std::unordered_map<const Tensor*, size_t> index;
  for (size_t i = 0; i < params.size(); ++i) index[params[i]] = i;
  std::vector<std::vector<float>> out(2 * params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    out[i].assign(size_t(params[i]->nelements()), 0.0f);  // a parameter without a gradient keeps zeros
    out[params.size() + i].assign(size_t(params[i]->nelements()), 0.0f);
  }
  for (size_t g = 0; g < shard.groups.size(); ++g) {
    const int64_t S = shard.slices[g];
    int64_t off = 0;
    for (const Tensor* p : shard.groups[g]) {
      const auto it = index.find(p);
      RT_ASSERT(it != index.end());
      for (int64_t j = 0; j < p->nelements(); ++j) {
        // Element e of the group's run lives on rank e / S, at e % S of its slice.
        const int64_t e = off + j, from = (e / S) * per + base[g] + e % S;
        out[it->second][size_t(j)] = all[size_t(from)];
        out[params.size() + it->second][size_t(j)] = all[size_t(from + S)];
      }
      off += p->nelements();
    }
  }
  return out;
}

void scatter_moments(const ZeroShard& shard, const std::vector<Tensor*>& m, const std::vector<Tensor*>& v,
                     const std::function<std::vector<float>(const Tensor*, bool)>& read) {
  RT_ASSERT(m.size() == shard.piece_param.size() && v.size() == m.size());
  for (size_t i = 0; i < m.size(); ++i) {
    const Tensor* p = shard.piece_param[i];
    const int64_t a = shard.piece_off[i], n = m[i]->nelements();
    for (const bool second : {false, true}) {
      const std::vector<float> whole = read(p, second);
      RT_ASSERT(int64_t(whole.size()) == p->nelements());
      set_data(second ? v[i] : m[i], std::vector<float>(whole.begin() + a, whole.begin() + a + n));
    }
  }
}

}  // namespace retort
