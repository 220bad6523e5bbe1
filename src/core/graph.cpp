#include "graph.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <unordered_set>

#include "error.h"
#include "op_table.h"

namespace retort {

void Graph::visit(Tensor* root) {
  // Iterative depth-first post-order, so deep graphs (long chains of layers) cannot overflow the stack.
  std::vector<std::pair<Tensor*, int>> stack{{root, 0}};
  while (!stack.empty()) {
    auto& [t, next] = stack.back();
    if (index_.count(t)) {
      stack.pop_back();
      continue;
    }
    if (next < kMaxSrc) {
      Tensor* s = t->src[next++];
      if (s && !index_.count(s)) stack.push_back({s, 0});
      continue;
    }
    Tensor* done = t;
    stack.pop_back();
    if (done->is_leaf()) {
      index_[done] = -1;  // leaves are not steps
      continue;
    }
    RT_CHECK(done->ctx == ctx_ || done->ctx->backend().name() == ctx_->backend().name(), "graph: node ",
             done->describe(), " (", op_name(done->op), ") lives on backend ", done->ctx->backend().name(),
             " but the graph runs on ", ctx_->backend().name(), "; copy it across explicitly");
    index_[done] = int(nodes_.size());
    nodes_.push_back(done);
    for (Tensor* a : done->aux)
      if (a && !index_.count(a)) {
        index_[a] = int(nodes_.size());
        nodes_.push_back(a);
      }
  }
  plan_.reset();
}

void Graph::forward(Tensor* root) {
  RT_CHECK(root != nullptr, "graph.forward: root is null");
  visit(root);
}

Tensor* Graph::grad(const Tensor* t) const {
  auto it = grads_.find(t);
  if (it == grads_.end()) return nullptr;
  if (zero_pending_ && t->is_leaf()) clear_pending_zero();
  return it->second;
}

void Graph::clear_pending_zero() const {
  for (Tensor* acc : accumulators_) acc->backend().fill_zero(acc->data, acc->nbytes());
  zero_pending_ = false;
}

namespace {

// How many readers each gradient node has (nodes, and the parameters' accumulators): a node that takes an
// addend (a matmul, an embedding's scatter: takes_addend) read only by a sum can take the other addend as its
// src[2] (the sum node itself becomes that node, so its readers need no rewiring), or add into its
// parameter's accumulator in place (Graph::backward). A non-leaf tensor whose gradient is such a node then
// shows the accumulated gradient in grad().
std::unordered_map<const Tensor*, int> fold_addend_sums(const std::unordered_map<const Tensor*, Tensor*>& g,
                                                        const std::vector<Tensor*>& sums) {
  std::unordered_map<const Tensor*, int> readers, shown;  // shown: as a non-leaf tensor's gradient
  std::unordered_set<const Tensor*> walked;
  std::vector<Tensor*> stack;
  for (auto& [t, gr] : g) {
    ++(t->is_leaf() ? readers : shown)[gr];
    stack.push_back(gr);
  }
  while (!stack.empty()) {
    Tensor* n = stack.back();
    stack.pop_back();
    if (!walked.insert(n).second) continue;
    for (Tensor* src : n->src)
      if (src) {
        ++readers[src];
        stack.push_back(src);
      }
  }
  for (Tensor* sum : sums)
    for (int k : {1, 0}) {
      Tensor* mm = sum->src[size_t(k)];
      Tensor* other = sum->src[size_t(1 - k)];
      const bool f32 = mm->dtype == DType::F32 && sum->dtype == DType::F32 && other->dtype == DType::F32;
      if (!takes_addend(mm) || readers[mm] != 1 || shown[mm] != 0 || !f32 || !other->is_contiguous() ||
          !same_shape(other, mm) || !same_shape(sum, mm))
        continue;
      sum->op = mm->op;
      sum->src = mm->src;
      sum->src[2] = other;
      sum->ip = mm->ip;
      sum->fp = mm->fp;
      break;
    }
  return readers;
}

// Whether a parameter's gradient gr can be written into its accumulator acc by the nodes that make it (no copy
// of the gradient, no Accumulate pass), and which node then starts the accumulator in a run after zero_grad
// (kFresh): a fused loss's aux output (its owner adds into the accumulator itself), a node that takes the
// accumulator as its addend (a matmul's GEMM C, an embedding's scatter), or a chain of the two.
struct InPlace {
  bool in_place = false;
  Tensor* fresh = nullptr;
};
InPlace wire_in_place(Tensor* gr, Tensor* acc, const std::unordered_map<const Tensor*, int>& readers) {
  bool same_shape = gr->dtype == DType::F32 && gr->is_contiguous();
  for (int d = 0; d < kMaxDims; ++d) same_shape = same_shape && gr->ne[d] == acc->ne[d];
  const bool aux = gr->op == Op::AuxOutput && gr->src[0] && !gr->view_src;
  auto offer = op_info(aux ? gr->src[0]->op : Op::None).accumulate_aux;
  const auto rd = readers.find(gr);
  const bool mm = same_shape && takes_addend(gr) && rd != readers.end() && rd->second == 1;
  if (mm) gr->src[2] = acc;
  // A folded sum whose addend is a fused loss's gradient output read by it alone (a tied embedding: the
  // head's weight gradient plus the embedding's scatter): the output starts the accumulator in place and
  // the sum's node adds its own term into it there, so neither a copy nor an Accumulate pass is left.
  Tensor* first = nullptr;
  if (!mm && same_shape && (gr->op == Op::Matmul || gr->op == Op::GetRowsBack) && gr->src[2] &&
      rd != readers.end() && rd->second == 1 && !gr->view_src) {
    Tensor* x = gr->src[2];
    const auto rx = readers.find(x);
    const bool x_aux = x->op == Op::AuxOutput && x->src[0] && !x->view_src && x->dtype == DType::F32 &&
                       x->is_contiguous() && ::retort::same_shape(x, acc) && rx != readers.end() &&
                       rx->second == 1;
    auto x_offer = op_info(x_aux ? x->src[0]->op : Op::None).accumulate_aux;
    if (x_aux && x_offer && x_offer(x)) {
      first = x;
      x->view_src = acc;
      x->data = acc->data;
    }
  }
  InPlace w;
  w.in_place = mm || first || (aux && same_shape && offer && offer(gr));
  w.fresh = first ? first : w.in_place ? gr : nullptr;
  return w;
}

}  // namespace

void Graph::backward(Tensor* loss, Tensor* seed) {
  RT_CHECK(loss != nullptr, "graph.backward: no loss given");
  RT_CHECK(!seed || (seed->is_leaf() && seed->dtype == DType::F32 && seed->nelements() == 1),
           "graph.backward: the seed must be an f32 leaf of one element, got ", seed->describe());
  RT_CHECK(!has_backward_, "graph.backward: this graph already has a backward pass");
  RT_CHECK(is_float(loss->dtype) && loss->nelements() == 1,
           "graph.backward: the loss must be a single float ", "element, got ", loss->describe());
  forward(loss);
  loss->flags |= kLoss;

  // Which tensors need a gradient: parameters and everything computed from them.
  std::unordered_set<const Tensor*> needs;
  std::vector<Tensor*> order;  // leaves first, then nodes in execution order
  std::unordered_set<const Tensor*> seen;
  std::function<void(Tensor*)> collect_leaves = [&](Tensor* t) {
    if (!t || seen.count(t)) return;
    seen.insert(t);
    for (Tensor* s : t->src) collect_leaves(s);
    if (t->is_leaf() && t->has(kParam)) {
      needs.insert(t);
      params_.push_back(t);
    }
  };
  for (Tensor* n : nodes_) collect_leaves(n);
  for (Tensor* n : nodes_)
    for (Tensor* s : n->src)
      if (s && needs.count(s)) {
        needs.insert(n);
        break;
      }
  RT_CHECK(needs.count(loss), "graph.backward: no parameter reaches the loss ", loss->describe(),
           " (mark trainable tensors with Context::param)");
  // Keep only parameters that actually reach the loss.
  std::unordered_set<const Tensor*> reaches{loss};
  for (int i = int(nodes_.size()) - 1; i >= 0; --i) {
    Tensor* n = nodes_[i];
    if (!reaches.count(n)) continue;
    for (Tensor* s : n->src)
      if (s) reaches.insert(s);
    if (n->op == Op::AuxOutput) reaches.insert(n->src[0]);
  }
  std::vector<Tensor*> kept;
  for (Tensor* p : params_)
    if (reaches.count(p)) kept.push_back(p);
  params_ = kept;

  // Autodiff makes its two nodes itself (a sum of gradients, the seed), so the graph needs nothing of the
  // op layer above it.
  std::vector<Tensor*> sums;
  auto sum_grads = [&](Tensor* a, Tensor* b) {
    RT_ASSERT(is_float(a->dtype) && is_float(b->dtype) && can_broadcast(b, a));
    Tensor* t = ctx_->node(Op::Add, a->dtype, a->ne);
    sums.push_back(t);
    t->src[0] = a;
    t->src[1] = b;
    return t;
  };
  std::unordered_map<const Tensor*, Tensor*> g;
  // Per parameter, the step of the reverse walk that gave it its last gradient term: its gradient is final
  // from then on.
  std::unordered_map<const Tensor*, int> finished;
  int walk = 0;
  auto add_grad = [&](Tensor* src, Tensor* gr) {
    RT_ASSERT(gr != nullptr);
    if (src->is_leaf()) finished[src] = walk;
    auto it = g.find(src);
    if (it == g.end()) {
      g[src] = gr;
    } else {
      it->second = sum_grads(it->second, gr);
    }
  };
  auto need = [&](const Tensor* t) { return needs.count(t) > 0 && reaches.count(t) > 0; };
  auto grad_of = [&](const Tensor* t) -> Tensor* {
    auto it = g.find(t);
    return it == g.end() ? nullptr : it->second;
  };
  BackwardCtx bc(*ctx_, need, add_grad, grad_of);

  int64_t one[kMaxDims] = {1, 1, 1, 1};
  Tensor* unit = ctx_->node(Op::Fill, DType::F32, one);
  unit->fp[0] = 1.0f;  // backward rules recognize this constant 1 (the single-pass losses)
  g[loss] = seed ? seed : unit;
  seed_ = seed;
  size_t forward_count = nodes_.size();
  for (int i = int(forward_count) - 1; i >= 0; --i, ++walk) {
    Tensor* n = nodes_[i];
    // An aux output whose owner differentiates it: the owner's rule (later in this reverse walk, since the
    // aux follows its owner in the order) reads its gradient.
    if (n->op == Op::AuxOutput && n->src[0] && op_info(n->src[0]->op).grads_through_aux) continue;
    const OpInfo& info = op_info(n->op);
    auto it = g.find(n);
    bool via_aux = false;
    if (info.grads_through_aux)
      for (Tensor* a : n->aux) via_aux = via_aux || (a && g.count(a));
    if (it == g.end() && !via_aux) continue;
    // An extra output names the op that wrote it: that is the op the caller built.
    const bool extra = n->op == Op::AuxOutput && n->src[0];
    RT_CHECK(info.differentiable && info.backward, "graph.backward: op ", op_name(n->op), " on ",
             n->describe(), extra ? " (an output of " : "", extra ? op_name(n->src[0]->op) : "",
             extra ? ")" : "", " has no gradient, but a parameter's gradient flows through it");
    info.backward(bc, n, it == g.end() ? nullptr : it->second);
  }
  const std::unordered_map<const Tensor*, int> readers = fold_addend_sums(g, sums);
  // The writers join the graph in the order their gradients are finished, each pulling in only the
  // gradient ops it needs: a layer's weight gradients then run as soon as its output gradient exists, before
  // the input gradients of the layers below, so a data-parallel bucket of them can be summed while the rest
  // of backward computes.
  std::vector<Tensor*> by_finish = params_;
  auto done = [&](const Tensor* p) {
    const auto it = finished.find(p);
    return it == finished.end() ? -1 : it->second;  // the loss itself, a parameter: seeded before the walk
  };
  std::stable_sort(by_finish.begin(), by_finish.end(),
                   [&](const Tensor* a, const Tensor* b) { return done(a) < done(b); });
  for (Tensor* p : by_finish) {
    auto it = g.find(p);
    RT_ASSERT(it != g.end());
    Tensor* acc = ctx_->tensor(DType::F32, p->shape(), p->name + ".grad");
    for (int d = 0; d < kMaxDims; ++d) RT_ASSERT(acc->ne[d] == p->ne[d]);
    Tensor* gr = it->second;
    const InPlace w = wire_in_place(gr, acc, readers);
    const bool in_place = w.in_place;
    Tensor* upd = in_place ? gr : ctx_->node(Op::Accumulate, DType::F32, acc->ne);
    if (!in_place) {
      upd->src[0] = acc;
      upd->src[1] = gr;
    }
    upd->view_src = acc;
    upd->data = acc->data;
    upd->flags |= kOutput;
    forward(upd);
    grads_[p] = acc;
    writers_[p] = upd;
    accumulators_.push_back(acc);
    in_place_.push_back(w.fresh);
  }
  for (auto& [t, gr] : g)
    if (!t->is_leaf()) grads_[t] = gr;
  has_backward_ = true;
  zero_pending_ = !accumulators_.empty();  // the first run writes the accumulators
  plan_.reset();
}

Tensor* Graph::grad_writer(const Tensor* p) const {
  const auto it = writers_.find(p);
  return it == writers_.end() ? nullptr : it->second;
}

void Graph::schedule_early(Tensor* node) {
  const auto it = index_.find(node);
  RT_CHECK(node && it != index_.end() && it->second >= 0,
           "graph.schedule_early: ", node ? node->describe() : std::string("null"),
           " is not a step of this graph");
  // Moving a step earlier never breaks the steps that read it (they all come after its old place); only its
  // sources bound how early it can go.
  const int at = it->second;
  int last = -1;
  for (const Tensor* s : node->src)
    if (s) last = std::max(last, index_.at(s));
  if (last + 1 >= at) return;
  nodes_.erase(nodes_.begin() + at);
  nodes_.insert(nodes_.begin() + last + 1, node);
  for (int i = last + 1; i <= at; ++i) index_[nodes_[size_t(i)]] = i;
  plan_.reset();
}

void Graph::schedule_late(Tensor* node) {
  const auto it = index_.find(node);
  RT_CHECK(node && it != index_.end() && it->second >= 0,
           "graph.schedule_late: ", node ? node->describe() : std::string("null"),
           " is not a step of this graph");
  const int at = it->second;
  int last = -1;
  for (const Tensor* s : node->src)
    if (s) last = std::max(last, index_.at(s));
  if (last <= at) return;
  for (int i = at + 1; i <= last; ++i)
    for (const Tensor* s : nodes_[size_t(i)]->src)
      RT_CHECK(s != node, "graph.schedule_late: ", nodes_[size_t(i)]->describe(), " (",
               op_name(nodes_[size_t(i)]->op), ") reads ", node->describe(), " but would run before it");
  nodes_.erase(nodes_.begin() + at);
  nodes_.insert(nodes_.begin() + last, node);
  for (int i = at; i <= last; ++i) index_[nodes_[size_t(i)]] = i;
  plan_.reset();
}

void Graph::zero_grad() {
  zero_pending_ = !accumulators_.empty();
}

const Plan& Graph::plan() {
  if (!plan_) plan_ = std::make_unique<Plan>(plan_memory(nodes_));
  return *plan_;
}

namespace {

// A 64-bit digest of everything a launch reads from the host: each node's identity, op, dtype, shape,
// strides, parameters, flags and the addresses of its output and operands. Two runs with equal digests
// issue the same launches, so a backend may replay the first's recording for the second.
uint64_t launch_signature(const std::vector<Tensor*>& nodes) {
  uint64_t h = 0x9e3779b97f4a7c15ull;
  auto mix = [&h](uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 0xff51afd7ed558ccdull;
  };
  auto word = [](const void* p) { return uint64_t(reinterpret_cast<uintptr_t>(p)); };
  mix(nodes.size());
  for (const Tensor* n : nodes) {
    mix(word(n));
    mix(uint64_t(n->op) << 40 | uint64_t(n->dtype) << 32 | n->flags);
    mix(word(n->data));
    for (int d = 0; d < kMaxDims; ++d) {
      mix(uint64_t(n->ne[d]));
      mix(uint64_t(n->nb[d]));
    }
    for (const Tensor* s : n->src) mix(s ? word(s->data) : 0);
    for (const Tensor* a : n->aux) mix(a ? word(a->data) : 0);
    for (int64_t v : n->ip) mix(uint64_t(v));
    for (float v : n->fp) {
      uint32_t u;
      std::memcpy(&u, &v, sizeof u);
      mix(u);
    }
  }
  return h;
}

}  // namespace

void Graph::compute() {
  Backend& be = ctx_->backend();
  const Plan& p = plan();
  if (!arena_ || arena_->size() < p.arena_bytes) arena_ = be.alloc(std::max<size_t>(p.arena_bytes, 1));
  char* base = static_cast<char*>(arena_->data());
  if (poison_) be.fill_bytes(base, 0xff, arena_->size());  // 0xffff... is NaN in f32, bf16 and f16
  for (const PlanSlot& s : p.slots) s.tensor->data = base + s.offset;
  for (Tensor* n : nodes_) {
    if (n->op == Op::View) n->data = static_cast<char*>(n->view_src->data) + n->view_offs;
    if (writes_into_src0(n->op)) n->data = n->src[0]->data;
    if (writes_accumulator(n)) n->data = n->view_src->data;  // an accumulator (backward)
  }
  // A pending zero_grad(): the in-place writers overwrite their accumulator in this run; the others are
  // cleared now. The flags come off however the run ends; if it throws, the zero_grad() stays pending.
  const bool fresh = zero_pending_;
  // With poison on, an overwritten accumulator starts as NaN too, so an element its writer misses shows.
  if (fresh)
    for (size_t i = 0; i < accumulators_.size(); ++i) {
      Tensor* acc = accumulators_[i];
      if (in_place_[i]) {
        in_place_[i]->flags |= kFresh;
        if (poison_) be.fill_bytes(acc->data, 0xff, acc->nbytes());
      } else {
        be.fill_zero(acc->data, acc->nbytes());
      }
    }
  auto unmark = [&] {
    for (Tensor* t : in_place_)
      if (t) t->flags &= ~uint32_t(kFresh);
  };
  try {
    for (Tensor* n : nodes_)
      for (Tensor* s : n->src)
        RT_CHECK(!s || s->data, "graph.compute: ", op_name(n->op), " reads ", s->describe(),
                 " which has no storage (is it on another context's backend?)");
    be.run_nodes(nodes_, be.records_launches() ? launch_signature(nodes_) : 0, replay_);
  } catch (...) {
    unmark();
    throw;
  }
  unmark();
  zero_pending_ = false;
}

}  // namespace retort
