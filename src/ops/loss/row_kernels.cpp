// CPU row kernels of the loss backend (the contract is in row_kernels.h). Each worker copies a row to f32
// scratch once, takes its softmax statistics in one online pass, and writes the gradient row from the
// scratch, which is why the gradient may alias the logits.
#include "row_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "../../core/error.h"
#include "../../core/thread_pool.h"

namespace retort::loss {

Block Block::sub_rows(int64_t r0, int64_t n) const {
  Block b = *this;
  if (!empty()) b.data = row(r0);
  b.rows = n;
  return b;
}

Block Block::dense(void* data, DType dtype, int64_t rows, int64_t cols) {
  size_t es = dtype_size(dtype);
  return {data, dtype, rows, cols, es * size_t(cols), es};
}

RowOut RowOut::sub_rows(int64_t r0, int64_t n) const {
  RowOut o = *this;
  auto at = [r0](float* p) { return p ? p + r0 : nullptr; };
  o.loss = at(loss);
  o.lse = at(lse);
  o.hard = at(hard);
  o.soft = at(soft);
  o.grad = grad.sub_rows(r0, n);
  return o;
}

CrossEntropySide CrossEntropySide::sub_rows(int64_t r0, int64_t n) const {
  CrossEntropySide s = *this;
  s.labels = labels.sub_rows(r0, n);
  return s;
}

TopKSide TopKSide::sub_rows(int64_t r0, int64_t n) const {
  TopKSide s = *this;
  s.ids = ids.sub_rows(r0, n);
  s.logprobs = logprobs.sub_rows(r0, n);
  s.mask = mask.sub_rows(r0, n);
  s.labels = labels.sub_rows(r0, n);
  return s;
}

DistillSide DistillSide::sub_rows(int64_t r0, int64_t n) const {
  DistillSide s = *this;
  s.teacher = teacher.sub_rows(r0, n);
  s.labels = labels.sub_rows(r0, n);
  return s;
}

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
// Elements per step of the online pass: one max per block, then one rescale of the running sums at most, so
// the inner loop is a plain sum of exponentials.
constexpr int64_t kBlock = 256;

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

void zero_row(const Block& b, int64_t r, float* scratch) {
  std::fill(scratch, scratch + b.cols, 0.0f);
  store_row(b, r, scratch);
}

// Running softmax statistics of a row x at two temperatures: m = max x, s1 = Σ exp(x − m),
// st = Σ exp((x − m)·inv_t). s1 is kept only when `both` (a loss needs T = 1 and T at once).
struct Online {
  float m = -kInf, s1 = 0.0f, st = 0.0f;

  void add(const float* x, int64_t n, float inv_t, bool both) {
    for (int64_t b = 0; b < n; b += kBlock) {
      const int64_t e = std::min(n, b + kBlock);
      float bm = -kInf;
      for (int64_t i = b; i < e; ++i) bm = x[i] > bm ? x[i] : bm;  // NaN never wins, and shows in the sum
      if (bm == -kInf) continue;  // a block of -inf adds nothing (and -inf - -inf would be NaN)
      if (bm > m) {
        // Rescale what was summed so far to the new maximum; exp(-inf) = 0 when nothing was.
        s1 *= std::exp(m - bm);
        st *= std::exp((m - bm) * inv_t);
        m = bm;
      }
      float a1 = 0.0f, at = 0.0f;
      for (int64_t i = b; i < e; ++i) {
        const float d = x[i] - m;
        at += std::exp(d * inv_t);
        if (both) a1 += std::exp(d);
      }
      s1 += a1;
      st += at;
    }
    if (!both) s1 = st;  // callers without a second temperature read s1 only when inv_t == 1
  }
};

float logaddexp(float a, float b) {
  const float hi = std::max(a, b), lo = std::min(a, b);
  if (hi == -kInf) return -kInf;
  return hi + std::log1p(std::exp(lo - hi));
}

// One term of a divergence between a teacher log-probability lp and a student log-probability lq (one slot of
// top-K or one vocabulary entry): adds the term of D and returns dD/d(lq) (G in the header's derivation).
// The TRL/GKD convention: beta = 0 forward KL(P‖Q), beta = 1 reverse KL(Q‖P), otherwise the generalized JSD
// with M = beta·P + (1 − beta)·Q. Terms whose weight is 0 are skipped so 0·log 0 never makes a NaN.
float divergence_term(float beta, float lp, float lq, double& d) {
  const float p = std::exp(lp), q = std::exp(lq);
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

// ---- cross-entropy ------------------------------------------------------------------------------------

int64_t check_cross_entropy(const CrossEntropySide& side, int64_t v, const std::string& what) {
  return count_valid(side.labels, side.labels.rows, v, side.ignore_index, what);
}

void cross_entropy_rows(const Block& logits, const CrossEntropySide& side, const RowOut& out,
                        ThreadPool& pool) {
  const int64_t v = logits.cols;
  const float eps = side.label_smoothing, zl = side.z_loss, cap = side.softcap;
  const bool want_grad = !out.grad.empty();
  parallel_rows(pool, logits.rows, v, [&](int64_t b, int64_t e) {
    std::vector<float> buf(static_cast<size_t>(v));
    float* z = buf.data();
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
      Online st;
      st.add(z, v, 1.0f, false);
      const float log_s = std::log(st.st);
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
      for (int64_t j = 0; j < v; ++j) {
        const float s = z[j];
        float g = a * std::exp((s - st.m) - log_s) - c;
        if (cap > 0) g *= 1.0f - (s / cap) * (s / cap);
        z[j] = g;
      }
      z[y] -= sc * (1.0f - eps) * (cap > 0 ? 1.0f - (sy / cap) * (sy / cap) : 1.0f);
      store_row(out.grad, r, z);
    }
  });
}

// ---- top-K distillation -------------------------------------------------------------------------------

namespace {

bool slot_valid(const TopKSide& side, int64_t r, int64_t k) {
  if (!side.mask.empty() && !get_nonzero(side.mask, r, k)) return false;
  return get_f(side.logprobs, r, k) != -kInf;
}

}  // namespace

int64_t check_topk(const TopKSide& side, int64_t rows, int64_t v, const std::string& what) {
  const int64_t valid = count_valid(side.labels, rows, v, side.ignore_index, what);
  if (side.ids.empty()) return valid;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < side.ids.cols; ++k) {
      if (!slot_valid(side, r, k)) continue;
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
    std::vector<float> buf(size_t(v) + 4 * size_t(kk));
    std::vector<int64_t> ids(static_cast<size_t>(kk));
    float* z = buf.data();
    float* xs = z + v;    // student logit at each valid slot
    float* lq = xs + kk;  // student log q per valid slot
    float* lp = lq + kk;  // teacher log p per valid slot
    float* gs = lp + kk;  // dD/d(log q) per valid slot
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
      // Full-vocabulary statistics are needed for Q over V, for the hard loss, and for the lse; with
      // normalize_topk alone only the K gathered logits are read.
      const bool full = !gathered && (!normalize || (want_hard && !ignored) || out.lse);
      const bool both = full && want_hard && !ignored && t != 1.0f;
      Online st;
      if (full || gathered) load_row(logits, r, z);
      if (full) st.add(z, v, inv_t, both);
      const float log_st = std::log(st.st), log_s1 = std::log(st.s1);

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
        if (want_grad) zero_row(out.grad, r, z);
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
        gs[i] = divergence_term(side.beta, lp[i], lq[i], d);
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
      const float dense_soft = normalize ? 0.0f : -cs * float(sum_g);
      if (dense_soft != 0.0f || ch != 0.0f) {
        for (int64_t j = 0; j < v; ++j) {
          const float dj = z[j] - st.m;
          float g = dense_soft != 0.0f ? dense_soft * std::exp(dj * inv_t - log_st) : 0.0f;
          if (ch != 0.0f) g += ch * std::exp(dj - log_s1);
          z[j] = g;
        }
      } else {
        std::fill(z, z + v, 0.0f);
      }
      if (cs != 0.0f)
        for (int64_t i = 0; i < n; ++i) {
          float g = cs * gs[i];
          if (normalize) g -= cs * std::exp(lq[i]) * float(sum_g);
          z[ids[size_t(i)]] += g;
        }
      if (ch != 0.0f) z[y] -= ch;
      store_row(out.grad, r, z);
    }
  });
}

// ---- full-vocabulary distillation ---------------------------------------------------------------------

int64_t check_distill(const DistillSide& side, int64_t rows, int64_t v, const std::string& what) {
  return count_valid(side.labels, rows, v, side.ignore_index, what);
}

void distill_rows(const Block& logits, const DistillSide& side, const RowOut& out, ThreadPool& pool) {
  const int64_t v = logits.cols;
  const float t = side.temperature, inv_t = 1.0f / t, beta = side.beta;
  const bool has_labels = !side.labels.empty();
  const bool hard_on = has_labels && side.w_hard != 0.0f;
  const bool want_hard = has_labels && (hard_on || out.hard);
  const bool want_grad = !out.grad.empty();
  parallel_rows(pool, logits.rows, 2 * v, [&](int64_t b, int64_t e) {
    std::vector<float> buf(2 * size_t(v));
    float* z = buf.data();
    float* w = z + v;  // teacher row
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
      // One online pass over both rows: student at T (and at 1 for the hard loss), teacher at T.
      load_row(logits, r, z);
      Online sz;
      sz.add(z, v, inv_t, want_hard && t != 1.0f);
      const float log_sz = std::log(sz.st), log_s1 = std::log(sz.s1);
      if (out.lse) out.lse[r] = sz.m * inv_t + log_sz;
      if (ignored) {
        if (want_grad) zero_row(out.grad, r, z);
        continue;
      }
      load_row(side.teacher, r, w);
      Online sw;
      sw.add(w, v, inv_t, false);
      const float log_sw = std::log(sw.st);

      const float hard = want_hard ? (sz.m - z[y]) + log_s1 : 0.0f;
      const float cs = want_grad && side.w_soft != 0.0f ? out.grad_scale * side.w_soft * t : 0.0f;
      const float ch = want_grad && hard_on ? out.grad_scale * side.w_hard : 0.0f;
      auto lq_at = [&](int64_t j) { return (z[j] - sz.m) * inv_t - log_sz; };
      auto lp_at = [&](int64_t j) { return (w[j] - sw.m) * inv_t - log_sw; };
      auto hard_grad = [&](int64_t j) { return ch != 0.0f ? ch * std::exp((z[j] - sz.m) - log_s1) : 0.0f; };
      double d = 0, sum_g = 0;
      if (beta == 0.0f && want_grad) {
        // Forward KL: dD/dz_j = (q_j − p_j)/T needs no row-wide sum, so loss and gradient share this pass.
        for (int64_t j = 0; j < v; ++j) {
          const float lq = lq_at(j), lp = lp_at(j);
          divergence_term(0.0f, lp, lq, d);
          const float g = cs * (std::exp(lq) - std::exp(lp)) + hard_grad(j);
          z[j] = g;  // z[j] is not read again; the hard term above used it first
        }
      } else {
        for (int64_t j = 0; j < v; ++j) sum_g += divergence_term(beta, lp_at(j), lq_at(j), d);
        if (want_grad) {
          for (int64_t j = 0; j < v; ++j) {
            const float lq = lq_at(j);
            double unused = 0;
            const float gj = divergence_term(beta, lp_at(j), lq, unused);
            const float g = cs * (gj - std::exp(lq) * float(sum_g)) + hard_grad(j);
            z[j] = g;
          }
        }
      }
      const float soft = t * t * float(d);
      if (out.hard) out.hard[r] = hard;
      if (out.soft) out.soft[r] = soft;
      if (out.loss)
        out.loss[r] =
            (hard_on ? side.w_hard * hard : 0.0f) + (side.w_soft != 0.0f ? side.w_soft * soft : 0.0f);
      if (!want_grad) continue;
      if (ch != 0.0f) z[y] -= ch;
      store_row(out.grad, r, z);
    }
  });
}

// ---- entropy ------------------------------------------------------------------------------------------

void entropy_rows(const Block& logits, const EntropySide& side, const RowOut& out, ThreadPool& pool) {
  const int64_t v = logits.cols;
  const float inv_t = 1.0f / side.temperature;
  const bool want_grad = !out.grad.empty();
  parallel_rows(pool, logits.rows, v, [&](int64_t b, int64_t e) {
    std::vector<float> buf(static_cast<size_t>(v));
    float* z = buf.data();
    for (int64_t r = b; r < e; ++r) {
      load_row(logits, r, z);
      // Online entropy: with d = (z − m)/T and w = exp(d), S = Σ w and B = Σ w·d give H = log S − B/S.
      // When the max rises from m to m', every d drops by (m' − m)/T and every w scales by α = exp(−that).
      float m = -kInf, s = 0.0f, bsum = 0.0f;
      for (int64_t i0 = 0; i0 < v; i0 += kBlock) {
        const int64_t i1 = std::min(v, i0 + kBlock);
        float bm = -kInf;
        for (int64_t i = i0; i < i1; ++i) bm = z[i] > bm ? z[i] : bm;
        if (bm == -kInf) continue;
        if (bm > m) {
          if (s > 0) {
            const float shift = (m - bm) * inv_t;
            const float alpha = std::exp(shift);
            bsum = alpha * (bsum + s * shift);
            s *= alpha;
          }
          m = bm;
        }
        for (int64_t i = i0; i < i1; ++i) {
          const float dd = (z[i] - m) * inv_t;
          const float ww = std::exp(dd);
          s += ww;
          if (ww > 0) bsum += ww * dd;
        }
      }
      const float log_s = std::log(s);
      const float h = log_s - bsum / s;
      if (out.loss) out.loss[r] = h;
      if (out.lse) out.lse[r] = m * inv_t + log_s;
      if (!want_grad) continue;
      const float c = -out.grad_scale * inv_t;
      for (int64_t j = 0; j < v; ++j) {
        const float lq = (z[j] - m) * inv_t - log_s;
        const float q = std::exp(lq);
        z[j] = q > 0 ? c * q * (lq + h) : 0.0f;
      }
      store_row(out.grad, r, z);
    }
  });
}

// ---- selective log-softmax ----------------------------------------------------------------------------

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
    std::vector<float> buf(size_t(v) + size_t(kk));
    float* z = buf.data();
    float* o = z + v;
    for (int64_t r = b; r < e; ++r) {
      load_row(logits, r, z);
      Online st;
      st.add(z, v, 1.0f, false);
      const float log_s = std::log(st.st);
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
      for (int64_t j = 0; j < v; ++j) z[j] = -std::exp(z[j] - l) * tot;
      for (int64_t k = 0; k < kk; ++k) z[get_i(ids, r, k)] += gk[k];
      store_row(grad, r, z);
    }
  });
}

}  // namespace retort::loss
