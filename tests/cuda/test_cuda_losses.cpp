// The loss backend's ops on CUDA: cross_entropy_loss, entropy and selective_log_softmax (its fused backward
// too) here, the distillation losses in test_cuda_distill.cpp. Every case runs on the CPU and on CUDA from
// the same inputs (cuda_loss_check.h): CUDA against the CPU (kCpuTol = 1e-9, every dtype: see there), against
// the float64 references of tests/ops/test_losses_ref.h (forward 1e-10, and gradients against central
// differences 1e-8, the CPU loss tests' tolerances), with looser numbers only where stated beside the case.
// Bad labels and ids raise retort::Error at the next synchronize. Without a usable device every test skips
// with the reason.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <tuple>

#include "cuda_loss_check.h"
#include "logits_grad_cases.h"

namespace retort::test {
namespace {

class CudaLosses : public CudaTest {};

constexpr double kInf = std::numeric_limits<double>::infinity();

// ---- cross-entropy ------------------------------------------------------------------------------------

struct CeCfg {
  CeRef r;
  int64_t n = 6, v = 11;
  DType dt = DType::F32, label_dt = DType::I32;
  double lo = -3, hi = 3;
  Out what = Out::Loss;
  bool transposed = false;  // logits read through a transposed view
};

// Logits [n, v] and labels in [-1, v) with ignore_index -1, so some rows are ignored.
LossCase ce_case(const std::string& name, CeCfg cfg) {
  cfg.r.ignore = -1;
  LossCase c;
  c.name = name;
  const Shape xs = cfg.transposed ? Shape{cfg.v, cfg.n} : Shape{cfg.n, cfg.v};
  c.inputs = {LossInput(xs, cfg.dt, true, cfg.lo, cfg.hi),
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
    return pick(cross_entropy_loss(ctx, cfg.transposed ? transpose(ctx, in[0]) : in[0], in[1], o), cfg.what);
  };
  c.reference = [cfg](const std::vector<Ref>& in) {
    return ce_ref(cfg.transposed ? mat_t(in[0]) : mat(in[0]), ints(in[1]), cfg.r, cfg.what);
  };
  c.check_grad = cfg.what == Out::Loss;
  return c;
}

TEST_F(CudaLosses, CrossEntropyOptionsAndOutputs) {
  for (double eps : {0.0, 0.1})
    for (double zl : {0.0, 0.01})
      for (double cap : {0.0, 2.5})
        for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
          CeCfg cfg;
          cfg.r = {-1, eps, zl, cap, red};
          EXPECT_TRUE(check_cuda(ce_case("cuda_ce_e" + std::to_string(int(eps * 10)) + "_z" +
                                             std::to_string(int(zl * 100)) + "_c" + std::to_string(int(cap)) +
                                             red_name(red),
                                         cfg)));
        }
  for (Reduction red : {Reduction::Mean, Reduction::None})
    for (Out what : {Out::PerRow, Out::Lse}) {  // the lse of ignored rows too
      CeCfg cfg;
      cfg.r.eps = 0.1;
      cfg.r.cap = 2;
      cfg.r.red = red;
      cfg.what = what;
      cfg.label_dt = DType::I64;
      EXPECT_TRUE(check_cuda(ce_case("cuda_ce_out" + std::to_string(int(what)) + red_name(red), cfg)));
    }
}

TEST_F(CudaLosses, CrossEntropyDtypesLayoutsAndSizes) {
  for (DType dt : {DType::F32, DType::BF16, DType::F16})
    for (bool transposed : {false, true}) {
      CeCfg cfg;
      cfg.r.eps = 0.1;
      cfg.r.z_loss = 0.01;
      cfg.dt = dt;
      cfg.transposed = transposed;
      EXPECT_TRUE(
          check_cuda(ce_case(std::string("cuda_ce_") + dtype_name(dt) + (transposed ? "_t" : ""), cfg)));
    }
  for (int64_t v = 1; v <= 7; ++v) {
    CeCfg cfg;
    cfg.v = v;
    cfg.r.eps = 0.2;
    EXPECT_TRUE(check_cuda(ce_case("cuda_ce_v" + std::to_string(v), cfg)));
  }
  for (DType dt : {DType::F32, DType::BF16}) {  // V = 1000 takes the 8-wide (and on Hopper the cluster) path
    CeCfg cfg;
    cfg.n = 3;
    cfg.v = 1000;
    cfg.dt = dt;
    cfg.r.z_loss = 1e-3;
    EXPECT_TRUE(check_cuda(ce_case(std::string("cuda_ce_v1000_") + dtype_name(dt), cfg)));
  }
  // Contiguous rows of odd length: each row starts at a different 16-byte misalignment, so the 8-wide path
  // starts with a scalar head of 0-7 values (bf16) or 0-3 (f32), and the gradient's rows line up with them.
  for (DType dt : {DType::BF16, DType::F32}) {
    CeCfg cfg;
    cfg.n = 64;
    cfg.v = dt == DType::BF16 ? 1001 : 1003;
    cfg.dt = dt;
    cfg.r.eps = 0.1;
    cfg.r.z_loss = 1e-3;
    EXPECT_TRUE(check_cuda(ce_case(std::string("cuda_ce_odd_rows_") + dtype_name(dt), cfg),
                           {kCpuTol, kCpuTol, false}));
  }
  // Many rows per CTA (grid-stride, the cluster path's row pipeline) and rows split over a cluster of CTAs:
  // too big for central differences.
  for (auto [n, v] : {std::pair<int64_t, int64_t>{300, 4096}, {6, 50000}}) {
    CeCfg cfg;
    cfg.n = n;
    cfg.v = v;
    cfg.r.eps = 0.1;
    EXPECT_TRUE(check_cuda(ce_case("cuda_ce_big" + std::to_string(v), cfg), {kCpuTol, kCpuTol, false}));
  }
  // Softcap on the cluster path (whole aligned rows: one CTA per row at V = 1,000, a cluster of CTAs at
  // 50,000): the segment maximum is taken before the cap and softcapped values are clamped to its image.
  for (auto [n, v, dt] :
       {std::tuple<int64_t, int64_t, DType>{64, 1000, DType::F32}, {6, 50000, DType::BF16}}) {
    CeCfg cfg;
    cfg.n = n;
    cfg.v = v;
    cfg.dt = dt;
    cfg.lo = -40;
    cfg.hi = 40;
    cfg.r.cap = 30;
    cfg.r.eps = 0.1;
    EXPECT_TRUE(check_cuda(ce_case("cuda_ce_cap_v" + std::to_string(v), cfg), {kCpuTol, kCpuTol, false}));
  }
}

// The cluster kernel's shared memory limit is a property of the kernel: rows of 50,304 bf16 values take
// 2 × 100.6 KB on Hopper, rows of 128,256 (three segments: two single-buffered CTAs per SM) 85.5 KB. A
// launch with a size used before must still be allowed after a launch with a smaller one (once refused with
// "invalid argument", H100, session 16). Then f32 rows of 60,000 in three segments.
TEST_F(CudaLosses, CrossEntropyVocabulariesAlternate) {
  int i = 0;
  for (int64_t v : {50304, 128256, 50304, 128256, -60000}) {
    CeCfg cfg;
    cfg.n = 3;
    cfg.v = std::abs(v);
    cfg.dt = v < 0 ? DType::F32 : DType::BF16;
    cfg.r.eps = 0.1;
    EXPECT_TRUE(check_cuda(ce_case("cuda_ce_alt" + std::to_string(i++) + "_" + std::to_string(cfg.v), cfg),
                           {kCpuTol, kCpuTol, false}));
  }
}

TEST_F(CudaLosses, CrossEntropyEdgeCases) {
  for (int valid_row : {-1, 2}) {  // all rows ignored: loss 0 and a zero gradient, not NaN
    CeCfg cfg;
    cfg.n = 5;
    cfg.r.eps = 0.1;
    cfg.r.z_loss = 0.01;
    LossCase c = ce_case(valid_row < 0 ? "cuda_ce_all_ignored" : "cuda_ce_one_valid", cfg);
    Vec labels(5, -1.0);
    if (valid_row >= 0) labels[size_t(valid_row)] = 3;
    c.inputs[1].values = labels;
    c.unit_seed = true;
    EXPECT_TRUE(check_cuda(c));
  }
  for (Reduction red : {Reduction::Mean, Reduction::Sum}) {  // the single pass: backward on the loss itself
    CeCfg cfg;
    cfg.r = {-1, 0.1, 0.01, 5, red};
    LossCase c = ce_case(std::string("cuda_ce_single_") + red_name(red), cfg);
    c.unit_seed = true;
    EXPECT_TRUE(check_cuda(c));
  }
  for (double cap : {0.0, 5.0}) {
    CeCfg cfg;
    cfg.n = 4;
    cfg.v = 9;
    cfg.r.cap = cap;
    cfg.lo = -1e4;
    cfg.hi = 1e4;
    LossCase c = ce_case("cuda_ce_huge" + std::to_string(int(cap)), cfg);
    c.fwd_tol = 1e-9;
    // The device's online pass subtracts the rounded max·log2(e) (ulp ~1e-3 near 1.4e4), so with |z| ~ 1e4
    // the softmax terms carry ~1e-3 relative error: a gradient nmse of ~1e-6, where the CPU's is exact.
    c.grad_tol = 1e-5;
    EXPECT_TRUE(check_cuda(c, {kCpuTol, 1e-5, true}));
  }
}

// ---- entropy ------------------------------------------------------------------------------------------

LossCase entropy_case(const std::string& name, double t, Reduction red, int64_t n, int64_t v,
                      DType dt = DType::F32, double lo = -3, double hi = 3) {
  LossCase c;
  c.name = name;
  c.inputs = {LossInput({n, v}, dt, true, lo, hi)};
  c.build = [t, red](Context& ctx, const std::vector<Tensor*>& in) {
    return entropy(ctx, in[0], float(t), red);
  };
  c.reference = [t, red](const std::vector<Ref>& in) { return entropy_ref(mat(in[0]), t, red); };
  return c;
}

TEST_F(CudaLosses, Entropy) {
  for (double t : {1.0, 2.0, 0.5})
    for (Reduction red : {Reduction::None, Reduction::Mean, Reduction::Sum})
      EXPECT_TRUE(check_cuda(
          entropy_case("cuda_entropy_t" + std::to_string(int(t * 10)) + red_name(red), t, red, 5, 9)));
  for (int64_t v = 1; v <= 7; ++v)
    EXPECT_TRUE(check_cuda(entropy_case("cuda_entropy_v" + std::to_string(v), 1.5, Reduction::None, 3, v)));
  EXPECT_TRUE(
      check_cuda(entropy_case("cuda_entropy_v1000", 1.0, Reduction::Mean, 2, 1000, DType::F32, -6, 6)));
  for (DType dt : {DType::BF16, DType::F16})
    EXPECT_TRUE(check_cuda(
        entropy_case(std::string("cuda_entropy_") + dtype_name(dt), 2, Reduction::None, 4, 16, dt)));
  // The big rows take the Hopper cluster path, whose exponentials are MUFU.EX2 (about 2 ulp): over 50,000
  // terms at T = 1.3 the gradient's nmse against the CPU's libm exp lands near 2e-8 (measured on H100), so
  // this case allows 1e-7 (1e-4 relative rms) instead of the 1e-9 the small cases keep.
  EXPECT_TRUE(check_cuda(entropy_case("cuda_entropy_big", 1.3, Reduction::Mean, 6, 50000, DType::BF16, -8, 8),
                         {1e-7, 1e-7, false}));
  // Rows of three segments: two single-buffered CTAs per SM on Hopper.
  EXPECT_TRUE(
      check_cuda(entropy_case("cuda_entropy_big3", 1.3, Reduction::Mean, 6, 128256, DType::BF16, -8, 8),
                 {1e-7, 1e-7, false}));

  // Logits near 1e4 with a spread-out distribution (the entropy must not cancel against the lse), and ±1e4
  // at T = 1.5 where the distribution is one-hot: 0 (or tiny), never NaN.
  // T = 2 scales exactly; at other temperatures the device's z / T, taken before the max is subtracted,
  // rounds at ulp(1e4 / T) and costs ~1e-4 of every softmax term.
  LossCase near =
      entropy_case("cuda_entropy_near1e4", 2.0, Reduction::None, 4, 9, DType::F32, 1e4 - 3, 1e4 + 3);
  near.fd_step = 1e-7;
  near.grad_tol = 1e-6;  // central differences of a float64 reference at 1e4 with a 1e-3 step
  EXPECT_TRUE(check_cuda(near));
  LossCase onehot = entropy_case("cuda_entropy_onehot", 1.5, Reduction::Mean, 4, 9, DType::F32, -1e4, 1e4);
  onehot.unit_seed = true;
  onehot.reference = [](const std::vector<Ref>& in) {
    Vec v = entropy_ref(mat(in[0]), 1.5, Reduction::Mean);
    for (double& x : v) x = std::abs(x) < 1e-30 ? 0.0 : x;  // below f32's range: compare absolutely with 0
    return v;
  };
  EXPECT_TRUE(check_cuda(onehot));

  // −inf logits (a masked vocabulary) add nothing: finite entropy and gradient (no central differences at
  // −inf).
  LossCase masked = entropy_case("cuda_entropy_minus_inf", 1.0, Reduction::None, 2, 6);
  masked.inputs[0].values = {0.5, -kInf, 1.0, -kInf, -0.3, 2.0, -kInf, 0.1, 0.7, -1.0, -kInf, -kInf};
  EXPECT_TRUE(check_cuda(masked, {kCpuTol, kCpuTol, false}));

  LossCase t;
  t.name = "cuda_entropy_transposed";
  t.inputs = {LossInput({7, 4}, DType::F32, true, -3, 3)};
  t.build = [](Context& ctx, const std::vector<Tensor*>& in) {
    return entropy(ctx, transpose(ctx, in[0]), 1.5f);
  };
  t.reference = [](const std::vector<Ref>& in) { return entropy_ref(mat_t(in[0]), 1.5, Reduction::None); };
  EXPECT_TRUE(check_cuda(t));
  LossCase single = entropy_case("cuda_entropy_single", 2, Reduction::Mean, 4, 9);
  single.unit_seed = true;
  EXPECT_TRUE(check_cuda(single));
}

// ---- selective log-softmax ----------------------------------------------------------------------------

LossCase selective_case(const std::string& name, int64_t n, int64_t v, int64_t k, DType dt = DType::F32,
                        double lo = -3, double hi = 3) {
  LossCase c;
  c.name = name;
  c.inputs = {LossInput({n, v}, dt, true, lo, hi), LossInput({n, k}, DType::I32, false, 0, double(v))};
  c.build = [](Context& ctx, const std::vector<Tensor*>& in) {
    return selective_log_softmax(ctx, in[0], in[1]);
  };
  c.reference = [k](const std::vector<Ref>& in) { return selective_ref(mat(in[0]), ints(in[1]), k); };
  return c;
}

TEST_F(CudaLosses, SelectiveLogSoftmax) {
  EXPECT_TRUE(check_cuda(selective_case("cuda_sel_basic", 5, 9, 3)));
  EXPECT_TRUE(check_cuda(selective_case("cuda_sel_k1", 4, 7, 1)));
  EXPECT_TRUE(check_cuda(selective_case("cuda_sel_k_gt_v", 3, 4, 9)));  // repeated ids: the fixup sums them
  for (int64_t v = 1; v <= 7; ++v)
    EXPECT_TRUE(check_cuda(selective_case("cuda_sel_v" + std::to_string(v), 3, v, 2)));
  EXPECT_TRUE(check_cuda(selective_case("cuda_sel_v1000", 2, 1000, 5)));
  EXPECT_TRUE(check_cuda(selective_case("cuda_sel_big", 40, 8192, 300), {kCpuTol, kCpuTol, false}));
  for (DType dt : {DType::BF16, DType::F16})
    EXPECT_TRUE(check_cuda(selective_case(std::string("cuda_sel_") + dtype_name(dt), 4, 16, 3, dt)));
  LossCase huge = selective_case("cuda_sel_huge", 3, 8, 4, DType::F32, -1e4, 1e4);
  huge.fwd_tol = 1e-9;
  huge.grad_tol = 1e-5;  // the backward's exp(z − lse) with |z| ~ 1e4 carries lse's f32 rounding (CPU too)
  EXPECT_TRUE(check_cuda(huge, {kCpuTol, 1e-5, true}));

  // Logits through a transposed view, ids as a strided window of a transposed i64 tensor.
  LossCase s;
  s.name = "cuda_sel_strided";
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
  EXPECT_TRUE(check_cuda(s));

  // As part of a loss (a sum of its log-probabilities, backward on it directly).
  LossCase l = selective_case("cuda_sel_in_loss", 4, 10, 3);
  l.build = [](Context& ctx, const std::vector<Tensor*>& in) {
    return sum(ctx, selective_log_softmax(ctx, in[0], in[1]));
  };
  l.reference = [](const std::vector<Ref>& in) {
    double s = 0;
    for (double x : selective_ref(mat(in[0]), ints(in[1]), 3)) s += x;
    return Vec{s};
  };
  l.unit_seed = true;
  EXPECT_TRUE(check_cuda(l));
}

// ---- bad labels and ids -------------------------------------------------------------------------------

bool mentions(const std::string& msg, const std::string& part) {
  return msg.find(part) != std::string::npos;
}

// Computes g on the device and expects the next synchronize to throw naming every part, once; the backend
// then works again.
void expect_device_error(Graph& g, const std::vector<std::string>& parts) {
  Backend& be = cuda_backend();
  g.compute();
  const std::string msg = error_of([&] { be.synchronize(); });
  for (const std::string& p : parts) EXPECT_TRUE(mentions(msg, p)) << "'" << p << "' not in: " << msg;
  EXPECT_NO_THROW(be.synchronize());  // reported once, then cleared
}

TEST_F(CudaLosses, BadLabelsAndIdsRaiseErrors) {
  Backend& be = cuda_backend();
  Context ctx(be);
  Tensor* x = ctx.input(DType::F32, {4, 6}, "logits");
  set_data(x, std::vector<float>(24, 0.25f));
  Tensor* y = ctx.input(DType::I32, {4}, "labels");
  Tensor* ids = ctx.input(DType::I32, {4, 3}, "ids");
  Tensor* lp = ctx.input(DType::F32, {4, 3}, "lp");
  set_data(lp, std::vector<float>(12, -1.0f));

  {  // cross-entropy
    Tensor* loss = cross_entropy_loss(ctx, x, y).loss;
    loss->flags |= kOutput;
    Graph g(ctx);
    g.forward(loss);
    set_data_int(y, {0, 9, 5, 3});
    expect_device_error(g, {"cross_entropy_loss", "label 9", "[0, 6)"});
    set_data_int(y, {0, -100, 5, 3});
    g.compute();
    EXPECT_NEAR(get_data(loss)[0], std::log(6.0), 1e-6);  // equal logits: log V for each valid row
  }
  {  // top-K: an id out of range in a valid slot throws, the same id in a masked slot is padding
    set_data_int(y, {0, 1, 2, 3});
    set_data_int(ids, {0, 1, 2, 3, 4, 5, 0, 6, 1, 2, 2, 2});
    Tensor* mask = ctx.input(DType::I32, {4, 3}, "mask");
    set_data_int(mask, {1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1});
    Tensor* bad = topk_kd(ctx, x, ids, lp, nullptr, y).loss;
    bad->flags |= kOutput;
    Graph g(ctx);
    g.forward(bad);
    expect_device_error(g, {"topk_kd", "id 6", "[0, 6)"});
    Tensor* ok = topk_kd(ctx, x, ids, lp, mask, y).loss;
    ok->flags |= kOutput;
    Graph g2(ctx);
    g2.forward(ok);
    g2.compute();
    EXPECT_NO_THROW(be.synchronize());
    EXPECT_TRUE(std::isfinite(get_data(ok)[0]));
    set_data_int(y, {0, 1, 2, 7});
    expect_device_error(g2, {"topk_kd", "label 7", "[0, 6)"});
  }
  {  // distill
    Tensor* teacher = ctx.input(DType::F32, {4, 6}, "teacher");
    set_data(teacher, std::vector<float>(24, 0.5f));
    DistillOptions o;
    o.w_hard = 0.5f;
    Tensor* loss = distill(ctx, x, teacher, y, o).loss;
    loss->flags |= kOutput;
    Graph g(ctx);
    g.forward(loss);
    set_data_int(y, {-7, 1, 2, 3});
    expect_device_error(g, {"distill", "label -7", "[0, 6)"});
  }
  {  // selective log-softmax
    set_data_int(ids, {0, 1, 2, 3, 4, 5, 0, 1, 2, -2, 2, 2});
    Tensor* out = selective_log_softmax(ctx, x, ids);
    out->flags |= kOutput;
    Graph g(ctx);
    g.forward(out);
    expect_device_error(g, {"selective_log_softmax", "id -2", "[0, 6)"});
  }
}

TEST_F(CudaLosses, NonFiniteTeacherLogprobsRaiseErrors) {
  // A NaN or +inf teacher logprob in a valid slot would drop out of the loss and show only in the gradient;
  // the device reports it as the CPU does (tests/ops/test_fused_linear_topk.cpp), on each kernel that reads
  // the slots: the general row kernel (forward; the gradient at T = 2), the rows run as cross-entropy rows
  // (the gradient with labels at T = 1) and the gathered form. The same value in a masked slot is padding.
  Backend& be = cuda_backend();
  Context ctx(be);
  Tensor* x = ctx.input(DType::F32, {4, 6}, "logits");
  set_data(x, std::vector<float>(24, 0.25f));
  Tensor* xg = ctx.input(DType::F32, {4, 3}, "gathered");
  set_data(xg, std::vector<float>(12, 0.5f));
  Tensor* y = ctx.input(DType::I32, {4}, "labels");
  set_data_int(y, {0, 1, 2, 3});
  Tensor* ids = ctx.input(DType::I32, {4, 3}, "ids");
  set_data_int(ids, {0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5});
  Tensor* mask = ctx.input(DType::I32, {4, 3}, "mask");
  set_data_int(mask, {1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1});
  for (DType lp_dt : {DType::F32, DType::BF16}) {
    Tensor* lp = ctx.input(lp_dt, {4, 3}, "lp");
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
      SCOPED_TRACE(std::string(dtype_name(lp_dt)) + " " + std::to_string(bad));
      std::vector<float> lpv(12, -1.5f);
      lpv[7] = bad;  // row 2, slot 1
      set_data(lp, lpv);
      TopKDistillOptions t2;
      t2.temperature = 2.0f;
      struct Way {
        const char* op;
        Tensor* root;
      };
      const std::vector<Way> ways = {
          {"topk_kd", topk_kd(ctx, x, ids, lp, nullptr, y).loss},
          {"topk_kd", logits_grad(ctx, topk_kd(ctx, x, ids, lp, nullptr, y).loss)},
          {"topk_kd", logits_grad(ctx, topk_kd(ctx, x, ids, lp, nullptr, y, t2).loss)},
          {"topk_kl_gathered", topk_kl_gathered(ctx, xg, lp, nullptr).loss},
          {"topk_kl_gathered", logits_grad(ctx, topk_kl_gathered(ctx, xg, lp, nullptr).loss)},
      };
      for (const Way& w : ways) {
        SCOPED_TRACE(w.op);
        w.root->flags |= kOutput;
        Graph g(ctx);
        g.forward(w.root);
        expect_device_error(g, {w.op, "teacher logprob", "row 2 slot 1"});
      }
      Tensor* masked = topk_kd(ctx, x, ids, lp, mask, y).loss;
      masked->flags |= kOutput;
      Graph gm(ctx);
      gm.forward(logits_grad(ctx, masked));
      gm.compute();
      EXPECT_NO_THROW(be.synchronize());
      EXPECT_TRUE(std::isfinite(get_data(masked)[0]));
    }
  }
}

// logits_grad on the device: the same case list as the CPU's (tests/ops/logits_grad_cases.h), and the
// device's f32 gradient against the CPU's.
TEST_F(CudaLosses, LogitsGradEveryLossAndDtype) {
  check_logits_grad_cases(cuda_backend());
  for (const LogitsGradCase& c : logits_grad_cases()) {
    SCOPED_TRACE(c.name);
    const Vec cpu = logits_grad_on(default_cpu_backend(), c, DType::BF16, DType::F32, false, false);
    const Vec gpu = logits_grad_on(cuda_backend(), c, DType::BF16, DType::F32, false, false);
    EXPECT_LE(nmse(gpu, cpu), kCpuTol);
  }
}

}  // namespace
}  // namespace retort::test
