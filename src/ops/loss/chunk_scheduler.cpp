// The chunk loop of the fused linear losses (see chunk_scheduler.h). Backend-neutral: everything that
// touches data goes through the ChunkExecutor.
#include "chunk_scheduler.h"

#include <algorithm>

#include "../../core/dtype.h"
#include "../../core/error.h"

namespace retort::loss {

const char* loss_kind_name(LossKind k) {
  switch (k) {
    case LossKind::CrossEntropy:
      return "cross_entropy";
    case LossKind::TopK:
      return "topk_kd";
    case LossKind::Distill:
      return "distill";
    case LossKind::Entropy:
      return "entropy";
    case LossKind::SelectiveLogSoftmax:
      return "selective_log_softmax";
  }
  return "?";
}

SelectiveSide SelectiveSide::sub_rows(int64_t r0, int64_t n) const {
  SelectiveSide s = *this;
  s.ids = ids.sub_rows(r0, n);
  s.values = values.sub_rows(r0, n);
  if (lse) s.lse = lse + r0;
  return s;
}

LossSpec LossSpec::sub_rows(int64_t r0, int64_t n) const {
  LossSpec s = *this;
  switch (kind) {
    case LossKind::CrossEntropy:
      s.ce = ce.sub_rows(r0, n);
      break;
    case LossKind::TopK:
      s.topk = topk.sub_rows(r0, n);
      break;
    case LossKind::Distill:
      s.distill = distill.sub_rows(r0, n);
      break;
    case LossKind::Entropy:
      break;
    case LossKind::SelectiveLogSoftmax:
      s.selective = selective.sub_rows(r0, n);
      break;
  }
  return s;
}

namespace {

constexpr size_t kAlign = 256;

size_t align_up(size_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}

// The loss reads only the K student logits at the teacher ids: Q normalized over the valid slots, no hard
// loss (it needs the full row's LSE), and neither the full-vocabulary LSE nor a hard part reported.
bool sparse_topk(const FusedLinearProblem& p) {
  if (p.spec.kind != LossKind::TopK) return false;
  const TopKSide& s = p.spec.topk;
  if (!s.normalize_topk || s.w_hard != 0.0f || s.ids.empty()) return false;
  if (p.lse) return false;
  if (p.hard && !s.labels.empty()) return false;
  return true;
}

bool reduced(const FusedLinearProblem& p) {
  return p.reduction != Reduction::None && p.spec.kind != LossKind::SelectiveLogSoftmax;
}

// Per-row buffers the scheduler must provide itself: the per-row loss (and parts) that a Mean / Sum reduces
// when the caller did not ask to see them.
struct RowBuffers {
  bool loss = false, hard = false, soft = false;
  int64_t count() const { return int64_t(loss) + int64_t(hard) + int64_t(soft); }
};

RowBuffers row_buffers(const FusedLinearProblem& p) {
  RowBuffers b;
  if (!reduced(p)) return b;
  b.loss = p.loss && !p.per_row;
  b.hard = p.hard != nullptr;
  b.soft = p.soft != nullptr;
  return b;
}

Block f32_rows(void* data, int64_t rows, int64_t cols, int64_t ld) {
  return {data, DType::F32, rows, cols, size_t(ld) * sizeof(float), sizeof(float)};
}

// A row-major [rows, cols] block of dtype dt with ld elements between rows.
Block rows_of(void* data, DType dt, int64_t rows, int64_t cols, int64_t ld) {
  const size_t es = dtype_size(dt);
  return {data, dt, rows, cols, size_t(ld) * es, es};
}

// The problem asks for 16-bit logits and may have them (the executor's answer aside): a dense path (the
// K-sparse one has no logits block) and not selective log-softmax, whose backward reads f32 log-probs.
bool wants_16bit_logits(const FusedLinearProblem& p) {
  return p.logits_dtype != DType::F32 && !sparse_topk(p) && p.spec.kind != LossKind::SelectiveLogSoftmax;
}

}  // namespace

// Bytes of a zero-padded [Vp, cols] copy of w, or 0 when w cannot be padded (its pad rows must be whole
// floats so that zero() can clear them).
size_t padded_bytes(const Block& w, int64_t vp) {
  const size_t row = size_t(w.cols) * dtype_size(w.dtype);
  if (row % sizeof(float) != 0) return 0;
  return align_up(size_t(vp) * row);
}

ChunkPlan plan_chunks(const FusedLinearProblem& p, bool pad_weights, size_t shadow, bool logits16) {
  ChunkPlan plan;
  const size_t total = p.memory_budget > 0 ? p.memory_budget : kFusedLinearAutoMin;
  const int64_t n = p.hidden.rows, v = p.weight.rows;
  plan.padded_vocab = (v + kVocabPad - 1) / kVocabPad * kVocabPad;
  plan.sparse = sparse_topk(p);
  const bool low = logits16 && wants_16bit_logits(p);
  if (low) plan.logits_dtype = p.logits_dtype;
  // Bytes per chunk row: the logits (or the K gathered logits) and the teacher's logits when online.
  size_t per_row = 0;
  if (plan.sparse) {
    per_row = size_t(p.spec.topk.logprobs.cols) * sizeof(float);
  } else {
    per_row = size_t(plan.padded_vocab) * dtype_size(plan.logits_dtype) * (p.online_teacher() ? 2 : 1);
  }
  // The budget also covers what the executor keeps beside the scratch per row (not allocated here); 16-bit
  // logits take their gradient in place, so no executor copy is kept for them.
  const size_t budget_per_row =
      per_row + (!plan.sparse && !low && p.wants_grad() ? size_t(plan.padded_vocab) * shadow : 0);
  size_t pad_bytes = 0;
  if (pad_weights && !plan.sparse && plan.padded_vocab > v) {
    const size_t ws = padded_bytes(p.weight, plan.padded_vocab);
    const size_t ts = p.online_teacher() ? padded_bytes(p.teacher_weight, plan.padded_vocab) : 0;
    // Unaligned GEMMs run several times slower than aligned ones (bench/RESULTS.md, "Fast by default"), so
    // the copies are worth most of the budget: pad whenever a chunk of kRowAlign rows (or all rows) still fits.
    const size_t keep = size_t(std::min<int64_t>(n, kRowAlign)) * budget_per_row;
    if (ws > 0 && (!p.online_teacher() || ts > 0) && ws + ts + keep <= total) {
      plan.pad_weights = true;
      pad_bytes = ws + ts;
    }
  }
  const size_t budget = total - pad_bytes;
  int64_t rows = p.chunk_rows > 0 ? p.chunk_rows : int64_t(std::max<size_t>(1, budget / budget_per_row));
  if (p.chunk_rows <= 0 && rows < n) {
    // As few chunks as the budget allows, of even size (no short tail chunk), rounded up to a multiple of
    // kRowAlign rows when that still fits: the GEMMs' row tiles are then full, and a [C, H] dhidden output
    // does not spill a few tiles into one more wave (2,093 rows of H = 2,048 make 136 tiles of 128 x 256
    // on 132 SMs; 2,048 rows make 128).
    const int64_t chunks = (n + rows - 1) / rows;
    const int64_t even = (n + chunks - 1) / chunks;
    const int64_t aligned = (even + kRowAlign - 1) / kRowAlign * kRowAlign;
    rows = aligned <= rows ? aligned : even;
  }
  plan.chunk_rows = std::clamp<int64_t>(rows, 1, n);
  const size_t chunk_bytes = align_up(size_t(plan.chunk_rows) * per_row);
  plan.scratch_bytes = chunk_bytes + size_t(row_buffers(p).count()) * align_up(size_t(n) * sizeof(float));
  plan.scratch_bytes += pad_bytes;
  return plan;
}

void run_fused_linear(ChunkExecutor& ex, const FusedLinearProblem& problem) {
  FusedLinearProblem p = problem;
  if (p.memory_budget == kFusedLinearAutoBudget) p.memory_budget = ex.auto_budget();
  const int64_t n = p.hidden.rows, v = p.weight.rows;
  RT_ASSERT(n > 0 && v > 0 && p.weight.cols == p.hidden.cols);
  const LossKind kind = p.spec.kind;
  const bool online = p.online_teacher();
  RT_ASSERT(!online || (kind == LossKind::Distill && p.teacher_weight.rows == v &&
                        p.teacher_hidden.rows == n && p.teacher_hidden.cols == p.teacher_weight.cols));
  const bool grad = p.wants_grad();
  RT_ASSERT(!grad || kind != LossKind::SelectiveLogSoftmax || p.spec.selective.lse);

  // Validation first: nothing is written when the side data is bad, and the mean's divisor is known before
  // the first chunk, so every gradient is scaled in the row loss's own pass.
  const bool red = reduced(p);
  const bool mean = red && p.reduction == Reduction::Mean;
  const int64_t valid = ex.validate(p.spec, n, v, red ? p.reduction : Reduction::None, p.what);
  RT_ASSERT(valid >= 0 || valid == ChunkExecutor::kCountOnDevice);
  float inv = 1.0f;  // kCountOnDevice: the executor applies 1/count itself
  if (mean && valid != ChunkExecutor::kCountOnDevice) inv = valid > 0 ? 1.0f / float(valid) : 0.0f;

  // 16-bit logits when asked for and the executor can compute them for every logits GEMM.
  bool logits16 = false;
  if (wants_16bit_logits(p)) {
    logits16 = ex.supports_16bit_logits(p.logits_dtype, p.hidden.dtype, p.weight.dtype);
    if (online)
      logits16 = logits16 &&
                 ex.supports_16bit_logits(p.logits_dtype, p.teacher_hidden.dtype, p.teacher_weight.dtype);
  }
  // Chunks an executor may run whole (ChunkExecutor::softmax_chunk); when it takes all of them, W needs no
  // padded copy.
  const bool offer_softmax = (kind == LossKind::CrossEntropy || kind == LossKind::TopK) && p.bias.empty() &&
                             p.dbias.empty() && !online && !sparse_topk(p);
  // The whole problem as one job: asked about before planning, then cut per chunk.
  SoftmaxChunk whole;
  whole.hidden = p.hidden;
  whole.weight = p.weight;
  whole.v = v;
  whole.vp = (v + kVocabPad - 1) / kVocabPad * kVocabPad;
  whole.spec = p.spec;
  whole.grad = grad;
  if (grad) whole.row_upstream = p.row_upstream;
  whole.dhidden = p.dhidden;
  whole.accumulate_dhidden = p.accumulate_dhidden;
  whole.dweight = p.dweight;
  whole.accumulate_dweight = p.accumulate_dweight;
  const bool softmax_all = offer_softmax && ex.softmax_whole(whole);
  const ChunkPlan plan =
      plan_chunks(p, ex.pads_vocab() && !softmax_all, ex.shadow_bytes_per_logit(), logits16);
  const int64_t c_max = plan.chunk_rows, vp = plan.padded_vocab;
  const DType ldt = plan.logits_dtype;
  char* base = static_cast<char*>(ex.scratch(plan.scratch_bytes));
  size_t off = 0;
  auto carve = [&](size_t bytes) {
    char* q = base + off;
    off += align_up(bytes);
    RT_ASSERT(off <= plan.scratch_bytes);
    return q;
  };
  const int64_t kk = plan.sparse ? p.spec.topk.logprobs.cols : 0;
  // Student logits [C, Vp] (gathered [C, K] f32 on the sparse path) and the teacher's [C, Vp] after them.
  // With 16-bit logits a row is Vp·2 bytes, a multiple of 256: the teacher's block stays aligned.
  const size_t logits_bytes = size_t(c_max) * (plan.sparse ? size_t(kk) : size_t(vp)) * dtype_size(ldt);
  char* chunk = carve(online ? 2 * logits_bytes : logits_bytes);
  char* logits_buf = chunk;
  char* teacher_buf = online ? chunk + logits_bytes : nullptr;

  // The GEMMs' view of the weights and of the vocabulary: padded to Vp when the executor wants it.
  const int64_t vg = plan.pad_weights ? vp : v;
  auto padded = [&](const Block& w) {
    if (!plan.pad_weights) return w;
    const size_t es = dtype_size(w.dtype), row = size_t(w.cols) * es;
    char* q = carve(size_t(vp) * row);
    const Block dst{q, w.dtype, vp, w.cols, row, es};
    ex.copy(w, dst.sub_rows(0, v));
    ex.zero(Block{q + size_t(v) * row, DType::F32, vp - v, int64_t(row / sizeof(float)), row, sizeof(float)});
    return dst;
  };
  const Block weight_g = padded(p.weight);
  const Block teacher_weight_g = online ? padded(p.teacher_weight) : Block{};

  // Per-row outputs over all N rows; sub_rows() cuts them per chunk.
  const RowBuffers rb = row_buffers(p);
  RowOut all;
  if (kind != LossKind::SelectiveLogSoftmax) {
    if (!red)
      all.loss = p.loss;
    else
      all.loss = rb.loss ? reinterpret_cast<float*>(carve(size_t(n) * sizeof(float))) : p.per_row;
    all.hard = !red ? p.hard : rb.hard ? reinterpret_cast<float*>(carve(size_t(n) * sizeof(float))) : nullptr;
    all.soft = !red ? p.soft : rb.soft ? reinterpret_cast<float*>(carve(size_t(n) * sizeof(float))) : nullptr;
  }
  all.lse = p.lse;
  all.grad_scale = p.grad_scale * inv;

  for (int64_t r0 = 0; r0 < n; r0 += c_max) {
    const int64_t c = std::min(c_max, n - r0);
    const bool first = r0 == 0;
    const Block hc = p.hidden.sub_rows(r0, c);
    LossSpec spec = p.spec.sub_rows(r0, c);
    RowOut out = all.sub_rows(r0, c);

    if (plan.sparse) {
      const Block g = f32_rows(logits_buf, c, kk, kk);
      // The first chunk overwrites dW and dbias (zero where no slot points) unless they are accumulators.
      SparseGrads sg;
      sg.dhidden = p.dhidden.sub_rows(r0, c);
      sg.dweight = p.dweight;
      sg.dbias = p.dbias;
      sg.accumulate_dhidden = p.accumulate_dhidden;
      sg.accumulate_dweight = !first || p.accumulate_dweight;
      sg.accumulate_dbias = !first || p.accumulate_dbias;
      if (grad && p.row_upstream.empty() && !sg.dhidden.empty() && !out.hard) {
        RowOut fo = out;
        fo.grad = g;
        if (ex.sparse_fused(hc, p.weight, p.bias, spec.topk, g, fo, sg.dhidden, sg.accumulate_dhidden)) {
          sg.dhidden = Block{};
          if (!sg.dweight.empty() || !sg.dbias.empty()) ex.scatter_grads(g, hc, p.weight, spec.topk, sg);
          continue;
        }
      }
      ex.gather_logits(hc, p.weight, p.bias, spec.topk, g);
      // The row loss sees the gathered block: slot k is column k, normalized over the valid slots.
      LossSpec gathered = spec;
      gathered.topk.ids = Block{};
      if (grad) out.grad = g;
      ex.row_loss(gathered, g, out);
      if (!grad) continue;
      if (!p.row_upstream.empty()) ex.scale_rows(g, p.row_upstream.sub_rows(r0, c));
      ex.scatter_grads(g, hc, p.weight, spec.topk, sg);
      continue;
    }

    if (offer_softmax) {
      SoftmaxChunk job = whole;
      job.hidden = hc;
      job.weight = weight_g;
      job.logits = logits_buf;
      job.logits_dtype = ldt;
      job.spec = spec;
      job.out = out;
      job.row_upstream = whole.row_upstream.sub_rows(r0, c);
      job.dhidden = whole.dhidden.sub_rows(r0, c);
      job.accumulate_dweight = !first || p.accumulate_dweight;
      if (ex.softmax_chunk(job)) continue;
    }

    // The pad columns (when padded) are written by the logits GEMM only: h·0 = 0 from the zero W rows, in
    // any dtype. Bias, row loss and scale_rows touch the first V columns.
    const Block logits = rows_of(logits_buf, ldt, c, v, vp);
    const Block logits_g = rows_of(logits_buf, ldt, c, vg, vp);  // with the pad columns when padded
    const Block teacher = online ? rows_of(teacher_buf, ldt, c, v, vp) : Block{};
    const Block teacher_g = online ? rows_of(teacher_buf, ldt, c, vg, vp) : Block{};
    if (online) spec.distill.teacher = teacher;
    if (grad) out.grad = logits;  // in place: each row is read before its gradient overwrites it

    // Pieces of the chunk (see ChunkExecutor::overlap_pieces): logits GEMMs on lane 0, the row loss of each
    // piece on lane 1 once its logits are there. One piece: everything in order on lane 0.
    const int pieces = int(std::clamp<int64_t>(ex.overlap_pieces(c, ldt), 1, c));
    const int64_t step = (c + pieces - 1) / pieces;
    int64_t last_row_fence = 0, before_last_fence = 0;
    int64_t last_r0 = 0;
    for (int64_t q0 = 0; q0 < c; q0 += step) {
      const int64_t qn = std::min(step, c - q0);
      ex.gemm(hc.sub_rows(q0, qn), false, weight_g, true, logits_g.sub_rows(q0, qn), 1.0f, 0.0f);
      if (!p.bias.empty()) ex.add_bias(logits.sub_rows(q0, qn), p.bias);
      if (online) {
        ex.gemm(p.teacher_hidden.sub_rows(r0 + q0, qn), false, teacher_weight_g, true,
                teacher_g.sub_rows(q0, qn), 1.0f, 0.0f);
        if (!p.teacher_bias.empty()) ex.add_bias(teacher.sub_rows(q0, qn), p.teacher_bias);
      }
      if (pieces > 1) {
        const int64_t f = ex.fence();
        ex.set_lane(1);
        ex.wait(f);
      }
      ex.row_loss(q0 == 0 && qn == c ? spec : spec.sub_rows(q0, qn), logits.sub_rows(q0, qn),
                  q0 == 0 && qn == c ? out : out.sub_rows(q0, qn));
      if (grad && !p.row_upstream.empty())
        ex.scale_rows(logits.sub_rows(q0, qn), p.row_upstream.sub_rows(r0 + q0, qn));
      if (pieces > 1) {
        before_last_fence = last_row_fence;
        last_row_fence = ex.fence();
        ex.set_lane(0);
      }
      last_r0 = q0;
    }
    // From here on lane 0 again: the gradient GEMMs read the row losses' gradients.
    if (!grad) {
      if (pieces > 1) ex.wait(last_row_fence);  // the next chunk's GEMM overwrites the logits
      continue;
    }
    // The pad columns of the gradient are the GEMM's zeros (the row loss writes only V columns).
    if (!p.dhidden.empty()) {
      const float beta = p.accumulate_dhidden ? 1.0f : 0.0f;
      const Block dh = p.dhidden.sub_rows(r0, c);
      if (pieces > 1 && last_r0 > 0) {  // the first pieces while the last one's row loss runs
        ex.wait(before_last_fence);
        ex.gemm(logits_g.sub_rows(0, last_r0), false, weight_g, false, dh.sub_rows(0, last_r0), 1.0f, beta);
        ex.wait(last_row_fence);
        ex.gemm(logits_g.sub_rows(last_r0, c - last_r0), false, weight_g, false,
                dh.sub_rows(last_r0, c - last_r0), 1.0f, beta);
      } else {
        if (pieces > 1) ex.wait(last_row_fence);
        ex.gemm(logits_g, false, weight_g, false, dh, 1.0f, beta);
      }
    } else if (pieces > 1) {
      ex.wait(last_row_fence);
    }
    if (!p.dweight.empty())
      ex.gemm(logits, true, hc, false, p.dweight, 1.0f, first && !p.accumulate_dweight ? 0.0f : 1.0f);
    if (!p.dbias.empty()) ex.column_sums(logits, p.dbias, !first || p.accumulate_dbias);
  }

  if (!red) return;
  if (p.loss) ex.reduce(all.loss, n, inv, p.loss);
  if (p.hard) ex.reduce(all.hard, n, inv, p.hard);
  if (p.soft) ex.reduce(all.soft, n, inv, p.soft);
}

}  // namespace retort::loss
