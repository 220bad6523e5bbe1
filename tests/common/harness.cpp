#include "harness.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

namespace retort::test {

std::mt19937_64& rng() {
  static std::mt19937_64 gen(12345);
  return gen;
}

uint64_t seed_of(const std::string& key) { return std::hash<std::string>{}(key) ^ 0x9e3779b97f4a7c15ull; }
void reseed(const std::string& key) { rng().seed(seed_of(key)); }

Vec random_vec(int64_t n, double lo, double hi) {
  std::uniform_real_distribution<double> d(lo, hi);
  Vec v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng());
  return v;
}

std::vector<int64_t> random_ints(int64_t n, int64_t lo, int64_t hi) {
  std::uniform_int_distribution<int64_t> d(lo, hi - 1);
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng());
  return v;
}

double nmse(const Vec& a, const Vec& b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) {
      if (a[i] == b[i]) continue;  // equal infinities are fine
      return std::numeric_limits<double>::infinity();
    }
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  if (den == 0) return num == 0 ? 0 : num;  // reference all zeros: fall back to the absolute error
  return num / den;
}

double max_abs_diff(const Vec& a, const Vec& b) {
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

Vec to_f64(const std::vector<float>& v) { return Vec(v.begin(), v.end()); }

namespace {

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

bool run_case(const OpCase& c, Backend* backend) {
  SCOPED_TRACE(c.name);
  reseed(c.name);
  Backend& be = backend ? *backend : static_cast<Backend&>(default_cpu_backend());
  Context ctx(be);
  std::vector<Tensor*> ins;
  std::vector<Ref> refs;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const Input& in = c.inputs[i];
    std::string nm = "in" + std::to_string(i);
    Tensor* t = is_float(in.dtype) && in.differentiable && c.check_grad ? ctx.param(in.dtype, in.shape, nm)
                                                                         : ctx.input(in.dtype, in.shape, nm);
    Ref r;
    for (int d = 0; d < 4; ++d) r.ne[d] = t->ne[d];
    if (is_float(in.dtype)) {
      Vec v = random_vec(t->nelements(), in.lo, in.hi);
      set_data(t, std::vector<float>(v.begin(), v.end()));
      r.v = to_f64(get_data(t));  // the values as stored (rounded to bf16 / f16 where so)
    } else {
      auto v = random_ints(t->nelements(), int64_t(in.lo), int64_t(in.hi));
      set_data_int(t, v);
      r.v = Vec(v.begin(), v.end());
    }
    ins.push_back(t);
    refs.push_back(std::move(r));
  }
  Tensor* out = c.build(ctx, ins);
  out->flags |= kOutput;
  Graph g(ctx);
  g.forward(out);
  Vec weights;
  bool grads = c.check_grad;
  if (grads) {
    Tensor* w = ctx.input(DType::F32, out->shape(), "w");
    weights = random_vec(out->nelements(), -1.0, 1.0);
    set_data(w, std::vector<float>(weights.begin(), weights.end()));
    weights = to_f64(get_data(w));
    Tensor* o32 = out->dtype == DType::F32 ? out : cast(ctx, out, DType::F32);
    g.backward(sum(ctx, mul(ctx, o32, w)));
  }
  g.set_poison(true);
  g.compute();

  bool ok = true;
  Vec expect = c.reference(refs);
  Vec got = to_f64(get_data(out));
  double e = nmse(got, expect);
  EXPECT_LE(e, c.fwd_tol) << "forward nmse " << e << " (tolerance " << c.fwd_tol << ")";
  ok &= e <= c.fwd_tol;
  if (!grads) return ok;

  for (size_t i = 0; i < ins.size(); ++i) {
    if (!ins[i]->has(kParam)) continue;
    Tensor* gt = g.grad(ins[i]);
    if (!gt) {
      ADD_FAILURE() << "input " << i << " got no gradient";
      ok = false;
      continue;
    }
    Vec analytic = to_f64(get_data(gt));
    std::vector<size_t> picked(refs[i].v.size());
    for (size_t j = 0; j < picked.size(); ++j) picked[j] = j;
    if (c.grad_samples > 0 && size_t(c.grad_samples) < picked.size()) {
      std::shuffle(picked.begin(), picked.end(), rng());
      picked.resize(size_t(c.grad_samples));
      Vec sampled;
      for (size_t j : picked) sampled.push_back(analytic[j]);
      analytic = std::move(sampled);
    }
    Vec numeric(picked.size());
    for (size_t s = 0; s < picked.size(); ++s) {
      const size_t j = picked[s];
      double keep = refs[i].v[j];
      double h = c.fd_step * std::max(1.0, std::abs(keep));
      refs[i].v[j] = keep + h;
      double fp = dot(c.reference(refs), weights);
      refs[i].v[j] = keep - h;
      double fm = dot(c.reference(refs), weights);
      refs[i].v[j] = keep;
      numeric[s] = (fp - fm) / (2 * h);
    }
    double ge = nmse(analytic, numeric);
    EXPECT_LE(ge, c.grad_tol) << "gradient of input " << i << ": nmse " << ge << " (tolerance " << c.grad_tol
                              << "), max abs diff " << max_abs_diff(analytic, numeric);
    ok &= ge <= c.grad_tol;
  }
  return ok;
}

}  // namespace retort::test
