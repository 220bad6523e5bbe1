// The case list of fused_linear_cross_entropy (tests/ops/loss_cases.h): the float64 lm-head
// (z = hidden · Wᵀ + bias) feeding the cross-entropy reference.
#include <algorithm>

#include "loss_cases.h"

namespace retort::test {

FusedLinearOptions fused_chunks(int64_t rows) {
  FusedLinearOptions f;
  f.chunk_rows = rows;
  f.logits_dtype = DType::F32;
  return f;
}

void loosen_for_16bit_heads(DType dt, LossCase& c) {
  if (dt == DType::F32) return;
  c.backend_grad_tol = std::max(c.backend_grad_tol, kHead16GradTol);
}

namespace {

LossInput hidden_in(int64_t n, int64_t h, DType dt = DType::F32, double lo = -1, double hi = 1) {
  return LossInput(Shape{n, h}, dt, true, lo, hi);
}
LossInput weight_in(int64_t v, int64_t h, DType dt = DType::F32, double lo = -1, double hi = 1) {
  return LossInput(Shape{v, h}, dt, true, lo, hi);
}
LossInput bias_in(int64_t v, DType dt = DType::F32) {
  return LossInput(Shape{v}, dt, true, -0.5, 0.5);
}

struct CeCfg {
  CeRef r;
  int64_t n = 7, h = 5, v = 11, chunk = 3;
  DType dt = DType::F32;
  bool bias = true;
  Out what = Out::Loss;
  double lo = -1, hi = 1;  // of hidden and weight
};

// hidden [n, h], weight [v, h], bias [v] (a constant when not `bias`: passed as null), labels in [-1, v)
// with ignore_index -1, so some rows are ignored.
LossCase ce_case(const std::string& name, CeCfg cfg) {
  cfg.r.ignore = -1;
  LossCase c;
  c.name = cat("fce_", name);
  c.inputs = {hidden_in(cfg.n, cfg.h, cfg.dt, cfg.lo, cfg.hi),
              weight_in(cfg.v, cfg.h, cfg.dt, cfg.lo, cfg.hi), bias_in(cfg.v, cfg.dt),
              LossInput(Shape{cfg.n}, DType::I32, false, -1, double(cfg.v))};
  c.inputs[2].param = cfg.bias;
  c.build = [cfg](Context& ctx, const std::vector<Tensor*>& in) {
    CrossEntropyOptions o;
    o.ignore_index = cfg.r.ignore;
    o.label_smoothing = float(cfg.r.eps);
    o.z_loss = float(cfg.r.z_loss);
    o.softcap = float(cfg.r.cap);
    o.reduction = cfg.r.red;
    o.return_per_row = cfg.what == Out::PerRow;
    o.return_lse = cfg.what == Out::Lse;
    return pick(fused_linear_cross_entropy(ctx, in[0], in[1], cfg.bias ? in[2] : nullptr, in[3], o,
                                           fused_chunks(cfg.chunk)),
                cfg.what);
  };
  c.reference = [cfg](const std::vector<Ref>& in) {
    return ce_ref(head_ref(in[0], in[1], cfg.bias ? &in[2] : nullptr), ints(in[3]), cfg.r, cfg.what);
  };
  c.check_grad = cfg.what == Out::Loss;
  loosen_for_16bit_heads(cfg.dt, c);
  return c;
}

CeCfg ce_cfg(double eps, double z_loss, double cap, Reduction red) {
  CeCfg cfg;
  cfg.r.eps = eps;
  cfg.r.z_loss = z_loss;
  cfg.r.cap = cap;
  cfg.r.red = red;
  return cfg;
}

void options(std::vector<LossCase>& cs) {
  // 7 rows in chunks of 3: the last chunk is short. The bias where there is no softcap.
  for (double eps : {0.0, 0.1})
    for (double zl : {0.0, 0.01})
      for (double cap : {0.0, 2.5})
        for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
          CeCfg cfg = ce_cfg(eps, zl, cap, red);
          cfg.bias = cap == 0.0;
          cs.push_back(ce_case(cat("e", std::to_string(int(eps * 10)), "_z", std::to_string(int(zl * 100)),
                                   "_c", std::to_string(int(cap * 10)), "_", red_name(red)),
                               cfg));
        }
  for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None})
    for (int64_t chunk : {int64_t(1), int64_t(7)}) {  // one row, all rows
      CeCfg cfg = ce_cfg(0.1, 0.01, 0, red);
      cfg.chunk = chunk;
      cs.push_back(ce_case(cat("chunk", std::to_string(chunk), "_", red_name(red)), cfg));
    }
  for (Reduction red : {Reduction::Mean, Reduction::None})
    for (Out what : {Out::PerRow, Out::Lse}) {
      CeCfg cfg = ce_cfg(0.2, 0, 4, red);
      cfg.n = 7;
      cfg.h = 4;
      cfg.v = 9;
      cfg.chunk = 2;
      cfg.what = what;
      cs.push_back(ce_case(cat(what == Out::PerRow ? "per_row_" : "lse_", red_name(red)), cfg));
    }
  // The single pass: the forward writes every gradient, nothing multiplies them afterwards.
  CeCfg cap = ce_cfg(0, 0, 2.5, Reduction::Mean);  // softcap without bias
  cap.bias = false;
  LossCase c = ce_case("single_cap", cap);
  c.unit_seed = c.single_pass = true;
  cs.push_back(c);
  CeCfg single = ce_cfg(0.1, 0, 0, Reduction::Mean);
  single.h = 4;
  single.v = 10;
  LossCase s = ce_case("single", single);
  s.unit_seed = s.single_pass = true;
  cs.push_back(s);
}

void dtypes_and_views(std::vector<LossCase>& cs) {
  for (DType dt : {DType::BF16, DType::F16})
    for (Reduction red : {Reduction::Mean, Reduction::None}) {
      CeCfg cfg = ce_cfg(0.1, 1e-3, 0, red);
      cfg.n = 6;
      cfg.h = 8;
      cfg.v = 13;
      cfg.chunk = 4;
      cfg.dt = dt;
      LossCase c = ce_case(cat(dtype_name(dt), "_", red_name(red)), cfg);
      c.fwd_tol = 1e-9;  // the reference sees the stored values; only f32 accumulation differs
      cs.push_back(c);
    }
  // bf16 hidden, f32 weight, f16 bias: the f32 gradient in place, CUDA's GEMMs on f32 copies of the odd
  // operand; weighted, and the single pass.
  for (bool unit : {false, true}) {
    LossCase c;
    c.name = unit ? "fce_mixed_single" : "fce_mixed";
    c.inputs = {hidden_in(5, 6, DType::BF16), weight_in(9, 6), bias_in(9, DType::F16),
                LossInput(Shape{5}, DType::I64, false, unit ? 0 : -1, 9)};
    c.build = [](Context& ctx, const std::vector<Tensor*>& in) {
      CrossEntropyOptions o;
      o.ignore_index = -1;
      return fused_linear_cross_entropy(ctx, in[0], in[1], in[2], in[3], o, fused_chunks(2)).loss;
    };
    c.reference = [](const std::vector<Ref>& in) {
      CeRef r;
      r.ignore = -1;
      return ce_ref(head_ref(in[0], in[1], &in[2]), ints(in[3]), r);
    };
    c.unit_seed = c.single_pass = unit;
    cs.push_back(c);
  }
  // hidden: a column window of a wider tensor; weight: the transpose of a stored [H, V] (column-major).
  LossCase v;
  v.name = "fce_views";
  v.inputs = {hidden_in(6, 9), LossInput(Shape{5, 11}, DType::F32, true),
              LossInput(Shape{6}, DType::I32, false, -1, 11)};
  v.build = [](Context& ctx, const std::vector<Tensor*>& in) {
    CrossEntropyOptions o;
    o.ignore_index = -1;
    o.label_smoothing = 0.1f;
    return fused_linear_cross_entropy(ctx, slice(ctx, in[0], 0, 3, 5), transpose(ctx, in[1]), nullptr, in[2],
                                      o, fused_chunks(4))
        .loss;
  };
  v.reference = [](const std::vector<Ref>& in) {
    CeRef r;
    r.ignore = -1;
    r.eps = 0.1;
    Ref h;
    h.ne[0] = 5;
    h.ne[1] = 6;
    for (int64_t i = 0; i < 6; ++i)
      for (int64_t j = 0; j < 5; ++j) h.v.push_back(in[0].at(j + 3, i));
    Ref w;  // [V, H] = the stored [H, V] transposed
    w.ne[0] = 5;
    w.ne[1] = 11;
    for (int64_t vv = 0; vv < 11; ++vv)
      for (int64_t k = 0; k < 5; ++k) w.v.push_back(in[1].at(vv, k));
    return ce_ref(head_ref(h, w, nullptr), ints(in[2]), r);
  };
  cs.push_back(v);
}

void sizes_and_edges(std::vector<LossCase>& cs) {
  // hidden and weight of ±100 over H = 1: logits of ±1e4. CUDA's online pass rounds max·log2(e) at ulp ~1e-3
  // there (see the row cross-entropy's huge cases), hence its looser gradient.
  for (Reduction red : {Reduction::Mean, Reduction::None}) {
    CeCfg cfg = ce_cfg(0.05, 0, 0, red);
    cfg.n = 4;
    cfg.h = 1;
    cfg.v = 9;
    cfg.bias = false;
    cfg.lo = -100;
    cfg.hi = 100;
    LossCase c = ce_case(cat("huge_", red_name(red)), cfg);
    c.fwd_tol = 1e-9;
    c.grad_tol = 1e-6;
    c.fd_step = 1e-7;
    c.backend_grad_tol = 1e-5;
    cs.push_back(c);
  }
  // V = 50,257 (not a multiple of 8 or 128: padded rows, unvectorized row kernels), 3 chunks, the last short.
  // Too big for central differences. dhidden sums 50,257 f32 products that nearly cancel (softmax − one-hot):
  // cuBLAS and the CPU GEMM add them in different orders, ~1e-4 of its size (H100: nmse 2.9e-7).
  for (DType dt : {DType::F32, DType::BF16}) {
    CeCfg cfg = ce_cfg(0, 0, 0, Reduction::Mean);
    cfg.n = 37;
    cfg.h = 16;
    cfg.v = 50257;
    cfg.chunk = 16;
    cfg.dt = dt;
    LossCase c = ce_case(cat("gpt2_", dtype_name(dt)), cfg);
    c.fd_samples = -1;
    c.backend_grad_tol = std::max(c.backend_grad_tol, 2e-6);
    cs.push_back(c);
  }
}

// CUDA's softmax-epilogue path (src/cuda/loss/softmax_chunk.h) takes bf16 hidden and W with 16-byte rows, no
// bias, no label smoothing or softcap; its logits gradient is exp(z − z_label) in bf16 scaled per row, so the
// 16-bit head tolerances hold. Elsewhere (the CPU, a device without it) the same cases take the row pass.
LossCase epilogue_case(const std::string& name, int64_t n, int64_t h, int64_t v, int64_t chunk, Reduction red,
                       double z_loss, Out what = Out::Loss, double hidden_range = 1) {
  CeCfg cfg = ce_cfg(0, z_loss, 0, red);
  cfg.n = n;
  cfg.h = h;
  cfg.v = v;
  cfg.chunk = chunk;
  cfg.dt = DType::BF16;
  cfg.bias = false;
  cfg.what = what;
  LossCase c = ce_case(cat("epilogue_", name), cfg);
  c.inputs[0] = hidden_in(n, h, DType::BF16, -hidden_range, hidden_range);
  c.inputs[1] = weight_in(v, h, DType::BF16);
  return c;
}

void epilogue(std::vector<LossCase>& cs) {
  // H = 8 (the least: rows of 16 bytes), V = 300 (pad columns 300-383 masked in the epilogue, a second
  // 256-column tile), ignored rows, z-loss; one row, odd and whole chunks; every reduction.
  for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None})
    for (int64_t chunk : {int64_t(1), int64_t(4), int64_t(9)})
      cs.push_back(epilogue_case(cat(red_name(red), std::to_string(chunk)), 9, 8, 300, chunk, red,
                                 red == Reduction::Sum ? 0.0 : 0.01));
  // GPT-2's vocabulary, 3 chunks (the last short), per-row losses and LSE; the single-pass gradient.
  for (Out what : {Out::Loss, Out::PerRow, Out::Lse}) {
    LossCase c = epilogue_case(cat("gpt2_", std::to_string(int(what))), 300, 64, 50257, 128, Reduction::Mean,
                               0.0, what);
    c.unit_seed = what == Out::Loss;
    c.fd_samples = -1;
    cs.push_back(c);
  }
  // Hidden values in ±20 and H = 16: logits with a spread of ~27, so many rows' losses pass 69 nats at the
  // label's shift (their sums leave [2^-100, 2^100]) and CUDA's exact per-row kernel recomputes them; no
  // central differences at logits this size.
  for (Reduction red : {Reduction::Mean, Reduction::None}) {
    LossCase c = epilogue_case(cat("far_", red_name(red)), 40, 16, 200, 24, red, 0.001, Out::Loss, 20.0);
    c.fd_samples = -1;
    cs.push_back(c);
  }
  // The same hidden and W feed two fused losses: the second backward adds into dhidden and dW (CUDA's
  // accumulate flags), on the epilogue path too.
  LossCase c;
  c.name = "fce_epilogue_shared";
  c.inputs = {hidden_in(10, 8, DType::BF16), weight_in(150, 8, DType::BF16),
              LossInput(Shape{10}, DType::I32, false, -1, 150.0),
              LossInput(Shape{10}, DType::I32, false, -1, 150.0)};
  c.build = [](Context& ctx, const std::vector<Tensor*>& in) {
    CrossEntropyOptions a;
    a.ignore_index = -1;
    CrossEntropyOptions b = a;
    b.reduction = Reduction::Sum;
    b.z_loss = 0.01f;
    Tensor* la = fused_linear_cross_entropy(ctx, in[0], in[1], nullptr, in[2], a, fused_chunks(4)).loss;
    Tensor* lb = fused_linear_cross_entropy(ctx, in[0], in[1], nullptr, in[3], b, fused_chunks(3)).loss;
    return add(ctx, la, lb);
  };
  c.reference = [](const std::vector<Ref>& in) {
    const Mat z = head_ref(in[0], in[1], nullptr);
    CeRef a;
    a.ignore = -1;
    CeRef b = a;
    b.red = Reduction::Sum;
    b.z_loss = 0.01;
    Vec x = ce_ref(z, ints(in[2]), a), y = ce_ref(z, ints(in[3]), b);
    x[0] += y[0];
    return x;
  };
  loosen_for_16bit_heads(DType::BF16, c);
  cs.push_back(c);
}

}  // namespace

std::vector<LossCase> fused_ce_cases() {
  std::vector<LossCase> cs;
  options(cs);
  dtypes_and_views(cs);
  sizes_and_edges(cs);
  epilogue(cs);
  return cs;
}

}  // namespace retort::test
