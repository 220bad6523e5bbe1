// The CUDA row-loss entry (cuda_row_loss.h).
#include "cuda_row_loss.h"

#include <algorithm>

#include "../cuda_common.cuh"
#include "../topk_rows.h"
#include "cuda_chunk_kernels.h"
#include "distill_rows.h"

namespace retort::cuda {

using loss::Block;
using loss::LossKind;

SideMatrix side(const Block& b) {
  if (b.empty()) return {};
  return {b.data, b.dtype, int64_t(b.row_stride), int64_t(b.col_stride)};
}
SideMatrix side_vec(const Block& b) {
  if (b.empty()) return {};
  return {b.data, b.dtype, int64_t(b.row_stride), 0};
}

namespace {

// Selective log-softmax: the kernel wants contiguous ids (and upstream). Its backward recomputes p at an id
// from the logits unless given the forward's log-probabilities; when the gradient overwrites the logits in
// place those are gathered first (z[id] − lse).
void selective(CudaExec& ex, const loss::SelectiveSide& s, RowBlock& b, const TempFn& temp) {
  const int64_t rows = b.rows, k = s.ids.cols;
  auto* ids = static_cast<int64_t*>(temp(size_t(rows * k) * sizeof(int64_t)));
  fused::copy_block(ex, s.ids, DType::I64, ids);
  SelectiveRows o;
  o.ids = ids;
  o.id_dtype = DType::I64;
  o.K = k;
  const bool dense_f32 = s.values.dtype == DType::F32 && s.values.col_stride == sizeof(float) &&
                         (rows == 1 || s.values.row_stride == size_t(k) * sizeof(float));
  if (!b.grad) {
    RT_CHECK(dense_f32, "cuda selective_log_softmax: the output must be contiguous f32");
    o.out = static_cast<float*>(s.values.data);
    selective_log_softmax_rows(b, o, nullptr, ex.stream);
    return;
  }
  RT_ASSERT(s.lse);
  float* up = static_cast<float*>(s.values.data);
  if (!dense_f32) {
    up = static_cast<float*>(temp(size_t(rows * k) * sizeof(float)));
    fused::copy_block(ex, s.values, DType::F32, up);
  }
  o.upstream = up;
  b.lse = const_cast<float*>(s.lse);  // read only on the backward
  if (b.grad == b.logits) {
    auto* lp = static_cast<float*>(temp(size_t(rows * k) * sizeof(float)));
    fused::gather_logprobs(ex, static_cast<const float*>(b.logits), b.stride, rows, ids, k, s.lse, lp);
    o.out = lp;
  }
  selective_log_softmax_rows(b, o, nullptr, ex.stream);
}

// The teacher head: the top-K row pass of topk_logprobs with the row's LSE and its target's nll.
void topk_logprobs(CudaExec& ex, const loss::TopKLogprobsSide& s, const RowBlock& b, Op op) {
  const int64_t k = s.k;
  auto dense = [&](const Block& x, size_t es) {
    return x.col_stride == es && (b.rows == 1 || x.row_stride == size_t(k) * es);
  };
  RT_CHECK(dense(s.logprobs, sizeof(float)) && dense(s.ids, sizeof(int32_t)) &&
               s.logprobs.dtype == DType::F32 && s.ids.dtype == DType::I32,
           "cuda ", op_name(op), ": the log-probs and ids must be contiguous f32 and i32 [rows, K]");
  TopKRowsArgs a;
  a.logits = b.logits;
  a.dtype = b.dtype;
  a.rows = b.rows;
  a.V = b.V;
  a.row_stride = b.stride * int64_t(dtype_size(b.dtype));
  a.K = k;
  a.logprobs = static_cast<float*>(s.logprobs.data);
  a.ids = static_cast<int32_t*>(s.ids.data);
  a.lse = b.lse;
  if (!s.labels.empty()) {
    a.nll = b.loss;
    a.labels = s.labels.data;
    a.label_dtype = s.labels.dtype;
    a.label_stride = int64_t(s.labels.row_stride);
    a.ignore_index = s.ignore_index;
  } else if (b.loss) {
    RT_CUDA_CHECK(cudaMemsetAsync(b.loss, 0, size_t(b.rows) * sizeof(float), ex.stream));
  }
  a.op = op;
  a.row0 = s.row0;
  topk_rows(ex, a);
}

}  // namespace

void row_loss(CudaExec& ex, const loss::LossSpec& spec, RowBlock& b, float* hard, float* soft, Op op,
              const TempFn& temp) {
  void* stream = ex.stream;
  const ErrorSink sink{ex.dev_error, op};
  const bool gathered = spec.kind == LossKind::TopK && spec.topk.ids.empty();
  switch (spec.kind) {
    case LossKind::CrossEntropy: {
      const Block& lab = spec.ce.labels;
      CrossEntropyRows o;
      if (lab.row_stride == dtype_size(lab.dtype)) {  // the kernel reads labels[r] contiguous
        o.labels = lab.data;
        o.label_dtype = lab.dtype;
      } else {
        auto* p = static_cast<int64_t*>(temp(size_t(lab.rows) * sizeof(int64_t)));
        fused::copy_labels(ex, lab, spec.ce.ignore_index, false, p);
        o.labels = p;
        o.label_dtype = DType::I64;
      }
      o.ignore_index = spec.ce.ignore_index;
      o.label_smoothing = spec.ce.label_smoothing;
      o.z_loss = spec.ce.z_loss;
      o.softcap = spec.ce.softcap;
      cross_entropy_rows(b, o, nullptr, stream);
      return;
    }
    case LossKind::TopK: {
      const loss::TopKSide& s = spec.topk;
      TopKRows o;
      o.ids = side(s.ids);
      o.logprobs = side(s.logprobs);
      o.mask = side(s.mask);
      o.labels = side_vec(s.labels);
      o.ignore_index = s.ignore_index;
      if (gathered && !s.labels.empty()) {
        // The gathered kernel checks labels against K; here they only say which rows count.
        auto* p = static_cast<int64_t*>(temp(size_t(s.labels.rows) * sizeof(int64_t)));
        fused::copy_labels(ex, s.labels, s.ignore_index, true, p);
        o.labels = {p, DType::I64, int64_t(sizeof(int64_t)), 0};
        o.ignore_index = -1;
      }
      o.K = s.logprobs.cols;
      o.div = s.div;
      o.temperature = s.temperature;
      o.w_hard = s.w_hard;
      o.w_soft = s.w_soft;
      o.normalize_topk = s.normalize_topk;
      o.hard = hard;
      o.soft = soft;
      if (b.grad && !gathered && o.K <= kMaxFastSlots) o.scratch = temp(topk_scratch_bytes(b.rows, o.K));
      topk_distill_rows(b, o, sink, stream);
      return;
    }
    case LossKind::Distill: {
      const loss::DistillSide& s = spec.distill;
      const size_t tes = dtype_size(s.teacher.dtype);
      RT_CHECK(s.teacher.col_stride == tes, "cuda distill: the teacher logits must have contiguous rows");
      DistillRows o;
      o.teacher = s.teacher.data;
      o.teacher_dtype = s.teacher.dtype;
      o.teacher_stride = std::max<int64_t>(s.teacher.cols, int64_t(s.teacher.row_stride / tes));
      o.labels = side_vec(s.labels);
      o.ignore_index = s.ignore_index;
      o.div = s.div;
      o.temperature = s.temperature;
      o.w_hard = s.w_hard;
      o.w_soft = s.w_soft;
      o.hard = hard;
      o.soft = soft;
      distill_rows(b, o, sink, stream);
      return;
    }
    case LossKind::Entropy:
      entropy_rows(b, EntropyRows{spec.entropy.temperature}, stream);
      return;
    case LossKind::SelectiveLogSoftmax:
      selective(ex, spec.selective, b, temp);
      return;
    case LossKind::TopKLogprobs:
      RT_ASSERT(!b.grad);
      topk_logprobs(ex, spec.topk_lp, b, op);
      return;
  }
}

}  // namespace retort::cuda
