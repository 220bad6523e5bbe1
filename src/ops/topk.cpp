// topk_logprobs: the K largest entries of each row of logits as log-softmax values, with their column ids
// (a teacher's top-K next-token candidates). On the CPU, per row: block maxima (vectorized) give the row max
// and a lower bound of the K-th value, the few entries above it are partially sorted (O(V + M log K) for M
// candidates, usually a few more than K), then the exps in place for the log-sum-exp (vectorized, summed in
// double). Rows are split over the thread pool.
//
// Order and ties: larger value first, equal values by smaller id, so the CUDA kernel (which selects on the
// same stored values) gives the same ids bit for bit. -inf entries are ordinary values (logprob -inf); a row
// of -inf only has no distribution: logprobs -inf, ids 0..K-1. NaN and +inf throw.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "../core/error.h"
#include "../core/op_table.h"
#include "../core/thread_pool.h"
#include "cpu_util.h"
#include "ops.h"
#include "topk_select.h"
#include "vec_math.h"

namespace retort {

namespace {

constexpr int kAuxIds = 0;  // aux slot of the ids output

// The candidates for the K best entries of z[0, V) into s.cand, in id order; returns the row max (NaNs
// skipped). The K-th largest block max is a lower bound of the row's K-th value (K blocks hold an entry that
// large), so only entries at least that large, in blocks whose max reaches it, can be among the K best: with
// about 4K blocks, a few more than K entries. Fewer than K candidates means the row holds NaN.
float select_candidates(const float* z, int64_t V, int64_t K, topk::Scratch& s) {
  const int64_t block = std::clamp<int64_t>(V / (4 * K) / 16 * 16, 64, 1024);
  const int64_t nb = (V + block - 1) / block;
  s.block_max.resize(size_t(nb));
  for (int64_t b = 0; b < nb; ++b)
    s.block_max[size_t(b)] = vmath::max(z + b * block, std::min(block, V - b * block));
  const float m = *std::max_element(s.block_max.begin(), s.block_max.end());
  float bound = -std::numeric_limits<float>::infinity();
  if (nb >= K) {
    s.nth = s.block_max;
    std::nth_element(s.nth.begin(), s.nth.begin() + (K - 1), s.nth.end(), std::greater<float>());
    bound = s.nth[size_t(K - 1)];
  }
  s.cand.clear();
  for (int64_t b = 0; b < nb; ++b) {
    if (!(s.block_max[size_t(b)] >= bound)) continue;
    for (int64_t i = b * block; i < std::min(V, (b + 1) * block); ++i)
      if (z[i] >= bound) s.cand.push_back({z[i], int32_t(i)});
  }
  return m;
}

}  // namespace

bool topk::select_row(float* z, int64_t V, int64_t K, Scratch& s, float* m, double* log_s) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  *m = select_candidates(z, V, K, s);
  *log_s = 0;
  if (*m == kInf || int64_t(s.cand.size()) < K) return false;
  std::partial_sort(s.cand.begin(), s.cand.begin() + K, s.cand.end(), topk::better);
  if (*m == -kInf) {
    for (int64_t i = 0; i < V; ++i)
      if (std::isnan(z[i])) return false;
    return true;
  }
  // exp(z - m) in place (the selection is done): a NaN stays NaN there, so its column can be found.
  const double sum = vmath::exp_affine(z, z, V, *m, 1.0f, 0.0f, 1.0f, 0.0f);
  if (std::isnan(sum)) return false;
  *log_s = std::log(sum);
  return true;
}

namespace {

[[noreturn]] void not_finite(const Tensor* x, int64_t r, const float* row, int64_t V) {
  int64_t c = 0;
  while (c < V && !(std::isnan(row[c]) || row[c] == std::numeric_limits<float>::infinity())) ++c;
  RT_FAIL("topk_logprobs: row ", r, " of logits ", x->describe(), " holds ",
          c < V && std::isnan(row[c]) ? "NaN" : "+inf", " at column ", c, " (logits must be finite or -inf)");
}

void cpu_topk_logprobs(Tensor* t, ThreadPool& pool) {
  const Tensor* x = t->src[0];
  const int64_t V = x->ne[0], N = x->ne[1], K = t->ip[0];
  float* lp = static_cast<float*>(t->data);
  int32_t* ids = static_cast<int32_t*>(t->aux[kAuxIds]->data);
  const int64_t min_chunk = std::max<int64_t>(1, 16384 / V);
  pool.parallel_for(
      N,
      [&](int64_t b, int64_t e) {
        topk::Scratch s;
        std::vector<float> zbuf(static_cast<size_t>(V));
        float* z = zbuf.data();
        for (int64_t r = b; r < e; ++r) {
          cpu::load_row(x, r, z);
          float m = 0;
          double log_s = 0;
          if (!topk::select_row(z, V, K, s, &m, &log_s)) not_finite(x, r, z, V);
          for (int64_t k = 0; k < K; ++k) {
            const topk::Entry& en = s.cand[size_t(k)];
            // A row of -inf only has no distribution: every slot reads as padding (-inf).
            lp[r * K + k] = m == -std::numeric_limits<float>::infinity()
                                ? -std::numeric_limits<float>::infinity()
                                : float(double(en.v) - double(m) - log_s);
            ids[r * K + k] = en.id;
          }
        }
      },
      min_chunk);
}

}  // namespace

TopKLogprobs topk_logprobs(Context& ctx, Tensor* logits, int64_t k) {
  RT_CHECK(logits != nullptr, "topk_logprobs: logits are null");
  RT_CHECK(is_float(logits->dtype), "topk_logprobs: logits must be f32, bf16 or f16, got ",
           logits->describe());
  RT_CHECK(logits->ne[2] == 1 && logits->ne[3] == 1,
           "topk_logprobs: logits must be 2-D [N, V] (reshape [B, T, V] to [B*T, V] first), got ",
           logits->describe());
  const int64_t V = logits->ne[0];
  RT_CHECK(k >= 1 && k <= V, "topk_logprobs: K = ", k, " must be in [1, V] with V = ", V, " (logits ",
           logits->describe(), ")");
  RT_CHECK(V <= std::numeric_limits<int32_t>::max(), "topk_logprobs: V = ", V,
           " does not fit the i32 ids (logits ", logits->describe(), ")");
  int64_t ne[kMaxDims] = {k, logits->ne[1], 1, 1};
  Tensor* t = ctx.node(Op::TopKLogprobs, DType::F32, ne);
  t->src[0] = logits;
  t->ip[0] = k;
  Tensor* ids = ctx.node(Op::AuxOutput, DType::I32, ne);
  ids->src[0] = t;
  ids->flags |= kOutput;  // read by name after the run: never reuse its memory
  t->aux[kAuxIds] = ids;
  return {t, ids};
}

void register_topk_ops(OpTable& t) {
  // Not differentiable: a selection has no useful gradient, so backward() through it throws.
  t[size_t(Op::TopKLogprobs)] = {cpu_topk_logprobs, nullptr, false};
}

}  // namespace retort
