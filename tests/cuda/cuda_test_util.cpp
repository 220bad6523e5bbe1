#include "cuda_test_util.h"

#include <memory>
#include <random>

namespace retort::test {

ShardSet make_shards(const ScratchDir& dir, int64_t vocab, const ShardRecipe& r) {
  std::mt19937 rng(r.seed);
  std::vector<int32_t> toks(r.tokens);
  for (size_t i = 0; i < toks.size(); ++i)
    toks[i] = i > 0 && rng() % 3 ? int32_t((toks[i - 1] * r.mul + r.add) % vocab)
                                 : int32_t(rng() % uint32_t(vocab));
  ShardWriteOptions o;
  o.val_fraction = 0.1;
  o.tokens_per_shard = r.tokens_per_shard;
  return write_shards(toks, dir.file("d"), vocab, o);
}

Backend& cuda_backend() {
  static std::unique_ptr<Backend> be = make_cuda_backend(0);
  return *be;
}

GraphResult run_graph(Backend& be, const CompareCase& c) {
  reseed(c.name);
  Context ctx(be);
  std::vector<Tensor*> ins;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const Input& in = c.inputs[i];
    const std::string nm = "in" + std::to_string(i);
    Tensor* t = is_float(in.dtype) && in.differentiable && c.grads ? ctx.param(in.dtype, in.shape, nm)
                                                                   : ctx.input(in.dtype, in.shape, nm);
    if (is_float(in.dtype)) {
      Vec v = random_vec(t->nelements(), in.lo, in.hi);
      set_data(t, std::vector<float>(v.begin(), v.end()));
    } else {
      set_data_int(t, random_ints(t->nelements(), int64_t(in.lo), int64_t(in.hi)));
    }
    ins.push_back(t);
  }
  Tensor* out = c.build(ctx, ins);
  out->flags |= kOutput;
  Graph g(ctx);
  g.forward(out);
  if (c.grads) {
    Tensor* w = ctx.input(DType::F32, out->shape(), "w");
    Vec wv = random_vec(out->nelements(), -1.0, 1.0);
    set_data(w, std::vector<float>(wv.begin(), wv.end()));
    Tensor* o32 = out->dtype == DType::F32 ? out : cast(ctx, out, DType::F32);
    g.backward(sum(ctx, mul(ctx, o32, w)));
  }
  g.set_poison(true);  // an element no kernel writes shows up as NaN
  g.compute();
  GraphResult r;
  r.out = to_f64(get_data(out));
  for (Tensor* t : ins)
    if (t->has(kParam)) {
      Tensor* gt = g.grad(t);
      r.grads.push_back(gt ? to_f64(get_data(gt)) : Vec{});
    }
  return r;
}

bool compare_with_cpu(const CompareCase& c) {
  SCOPED_TRACE(c.name);
  GraphResult cpu = run_graph(default_cpu_backend(), c);
  GraphResult gpu = run_graph(cuda_backend(), c);
  bool ok = true;
  const double e = nmse(gpu.out, cpu.out);
  EXPECT_LE(e, c.tol) << "output nmse " << e << " (tolerance " << c.tol << "), max abs diff "
                      << max_abs_diff(gpu.out, cpu.out);
  ok &= e <= c.tol;
  EXPECT_EQ(gpu.grads.size(), cpu.grads.size());
  for (size_t i = 0; i < std::min(gpu.grads.size(), cpu.grads.size()); ++i) {
    EXPECT_FALSE(cpu.grads[i].empty()) << "input " << i << " got no gradient";
    const double ge = nmse(gpu.grads[i], cpu.grads[i]);
    EXPECT_LE(ge, c.grad_tol) << "gradient " << i << " nmse " << ge << " (tolerance " << c.grad_tol
                              << "), max abs diff " << max_abs_diff(gpu.grads[i], cpu.grads[i]);
    ok &= ge <= c.grad_tol;
  }
  return ok;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected retort::Error";
  return "";
}

}  // namespace retort::test
