// The CUDA ChunkExecutor: the fused linear losses' chunk loop (chunk_scheduler.h) on the backend's stream.
//
//   gemm        ChunkGemm (chunk_gemm.h): cuBLASLt on the blocks' own strides, algorithms timed and cached.
//   row_loss    the CUDA row kernels (cuda_row_loss.h) on the chunk's logits (row stride Vp): f32 logits with
//               the gradient written over them, or into a 16-bit shadow (cuda_chunk_exec.h); 16-bit logits
//               (FusedLinearOptions::logits_dtype) with the 16-bit gradient over them, in place, and no
//               shadow.
//   validate    labels and ids checked on the device (errors in the backend's device record, reported at the
//               next synchronize or read); a mean's 1 / count stays in device memory (kCountOnDevice) and is
//               multiplied in by the row kernels and the reduction, so nothing in a fused loss waits.
//   fast_path   the softmax epilogue (softmax_chunk.h) and the one-pass K-sparse forward KL.
//   the rest    small kernels of cuda_chunk_kernels.cu and the K-sparse path of cuda_sparse_topk.cu.
// Temporaries come from the backend's caching allocator and go back when the executor dies (or right after
// the work that uses them is queued): one stream orders every later reuse after that work.
#include <algorithm>
#include <string>
#include <vector>

#include "../../core/op_table.h"
#include "../cuda_common.cuh"
#include "../topk_rows.h"
#include "chunk_gemm.h"
#include "cuda_chunk_exec.h"
#include "cuda_chunk_kernels.h"
#include "cuda_row_loss.h"
#include "distill_rows.h"
#include "phase_profile.h"
#include "row_losses.h"
#include "softmax_chunk.h"

namespace retort::cuda {

namespace {

__global__ void product_kernel(const float* a, const float* b, float* out) {
  *out = *a * *b;
}

using loss::Block;
using loss::LossKind;
using loss::LossSpec;
using loss::RowOut;

class CudaChunkExecutor final : public loss::ChunkExecutor {
 public:
  CudaChunkExecutor(CudaExec& ex, Op op, DType grad_dtype, const float* grad_factor)
      : ex_(ex), op_(op), grad_dtype_(grad_dtype), gemm_(ex), factor_(grad_factor), grad_dev_(grad_factor) {
    RT_ASSERT(grad_dtype == DType::F32 || grad_dtype == DType::BF16 || grad_dtype == DType::F16);
    if (phase_profile_on()) whole_ = phase_begin(std::string("op ") + op_name(op), ex_.stream);
  }
  CudaChunkExecutor(const CudaChunkExecutor&) = delete;
  CudaChunkExecutor& operator=(const CudaChunkExecutor&) = delete;
  ~CudaChunkExecutor() override { phase_end(whole_, ex_.stream); }

  loss::ExecutorCaps caps() const override {
    loss::ExecutorCaps c;
    c.auto_budget = auto_budget();
    c.pads_vocab = true;
    c.shadow_bytes_per_logit = grad_dtype_ == DType::F32 ? 0 : dtype_size(grad_dtype_);
    // cuBLASLt writes a bf16 (f16) C from bf16 (f16) operands with f32 accumulation; an f32 operand has no
    // 16-bit output (and a mixed pair runs on f32 copies), so those keep f32 logits.
    c.logits16 = true;
    return c;
  }

  bool fast_path(const loss::FastPath& job) override {
    switch (job.kind) {
      case loss::FastPath::Kind::DenseWhole:
        return softmax_takes(job.dense, false);
      case loss::FastPath::Kind::DenseChunk:
        return softmax_chunk(job.dense);
      case loss::FastPath::Kind::SparseChunk:
        return sparse_fused(job.sparse);
    }
    return false;
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
      case LossKind::TopKLogprobs:
        RT_CHECK(spec.topk_lp.k <= kTopKRowsMaxK, what, ": K = ", spec.topk_lp.k,
                 "; the CUDA top-K kernel selects at most ", kTopKRowsMaxK);
        labels = spec.topk_lp.labels.empty() ? nullptr : &spec.topk_lp.labels;
        ignore = spec.topk_lp.ignore_index;
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
    if (inv) {
      grad_dev_ = inv;
      if (factor_) {
        // The gradients' device scale: the mean's 1 / count times the graph's seed; the loss keeps 1 / count.
        factor_inv_ = ex_.temp(sizeof(float));
        product_kernel<<<1, 1, 0, ex_.stream>>>(inv, factor_, factor_inv_->as<float>());
        RT_CUDA_LAUNCH_CHECK("fused loss gradient scale");
        grad_dev_ = factor_inv_->as<float>();
      }
    }
    // Under Sum / None the count scales nothing, so it is not counted; under Mean it stays on the device.
    return kCountOnDevice;
  }

  void* scratch(size_t bytes) override {
    bufs_.push_back(ex_.temp(std::max<size_t>(bytes, 1)));
    return bufs_.back()->data();
  }

  void gemm(const Block& a, bool ta, const Block& b, bool tb, const Block& c, float alpha,
            float beta) override {
    if (c.data == shadow_of_) shadow_of_ = nullptr;  // the logits are overwritten: the shadow is stale
    gemm_.run(resolve(a), ta, resolve(b), tb, c, alpha, beta);
  }

  void add_bias(const Block& c, const Block& bias) override {
    if (c.data == shadow_of_) shadow_of_ = nullptr;
    fused::add_bias(ex_, c, bias);
  }
  void column_sums(const Block& g, const Block& dbias, bool accumulate) override {
    fused::column_sums(ex_, resolve(g), dbias, accumulate);
  }
  void scale_rows(const Block& g, const Block& u) override { fused::scale_rows(ex_, resolve(g), u); }
  void zero(const Block& b) override { fused::zero(ex_, b); }
  // From what the device has free plus what the backend's allocator keeps cached (reusable by the scratch),
  // at the backend's first fused call.
  size_t auto_budget() const {
    if (*ex_.fused_free == 0) {
      size_t free = 0, total = 0;
      RT_CUDA_CHECK(cudaMemGetInfo(&free, &total));
      *ex_.fused_free = std::max<size_t>(1, free + ex_.alloc->stats().bytes_cached);
    }
    return fused_linear_auto_budget(*ex_.fused_free, kFusedLinearAutoMaxGpu);
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
                ex_.stream);
    const bool gathered = spec.kind == LossKind::TopK && spec.topk.ids.empty();
    RowBlock b;
    b.logits = logits.data;
    b.dtype = logits.dtype;
    b.rows = logits.rows;
    b.V = logits.cols;
    b.stride = std::max<int64_t>(logits.cols, int64_t(logits.row_stride / les));  // Vp
    b.scale = out.grad_scale;
    b.scale_dev = grad_dev_;
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
    // Contiguous side data, freed once the kernel is queued on the backend's stream.
    std::vector<std::unique_ptr<DeviceBuffer>> keep;
    auto temp = [&](size_t bytes) {
      keep.push_back(ex_.temp(std::max<size_t>(bytes, 1)));
      return keep.back()->data();
    };
    cuda::row_loss(ex_, spec, b, out.hard, out.soft, op_, temp);
  }

  void reduce(const float* v, int64_t n, float scale, float* out) override {
    sum_rows_scalar(v, n, mean_on_device_ ? inv_->as<float>() : nullptr, scale, out, ex_.stream);
  }

  void gather_logits(const Block& hidden, const Block& w, const Block& bias, const loss::TopKSide& side,
                     const Block& out) override {
    fused::gather_topk_logits(ex_, hidden, w, bias, side, out, runs_);
  }

  // The one-pass K-sparse forward KL (cuda_sparse_topk.cu), when it has one for these options and layouts.
  bool sparse_fused(const loss::SparseChunk& j) {
    const RowOut& out = j.out;
    fused::SparseKlOut o;
    o.loss = out.loss;
    o.soft = out.soft;
    o.lse = out.lse;
    o.grad_scale = out.grad_scale;
    o.grad_scale_dev = grad_dev_;
    return fused::sparse_forward_kl(ex_, j.hidden, j.weight, j.bias, j.side, j.g, o, j.dhidden,
                                    j.accumulate_dhidden);
  }

  void scatter_grads(const Block& g, const Block& hidden, const Block& w, const loss::TopKSide& side,
                     const loss::SparseGrads& out) override {
    fused::scatter_topk_grads(ex_, g, hidden, w, side, out, runs_);
  }

  // Whether softmax_chunk takes j (check_logits: also the logits pointer, absent when the scheduler asks
  // about the whole problem, FastPath::Kind::DenseWhole).
  bool softmax_takes(const loss::SoftmaxChunk& j, bool check_logits) const {
    if (!ex_.opts.softmax_epilogue) return false;
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
  bool softmax_chunk(const loss::SoftmaxChunk& j) {
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
        r.scale_dev = grad_dev_;
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

  CudaExec& ex_;
  Op op_;
  DType grad_dtype_;
  ChunkGemm gemm_;
  int whole_ = -1;                                   // the whole op's phase (RETORT_CHUNK_PROFILE)
  std::vector<std::unique_ptr<DeviceBuffer>> bufs_;  // scratch
  fused::SparseRuns runs_;  // the K-sparse path's sorted slots, from a chunk's gather to its scatter
  std::unique_ptr<DeviceBuffer> inv_;  // 1 / count of a mean with labels (device)
  bool mean_on_device_ = false;
  const float* factor_;  // the graph's seed, multiplying every gradient (device), or null
  std::unique_ptr<DeviceBuffer> factor_inv_;  // *factor_ / count, when both apply
  const float* grad_dev_;                     // what the gradients are multiplied by on the device, or null
  std::unique_ptr<DeviceBuffer> shadow_;  // the 16-bit logits gradient
  size_t shadow_bytes_ = 0;
  const void* shadow_of_ = nullptr;  // the logits block the shadow stands for (null: none)
  int64_t shadow_rows_ = 0;
  size_t shadow_src_stride_ = 0;
};

}  // namespace

std::unique_ptr<loss::ChunkExecutor> make_cuda_chunk_executor(CudaExec& ex, Op op, DType grad_dtype,
                                                              const float* grad_factor) {
  return std::make_unique<CudaChunkExecutor>(ex, op, grad_dtype, grad_factor);
}

}  // namespace retort::cuda
