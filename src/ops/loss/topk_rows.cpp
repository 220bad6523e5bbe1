// The CPU row kernel of the teacher head (TopKLogprobsSide, row_kernels.h): per row, one f32 copy of the
// logits, the label's logit read from it, then topk_logprobs's selection (src/ops/topk_select.h), which also
// gives the row max and the log-sum-exp. Rows are split over the thread pool.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "../../core/error.h"
#include "../../core/thread_pool.h"
#include "../topk_select.h"
#include "row_kernels.h"

namespace retort::loss {

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

void load_f32_row(const Block& b, int64_t r, float* out) {
  const char* p = b.row(r);
  if (b.dtype == DType::F32 && b.col_stride == sizeof(float)) {
    std::memcpy(out, p, size_t(b.cols) * sizeof(float));
    return;
  }
  for (int64_t i = 0; i < b.cols; ++i) out[i] = load_f32(p + size_t(i) * b.col_stride, b.dtype, 0);
}

int64_t label_at(const Block& labels, int64_t r) {
  return load_i64(labels.row(r), labels.dtype, 0);
}

// The row as loaded (z is overwritten by the selection) names the first NaN or +inf.
[[noreturn]] void not_finite(const TopKLogprobsSide& side, const Block& logits, int64_t r) {
  std::vector<float> z(size_t(logits.cols));
  load_f32_row(logits, r, z.data());
  int64_t c = 0;
  while (c < logits.cols && !(std::isnan(z[size_t(c)]) || z[size_t(c)] == kInf)) ++c;
  RT_FAIL(side.op, ": the logits of row ", side.row0 + r, " hold ",
          c < logits.cols && std::isnan(z[size_t(c)]) ? "NaN" : "+inf", " at column ", c,
          " (hidden or weight hold NaN or inf, or their product overflows f32)");
}

}  // namespace

int64_t check_topk_logprobs(const TopKLogprobsSide& side, int64_t rows, int64_t v, const std::string& what) {
  RT_CHECK(side.k >= 1 && side.k <= v, what, ": K = ", side.k, " must be in [1, V] with V = ", v);
  if (side.labels.empty()) return rows;
  int64_t valid = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t y = label_at(side.labels, r);
    if (y == side.ignore_index) continue;
    RT_CHECK(y >= 0 && y < v, what, ": target ", y, " at row ", r, " is outside [0, ", v,
             ") and is not the ignore_index ", side.ignore_index);
    ++valid;
  }
  return valid;
}

void topk_logprobs_rows(const Block& logits, const TopKLogprobsSide& side, const RowOut& out,
                        ThreadPool& pool) {
  const int64_t v = logits.cols, k = side.k;
  RT_ASSERT(side.logprobs.dtype == DType::F32 && side.ids.dtype == DType::I32 && k >= 1 && k <= v);
  pool.parallel_for(
      logits.rows,
      [&](int64_t b, int64_t e) {
        topk::Scratch s;
        std::vector<float> buf(static_cast<size_t>(v));
        float* z = buf.data();
        for (int64_t r = b; r < e; ++r) {
          load_f32_row(logits, r, z);
          const int64_t y = side.labels.empty() ? side.ignore_index : label_at(side.labels, r);
          const bool counts = !side.labels.empty() && y != side.ignore_index;
          const float zy = counts ? z[y] : 0.0f;  // before the selection overwrites z
          float m = 0;
          double log_s = 0;
          if (!topk::select_row(z, v, k, s, &m, &log_s)) not_finite(side, logits, r);
          // A row of -inf only has no distribution: every slot reads as padding (-inf), as in topk_logprobs.
          const bool none = m == -kInf;
          auto* lp = reinterpret_cast<float*>(side.logprobs.row(r));
          auto* ids = reinterpret_cast<int32_t*>(side.ids.row(r));
          for (int64_t j = 0; j < k; ++j) {
            const topk::Entry& en = s.cand[size_t(j)];
            lp[size_t(j) * side.logprobs.col_stride / sizeof(float)] =
                none ? -kInf : float(double(en.v) - double(m) - log_s);
            ids[size_t(j) * side.ids.col_stride / sizeof(int32_t)] = en.id;
          }
          // Shifted by the max so that logits of 1e4 keep their precision: lse − z_y = (m − z_y) + log Σ.
          if (out.lse) out.lse[r] = none ? -kInf : float(double(m) + log_s);
          if (out.loss) out.loss[r] = !counts ? 0.0f : none ? kInf : float((double(m) - double(zy)) + log_s);
        }
      },
      std::max<int64_t>(1, 16384 / v));
}

}  // namespace retort::loss
