// The case lists of topk_kd and topk_kl_gathered (tests/ops/loss_cases.h).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <limits>
#include <utility>

#include "loss_cases.h"

namespace retort::test {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// ---- topk_kd ------------------------------------------------------------------------------------------

struct TopKCfg {
  TopKRef r;
  bool labels = true;
  bool mask = true;
  int64_t n = 5, v = 9, k = 4;
  DType dt = DType::F32, lp_dt = DType::F32, id_dt = DType::I32, mask_dt = DType::I32;
  double lo = -3, hi = 3;
  Out what = Out::Loss;
  bool transposed = false;  // logits read through a transposed view
};

// Inputs: logits [n, v], ids [n, k] in [0, v) (repeats happen), logprobs [n, k] in [-4, -0.1), mask [n, k]
// in {0, 1}, labels [n] in [-1, v) with ignore_index -1. Optional inputs left out are passed as null.
LossCase topk_case(const std::string& name, TopKCfg cfg) {
  cfg.r.ignore = -1;
  LossCase c;
  c.name = cat("topk_", name);
  const Shape xs = cfg.transposed ? Shape{cfg.v, cfg.n} : Shape{cfg.n, cfg.v};
  c.inputs = {LossInput(xs, cfg.dt, true, cfg.lo, cfg.hi),
              LossInput({cfg.n, cfg.k}, cfg.id_dt, false, 0, double(cfg.v)),
              LossInput({cfg.n, cfg.k}, cfg.lp_dt, false, -4, -0.1),
              LossInput({cfg.n, cfg.k}, cfg.mask_dt, false, 0, 2),
              LossInput({cfg.n}, DType::I32, false, -1, double(cfg.v))};
  if (is_float(cfg.mask_dt)) {  // a float mask: exactly 0 or 1
    Vec m;
    for (int64_t i = 0; i < cfg.n * cfg.k; ++i) m.push_back(double((i * 7 + 3) % 5 != 0));
    c.inputs[3].values = m;
  }
  c.build = [cfg](Context& ctx, const std::vector<Tensor*>& in) {
    const TopKDistillOptions o = topk_options(cfg.r, cfg.what);
    Tensor* x = cfg.transposed ? transpose(ctx, in[0]) : in[0];
    return pick(topk_kd(ctx, x, in[1], in[2], cfg.mask ? in[3] : nullptr, cfg.labels ? in[4] : nullptr, o),
                cfg.what);
  };
  c.reference = [cfg](const std::vector<Ref>& in) {
    return topk_ref(cfg.transposed ? mat_t(in[0]) : mat(in[0]), ints(in[1]), mat(in[2]),
                    cfg.mask ? in[3].v : Vec{}, cfg.labels ? ints(in[4]) : std::vector<int64_t>{}, cfg.r,
                    cfg.what);
  };
  c.check_grad = cfg.what == Out::Loss;
  return c;
}

std::string topk_name(const TopKRef& r, bool labels) {
  return cat("b", tag(r.beta, 10), "_t", tag(r.t, 1), r.normalize ? "_norm" : "", r.w_hard > 0 ? "_hard" : "",
             labels ? "_labels" : "", "_", red_name(r.red));
}

TopKCfg topk_cfg(double beta, double t, bool norm, double w_hard) {
  TopKCfg cfg;
  cfg.r.beta = beta;
  cfg.r.t = t;
  cfg.r.normalize = norm;
  cfg.r.w_hard = w_hard;
  return cfg;
}

void topk_options(std::vector<LossCase>& cs) {
  int i = 0;
  for (double beta : {0.0, 0.5, 1.0})
    for (double t : {1.0, 2.0})
      for (bool norm : {false, true})
        for (double w_hard : {0.0, 0.7})
          for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
            TopKCfg cfg = topk_cfg(beta, t, norm, w_hard);
            cfg.r.w_soft = 0.8;
            cfg.r.red = red;
            cfg.labels = w_hard > 0 || (i++ % 2 == 0);  // without labels every row counts
            cs.push_back(topk_case(topk_name(cfg.r, cfg.labels), cfg));
          }
  for (double beta : {0.0, 0.5, 1.0}) {  // no mask; i64 ids
    TopKCfg cfg = topk_cfg(beta, 2, false, 0);
    cfg.mask = false;
    cfg.id_dt = DType::I64;
    cs.push_back(topk_case(cat("nomask_b", tag(beta, 10)), cfg));
  }
  // TVD and the skew KLs: every kernel path of the KL family (CUDA: the general kernel, the cross-entropy
  // rows with a slot fixup at T = 1 with labels and normalize_topk, long rows).
  i = 0;
  for (const DivCase& d : div_cases())
    for (double t : {1.0, 2.0})
      for (bool norm : {false, true})
        for (double w_hard : {0.0, 0.7}) {
          TopKCfg cfg = topk_cfg(0, t, norm, w_hard);
          cfg.r.div = d.div;
          cfg.r.alpha = d.alpha;
          cfg.r.w_soft = 0.8;
          cfg.r.red = nth_reduction(i++);
          cfg.labels = w_hard > 0 || i % 2 == 0;
          cs.push_back(topk_case(cat(d.name, "_", topk_name(cfg.r, cfg.labels)), cfg));
        }
  for (const DivCase& d : div_cases()) {
    TopKCfg cfg = topk_cfg(0, 1, true, 0.3);
    cfg.r.div = d.div;
    cfg.r.alpha = d.alpha;
    cfg.n = 3;
    cfg.v = 3000;
    cfg.k = 40;
    LossCase c = topk_case(cat("long_", d.name), cfg);
    c.fd_samples = 64;
    cs.push_back(c);
  }
  for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None})
    for (Out what : {Out::PerRow, Out::Lse, Out::Hard, Out::Soft}) {
      TopKCfg cfg = topk_cfg(0.5, 2, false, 0.3);
      cfg.r.red = red;
      cfg.what = what;
      cs.push_back(topk_case(cat("out", std::to_string(int(what)), "_", red_name(red)), cfg));
    }
  // The hard part with w_hard = 0, and the lse on the normalize_topk path (which otherwise skips the row).
  TopKCfg cfg = topk_cfg(0, 1, true, 0);
  cfg.what = Out::Hard;
  cs.push_back(topk_case("hard_unweighted", cfg));
  cfg.what = Out::Lse;
  cfg.r.t = 2;
  cs.push_back(topk_case("norm_lse", cfg));
}

void topk_shapes(std::vector<LossCase>& cs) {
  for (double beta : {0.0, 0.5, 1.0})
    for (bool norm : {false, true}) {
      TopKCfg cfg = topk_cfg(beta, 2, norm, 0.5);
      cfg.k = 1;
      const std::string t = cat(tag(beta, 10), norm ? "n" : "");
      cs.push_back(topk_case(cat("k1_", t), cfg));
      cfg.k = cfg.v = 6;  // K = V, each id once per row: normalize_topk renormalizes over everything
      cfg.mask = false;
      LossCase c = topk_case(cat("kv_", t), cfg);
      Vec ids;
      for (int64_t r = 0; r < cfg.n; ++r)
        for (int64_t k = 0; k < cfg.k; ++k) ids.push_back(double((k * 5 + r) % cfg.k));
      c.inputs[1].values = ids;
      cs.push_back(c);
    }
  for (int64_t v = 1; v <= 7; ++v) {
    TopKCfg cfg = topk_cfg(v % 2 ? 0.5 : 1.0, 2, false, 0.5);
    cfg.v = v;
    cfg.k = std::min<int64_t>(3, v);
    cs.push_back(topk_case(cat("v", std::to_string(v)), cfg));
  }
  for (bool norm : {false, true}) {
    TopKCfg cfg = topk_cfg(0.5, norm ? 2 : 1, norm, 0.5);
    cfg.n = 2;
    cfg.v = 1000;
    cfg.k = 16;
    cs.push_back(topk_case(norm ? "v1000_norm" : "v1000", cfg));
  }
  // T = 2 with the hard loss: two running sums (at T and at 1), and the dense gradient's two exponentials.
  for (double t : {1.0, 2.0}) {
    TopKCfg cfg = topk_cfg(0, t, false, 0.5);
    cfg.n = 1;
    cfg.v = 2600;
    cfg.k = 6;
    LossCase c = topk_case(cat("long_rising_t", tag(t, 1)), cfg);
    c.inputs[0].values = rising(cfg.v);
    cs.push_back(c);
  }
  // From here on too big for central differences (most gradient elements are below a difference's rounding).
  // K in the thousands: CUDA's per-slot values and duplicate-id sort take > 48 KB of shared memory, and with
  // 3000 random ids out of 5000 most rows repeat some.
  for (bool norm : {false, true}) {
    TopKCfg cfg = topk_cfg(0.5, 2, norm, 0.2);
    cfg.n = 4;
    cfg.v = 5000;
    cfg.k = 3000;
    cfg.dt = DType::BF16;
    LossCase c = topk_case(norm ? "k3000_norm" : "k3000", cfg);
    c.fd_samples = -1;
    cs.push_back(c);
  }
  // Many rows over a vocabulary that takes CUDA's 8-wide loads; then long rows (a 60 KB bf16 row, a 400 KB
  // f32 row), more rows than CTAs: CUDA's two-pass kernel at real vocabularies, re-reading rows from L2.
  TopKCfg big = topk_cfg(0, 1, false, 0.5);
  big.n = 300;
  big.v = 4096;
  big.k = 64;
  LossCase rows = topk_case("rows300", big);
  rows.fd_samples = -1;
  cs.push_back(rows);
  for (DType dt : {DType::BF16, DType::F32}) {
    TopKCfg c32 = topk_cfg(0.5, dt == DType::F32 ? 2 : 1, false, 0.5);
    c32.n = 300;
    c32.v = dt == DType::F32 ? 100000 : 30000;
    c32.k = 64;
    c32.dt = dt;
    LossCase c = topk_case(cat("long_", dtype_name(dt)), c32);
    c.fd_samples = -1;
    cs.push_back(c);
  }
}

void topk_edges(std::vector<LossCase>& cs) {
  // Teacher logprobs in the logits' storage, a float mask; the transposed ones on normalize_topk.
  for (DType dt : {DType::BF16, DType::F16})
    for (bool transposed : {false, true}) {
      TopKCfg cfg = topk_cfg(transposed ? 1.0 : 0.5, 2, transposed, 0.5);
      cfg.dt = cfg.lp_dt = dt;
      cfg.mask_dt = DType::F32;
      cfg.transposed = transposed;
      cs.push_back(topk_case(cat(dtype_name(dt), transposed ? "_t" : ""), cfg));
    }
  TopKCfg tr = topk_cfg(1, 1, false, 0);
  tr.transposed = true;
  cs.push_back(topk_case("f32_t", tr));
  for (double beta : {0.0, 0.5, 1.0})
    for (bool norm : {false, true}) {
      TopKCfg cfg = topk_cfg(beta, 2, norm, 0.5);
      cfg.lo = -1e4;
      cfg.hi = 1e4;
      LossCase c = topk_case(cat("huge_", tag(beta, 10), norm ? "n" : ""), cfg);
      c.fwd_tol = 1e-9;
      c.grad_tol = 1e-6;  // central differences with steps of 1e-2 at |z| ~ 1e4
      cs.push_back(c);
    }
  // Row 0 pads two slots with −inf (and id −1, never to be read), row 1 is fully masked, row 2 pads by mask
  // only (with an out-of-range id), row 3 repeats id 3.
  auto padded = [](const std::string& name, const TopKRef& r, bool use_labels) {
    TopKCfg cfg;
    cfg.r = r;
    cfg.n = 4;
    cfg.v = 7;
    cfg.k = 3;
    cfg.labels = use_labels;
    LossCase c = topk_case(name, cfg);
    c.inputs[1].values = {1, -1, -1, 0, 2, 4, 6, 99, 5, 3, 3, 1};
    c.inputs[2].values = {-0.5, -kInf, -kInf, -1, -2, -3, -0.2, -1.7, -kInf, -0.3, -2.5, -1.2};
    c.inputs[3].values = {1, 1, 1, 0, 0, 0, 1, 0, 1, 1, 1, 1};
    c.inputs[4].values = {2, 6, -1, 0};
    return c;
  };
  for (double beta : {0.0, 0.5, 1.0})
    for (double t : {1.0, 2.0})
      for (bool norm : {false, true}) {
        TopKRef r;
        r.beta = beta;
        r.t = t;
        r.normalize = norm;
        r.w_hard = 0.4;
        const std::string nm = cat("pad_", tag(beta, 10), tag(t, 1), norm ? "n" : "");
        cs.push_back(padded(nm, r, true));
        r.w_hard = 0;
        r.red = Reduction::None;
        cs.push_back(padded(cat(nm, "_none"), r, false));
      }
  // The rows alone, no gradient: the fully masked row has no divergence, so a zero loss (not NaN).
  TopKRef none;
  none.red = Reduction::None;
  LossCase rows = padded("pad_rows", none, false);
  rows.check_grad = false;
  rows.reference = [none](const std::vector<Ref>& in) {
    Vec v = topk_ref(mat(in[0]), ints(in[1]), mat(in[2]), in[3].v, {}, none);
    EXPECT_EQ(v[1], 0.0);
    return v;
  };
  cs.push_back(rows);
  for (int valid_row : {-1, 1}) {  // all rows ignored: loss 0 and a zero gradient; one valid row
    TopKCfg cfg = topk_cfg(0.5, 1, false, 0.5);
    LossCase c = topk_case(valid_row < 0 ? "all_ignored" : "one_valid", cfg);
    Vec labels(size_t(cfg.n), -1.0);
    if (valid_row >= 0) labels[size_t(valid_row)] = 4;
    c.inputs[4].values = labels;
    c.unit_seed = true;
    cs.push_back(c);
  }
  for (bool norm : {false, true}) {
    LossCase c = topk_case(norm ? "single_norm" : "single", topk_cfg(0.5, 2, norm, 0.3));
    c.unit_seed = c.single_pass = true;
    cs.push_back(c);
  }
}

// ---- topk_kl_gathered ---------------------------------------------------------------------------------

LossCase gathered_case(const std::string& name, double t, Reduction red, bool use_mask, Out what = Out::Loss,
                       DType dt = DType::F32) {
  LossCase c;
  c.name = cat("gathered_", name);
  c.inputs = {LossInput({5, 6}, dt, true, -3, 3), LossInput({5, 6}, DType::F32, false, -4, -0.1),
              LossInput({5, 6}, DType::F32, false, 0, 1)};
  c.build = [=](Context& ctx, const std::vector<Tensor*>& in) {
    TopKKLOptions o;
    o.temperature = float(t);
    o.reduction = red;
    o.return_per_row = what == Out::PerRow;
    o.return_lse = what == Out::Lse;
    // The op sees mask != 0: a random float mask thresholded at 0.4 (relu keeps it a float tensor).
    Tensor* m = use_mask ? relu(ctx, sub(ctx, in[2], fill(ctx, DType::F32, in[2]->ne, 0.4f))) : nullptr;
    return pick(topk_kl_gathered(ctx, in[0], in[1], m, o), what);
  };
  c.reference = [=](const std::vector<Ref>& in) {
    TopKRef r;
    r.t = t;
    r.red = red;
    Vec mask;
    if (use_mask)
      for (double x : in[2].v) mask.push_back(x > 0.4 ? 1.0 : 0.0);
    return topk_ref(mat(in[0]), {}, mat(in[1]), mask, {}, r, what);
  };
  c.check_grad = what == Out::Loss;
  return c;
}

}  // namespace

std::vector<LossCase> topk_kd_cases() {
  std::vector<LossCase> cs;
  topk_options(cs);
  topk_shapes(cs);
  topk_edges(cs);
  return cs;
}

std::vector<LossCase> topk_gathered_cases() {
  std::vector<LossCase> cs;
  for (double t : {1.0, 2.0})
    for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None})
      for (bool use_mask : {false, true})
        cs.push_back(gathered_case(cat("t", tag(t, 1), "_", red_name(red), use_mask ? "_mask" : ""), t, red,
                                   use_mask));
  for (Out what : {Out::PerRow, Out::Lse})
    cs.push_back(gathered_case(cat("out", std::to_string(int(what))), 2, Reduction::Mean, false, what));
  for (bool use_mask : {false, true})
    cs.push_back(
        gathered_case(use_mask ? "bf16_mask" : "bf16", 2, Reduction::Mean, use_mask, Out::Loss, DType::BF16));
  LossCase pad = gathered_case("pad", 2, Reduction::None, true);
  pad.inputs[1].values = Vec(30, -1.0);
  pad.inputs[1].values[0] = -kInf;  // −inf padding in a valid-mask slot
  pad.inputs[2].values = Vec(30, 1.0);
  for (int k = 0; k < 6; ++k) pad.inputs[2].values[size_t(6 + k)] = 0;  // row 1 fully masked
  cs.push_back(pad);
  LossCase single = gathered_case("single", 2, Reduction::Mean, false);
  single.unit_seed = single.single_pass = true;
  cs.push_back(single);
  // topk_kd with normalize_topk (beta 0, no hard loss) against the gathered reference applied to the student
  // logits gathered at the ids: the two ops compute the same loss.
  LossCase same;
  same.name = "gathered_vs_topk";
  same.inputs = {LossInput({4, 10}, DType::F32, true, -3, 3), LossInput({4, 3}, DType::I32, false, 0, 10),
                 LossInput({4, 3}, DType::F32, false, -4, -0.1)};
  same.build = [](Context& ctx, const std::vector<Tensor*>& in) {
    TopKDistillOptions o;
    o.normalize_topk = true;
    o.temperature = 2;
    return topk_kd(ctx, in[0], in[1], in[2], nullptr, nullptr, o).loss;
  };
  same.reference = [](const std::vector<Ref>& in) {
    Mat z = mat(in[0]), g;
    g.rows = 4;
    g.cols = 3;
    const std::vector<int64_t> ids = ints(in[1]);
    for (int64_t r = 0; r < 4; ++r)
      for (int64_t k = 0; k < 3; ++k) g.v.push_back(z.at(r, ids[size_t(r * 3 + k)]));
    TopKRef r;
    r.t = 2;
    return topk_ref(g, {}, mat(in[2]), {}, {}, r);
  };
  cs.push_back(same);
  return cs;
}

}  // namespace retort::test
