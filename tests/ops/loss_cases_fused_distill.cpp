// The case lists of fused_linear_distill (student and online teacher lm-heads), fused_linear_entropy and
// fused_linear_selective_log_softmax (tests/ops/loss_cases.h): float64 lm-heads feeding the row references.
#include <array>

#include "loss_cases.h"

namespace retort::test {
namespace {

std::string num(double x) {
  return std::to_string(int(x * 10));
}

struct Cfg {
  DistillRef r;
  bool bias = true, teacher_bias = true, labels = true;
  int64_t n = 7, h = 4, ht = 6, v = 11, chunk = 3;
  DType dt = DType::F32, teacher_dt = DType::F32;
  Out what = Out::Loss;
};

// hidden [n, h], weight [v, h], bias [v], teacher hidden [n, ht], teacher weight [v, ht], teacher bias [v]
// (constants), labels [n] in [-1, v) with ignore_index -1; optional inputs left out are passed as null.
LossCase distill_case(const std::string& name, Cfg cfg) {
  cfg.r.ignore = -1;
  LossCase c;
  c.name = cat("fdistill_", name);
  c.inputs = {LossInput({cfg.n, cfg.h}, cfg.dt, true, -2, 2),
              LossInput({cfg.v, cfg.h}, cfg.dt, true, -1, 1),
              LossInput({cfg.v}, cfg.dt, cfg.bias, -0.5, 0.5),
              LossInput({cfg.n, cfg.ht}, cfg.teacher_dt, false, -2, 2),
              LossInput({cfg.v, cfg.ht}, cfg.teacher_dt, false, -1, 1),
              LossInput({cfg.v}, cfg.teacher_dt, false, -1, 1),
              LossInput({cfg.n}, DType::I32, false, -1, double(cfg.v))};
  c.build = [cfg](Context& ctx, const std::vector<Tensor*>& in) {
    const DistillOptions o = distill_options(cfg.r, cfg.what);
    return pick(fused_linear_distill(ctx, in[0], in[1], cfg.bias ? in[2] : nullptr, in[3], in[4],
                                     cfg.teacher_bias ? in[5] : nullptr, cfg.labels ? in[6] : nullptr, o,
                                     fused_chunks(cfg.chunk)),
                cfg.what);
  };
  c.reference = [cfg](const std::vector<Ref>& in) {
    return distill_ref(head_ref(in[0], in[1], cfg.bias ? &in[2] : nullptr),
                       head_ref(in[3], in[4], cfg.teacher_bias ? &in[5] : nullptr),
                       cfg.labels ? ints(in[6]) : std::vector<int64_t>{}, cfg.r, cfg.what);
  };
  c.check_grad = cfg.what == Out::Loss;
  loosen_for_16bit_heads(cfg.dt, c);
  return c;
}

void distill_grids(std::vector<LossCase>& cs) {
  int i = 0;
  for (double beta : {0.0, 0.5, 1.0})
    for (double t : {1.0, 2.0})
      for (double w_hard : {0.0, 0.3}) {
        Cfg cfg;
        cfg.r.beta = beta;
        cfg.r.t = t;
        cfg.r.w_hard = w_hard;
        cfg.r.red = nth_reduction(i++);
        cfg.labels = w_hard > 0 || i % 2 == 0;
        cfg.bias = i % 3 != 0;
        cfg.teacher_bias = i % 2 == 0;
        cs.push_back(distill_case(cat("b", num(beta), "_t", num(t), w_hard > 0 ? "_hard" : "",
                                      cfg.labels ? "_labels" : "", "_", red_name(cfg.r.red)),
                                  cfg));
      }
  // f32 and bf16 heads, forward KL and JSD at T = 2 with a hard part, every reduction and chunks of one row,
  // some rows and all rows.
  for (DType dt : {DType::F32, DType::BF16})
    for (double beta : {0.0, 0.5})
      for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None})
        for (int64_t chunk : {int64_t(1), int64_t(3), int64_t(7)}) {
          Cfg cfg;
          cfg.r.beta = beta;
          cfg.r.t = 2.0;
          cfg.r.w_hard = 0.25;
          cfg.r.red = red;
          cfg.dt = cfg.teacher_dt = dt;
          cfg.chunk = chunk;
          cs.push_back(distill_case(
              cat(dtype_name(dt), "_b", num(beta), "_", red_name(red), "_chunk", std::to_string(chunk)),
              cfg));
        }
  // TVD and the skew KLs: T = 1 with a hard part and T = 2 without, then T = 2 with one in f32 and bf16.
  for (const DivCase& d : div_cases()) {
    for (double t : {1.0, 2.0}) {
      Cfg cfg;
      cfg.r.div = d.div;
      cfg.r.alpha = d.alpha;
      cfg.r.t = t;
      cfg.r.w_hard = t == 1.0 ? 0.3 : 0.0;
      cfg.r.red = nth_reduction(i++);
      cfg.labels = cfg.r.w_hard > 0 || i % 2 == 0;
      cs.push_back(distill_case(cat(d.name, "_t", num(t), "_", red_name(cfg.r.red)), cfg));
    }
    for (DType dt : {DType::F32, DType::BF16}) {
      Cfg cfg;
      cfg.r.div = d.div;
      cfg.r.alpha = d.alpha;
      cfg.r.t = 2.0;
      cfg.r.w_hard = 0.25;
      cfg.r.red = nth_reduction(i++);
      cfg.dt = cfg.teacher_dt = dt;
      cs.push_back(distill_case(cat(d.name, "_", dtype_name(dt), "_hard_", red_name(cfg.r.red)), cfg));
    }
  }
  for (Out what : {Out::PerRow, Out::Lse, Out::Hard, Out::Soft}) {
    Cfg cfg;
    cfg.r.w_hard = 0.5;
    cfg.r.t = 1.5;
    cfg.what = what;
    cs.push_back(distill_case(cat("out", std::to_string(int(what))), cfg));
  }
  for (Out what : {Out::Hard, Out::Soft, Out::Lse}) {
    Cfg cfg;
    cfg.r.beta = 0.5;
    cfg.r.w_hard = 0.5;
    cfg.what = what;
    cs.push_back(distill_case(cat("jsd_out", std::to_string(int(what))), cfg));
  }
  // A bf16 student and an f16 teacher of another width (Ht = 9 vs H = 4); the single pass.
  Cfg cfg;
  cfg.dt = DType::BF16;
  cfg.teacher_dt = DType::F16;
  cfg.ht = 9;
  cfg.r.beta = 0.5;
  cfg.r.w_hard = 0.2;
  LossCase c = distill_case("single_mixed", cfg);
  c.unit_seed = c.single_pass = true;
  cs.push_back(c);
}

}  // namespace

std::vector<LossCase> fused_distill_cases() {
  std::vector<LossCase> cs;
  distill_grids(cs);
  return cs;
}

std::vector<LossCase> fused_entropy_cases() {
  std::vector<LossCase> cs;
  struct Shape3 {
    int64_t n, h, v;
  };
  for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None})
    for (double t : {1.0, 0.7, 1.5}) {
      const Shape3 s = t == 1.5 ? Shape3{7, 5, 11} : Shape3{7, 5, 13};
      LossCase c;
      c.name = cat("fentropy_", red_name(red), "_t", num(t));
      c.inputs = {LossInput({s.n, s.h}, DType::F32, true, -2, 2),
                  LossInput({s.v, s.h}, DType::F32, true, -1, 1),
                  LossInput({s.v}, DType::F32, true, -0.5, 0.5)};
      c.build = [red, t](Context& ctx, const std::vector<Tensor*>& in) {
        return fused_linear_entropy(ctx, in[0], in[1], in[2], float(t), red, fused_chunks(3));
      };
      c.reference = [red, t](const std::vector<Ref>& in) {
        return entropy_ref(head_ref(in[0], in[1], &in[2]), t, red);
      };
      cs.push_back(c);
      if (red == Reduction::None || t == 1.5) continue;
      c.name = cat(c.name, "_single");
      c.unit_seed = c.single_pass = true;
      cs.push_back(c);
    }
  return cs;
}

std::vector<LossCase> fused_selective_cases() {
  // Forward, and the recomputing backward (FusedLinearBack) with a per-element upstream gradient; K = 1, K
  // within V and K = 9 of V = 9 (repeated ids); f32 and bf16 heads.
  std::vector<LossCase> cs;
  for (DType dt : {DType::F32, DType::BF16})
    for (int64_t k : {int64_t(1), int64_t(3), int64_t(9)}) {
      LossCase c;
      c.name = cat("fselective_", dtype_name(dt), "_k", std::to_string(k));
      c.inputs = {LossInput({6, 4}, dt, true, -2, 2), LossInput({9, 4}, dt, true, -1, 1),
                  LossInput({9}, dt, true, -0.5, 0.5), LossInput({6, k}, DType::I64, false, 0, 9)};
      c.build = [](Context& ctx, const std::vector<Tensor*>& in) {
        return fused_linear_selective_log_softmax(ctx, in[0], in[1], in[2], in[3], fused_chunks(4));
      };
      c.reference = [k](const std::vector<Ref>& in) {
        return selective_ref(head_ref(in[0], in[1], &in[2]), ints(in[3]), k);
      };
      loosen_for_16bit_heads(dt, c);
      cs.push_back(c);
    }
  return cs;
}

}  // namespace retort::test
