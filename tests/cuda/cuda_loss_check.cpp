#include "cuda_loss_check.h"

#include <algorithm>
#include <cmath>

namespace retort::test {

namespace {

struct Run {
  Vec out;
  std::vector<Vec> grads;  // one per parameter input, in input order
  std::vector<Ref> refs;   // the inputs as stored (bf16 / f16 rounding included), in float64
  Vec weights;             // of the upstream: backward(Σ w·out), or {1} for the unit seed
};

// Builds and computes c on be. Inputs come from the generator seeded with the case's name, so every backend
// sees the same values.
Run run_on(Backend& be, const LossCase& c) {
  reseed(c.name);
  Context ctx(be);
  Run r;
  std::vector<Tensor*> ins;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const LossInput& in = c.inputs[i];
    const std::string nm = "in" + std::to_string(i);
    Tensor* t =
        in.param && c.check_grad ? ctx.param(in.dtype, in.shape, nm) : ctx.input(in.dtype, in.shape, nm);
    Ref ref;
    for (int d = 0; d < 4; ++d) ref.ne[d] = t->ne[d];
    if (is_float(in.dtype)) {
      const Vec v = in.values.empty() ? random_vec(t->nelements(), in.lo, in.hi) : in.values;
      set_data(t, std::vector<float>(v.begin(), v.end()));
      ref.v = to_f64(get_data(t));
    } else {
      std::vector<int64_t> v;
      if (in.values.empty())
        v = random_ints(t->nelements(), int64_t(in.lo), int64_t(in.hi));
      else
        for (double x : in.values) v.push_back(int64_t(x));
      set_data_int(t, v);
      ref.v = Vec(v.begin(), v.end());
    }
    ins.push_back(t);
    r.refs.push_back(std::move(ref));
  }
  Tensor* out = c.build(ctx, ins);
  out->flags |= kOutput;
  Graph g(ctx);
  g.forward(out);
  if (c.check_grad) {
    if (c.unit_seed) {
      Tensor* seed = nullptr;
      if (c.leaf_seed > 0) {
        seed = ctx.tensor(DType::F32, {1}, "seed");
        set_data(seed, {c.leaf_seed});
      }
      r.weights = {seed ? double(c.leaf_seed) : 1.0};
      g.backward(out, seed);
    } else {
      Tensor* w = ctx.input(DType::F32, out->shape(), "w");
      const Vec wv = random_vec(out->nelements(), 0.5, 2.0);
      set_data(w, std::vector<float>(wv.begin(), wv.end()));
      r.weights = to_f64(get_data(w));
      g.backward(sum(ctx, mul(ctx, out, w)));
    }
  }
  g.set_poison(true);  // an element no kernel writes shows up as NaN
  g.compute();
  r.out = to_f64(get_data(out));
  for (Tensor* t : ins)
    if (t->has(kParam)) {
      Tensor* gt = g.grad(t);
      r.grads.push_back(gt ? to_f64(get_data(gt)) : Vec{});
    }
  return r;
}

bool all_finite(const Vec& v) {
  for (double x : v)
    if (!std::isfinite(x)) return false;
  return true;
}

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

bool check_cuda(const LossCase& c, bool finite_differences) {
  EXPECT_TRUE(c.cuda_unsupported.empty()) << c.name << " is not supported on CUDA: " << c.cuda_unsupported;
  // A result allowed backend_tol from the CPU's is allowed as much from the float64 reference.
  LossCase d = c;
  d.fwd_tol = std::max(c.fwd_tol, c.backend_tol);
  d.grad_tol = std::max(c.grad_tol, c.backend_grad_tol);
  return check_cuda(d, {c.backend_tol, c.backend_grad_tol, finite_differences});
}

bool check_cuda(const LossCase& c, const CudaTol& tol) {
  SCOPED_TRACE(case_trace(c) + " (cuda)");
  const Run cpu = run_on(default_cpu_backend(), c);
  const Run gpu = run_on(cuda_backend(), c);
  bool ok = true;
  auto expect_le = [&](double e, double t, const std::string& what, const Vec& got, const Vec& want) {
    EXPECT_LE(e, t) << what << ": nmse " << e << " (tolerance " << t << "), max abs diff "
                    << max_abs_diff(got, want) << (got.empty() ? "" : ", got[0] " + std::to_string(got[0]))
                    << (want.empty() ? "" : ", want[0] " + std::to_string(want[0]));
    ok &= e <= t;
  };
  EXPECT_TRUE(all_finite(gpu.out)) << "the CUDA output has a non-finite value";
  ok &= all_finite(gpu.out);
  expect_le(nmse(gpu.out, cpu.out), tol.cpu, "output vs CPU", gpu.out, cpu.out);
  const Vec want = c.reference(gpu.refs);
  expect_le(nmse(gpu.out, want), c.fwd_tol, "output vs float64 reference", gpu.out, want);
  if (!c.check_grad) return ok;

  EXPECT_EQ(gpu.grads.size(), cpu.grads.size());
  if (gpu.grads.size() != cpu.grads.size()) return false;
  size_t gi = 0;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    if (!c.inputs[i].param) continue;
    const Vec& got = gpu.grads[gi];
    const Vec& cg = cpu.grads[gi];
    ++gi;
    const std::string which = "gradient of input " + std::to_string(i);
    EXPECT_FALSE(got.empty()) << which << " is missing";
    EXPECT_TRUE(all_finite(got)) << which << " has a non-finite value";
    ok &= !got.empty() && all_finite(got);
    expect_le(nmse(got, cg), tol.cpu_grad, which + " vs CPU", got, cg);
    if (!tol.finite_differences) continue;
    std::vector<Ref> refs = gpu.refs;
    const std::vector<size_t> picked = fd_elements(c, refs[i].v.size());
    if (picked.empty()) continue;
    Vec analytic, numeric;
    for (size_t j : picked) {
      const double keep = refs[i].v[j];
      const double h = c.fd_step * std::max(1.0, std::abs(keep));
      refs[i].v[j] = keep + h;
      const double fp = dot(c.reference(refs), gpu.weights);
      refs[i].v[j] = keep - h;
      const double fm = dot(c.reference(refs), gpu.weights);
      refs[i].v[j] = keep;
      analytic.push_back(got.empty() ? 0.0 : got[j]);
      numeric.push_back((fp - fm) / (2 * h));
    }
    expect_le(nmse(analytic, numeric), c.grad_tol, which + " vs central differences", analytic, numeric);
  }
  return ok;
}

bool check_cuda_same(const LossCase& c, Backend& a, Backend& b, double grad_tol) {
  SCOPED_TRACE(c.name + " (two CUDA backends)");
  const Run ra = run_on(a, c), rb = run_on(b, c);
  bool ok = true;
  auto finite = [&](const Vec& x, const std::string& what) {
    EXPECT_TRUE(all_finite(x)) << what << " has a non-finite value";
    ok &= all_finite(x);
  };
  finite(ra.out, "output (a)");
  finite(rb.out, "output (b)");
  EXPECT_EQ(ra.out.size(), rb.out.size());
  const bool eq = ra.out.size() == rb.out.size() && max_abs_diff(ra.out, rb.out) == 0.0;
  EXPECT_TRUE(eq) << "outputs differ: max abs diff "
                  << (ra.out.size() == rb.out.size() ? max_abs_diff(ra.out, rb.out) : -1.0);
  ok &= eq;
  EXPECT_EQ(ra.grads.size(), rb.grads.size());
  if (ra.grads.size() != rb.grads.size()) return false;
  for (size_t i = 0; i < ra.grads.size(); ++i) {
    const std::string which = "gradient " + std::to_string(i);
    EXPECT_FALSE(ra.grads[i].empty()) << which << " is missing";
    finite(ra.grads[i], which + " (a)");
    finite(rb.grads[i], which + " (b)");
    const double e = nmse(rb.grads[i], ra.grads[i]);
    EXPECT_LE(e, grad_tol) << which << ": nmse " << e << ", max abs diff "
                           << max_abs_diff(rb.grads[i], ra.grads[i]);
    ok &= e <= grad_tol;
  }
  return ok;
}

size_t fused_ce_peak_extra(DType dt, DType logits_dtype, size_t budget, int64_t n, int64_t h, int64_t v,
                           const std::string& seed) {
  auto be = make_cuda_backend(0);
  Context ctx(*be);
  Tensor* x = ctx.param(dt, {n, h}, "hidden");
  Tensor* w = ctx.param(dt, {v, h}, "weight");
  Tensor* y = ctx.input(DType::I32, {n}, "labels");
  reseed(seed);
  set_data(x, std::vector<float>(size_t(n * h), 0.01f));
  Vec wv = random_vec(v * h, -0.05, 0.05);
  set_data(w, std::vector<float>(wv.begin(), wv.end()));
  set_data_int(y, random_ints(n, -1, v));
  FusedLinearOptions f;
  f.logits_budget = budget;
  f.logits_dtype = logits_dtype;
  CrossEntropyOptions o;
  o.ignore_index = -1;
  Tensor* loss = fused_linear_cross_entropy(ctx, x, w, nullptr, y, o, f).loss;
  loss->flags |= kOutput;
  Graph g(ctx);
  g.forward(loss);
  g.backward(loss);
  g.compute();  // first run: the arena and the allocator's cache
  be->synchronize();
  const CudaMemoryStats before = cuda_memory_stats(*be);
  cuda_reset_peak(*be);
  g.compute();
  be->synchronize();
  const CudaMemoryStats after = cuda_memory_stats(*be);
  EXPECT_TRUE(std::isfinite(get_data(loss)[0]));
  EXPECT_TRUE(std::isfinite(get_data(g.grad(w))[0]));
  return after.peak_bytes - before.bytes_in_use;
}

}  // namespace retort::test
