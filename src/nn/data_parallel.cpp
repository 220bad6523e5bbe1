#include "data_parallel.h"

#include <algorithm>
#include <unordered_map>

#include "../core/error.h"
#include "../ops/collective_ops.h"

namespace retort {

bool sparse_embedding_exchange(int64_t world, int64_t rows, int64_t vocab, int64_t dim, DType wire) {
  // A ring all-reduce moves about 2 (W-1)/W of the table through each rank; an all-gather (W-1)/W of every
  // rank's rows and ids together. In doubles, so a huge table or batch decides without overflowing.
  const double gathered = double(world) * double(rows) * (double(dim) * 4.0 + 4.0);
  const double reduced = 2.0 * double(vocab) * double(dim) * double(dtype_size(wire));
  return gathered < reduced;
}

namespace {

// An embedding whose gradient is an in-place scatter (get_rows_back) of rows that name their table rows by
// i32 ids, optionally on top of a fused loss's dense weight gradient (a tied lm-head) written into the same
// accumulator: what append_grad_sync can exchange sparsely. scatter is null when the gradient is not that.
struct EmbeddingGrad {
  Tensor* scatter = nullptr;  // the writer: get_rows_back(rows, ids) + addend, in place in the accumulator
  Tensor* head = nullptr;     // the tied head's dense part (the scatter's addend), or null when untied
};

EmbeddingGrad embedding_grad(Tensor* w) {
  EmbeddingGrad e;
  if (w->op != Op::GetRowsBack || !w->view_src || w->dtype != DType::F32 || !w->is_contiguous()) return e;
  const Tensor* rows = w->src[0];
  const Tensor* ids = w->src[1];
  if (rows->dtype != DType::F32 || !rows->is_contiguous() || ids->dtype != DType::I32 ||
      !ids->is_contiguous())
    return e;
  Tensor* add = w->src[2];
  if (add == w->view_src) {
    e.scatter = w;  // untied: the scatter starts the accumulator
  } else if (add && add->op == Op::AuxOutput && add->view_src == w->view_src) {
    e.scatter = w;
    e.head = add;
  }
  return e;
}

}  // namespace

GradSync append_grad_sync(Graph& graph, Collective& comm, Tensor* loss, const std::vector<Tensor*>& parts,
                          DType wire, int64_t bucket_bytes) {
  RT_CHECK(bucket_bytes >= 1, "data parallel: bucket size ", bucket_bytes, " bytes must be >= 1");
  RT_CHECK(!graph.params().empty(), "data parallel: the graph has no gradients to sum (call backward first)");
  RT_CHECK(graph.seed() != nullptr,
           "data parallel: the graph's backward must be seeded with the rank's weight (Graph::backward(loss, "
           "weight)), so that the gradients summed over the ranks are the whole batch's");
  Context& ctx = graph.ctx();
  // What is summed, in the order backward finishes it: whole gradients (their writers), a tied head's dense
  // part alone (ready once the fused loss has run, long before the embedding's scatter adds to it), and an
  // embedding's scatter rows, which are gathered instead of summed.
  enum class Kind { Dense, Head, Rows };
  struct Item {
    Tensor* t;
    Kind kind;
    Tensor* scatter;
  };
  std::vector<Item> items;
  std::vector<Tensor*> scatters;
  for (const Tensor* p : graph.params()) {
    Tensor* w = graph.grad_writer(p);
    RT_ASSERT(w != nullptr);
    const EmbeddingGrad e = embedding_grad(w);
    if (e.scatter && sparse_embedding_exchange(comm.size(), w->src[0]->nrows(), w->ne[1], w->ne[0], wire)) {
      if (e.head) {
        // The head's gradient output joined the graph with the scatter that reads it, at the end of backward;
        // its owner writes it much earlier, which is where its bucket can start.
        graph.schedule_early(e.head);
        items.push_back({e.head, Kind::Head, w});
      }
      items.push_back({w->src[0], Kind::Rows, w});
      scatters.push_back(w);
    } else {
      items.push_back({w, Kind::Dense, nullptr});
    }
  }
  std::unordered_map<const Tensor*, size_t> pos;
  for (size_t i = 0; i < graph.nodes().size(); ++i) pos[graph.nodes()[i]] = i;
  // The first bucket can start while most of backward is still to run.
  auto at = [&](const Item& i) { return i.t->is_leaf() ? 0 : pos.at(i.t) + 1; };
  std::stable_sort(items.begin(), items.end(), [&](const Item& a, const Item& b) { return at(a) < at(b); });
  GradSync sync;
  sync.weight = graph.seed();
  std::vector<Tensor*> bucket_nodes;
  Tensor* prev = nullptr;
  std::vector<Tensor*> bucket;
  int64_t bytes = 0;
  auto flush = [&] {
    if (bucket.empty()) return;
    prev = all_reduce_op(ctx, comm, bucket, nullptr, prev, wire, false);
    bucket_nodes.push_back(prev);
    bucket.clear();
    bytes = 0;
  };
  for (const Item& i : items) {
    if (i.kind == Kind::Dense) {
      const int64_t b = i.t->nelements() * 4;
      if (!bucket.empty() && (bytes + b > bucket_bytes || bucket.size() == size_t(kAllReduceMaxTensors)))
        flush();
      bucket.push_back(i.t);
      bytes += b;
      continue;
    }
    flush();
    if (i.kind == Kind::Head) {
      // Its own bucket, launched as soon as the head's gradient exists; the scatter adds onto the sum.
      bucket.push_back(i.t);
      flush();
      i.scatter->src[2] = prev;
    } else {
      // Every rank scatters every rank's rows, in rank order, into the same summed head part (or zeros):
      // the same bits everywhere.
      prev = gather_rows_op(ctx, comm, i.t, i.scatter->src[1], prev);
      bucket_nodes.push_back(prev);
      i.scatter->src[0] = prev;
      i.scatter->src[1] = prev->src[3];
      ++sync.sparse;
    }
  }
  flush();
  std::vector<Tensor*> scalars{loss};
  scalars.insert(scalars.end(), parts.begin(), parts.end());
  // The loss and its parts in f32 whatever the wire: they are a handful of floats, and they are reported.
  // Unlike the gradients they are this rank's own means, so the weight applies here.
  sync.loss = all_reduce_op(ctx, comm, scalars, sync.weight, prev, DType::F32, true);
  graph.forward(sync.loss);
  for (Tensor* n : bucket_nodes) graph.schedule_early(n);
  for (Tensor* w : scatters) graph.schedule_late(w);
  sync.buckets = int(bucket_nodes.size()) - sync.sparse;
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
