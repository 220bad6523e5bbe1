// The case list of distill, the full-vocabulary KL / JSD (tests/ops/loss_cases.h).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <limits>
#include <utility>

#include "loss_cases.h"

namespace retort::test {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// ---- distill ------------------------------------------------------------------------------------------

struct DistillCfg {
  DistillRef r;
  bool labels = true;
  int64_t n = 5, v = 9;
  DType dt = DType::F32, teacher_dt = DType::F32;
  double lo = -3, hi = 3;
  Out what = Out::Loss;
  bool transposed = false;          // the student read through a transposed view
  bool teacher_transposed = false;  // the teacher too
};

// Inputs: student [n, v] (param), teacher [n, v] (constant), labels [n] in [-1, v) with ignore_index -1.
LossCase distill_case(const std::string& name, DistillCfg cfg) {
  cfg.r.ignore = -1;
  LossCase c;
  c.name = cat("distill_", name);
  const Shape xs = cfg.transposed ? Shape{cfg.v, cfg.n} : Shape{cfg.n, cfg.v};
  const Shape ts = cfg.teacher_transposed ? Shape{cfg.v, cfg.n} : Shape{cfg.n, cfg.v};
  c.inputs = {LossInput(xs, cfg.dt, true, cfg.lo, cfg.hi),
              LossInput(ts, cfg.teacher_dt, false, cfg.lo, cfg.hi),
              LossInput({cfg.n}, DType::I32, false, -1, double(cfg.v))};
  c.build = [cfg](Context& ctx, const std::vector<Tensor*>& in) {
    const DistillOptions o = distill_options(cfg.r, cfg.what);
    Tensor* x = cfg.transposed ? transpose(ctx, in[0]) : in[0];
    Tensor* t = cfg.teacher_transposed ? transpose(ctx, in[1]) : in[1];
    return pick(distill(ctx, x, t, cfg.labels ? in[2] : nullptr, o), cfg.what);
  };
  c.reference = [cfg](const std::vector<Ref>& in) {
    return distill_ref(cfg.transposed ? mat_t(in[0]) : mat(in[0]),
                       cfg.teacher_transposed ? mat_t(in[1]) : mat(in[1]),
                       cfg.labels ? ints(in[2]) : std::vector<int64_t>{}, cfg.r, cfg.what);
  };
  c.check_grad = cfg.what == Out::Loss;
  return c;
}

std::string distill_name(const DistillRef& r, bool labels) {
  return cat("b", tag(r.beta, 10), "_t", tag(r.t, 1), r.w_hard > 0 ? "_hard" : "", labels ? "_labels" : "",
             "_", red_name(r.red));
}

DistillCfg distill_cfg(double beta, double t, double w_hard) {
  DistillCfg cfg;
  cfg.r.beta = beta;
  cfg.r.t = t;
  cfg.r.w_hard = w_hard;
  return cfg;
}

void distill_options(std::vector<LossCase>& cs) {
  int i = 0;
  for (double beta : {0.0, 0.5, 1.0, 0.1})
    for (double t : {1.0, 2.0})
      for (double w_hard : {0.0, 0.6})
        for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
          DistillCfg cfg = distill_cfg(beta, t, w_hard);
          cfg.r.w_soft = 0.9;
          cfg.r.red = red;
          cfg.labels = w_hard > 0 || (i++ % 2 == 0);
          cs.push_back(distill_case(distill_name(cfg.r, cfg.labels), cfg));
        }
  for (Reduction red : {Reduction::Mean, Reduction::None})
    for (Out what : {Out::PerRow, Out::Lse, Out::Hard, Out::Soft}) {
      DistillCfg cfg = distill_cfg(0.5, 2, 0.4);
      cfg.r.red = red;
      cfg.what = what;
      cs.push_back(distill_case(cat("out", std::to_string(int(what)), "_", red_name(red)), cfg));
    }
  // TVD and the skew KLs: short rows, rows of 1000 (every vector width and tail of the CPU's loops) and of
  // 3001 (CUDA's portable kernel with 8-wide loads; the Hopper cluster kernel is the KL family's).
  i = 0;
  for (const DivCase& d : div_cases())
    for (double t : {1.0, 2.0})
      for (double w_hard : {0.0, 0.6}) {
        DistillCfg cfg = distill_cfg(0, t, w_hard);
        cfg.r.div = d.div;
        cfg.r.alpha = d.alpha;
        cfg.r.w_soft = 0.9;
        cfg.r.red = nth_reduction(i++);
        cfg.labels = w_hard > 0 || i % 2 == 0;
        cs.push_back(distill_case(cat(d.name, "_", distill_name(cfg.r, cfg.labels)), cfg));
      }
  for (const DivCase& d : div_cases()) {
    DistillCfg cfg = distill_cfg(0, 2, 0.5);
    cfg.r.div = d.div;
    cfg.r.alpha = d.alpha;
    cfg.n = 2;
    cfg.v = 1000;
    cs.push_back(distill_case(cat(d.name, "_v1000"), cfg));
    for (double t : {1.0, 2.0}) {
      cfg.r.t = t;
      cfg.r.w_hard = t == 1 ? 0.6 : 0;
      cfg.r.red = nth_reduction(i++);
      cfg.labels = cfg.r.w_hard > 0 || i % 2 == 0;
      cfg.n = 3;
      cfg.v = 3001;
      LossCase c = distill_case(cat(d.name, "_v3001_", distill_name(cfg.r, cfg.labels)), cfg);
      c.fd_samples = 64;
      cs.push_back(c);
    }
  }
  for (double beta : {0.0, 0.5, 1.0}) {
    LossCase c = distill_case(cat("single_", tag(beta, 10)), distill_cfg(beta, 2, 0.2));
    c.unit_seed = c.single_pass = true;
    cs.push_back(c);
  }
  for (const DivCase& d : div_cases()) {
    DistillCfg cfg = distill_cfg(0, 1, 0.2);
    cfg.r.div = d.div;
    cfg.r.alpha = d.alpha;
    LossCase c = distill_case(cat("single_", d.name), cfg);
    c.unit_seed = c.single_pass = true;
    cs.push_back(c);
  }
}

void distill_shapes(std::vector<LossCase>& cs) {
  for (int64_t v = 1; v <= 7; ++v) {
    DistillCfg cfg = distill_cfg(v % 3 == 0 ? 0.0 : v % 3 == 1 ? 0.5 : 1.0, 2, 0.5);
    cfg.v = v;
    cs.push_back(distill_case(cat("v", std::to_string(v)), cfg));
  }
  for (double beta : {0.0, 0.5}) {
    DistillCfg cfg = distill_cfg(beta, 1, 0.5);
    cfg.n = 2;
    cfg.v = 1000;
    cs.push_back(distill_case(cat("v1000_", tag(beta, 10)), cfg));
  }
  for (double beta : {0.0, 0.5, 1.0}) {
    DistillCfg cfg = distill_cfg(beta, 2, 0.5);
    cfg.n = 1;
    cfg.v = 2600;
    LossCase c = distill_case(cat("long_rising_", tag(beta, 10)), cfg);
    c.inputs[0].values = rising(cfg.v);
    cs.push_back(c);
  }
  // Contiguous rows of odd length: CUDA's portable kernel's 8-wide path after each row's scalar head
  // (student and teacher rows share their misalignment), for every mode; f32 also stores the gradient 8-wide.
  for (DType dt : {DType::BF16, DType::F32})
    for (double beta : {0.0, 0.5, 1.0}) {
      DistillCfg cfg = distill_cfg(beta, beta == 0.5 ? 2 : 1, 0.25);
      cfg.n = 64;
      cfg.v = dt == DType::BF16 ? 1001 : 1003;
      cfg.dt = cfg.teacher_dt = dt;
      LossCase c = distill_case(cat("odd_rows_", dtype_name(dt), "_", tag(beta, 10)), cfg);
      c.fd_samples = 24;
      cs.push_back(c);
    }
  // Storage dtypes: a teacher in the student's dtype or in f32; the student alone or both read transposed.
  for (DType dt : {DType::BF16, DType::F16}) {
    DistillCfg cfg = distill_cfg(0.5, 2, 0.5);
    cfg.dt = cfg.teacher_dt = dt;
    cs.push_back(distill_case(dtype_name(dt), cfg));
    cfg.teacher_dt = DType::F32;
    cs.push_back(distill_case(cat(dtype_name(dt), "_teacher_f32"), cfg));
    cfg.r.beta = 1;
    cfg.teacher_dt = dt;
    cfg.transposed = true;
    cs.push_back(distill_case(cat(dtype_name(dt), "_t"), cfg));
    cfg.teacher_transposed = true;
    cs.push_back(distill_case(cat(dtype_name(dt), "_tt"), cfg));
  }
  // Too big for central differences: many rows, then rows that are whole 16-byte vectors in one dtype (the
  // Hopper cluster kernel: rows in the shared memory of up to eight CTAs; bf16 V = 60,000 in three), with
  // ignored rows and labels at both ends, the lse and the soft part too. JSD at T = 1 keeps q and t between
  // its passes; at T = 2 with the hard loss it keeps t only.
  for (double beta : {0.0, 1.0}) {
    DistillCfg cfg = distill_cfg(beta, 2, 0.3);
    cfg.n = 200;
    cfg.v = 3000;
    cfg.dt = cfg.teacher_dt = DType::BF16;
    LossCase c = distill_case(cat("rows200_", tag(beta, 10)), cfg);
    c.fd_samples = -1;
    cs.push_back(c);
  }
  for (auto [beta, t] : {std::pair{0.0, 2.0}, {0.5, 1.0}, {0.5, 2.0}, {1.0, 2.0}})
    for (Out what : {Out::Loss, Out::Lse, Out::Soft}) {
      DistillCfg cfg = distill_cfg(beta, t, 0.3);
      cfg.n = 6;
      cfg.v = 60000;
      cfg.dt = cfg.teacher_dt = DType::BF16;
      cfg.what = what;
      LossCase c =
          distill_case(cat("cluster_", tag(beta, 10), "_t", tag(t, 1), "_", std::to_string(int(what))), cfg);
      c.inputs[2].values = {5, -1, 59999, 0, -1, 31337};
      c.fd_samples = -1;
      cs.push_back(c);
    }
  // Rows that two 512-thread CTAs per SM could hold single-buffered only: three 320-thread CTAs per SM take
  // them, in more segments (bf16 V = 128,256 in 8; f32 V = 60,000 in 7).
  for (auto [v, dt] : {std::pair{int64_t(128256), DType::BF16}, {int64_t(60000), DType::F32}})
    for (auto [beta, t] : {std::pair{0.0, 1.0}, {0.5, 1.0}, {0.5, 2.0}, {1.0, 1.0}}) {
      DistillCfg cfg = distill_cfg(beta, t, 0.3);
      cfg.n = 6;
      cfg.v = v;
      cfg.dt = cfg.teacher_dt = dt;
      LossCase c = distill_case(cat("cluster3_", dtype_name(dt), "_", tag(beta, 10), "_t", tag(t, 1)), cfg);
      c.inputs[2].values = {5, -1, double(v - 1), 0, 31337, -1};
      c.fd_samples = -1;
      cs.push_back(c);
    }
}

void distill_edges(std::vector<LossCase>& cs) {
  for (double beta : {0.0, 0.5, 1.0}) {
    DistillCfg cfg = distill_cfg(beta, 2, 0.3);
    cfg.lo = -1e4;
    cfg.hi = 1e4;
    LossCase c = distill_case(cat("huge_", tag(beta, 10)), cfg);
    c.fwd_tol = 1e-9;
    c.grad_tol = 1e-6;  // central differences with steps of 1e-2 at |z| ~ 1e4
    cs.push_back(c);
  }
  // A teacher that rules tokens out with −inf logits (a padded vocabulary): forward KL and JSD stay finite.
  for (double beta : {0.0, 0.5}) {
    DistillCfg cfg = distill_cfg(beta, 1, 0);
    cfg.n = 2;
    cfg.v = 5;
    LossCase c = distill_case(cat("teacher_inf_", tag(beta, 10)), cfg);
    c.inputs[1].values = {0.5, -kInf, 1.0, -kInf, -0.3, -kInf, 2.0, 0.1, 0.7, -1.0};
    cs.push_back(c);
  }
  // Whole 16-byte f32 rows (V = 16: CUDA's cluster kernel) of ±1e4 logits against a teacher spread over ±1e4
  // with every third entry ruled out.
  for (auto [beta, t] : {std::pair{0.0, 2.0}, {0.5, 2.0}, {0.5, 1.0}}) {
    DistillCfg cfg = distill_cfg(beta, t, 0.3);
    cfg.n = 2;
    cfg.v = 16;
    cfg.lo = -1e4;
    cfg.hi = 1e4;
    LossCase c = distill_case(cat("huge16_", tag(beta, 10), "_t", tag(t, 1)), cfg);
    Vec teacher(32);
    for (size_t j = 0; j < teacher.size(); ++j)
      teacher[j] = j % 3 == 1 ? -kInf : 1e4 * std::sin(double(j) * 1.7);
    c.inputs[1].values = teacher;
    c.fwd_tol = 1e-9;
    c.grad_tol = 1e-6;
    cs.push_back(c);
  }
  for (int valid_row : {-1, 3}) {
    LossCase c = distill_case(valid_row < 0 ? "all_ignored" : "one_valid", distill_cfg(0.5, 1, 0.5));
    Vec labels(5, -1.0);
    if (valid_row >= 0) labels[size_t(valid_row)] = 2;
    c.inputs[2].values = labels;
    c.unit_seed = true;
    cs.push_back(c);
  }
}

}  // namespace

std::vector<LossCase> distill_cases() {
  std::vector<LossCase> cs;
  distill_options(cs);
  distill_shapes(cs);
  distill_edges(cs);
  return cs;
}

}  // namespace retort::test
