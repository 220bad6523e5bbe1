// The float64 references and the case runner declared in test_losses_ref.h.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <random>
#include <limits>

#include "test_losses_ref.h"

namespace retort::test {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

double logaddexp(double a, double b) {
  double hi = std::max(a, b), lo = std::min(a, b);
  if (hi == -kInf) return -kInf;
  return hi + std::log1p(std::exp(lo - hi));
}

// Σ over slots of the divergence between teacher log-probabilities lp and student log-probabilities lq.
double divergence(Divergence kind, double beta, double alpha, const Vec& lp, const Vec& lq) {
  double d = 0;
  for (size_t i = 0; i < lp.size(); ++i) {
    double p = std::exp(lp[i]), q = std::exp(lq[i]);
    if (kind == Divergence::Tvd) {
      d += 0.5 * std::fabs(p - q);
    } else if (kind == Divergence::SkewKl) {
      const double m = alpha * p + (1 - alpha) * q;
      if (p > 0) d += p * (lp[i] - std::log(m));
    } else if (kind == Divergence::SkewReverseKl) {
      const double m = (1 - alpha) * p + alpha * q;
      if (q > 0) d += q * (lq[i] - std::log(m));
    } else if (beta == 0) {
      if (p > 0) d += p * (lp[i] - lq[i]);
    } else if (beta == 1) {
      if (q > 0) d += q * (lq[i] - lp[i]);
    } else {
      double lm = logaddexp(std::log(beta) + lp[i], std::log(1 - beta) + lq[i]);  // log(βp + (1−β)q)
      if (p > 0) d += beta * p * (lp[i] - lm);
      if (q > 0) d += (1 - beta) * q * (lq[i] - lm);
    }
  }
  return d;
}

struct RowVals {
  double loss = 0, lse = 0, hard = 0, soft = 0;
};

// Collects one output from per-row values and reduces it (hard and soft reduce like the loss).
Vec finish(const std::vector<RowVals>& rows, int64_t valid, Reduction red, Out what) {
  Vec v;
  for (const RowVals& r : rows) {
    switch (what) {
      case Out::Loss:
      case Out::PerRow:
        v.push_back(r.loss);
        break;
      case Out::Lse:
        v.push_back(r.lse);
        break;
      case Out::Hard:
        v.push_back(r.hard);
        break;
      case Out::Soft:
        v.push_back(r.soft);
        break;
    }
  }
  if (what == Out::Lse || what == Out::PerRow || red == Reduction::None) return v;
  double s = 0;
  for (double x : v) s += x;
  if (red == Reduction::Mean) s = valid > 0 ? s / double(valid) : 0.0;
  return {s};
}

}  // namespace

Tensor* pick(const LossOutputs& o, Out what) {
  switch (what) {
    case Out::PerRow:
      return o.per_row;
    case Out::Lse:
      return o.lse;
    case Out::Hard:
      return o.hard;
    case Out::Soft:
      return o.soft;
    default:
      return o.loss;
  }
}

const char* red_name(Reduction r) {
  return r == Reduction::Mean ? "mean" : r == Reduction::Sum ? "sum" : "none";
}

Mat mat(const Ref& r) {
  Mat m;
  m.rows = r.ne[1];
  m.cols = r.ne[0];
  m.v = r.v;
  return m;
}

Mat mat_t(const Ref& r) {
  Mat m;
  m.rows = r.ne[0];
  m.cols = r.ne[1];
  m.v.resize(r.v.size());
  for (int64_t i = 0; i < m.rows; ++i)
    for (int64_t j = 0; j < m.cols; ++j) m.v[size_t(i * m.cols + j)] = r.at(i, j);
  return m;
}

Mat head_ref(const Ref& hidden, const Ref& w, const Ref* bias) {
  const int64_t n = hidden.ne[1], h = hidden.ne[0], v = w.ne[1];
  EXPECT_EQ(w.ne[0], h);
  Mat z;
  z.rows = n;
  z.cols = v;
  z.v.assign(size_t(n * v), 0.0);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < v; ++j) {
      double s = bias ? bias->at(j) : 0.0;
      for (int64_t k = 0; k < h; ++k) s += hidden.at(k, r) * w.at(k, j);
      z.v[size_t(r * v + j)] = s;
    }
  return z;
}

std::vector<int64_t> ints(const Ref& r) {
  std::vector<int64_t> out;
  for (double x : r.v) out.push_back(int64_t(x));
  return out;
}

double lse_ref(const double* x, int64_t n, double t) {
  double m = -kInf;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, x[i] / t);
  if (m == -kInf) return -kInf;
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(x[i] / t - m);
  return m + std::log(s);
}

Vec ce_ref(const Mat& z, const std::vector<int64_t>& labels, const CeRef& o, Out what) {
  std::vector<RowVals> rows(size_t(z.rows));
  int64_t valid = 0;
  for (int64_t r = 0; r < z.rows; ++r) {
    Vec s(z.row(r), z.row(r) + z.cols);
    if (o.cap > 0)
      for (double& x : s) x = o.cap * std::tanh(x / o.cap);
    double lse = lse_ref(s.data(), z.cols);
    rows[size_t(r)].lse = lse;
    int64_t y = labels[size_t(r)];
    if (y == o.ignore) continue;
    ++valid;
    double mean_s = 0;
    for (double x : s) mean_s += x / double(z.cols);
    rows[size_t(r)].loss = (1 - o.eps) * (lse - s[size_t(y)]) + o.eps * (lse - mean_s) + o.z_loss * lse * lse;
  }
  return finish(rows, valid, o.red, what);
}

Vec topk_ref(const Mat& z, const std::vector<int64_t>& ids, const Mat& logprobs, const Vec& mask,
             const std::vector<int64_t>& labels, const TopKRef& o, Out what) {
  const int64_t k = logprobs.cols;
  const bool gathered = ids.empty();
  const bool normalize = gathered || o.normalize;
  std::vector<RowVals> rows(size_t(z.rows));
  int64_t valid = 0;
  for (int64_t r = 0; r < z.rows; ++r) {
    RowVals& out = rows[size_t(r)];
    // The student's normalizer over its whole row (over the valid slots when gathered).
    Vec xs, lp;
    for (int64_t j = 0; j < k; ++j) {
      double l = logprobs.at(r, j);
      if ((!mask.empty() && mask[size_t(r * k + j)] == 0) || l == -kInf) continue;
      xs.push_back(z.at(r, gathered ? j : ids[size_t(r * k + j)]));
      lp.push_back(l);
    }
    const int64_t n = int64_t(xs.size());
    double slots_lse = n ? lse_ref(xs.data(), n, o.t) : 0.0;
    double full_lse = lse_ref(z.row(r), z.cols, o.t);
    out.lse = gathered ? slots_lse : full_lse;
    const bool has_labels = !labels.empty();
    if (has_labels && labels[size_t(r)] == o.ignore) continue;
    ++valid;
    Vec lq(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) lq[size_t(i)] = xs[size_t(i)] / o.t - (normalize ? slots_lse : full_lse);
    if (o.t != 1 && n > 0) {
      double l = lse_ref(lp.data(), n, o.t);
      for (double& x : lp) x = x / o.t - l;
    }
    out.soft = o.t * o.t * divergence(o.div, o.beta, o.alpha, lp, lq);
    if (has_labels) out.hard = lse_ref(z.row(r), z.cols) - z.at(r, labels[size_t(r)]);
    out.loss = o.w_hard * out.hard + o.w_soft * out.soft;
  }
  return finish(rows, valid, o.red, what);
}

Vec distill_ref(const Mat& z, const Mat& teacher, const std::vector<int64_t>& labels, const DistillRef& o,
                Out what) {
  std::vector<RowVals> rows(size_t(z.rows));
  int64_t valid = 0;
  for (int64_t r = 0; r < z.rows; ++r) {
    RowVals& out = rows[size_t(r)];
    const double lz = lse_ref(z.row(r), z.cols, o.t), lt = lse_ref(teacher.row(r), z.cols, o.t);
    out.lse = lz;
    const bool has_labels = !labels.empty();
    if (has_labels && labels[size_t(r)] == o.ignore) continue;
    ++valid;
    Vec lp(size_t(z.cols)), lq(size_t(z.cols));
    for (int64_t j = 0; j < z.cols; ++j) {
      lq[size_t(j)] = z.at(r, j) / o.t - lz;
      lp[size_t(j)] = teacher.at(r, j) / o.t - lt;
    }
    out.soft = o.t * o.t * divergence(o.div, o.beta, o.alpha, lp, lq);
    if (has_labels) out.hard = lse_ref(z.row(r), z.cols) - z.at(r, labels[size_t(r)]);
    out.loss = o.w_hard * out.hard + o.w_soft * out.soft;
  }
  return finish(rows, valid, o.red, what);
}

Vec entropy_ref(const Mat& z, double t, Reduction red) {
  std::vector<RowVals> rows(size_t(z.rows));
  for (int64_t r = 0; r < z.rows; ++r) {
    double l = lse_ref(z.row(r), z.cols, t), h = 0;
    for (int64_t j = 0; j < z.cols; ++j) {
      double lq = z.at(r, j) / t - l, q = std::exp(lq);
      if (q > 0) h -= q * lq;
    }
    rows[size_t(r)].loss = h;
  }
  return finish(rows, z.rows, red, Out::Loss);
}

Vec selective_ref(const Mat& z, const std::vector<int64_t>& ids, int64_t k) {
  Vec out;
  for (int64_t r = 0; r < z.rows; ++r) {
    double l = lse_ref(z.row(r), z.cols);
    for (int64_t j = 0; j < k; ++j) out.push_back(z.at(r, ids[size_t(r * k + j)]) - l);
  }
  return out;
}

namespace {

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

bool all_finite(const Vec& v) {
  for (double x : v)
    if (!std::isfinite(x)) return false;
  return true;
}

}  // namespace

namespace {

// Creates the case's inputs in ctx (random or given values) and their float64 copies as stored.
void make_inputs(Context& ctx, const LossCase& c, std::vector<Tensor*>& ins, std::vector<Ref>& refs) {
  reseed(c.name);
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const LossInput& in = c.inputs[i];
    std::string nm = "in" + std::to_string(i);
    Tensor* t =
        in.param && c.check_grad ? ctx.param(in.dtype, in.shape, nm) : ctx.input(in.dtype, in.shape, nm);
    Ref r;
    for (int d = 0; d < 4; ++d) r.ne[d] = t->ne[d];
    if (is_float(in.dtype)) {
      Vec v = in.values.empty() ? random_vec(t->nelements(), in.lo, in.hi) : in.values;
      set_data(t, std::vector<float>(v.begin(), v.end()));
      r.v = to_f64(get_data(t));
    } else {
      std::vector<int64_t> v;
      if (in.values.empty())
        v = random_ints(t->nelements(), int64_t(in.lo), int64_t(in.hi));
      else
        for (double x : in.values) v.push_back(int64_t(x));
      set_data_int(t, v);
      r.v = Vec(v.begin(), v.end());
    }
    ins.push_back(t);
    refs.push_back(std::move(r));
  }
}

}  // namespace

uint64_t case_seed(const LossCase& c) {
  return seed_of(c.name);
}

std::string case_trace(const LossCase& c) {
  return c.name + " (seed " + std::to_string(case_seed(c)) + ")";
}

void PrintTo(const LossCase& c, std::ostream* os) {
  *os << case_trace(c);
}

std::string case_param_name(const LossCase& c) {
  std::string s = c.name;
  for (char& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
}

std::vector<size_t> fd_elements(const LossCase& c, size_t n) {
  std::vector<size_t> picked;
  if (!c.fd || c.fd_samples < 0) return picked;
  for (size_t j = 0; j < n; ++j) picked.push_back(j);
  if (c.fd_samples > 0 && size_t(c.fd_samples) < n) {
    std::mt19937_64 g(case_seed(c));
    std::shuffle(picked.begin(), picked.end(), g);
    picked.resize(size_t(c.fd_samples));
  }
  return picked;
}

bool run_loss_case(const LossCase& c) {
  SCOPED_TRACE(case_trace(c));
  Context ctx(default_cpu_backend());
  std::vector<Tensor*> ins;
  std::vector<Ref> refs;
  make_inputs(ctx, c, ins, refs);
  Tensor* out = c.build(ctx, ins);
  out->flags |= kOutput;
  Graph g(ctx);
  g.forward(out);
  Vec weights;
  if (c.check_grad) {
    if (c.unit_seed) {
      Tensor* seed = nullptr;
      if (c.leaf_seed > 0) {
        seed = ctx.tensor(DType::F32, {1}, "seed");
        set_data(seed, {c.leaf_seed});
      }
      weights = {seed ? double(c.leaf_seed) : 1.0};
      g.backward(out, seed);
    } else {
      Tensor* w = ctx.input(DType::F32, out->shape(), "w");
      weights = random_vec(out->nelements(), 0.5, 2.0);
      set_data(w, std::vector<float>(weights.begin(), weights.end()));
      weights = to_f64(get_data(w));
      g.backward(sum(ctx, mul(ctx, out, w)));
    }
  }
  g.set_poison(true);
  g.compute();

  bool ok = true;
  Vec expect = c.reference(refs);
  Vec got = to_f64(get_data(out));
  EXPECT_TRUE(all_finite(got)) << "output has a non-finite value";
  double e = nmse(got, expect);
  EXPECT_LE(e, c.fwd_tol) << "forward nmse " << e << " (tolerance " << c.fwd_tol << "), got[0] " << got[0]
                          << " expected[0] " << expect[0];
  ok &= e <= c.fwd_tol && all_finite(got);
  if (!c.check_grad) return ok;
  for (size_t i = 0; i < ins.size(); ++i) {
    if (!ins[i]->has(kParam)) continue;
    Tensor* gt = g.grad(ins[i]);
    if (!gt) {
      ADD_FAILURE() << "input " << i << " got no gradient";
      ok = false;
      continue;
    }
    const Vec full = to_f64(get_data(gt));
    EXPECT_TRUE(all_finite(full)) << "gradient of input " << i << " has a non-finite value";
    ok &= all_finite(full);
    const std::vector<size_t> picked = fd_elements(c, refs[i].v.size());
    if (picked.empty()) continue;
    Vec analytic, numeric;
    for (size_t j : picked) {
      double keep = refs[i].v[j];
      double h = c.fd_step * std::max(1.0, std::abs(keep));
      refs[i].v[j] = keep + h;
      double fp = dot(c.reference(refs), weights);
      refs[i].v[j] = keep - h;
      double fm = dot(c.reference(refs), weights);
      refs[i].v[j] = keep;
      analytic.push_back(full[j]);
      numeric.push_back((fp - fm) / (2 * h));
    }
    double ge = nmse(analytic, numeric);
    EXPECT_LE(ge, c.grad_tol) << "gradient of input " << i << ": nmse " << ge << " (tolerance " << c.grad_tol
                              << "), max abs diff " << max_abs_diff(analytic, numeric);
    ok &= ge <= c.grad_tol && all_finite(analytic);
  }
  return ok;
}

Vec rising(int64_t v) {
  Vec x;
  for (int64_t j = 0; j < v; ++j) x.push_back(0.003 * double(j) - 4.0);
  return x;
}

void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "expected retort::Error";
  } catch (const Error& e) {
    std::string m = e.what();
    for (const std::string& p : parts)
      EXPECT_NE(m.find(p), std::string::npos) << "'" << p << "' not in: " << m;
  }
}

}  // namespace retort::test

namespace retort::test {

OpCase to_op_case(const LossCase& c) {
  OpCase o;
  o.name = c.name;
  for (const LossInput& in : c.inputs) {
    EXPECT_TRUE(in.values.empty()) << c.name << ": run_case draws its own values";
    o.inputs.push_back({in.shape, in.dtype, in.param, in.lo, in.hi});
  }
  o.build = c.build;
  o.reference = c.reference;
  o.fwd_tol = c.fwd_tol;
  o.grad_tol = c.grad_tol;
  o.fd_step = c.fd_step;
  o.check_grad = c.check_grad;
  return o;
}

void check_single_pass(const LossCase& c) {
  SCOPED_TRACE(c.name + " (single pass)");
  LossCase unit = c;
  unit.unit_seed = true;
  EXPECT_TRUE(run_loss_case(unit));
  // Seeded with a leaf (a data-parallel rank's weight): the gradients against differences of 0.37·loss.
  LossCase seeded = unit;
  seeded.leaf_seed = 0.37f;
  EXPECT_TRUE(run_loss_case(seeded));

  // The same inputs in two graphs: backward(loss) and backward(3·loss).
  std::vector<Vec> grads[2];
  for (int k = 0; k < 2; ++k) {
    Context ctx(default_cpu_backend());
    std::vector<Tensor*> ins;
    std::vector<Ref> refs;
    make_inputs(ctx, c, ins, refs);
    Tensor* out = c.build(ctx, ins);
    Graph g(ctx);
    g.backward(k == 0 ? out : scale(ctx, out, 3.0f));
    if (k == 0) {
      for (Tensor* n : g.nodes()) {
        EXPECT_NE(n->op, Op::Mul) << "the unit-seeded backward multiplies the gradient by its upstream";
      }
    }
    g.compute();
    for (Tensor* t : ins)
      if (t->has(kParam)) grads[k].push_back(to_f64(get_data(g.grad(t))));
  }
  ASSERT_EQ(grads[0].size(), grads[1].size());
  for (size_t i = 0; i < grads[0].size(); ++i) {
    Vec three = grads[0][i];
    for (double& x : three) x *= 3;
    EXPECT_LE(nmse(grads[1][i], three), 1e-12) << "3·loss does not give 3× the gradient";
    EXPECT_GT(nmse(three, Vec(three.size(), 0.0)), 0.0) << "the gradient is all zeros";
  }
}

}  // namespace retort::test
