// The CUDA ChunkExecutor: the fused linear losses' chunk loop (chunk_scheduler.h) on one backend stream.
//
//   gemm        cuBLASLt on the blocks' own strides (see "Row-major blocks" below), f32 accumulation and f32
//               C, or a 16-bit C (16-bit logits, beta 0) from operands of that dtype; bf16 / f16 operands
//               on the tensor cores, f32 operands in full f32 (TF32 only when the backend allows it).
//               Descriptors, layouts and the chosen algorithm are cached per shape and types: a chunk loop
//               repeats three or four shapes.
//   row_loss    the CUDA row kernels (row_losses.h, distill_rows.h) on the chunk's logits (row stride Vp):
//               f32 logits with the gradient written over them, or into a 16-bit shadow (cuda_chunk_exec.h);
//               16-bit logits (FusedLinearOptions::logits_dtype) with the 16-bit gradient over them, in
//               place, and no shadow.
//   validate    labels and ids checked on the device (errors in the backend's device record, reported at the
//               next synchronize or read); a mean's 1 / count stays in device memory (kCountOnDevice) and is
//               multiplied in by the row kernels and the reduction, so nothing in a fused loss waits.
//   the rest    small kernels of cuda_chunk_kernels.cu and the K-sparse path of cuda_sparse_topk.cu.
// Temporaries come from the backend's caching allocator and go back when the executor dies (or right after
// the work that uses them is queued): one stream orders every later reuse after that work.
//
// Row-major blocks. cuBLASLt is column-major: a block whose rows are contiguous (col_stride = element size)
// reads as its transpose with ld = row_stride; one whose columns are contiguous reads as itself with
// ld = col_stride. C [m, n] is row-major, seen as Cᵀ, so we ask for Cᵀ = op(B)ᵀ·op(A)ᵀ: cuBLASLt's first
// operand is our B, its second our A, and each gets op N when its memory view already is the factor needed,
// T otherwise (the same mapping as cuda_matmul.cu). A block with neither stride unit is copied first.
#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "../../core/op_table.h"
#include "../../io/tune_cache.h"
#include "../cuda_common.cuh"
#include "cuda_chunk_exec.h"
#include "cuda_chunk_kernels.h"
#include "cuda_row_loss.h"
#include "distill_rows.h"
#include "row_losses.h"
#include "softmax_chunk.h"

namespace retort::cuda {

namespace {

using loss::Block;
using loss::LossKind;
using loss::LossSpec;
using loss::RowOut;

cudaDataType_t lt_type(DType t) {
  switch (t) {
    case DType::F32:
      return CUDA_R_32F;
    case DType::BF16:
      return CUDA_R_16BF;
    case DType::F16:
      return CUDA_R_16F;
    default:
      break;
  }
  RT_FAIL("cuda fused linear: GEMM operands must be f32, bf16 or f16, got ", dtype_name(t));
}

// How cuBLASLt sees a block in memory: the block's transpose (rows contiguous) or the block itself.
struct LtView {
  bool ok = false;
  bool shows_transpose = false;
  uint64_t rows = 0, cols = 0;  // of the column-major matrix cuBLASLt sees
  int64_t ld = 0;
};

LtView view_of(const Block& b) {
  const size_t es = dtype_size(b.dtype);
  if ((b.cols == 1 || b.col_stride == es) && b.row_stride % es == 0) {
    const int64_t ld = b.rows == 1 ? b.cols : int64_t(b.row_stride / es);
    if (ld >= b.cols && ld > 0) return {true, true, uint64_t(b.cols), uint64_t(b.rows), ld};
  }
  if ((b.rows == 1 || b.row_stride == es) && b.col_stride % es == 0) {
    const int64_t ld = b.cols == 1 ? b.rows : int64_t(b.col_stride / es);
    if (ld >= b.rows && ld > 0) return {true, false, uint64_t(b.rows), uint64_t(b.cols), ld};
  }
  return {};
}

// The largest power of two (at most 256) dividing the base address and the column step.
uint32_t alignment_of(const void* p, int64_t ld_bytes) {
  const uint64_t v = uint64_t(reinterpret_cast<uintptr_t>(p)) | uint64_t(ld_bytes);
  uint32_t a = 256;
  while (a > 1 && (v & (a - 1))) a >>= 1;
  return a;
}

// Everything a cuBLASLt plan depends on: types, ops, compute type, the three layouts, the alignments, C's
// type and the SM count it is tuned for (0: the device's).
using GemmKey = std::array<int64_t, 19>;

struct GemmPlan {
  GemmKey key{};
  cublasLtMatmulDesc_t md = nullptr;
  cublasLtMatrixLayout_t lx = nullptr, ly = nullptr, lc = nullptr;
  std::vector<LtAlgo> cands;     // cuBLASLt's candidates, its first choice first
  std::array<LtAlgo, 2> algo{};  // for beta = 0 and for beta != 0 (accumulating into C)
  std::array<int, 2> idx{};      // algo[]'s indices in cands
  bool tuned = false;            // algo[] timed (lt_fastest), or never to be
  int64_t entry = -1;            // its index in CudaExec::lt_tuned once timed
  GemmPlan() = default;
  GemmPlan(const GemmPlan&) = delete;
  GemmPlan& operator=(const GemmPlan&) = delete;
  ~GemmPlan() {
    if (lc) (void)cublasLtMatrixLayoutDestroy(lc);
    if (ly) (void)cublasLtMatrixLayoutDestroy(ly);
    if (lx) (void)cublasLtMatrixLayoutDestroy(lx);
    if (md) (void)cublasLtMatmulDescDestroy(md);
  }
};

struct LtPref {
  cublasLtMatmulPreference_t p = nullptr;
  ~LtPref() {
    if (p) (void)cublasLtMatmulPreferenceDestroy(p);
  }
};

// RETORT_CHUNK_PROFILE=1: the fused losses' phases timed in context by CUDA events on the stream (each GEMM
// by shape, each row loss by kind, and the whole op from the executor's birth to its death), summed per label
// and printed to stderr at exit. For finding where a fused step's time goes under sustained load, where
// Nsight Compute's kernel-by-kernel replay runs cooler; the events cost a few microseconds of host time each.
class PhaseProfile {
 public:
  static PhaseProfile* get() {
    static PhaseProfile* p = [] {
      const char* e = std::getenv("RETORT_CHUNK_PROFILE");
      if (!e || e[0] != '1') return static_cast<PhaseProfile*>(nullptr);
      auto* q = new PhaseProfile;  // lives to the end: printed by the atexit hook below
      std::atexit([] { get()->report(); });
      return q;
    }();
    return p;
  }
  // Records the start of a phase on stream s; end() records its end.
  int begin(const std::string& label, cudaStream_t s) {
    std::lock_guard<std::mutex> lock(mu_);
    Rec r{label, nullptr, nullptr};
    if (cudaEventCreate(&r.a) != cudaSuccess) return -1;
    if (cudaEventRecord(r.a, s) != cudaSuccess) {
      (void)cudaEventDestroy(r.a);
      return -1;
    }
    open_[next_] = r;
    return next_++;
  }
  void end(int id, cudaStream_t s) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = open_.find(id);
    if (it == open_.end()) return;
    Rec r = it->second;
    open_.erase(it);
    if (cudaEventCreate(&r.b) != cudaSuccess || cudaEventRecord(r.b, s) != cudaSuccess) {
      (void)cudaEventDestroy(r.a);
      if (r.b) (void)cudaEventDestroy(r.b);
      return;
    }
    done_.push_back(r);
    if (done_.size() >= 4096) flush_locked();
  }

 private:
  struct Rec {
    std::string label;
    cudaEvent_t a, b;
  };
  void flush_locked() {
    for (Rec& r : done_) {
      float ms = 0.0f;
      if (cudaEventSynchronize(r.b) == cudaSuccess && cudaEventElapsedTime(&ms, r.a, r.b) == cudaSuccess)
        samples_[r.label].push_back(ms);
      (void)cudaEventDestroy(r.a);
      (void)cudaEventDestroy(r.b);
    }
    done_.clear();
  }
  void report() {
    std::lock_guard<std::mutex> lock(mu_);
    flush_locked();
    std::fprintf(
        stderr,
        "fused-loss phases (RETORT_CHUNK_PROFILE): label, count, median us, mean us (the first calls "
        "include module loading and GEMM timing)\n");
    for (auto& [label, v] : samples_) {
      double sum = 0.0;
      for (float x : v) sum += x;
      std::nth_element(v.begin(), v.begin() + ptrdiff_t(v.size() / 2), v.end());
      std::fprintf(stderr, "  %-52s %8zu %10.1f %10.1f\n", label.c_str(), v.size(), 1e3 * v[v.size() / 2],
                   1e3 * sum / double(v.size()));
    }
  }
  std::mutex mu_;
  int next_ = 0;
  std::map<int, Rec> open_;                            // begun, not ended
  std::vector<Rec> done_;                              // both events recorded, not yet read
  std::map<std::string, std::vector<float>> samples_;  // ms per call
};

// A phase of the profile, from construction to destruction (nothing when the profile is off).
class Phase {
 public:
  // label() makes the phase's name, only when the profile is on.
  template <class Label>
  Phase(const Label& label, cudaStream_t s) : s_(s) {
    if (PhaseProfile* p = PhaseProfile::get()) id_ = p->begin(label(), s);
  }
  ~Phase() {
    if (id_ >= 0) PhaseProfile::get()->end(id_, s_);
  }
  Phase(const Phase&) = delete;
  Phase& operator=(const Phase&) = delete;

 private:
  cudaStream_t s_;
  int id_ = -1;
};

class CudaChunkExecutor final : public loss::ChunkExecutor {
 public:
  CudaChunkExecutor(CudaExec& ex, Op op, DType grad_dtype)
      : ex_(ex),
        op_(op),
        grad_dtype_(grad_dtype),
        overlap_(overlap_config(ex.opts)),
        tune_(ex.opts.gemm_tune) {
    RT_ASSERT(grad_dtype == DType::F32 || grad_dtype == DType::BF16 || grad_dtype == DType::F16);
    if (PhaseProfile* p = PhaseProfile::get())
      whole_ = p->begin(std::string("op ") + op_name(op), ex_.stream);
  }
  CudaChunkExecutor(const CudaChunkExecutor&) = delete;
  CudaChunkExecutor& operator=(const CudaChunkExecutor&) = delete;

  // Work queued on the side stream is joined into the backend's stream before anything it used (scratch,
  // temporaries, 1 / count) goes back to the allocator, whose reuse follows that stream's order. Also on
  // the way out of an exception.
  ~CudaChunkExecutor() override {
    if (side_used_) {
      cudaEvent_t e = nullptr;
      if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess) {
        (void)cudaEventRecord(e, ex_.side_stream);
        (void)cudaStreamWaitEvent(ex_.stream, e, 0);
        (void)cudaEventDestroy(e);
      } else {
        (void)cudaStreamSynchronize(ex_.side_stream);  // cannot fence: wait instead
      }
    }
    for (cudaEvent_t e : events_) (void)cudaEventDestroy(e);
    if (whole_ >= 0) PhaseProfile::get()->end(whole_, ex_.stream);
  }

  // Row pieces only where a piece's row loss reads and writes nothing but its own rows of the chunk: not
  // with f32 logits whose gradient goes to the 16-bit shadow (it stands for whole chunks).
  int overlap_pieces(int64_t rows, DType logits) const override {
    if (!ex_.side_stream || overlap_.pieces <= 1) return 1;
    if (logits == DType::F32 && grad_dtype_ != DType::F32) return 1;
    return int(std::clamp<int64_t>(rows / overlap_.min_rows, 1, overlap_.pieces));
  }
  void set_lane(int lane) override {
    RT_ASSERT(lane == 0 || lane == 1);
    if (lane == 1) {
      RT_ASSERT(ex_.side_stream);
      if (!side_used_) {
        side_ex_ = ex_;
        side_ex_.stream = ex_.side_stream;
        side_used_ = true;
      }
      cur_ = &side_ex_;
    } else {
      if (cur_ == &side_ex_) side_pending_ = true;  // lane 1 has work that lane 0 has not waited for
      cur_ = &ex_;
    }
  }
  int64_t fence() override {
    cudaEvent_t e = nullptr;
    RT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    events_.push_back(e);
    RT_CUDA_CHECK(cudaEventRecord(e, cur_->stream));
    const int64_t id = int64_t(events_.size());
    if (cur_ == &side_ex_) last_side_fence_ = id;
    return id;
  }
  void wait(int64_t f) override {
    RT_ASSERT(f >= 1 && f <= int64_t(events_.size()));
    RT_CUDA_CHECK(cudaStreamWaitEvent(cur_->stream, events_[size_t(f - 1)], 0));
    if (cur_ == &ex_ && f == last_side_fence_) side_pending_ = false;
  }

  int64_t validate(const LossSpec& spec, int64_t rows, int64_t v, Reduction reduction,
                   const std::string& what) override {
    const Block* labels = nullptr;
    int64_t ignore = -100;
    switch (spec.kind) {
      case LossKind::CrossEntropy:
        RT_CHECK(!spec.ce.labels.empty(), what, ": labels are missing");
        labels = &spec.ce.labels;
        ignore = spec.ce.ignore_index;
        break;
      case LossKind::TopK:
        RT_CHECK(spec.topk.logprobs.cols <= kMaxTopKSlots, what, ": K = ", spec.topk.logprobs.cols,
                 " teacher slots per row; the CUDA top-K kernel keeps at most ", kMaxTopKSlots);
        if (!spec.topk.ids.empty()) fused::check_ids(ex_, spec.topk.ids, &spec.topk, v, op_);
        labels = spec.topk.labels.empty() ? nullptr : &spec.topk.labels;
        ignore = spec.topk.ignore_index;
        break;
      case LossKind::Distill:
        labels = spec.distill.labels.empty() ? nullptr : &spec.distill.labels;
        ignore = spec.distill.ignore_index;
        break;
      case LossKind::Entropy:
        break;
      case LossKind::SelectiveLogSoftmax:
        fused::check_ids(ex_, spec.selective.ids, nullptr, v, op_);
        break;
    }
    if (!labels) return rows;  // every row counts: the scheduler scales by 1 / rows itself
    float* inv = nullptr;
    if (reduction == Reduction::Mean) {
      inv_ = ex_.temp(sizeof(float));
      inv = inv_->as<float>();
      mean_on_device_ = true;
    }
    fused::check_labels(ex_, *labels, ignore, v, op_, inv);
    // Under Sum / None the count scales nothing, so it is not counted; under Mean it stays on the device.
    return kCountOnDevice;
  }

  void* scratch(size_t bytes) override {
    bufs_.push_back(ex_.temp(std::max<size_t>(bytes, 1)));
    return bufs_.back()->data();
  }

  void gemm(const Block& a0, bool ta, const Block& b0, bool tb, const Block& c, float alpha,
            float beta) override {
    RT_ASSERT(cur_ == &ex_);  // GEMMs stay on the backend's stream
    Block a = resolve(a0), b = resolve(b0);
    if (c.data == shadow_of_) shadow_of_ = nullptr;  // the logits are overwritten: the shadow is stale
    const int64_t m = ta ? a.cols : a.rows, k = ta ? a.rows : a.cols, n = tb ? b.rows : b.cols;
    RT_ASSERT(c.rows == m && c.cols == n && (tb ? b.cols : b.rows) == k);
    // A 16-bit C only as 16-bit logits: beta 0, and operands of its dtype (supports_16bit_logits), which
    // cuBLASLt can write from its f32 accumulators.
    const bool c16 = c.dtype != DType::F32;
    RT_ASSERT(c.col_stride == dtype_size(c.dtype) && (beta == 0.0f || beta == 1.0f));
    RT_ASSERT(!c16 || ((c.dtype == DType::BF16 || c.dtype == DType::F16) && beta == 0.0f &&
                       a.dtype == c.dtype && b.dtype == c.dtype));
    if (m == 0 || n == 0) return;
    if (k == 0) {
      if (beta == 0.0f) fused::zero(ex_, c);
      return;
    }
    // A C whose row count is not a multiple of 8 (the weight gradient [50257, H] of GPT-2's vocabulary) gets
    // only sm80 kernels from cuBLASLt, at about twice the time of the sm90 ones (H100): the rows up to a
    // multiple of 8 go first, the few left after (< 8: a thin GEMM of little work), each a GEMM of its own.
    if (const int64_t m_main = m / 8 * 8; m % 8 != 0 && m_main >= 1024) {
      auto part = [](const Block& x, bool t, int64_t r0, int64_t r) {
        if (!t) return x.sub_rows(r0, r);
        Block y = x;  // rows of C are columns of a transposed operand
        y.data = static_cast<char*>(x.data) + r0 * int64_t(x.col_stride);
        y.cols = r;
        return y;
      };
      gemm(part(a, ta, 0, m_main), ta, b, tb, c.sub_rows(0, m_main), alpha, beta);
      gemm(part(a, ta, m_main, m - m_main), ta, b, tb, c.sub_rows(m_main, m - m_main), alpha, beta);
      return;
    }
    std::vector<std::unique_ptr<DeviceBuffer>> keep;  // converted operands, freed once the GEMM is queued
    // cuBLASLt wants one input type: mixed operands are computed in f32 (slow path: a converted copy).
    if (a.dtype != b.dtype) {
      if (a.dtype != DType::F32) a = converted(a, DType::F32, keep);
      if (b.dtype != DType::F32) b = converted(b, DType::F32, keep);
    }
    LtView va = view_of(a), vb = view_of(b);
    if (!va.ok) va = view_of(a = converted(a, a.dtype, keep));
    if (!vb.ok) vb = view_of(b = converted(b, b.dtype, keep));
    const LtView vc = view_of(c);
    RT_ASSERT(va.ok && vb.ok && vc.ok && vc.shows_transpose);
    const cublasOperation_t op_x = (!tb) == vb.shows_transpose ? CUBLAS_OP_N : CUBLAS_OP_T;
    const cublasOperation_t op_y = (!ta) == va.shows_transpose ? CUBLAS_OP_N : CUBLAS_OP_T;
    const cublasComputeType_t compute =
        a.dtype == DType::F32 && ex_.opts.allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    const int64_t es = int64_t(dtype_size(a.dtype));
    const GemmKey key = {int64_t(lt_type(b.dtype)),
                         int64_t(lt_type(a.dtype)),
                         int64_t(op_x),
                         int64_t(op_y),
                         int64_t(compute),
                         int64_t(vb.rows),
                         int64_t(vb.cols),
                         vb.ld,
                         int64_t(va.rows),
                         int64_t(va.cols),
                         va.ld,
                         int64_t(vc.rows),
                         int64_t(vc.cols),
                         vc.ld,
                         alignment_of(b.data, vb.ld * es),
                         alignment_of(a.data, va.ld * es),
                         alignment_of(c.data, vc.ld * int64_t(dtype_size(c.dtype))),
                         int64_t(lt_type(c.dtype)),
                         side_pending_ ? overlap_.gemm_sms : 0};
    GemmPlan& plan = plan_for(key);
    // The algorithms are timed at the first call whose C may be clobbered first (beta = 0: this call
    // overwrites it) and while no side-stream work shares the GPU; until then cuBLASLt's first choice. For
    // the accumulating algorithm (beta != 0) that is the first chunk's dW, before the chunks that add to it.
    // Once more at such a call LtTuned::kSettleSeconds later, in the clocks of a GPU under load.
    if (beta == 0.0f && !side_pending_) {
      if (!plan.tuned) {
        tune(plan, a.data, b.data, c.data, alpha);
      } else if (plan.entry >= 0) {
        LtTuned& e = (*ex_.lt_tuned)[size_t(plan.entry)];
        if (!e.settled && std::chrono::duration<double>(std::chrono::steady_clock::now() - e.first).count() >=
                              LtTuned::kSettleSeconds) {
          e.settled = true;
          if (plan.cands.empty()) plan.cands = e.cands;
          retime(plan, a.data, b.data, c.data, alpha);
          e.algo = plan.algo;
          cache_store(plan);
        } else if (e.settled) {
          plan.algo = e.algo;
        }
      }
    }
    Phase phase(
        [&] {
          return "gemm " + std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) +
                 (beta == 0.0f ? "" : " +=");
        },
        ex_.stream);
    RT_CUBLAS_CHECK(cublasLtMatmul(ex_.lt, plan.md, &alpha, b.data, plan.lx, a.data, plan.ly, &beta, c.data,
                                   plan.lc, c.data, plan.lc, &plan.algo[beta == 0.0f ? 0 : 1].algo,
                                   ex_.workspace, ex_.workspace_bytes, ex_.stream));
  }

  void add_bias(const Block& c, const Block& bias) override {
    if (c.data == shadow_of_) shadow_of_ = nullptr;
    fused::add_bias(ex_, c, bias);
  }
  void column_sums(const Block& g, const Block& dbias, bool accumulate) override {
    fused::column_sums(ex_, resolve(g), dbias, accumulate);
  }
  void scale_rows(const Block& g, const Block& u) override { fused::scale_rows(*cur_, resolve(g), u); }
  void zero(const Block& b) override { fused::zero(ex_, b); }
  bool pads_vocab() const override { return true; }
  // From what the device has free plus what the backend's allocator keeps cached (reusable by the scratch),
  // at the backend's first fused call.
  size_t auto_budget() const override {
    if (*ex_.fused_free == 0) {
      size_t free = 0, total = 0;
      RT_CUDA_CHECK(cudaMemGetInfo(&free, &total));
      *ex_.fused_free = std::max<size_t>(1, free + ex_.alloc->stats().bytes_cached);
    }
    return fused_linear_auto_budget(*ex_.fused_free, kFusedLinearAutoMaxGpu);
  }
  // cuBLASLt writes a bf16 (f16) C from bf16 (f16) operands with f32 accumulation; an f32 operand has no
  // 16-bit output (and a mixed pair runs on f32 copies), so those keep f32 logits.
  bool supports_16bit_logits(DType logits, DType a, DType b) const override {
    return (logits == DType::BF16 || logits == DType::F16) && a == logits && b == logits;
  }
  size_t shadow_bytes_per_logit() const override {
    return grad_dtype_ == DType::F32 ? 0 : dtype_size(grad_dtype_);
  }
  void copy(const Block& src, const Block& dst) override {
    RT_ASSERT(src.dtype == dst.dtype && src.rows == dst.rows && src.cols == dst.cols &&
              dst.col_stride == dtype_size(dst.dtype) &&
              dst.row_stride == size_t(dst.cols) * dtype_size(dst.dtype));
    if (src.rows > 0 && src.col_stride == dtype_size(src.dtype) && src.row_stride % 16 == 0 &&
        reinterpret_cast<uintptr_t>(src.data) % 16 == 0 && dst.row_stride % 16 == 0) {
      // Rows of whole 16-byte pieces (the padded weight copy): the copy engine's strided copy, at HBM speed
      // (the element-wise kernel took 0.12 ms for GPT-2's 77 MB weight on an H100).
      RT_CUDA_CHECK(cudaMemcpy2DAsync(dst.data, dst.row_stride, src.data, src.row_stride, dst.row_stride,
                                      size_t(src.rows), cudaMemcpyDeviceToDevice, ex_.stream));
      return;
    }
    fused::copy_block(ex_, src, dst.dtype, dst.data);
  }

  void row_loss(const LossSpec& spec, const Block& logits, const RowOut& out) override {
    // f32 logits, or 16-bit ones (FusedLinearOptions::logits_dtype), whose gradient goes over them in place.
    const size_t les = dtype_size(logits.dtype);
    const bool low = logits.dtype != DType::F32;
    RT_ASSERT(is_float(logits.dtype) && logits.col_stride == les);
    RT_ASSERT(out.grad.empty() || (out.grad.data == logits.data && out.grad.dtype == logits.dtype));
    RT_ASSERT(!low || spec.kind != LossKind::SelectiveLogSoftmax);
    if (logits.rows == 0) return;
    Phase phase([&] { return "row_loss kind " + std::to_string(int(spec.kind)) + (low ? " 16-bit" : ""); },
                cur_->stream);
    const bool gathered = spec.kind == LossKind::TopK && spec.topk.ids.empty();
    RowBlock b;
    b.logits = logits.data;
    b.dtype = logits.dtype;
    b.rows = logits.rows;
    b.V = logits.cols;
    b.stride = std::max<int64_t>(logits.cols, int64_t(logits.row_stride / les));  // Vp
    b.scale = out.grad_scale;
    b.scale_dev = mean_on_device_ ? inv_->as<float>() : nullptr;
    b.loss = out.loss;
    b.lse = out.lse;
    if (!out.grad.empty()) {
      b.grad_stride = b.stride;
      if (low) {  // in place, in the logits' own dtype: nothing to shadow
        b.grad = logits.data;
        b.grad_dtype = logits.dtype;
        shadow_of_ = nullptr;
      } else if (grad_dtype_ != DType::F32 && !gathered) {
        b.grad = shadow_for(logits);
        b.grad_dtype = grad_dtype_;
      } else {
        b.grad = logits.data;
        b.grad_dtype = DType::F32;
        shadow_of_ = nullptr;
      }
    }
    // Contiguous side data, freed once the kernel is queued on the backend's stream; on the side stream
    // kept until the executor has joined it (see the destructor).
    CudaExec& ex = *cur_;
    std::vector<std::unique_ptr<DeviceBuffer>> local;
    auto& keep = cur_ == &ex_ ? local : side_keep_;
    auto temp = [&](size_t bytes) {
      keep.push_back(ex.temp(std::max<size_t>(bytes, 1)));
      return keep.back()->data();
    };
    cuda::row_loss(ex, spec, b, out.hard, out.soft, op_, temp);
  }

  void reduce(const float* v, int64_t n, float scale, float* out) override {
    sum_rows_scalar(v, n, mean_on_device_ ? inv_->as<float>() : nullptr, scale, out, ex_.stream);
  }

  void gather_logits(const Block& hidden, const Block& w, const Block& bias, const loss::TopKSide& side,
                     const Block& out) override {
    fused::gather_topk_logits(ex_, hidden, w, bias, side, out, runs_);
  }

  bool sparse_fused(const Block& hidden, const Block& w, const Block& bias, const loss::TopKSide& side,
                    const Block& g, const RowOut& out, const Block& dhidden,
                    bool accumulate_dhidden) override {
    fused::SparseKlOut o;
    o.loss = out.loss;
    o.soft = out.soft;
    o.lse = out.lse;
    o.grad_scale = out.grad_scale;
    o.grad_scale_dev = mean_on_device_ ? inv_->as<float>() : nullptr;
    return fused::sparse_forward_kl(ex_, hidden, w, bias, side, g, o, dhidden, accumulate_dhidden);
  }

  void scatter_grads(const Block& g, const Block& hidden, const Block& w, const loss::TopKSide& side,
                     const loss::SparseGrads& out) override {
    fused::scatter_topk_grads(ex_, g, hidden, w, side, out, runs_);
  }

  bool softmax_whole(const loss::SoftmaxChunk& j) const override { return softmax_takes(j, false); }

  // Whether softmax_chunk takes j (check_logits: also the logits pointer, absent when softmax_whole asks).
  bool softmax_takes(const loss::SoftmaxChunk& j, bool check_logits) const {
    if (!ex_.opts.softmax_epilogue || cur_ != &ex_) return false;
    const LossKind kind = j.spec.kind;
    if (kind == LossKind::CrossEntropy) {
      const loss::CrossEntropySide& ce = j.spec.ce;
      if (ce.label_smoothing != 0.0f || ce.softcap != 0.0f || ce.labels.empty()) return false;
    } else if (kind == LossKind::TopK) {
      const loss::TopKSide& t = j.spec.topk;
      if (!t.div.forward_kl() || t.temperature != 1.0f || t.normalize_topk || t.ids.empty() ||
          t.logprobs.cols > kSoftmaxMaxSlots || t.logprobs.cols == 0)
        return false;
    } else {
      return false;
    }
    const Block &x = j.hidden, &w = j.weight;
    auto rows16 = [](const Block& b) {
      return b.dtype == DType::BF16 && b.col_stride == 2 && b.row_stride % 16 == 0 &&
             reinterpret_cast<uintptr_t>(b.data) % 16 == 0;
    };
    // H ≤ 32,768: the exact-row kernel holds a hidden row in shared memory as f32.
    if (!rows16(x) || !rows16(w) || x.cols % 2 != 0 || x.cols != w.cols || x.rows == 0 || x.cols > 32768)
      return false;
    if ((check_logits && reinterpret_cast<uintptr_t>(j.logits) % 16 != 0) || j.vp % 8 != 0 || j.vp < w.rows)
      return false;
    if (!j.dhidden.empty() && (j.dhidden.dtype != DType::F32 || j.dhidden.col_stride != sizeof(float)))
      return false;
    if (!j.dweight.empty() && j.dweight.dtype != DType::F32) return false;
    return softmax_epilogue_supported(ex_.device);
  }

  // softmax_chunk.h: cross-entropy without label smoothing or softcap, or top-K distillation with forward KL
  // at T = 1 over the full vocabulary (at most kSoftmaxMaxSlots slots); bf16 hidden and W with 16-byte
  // aligned rows, an even H, f32 gradients with unit column strides. W may be padded (Vp rows) or not.
  bool softmax_chunk(const loss::SoftmaxChunk& j) override {
    if (!softmax_takes(j, true)) return false;
    const LossKind kind = j.spec.kind;
    const Block &x = j.hidden, &w = j.weight;
    shadow_of_ = nullptr;  // the logits block now holds E
    const int64_t c = x.rows, h = x.cols, wrows = w.rows, v = j.v, tiles = softmax_tiles(wrows);
    const int64_t ldx = int64_t(x.row_stride / 2), ldw = int64_t(w.row_stride / 2);
    std::vector<std::unique_ptr<DeviceBuffer>> keep;
    auto temp = [&](size_t bytes) {
      keep.push_back(ex_.temp(std::max<size_t>(bytes, 1)));
      return keep.back()->data();
    };
    SoftmaxRows r;
    r.rows = c;
    r.v = v;
    r.wrows = wrows;
    r.tiles = tiles;
    r.x = x.data;
    r.ldx = ldx;
    r.w = w.data;
    r.ldw = ldw;
    r.h = h;
    const Block* labels_in = nullptr;
    if (kind == LossKind::CrossEntropy) {
      labels_in = &j.spec.ce.labels;
      r.ignore = j.spec.ce.ignore_index;
      r.z_loss = j.spec.ce.z_loss;
    } else {
      const loss::TopKSide& t = j.spec.topk;
      if (!t.labels.empty()) labels_in = &t.labels;
      r.ignore = t.ignore_index;
      r.w_hard = t.w_hard;
      r.w_soft = t.w_soft;
      r.k = t.logprobs.cols;
      auto* ids = static_cast<int64_t*>(temp(size_t(c * r.k) * sizeof(int64_t)));
      fused::copy_block(ex_, t.ids, DType::I64, ids);
      r.ids = ids;
      if (t.labels.empty() || j.logits_dtype == DType::F32) {  // z at the slots exactly
        auto* zk = static_cast<float*>(temp(size_t(c * r.k) * sizeof(float)));
        Phase phase([] { return std::string("softmax-epilogue gather"); }, ex_.stream);
        fused::gather_topk_logits(ex_, x, w, Block{}, t, Block::dense(zk, DType::F32, c, r.k), runs_);
        r.zk = zk;
      } else {  // 16-bit logits: from E (the shift is z at the label), which the GEMM then always writes
        r.e_read = j.logits;
        r.lde = j.vp;
      }
      r.logprobs = side(t.logprobs);
      r.mask = side(t.mask);
      r.hard = j.out.hard;
      r.soft = j.out.soft;
    }
    if (labels_in) r.labels = static_cast<int64_t*>(temp(size_t(c) * sizeof(int64_t)));
    auto* shift = static_cast<float*>(temp(size_t(c) * sizeof(float)));
    auto* part = static_cast<float*>(temp(size_t(c * tiles) * sizeof(float)));
    r.shift = shift;
    r.part = part;
    {
      Phase phase([] { return std::string("softmax-epilogue logits"); }, ex_.stream);
      softmax_shift(r, labels_in ? side_vec(*labels_in) : SideMatrix{}, shift, ex_.stream);
      SoftmaxGemm g;
      g.x = x.data;
      g.ldx = ldx;
      g.w = w.data;
      g.ldw = ldw;
      g.rows = c;
      g.h = h;
      g.wrows = wrows;
      g.v = v;
      g.e = j.grad || r.e_read ? j.logits : nullptr;
      g.lde = j.vp;
      g.shift = shift;
      g.part = part;
      const int pp = ex_.opts.softmax_pingpong;
      g.schedule = pp == 1 || (pp < 0 && h <= kSoftmaxPingPongMaxH) ? SoftmaxSchedule::PingPong
                                                                    : SoftmaxSchedule::Cooperative;
      softmax_gemm(g, ex_.sm_count, ex_.stream);
    }
    float* s = nullptr;
    void* xs = nullptr;
    {
      Phase phase([] { return std::string("softmax-epilogue rows"); }, ex_.stream);
      r.loss = j.out.loss;
      r.lse = j.out.lse;
      if (j.grad) {
        r.e = j.logits;
        r.lde = j.vp;
        r.grad_scale = j.out.grad_scale;
        r.scale_dev = mean_on_device_ ? inv_->as<float>() : nullptr;
        r.upstream = side_vec(j.row_upstream);
        s = static_cast<float*>(temp(size_t(c) * sizeof(float)));
        r.s = s;
        if (!j.dweight.empty()) xs = temp(size_t(c * h) * 2);
        r.xs = xs;
      }
      r.bad = static_cast<int32_t*>(temp(size_t(c) * sizeof(int32_t)));
      softmax_rows(r, ex_.stream);
    }
    ++*ex_.softmax_chunks;
    if (!j.grad) return true;
    const size_t rb = size_t(j.vp) * 2;
    if (!j.dhidden.empty()) {
      // dh (+)= diag(s)·(E'·W). The GEMM's K runs over W's rows up to a multiple of 8 (cuBLASLt's sm90
      // kernels want aligned extents; a padded W has Vp rows, an unpadded one V): the few rows left (< 8)
      // are added by the scaling pass, which reads dh (or the GEMM's output) once anyway.
      const int64_t k_main = wrows / 8 * 8;
      const Block e_g{j.logits, DType::BF16, c, k_main, rb, 2};  // E' over those rows (pad columns are 0)
      const Block& dh = j.dhidden;
      const int64_t ld = int64_t(dh.row_stride / sizeof(float));
      ScaleAddTail tail;
      tail.cols = wrows - k_main;
      tail.e = static_cast<const char*>(j.logits) + k_main * 2;
      tail.lde = j.vp;
      tail.w = static_cast<const char*>(w.data) + k_main * int64_t(w.row_stride);
      tail.ldw = int64_t(w.row_stride / 2);
      float* t = static_cast<float*>(dh.data);
      int64_t t_ld = ld;
      if (j.accumulate_dhidden) {  // the product into a temporary, then dh += diag(s)·(it + tail)
        t = static_cast<float*>(temp(size_t(c * h) * sizeof(float)));
        t_ld = h;
      }
      gemm(e_g, false, w.sub_rows(0, k_main), false,
           Block{t, DType::F32, c, h, size_t(t_ld) * sizeof(float), sizeof(float)}, 1.0f, 0.0f);
      scale_add_rows(static_cast<float*>(dh.data), ld, t, t_ld, c, h, s, j.accumulate_dhidden, tail,
                     ex_.sm_count, ex_.stream);
    }
    if (!j.dweight.empty()) {  // xs = diag(s)·hidden, written by the row kernels
      gemm(Block{j.logits, DType::BF16, c, v, rb, 2}, true, Block::dense(xs, DType::BF16, c, h), false,
           j.dweight, 1.0f, j.accumulate_dweight ? 1.0f : 0.0f);
    }
    return true;
  }

 private:
  // The 16-bit gradient buffer for the logits block, which it now stands for.
  void* shadow_for(const Block& logits) {
    RT_ASSERT(cur_ == &ex_);  // no row pieces with a shadow (overlap_pieces)
    const size_t bytes = size_t(logits.rows) * (logits.row_stride / sizeof(float)) * dtype_size(grad_dtype_);
    if (!shadow_ || shadow_bytes_ < bytes) {
      shadow_ = ex_.temp(bytes);
      // The row kernels write V columns; the pad columns up to Vp are read by the dhidden GEMM over the
      // padded vocabulary and must be zeros (uninitialized bits could be NaN, and 0·NaN is NaN).
      RT_CUDA_CHECK(cudaMemsetAsync(shadow_->data(), 0, bytes, ex_.stream));
      shadow_bytes_ = bytes;
    }
    shadow_of_ = logits.data;
    shadow_rows_ = logits.rows;
    shadow_src_stride_ = logits.row_stride;
    return shadow_->data();
  }

  // The block as the executor holds it: the logits whose gradient went to the shadow read from there.
  Block resolve(const Block& x) const {
    if (!shadow_of_ || x.data != shadow_of_ || x.dtype != DType::F32) return x;
    RT_ASSERT(x.rows <= shadow_rows_ && x.row_stride == shadow_src_stride_ && x.col_stride == sizeof(float));
    const size_t es = dtype_size(grad_dtype_);
    return {shadow_->data(), grad_dtype_, x.rows, x.cols, x.row_stride / sizeof(float) * es, es};
  }

  // A contiguous row-major copy of x in dtype dt.
  Block converted(const Block& x, DType dt, std::vector<std::unique_ptr<DeviceBuffer>>& keep) {
    keep.push_back(ex_.temp(std::max<size_t>(size_t(x.rows * x.cols) * dtype_size(dt), 1)));
    fused::copy_block(ex_, x, dt, keep.back()->data());
    return Block::dense(keep.back()->data(), dt, x.rows, x.cols);
  }

  GemmPlan& plan_for(const GemmKey& key) {
    for (const auto& p : plans_)
      if (p->key == key) return *p;
    auto p = std::make_unique<GemmPlan>();
    p->key = key;
    const auto compute = cublasComputeType_t(key[4]);
    const auto op_x = cublasOperation_t(key[2]), op_y = cublasOperation_t(key[3]);
    RT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->md, compute, CUDA_R_32F));
    RT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->md, CUBLASLT_MATMUL_DESC_TRANSA, &op_x, sizeof(op_x)));
    RT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->md, CUBLASLT_MATMUL_DESC_TRANSB, &op_y, sizeof(op_y)));
    if (const int32_t sms = int32_t(key[18]); sms > 0)
      RT_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(p->md, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &sms, sizeof(sms)));
    RT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->lx, cudaDataType_t(key[0]), uint64_t(key[5]),
                                               uint64_t(key[6]), key[7]));
    RT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->ly, cudaDataType_t(key[1]), uint64_t(key[8]),
                                               uint64_t(key[9]), key[10]));
    RT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->lc, cudaDataType_t(key[17]), uint64_t(key[11]),
                                               uint64_t(key[12]), key[13]));
    LtPref pref;
    const uint64_t ws = ex_.workspace_bytes;
    const uint32_t al_x = uint32_t(key[14]), al_y = uint32_t(key[15]), al_c = uint32_t(key[16]);
    RT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref.p));
    RT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                         &ws, sizeof(ws)));
    RT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                         &al_x, sizeof(al_x)));
    RT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                         &al_y, sizeof(al_y)));
    RT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                         &al_c, sizeof(al_c)));
    RT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                         &al_c, sizeof(al_c)));
    // Timed by an earlier executor of this backend: no heuristic query at all.
    for (size_t i = 0; i < ex_.lt_tuned->size(); ++i) {
      const LtTuned& t = (*ex_.lt_tuned)[i];
      if (std::equal(key.begin(), key.end(), t.key.begin(), t.key.end())) {
        p->algo = t.algo;
        p->tuned = true;
        p->entry = int64_t(i);
        plans_.push_back(std::move(p));
        return *plans_.back();
      }
    }
    // Only f32 outputs accumulate (dW, dhidden); a 16-bit one (logits) has nothing to time unless All. At
    // most kMaxTunedShapes shapes per backend are timed (rows that change every step, such as a last short
    // chunk of varying size, would otherwise time a new shape each step); later ones take the first choice.
    const bool timed =
        (tune_ == GemmTune::All || (tune_ == GemmTune::Accumulating && key[17] == CUDA_R_32F)) &&
        ex_.lt_tuned->size() < kMaxTunedShapes;
    p->cands = lt_candidates(ex_.lt, p->md, p->lx, p->ly, p->lc, pref.p, timed ? kTuneCandidates : 1);
    RT_CHECK(!p->cands.empty(), "cuda fused linear: cuBLASLt has no algorithm for a ", key[11], " x ",
             key[12], " GEMM (inputs ", key[0] == CUDA_R_32F ? "f32" : "16-bit", ")");
    p->algo[0] = p->algo[1] = p->cands[0];
    p->tuned = p->cands.size() < 2;
    // Picked by an earlier process on this device (CudaOptions::gemm_cache): those algorithms, untimed.
    if (timed && !p->tuned && cache_lookup(*p)) {
      p->tuned = true;
      p->entry = int64_t(ex_.lt_tuned->size());
      ex_.lt_tuned->push_back(LtTuned{std::vector<int64_t>(key.begin(), key.end()), p->algo, p->cands,
                                      std::chrono::steady_clock::now(), true});
      ++ex_.gemm_cache->hits;
    }
    plans_.push_back(std::move(p));
    return *plans_.back();
  }

  // The cache file's signature: what the candidates and their speeds depend on besides the GemmKey.
  std::string cache_signature() const {
    cudaDeviceProp prop{};
    RT_CUDA_CHECK(cudaGetDeviceProperties(&prop, ex_.device));
    return std::string(prop.name) + " cc " + std::to_string(prop.major) + "." + std::to_string(prop.minor) +
           " sms " + std::to_string(prop.multiProcessorCount) + " cublasLt " +
           std::to_string(cublasLtGetVersion()) + " workspace " + std::to_string(ex_.workspace_bytes) +
           " candidates " + std::to_string(kTuneCandidates);
  }
  // Sets plan's algorithms from the cache file when it holds its key for as many candidates as plan has.
  bool cache_lookup(GemmPlan& plan) {
    GemmCacheFile& f = *ex_.gemm_cache;
    if (f.path.empty()) return false;
    if (!f.loaded) {
      f.signature = cache_signature();
      for (io::TuneEntry& e : io::read_tune_cache(f.path, f.signature))
        f.entries[std::move(e.key)] = std::move(e.value);
      f.loaded = true;
    }
    const auto it = f.entries.find(std::vector<int64_t>(plan.key.begin(), plan.key.end()));
    if (it == f.entries.end()) return false;
    const std::vector<int64_t>& v = it->second;
    const int64_t n = int64_t(plan.cands.size());
    if (v.size() != 3 || v[0] != n || v[1] < 0 || v[1] >= n || v[2] < 0 || v[2] >= n) return false;
    plan.idx = {int(v[1]), int(v[2])};
    plan.algo = {plan.cands[size_t(v[1])], plan.cands[size_t(v[2])]};
    return true;
  }
  // Records plan's timed picks in the cache file (merged with what it holds, written atomically).
  void cache_store(const GemmPlan& plan) {
    GemmCacheFile& f = *ex_.gemm_cache;
    if (f.path.empty() || plan.cands.size() < 2) return;
    if (f.signature.empty()) f.signature = cache_signature();
    io::TuneEntry e{std::vector<int64_t>(plan.key.begin(), plan.key.end()),
                    {int64_t(plan.cands.size()), plan.idx[0], plan.idx[1]}};
    f.entries[e.key] = e.value;
    // One writer at a time in this process: the atomic write's temporary name is per process, and backends
    // on other threads may share the file.
    static std::mutex write_mu;
    std::lock_guard<std::mutex> lock(write_mu);
    io::write_tune_cache(f.path, f.signature, {e});
  }

  // Times plan's candidates on its own operands (the GEMM about to run, whose C this call overwrites) and
  // keeps the fastest for beta = 0 (GemmTune::All) and, for f32 outputs (the accumulators: dW over chunks,
  // dhidden when asked), for beta = 1, and records them per GEMM shape and backend (ex_.lt_tuned), where
  // gemm() has them timed once more (retime) after LtTuned::kSettleSeconds. Waits for the stream.
  void tune(GemmPlan& plan, const void* a, const void* b, void* c, float alpha) {
    plan.tuned = true;
    retime(plan, a, b, c, alpha);
    cache_store(plan);
    plan.entry = int64_t(ex_.lt_tuned->size());
    ex_.lt_tuned->push_back(LtTuned{std::vector<int64_t>(plan.key.begin(), plan.key.end()), plan.algo,
                                    plan.cands, std::chrono::steady_clock::now(), false});
  }
  void retime(GemmPlan& plan, const void* a, const void* b, void* c, float alpha) {
    const int n = int(plan.cands.size());
    for (int acc = tune_ == GemmTune::All ? 0 : 1; acc < (plan.key[17] == CUDA_R_32F ? 2 : 1); ++acc) {
      const float beta = float(acc);
      const int best = lt_fastest(n, ex_.stream, [&](int i) {
        RT_CUBLAS_CHECK(cublasLtMatmul(ex_.lt, plan.md, &alpha, b, plan.lx, a, plan.ly, &beta, c, plan.lc, c,
                                       plan.lc, &plan.cands[size_t(i)].algo, ex_.workspace,
                                       ex_.workspace_bytes, ex_.stream));
      });
      plan.algo[acc] = plan.cands[size_t(best)];
      plan.idx[acc] = best;
    }
    if (plan.key[17] != CUDA_R_32F) {
      plan.algo[1] = plan.algo[0];
      plan.idx[1] = plan.idx[0];
    }
  }

  static constexpr int kTuneCandidates = 8;
  static constexpr size_t kMaxTunedShapes = 64;

  struct Overlap {
    int pieces = 1, min_rows = 0, gemm_sms = 0;
  };
  // The backend's options (checked when it was made), or the environment's tuning overrides.
  static Overlap overlap_config(const CudaOptions& o) {
    auto env = [](const char* name, int fallback, int least) {
      const char* e = std::getenv(name);
      if (!e || !*e) return fallback;
      const int v = std::atoi(e);
      RT_CHECK(v >= least, "cuda fused linear: ", name, "=", e, " must be an integer >= ", least);
      return v;
    };
    Overlap c;
    c.pieces = env("RETORT_OVERLAP_PIECES", o.fused_overlap_pieces, 1);
    c.min_rows = env("RETORT_OVERLAP_MIN_ROWS", o.fused_overlap_min_rows, 1);
    c.gemm_sms = env("RETORT_OVERLAP_SMS", o.fused_overlap_gemm_sms, 0);
    return c;
  }

  CudaExec& ex_;
  Op op_;
  DType grad_dtype_;
  Overlap overlap_;
  GemmTune tune_;              // CudaOptions::gemm_tune, or RETORT_GEMM_TUNE (read when the backend was made)
  CudaExec side_ex_;           // ex_ with the side stream (lane 1)
  CudaExec* cur_ = &ex_;       // the lane work is queued on
  bool side_used_ = false;     // lane 1 got work: the destructor joins it
  bool side_pending_ = false;  // lane 1 has work lane 0 has not waited for: GEMMs now share the GPU
  int64_t last_side_fence_ = 0;
  int whole_ = -1;                                        // the whole op's phase (RETORT_CHUNK_PROFILE)
  std::vector<cudaEvent_t> events_;                       // fences
  std::vector<std::unique_ptr<DeviceBuffer>> side_keep_;  // temporaries of lane-1 work
  std::vector<std::unique_ptr<DeviceBuffer>> bufs_;       // scratch
  std::vector<std::unique_ptr<GemmPlan>> plans_;
  fused::SparseRuns runs_;  // the K-sparse path's sorted slots, from a chunk's gather to its scatter
  std::unique_ptr<DeviceBuffer> inv_;  // 1 / count of a mean with labels (device)
  bool mean_on_device_ = false;
  std::unique_ptr<DeviceBuffer> shadow_;  // the 16-bit logits gradient
  size_t shadow_bytes_ = 0;
  const void* shadow_of_ = nullptr;  // the logits block the shadow stands for (null: none)
  int64_t shadow_rows_ = 0;
  size_t shadow_src_stride_ = 0;
};

}  // namespace

std::unique_ptr<loss::ChunkExecutor> make_cuda_chunk_executor(CudaExec& ex, Op op, DType grad_dtype) {
  return std::make_unique<CudaChunkExecutor>(ex, op, grad_dtype);
}

}  // namespace retort::cuda
