// logits_grad and selective_log_softmax_grad (losses.h): one case list, run on every backend. Each case
// computes a row loss's logits gradient through the loss's own pass in a given dtype, into a new tensor or
// over the logits in place, and the same gradient through a graph backward in f32 (itself checked against
// float64 references and central differences by the loss tests). Checked: the f32 result equals the
// backward's bit for bit on the same backend; a 16-bit result is the backward's rounded to that dtype, within
// one rounding (the kernels compute in f32 and round once on store); in place equals out of place bit for
// bit.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "harness.h"

namespace retort::test {

struct LogitsGradCase {
  std::string name;
  int64_t n = 6, v = 37;
  // The loss of logits x (side inputs made in ctx from the case's own generator, the same on every backend).
  std::function<Tensor*(Context&, Tensor* x)> loss;
  bool selective = false;  // selective_log_softmax_grad with a random grad_output instead
};

inline Tensor* side_ints(Context& ctx, Shape shape, int64_t lo, int64_t hi, const std::string& key) {
  reseed(key);
  Tensor* t = ctx.input(DType::I32, shape, key);
  set_data_int(t, random_ints(t->nelements(), lo, hi));
  return t;
}
inline Tensor* side_floats(Context& ctx, Shape shape, double lo, double hi, const std::string& key) {
  reseed(key);
  Tensor* t = ctx.input(DType::F32, shape, key);
  Vec v = random_vec(t->nelements(), lo, hi);
  set_data(t, std::vector<float>(v.begin(), v.end()));
  return t;
}

inline std::vector<LogitsGradCase> logits_grad_cases() {
  std::vector<LogitsGradCase> cs;
  cs.push_back({"ce", 6, 37, [](Context& ctx, Tensor* x) {
                  CrossEntropyOptions o;
                  o.label_smoothing = 0.1f;
                  o.z_loss = 1e-3f;
                  Tensor* y = side_ints(ctx, {6}, -1, 37, "lg_ce_y");  // -1: ignored rows
                  o.ignore_index = -1;
                  return cross_entropy_loss(ctx, x, y, o).loss;
                }});
  cs.push_back({"ce_sum_wide", 3, 4099, [](Context& ctx, Tensor* x) {
                  CrossEntropyOptions o;
                  o.reduction = Reduction::Sum;
                  return cross_entropy_loss(ctx, x, side_ints(ctx, {3}, 0, 4099, "lg_cew_y"), o).loss;
                }});
  cs.push_back({"topk", 5, 40, [](Context& ctx, Tensor* x) {
                  TopKDistillOptions o;
                  o.w_hard = 0.5f;
                  o.beta = 0.3f;
                  Tensor* ids = side_ints(ctx, {5, 4}, 0, 40, "lg_tk_ids");
                  Tensor* lp = side_floats(ctx, {5, 4}, -4.0, -0.5, "lg_tk_lp");
                  Tensor* y = side_ints(ctx, {5}, 0, 40, "lg_tk_y");
                  return topk_kd(ctx, x, ids, lp, nullptr, y, o).loss;
                }});
  cs.push_back({"distill_jsd", 4, 29, [](Context& ctx, Tensor* x) {
                  DistillOptions o;
                  o.beta = 0.5f;
                  o.temperature = 2.0f;
                  return distill(ctx, x, side_floats(ctx, {4, 29}, -3.0, 3.0, "lg_d_t"), nullptr, o).loss;
                }});
  cs.push_back(
      {"entropy", 5, 33, [](Context& ctx, Tensor* x) { return entropy(ctx, x, 1.5f, Reduction::Mean); }});
  LogitsGradCase sel{"selective", 5, 31, nullptr, true};
  cs.push_back(sel);
  return cs;
}

// The case's gradient on backend be: logits of dtype x_dt from the case's generator; via_backward: the f32
// gradient of a graph backward (the reference), else logits_grad / selective_log_softmax_grad in grad_dt,
// in place when asked. Returned as f64, in row-major order.
inline Vec logits_grad_on(Backend& be, const LogitsGradCase& c, DType x_dt, DType grad_dt, bool in_place,
                          bool via_backward) {
  Context ctx(be);
  reseed("lg_x_" + c.name);
  Tensor* x = via_backward ? ctx.param(x_dt, {c.n, c.v}, "x") : ctx.input(x_dt, {c.n, c.v}, "x");
  Vec xv = random_vec(c.n * c.v, -3.0, 3.0);
  set_data(x, std::vector<float>(xv.begin(), xv.end()));
  Graph g(ctx);
  g.set_poison(true);
  Tensor* out = nullptr;
  if (c.selective) {
    Tensor* ids = side_ints(ctx, {c.n, 3}, 0, c.v, "lg_s_ids");
    Tensor* up = side_floats(ctx, {c.n, 3}, -1.0, 1.0, "lg_s_up");
    Tensor* vals = selective_log_softmax(ctx, x, ids);
    if (via_backward) {
      g.backward(sum(ctx, mul(ctx, vals, up)));
    } else {
      out = selective_log_softmax_grad(ctx, vals, up, grad_dt);
      out->flags |= kOutput;
      g.forward(out);
    }
  } else {
    Tensor* l = c.loss(ctx, x);
    if (via_backward) {
      g.backward(l);
    } else {
      out = logits_grad(ctx, l, grad_dt, in_place);
      out->flags |= kOutput;
      g.forward(out);
    }
  }
  g.compute();
  return to_f64(get_data(via_backward ? g.grad(x) : out));
}

// got (a 16-bit gradient) against want (f32) rounded to dt: within one rounding of the value, relative to
// the row's largest entry where the entry is tiny (f16's subnormals lose relative precision).
inline bool within_rounding(const Vec& got, const Vec& want, DType dt, const std::string& what) {
  // One spacing of the dtype (twice the rounding error), and f16's subnormal spacing as an absolute floor.
  const double ulp = dt == DType::BF16 ? std::ldexp(1.0, -7) : std::ldexp(1.0, -10);
  const double floor = dt == DType::F16 ? std::ldexp(1.0, -24) : 0.0;
  double scale = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  EXPECT_EQ(got.size(), want.size()) << what;
  if (got.size() != want.size()) return false;
  for (size_t i = 0; i < got.size(); ++i) {
    const double tol = ulp * std::max(std::fabs(want[i]), 1e-3 * scale) + floor;
    if (!(std::fabs(got[i] - want[i]) <= tol)) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", want " << want[i] << " within "
                    << tol;
      return false;
    }
  }
  return true;
}

// Runs every case on be: f32 equal to the backward, 16-bit within a rounding of it, in place equal to out of
// place, for f32, bf16 and f16 logits.
inline void check_logits_grad_cases(Backend& be) {
  for (const LogitsGradCase& c : logits_grad_cases())
    for (DType xd : {DType::F32, DType::BF16, DType::F16}) {
      SCOPED_TRACE(c.name + " logits " + dtype_name(xd));
      const Vec ref = logits_grad_on(be, c, xd, DType::F32, false, true);
      const Vec f32 = logits_grad_on(be, c, xd, DType::F32, false, false);
      EXPECT_EQ(f32, ref) << "the f32 gradient of the loss's own pass differs from the backward's";
      for (double v : ref) ASSERT_TRUE(std::isfinite(v));
      if (xd != DType::F32) within_rounding(logits_grad_on(be, c, xd, xd, false, false), ref, xd, "16-bit");
      if (!c.selective) {
        const Vec own = logits_grad_on(be, c, xd, xd, false, false);
        EXPECT_EQ(logits_grad_on(be, c, xd, xd, true, false), own) << "in place differs from out of place";
      }
    }
}

}  // namespace retort::test
