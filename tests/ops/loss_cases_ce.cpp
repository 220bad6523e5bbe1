// The case lists of cross_entropy_loss, entropy and selective_log_softmax (tests/ops/loss_cases.h).
#include <array>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <tuple>

#include "loss_cases.h"

namespace retort::test {

std::string tag(double x, double scale) {
  return std::to_string(int(std::lround(x * scale)));
}

Reduction nth_reduction(int i) {
  return std::array{Reduction::Mean, Reduction::Sum, Reduction::None}[size_t(i % 3)];
}

TopKDistillOptions topk_options(const TopKRef& r, Out what) {
  TopKDistillOptions o;
  o.divergence = r.div;
  o.beta = float(r.beta);
  o.skew_alpha = float(r.alpha);
  o.temperature = float(r.t);
  o.normalize_topk = r.normalize;
  o.w_hard = float(r.w_hard);
  o.w_soft = float(r.w_soft);
  o.ignore_index = r.ignore;
  o.reduction = r.red;
  o.return_per_row = what == Out::PerRow;
  o.return_lse = what == Out::Lse;
  o.return_parts = what == Out::Hard || what == Out::Soft;
  return o;
}

DistillOptions distill_options(const DistillRef& r, Out what) {
  DistillOptions o;
  o.divergence = r.div;
  o.beta = float(r.beta);
  o.skew_alpha = float(r.alpha);
  o.temperature = float(r.t);
  o.w_hard = float(r.w_hard);
  o.w_soft = float(r.w_soft);
  o.ignore_index = r.ignore;
  o.reduction = r.red;
  o.return_per_row = what == Out::PerRow;
  o.return_lse = what == Out::Lse;
  o.return_parts = what == Out::Hard || what == Out::Soft;
  return o;
}

std::vector<LossCase> fused_leaf_seeded_cases() {
  std::vector<LossCase> out;
  for (const auto& list :
       {fused_ce_cases(), fused_topk_cases(), fused_distill_cases(), fused_entropy_cases()})
    for (const LossCase& c : list)
      if (c.single_pass && c.check_grad) {
        LossCase s = c;
        s.name += "_leafseed";
        s.unit_seed = true;
        s.leaf_seed = 0.37f;
        out.push_back(std::move(s));
      }
  return out;
}

const LossCase& case_named(const std::vector<LossCase>& list, const std::string& name) {
  for (const LossCase& c : list)
    if (c.name == name) return c;
  ADD_FAILURE() << "no case named " << name;
  return list.front();
}

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// How a case's logits are read: contiguous, through a transposed view (stored [v, n]: consecutive logits of
// a row are a whole row apart), or as columns [2, 2 + v) of rows of v + 3 (rows strided, starts unaligned).
enum class Layout { Contiguous, Transposed, Sliced };

Shape stored_shape(Layout l, int64_t n, int64_t v) {
  if (l == Layout::Transposed) return {v, n};
  if (l == Layout::Sliced) return {n, v + 3};
  return {n, v};
}

Tensor* view_of(Context& ctx, Tensor* x, Layout l, int64_t v) {
  if (l == Layout::Transposed) return transpose(ctx, x);
  if (l == Layout::Sliced) return slice(ctx, x, 0, 2, v);  // dim 0, from 2, v long
  return x;
}

Mat mat_of(const Ref& r, Layout l, int64_t v) {
  if (l == Layout::Transposed) return mat_t(r);
  Mat full = mat(r);
  if (l == Layout::Contiguous) return full;
  Mat z;
  z.rows = full.rows;
  z.cols = v;
  for (int64_t i = 0; i < full.rows; ++i)
    for (int64_t j = 0; j < v; ++j) z.v.push_back(full.at(i, j + 2));
  return z;
}

// ---- cross-entropy ------------------------------------------------------------------------------------

struct CeCfg {
  CeRef r;
  int64_t n = 6, v = 11;
  DType dt = DType::F32, label_dt = DType::I32;
  double lo = -3, hi = 3;
  Out what = Out::Loss;
  Layout layout = Layout::Contiguous;
};

// Logits [n, v] and labels in [-1, v) with ignore_index -1, so some rows are ignored.
LossCase ce_case(const std::string& name, CeCfg cfg) {
  cfg.r.ignore = -1;
  LossCase c;
  c.name = cat("ce_", name);
  c.inputs = {LossInput(stored_shape(cfg.layout, cfg.n, cfg.v), cfg.dt, true, cfg.lo, cfg.hi),
              LossInput({cfg.n}, cfg.label_dt, false, -1, double(cfg.v))};
  c.build = [cfg](Context& ctx, const std::vector<Tensor*>& in) {
    CrossEntropyOptions o;
    o.ignore_index = cfg.r.ignore;
    o.label_smoothing = float(cfg.r.eps);
    o.z_loss = float(cfg.r.z_loss);
    o.softcap = float(cfg.r.cap);
    o.reduction = cfg.r.red;
    o.return_per_row = cfg.what == Out::PerRow;
    o.return_lse = cfg.what == Out::Lse;
    return pick(cross_entropy_loss(ctx, view_of(ctx, in[0], cfg.layout, cfg.v), in[1], o), cfg.what);
  };
  c.reference = [cfg](const std::vector<Ref>& in) {
    return ce_ref(mat_of(in[0], cfg.layout, cfg.v), ints(in[1]), cfg.r, cfg.what);
  };
  c.check_grad = cfg.what == Out::Loss;
  return c;
}

CeCfg ce_cfg(double eps, double z_loss, double cap = 0, Reduction red = Reduction::Mean) {
  CeCfg cfg;
  cfg.r.eps = eps;
  cfg.r.z_loss = z_loss;
  cfg.r.cap = cap;
  cfg.r.red = red;
  return cfg;
}

void ce_options(std::vector<LossCase>& cs) {
  for (double eps : {0.0, 0.1})
    for (double zl : {0.0, 0.01})
      for (double cap : {0.0, 2.5})
        for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None})
          cs.push_back(
              ce_case(cat("e", tag(eps, 10), "_z", tag(zl, 100), "_c", tag(cap, 10), "_", red_name(red)),
                      ce_cfg(eps, zl, cap, red)));
  // The extra outputs (the lse of ignored rows too; the per-row loss is 0 there), with i64 labels.
  for (Reduction red : {Reduction::Mean, Reduction::None})
    for (Out what : {Out::PerRow, Out::Lse}) {
      CeCfg cfg = ce_cfg(0.2, 0, 4, red);
      cfg.n = 7;
      cfg.v = 9;
      cfg.what = what;
      cfg.label_dt = DType::I64;
      cs.push_back(ce_case(std::string(what == Out::PerRow ? "per_row_" : "lse_") + red_name(red), cfg));
    }
  // The single pass: backward on the loss itself, no multiply by an upstream.
  for (Reduction red : {Reduction::Mean, Reduction::Sum}) {
    LossCase c = ce_case(std::string("single_") + red_name(red), ce_cfg(0.1, 0.01, 5, red));
    c.unit_seed = c.single_pass = true;
    cs.push_back(c);
  }
  for (DType dt : {DType::BF16, DType::F16}) {
    CeCfg cfg;
    cfg.n = 4;
    cfg.v = 10;
    cfg.dt = dt;
    cfg.label_dt = DType::I64;
    LossCase c = ce_case(std::string("single_") + dtype_name(dt), cfg);
    c.inputs[1].lo = 0;  // no ignored rows
    c.unit_seed = c.single_pass = true;
    cs.push_back(c);
  }
}

void ce_dtypes_and_sizes(std::vector<LossCase>& cs) {
  for (DType dt : {DType::F32, DType::BF16, DType::F16})
    for (Layout l : {Layout::Contiguous, Layout::Transposed, Layout::Sliced}) {
      CeCfg cfg = ce_cfg(0.1, 0.01, l == Layout::Contiguous ? 0 : 3);
      cfg.dt = dt;
      cfg.layout = l;
      const char* ln = l == Layout::Contiguous ? "" : l == Layout::Transposed ? "_t" : "_sliced";
      cs.push_back(ce_case(std::string(dtype_name(dt)) + ln, cfg));
    }
  for (int64_t v = 1; v <= 7; ++v) {
    CeCfg cfg = ce_cfg(0.2, 0.01);
    cfg.n = 4;
    cfg.v = v;
    cs.push_back(ce_case(cat("v", std::to_string(v)), cfg));
  }
  for (DType dt : {DType::F32, DType::BF16}) {  // V = 1000 takes the 8-wide (and on Hopper the cluster) path
    CeCfg cfg = ce_cfg(0.1, 1e-3);
    cfg.n = 3;
    cfg.v = 1000;
    cfg.dt = dt;
    cs.push_back(ce_case(std::string("v1000_") + dtype_name(dt), cfg));
  }
  // A row rising from −4 to the end: an online pass rescales its running sums all the way.
  LossCase rise = ce_case("long_rising", ce_cfg(0.1, 0.01));
  rise.inputs = {LossInput({1, 2600}, DType::F32, true, 0, 0, rising(2600)),
                 LossInput({1}, DType::I32, false, 0, 0, Vec{2500})};
  rise.build = [](Context& ctx, const std::vector<Tensor*>& in) {
    CrossEntropyOptions o;
    o.label_smoothing = 0.1f;
    o.z_loss = 0.01f;
    return cross_entropy_loss(ctx, in[0], in[1], o).loss;
  };
  rise.reference = [](const std::vector<Ref>& in) {
    CeRef r;
    r.eps = 0.1;
    r.z_loss = 0.01;
    return ce_ref(mat(in[0]), ints(in[1]), r);
  };
  cs.push_back(rise);
  // Contiguous rows of odd length: each row starts at a different 16-byte misalignment, so CUDA's 8-wide
  // path starts with a scalar head of 0-7 values (bf16) or 0-3 (f32). Too long to difference whole.
  for (DType dt : {DType::BF16, DType::F32}) {
    CeCfg cfg = ce_cfg(0.1, 1e-3);
    cfg.n = 64;
    cfg.v = dt == DType::BF16 ? 1001 : 1003;
    cfg.dt = dt;
    LossCase c = ce_case(std::string("odd_rows_") + dtype_name(dt), cfg);
    c.fd_samples = 24;
    cs.push_back(c);
  }
  // Many rows per CTA (CUDA's grid-stride and cluster row pipeline) and rows split over a cluster of CTAs.
  // From here on the rows are too long for central differences: most gradient elements are far below a
  // difference's rounding (~1e-10), so the gradients are checked finite here and against the CPU's elsewhere.
  for (auto [n, v] : {std::pair<int64_t, int64_t>{300, 4096}, {6, 50000}}) {
    CeCfg cfg = ce_cfg(0.1, 0);
    cfg.n = n;
    cfg.v = v;
    LossCase c = ce_case(cat("big", std::to_string(v)), cfg);
    c.fd_samples = -1;
    cs.push_back(c);
  }
  // Softcap on whole aligned rows (one CTA per row at V = 1,000, a cluster of CTAs at 50,000): the segment
  // maximum is taken before the cap, and capped values are clamped to its image.
  for (auto [n, v, dt] :
       {std::tuple<int64_t, int64_t, DType>{64, 1000, DType::F32}, {6, 50000, DType::BF16}}) {
    CeCfg cfg = ce_cfg(0.1, 0, 30);
    cfg.n = n;
    cfg.v = v;
    cfg.dt = dt;
    cfg.lo = -40;
    cfg.hi = 40;
    LossCase c = ce_case(cat("cap_v", std::to_string(v)), cfg);
    c.fd_samples = -1;
    cs.push_back(c);
  }
  // Real vocabularies: CUDA's cluster kernel keeps rows of 50,304 bf16 values in two CTAs, of 128,256 in
  // three, and f32 rows of 60,000 in three (test_cuda_loss_cases.cpp also runs them alternately).
  for (int64_t v : {50304, 128256, -60000}) {
    CeCfg cfg = ce_cfg(0.1, 0);
    cfg.n = 3;
    cfg.v = std::abs(v);
    cfg.dt = v < 0 ? DType::F32 : DType::BF16;
    LossCase c = ce_case(cat("vocab", std::to_string(cfg.v), "_", dtype_name(cfg.dt)), cfg);
    c.fd_samples = -1;
    cs.push_back(c);
  }
}

void ce_edges(std::vector<LossCase>& cs) {
  for (int valid_row : {-1, 2}) {  // all rows ignored: loss 0 and a zero gradient, not NaN
    CeCfg cfg = ce_cfg(0.1, 0.01);
    cfg.n = 5;
    cfg.v = 7;
    LossCase c = ce_case(valid_row < 0 ? "all_ignored" : "one_valid", cfg);
    Vec labels(5, -1.0);
    if (valid_row >= 0) labels[size_t(valid_row)] = 3;
    c.inputs[1].values = labels;
    c.unit_seed = true;
    cs.push_back(c);
  }
  // Logits of ±1e4. CUDA's online pass subtracts the rounded max·log2(e) (ulp ~1e-3 near 1.4e4), so the
  // softmax terms carry ~1e-3 relative error there: a gradient nmse of ~1e-6 against the exact CPU's.
  struct Huge {
    const char* name;
    double eps, cap;
    Reduction red;
  };
  for (const Huge& h :
       {Huge{"huge_mean", 0.05, 0, Reduction::Mean}, Huge{"huge_none", 0.05, 0, Reduction::None},
        Huge{"huge_cap5", 0, 5, Reduction::Mean}, Huge{"huge_cap30", 0.05, 30, Reduction::Mean}}) {
    CeCfg cfg = ce_cfg(h.eps, 0, h.cap, h.red);
    cfg.n = 4;
    cfg.v = 9;
    cfg.lo = -1e4;
    cfg.hi = 1e4;
    LossCase c = ce_case(h.name, cfg);
    c.fwd_tol = 1e-9;
    c.grad_tol = 1e-6;
    c.backend_grad_tol = 1e-5;
    cs.push_back(c);
  }
  // Logits computed by another op: the loss's gradient reaches both of its operands.
  for (bool unit : {false, true}) {
    LossCase c;
    c.name = unit ? "ce_after_mul_unit" : "ce_after_mul";
    c.inputs = {LossInput({4, 6}, DType::F32, true, -2, 2), LossInput({4, 6}, DType::F32, true, 0.5, 2),
                LossInput({4}, DType::I32, false, 0, 6)};
    c.build = [](Context& ctx, const std::vector<Tensor*>& in) {
      return cross_entropy_loss(ctx, mul(ctx, in[0], in[1]), in[2]).loss;
    };
    c.reference = [](const std::vector<Ref>& in) {
      Mat z = mat(in[0]);
      for (size_t i = 0; i < z.v.size(); ++i) z.v[i] *= in[1].v[i];
      return ce_ref(z, ints(in[2]), CeRef{});
    };
    c.unit_seed = unit;
    cs.push_back(c);
  }
}

// ---- entropy ------------------------------------------------------------------------------------------

LossCase entropy_case(const std::string& name, double t, Reduction red, int64_t n, int64_t v,
                      DType dt = DType::F32, double lo = -3, double hi = 3) {
  LossCase c;
  c.name = cat("entropy_", name);
  c.inputs = {LossInput({n, v}, dt, true, lo, hi)};
  c.build = [t, red](Context& ctx, const std::vector<Tensor*>& in) {
    return entropy(ctx, in[0], float(t), red);
  };
  c.reference = [t, red](const std::vector<Ref>& in) { return entropy_ref(mat(in[0]), t, red); };
  return c;
}

// ---- selective log-softmax ----------------------------------------------------------------------------

LossCase selective_case(const std::string& name, int64_t n, int64_t v, int64_t k, DType dt = DType::F32,
                        double lo = -3, double hi = 3) {
  LossCase c;
  c.name = cat("sel_", name);
  c.inputs = {LossInput({n, v}, dt, true, lo, hi), LossInput({n, k}, DType::I32, false, 0, double(v))};
  c.build = [](Context& ctx, const std::vector<Tensor*>& in) {
    return selective_log_softmax(ctx, in[0], in[1]);
  };
  c.reference = [k](const std::vector<Ref>& in) { return selective_ref(mat(in[0]), ints(in[1]), k); };
  return c;
}

}  // namespace

std::vector<LossCase> cross_entropy_cases() {
  std::vector<LossCase> cs;
  ce_options(cs);
  ce_dtypes_and_sizes(cs);
  ce_edges(cs);
  return cs;
}

std::vector<LossCase> entropy_cases() {
  std::vector<LossCase> cs;
  for (double t : {1.0, 2.0, 0.5})
    for (Reduction red : {Reduction::None, Reduction::Mean, Reduction::Sum})
      cs.push_back(entropy_case(cat("t", tag(t, 10), "_", red_name(red)), t, red, 5, 9));
  for (int64_t v = 1; v <= 7; ++v)
    cs.push_back(entropy_case(cat("v", std::to_string(v)), 1.5, Reduction::None, 3, v));
  cs.push_back(entropy_case("v1000", 1.0, Reduction::Mean, 2, 1000, DType::F32, -6, 6));
  for (DType dt : {DType::BF16, DType::F16})
    cs.push_back(entropy_case(dtype_name(dt), 2, Reduction::None, 4, 16, dt));
  // Rows of 50,000 take CUDA's cluster path (two segments; 128,256: three), whose exponentials are MUFU.EX2
  // (about 2 ulp): at T = 1.3 the gradient's nmse against the CPU's libm exp lands near 2e-8 (H100), so these
  // allow 1e-7 against the CPU instead of 1e-9.
  for (int64_t v : {50000, 128256}) {
    LossCase c = entropy_case(cat("big", std::to_string(v)), 1.3, Reduction::Mean, 6, v, DType::BF16, -8, 8);
    c.backend_tol = c.backend_grad_tol = 1e-7;
    c.fd_samples = -1;
    cs.push_back(c);
  }
  // Rising rows over more than two blocks of the CPU kernels' passes.
  LossCase rise = entropy_case("rising", 1.0, Reduction::None, 2, 2600);
  for (int r = 0; r < 2; ++r)
    for (int j = 0; j < 2600; ++j) rise.inputs[0].values.push_back(0.003 * j * (r + 1) - 3);
  cs.push_back(rise);
  // ±1e4 at a temperature that keeps the distribution spread out: a full comparison.
  LossCase spread = entropy_case("huge_spread", 5000, Reduction::None, 4, 9, DType::F32, -1e4, 1e4);
  spread.grad_tol = 1e-6;
  cs.push_back(spread);
  // Logits near 1e4 (the entropy must not cancel against the lse). T = 2 scales exactly; at other
  // temperatures CUDA's z / T, taken before the max is subtracted, rounds at ulp(1e4 / T).
  LossCase near = entropy_case("near1e4", 2.0, Reduction::None, 4, 9, DType::F32, 1e4 - 3, 1e4 + 3);
  near.fd_step = 1e-7;
  near.grad_tol = 1e-6;  // central differences of a float64 reference at 1e4 with a 1e-3 step
  cs.push_back(near);
  // ±1e4 where the distribution is one-hot: the entropy is ~1e-100, so 0 (or as tiny), never NaN.
  for (double t : {1.5, 2.0}) {
    LossCase h = entropy_case(cat("onehot_t", tag(t, 10)), t, Reduction::Mean, 4, 9, DType::F32, -1e4, 1e4);
    h.unit_seed = true;
    h.reference = [t](const std::vector<Ref>& in) {
      Vec v = entropy_ref(mat(in[0]), t, Reduction::Mean);
      for (double& x : v) x = std::abs(x) < 1e-30 ? 0.0 : x;  // below f32's range: compare absolutely with 0
      return v;
    };
    cs.push_back(h);
  }
  // −inf logits (a masked vocabulary) add nothing: finite entropy and gradient (no differences at −inf).
  LossCase masked = entropy_case("minus_inf", 1.0, Reduction::None, 2, 6);
  masked.inputs[0].values = {0.5, -kInf, 1.0, -kInf, -0.3, 2.0, -kInf, 0.1, 0.7, -1.0, -kInf, -kInf};
  masked.fd = false;
  cs.push_back(masked);
  LossCase t;
  t.name = "entropy_transposed";
  t.inputs = {LossInput({7, 4}, DType::F32, true, -3, 3)};
  t.build = [](Context& ctx, const std::vector<Tensor*>& in) {
    return entropy(ctx, transpose(ctx, in[0]), 1.5f);
  };
  t.reference = [](const std::vector<Ref>& in) { return entropy_ref(mat_t(in[0]), 1.5, Reduction::None); };
  cs.push_back(t);
  LossCase single = entropy_case("single", 2, Reduction::Mean, 4, 9);
  single.unit_seed = single.single_pass = true;
  cs.push_back(single);
  return cs;
}

std::vector<LossCase> selective_cases() {
  std::vector<LossCase> cs;
  cs.push_back(selective_case("basic", 5, 9, 3));
  cs.push_back(selective_case("k1", 4, 7, 1));
  cs.push_back(selective_case("k_gt_v", 3, 4, 9));  // ids repeat: the scatter adds them
  for (int64_t v = 1; v <= 7; ++v) cs.push_back(selective_case(cat("v", std::to_string(v)), 3, v, 2));
  cs.push_back(selective_case("v1000", 2, 1000, 5));
  LossCase big = selective_case("big", 40, 8192, 300);
  big.fd_samples = -1;
  cs.push_back(big);
  for (DType dt : {DType::BF16, DType::F16}) cs.push_back(selective_case(dtype_name(dt), 4, 16, 3, dt));
  LossCase huge = selective_case("huge", 3, 8, 4, DType::F32, -1e4, 1e4);
  huge.fwd_tol = 1e-9;
  huge.grad_tol = 1e-5;  // the backward's exp(z − lse) with |z| ~ 1e4 carries lse's f32 rounding
  huge.backend_grad_tol = 1e-5;
  cs.push_back(huge);

  // Logits through a transposed view [5, 9], ids as a column window [5, 2] of a transposed i64 [6, 5].
  LossCase s;
  s.name = "sel_strided";
  s.inputs = {LossInput({9, 5}, DType::F32, true, -3, 3), LossInput({6, 5}, DType::I64, false, 0, 9)};
  s.build = [](Context& ctx, const std::vector<Tensor*>& in) {
    return selective_log_softmax(ctx, transpose(ctx, in[0]), slice(ctx, transpose(ctx, in[1]), 0, 1, 2));
  };
  s.reference = [](const std::vector<Ref>& in) {
    const Mat idt = mat_t(in[1]);  // [5, 6]
    std::vector<int64_t> ids;
    for (int64_t r = 0; r < 5; ++r)
      for (int64_t k = 1; k < 3; ++k) ids.push_back(int64_t(idt.at(r, k)));
    return selective_ref(mat_t(in[0]), ids, 2);
  };
  cs.push_back(s);

  // As part of a loss: a sum of its log-probabilities, backward on it directly.
  LossCase l = selective_case("in_loss", 4, 10, 3);
  l.build = [](Context& ctx, const std::vector<Tensor*>& in) {
    return sum(ctx, selective_log_softmax(ctx, in[0], in[1]));
  };
  l.reference = [](const std::vector<Ref>& in) {
    double s = 0;
    for (double x : selective_ref(mat(in[0]), ints(in[1]), 3)) s += x;
    return Vec{s};
  };
  l.unit_seed = true;
  cs.push_back(l);
  // Two consumers of the same output: the graph sums their gradients before the fused backward runs once.
  LossCase p = selective_case("policy_loss", 4, 8, 3, DType::F32, -2, 2);
  p.build = [](Context& ctx, const std::vector<Tensor*>& in) {
    Tensor* lp = selective_log_softmax(ctx, in[0], in[1]);
    return add(ctx, sum(ctx, mul(ctx, lp, lp)), scale(ctx, sum(ctx, lp), -0.5f));
  };
  p.reference = [](const std::vector<Ref>& in) {
    double s = 0;
    for (double x : selective_ref(mat(in[0]), ints(in[1]), 3)) s += x * x - 0.5 * x;
    return Vec{s};
  };
  p.unit_seed = true;
  cs.push_back(p);
  return cs;
}

}  // namespace retort::test
