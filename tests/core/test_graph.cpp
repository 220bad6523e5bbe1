// The graph: topological order, autodiff (shared nodes, accumulation across runs, error cases), deep graphs,
// repeatable runs, and poison mode.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "core/op_table.h"
#include "expect_error.h"
#include "harness.h"

namespace retort::test {
namespace {

Tensor* filled_param(Context& ctx, const Shape& s, const std::string& name, double lo = -1, double hi = 1) {
  Tensor* p = ctx.param(DType::F32, s, name);
  Vec v = random_vec(p->nelements(), lo, hi);
  set_data(p, std::vector<float>(v.begin(), v.end()));
  return p;
}

TEST(Graph, TopologicalOrder) {
  reseed("graph_topo");
  Context ctx(default_cpu_backend());
  Tensor* x = filled_param(ctx, {3, 4}, "x");
  Tensor* y = filled_param(ctx, {3, 4}, "y");
  // A diamond with a shared node and a view in the middle.
  Tensor* a = tanh(ctx, x);
  Tensor* b = mul(ctx, a, y);
  Tensor* c = exp(ctx, transpose(ctx, a));
  Tensor* d = add(ctx, b, transpose(ctx, c));
  Tensor* out = sum(ctx, d);
  Graph g(ctx);
  g.forward(out);
  std::unordered_map<const Tensor*, size_t> pos;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Tensor* n = g.nodes()[i];
    EXPECT_FALSE(n->is_leaf()) << "leaves are not steps";
    EXPECT_TRUE(pos.emplace(n, i).second) << "node listed twice";
  }
  for (const Tensor* n : g.nodes())
    for (const Tensor* s : n->src)
      if (s && !s->is_leaf()) {
        ASSERT_TRUE(pos.count(s)) << "a source is missing from the order";
        EXPECT_LT(pos[s], pos[n]) << op_name(s->op) << " must run before " << op_name(n->op);
      }
  EXPECT_EQ(g.nodes().size(), 7u);  // tanh, mul, transpose, exp, transpose, add, sum
  EXPECT_EQ(g.nodes().back(), out);
  // A second root adds only what is new.
  Tensor* e = neg(ctx, b);
  g.forward(e);
  EXPECT_EQ(g.nodes().size(), 8u);
  EXPECT_EQ(g.nodes().back(), e);
}

TEST(Graph, ForwardValues) {
  reseed("graph_forward");
  Context ctx(default_cpu_backend());
  Tensor* x = filled_param(ctx, {5}, "x");
  Tensor* y = add(ctx, mul(ctx, x, x), scale(ctx, x, 2.0f));  // x² + 2x
  y->flags |= kOutput;
  Graph g(ctx);
  g.forward(y);
  g.compute();
  auto xv = get_data(x), yv = get_data(y);
  for (size_t i = 0; i < xv.size(); ++i) EXPECT_FLOAT_EQ(yv[i], xv[i] * xv[i] + 2 * xv[i]);
}

TEST(Graph, NodeUsedTwiceGetsSummedGradients) {
  reseed("graph_twice");
  Context ctx(default_cpu_backend());
  Tensor* x = filled_param(ctx, {4, 3}, "x");
  Tensor* t = tanh(ctx, x);
  // t reaches the loss along three paths: t*t (both operands) and t itself.
  Tensor* loss = sum(ctx, add(ctx, mul(ctx, t, t), t));
  Graph g(ctx);
  g.backward(loss);
  g.compute();
  auto xv = get_data(x), gv = get_data(g.grad(x));
  for (size_t i = 0; i < xv.size(); ++i) {
    double th = std::tanh(double(xv[i]));
    EXPECT_NEAR(gv[i], (2 * th + 1) * (1 - th * th), 1e-6);
  }
  // The same parameter as both operands of one op.
  Context ctx2(default_cpu_backend());
  Tensor* p = filled_param(ctx2, {6}, "p");
  Graph g2(ctx2);
  g2.backward(sum(ctx2, mul(ctx2, p, p)));
  g2.compute();
  auto pv = get_data(p), pg = get_data(g2.grad(p));
  for (size_t i = 0; i < pv.size(); ++i) EXPECT_FLOAT_EQ(pg[i], 2 * pv[i]);
}

TEST(Graph, ChainRuleAcrossOpsMatchesFiniteDifferences) {
  // loss = mean(tanh(a * b + c)²) with b broadcast over rows; a float64 model of it gives the numbers.
  reseed("graph_chain");
  Context ctx(default_cpu_backend());
  Tensor* a = filled_param(ctx, {3, 4}, "a");
  Tensor* b = filled_param(ctx, {4}, "b");
  Tensor* c = filled_param(ctx, {3, 1}, "c");
  Tensor* h = tanh(ctx, add(ctx, mul(ctx, a, b), c));
  Graph g(ctx);
  g.backward(mean(ctx, mul(ctx, h, h)));
  g.compute();
  std::vector<Vec> vals = {to_f64(get_data(a)), to_f64(get_data(b)), to_f64(get_data(c))};
  auto f = [&]() {
    double s = 0;
    for (int r = 0; r < 3; ++r)
      for (int k = 0; k < 4; ++k) {
        double v = std::tanh(vals[0][size_t(r * 4 + k)] * vals[1][size_t(k)] + vals[2][size_t(r)]);
        s += v * v;
      }
    return s / 12;
  };
  Tensor* ps[] = {a, b, c};
  for (int i = 0; i < 3; ++i) {
    Vec got = to_f64(get_data(g.grad(ps[i])));
    Vec num(vals[size_t(i)].size());
    for (size_t j = 0; j < num.size(); ++j) {
      double keep = vals[size_t(i)][j];
      vals[size_t(i)][j] = keep + 1e-6;
      double fp = f();
      vals[size_t(i)][j] = keep - 1e-6;
      double fm = f();
      vals[size_t(i)][j] = keep;
      num[j] = (fp - fm) / 2e-6;
    }
    EXPECT_LE(nmse(got, num), 1e-9) << ps[i]->name;
  }
}

TEST(Graph, BackwardWithoutLossThrows) {
  Context ctx(default_cpu_backend());
  Graph g(ctx);
  expect_error([&] { g.backward(nullptr); }, {"graph.backward", "no loss"});
  expect_error([&] { g.forward(nullptr); }, {"graph.forward", "null"});
}

TEST(Graph, BackwardOfNonScalarThrows) {
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.param(DType::F32, {3}, "x");
  Graph g(ctx);
  expect_error([&] { g.backward(tanh(ctx, x)); }, {"graph.backward", "single float", "f32[3]"});
  Tensor* ids = ctx.tensor(DType::I32, {1}, "ids");
  expect_error([&] { g.backward(ids); }, {"graph.backward", "'ids' i32[1]"});
}

TEST(Graph, BackwardWithoutParameterThrows) {
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.input(DType::F32, {3}, "x");
  Graph g(ctx);
  expect_error([&] { g.backward(sum(ctx, tanh(ctx, x))); },
               {"graph.backward", "no parameter", "Context::param"});
}

TEST(Graph, SecondBackwardThrows) {
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.param(DType::F32, {3}, "x");
  Graph g(ctx);
  g.backward(sum(ctx, x));
  expect_error([&] { g.backward(mean(ctx, x)); }, {"graph.backward", "already"});
}

TEST(Graph, NonDifferentiableOpOnThePathThrows) {
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.param(DType::F32, {3}, "x");
  // relu_back is an internal gradient op with no gradient of its own; build one by hand.
  Tensor* rb = ctx.node(Op::ReluBack, DType::F32, x->ne);
  rb->src[0] = x;
  rb->src[1] = x;
  Graph g(ctx);
  expect_error([&] { g.backward(sum(ctx, rb)); }, {"graph.backward", "relu_back", "no gradient"});
}

TEST(Graph, ParameterOffThePathGetsNoGradient) {
  Context ctx(default_cpu_backend());
  Tensor* used = filled_param(ctx, {3}, "used");
  Tensor* unused = filled_param(ctx, {3}, "unused");
  Tensor* side = tanh(ctx, unused);  // in the graph, but not on the loss's path
  Graph g(ctx);
  g.forward(side);
  g.backward(sum(ctx, used));
  ASSERT_EQ(g.params().size(), 1u);
  EXPECT_EQ(g.params()[0], used);
  EXPECT_EQ(g.grad(unused), nullptr);
  ASSERT_NE(g.grad(used), nullptr);
  g.compute();
  EXPECT_EQ(get_data(g.grad(used)), (std::vector<float>{1, 1, 1}));
}

TEST(Graph, GradientsAccumulateAcrossRunsUntilZeroed) {
  reseed("graph_accumulate");
  Context ctx(default_cpu_backend());
  Tensor* w = filled_param(ctx, {2, 5}, "w");
  Tensor* x = ctx.input(DType::F32, {2, 5}, "x");
  Graph g(ctx);
  g.backward(sum(ctx, mul(ctx, tanh(ctx, w), x)));  // d/dw = x (1 - tanh² w)
  Vec x1 = random_vec(10), x2 = random_vec(10);
  set_data(x, std::vector<float>(x1.begin(), x1.end()));
  g.compute();
  auto g1 = get_data(g.grad(w));
  set_data(x, std::vector<float>(x2.begin(), x2.end()));
  g.compute();
  auto g12 = get_data(g.grad(w));
  g.zero_grad();
  EXPECT_EQ(get_data(g.grad(w)), std::vector<float>(10, 0.0f));
  g.compute();
  auto g2 = get_data(g.grad(w));
  for (size_t i = 0; i < 10; ++i) {
    EXPECT_NE(g1[i], 0.0f);
    EXPECT_FLOAT_EQ(g12[i], g1[i] + g2[i]);
  }
  auto wv = get_data(w);
  for (size_t i = 0; i < 10; ++i) {
    double th = std::tanh(double(wv[i]));
    EXPECT_NEAR(g2[i], x2[i] * (1 - th * th), 1e-6);
  }
}

// x feeds two matmuls: dx = u w1 + v w2 is one matmul taking the other as its C (no Add node), and each
// weight's gradient GEMM adds into its accumulator in place (no Accumulate node for w1, w2). Values against a
// float64 reference, accumulation across runs, zero_grad, and a poisoned run (the first GEMM after zero_grad
// must overwrite its accumulator, not add to it).
TEST(Graph, MatmulGradientsAddIntoTheirSumsAndAccumulators) {
  reseed("graph_matmul_addend");
  const int64_t R = 5, I = 4, O = 3;
  const Vec xv = random_vec(R * I), w1v = random_vec(O * I), w2v = random_vec(O * I), uv = random_vec(R * O),
            vv = random_vec(R * O);
  for (int poison = 0; poison < 2; ++poison) {
    Context ctx(default_cpu_backend());
    auto param = [&](const Shape& s, const Vec& v, const char* name) {
      Tensor* p = ctx.param(DType::F32, s, name);
      set_data(p, std::vector<float>(v.begin(), v.end()));
      return p;
    };
    Tensor* x = param({R, I}, xv, "x");
    Tensor* w1 = param({O, I}, w1v, "w1");
    Tensor* w2 = param({O, I}, w2v, "w2");
    Tensor* u = ctx.input(DType::F32, {R, O}, "u");
    Tensor* v = ctx.input(DType::F32, {R, O}, "v");
    set_data(u, std::vector<float>(uv.begin(), uv.end()));
    set_data(v, std::vector<float>(vv.begin(), vv.end()));
    Tensor* loss = add(ctx, sum(ctx, mul(ctx, matmul(ctx, x, w1, false, true), u)),
                       sum(ctx, mul(ctx, matmul(ctx, x, w2, false, true), v)));
    Graph g(ctx);
    g.backward(loss);
    g.set_poison(poison == 1);
    int adds = 0, accumulates = 0, addends = 0;
    for (const Tensor* n : g.nodes()) {
      adds += n->op == Op::Add;
      accumulates += n->op == Op::Accumulate;
      addends += n->op == Op::Matmul && n->src[2] != nullptr;
    }
    EXPECT_EQ(adds, 1);         // the loss's own
    EXPECT_EQ(accumulates, 1);  // x's: its gradient, a sum of two matmuls, is already one matmul with a C
    EXPECT_EQ(addends, 3);      // dx, and w1, w2 into their accumulators
    // dx[r, i] = Σ_o u[r, o] w1[o, i] + v[r, o] w2[o, i]; dw1[o, i] = Σ_r u[r, o] x[r, i] (w2 with v).
    Vec dx(size_t(R * I), 0.0), dw1(size_t(O * I), 0.0), dw2(size_t(O * I), 0.0);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t o = 0; o < O; ++o)
        for (int64_t i = 0; i < I; ++i) {
          const size_t ri = size_t(r * I + i), oi = size_t(o * I + i), ro = size_t(r * O + o);
          dx[ri] += uv[ro] * w1v[oi] + vv[ro] * w2v[oi];
          dw1[oi] += uv[ro] * xv[ri];
          dw2[oi] += vv[ro] * xv[ri];
        }
    auto expect = [&](const Tensor* p, const Vec& want, double times, const char* what) {
      const std::vector<float> got = get_data(g.grad(p));
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i)
        EXPECT_NEAR(got[i], times * want[i], 1e-5)
            << what << " x" << times << " at " << i << " poison " << poison;
    };
    for (double times : {1.0, 2.0}) {
      g.compute();
      expect(x, dx, times, "dx");
      expect(w1, dw1, times, "dw1");
      expect(w2, dw2, times, "dw2");
    }
    g.zero_grad();
    g.compute();
    expect(x, dx, 1.0, "dx after zero_grad");
    expect(w1, dw1, 1.0, "dw1 after zero_grad");
  }
}

// A tied embedding: the head's weight gradient (a fused loss's output) and the embedding's scatter sum into one
// accumulator with neither an Add nor an Accumulate node: the fused loss starts it in place, the scatter adds
// its rows into it there.
TEST(Graph, TiedEmbeddingGradientChainsIntoItsAccumulator) {
  reseed("graph_tied_embedding");
  const int64_t V = 7, D = 4, N = 6;
  const Vec ev = random_vec(V * D);
  const std::vector<int64_t> idv = {0, 3, 3, 6, 1, 3}, lv = {2, 0, 5, 3, 3, 1};
  // Σ_r lse(z_r) − z_r[label_r], z_r[j] = Σ_d E[id_r, d]·E[j, d], in double.
  auto loss_ref = [&](const Vec& e) {
    double total = 0;
    for (int64_t r = 0; r < N; ++r) {
      Vec z(size_t(V), 0.0);
      for (int64_t j = 0; j < V; ++j)
        for (int64_t d = 0; d < D; ++d) z[size_t(j)] += e[size_t(idv[size_t(r)] * D + d)] * e[size_t(j * D + d)];
      double m = z[0], se = 0;
      for (double x : z) m = std::max(m, x);
      for (double x : z) se += std::exp(x - m);
      total += m + std::log(se) - z[size_t(lv[size_t(r)])];
    }
    return total;
  };
  Vec want(ev.size());
  for (size_t i = 0; i < ev.size(); ++i) {
    Vec a = ev, b = ev;
    a[i] += 1e-6;
    b[i] -= 1e-6;
    want[i] = (loss_ref(a) - loss_ref(b)) / 2e-6;
  }
  for (int poison = 0; poison < 2; ++poison) {
    Context ctx(default_cpu_backend());
    Tensor* e = ctx.param(DType::F32, {V, D}, "emb");
    set_data(e, std::vector<float>(ev.begin(), ev.end()));
    Tensor* ids = ctx.input(DType::I32, {N}, "ids");
    Tensor* labels = ctx.input(DType::I32, {N}, "labels");
    set_data_int(ids, idv);
    set_data_int(labels, lv);
    CrossEntropyOptions ce;
    ce.reduction = Reduction::Sum;
    Tensor* loss = fused_linear_cross_entropy(ctx, get_rows(ctx, e, ids), e, nullptr, labels, ce).loss;
    Graph g(ctx);
    g.backward(loss);
    g.set_poison(poison == 1);
    int adds = 0, accumulates = 0, scatters_with_addend = 0;
    for (const Tensor* n : g.nodes()) {
      adds += n->op == Op::Add;
      accumulates += n->op == Op::Accumulate;
      scatters_with_addend += n->op == Op::GetRowsBack && n->src[2] != nullptr;
    }
    EXPECT_EQ(adds, 0);
    EXPECT_EQ(accumulates, 0);
    EXPECT_EQ(scatters_with_addend, 1);
    auto expect = [&](double times, const char* what) {
      const std::vector<float> got = get_data(g.grad(e));
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i)
        EXPECT_NEAR(got[i], times * want[i], 1e-4 * (1 + std::fabs(times * want[i])))
            << what << " at " << i << " poison " << poison;
    };
    g.compute();
    expect(1, "first run");
    g.compute();
    expect(2, "accumulated over two runs");
    g.zero_grad();
    g.compute();
    expect(1, "after zero_grad");
  }
}

TEST(Graph, BF16ParameterGetsF32Gradient) {
  Context ctx(default_cpu_backend());
  Tensor* w = ctx.param(DType::BF16, {4}, "w");
  set_data(w, {0.5f, -1.0f, 2.0f, 0.25f});
  Graph g(ctx);
  g.backward(sum(ctx, mul(ctx, w, w)));
  g.compute();
  Tensor* gw = g.grad(w);
  EXPECT_EQ(gw->dtype, DType::F32);
  EXPECT_EQ(get_data(gw), (std::vector<float>{1.0f, -2.0f, 4.0f, 0.5f}));
}

TEST(Graph, DeepChainDoesNotOverflowTheStack) {
  // 10,000 nodes forward and as many backward: the ordering and autodiff must not recurse per node.
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.param(DType::F32, {4}, "x");
  set_data(x, {1, 2, 3, 4});
  Tensor* y = x;
  const int n = 10000;
  for (int i = 0; i < n; ++i) y = (i % 2) ? neg(ctx, y) : scale(ctx, y, i % 4 == 0 ? 2.0f : 0.5f);
  y->flags |= kOutput;
  Graph g(ctx);
  g.backward(sum(ctx, y));
  EXPECT_GE(g.nodes().size(), size_t(2 * n));
  g.compute();
  // 5000 negations cancel, the scales alternate 2 and 0.5: y = x, and dy/dx = 1.
  EXPECT_EQ(get_data(y), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(get_data(g.grad(x)), (std::vector<float>{1, 1, 1, 1}));
  // Peak memory is a few slots, not one per node.
  EXPECT_LT(g.plan().arena_bytes, g.plan().naive_bytes / 100);
}

TEST(Graph, WeightGradientsRunAsSoonAsTheirLayerIsReached) {
  // Three layers y = relu(relu(x W1) W2) W3: each weight's gradient needs only its layer's output gradient
  // and input, so its writer must come before the gradient flowing into the layer below (what a
  // data-parallel bucket of the top layers waits for), and the writers must run top layer first.
  reseed("graph_early_weights");
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.input(DType::F32, {4, 6}, "x");
  set_data(x, std::vector<float>(24, 0.5f));
  Tensor* w1 = filled_param(ctx, {6, 5}, "w1");
  Tensor* w2 = filled_param(ctx, {5, 5}, "w2");
  Tensor* w3 = filled_param(ctx, {5, 3}, "w3");
  Tensor* h1 = relu(ctx, matmul(ctx, x, w1));
  Tensor* h2 = relu(ctx, matmul(ctx, h1, w2));
  Tensor* y = matmul(ctx, h2, w3);
  Graph g(ctx);
  g.backward(sum(ctx, mul(ctx, y, y)));
  std::unordered_map<const Tensor*, size_t> pos;
  for (size_t i = 0; i < g.nodes().size(); ++i) pos[g.nodes()[i]] = i;
  ASSERT_TRUE(g.grad(h1) && g.grad(h2));
  EXPECT_LT(pos.at(g.grad_writer(w3)), pos.at(g.grad(h2)))
      << "w3's gradient waits for the gradient into layer 3";
  EXPECT_LT(pos.at(g.grad_writer(w2)), pos.at(g.grad(h1)))
      << "w2's gradient waits for the gradient into layer 2";
  EXPECT_LT(pos.at(g.grad_writer(w3)), pos.at(g.grad_writer(w2)));
  EXPECT_LT(pos.at(g.grad_writer(w2)), pos.at(g.grad_writer(w1)));
  // The parameters keep the order the forward pass found them in.
  EXPECT_EQ(g.params(), (std::vector<Tensor*>{w1, w2, w3}));
  // The order changes nothing computed: the same gradients as y's float64 chain rule.
  g.compute();
  const auto X = to_f64(get_data(x)), W1 = to_f64(get_data(w1)), W2 = to_f64(get_data(w2)),
             W3 = to_f64(get_data(w3));
  auto mm = [](const Vec& a, const Vec& b, int m, int k, int n) {
    Vec c(size_t(m * n), 0.0);
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j)
        for (int t = 0; t < k; ++t) c[size_t(i * n + j)] += a[size_t(i * k + t)] * b[size_t(t * n + j)];
    return c;
  };
  auto relu64 = [](Vec v) {
    for (double& e : v) e = std::max(e, 0.0);
    return v;
  };
  const Vec a1 = relu64(mm(X, W1, 4, 6, 5)), a2 = relu64(mm(a1, W2, 4, 5, 5)), out = mm(a2, W3, 4, 5, 3);
  // dW3 = a2ᵀ (2 y).
  Vec dw3(15, 0.0);
  for (int i = 0; i < 4; ++i)
    for (int t = 0; t < 5; ++t)
      for (int j = 0; j < 3; ++j)
        dw3[size_t(t * 3 + j)] += a2[size_t(i * 5 + t)] * 2 * out[size_t(i * 3 + j)];
  EXPECT_LE(nmse(to_f64(get_data(g.grad(w3))), dw3), 1e-10);
}

TEST(Graph, ComputeTwiceGivesTheSameResult) {
  reseed("graph_twice_same");
  Context ctx(default_cpu_backend());
  Tensor* x = filled_param(ctx, {16, 33}, "x");
  Tensor* h = gelu(ctx, add(ctx, x, transpose(ctx, transpose(ctx, x))));
  Tensor* m = max_rows(ctx, h);
  Tensor* out = add(ctx, sum_rows(ctx, mul(ctx, h, h)), m);
  out->flags |= kOutput;
  Graph g(ctx);
  g.backward(mean(ctx, out));
  g.compute();
  auto o1 = get_data(out);
  auto g1 = get_data(g.grad(x));
  g.zero_grad();
  g.compute();
  EXPECT_EQ(get_data(out), o1);
  EXPECT_EQ(get_data(g.grad(x)), g1);
}

TEST(Graph, PlanIsKnownBeforeRunning) {
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.param(DType::F32, {64, 64}, "x");
  Graph g(ctx);
  g.backward(sum(ctx, exp(ctx, tanh(ctx, x))));
  const Plan& p = g.plan();
  EXPECT_GT(p.arena_bytes, 0u);
  EXPECT_GE(p.naive_bytes, p.arena_bytes);
  for (const PlanSlot& s : p.slots) EXPECT_EQ(s.tensor->data, nullptr) << "nothing is placed before compute";
}

// Builds the same graph twice, runs it with and without poison, and compares every output and gradient.
TEST(Graph, PoisonModeCatchesNothingOnCorrectOps) {
  reseed("graph_poison");
  Vec av = random_vec(4 * 6), bv = random_vec(6), cv = random_vec(2 * 4 * 3);
  std::vector<std::vector<float>> results[2];
  for (int poison = 0; poison < 2; ++poison) {
    Context ctx(default_cpu_backend());
    Tensor* a = ctx.param(DType::F32, {4, 6}, "a");
    Tensor* b = ctx.param(DType::BF16, {6}, "b");
    Tensor* c = ctx.param(DType::F32, {2, 4, 3}, "c");
    set_data(a, std::vector<float>(av.begin(), av.end()));
    set_data(b, std::vector<float>(bv.begin(), bv.end()));
    set_data(c, std::vector<float>(cv.begin(), cv.end()));
    // Every family that exists: elementwise with broadcast, views, slices, concat, copies, reductions.
    Tensor* h = silu(ctx, add(ctx, a, b));                                // [4, 6]
    Tensor* left = slice(ctx, h, 0, 0, 3);                                // [4, 3]
    Tensor* right = slice(ctx, h, 0, 3, 3);                               // [4, 3]
    Tensor* j = concat(ctx, mul(ctx, left, right), relu(ctx, right), 1);  // [8, 3]
    Tensor* k = add(ctx, reshape(ctx, contiguous(ctx, j), {2, 4, 3}), c);
    Tensor* p = permute(ctx, k, 1, 0, 2, 3);  // [2, 3, 4]
    Tensor* r = cast(ctx, p, DType::BF16);
    Tensor* q = repeat(ctx, max_rows(ctx, r), r->ne);
    Tensor* out = add(ctx, sub(ctx, r, q), mean_rows(ctx, exp(ctx, r)));
    out->flags |= kOutput;
    Tensor* fl = fill(ctx, DType::F32, out->ne, 0.5f);
    Tensor* loss = add(ctx, sum(ctx, mul(ctx, out, fl)), max(ctx, gelu(ctx, c)));
    Graph g(ctx);
    g.backward(loss);
    g.set_poison(poison == 1);
    g.compute();
    auto push = [&](const Tensor* t) {
      auto v = get_data(t);
      for (float f : v) EXPECT_TRUE(std::isfinite(f)) << t->describe() << (poison ? " (poisoned run)" : "");
      results[poison].push_back(v);
    };
    push(out);
    push(loss);
    push(g.grad(a));
    push(g.grad(b));
    push(g.grad(c));
  }
  ASSERT_EQ(results[0].size(), results[1].size());
  for (size_t i = 0; i < results[0].size(); ++i) EXPECT_EQ(results[0][i], results[1][i]) << "result " << i;
}

TEST(Graph, PoisonModeShowsAnUnwrittenOutput) {
  // The check above can fail: a node whose kernel writes nothing reads back as NaN under poison.
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.input(DType::F32, {3}, "x");
  Tensor* lazy = ctx.node(Op::AuxOutput, DType::F32, x->ne);  // "written by its owner", here by nobody
  Tensor* owner = tanh(ctx, x);
  lazy->src[0] = owner;
  owner->aux[0] = lazy;
  lazy->flags |= kOutput;
  Graph g(ctx);
  g.forward(lazy);
  g.set_poison(true);
  g.compute();
  for (float f : get_data(lazy)) EXPECT_TRUE(std::isnan(f));
}

}  // namespace
}  // namespace retort::test
