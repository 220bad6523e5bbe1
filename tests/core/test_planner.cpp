// The memory planner: hand-built cases, then a property test over many random graphs of elementwise,
// reduction and view ops (with and without a backward pass): live slots never overlap, views keep their base
// alive, outputs are never reused, peak <= naive, and a planned run gives bit-for-bit the values of a run in
// which every node has its own buffer.
#include <gtest/gtest.h>

#include <climits>
#include <unordered_map>

#include "core/op_table.h"
#include "core/planner.h"
#include "harness.h"

namespace retort::test {
namespace {

// ---- invariants of a plan, checked for any node list ------------------------------------------------------

bool owns_storage(const Tensor* t) {
  return t->op != Op::None && t->op != Op::View && t->op != Op::Accumulate;
}

void check_plan(const std::vector<Tensor*>& nodes, const Plan& plan, size_t alignment) {
  std::unordered_map<const Tensor*, int> step;
  for (int i = 0; i < int(nodes.size()); ++i) step[nodes[i]] = i;
  std::unordered_map<const Tensor*, const PlanSlot*> slot;
  size_t naive = 0, top = 0;
  for (const PlanSlot& s : plan.slots) {
    ASSERT_TRUE(owns_storage(s.tensor)) << op_name(s.tensor->op) << " got a slot";
    ASSERT_TRUE(slot.emplace(s.tensor, &s).second) << "two slots for one tensor";
    EXPECT_GE(s.size, s.tensor->nbytes());
    EXPECT_EQ(s.size % alignment, 0u);
    EXPECT_EQ(s.offset % alignment, 0u);
    EXPECT_LE(s.first, s.last);
    // The writer's step: the node's own, or for an extra output its owner's.
    const Tensor* writer = s.tensor->op == Op::AuxOutput ? s.tensor->src[0] : s.tensor;
    EXPECT_EQ(s.first, step.at(writer));
    naive += s.size;
    top = std::max(top, s.offset + s.size);
  }
  for (const Tensor* n : nodes)
    if (owns_storage(n)) {
      EXPECT_TRUE(slot.count(n)) << op_name(n->op) << " has no slot";
    }
  EXPECT_EQ(plan.naive_bytes, naive);
  EXPECT_EQ(plan.arena_bytes, top);
  EXPECT_LE(plan.arena_bytes, plan.naive_bytes);

  // Slots live at the same time never share a byte.
  for (size_t i = 0; i < plan.slots.size(); ++i)
    for (size_t j = i + 1; j < plan.slots.size(); ++j) {
      const PlanSlot& a = plan.slots[i];
      const PlanSlot& b = plan.slots[j];
      bool live_together = a.first <= b.last && b.first <= a.last;
      bool overlap = a.offset < b.offset + b.size && b.offset < a.offset + a.size;
      ASSERT_FALSE(live_together && overlap)
          << op_name(a.tensor->op) << " [" << a.first << ", " << a.last << "] at " << a.offset << " and "
          << op_name(b.tensor->op) << " [" << b.first << ", " << b.last << "] at " << b.offset;
    }

  // Every read, direct or through a view, happens while the storage it reads is live.
  for (int i = 0; i < int(nodes.size()); ++i)
    for (Tensor* s : nodes[i]->src) {
      if (!s) continue;
      auto it = slot.find(storage_root(s));
      if (it == slot.end()) continue;
      EXPECT_LE(it->second->first, i);
      EXPECT_GE(it->second->last, i) << op_name(nodes[i]->op) << " at step " << i << " reads "
                                     << op_name(s->op) << " whose storage died at step " << it->second->last;
    }

  // Outputs and the loss (or the storage an output view shows) stay live to the end.
  for (Tensor* n : nodes)
    if (n->has(kOutput) || n->has(kLoss)) {
      auto it = slot.find(storage_root(n));
      if (it != slot.end()) {
        EXPECT_EQ(it->second->last, INT_MAX) << op_name(n->op) << " output reused";
      }
    }
}

// ---- hand-built cases -------------------------------------------------------------------------------------

TEST(Planner, ChainNeedsTwoBuffersNotOne) {
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.input(DType::F32, {1000}, "x");
  Tensor* y = x;
  for (int i = 0; i < 10; ++i) y = tanh(ctx, y);
  y->flags |= kOutput;
  Graph g(ctx);
  g.forward(y);
  const Plan& p = g.plan();
  check_plan(g.nodes(), p, kPlanAlignment);
  const size_t slot = 4096;  // 4000 bytes rounded up to 256
  EXPECT_EQ(p.naive_bytes, 10 * slot);
  EXPECT_EQ(p.arena_bytes, 2 * slot);  // a chain ping-pongs between two buffers
  EXPECT_LT(p.arena_bytes, p.naive_bytes);
}

TEST(Planner, OutputsAreNeverReused) {
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.input(DType::F32, {256}, "x");
  Tensor* a = tanh(ctx, x);
  a->flags |= kOutput;
  Tensor* y = a;
  for (int i = 0; i < 6; ++i) y = neg(ctx, y);
  y->flags |= kOutput;
  Graph g(ctx);
  g.forward(y);
  const Plan& p = g.plan();
  check_plan(g.nodes(), p, kPlanAlignment);
  // a's slot overlaps no other.
  for (const PlanSlot& s : p.slots) {
    if (s.tensor == a) continue;
    const PlanSlot* sa = nullptr;
    for (const PlanSlot& t : p.slots)
      if (t.tensor == a) sa = &t;
    ASSERT_NE(sa, nullptr);
    EXPECT_TRUE(s.offset >= sa->offset + sa->size || sa->offset >= s.offset + s.size);
  }
}

TEST(Planner, ViewsKeepTheirBaseAlive) {
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.input(DType::F32, {8, 8}, "x");
  Tensor* base = exp(ctx, x);
  Tensor* v = slice(ctx, transpose(ctx, base), 1, 2, 3);
  Tensor* y = x;
  for (int i = 0; i < 5; ++i) y = tanh(ctx, y);
  Tensor* late = contiguous(ctx, v);
  Tensor* out = add(ctx, late, slice(ctx, y, 1, 0, 3));
  out->flags |= kOutput;
  Graph g(ctx);
  // Ordered so that base is written first, the tanh chain (which could reuse its memory) runs next, and
  // base is read through its views only after that.
  g.forward(v);
  g.forward(y);
  g.forward(out);
  const Plan& p = g.plan();
  check_plan(g.nodes(), p, kPlanAlignment);
  int late_step = -1;
  for (int i = 0; i < int(g.nodes().size()); ++i)
    if (g.nodes()[i] == late) late_step = i;
  ASSERT_GE(late_step, 7);
  for (const PlanSlot& s : p.slots)
    if (s.tensor == base) {
      EXPECT_GE(s.last, late_step) << "base died before its view was read";
    }
  g.set_poison(true);
  set_data(x, std::vector<float>(64, 0.5f));
  g.compute();
  const float want = std::exp(0.5f) + std::tanh(std::tanh(std::tanh(std::tanh(std::tanh(0.5f)))));
  for (float f : get_data(out)) EXPECT_FLOAT_EQ(f, want);
}

TEST(Planner, OutputViewKeepsItsStorage) {
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.input(DType::F32, {4, 4}, "x");
  Tensor* base = tanh(ctx, x);
  Tensor* v = transpose(ctx, base);
  v->flags |= kOutput;
  Tensor* y = base;
  for (int i = 0; i < 4; ++i) y = neg(ctx, y);
  Graph g(ctx);
  g.forward(v);
  g.forward(y);
  check_plan(g.nodes(), g.plan(), kPlanAlignment);
}

TEST(Planner, ExtraOutputsLiveFromTheirOwnersStep) {
  // An owner that writes an extra output: both are written at the owner's step, so they must not overlap.
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.input(DType::F32, {64}, "x");
  Tensor* owner = tanh(ctx, x);
  Tensor* extra = ctx.node(Op::AuxOutput, DType::F32, x->ne);
  extra->src[0] = owner;
  owner->aux[0] = extra;
  Tensor* y = owner;
  for (int i = 0; i < 3; ++i) y = neg(ctx, y);
  Tensor* out = add(ctx, y, extra);
  Graph g(ctx);
  g.forward(out);
  const Plan& p = g.plan();
  check_plan(g.nodes(), p, kPlanAlignment);
  const PlanSlot *so = nullptr, *se = nullptr;
  for (const PlanSlot& s : p.slots) {
    if (s.tensor == owner) so = &s;
    if (s.tensor == extra) se = &s;
  }
  ASSERT_TRUE(so && se);
  EXPECT_EQ(se->first, so->first);
  EXPECT_TRUE(se->offset >= so->offset + so->size || so->offset >= se->offset + se->size);
}

TEST(Planner, CustomAlignment) {
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.input(DType::BF16, {7}, "x");
  Tensor* y = x;
  for (int i = 0; i < 5; ++i) y = neg(ctx, y);
  Graph g(ctx);
  g.forward(y);
  for (size_t a : {size_t(1), size_t(2), size_t(64), size_t(4096)}) {
    Plan p = plan_memory(g.nodes(), a);
    check_plan(g.nodes(), p, a);
    EXPECT_EQ(p.slots[0].size, (14 + a - 1) / a * a);
  }
}

TEST(Planner, PlanIsCachedUntilTheGraphChanges) {
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.input(DType::F32, {16}, "x");
  Graph g(ctx);
  g.forward(tanh(ctx, x));
  EXPECT_EQ(g.plan().slots.size(), 1u);
  const Plan* first = &g.plan();
  EXPECT_EQ(&g.plan(), first);
  g.forward(neg(ctx, x));
  EXPECT_EQ(g.plan().slots.size(), 2u);
}

TEST(Planner, EmptyNodeList) {
  Plan p = plan_memory({});
  EXPECT_EQ(p.arena_bytes, 0u);
  EXPECT_EQ(p.naive_bytes, 0u);
  EXPECT_TRUE(p.slots.empty());
}

// ---- random graphs ----------------------------------------------------------------------------------------

// Grows a random DAG: every op draws its operands from the tensors built so far (recent ones more often).
class RandomGraph {
 public:
  RandomGraph(Context& ctx, std::mt19937_64& rng, bool params) : ctx_(ctx), rng_(rng) {
    int leaves = int(pick(2, 4));
    for (int i = 0; i < leaves; ++i) {
      Shape s;
      int dims = int(pick(1, 4));
      for (int d = 0; d < dims; ++d) s.push_back(pick(1, 6));
      DType dt = pick(0, 4) == 0 ? DType::BF16 : DType::F32;
      Tensor* t = params ? ctx.param(dt, s, std::string("p") + std::to_string(i))
                         : ctx.input(dt, s, std::string("x") + std::to_string(i));
      Vec v = random_vec(t->nelements(), -1.5, 1.5);
      set_data(t, std::vector<float>(v.begin(), v.end()));
      pool_.push_back(t);
    }
  }

  void grow(int ops) {
    for (int i = 0; i < ops; ++i) {
      Tensor* t = one_op();
      if (pick(0, 5) == 0) t->flags |= kOutput;
      pool_.push_back(t);
    }
  }

  // Tensors no other node reads: the roots to ask the graph for.
  std::vector<Tensor*> sinks() const {
    std::unordered_map<const Tensor*, int> used;
    for (Tensor* t : pool_)
      for (Tensor* s : t->src)
        if (s) used[s]++;
    std::vector<Tensor*> out;
    for (Tensor* t : pool_)
      if (!t->is_leaf() && !used.count(t)) out.push_back(t);
    return out;
  }
  const std::vector<Tensor*>& all() const { return pool_; }

 private:
  int64_t pick(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng_); }
  Tensor* operand() {
    // Skewed toward the newest tensors so chains grow deep, but any tensor can be picked.
    size_t n = pool_.size();
    size_t back =
        size_t(std::min<int64_t>(int64_t(n) - 1, pick(0, 3) == 0 ? pick(0, int64_t(n) - 1) : pick(0, 2)));
    return pool_[n - 1 - back];
  }
  Tensor* same_shape_as(Tensor* x, bool same_dtype = false) {
    std::vector<Tensor*> c;
    for (Tensor* t : pool_)
      if (same_shape(t, x) && (!same_dtype || t->dtype == x->dtype)) c.push_back(t);
    return c[size_t(pick(0, int64_t(c.size()) - 1))];
  }

  Tensor* one_op() {
    Tensor* x = operand();
    const bool big = x->nelements() > 2000;
    switch (pick(0, 9)) {
      case 0: {
        switch (pick(0, 4)) {
          case 0:
            return tanh(ctx_, x);
          case 1:
            return neg(ctx_, x);
          case 2:
            return scale(ctx_, x, 0.75f);
          case 3:
            return silu(ctx_, x);
          default:
            return relu(ctx_, x);
        }
      }
      case 1: {
        Tensor* y = same_shape_as(x);
        return pick(0, 1) ? add(ctx_, x, y) : mul(ctx_, x, y);
      }
      case 2: {  // a broadcast partner: one of x's own reductions
        Tensor* r = pick(0, 1) ? mean_rows(ctx_, x) : max_rows(ctx_, x);
        return pick(0, 1) ? sub(ctx_, x, r) : mul(ctx_, x, r);
      }
      case 3: {
        switch (pick(0, 5)) {
          case 0:
            return sum_rows(ctx_, x);
          case 1:
            return mean_rows(ctx_, x);
          case 2:
            return max_rows(ctx_, x);
          case 3:
            return sum(ctx_, x);
          case 4:
            return mean(ctx_, x);
          default:
            return max(ctx_, x);
        }
      }
      case 4: {
        int a[4] = {0, 1, 2, 3};
        std::shuffle(a, a + 4, rng_);
        return pick(0, 1) ? transpose(ctx_, x) : permute(ctx_, x, a[0], a[1], a[2], a[3]);
      }
      case 5: {
        int d = int(pick(0, 3));
        int64_t len = pick(1, x->ne[d]);
        return slice(ctx_, x, d, pick(0, x->ne[d] - len), len);
      }
      case 6: {
        Tensor* c = x->is_contiguous() ? x : contiguous(ctx_, x);
        Shape s = {x->nelements()};
        for (int64_t f : {2, 3})
          if (x->nelements() % f == 0 && pick(0, 1)) s = {f, x->nelements() / f};
        return reshape(ctx_, c, s);
      }
      case 7:
        return pick(0, 1) ? cast(ctx_, x, x->dtype == DType::F32 ? DType::BF16 : DType::F32)
                          : contiguous(ctx_, x);
      case 8: {
        if (big) return tanh(ctx_, x);
        int64_t ne[kMaxDims];
        for (int d = 0; d < kMaxDims; ++d) ne[d] = x->ne[d] == 1 ? pick(1, 3) : x->ne[d];
        if (pick(0, 1)) return repeat(ctx_, x, ne);
        for (int d = 0; d < kMaxDims; ++d) ne[d] = pick(0, 1) ? 1 : x->ne[d];
        return reduce_to(ctx_, x, ne);
      }
      default: {
        if (big) return neg(ctx_, x);
        int d = int(pick(0, 3));
        return concat(ctx_, x, pick(0, 1) ? x : same_shape_as(x, true), d);
      }
    }
  }

  Context& ctx_;
  std::mt19937_64& rng_;
  std::vector<Tensor*> pool_;
};

// Runs the graph's nodes with every owning node in a buffer of its own: the plan-free result.
void run_unplanned(Graph& g, std::vector<std::shared_ptr<Buffer>>& keep) {
  Backend& be = g.ctx().backend();
  for (Tensor* n : g.nodes()) {
    if (n->op == Op::View) {
      n->data = static_cast<char*>(n->view_src->data) + n->view_offs;
    } else if (n->op == Op::Accumulate) {
      n->data = n->src[0]->data;
    } else {
      keep.push_back(be.alloc(n->nbytes()));
      n->data = keep.back()->data();
      be.fill_bytes(n->data, 0xff, n->nbytes());  // the same poison as the planned run
    }
  }
  for (Tensor* n : g.nodes()) {
    if (n->op != Op::View && n->op != Op::AuxOutput) be.run(n);
  }
}

void random_graph_case(int seed, bool with_backward) {
  SCOPED_TRACE("seed " + std::to_string(seed) + (with_backward ? " with backward" : ""));
  reseed("planner_random_" + std::to_string(seed) + (with_backward ? "b" : "f"));
  Context ctx(default_cpu_backend());
  RandomGraph rg(ctx, rng(), with_backward);
  rg.grow(int(std::uniform_int_distribution<int>(5, 40)(rng())));
  Graph g(ctx);
  std::vector<Tensor*> roots = rg.sinks();
  for (Tensor* r : roots) g.forward(r);
  std::vector<Tensor*> watched;
  for (Tensor* t : rg.all())
    if (t->has(kOutput)) watched.push_back(t);
  if (with_backward) {
    Tensor* loss = nullptr;
    for (Tensor* r : roots) {
      Tensor* s = sum(ctx, r);
      loss = loss ? add(ctx, loss, s) : s;
    }
    g.backward(loss);
    watched.push_back(loss);
    for (Tensor* p : g.params()) watched.push_back(g.grad(p));
  } else {
    for (Tensor* r : roots) {
      r->flags |= kOutput;
      watched.push_back(r);
    }
  }
  check_plan(g.nodes(), g.plan(), kPlanAlignment);
  if (::testing::Test::HasFatalFailure()) return;

  g.set_poison(true);
  g.compute();
  std::vector<std::vector<float>> planned;
  for (Tensor* t : watched) planned.push_back(get_data(t));
  g.zero_grad();
  // run_unplanned runs the nodes itself, not through compute(): grad() carries out the lazy zero_grad()
  // first.
  for (Tensor* p : g.params()) g.grad(p);
  std::vector<std::shared_ptr<Buffer>> keep;
  run_unplanned(g, keep);
  for (size_t i = 0; i < watched.size(); ++i) {
    auto want = get_data(watched[i]);
    ASSERT_EQ(planned[i].size(), want.size());
    for (size_t j = 0; j < want.size(); ++j) {
      // Bit-equal: the same kernels on the same inputs; only the placement differs. NaN == NaN here.
      uint32_t a, b;
      std::memcpy(&a, &planned[i][j], 4);
      std::memcpy(&b, &want[j], 4);
      // The poison pattern itself (f32, or bf16 widened) means no kernel wrote the element.
      ASSERT_TRUE(a != 0xffffffffu && a != 0xffff0000u)
          << "element " << j << " of " << watched[i]->describe() << " was never written";
      ASSERT_EQ(a, b) << "watched tensor " << i << " (" << watched[i]->describe() << ", "
                      << op_name(watched[i]->op) << ") element " << j << ": planned " << planned[i][j]
                      << ", own buffers " << want[j];
    }
  }
}

TEST(PlannerProperty, RandomForwardGraphs) {
  for (int seed = 0; seed < 150; ++seed) {
    random_graph_case(seed, false);
    if (HasFatalFailure()) return;
  }
}

TEST(PlannerProperty, RandomGraphsWithBackward) {
  for (int seed = 0; seed < 150; ++seed) {
    random_graph_case(seed, true);
    if (HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace retort::test
