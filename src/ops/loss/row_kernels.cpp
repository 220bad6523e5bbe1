// CPU row kernels of the loss backend (the contract is in row_kernels.h). Each worker reads a row as f32 once
// (into scratch; the top-K kernel reads an f32 row in place), takes its softmax statistics from it (the
// maximum, then the exponentials, which are kept for the gradient: one exponential per entry and
// temperature), and writes the gradient row only after its last read of the logits, which is why the
// gradient may alias the logits. Exponentials, logarithms and row sums go through
// vec_math (eight lanes with AVX2); the arithmetic between them is plain loops over scratch rows, which the
// compiler vectorizes.
#include "row_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "../../core/error.h"
#include "../../core/thread_pool.h"
#include "../vec_math.h"

namespace retort::loss {

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
float get_f(const Block& b, int64_t r, int64_t c) {
  return load_f32(b.row(r) + size_t(c) * b.col_stride, b.dtype, 0);
}
int64_t get_i(const Block& b, int64_t r, int64_t c) {
  return load_i64(b.row(r) + size_t(c) * b.col_stride, b.dtype, 0);
}
bool get_nonzero(const Block& b, int64_t r, int64_t c) {
  return is_int(b.dtype) ? get_i(b, r, c) != 0 : get_f(b, r, c) != 0.0f;
}

void load_row(const Block& b, int64_t r, float* out) {
  const char* p = b.row(r);
  const int64_t n = b.cols;
  if (b.col_stride == dtype_size(b.dtype)) {
    if (b.dtype == DType::F32) {
      std::memcpy(out, p, size_t(n) * sizeof(float));
      return;
    }
    if (b.dtype == DType::BF16) {
      const uint16_t* s = reinterpret_cast<const uint16_t*>(p);
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(s[i]);
      return;
    }
  }
  for (int64_t i = 0; i < n; ++i) out[i] = load_f32(p + size_t(i) * b.col_stride, b.dtype, 0);
}

void store_row(const Block& b, int64_t r, const float* in) {
  char* p = b.row(r);
  const int64_t n = b.cols;
  if (b.dtype == DType::F32 && b.col_stride == sizeof(float)) {
    std::memcpy(p, in, size_t(n) * sizeof(float));
    return;
  }
  for (int64_t i = 0; i < n; ++i) store_f32(p + size_t(i) * b.col_stride, b.dtype, 0, in[i]);
}

// Row r of b when b is f32 with dense rows, else nullptr.
float* dense_f32_row(const Block& b, int64_t r) {
  return b.dtype == DType::F32 && b.col_stride == sizeof(float) ? reinterpret_cast<float*>(b.row(r))
                                                                : nullptr;
}

// Row r of b as f32: where it lies when it is f32 and dense, else converted into scratch.
const float* f32_row_or_copy(const Block& b, int64_t r, float* scratch) {
  if (const float* p = dense_f32_row(b, r)) return p;
  load_row(b, r, scratch);
  return scratch;
}

void zero_row(const Block& b, int64_t r, float* scratch) {
  std::fill(scratch, scratch + b.cols, 0.0f);
  store_row(b, r, scratch);
}

// Softmax statistics of a scratch row x at temperature T: m = max x (NaNs skipped) and s = Σ e_j with
// e_j = exp((x_j − m)/T) written to e (summed in f64). A row of nothing but −inf has m = −inf, s = 0 and e =
// 0; a NaN anywhere makes s NaN.
struct RowStats {
  float m, s;
};
RowStats row_stats(const float* x, int64_t n, float inv_t, float* e) {
  const float m = vmath::max(x, n);
  if (m == -kInf) {
    std::fill(e, e + n, 0.0f);
    return {m, std::isnan(vmath::sum(x, n)) ? std::numeric_limits<float>::quiet_NaN() : 0.0f};
  }
  return {m, float(vmath::exp_affine(x, e, n, m, inv_t, 0.0f, 1.0f, 0.0f))};
}

float logaddexp(float a, float b) {
  const float hi = std::max(a, b), lo = std::min(a, b);
  if (hi == -kInf) return -kInf;
  return hi + std::log1p(std::exp(lo - hi));
}

// One term of the divergence (row_kernels.h) between a teacher log-probability lp and a student
// log-probability lq (one slot of top-K or one vocabulary entry): adds the term of D and returns dD/d(lq).
float divergence_term(const DivergenceSpec& dv, float lp, float lq, double& d) {
  const float p = std::exp(lp), q = std::exp(lq);
  switch (dv.kind) {
    case Divergence::Kl:
      break;
    case Divergence::Tvd:
      d += 0.5 * std::fabs(double(p) - double(q));
      return q > p ? 0.5f * q : q < p ? -0.5f * q : 0.0f;
    case Divergence::SkewKl: {
      if (!(p > 0)) return 0.0f;
      const float a = dv.alpha, lm = logaddexp(std::log(a) + lp, std::log1p(-a) + lq);
      d += double(p) * (lp - lm);
      return -(1.0f - a) * p * std::exp(lq - lm);
    }
    case Divergence::SkewReverseKl: {
      if (!(q > 0)) return 0.0f;
      const float a = dv.alpha, lm = logaddexp(std::log1p(-a) + lp, std::log(a) + lq);
      d += double(q) * (lq - lm);
      return q * (lq - lm + 1.0f - a * std::exp(lq - lm));
    }
  }
  const float beta = dv.beta;
  if (beta == 0.0f) {
    if (p > 0) d += double(p) * (lp - lq);
    return -p;
  }
  if (beta == 1.0f) {
    if (q > 0) {
      d += double(q) * (lq - lp);
      return q * (lq - lp + 1.0f);
    }
    return 0.0f;
  }
  const float lm = logaddexp(std::log(beta) + lp, std::log1p(-beta) + lq);
  double t = 0;
  if (p > 0) t += double(beta) * p * (lp - lm);
  float g = 0.0f;
  if (q > 0) {
    const float u = q * (lq - lm);
    t += double(1.0f - beta) * u;
    // d/d(lq) of beta·KL(P‖M) + (1 − beta)·KL(Q‖M) simplifies to (1 − beta)·q·(log q − log m).
    g = (1.0f - beta) * u;
  }
  d += t;
  return g;
}

// Runs fn(begin, end) over row ranges in parallel, in chunks of about 16K elements.
template <typename F>
void parallel_rows(ThreadPool& pool, int64_t rows, int64_t width, F&& fn) {
  pool.parallel_for(rows, fn, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, width)));
}

void check_label(int64_t y, int64_t r, int64_t v, int64_t ignore_index, const std::string& what) {
  RT_CHECK(y >= 0 && y < v, what, ": label ", y, " at row ", r, " is outside [0, ", v,
           ") and is not the ignore_index ", ignore_index);
}

// Counts rows with label != ignore_index (all rows without labels), checking the others are in [0, v).
int64_t count_valid(const Block& labels, int64_t rows, int64_t v, int64_t ignore_index,
                    const std::string& what) {
  if (labels.empty()) return rows;
  int64_t valid = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t y = get_i(labels, r, 0);
    if (y == ignore_index) continue;
    check_label(y, r, v, ignore_index, what);
    ++valid;
  }
  return valid;
}

void zero_outputs(const RowOut& out, int64_t r) {
  if (out.loss) out.loss[r] = 0.0f;
  if (out.hard) out.hard[r] = 0.0f;
  if (out.soft) out.soft[r] = 0.0f;
}

}  // namespace

// Cross-entropy.

int64_t check_cross_entropy(const CrossEntropySide& side, int64_t v, const std::string& what) {
  return count_valid(side.labels, side.labels.rows, v, side.ignore_index, what);
}

void cross_entropy_rows(const Block& logits, const CrossEntropySide& side, const RowOut& out,
                        ThreadPool& pool) {
  const int64_t v = logits.cols;
  const float eps = side.label_smoothing, zl = side.z_loss, cap = side.softcap;
  const bool want_grad = !out.grad.empty();
  parallel_rows(pool, logits.rows, v, [&](int64_t b, int64_t e) {
    std::vector<float> buf(2 * static_cast<size_t>(v));
    float* __restrict z = buf.data();
    float* __restrict ez = z + v;  // exp(z − m)
    for (int64_t r = b; r < e; ++r) {
      const int64_t y = get_i(side.labels, r, 0);
      const bool ignored = y == side.ignore_index;
      if (ignored) {
        zero_outputs(out, r);
        // The gradient may be the logits themselves (the fused path): zero it only after the lse is read.
        if (!out.lse) {
          if (want_grad) zero_row(out.grad, r, z);
          continue;
        }
      }
      load_row(logits, r, z);
      if (cap > 0)
        for (int64_t j = 0; j < v; ++j) z[j] = cap * std::tanh(z[j] / cap);
      const RowStats st = row_stats(z, v, 1.0f, ez);
      const float log_s = std::log(st.s);
      const float lse = st.m + log_s;
      if (out.lse) out.lse[r] = lse;
      if (ignored) {
        if (want_grad) zero_row(out.grad, r, z);
        continue;
      }
      // Shifted by the max so that logits of 1e4 keep their precision: lse − z_y = (m − z_y) + log Σ.
      float loss = (1.0f - eps) * ((st.m - z[y]) + log_s);
      if (eps > 0) {
        double shifted = 0;  // Σ (z_j − m): lse − mean z = log Σ − mean(z − m)
        for (int64_t j = 0; j < v; ++j) shifted += z[j] - st.m;
        loss += eps * (log_s - float(shifted / double(v)));
      }
      if (zl != 0) loss += zl * lse * lse;
      if (out.loss) out.loss[r] = loss;
      if (!want_grad) continue;
      // d/ds_j = q_j (1 + 2·z_loss·lse) − eps/V − (1 − eps)[j = y], then times ds/dz = 1 − (s/c)² under the
      // cap.
      const float sc = out.grad_scale;
      const float a = sc * (1.0f + 2.0f * zl * lse);
      const float c = sc * eps / float(v);
      const float sy = z[y];
      const float as = a / st.s;  // q_j = e_j / s
      if (cap > 0) {
        for (int64_t j = 0; j < v; ++j) z[j] = (as * ez[j] - c) * (1.0f - (z[j] / cap) * (z[j] / cap));
      } else {
        for (int64_t j = 0; j < v; ++j) z[j] = as * ez[j] - c;
      }
      z[y] -= sc * (1.0f - eps) * (cap > 0 ? 1.0f - (sy / cap) * (sy / cap) : 1.0f);
      store_row(out.grad, r, z);
    }
  });
}

// Top-K distillation.

namespace {

bool slot_valid(const TopKSide& side, int64_t r, int64_t k) {
  if (!side.mask.empty() && !get_nonzero(side.mask, r, k)) return false;
  return get_f(side.logprobs, r, k) != -kInf;
}

}  // namespace

int64_t check_topk(const TopKSide& side, int64_t rows, int64_t v, const std::string& what) {
  const int64_t valid = count_valid(side.labels, rows, v, side.ignore_index, what);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < side.logprobs.cols; ++k) {
      if (!slot_valid(side, r, k)) continue;
      // A NaN would otherwise drop out of the loss (it is a max and a sum over slots) and surface only as NaN
      // gradients, which a finite-loss check does not see.
      const float lp = get_f(side.logprobs, r, k);
      RT_CHECK(!std::isnan(lp) && lp != kInf, what, ": teacher logprob ", lp, " at row ", r, " slot ", k,
               " (a valid slot needs a finite logprob; padding slots need mask 0 or logprob -inf)");
      if (side.ids.empty()) continue;
      const int64_t id = get_i(side.ids, r, k);
      RT_CHECK(id >= 0 && id < v, what, ": teacher id ", id, " at row ", r, " slot ", k, " is outside [0, ",
               v, ") (padding slots need mask 0 or logprob -inf)");
    }
  return valid;
}

void topk_rows(const Block& logits, const TopKSide& side, const RowOut& out, ThreadPool& pool) {
  const bool gathered = side.ids.empty();
  const bool normalize = gathered || side.normalize_topk;
  const int64_t v = logits.cols, kk = side.logprobs.cols;
  const float t = side.temperature, inv_t = 1.0f / t;
  const bool has_labels = !side.labels.empty();
  const bool hard_on = has_labels && side.w_hard != 0.0f;
  const bool want_hard = has_labels && (hard_on || out.hard);
  const bool want_grad = !out.grad.empty();
  parallel_rows(pool, logits.rows, v + kk, [&](int64_t b, int64_t e) {
    std::vector<float> buf(3 * size_t(v) + 4 * size_t(kk));
    std::vector<int64_t> ids(static_cast<size_t>(kk));
    float* zbuf = buf.data();  // [v] the row as f32 when it is stored otherwise, and the gradient's likewise
    float* xs = zbuf + v;      // student logit at each valid slot
    float* lq = xs + kk;       // student log q per valid slot
    float* lp = lq + kk;       // teacher log p per valid slot
    float* gs = lp + kk;       // dD/d(log q) per valid slot
    float* et = gs + kk;       // [v] exp((z − m)/T)
    float* e1 = et + v;        // [v] exp(z − m) when T != 1 and the hard loss is on
    for (int64_t r = b; r < e; ++r) {
      const int64_t y = has_labels ? get_i(side.labels, r, 0) : -1;
      const bool ignored = has_labels && y == side.ignore_index;
      if (ignored) {
        zero_outputs(out, r);
        // The gradient may be the logits themselves (the fused path): zero it only after the lse is read.
        if (!out.lse) {
          if (want_grad) zero_row(out.grad, r, zbuf);
          continue;
        }
      }
      // Full-vocabulary statistics are needed for Q over V, for the hard loss, and for the lse; with
      // normalize_topk alone only the K gathered logits are read.
      const bool full = !gathered && (!normalize || (want_hard && !ignored) || out.lse);
      const bool both = full && want_hard && !ignored && t != 1.0f;
      RowStats st{-kInf, 0.0f};
      float s1 = 0.0f;  // Σ exp(z − m) (at T = 1), for the hard loss
      // Rows already f32 and dense are read where they lie: a copy of a vocabulary-wide row costs as much
      // as a pass of the statistics.
      const float* z = zbuf;
      if (full || gathered) z = f32_row_or_copy(logits, r, zbuf);
      if (full) {
        st = row_stats(z, v, inv_t, et);
        s1 = st.s;
        if (both && st.m != -kInf) {
          s1 = float(vmath::exp_affine(z, e1, v, st.m, 1.0f, 0.0f, 1.0f, 0.0f));
        }
      }
      const float log_st = std::log(st.s), log_s1 = std::log(s1);

      int64_t n = 0;
      for (int64_t k = 0; k < kk; ++k) {
        if (!slot_valid(side, r, k)) continue;
        const int64_t id = gathered ? k : get_i(side.ids, r, k);
        ids[size_t(n)] = id;
        xs[n] = (full || gathered) ? z[id] : get_f(logits, r, id);
        lp[n] = get_f(side.logprobs, r, k);
        ++n;
      }
      float slots_lse = 0.0f;  // LSE over the valid slots of x/T (normalize_topk's normalizer)
      if (normalize && n > 0) {
        float ms = -kInf;
        for (int64_t i = 0; i < n; ++i) ms = std::max(ms, xs[i]);
        float s = 0.0f;
        for (int64_t i = 0; i < n; ++i) s += std::exp((xs[i] - ms) * inv_t);
        const float ls = std::log(s);
        for (int64_t i = 0; i < n; ++i) lq[i] = (xs[i] - ms) * inv_t - ls;
        slots_lse = ms * inv_t + ls;
      } else {
        for (int64_t i = 0; i < n; ++i) lq[i] = (xs[i] - st.m) * inv_t - log_st;
      }
      if (out.lse) out.lse[r] = gathered ? slots_lse : st.m * inv_t + log_st;
      if (ignored) {
        if (want_grad) zero_row(out.grad, r, zbuf);
        continue;
      }

      if (t != 1.0f && n > 0) {  // the teacher's top-K renormalized at temperature T
        float mu = -kInf;
        for (int64_t i = 0; i < n; ++i) mu = std::max(mu, lp[i]);
        float s = 0.0f;
        for (int64_t i = 0; i < n; ++i) s += std::exp((lp[i] - mu) * inv_t);
        const float ls = std::log(s);
        for (int64_t i = 0; i < n; ++i) lp[i] = (lp[i] - mu) * inv_t - ls;
      }
      double d = 0, sum_g = 0;
      for (int64_t i = 0; i < n; ++i) {
        gs[i] = divergence_term(side.div, lp[i], lq[i], d);
        sum_g += gs[i];
      }
      const float soft = t * t * float(d);
      const float hard = want_hard ? (st.m - z[y]) + log_s1 : 0.0f;
      if (out.hard) out.hard[r] = hard;
      if (out.soft) out.soft[r] = soft;
      if (out.loss)
        out.loss[r] =
            (hard_on ? side.w_hard * hard : 0.0f) + (side.w_soft != 0.0f ? side.w_soft * soft : 0.0f);
      if (!want_grad) continue;

      // d(T²·D)/dz_j = T·(Σ_{k: id_k = j} G_k − π_j·Σ_k G_k), π the softmax Q is normalized over; plus the
      // hard loss's q1_j − [j = y]. The dense part goes first, the K slots are added on top before the store.
      const float cs = side.w_soft != 0.0f ? out.grad_scale * side.w_soft * t : 0.0f;
      const float ch = hard_on ? out.grad_scale * side.w_hard : 0.0f;
      // The dense part: dense_soft·q_j at T plus ch·q_j at 1 (the same softmax when T = 1), from the
      // exponentials of the statistics pass.
      const float dense_soft = normalize ? 0.0f : -cs * float(sum_g);
      // The gradient row, written in place when the gradient is f32 and dense (over the logits in the fused
      // path: z is not read past this point).
      float* const grow = dense_f32_row(out.grad, r);
      float* __restrict g = grow ? grow : zbuf;
      if (dense_soft != 0.0f || ch != 0.0f) {
        const float* __restrict eh = both ? e1 : et;
        const float a_soft = dense_soft / st.s, a_hard = ch / s1;
        for (int64_t j = 0; j < v; ++j) g[j] = a_soft * et[j] + a_hard * eh[j];
      } else {
        std::fill(g, g + v, 0.0f);
      }
      if (cs != 0.0f)
        for (int64_t i = 0; i < n; ++i) {
          float gi = cs * gs[i];
          if (normalize) gi -= cs * std::exp(lq[i]) * float(sum_g);
          g[ids[size_t(i)]] += gi;
        }
      if (ch != 0.0f) g[y] -= ch;
      if (!grow) store_row(out.grad, r, g);
    }
  });
}

// Full-vocabulary distillation.

int64_t check_distill(const DistillSide& side, int64_t rows, int64_t v, const std::string& what) {
  return count_valid(side.labels, rows, v, side.ignore_index, what);
}

namespace {

// The loops of distill_rows, with restrict-qualified arguments and unconditional arithmetic before each
// select so that the compiler vectorizes them.

// lq = (z − m_z)/T − log Σ_z, lp = (w − m_w)/T − log Σ_w (over w), q = e_z / Σ_z and p = e_w / Σ_w (over
// the exponentials of the statistics pass).
void log_probs(const float* __restrict z, float* __restrict lp, float* __restrict q, float* __restrict p,
               float* __restrict lq, int64_t v, float inv_t, RowStats sz, float log_sz, RowStats sw,
               float log_sw) {
  const float mz = sz.m, mw = sw.m, inv_sz = 1.0f / sz.s, inv_sw = 1.0f / sw.s;
  for (int64_t j = 0; j < v; ++j) {
    lq[j] = (z[j] - mz) * inv_t - log_sz;
    lp[j] = (lp[j] - mw) * inv_t - log_sw;
    q[j] *= inv_sz;
    p[j] *= inv_sw;
  }
}

// The terms of D (into term) and dD/d(log q) (into g; forward KL's is −p, not written), by row_kernels.h's
// table. log m comes from m itself (m is below the smallest normal float only where p and q are too, and
// their terms then vanish). A term whose weight is 0 is 0, so 0·log 0 never makes a NaN.
void divergence_terms(const DivergenceSpec& dv, const float* __restrict lp, const float* __restrict lq,
                      const float* __restrict p, const float* __restrict q, float* __restrict term,
                      float* __restrict g, int64_t v) {
  constexpr float kTiny = 1.17549435e-38f;
  const float beta = dv.beta, a = dv.alpha, oma = 1.0f - a;
  switch (dv.kind) {
    case Divergence::Kl:
      break;
    case Divergence::Tvd:
      for (int64_t j = 0; j < v; ++j) {
        term[j] = 0.5f * std::fabs(p[j] - q[j]);
        g[j] = q[j] > p[j] ? 0.5f * q[j] : q[j] < p[j] ? -0.5f * q[j] : 0.0f;
      }
      return;
    case Divergence::SkewKl:  // m = α·p + (1 − α)·q
      for (int64_t j = 0; j < v; ++j) g[j] = std::max(a * p[j] + oma * q[j], kTiny);
      vmath::log(g, v);
      for (int64_t j = 0; j < v; ++j) {
        const float lm = g[j];
        const float tp = p[j] * (lp[j] - lm), gj = -oma * p[j] * std::exp(lq[j] - lm);
        term[j] = p[j] > 0.0f ? tp : 0.0f;
        g[j] = p[j] > 0.0f ? gj : 0.0f;
      }
      return;
    case Divergence::SkewReverseKl:  // m = (1 − α)·p + α·q
      for (int64_t j = 0; j < v; ++j) g[j] = std::max(oma * p[j] + a * q[j], kTiny);
      vmath::log(g, v);
      for (int64_t j = 0; j < v; ++j) {
        const float lm = g[j];
        const float tq = q[j] * (lq[j] - lm), gj = q[j] * (lq[j] - lm + 1.0f - a * std::exp(lq[j] - lm));
        term[j] = q[j] > 0.0f ? tq : 0.0f;
        g[j] = q[j] > 0.0f ? gj : 0.0f;
      }
      return;
  }
  if (beta == 0.0f) {
    for (int64_t j = 0; j < v; ++j) {
      const float tp = p[j] * (lp[j] - lq[j]);
      term[j] = p[j] > 0.0f ? tp : 0.0f;
    }
    return;
  }
  if (beta == 1.0f) {
    for (int64_t j = 0; j < v; ++j) {
      const float tq = q[j] * (lq[j] - lp[j]);
      term[j] = q[j] > 0.0f ? tq : 0.0f;
    }
    for (int64_t j = 0; j < v; ++j) {
      const float gj = q[j] * (lq[j] - lp[j] + 1.0f);
      g[j] = q[j] > 0.0f ? gj : 0.0f;
    }
    return;
  }
  const float omb = 1.0f - beta;
  for (int64_t j = 0; j < v; ++j) g[j] = std::max(beta * p[j] + omb * q[j], kTiny);
  vmath::log(g, v);
  for (int64_t j = 0; j < v; ++j) {
    const float lm = g[j];
    const float tp = beta * p[j] * (lp[j] - lm), tq = omb * q[j] * (lq[j] - lm);
    const float tp0 = p[j] > 0.0f ? tp : 0.0f, tq0 = q[j] > 0.0f ? tq : 0.0f;
    term[j] = tp0 + tq0;
    // d/d(lq) of beta·KL(P‖M) + (1 − beta)·KL(Q‖M) simplifies to (1 − beta)·q·(log q − log m).
    g[j] = tq0;
  }
}

// dz = cs·(sign·g − q·Σg) + ch1·q: the soft gradient (cs = T²·w_soft·scale / T), g = dD/d(log q) with its sum
// (forward KL: g = p, sign −1, Σg = −1, so q − p), plus, when T = 1, the hard loss's ch1·q.
void distill_grad(const float* __restrict g, float sign, const float* __restrict q, float* __restrict dz,
                  int64_t v, float cs, float sum_g, float ch1) {
  for (int64_t j = 0; j < v; ++j) dz[j] = cs * (sign * g[j] - q[j] * sum_g) + ch1 * q[j];
}

}  // namespace

void distill_rows(const Block& logits, const DistillSide& side, const RowOut& out, ThreadPool& pool) {
  const int64_t v = logits.cols;
  const float t = side.temperature, inv_t = 1.0f / t;
  const bool has_labels = !side.labels.empty();
  const bool hard_on = has_labels && side.w_hard != 0.0f;
  const bool want_hard = has_labels && (hard_on || out.hard);
  const bool want_grad = !out.grad.empty();
  parallel_rows(pool, logits.rows, 2 * v, [&](int64_t b, int64_t e) {
    // Rows of v floats: the student logits; the teacher's, then log p; log q; q; p; the divergence terms,
    // then the gradient; dD/d(log q) (JSD: log m first).
    std::vector<float> buf(7 * size_t(v));
    float* __restrict z = buf.data();
    float* __restrict lp = z + v;
    float* __restrict lq = lp + v;
    float* __restrict q = lq + v;
    float* __restrict p = q + v;
    float* __restrict term = p + v;
    float* __restrict gq = term + v;
    for (int64_t r = b; r < e; ++r) {
      const int64_t y = has_labels ? get_i(side.labels, r, 0) : -1;
      const bool ignored = has_labels && y == side.ignore_index;
      if (ignored) {
        zero_outputs(out, r);
        // The gradient may be the logits themselves (the fused path): zero it only after the lse is read.
        if (!out.lse) {
          if (want_grad) zero_row(out.grad, r, z);
          continue;
        }
      }
      // Statistics of both rows: the student at T (and at 1 for the hard loss), the teacher at T; their
      // exponentials become q and p below.
      load_row(logits, r, z);
      const RowStats sz = row_stats(z, v, inv_t, q);
      const float s1 = want_hard && t != 1.0f && sz.m != -kInf ? vmath::sum_exp(z, v, sz.m, 1.0f) : sz.s;
      const float log_sz = std::log(sz.s), log_s1 = std::log(s1);
      if (out.lse) out.lse[r] = sz.m * inv_t + log_sz;
      if (ignored) {
        if (want_grad) zero_row(out.grad, r, z);
        continue;
      }
      load_row(side.teacher, r, lp);
      const RowStats sw = row_stats(lp, v, inv_t, p);
      const float log_sw = std::log(sw.s);

      const float hard = want_hard ? (sz.m - z[y]) + log_s1 : 0.0f;
      log_probs(z, lp, q, p, lq, v, inv_t, sz, log_sz, sw, log_sw);
      divergence_terms(side.div, lp, lq, p, q, term, gq, v);
      const double d = vmath::sum(term, v);
      if (want_grad) {
        // dD/dz_j = (g_j − q_j·Σg)/T (forward KL: (q_j − p_j)/T), times T² in cs; plus the hard loss's
        // ch·softmax(z)_j at T = 1 (ch·q_j when T = 1).
        const float cs = side.w_soft != 0.0f ? out.grad_scale * side.w_soft * t : 0.0f;
        const float ch = hard_on ? out.grad_scale * side.w_hard : 0.0f;
        const float ch1 = t == 1.0f ? ch : 0.0f;
        float* dz = term;
        if (side.div.forward_kl())
          distill_grad(p, -1.0f, q, dz, v, cs, -1.0f, ch1);
        else
          distill_grad(gq, 1.0f, q, dz, v, cs, float(vmath::sum(gq, v)), ch1);
        if (ch != 0.0f) {
          if (t != 1.0f) vmath::exp_affine(z, dz, v, sz.m, 1.0f, log_s1, ch, 0.0f, true);
          dz[y] -= ch;
        }
        store_row(out.grad, r, dz);
      }
      const float soft = t * t * float(d);
      if (out.hard) out.hard[r] = hard;
      if (out.soft) out.soft[r] = soft;
      if (out.loss)
        out.loss[r] =
            (hard_on ? side.w_hard * hard : 0.0f) + (side.w_soft != 0.0f ? side.w_soft * soft : 0.0f);
    }
  });
}

// Entropy.

void entropy_rows(const Block& logits, const EntropySide& side, const RowOut& out, ThreadPool& pool) {
  const int64_t v = logits.cols;
  const float inv_t = 1.0f / side.temperature;
  const bool want_grad = !out.grad.empty();
  parallel_rows(pool, logits.rows, v, [&](int64_t b, int64_t e) {
    // Rows of v floats: the logits, then log q; q; q·log q.
    std::vector<float> buf(3 * size_t(v));
    float* __restrict z = buf.data();
    float* __restrict q = z + v;
    float* __restrict ql = q + v;
    for (int64_t r = b; r < e; ++r) {
      load_row(logits, r, z);
      // With d = (z − m)/T and w = exp(d): S = Σ w, H = log S − Σ w·d / S; then log q = d − log S.
      const float m = vmath::max(z, v);  // NaN never wins, and shows in S
      for (int64_t j = 0; j < v; ++j) z[j] = (z[j] - m) * inv_t;
      std::memcpy(q, z, size_t(v) * sizeof(float));
      vmath::exp(q, v);
      for (int64_t j = 0; j < v; ++j) ql[j] = q[j] > 0.0f ? q[j] * z[j] : 0.0f;  // 0·(−inf) is 0 here
      const float s = float(vmath::sum(q, v)), bsum = float(vmath::sum(ql, v));
      const float log_s = std::log(s);
      const float h = log_s - bsum / s;
      if (out.loss) out.loss[r] = h;
      if (out.lse) out.lse[r] = m * inv_t + log_s;
      if (!want_grad) continue;
      // dH/dz_j = −(1/T)·q_j·(log q_j + H), with q_j = w_j / S.
      const float c = -out.grad_scale * inv_t, inv_s = 1.0f / s;
      for (int64_t j = 0; j < v; ++j) {
        const float qj = q[j] * inv_s;
        z[j] = qj > 0.0f ? c * qj * ((z[j] - log_s) + h) : 0.0f;
      }
      store_row(out.grad, r, z);
    }
  });
}

// Selective log-softmax.

void check_ids(const Block& ids, int64_t v, const std::string& what) {
  for (int64_t r = 0; r < ids.rows; ++r)
    for (int64_t k = 0; k < ids.cols; ++k) {
      const int64_t id = get_i(ids, r, k);
      RT_CHECK(id >= 0 && id < v, what, ": id ", id, " at row ", r, " position ", k, " is outside [0, ", v,
               ")");
    }
}

void selective_log_softmax_rows(const Block& logits, const Block& ids, const Block& out, float* lse,
                                ThreadPool& pool) {
  const int64_t v = logits.cols, kk = ids.cols;
  parallel_rows(pool, logits.rows, v, [&](int64_t b, int64_t e) {
    std::vector<float> buf(2 * size_t(v) + size_t(kk));
    float* z = buf.data();
    float* o = z + v;
    float* ez = o + kk;
    for (int64_t r = b; r < e; ++r) {
      load_row(logits, r, z);
      const RowStats st = row_stats(z, v, 1.0f, ez);
      const float log_s = std::log(st.s);
      for (int64_t k = 0; k < kk; ++k) o[k] = (z[get_i(ids, r, k)] - st.m) - log_s;
      store_row(out, r, o);
      if (lse) lse[r] = st.m + log_s;
    }
  });
}

void selective_log_softmax_back_rows(const Block& logits, const Block& ids, const Block& g, const float* lse,
                                     const Block& grad, ThreadPool& pool) {
  const int64_t v = logits.cols, kk = ids.cols;
  parallel_rows(pool, logits.rows, v, [&](int64_t b, int64_t e) {
    std::vector<float> buf(size_t(v) + size_t(kk));
    float* z = buf.data();
    float* gk = z + v;
    for (int64_t r = b; r < e; ++r) {
      load_row(g, r, gk);
      double total = 0;
      for (int64_t k = 0; k < kk; ++k) total += gk[k];
      load_row(logits, r, z);
      const float tot = float(total), l = lse[r];
      vmath::exp_affine(z, z, v, l, 1.0f, 0.0f, -tot, 0.0f);  // −exp(z − lse)·Σg
      for (int64_t k = 0; k < kk; ++k) z[get_i(ids, r, k)] += gk[k];
      store_row(grad, r, z);
    }
  });
}

}  // namespace retort::loss
