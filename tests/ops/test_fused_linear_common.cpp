// The helpers declared in test_fused_linear_ref.h.
#include <cmath>

#include "test_fused_linear_ref.h"

namespace retort::test {

std::vector<Vec> draw_values(const std::string& key, const std::vector<LossInput>& inputs) {
  reseed(key);
  Context ctx(default_cpu_backend());
  std::vector<Vec> out;
  for (const LossInput& in : inputs) {
    Tensor* t = ctx.tensor(in.dtype, in.shape);
    if (!in.values.empty()) {
      out.push_back(in.values);
    } else if (is_float(in.dtype)) {
      out.push_back(random_vec(t->nelements(), in.lo, in.hi));
    } else {
      std::vector<int64_t> v = random_ints(t->nelements(), int64_t(in.lo), int64_t(in.hi));
      out.push_back(Vec(v.begin(), v.end()));
    }
    if (is_float(in.dtype)) {  // as stored (rounded to bf16 / f16)
      set_data(t, std::vector<float>(out.back().begin(), out.back().end()));
      out.back() = to_f64(get_data(t));
    }
  }
  return out;
}

GraphResult run_graph(const std::vector<LossInput>& inputs, const std::vector<Vec>& values,
                      const BuildFn& build, Seed seed) {
  Context ctx(default_cpu_backend());
  std::vector<Tensor*> ins;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const LossInput& in = inputs[i];
    const std::string nm = "in" + std::to_string(i);
    Tensor* t = in.param && seed != Seed::None ? ctx.param(in.dtype, in.shape, nm)
                                               : ctx.input(in.dtype, in.shape, nm);
    if (is_float(in.dtype)) {
      set_data(t, std::vector<float>(values[i].begin(), values[i].end()));
    } else {
      std::vector<int64_t> v;
      for (double x : values[i]) v.push_back(int64_t(x));
      set_data_int(t, v);
    }
    ins.push_back(t);
  }
  std::vector<Tensor*> outs = build(ctx, ins);
  Graph g(ctx);
  for (Tensor* o : outs) {
    o->flags |= kOutput;
    g.forward(o);
  }
  if (seed == Seed::Unit) {
    g.backward(outs[0]);
  } else if (seed == Seed::Weighted) {
    Tensor* w = ctx.input(DType::F32, outs[0]->shape(), "w");
    reseed("upstream weights");
    Vec wv = random_vec(outs[0]->nelements(), 0.5, 2.0);
    set_data(w, std::vector<float>(wv.begin(), wv.end()));
    g.backward(sum(ctx, mul(ctx, outs[0], w)));
  }
  g.set_poison(true);
  g.compute();
  GraphResult r;
  for (Tensor* o : outs) r.outs.push_back(to_f64(get_data(o)));
  if (seed != Seed::None)
    for (Tensor* t : ins)
      if (t->has(kParam)) {
        Tensor* gt = g.grad(t);
        EXPECT_NE(gt, nullptr) << t->describe() << " got no gradient";
        r.grads.push_back(gt ? to_f64(get_data(gt)) : Vec{});
      }
  for (Tensor* n : g.nodes()) r.ops.push_back(n->op);
  return r;
}

namespace {

bool finite(const Vec& v) {
  for (double x : v)
    if (!std::isfinite(x)) return false;
  return true;
}

}  // namespace

void expect_close(const GraphResult& a, const GraphResult& b, double tol, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(a.outs.size(), b.outs.size());
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t i = 0; i < a.outs.size(); ++i) {
    EXPECT_TRUE(finite(a.outs[i]) && finite(b.outs[i])) << "output " << i << " is not finite";
    const double e = nmse(a.outs[i], b.outs[i]);
    EXPECT_LE(e, tol) << "output " << i << ": nmse " << e << ", max abs diff "
                      << max_abs_diff(a.outs[i], b.outs[i]);
  }
  for (size_t i = 0; i < a.grads.size(); ++i) {
    EXPECT_TRUE(finite(a.grads[i]) && finite(b.grads[i])) << "gradient " << i << " is not finite";
    const double e = nmse(a.grads[i], b.grads[i]);
    EXPECT_LE(e, tol) << "gradient " << i << ": nmse " << e << ", max abs diff "
                      << max_abs_diff(a.grads[i], b.grads[i]);
  }
}

std::vector<int64_t> chunk_sizes(int64_t n) {
  std::vector<int64_t> c{1, 3};
  if (n > 7) c.push_back(7);
  c.push_back(n);
  return c;
}

}  // namespace retort::test
