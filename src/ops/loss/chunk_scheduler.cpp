// The chunk loop of the fused linear losses (see chunk_scheduler.h). Backend-neutral: everything that
// touches data goes through the ChunkExecutor.
#include "chunk_scheduler.h"

#include <algorithm>

#include "../../core/dtype.h"
#include "../../core/error.h"

namespace retort::loss {

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
  const size_t total = p.logits_budget > 0 ? p.logits_budget : kFusedLinearAutoMin;
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
    // the copies are worth most of the budget: pad whenever a chunk of kRowAlign rows (or all rows) still
    // fits.
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

namespace {

// 16-bit logits when asked for and the executor can compute them for every logits GEMM: both operands of
// the student's (and an online teacher's) GEMM of the logits' dtype.
bool use_16bit_logits(const FusedLinearProblem& p, const ExecutorCaps& caps) {
  if (!wants_16bit_logits(p) || !caps.logits16) return false;
  auto same = [&](const Block& a, const Block& b) {
    return a.dtype == p.logits_dtype && b.dtype == p.logits_dtype;
  };
  return same(p.hidden, p.weight) && (!p.online_teacher() || same(p.teacher_hidden, p.teacher_weight));
}

// The whole problem as one dense fast-path job: asked about before planning, then cut per chunk.
SoftmaxChunk whole_job(const FusedLinearProblem& p) {
  SoftmaxChunk whole;
  whole.hidden = p.hidden;
  whole.weight = p.weight;
  whole.v = p.weight.rows;
  whole.vp = (whole.v + kVocabPad - 1) / kVocabPad * kVocabPad;
  whole.spec = p.spec;
  whole.grad = p.wants_grad();
  if (whole.grad) whole.row_upstream = p.row_upstream;
  whole.dhidden = p.dhidden;
  whole.accumulate_dhidden = p.accumulate_dhidden;
  whole.dweight = p.dweight;
  whole.accumulate_dweight = p.accumulate_dweight;
  return whole;
}

// One problem's run: the plan, the scratch carved from it, and the per-chunk steps.
class ChunkRun {
 public:
  ChunkRun(ChunkExecutor& ex, const FusedLinearProblem& p, float inv) : ex_(ex), p_(p) {
    const ExecutorCaps caps = ex.caps();
    const LossKind kind = p.spec.kind;
    // Chunks an executor may run whole; when it takes all of them, W needs no padded copy.
    offer_dense_ = (kind == LossKind::CrossEntropy || kind == LossKind::TopK) && p.bias.empty() &&
                   p.dbias.empty() && !p.online_teacher() && !sparse_topk(p);
    whole_ = whole_job(p);
    FastPath ask;
    ask.kind = FastPath::Kind::DenseWhole;
    ask.dense = whole_;
    const bool dense_all = offer_dense_ && ex.fast_path(ask);
    plan_ =
        plan_chunks(p, caps.pads_vocab && !dense_all, caps.shadow_bytes_per_logit, use_16bit_logits(p, caps));
    ex.gradient_may_round_to(wants_16bit_logits(p) && plan_.logits_dtype == DType::F32 ? p.logits_dtype
                                                                                       : DType::F32);
    base_ = static_cast<char*>(ex.scratch(plan_.scratch_bytes));
    carve_buffers(inv);
  }

  void chunk(int64_t r0) {
    const int64_t c = std::min(plan_.chunk_rows, p_.hidden.rows - r0);
    if (plan_.sparse)
      sparse(r0, c);
    else
      dense(r0, c);
  }
  int64_t chunk_rows() const { return plan_.chunk_rows; }
  const RowOut& all() const { return all_; }

 private:
  char* carve(size_t bytes) {
    char* q = base_ + off_;
    off_ += align_up(bytes);
    RT_ASSERT(off_ <= plan_.scratch_bytes);
    return q;
  }
  // W (or the teacher's) as the GEMMs see it: copied into zero-padded [Vp, H] scratch when the plan pads.
  Block padded(const Block& w) {
    if (!plan_.pad_weights) return w;
    const int64_t vp = plan_.padded_vocab, v = w.rows;
    const size_t es = dtype_size(w.dtype), row = size_t(w.cols) * es;
    char* q = carve(size_t(vp) * row);
    const Block dst{q, w.dtype, vp, w.cols, row, es};
    ex_.copy(w, dst.sub_rows(0, v));
    ex_.zero(
        Block{q + size_t(v) * row, DType::F32, vp - v, int64_t(row / sizeof(float)), row, sizeof(float)});
    return dst;
  }
  float* row_buffer() { return reinterpret_cast<float*>(carve(size_t(p_.hidden.rows) * sizeof(float))); }

  void carve_buffers(float inv) {
    const bool online = p_.online_teacher();
    const int64_t kk = plan_.sparse ? p_.spec.topk.logprobs.cols : 0;
    // Student logits [C, Vp] (gathered [C, K] f32 on the sparse path) and the teacher's [C, Vp] after them.
    // With 16-bit logits a row is Vp·2 bytes, a multiple of 256: the teacher's block stays aligned.
    const size_t logits_bytes = size_t(plan_.chunk_rows) *
                                (plan_.sparse ? size_t(kk) : size_t(plan_.padded_vocab)) *
                                dtype_size(plan_.logits_dtype);
    logits_buf_ = carve(online ? 2 * logits_bytes : logits_bytes);
    teacher_buf_ = online ? logits_buf_ + logits_bytes : nullptr;
    weight_g_ = padded(p_.weight);
    if (online) teacher_weight_g_ = padded(p_.teacher_weight);
    // Per-row outputs over all N rows; sub_rows() cuts them per chunk.
    const bool red = reduced(p_);
    const RowBuffers rb = row_buffers(p_);
    if (p_.spec.kind != LossKind::SelectiveLogSoftmax) {
      all_.loss = !red ? p_.loss : rb.loss ? row_buffer() : p_.per_row;
      all_.hard = !red ? p_.hard : rb.hard ? row_buffer() : nullptr;
      all_.soft = !red ? p_.soft : rb.soft ? row_buffer() : nullptr;
    }
    all_.lse = p_.lse;
    all_.grad_scale = p_.grad_scale * inv;
  }

  void sparse(int64_t r0, int64_t c) {
    const int64_t kk = p_.spec.topk.logprobs.cols;
    const bool first = r0 == 0, grad = p_.wants_grad();
    const Block hc = p_.hidden.sub_rows(r0, c);
    const LossSpec spec = p_.spec.sub_rows(r0, c);
    RowOut out = all_.sub_rows(r0, c);
    const Block g = f32_rows(logits_buf_, c, kk, kk);
    // The first chunk overwrites dW and dbias (zero where no slot points) unless they are accumulators.
    SparseGrads sg;
    sg.dhidden = p_.dhidden.sub_rows(r0, c);
    sg.dweight = p_.dweight;
    sg.dbias = p_.dbias;
    sg.accumulate_dhidden = p_.accumulate_dhidden;
    sg.accumulate_dweight = !first || p_.accumulate_dweight;
    sg.accumulate_dbias = !first || p_.accumulate_dbias;
    if (grad && p_.row_upstream.empty() && !sg.dhidden.empty() && !out.hard) {
      FastPath job;
      job.kind = FastPath::Kind::SparseChunk;
      job.sparse = {hc, p_.weight, p_.bias, spec.topk, g, out, sg.dhidden, sg.accumulate_dhidden};
      job.sparse.out.grad = g;
      if (ex_.fast_path(job)) {
        sg.dhidden = Block{};
        if (!sg.dweight.empty() || !sg.dbias.empty()) ex_.scatter_grads(g, hc, p_.weight, spec.topk, sg);
        return;
      }
    }
    ex_.gather_logits(hc, p_.weight, p_.bias, spec.topk, g);
    // The row loss sees the gathered block: slot k is column k, normalized over the valid slots.
    LossSpec gathered = spec;
    gathered.topk.ids = Block{};
    if (grad) out.grad = g;
    ex_.row_loss(gathered, g, out);
    if (!grad) return;
    if (!p_.row_upstream.empty()) ex_.scale_rows(g, p_.row_upstream.sub_rows(r0, c));
    ex_.scatter_grads(g, hc, p_.weight, spec.topk, sg);
  }

  void dense(int64_t r0, int64_t c) {
    const bool first = r0 == 0, grad = p_.wants_grad(), online = p_.online_teacher();
    const int64_t v = p_.weight.rows, vp = plan_.padded_vocab, vg = plan_.pad_weights ? vp : v;
    const DType ldt = plan_.logits_dtype;
    const Block hc = p_.hidden.sub_rows(r0, c);
    LossSpec spec = p_.spec.sub_rows(r0, c);
    RowOut out = all_.sub_rows(r0, c);
    if (offer_dense_) {
      FastPath job;
      job.dense = whole_;
      job.dense.hidden = hc;
      job.dense.weight = weight_g_;
      job.dense.logits = logits_buf_;
      job.dense.logits_dtype = ldt;
      job.dense.spec = spec;
      job.dense.out = out;
      job.dense.row_upstream = whole_.row_upstream.sub_rows(r0, c);
      job.dense.dhidden = whole_.dhidden.sub_rows(r0, c);
      job.dense.accumulate_dweight = !first || p_.accumulate_dweight;
      if (ex_.fast_path(job)) return;
    }
    // The pad columns (when padded) are written by the logits GEMM only: h·0 = 0 from the zero W rows, in
    // any dtype. Bias, row loss and scale_rows touch the first V columns.
    const Block logits = rows_of(logits_buf_, ldt, c, v, vp);
    const Block logits_g = rows_of(logits_buf_, ldt, c, vg, vp);  // with the pad columns when padded
    ex_.gemm(hc, false, weight_g_, true, logits_g, 1.0f, 0.0f);
    if (!p_.bias.empty()) ex_.add_bias(logits, p_.bias);
    if (online) {
      const Block teacher = rows_of(teacher_buf_, ldt, c, v, vp);
      ex_.gemm(p_.teacher_hidden.sub_rows(r0, c), false, teacher_weight_g_, true,
               rows_of(teacher_buf_, ldt, c, vg, vp), 1.0f, 0.0f);
      if (!p_.teacher_bias.empty()) ex_.add_bias(teacher, p_.teacher_bias);
      spec.distill.teacher = teacher;
    }
    if (grad) out.grad = logits;  // in place: each row is read before its gradient overwrites it
    ex_.row_loss(spec, logits, out);
    if (!grad) return;
    if (!p_.row_upstream.empty()) ex_.scale_rows(logits, p_.row_upstream.sub_rows(r0, c));
    // The pad columns of the gradient are the GEMM's zeros (the row loss writes only V columns).
    if (!p_.dhidden.empty())
      ex_.gemm(logits_g, false, weight_g_, false, p_.dhidden.sub_rows(r0, c), 1.0f,
               p_.accumulate_dhidden ? 1.0f : 0.0f);
    if (!p_.dweight.empty())
      ex_.gemm(logits, true, hc, false, p_.dweight, 1.0f, first && !p_.accumulate_dweight ? 0.0f : 1.0f);
    if (!p_.dbias.empty()) ex_.column_sums(logits, p_.dbias, !first || p_.accumulate_dbias);
  }

  ChunkExecutor& ex_;
  const FusedLinearProblem& p_;
  ChunkPlan plan_;
  bool offer_dense_ = false;
  SoftmaxChunk whole_;
  char* base_ = nullptr;
  size_t off_ = 0;
  char* logits_buf_ = nullptr;
  char* teacher_buf_ = nullptr;
  Block weight_g_, teacher_weight_g_;
  RowOut all_;
};

}  // namespace

void run_fused_linear(ChunkExecutor& ex, const FusedLinearProblem& problem) {
  FusedLinearProblem p = problem;
  if (p.logits_budget == kFusedLinearAutoBudget) p.logits_budget = ex.caps().auto_budget;
  const int64_t n = p.hidden.rows, v = p.weight.rows;
  RT_ASSERT(n > 0 && v > 0 && p.weight.cols == p.hidden.cols);
  const LossKind kind = p.spec.kind;
  RT_ASSERT(!p.online_teacher() ||
            (kind == LossKind::Distill && p.teacher_weight.rows == v && p.teacher_hidden.rows == n &&
             p.teacher_hidden.cols == p.teacher_weight.cols));
  RT_ASSERT(!p.wants_grad() || kind != LossKind::SelectiveLogSoftmax || p.spec.selective.lse);

  // Validation first: nothing is written when the side data is bad, and the mean's divisor is known before
  // the first chunk, so every gradient is scaled in the row loss's own pass.
  const bool red = reduced(p);
  const bool mean = red && p.reduction == Reduction::Mean;
  RT_ASSERT(!p.grad_factor);  // the caller hands it to its executor
  const int64_t valid = ex.validate(p.spec, n, v, red ? p.reduction : Reduction::None, p.what);
  RT_ASSERT(valid >= 0 || valid == ChunkExecutor::kCountOnDevice);
  float inv = 1.0f;  // kCountOnDevice: the executor applies 1/count itself
  if (mean && valid != ChunkExecutor::kCountOnDevice) inv = valid > 0 ? 1.0f / float(valid) : 0.0f;

  ChunkRun run(ex, p, inv);
  for (int64_t r0 = 0; r0 < n; r0 += run.chunk_rows()) run.chunk(r0);

  if (!red) return;
  if (p.loss) ex.reduce(run.all().loss, n, inv, p.loss);
  if (p.hard) ex.reduce(run.all().hard, n, inv, p.hard);
  if (p.soft) ex.reduce(run.all().soft, n, inv, p.soft);
}

}  // namespace retort::loss
