// The case list of fused_linear_topk_kd (tests/ops/loss_cases.h): the float64 lm-head feeding the top-K
// reference, on the dense path (full-vocabulary GEMMs: a hard loss, Q over V, or an output that needs the
// whole row) and the K-sparse path (normalize_topk without the hard loss: K dot products per row).
#include <array>
#include <limits>

#include "loss_cases.h"

namespace retort::test {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

LossInput hidden_in(int64_t n, int64_t h, DType dt, double lo, double hi) {
  return LossInput(Shape{n, h}, dt, true, lo, hi);
}

struct Cfg {
  TopKRef r;
  bool bias = true, labels = true, mask = true;
  int64_t n = 7, h = 4, v = 11, k = 4, chunk = 3;
  DType dt = DType::F32;
  Out what = Out::Loss;
  DType logits = DType::F32;  // FusedLinearOptions::logits_dtype (the CPU keeps f32 logits whatever it is)
  double hidden_range = 2;
};

// hidden [n, h], weight [v, h], bias [v], ids [n, k], logprobs [n, k], mask [n, k] in {0..3} (nonzero =
// valid: a row rarely loses its divergence), labels [n] in [-1, v) with ignore_index -1; optional inputs
// left out are passed as null (an unused bias is no parameter).
LossCase topk_case(const std::string& name, Cfg cfg) {
  cfg.r.ignore = -1;
  LossCase c;
  c.name = cat("ftopk_", name);
  c.inputs = {hidden_in(cfg.n, cfg.h, cfg.dt, -cfg.hidden_range, cfg.hidden_range),
              LossInput(Shape{cfg.v, cfg.h}, cfg.dt, true, -1, 1),
              LossInput(Shape{cfg.v}, cfg.dt, cfg.bias, -0.5, 0.5),
              LossInput({cfg.n, cfg.k}, DType::I32, false, 0, double(cfg.v)),
              LossInput({cfg.n, cfg.k}, DType::F32, false, -4, -0.1),
              LossInput({cfg.n, cfg.k}, DType::I32, false, 0, 4),
              LossInput({cfg.n}, DType::I32, false, -1, double(cfg.v))};
  c.build = [cfg](Context& ctx, const std::vector<Tensor*>& in) {
    const TopKDistillOptions o = topk_options(cfg.r, cfg.what);
    FusedLinearOptions f = fused_chunks(cfg.chunk);
    f.logits_dtype = cfg.logits;
    return pick(fused_linear_topk_kd(ctx, in[0], in[1], cfg.bias ? in[2] : nullptr, in[3], in[4],
                                     cfg.mask ? in[5] : nullptr, cfg.labels ? in[6] : nullptr, o, f),
                cfg.what);
  };
  c.reference = [cfg](const std::vector<Ref>& in) {
    return topk_ref(head_ref(in[0], in[1], cfg.bias ? &in[2] : nullptr), ints(in[3]), mat(in[4]),
                    cfg.mask ? in[5].v : Vec{}, cfg.labels ? ints(in[6]) : std::vector<int64_t>{}, cfg.r,
                    cfg.what);
  };
  c.check_grad = cfg.what == Out::Loss;
  // The K-sparse path gathers and scatters in f32: no 16-bit logits gradient there.
  const bool sparse = cfg.r.normalize && cfg.r.w_hard == 0 && cfg.what != Out::Lse && cfg.what != Out::Hard;
  if (!sparse) loosen_for_16bit_heads(cfg.dt, c);
  return c;
}

std::string num(double x) {
  return std::to_string(int(x * 10));
}

void grids(std::vector<LossCase>& cs) {
  int i = 0;
  for (double beta : {0.0, 0.5, 1.0})
    for (double t : {1.0, 2.0})
      for (bool normalize : {false, true})
        for (double w_hard : {0.0, 0.5}) {
          Cfg cfg;
          cfg.r.beta = beta;
          cfg.r.t = t;
          cfg.r.normalize = normalize;
          cfg.r.w_hard = w_hard;
          cfg.r.red = nth_reduction(i++);
          cfg.labels = w_hard > 0 || i % 2 == 0;
          cfg.bias = i % 4 != 1;
          cs.push_back(
              topk_case(cat("b", num(beta), "_t", num(t), normalize ? "_norm" : "", w_hard > 0 ? "_hard" : "",
                            cfg.labels ? "_labels" : "", "_", red_name(cfg.r.red)),
                        cfg));
        }
  // Full-vocabulary GEMMs at T = 2 with a hard loss, every reduction.
  for (double beta : {0.0, 0.5, 1.0})
    for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
      Cfg cfg;
      cfg.r.beta = beta;
      cfg.r.t = 2.0;
      cfg.r.w_hard = 0.5;
      cfg.r.red = red;
      cfg.r.normalize = beta == 0.5;
      cs.push_back(topk_case(cat("dense_b", num(beta), "_", red_name(red)), cfg));
    }
  // TVD and the skew KLs, dense and K-sparse. The skew divergences at α = 0.6 are small (M is close to the
  // weighted side), so the f32 rounding of the GEMM's logits is a larger fraction of them: nmse up to ~3e-9.
  i = 0;
  for (const DivCase& d : div_cases())
    for (bool normalize : {false, true})
      for (double w_hard : {0.0, 0.5}) {
        Cfg cfg;
        cfg.r.div = d.div;
        cfg.r.alpha = d.alpha;
        cfg.r.t = i % 2 == 0 ? 1.0 : 2.0;
        cfg.r.normalize = normalize;
        cfg.r.w_hard = w_hard;
        cfg.r.red = nth_reduction(i++);
        cfg.labels = w_hard > 0 || i % 2 == 0;
        LossCase c = topk_case(
            cat(d.name, normalize ? "_norm" : "", w_hard > 0 ? "_hard" : "", "_", red_name(cfg.r.red)), cfg);
        c.fwd_tol = 1e-8;
        cs.push_back(c);
      }
  // The extra outputs: lse and the hard part with labels need the full row, the dense path even with
  // normalize_topk on.
  for (bool normalize : {false, true})
    for (Out what : {Out::PerRow, Out::Lse, Out::Hard, Out::Soft})
      for (Reduction red : {Reduction::Mean, Reduction::None}) {
        Cfg cfg;
        cfg.r.normalize = normalize;
        cfg.r.red = red;
        cfg.r.t = 1.5;
        cfg.what = what;
        cs.push_back(
            topk_case(cat("out", std::to_string(int(what)), normalize ? "_norm_" : "_", red_name(red)), cfg));
      }
  for (bool normalize : {false, true})
    for (DType dt : {DType::F32, DType::BF16}) {
      Cfg cfg;
      cfg.r.normalize = normalize;
      cfg.r.beta = 0.5;
      cfg.dt = dt;
      LossCase c = topk_case(cat("single_", dtype_name(dt), normalize ? "_norm" : ""), cfg);
      c.unit_seed = c.single_pass = true;
      cs.push_back(c);
    }
}

// CUDA runs T = 1 with beta = 0, or normalize_topk, as cross-entropy rows with a per-row coefficient between
// a slot-gathering and a slot-fixup kernel: duplicate ids (K = 6 of V = 11), masked and ignored rows, every
// reduction and output, w_hard or w_soft zero, and a vocabulary of three cluster segments.
void as_ce_rows(std::vector<LossCase>& cs) {
  for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
    Cfg cfg;
    cfg.k = 6;
    cfg.r.w_hard = 0.5;
    cfg.r.red = red;
    cs.push_back(topk_case(cat("ce_fkl_", red_name(red)), cfg));
  }
  for (double beta : {0.0, 0.5, 1.0}) {
    Cfg cfg;
    cfg.k = 6;
    cfg.r.beta = beta;
    cfg.r.normalize = true;
    cfg.r.w_hard = 0.75;
    cs.push_back(topk_case(cat("ce_norm_b", num(beta)), cfg));
  }
  for (double wh : {0.0, 1.0}) {
    Cfg cfg;
    cfg.k = 5;
    cfg.r.w_hard = wh;
    cfg.r.w_soft = 1.0 - wh;
    cfg.chunk = 4;
    cs.push_back(topk_case(cat("ce_w", num(wh)), cfg));
  }
  for (Out what : {Out::PerRow, Out::Hard, Out::Soft, Out::Lse}) {
    Cfg cfg;
    cfg.k = 6;
    cfg.r.w_hard = 0.25;
    cfg.what = what;
    cs.push_back(topk_case(cat("ce_out", std::to_string(int(what))), cfg));
  }
  Cfg wide;
  wide.n = 5;
  wide.h = 3;
  wide.v = 60000;
  wide.k = 64;
  wide.chunk = 2;
  wide.r.w_hard = 0.5;
  wide.dt = DType::BF16;
  LossCase c = topk_case("ce_wide", wide);
  c.fd_samples = -1;                                        // 180k weight entries
  c.backend_grad_tol = std::max(c.backend_grad_tol, 2e-6);  // dhidden's long sums (see fce_gpt2)
  cs.push_back(c);
}

// normalize_topk, w_hard = 0: K dot products per row and K-sparse gradient updates. beta = 0 takes CUDA's
// one-pass kernel (logits, loss and dhidden as an online softmax-weighted sum of the weight rows), at T = 1
// and T = 2; beta = 0.3 the gather, the gathered row loss and the scatter. H = 16: the vectorized bf16
// gather.
void sparse(std::vector<LossCase>& cs) {
  for (double beta : {0.3, 0.0})
    for (DType dt : {DType::F32, DType::BF16})
      for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None})
        for (int64_t chunk : {int64_t(1), int64_t(3), int64_t(7)}) {
          Cfg cfg;
          cfg.r.normalize = true;
          cfg.r.beta = beta;
          cfg.r.t = red == Reduction::Sum ? 2.0 : 1.0;
          cfg.r.red = red;
          cfg.dt = dt;
          cfg.chunk = chunk;
          cfg.h = 16;
          cs.push_back(topk_case(cat("sparse_", beta == 0.0 ? "fkl_" : "", dtype_name(dt), "_", red_name(red),
                                     std::to_string(chunk)),
                                 cfg));
        }
  Cfg odd;  // H = 5: CUDA's unvectorized dhidden and dW kernels
  odd.r.normalize = true;
  odd.r.beta = 0.7;
  odd.h = 5;
  cs.push_back(topk_case("sparse_h5", odd));
  // H = 2056: CUDA's dW column tiles (2048 columns for 16-bit rows, 1024 for f32) and a partial last tile;
  // the one-pass kernel with 257 column groups.
  for (double beta : {0.5, 0.0})
    for (DType dt : {DType::F32, DType::BF16}) {
      Cfg wide;
      wide.r.normalize = true;
      wide.r.beta = beta;
      wide.dt = dt;
      wide.h = 2056;
      LossCase c = topk_case(cat("sparse_wide_", beta == 0.0 ? "fkl_" : "", dtype_name(dt)), wide);
      c.fd_samples = 256;  // of 36,000 entries: differencing them all took 10 s
      cs.push_back(c);
    }
}

// K = 1 and K = V, padding given by −inf logprobs and by the mask, whose ids are garbage (out of range): the
// sparse path must never look them up.
void padding(std::vector<LossCase>& cs) {
  for (bool normalize : {false, true}) {
    for (int64_t k : {int64_t(1), int64_t(11)}) {
      Cfg cfg;
      cfg.k = k;
      cfg.r.normalize = normalize;
      cfg.r.t = 2;
      cs.push_back(topk_case(cat("k", std::to_string(k), normalize ? "_norm" : ""), cfg));
    }
    Cfg cfg;
    cfg.n = 4;
    cfg.k = 3;
    cfg.r.normalize = normalize;
    cfg.r.beta = 0.5;
    // Row 0: slot 1 padded by −inf; row 1: fully masked (no divergence); row 2: id 99 and −5 on padding.
    for (bool unit : {false, true}) {
      LossCase c = topk_case(cat("padding", normalize ? "_norm" : "", unit ? "_unit" : ""), cfg);
      c.inputs[3].values = {0, 5, 2, 3, 3, 1, 99, 7, -5, 10, 9, 8};
      c.inputs[4].values = {-1.0, kNegInf, -0.7, -2, -1, -3, -0.5, -1.5, -2, -0.1, -2.5, -3};
      c.inputs[5].values = {1, 1, 1, 0, 0, 0, 0, 1, 0, 1, 1, 1};
      c.inputs[6].values = {3, -1, 4, 10};
      c.unit_seed = unit;
      cs.push_back(c);
    }
  }
}

// Top-K forward KL at T = 1 with a hard part over the full vocabulary, bf16 operands, rows of 16 bytes, no
// bias: CUDA's softmax-epilogue path, which folds the slots and the label into the bf16 exp(z − shift) block.
Cfg epilogue_cfg(int64_t n, int64_t h, int64_t v, int64_t k, int64_t chunk) {
  Cfg cfg;
  cfg.dt = DType::BF16;
  cfg.bias = false;
  cfg.n = n;
  cfg.h = h;
  cfg.v = v;
  cfg.k = k;
  cfg.chunk = chunk;
  cfg.r.w_hard = 0.5;
  cfg.hidden_range = 1;
  return cfg;
}

void epilogue(std::vector<LossCase>& cs) {
  // With and without labels (no labels: the shift is the largest z at a valid slot) and a mask.
  for (bool labels : {true, false})
    for (bool mask : {true, false})
      for (Reduction red : {Reduction::Mean, Reduction::None}) {
        Cfg cfg = epilogue_cfg(9, 8, 300, 6, 4);
        cfg.labels = labels;
        cfg.mask = mask;
        cfg.r.red = red;
        if (!labels) cfg.r.w_hard = 0.0;  // a hard part needs labels
        cs.push_back(topk_case(cat("epilogue_", labels ? "l" : "", mask ? "m" : "", red_name(red)), cfg));
      }
  for (Out what : {Out::Hard, Out::Soft, Out::Lse, Out::PerRow}) {
    Cfg cfg = epilogue_cfg(9, 8, 300, 6, 4);
    cfg.what = what;
    cs.push_back(topk_case(cat("epilogue_out", std::to_string(int(what))), cfg));
  }
  {  // Ids and labels from [0, 5): duplicate ids in a row, and the label among them.
    Cfg cfg = epilogue_cfg(9, 8, 300, 6, 4);
    cfg.r.w_soft = 0.75;
    LossCase c = topk_case("epilogue_dup", cfg);
    c.inputs[3] = LossInput({cfg.n, cfg.k}, DType::I32, false, 0, 5);
    c.inputs[6] = LossInput({cfg.n}, DType::I32, false, -1, 5);
    cs.push_back(c);
  }
  {  // K = 64 over GPT-2's vocabulary, 3 chunks (the last short).
    LossCase c = topk_case("epilogue_gpt2", epilogue_cfg(300, 64, 50257, 64, 128));
    c.fd_samples = -1;
    cs.push_back(c);
  }
  // 16-bit chunk logits with labels: CUDA takes z at the slots from the bf16 exp block, |error| ≤ 2^-8 (the
  // row pass reads them from bf16 logits, |error| ≤ 2^-9·|z|): the losses to 1e-6 nmse there, the gradients
  // as before. The CPU keeps f32 logits: its losses exact as ever (its gradient GEMMs read the logits
  // gradient rounded to bf16, which no finite difference looks at here: fd_samples -1).
  for (bool big : {false, true})
    for (Out what : {Out::PerRow, Out::Loss}) {
      Cfg cfg = big ? epilogue_cfg(300, 64, 50257, 64, 128) : epilogue_cfg(9, 8, 300, 6, 4);
      cfg.logits = DType::BF16;
      cfg.what = what;
      LossCase c = topk_case(cat("epilogue_low", what == Out::Loss ? "g" : "", big ? "_gpt2" : ""), cfg);
      c.backend_tol = 1e-6;
      c.fd_samples = -1;
      cs.push_back(c);
    }
}

}  // namespace

std::vector<LossCase> fused_topk_cases() {
  std::vector<LossCase> cs;
  grids(cs);
  as_ce_rows(cs);
  sparse(cs);
  padding(cs);
  epilogue(cs);
  return cs;
}

}  // namespace retort::test
