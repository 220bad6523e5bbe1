// topk_logprobs: the K largest entries of each row of logits as log-softmax values, with their column ids
// (a teacher's top-K next-token candidates). One pass per row on the CPU: the row max (vectorized), a
// selection of the K best with a heap of K entries that only the rare entry above its worst enters
// (O(V + hits·log K)), then the exps in place for the log-sum-exp (vectorized, summed in double).
//
// Order and ties: larger value first, equal values by smaller id, so the CUDA kernel (which selects on the
// same stored values) gives the same ids bit for bit. -inf entries are ordinary values (logprob -inf); a row
// of -inf only has no distribution: logprobs -inf, ids 0..K-1. NaN and +inf throw.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "../core/error.h"
#include "../core/op_table.h"
#include "../core/thread_pool.h"
#include "cpu_util.h"
#include "ops.h"
#include "vec_math.h"

namespace retort {

namespace {

constexpr int kAuxIds = 0;  // aux slot of the ids output

struct Entry {
  float v;
  int32_t id;
};

// a comes before b in the output: the larger value, then the smaller id.
inline bool better(const Entry& a, const Entry& b) {
  return a.v > b.v || (a.v == b.v && a.id < b.id);
}

[[noreturn]] void not_finite(const Tensor* x, int64_t r, const float* row, int64_t V) {
  int64_t c = 0;
  while (c < V && !(std::isnan(row[c]) || row[c] == std::numeric_limits<float>::infinity())) ++c;
  RT_FAIL("topk_logprobs: row ", r, " of logits ", x->describe(), " holds ",
          c < V && std::isnan(row[c]) ? "NaN" : "+inf", " at column ", c, " (logits must be finite or -inf)");
}

// The K best entries of z[0, V) into heap (best first). The heap keeps its worst entry on top; entries are
// offered in id order, so one equal to the worst never displaces it (the worst has the smaller id).
void select_top(const float* z, int64_t V, int64_t K, std::vector<Entry>& heap) {
  heap.clear();
  for (int64_t i = 0; i < K; ++i) heap.push_back({z[i], int32_t(i)});
  std::make_heap(heap.begin(), heap.end(), better);
  float worst = heap.front().v;
  // Blocks whose max does not beat the worst are skipped with one vectorized max (NaNs read as not better,
  // like the comparison below; a NaN row is refused afterwards anyway).
  constexpr int64_t kBlock = 64;
  for (int64_t i = K; i < V;) {
    const int64_t end = std::min(V, (i / kBlock + 1) * kBlock);
    if (end - i == kBlock && !(vmath::max(z + i, kBlock) > worst)) {
      i = end;
      continue;
    }
    for (; i < end; ++i)
      if (z[i] > worst) {
        std::pop_heap(heap.begin(), heap.end(), better);
        heap.back() = {z[i], int32_t(i)};
        std::push_heap(heap.begin(), heap.end(), better);
        worst = heap.front().v;
      }
  }
  std::sort(heap.begin(), heap.end(), better);
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
        std::vector<float> z(static_cast<size_t>(V));
        std::vector<Entry> heap;
        heap.reserve(size_t(K));
        for (int64_t r = b; r < e; ++r) {
          cpu::load_row(x, r, z.data());
          const float m = vmath::max(z.data(), V);  // NaNs skipped; found by the sum below
          if (m == std::numeric_limits<float>::infinity()) not_finite(x, r, z.data(), V);
          select_top(z.data(), V, K, heap);
          double log_s = 0;
          if (m == -std::numeric_limits<float>::infinity()) {
            for (int64_t i = 0; i < V; ++i)
              if (std::isnan(z[size_t(i)])) not_finite(x, r, z.data(), V);
          } else {
            // exp(z - m) in place (the selection is done): a NaN stays NaN there, so its column is found.
            const double s = vmath::exp_affine(z.data(), z.data(), V, m, 1.0f, 0.0f, 1.0f, 0.0f);
            if (std::isnan(s)) not_finite(x, r, z.data(), V);
            log_s = std::log(s);
          }
          for (int64_t k = 0; k < K; ++k) {
            const Entry& en = heap[size_t(k)];
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
  t[size_t(Op::TopKLogprobs)] = {"topk_logprobs", cpu_topk_logprobs, nullptr, false};
}

}  // namespace retort
