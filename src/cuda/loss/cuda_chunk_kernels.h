// The small device helpers of the CUDA ChunkExecutor (cuda_chunk_exec.cu): elementwise work on chunk blocks,
// the validation of labels and ids, layout copies, and the K-sparse top-K gather / scatter
// (cuda_sparse_topk.cu). Every function queues its kernels on ex.stream and returns at once; every block is
// executor memory (device pointers) described by loss::Block (byte strides). Host-only header.
#pragma once
#include <cstdint>
#include <memory>

#include "../../ops/loss/chunk_scheduler.h"
#include "../cuda_internal.h"

namespace retort::cuda::fused {

using loss::Block;

// c[r, j] += bias[0, j] (c f32, bf16 or f16: the sum in f32, rounded once; bias any float dtype).
void add_bias(CudaExec& ex, const Block& c, const Block& bias);
// dbias[0, j] = (accumulate ? dbias[0, j] : 0) + Σ_r g[r, j], rows summed in order by one thread per column
// (g f32 / bf16 / f16, dbias f32): the same bits for any grid.
void column_sums(CudaExec& ex, const Block& g, const Block& dbias, bool accumulate);
// g[r, :] *= u[r, 0] (g f32 / bf16 / f16, u any float dtype).
void scale_rows(CudaExec& ex, const Block& g, const Block& u);
// Every element of the float block (f32, bf16 or f16) = 0.
void zero(CudaExec& ex, const Block& b);

// Labels [rows, 1]: each one != ignore must be in [0, v), else the backend's device error record names op
// and the value. When inv_count is set, *inv_count = 1 / max(1, rows whose label != ignore) (one block,
// fixed order).
void check_labels(CudaExec& ex, const Block& labels, int64_t ignore, int64_t v, Op op, float* inv_count);
// Ids [rows, K] in [0, v). With slots set (top-K), only the valid slots (mask != 0 and logprob != −inf)
// are checked, as on the CPU, and their logprobs must not be NaN or +inf.
void check_ids(CudaExec& ex, const Block& ids, const loss::TopKSide* slots, int64_t v, Op op);

// A contiguous row-major copy of src [rows, cols] in dtype dt (ints to ints, floats to floats).
void copy_block(CudaExec& ex, const Block& src, DType dt, void* out);
// Labels [rows, 1] as contiguous i64: y (remap false), or −1 for ignored / 0 for counted rows (remap true:
// the gathered top-K kernel, which only needs to know which rows count, checks labels against K).
void copy_labels(CudaExec& ex, const Block& labels, int64_t ignore, bool remap, int64_t* out);
// lp[r, k] = z[r, ids[r, k]] − lse[r]: selective log-softmax's forward values, for a backward whose
// gradient overwrites the logits. ids contiguous i64 [rows, K], z f32 rows of stride ld floats.
void gather_logprobs(CudaExec& ex, const float* z, int64_t ld, int64_t rows, const int64_t* ids, int64_t k,
                     const float* lse, float* lp);

// K-sparse top-K (cuda_sparse_topk.cu; sparse_forward_kl: sparse_fkl.cu).
// The valid slots of one chunk sorted by id (a stable radix sort, so within an id rows and then slots stay in
// order), with each id's run [first[id], last[id]) of sorted positions (first = -1: no slot). The gather
// makes it and the scatter of the same chunk reuses it; `ids`, `rows` and `k` say which chunk it is for.
struct SparseRuns {
  std::unique_ptr<DeviceBuffer> buf;
  const void* ids = nullptr;
  int64_t rows = 0, k = 0, v = 0, count = 0;
  int* keys = nullptr;  // sorted ids (v: an invalid slot, sorted last)
  int* vals = nullptr;  // r·K + k at each sorted position
  int* first = nullptr;
  int* last = nullptr;
  // (r, g bits) per sorted position, written by the scatter once the gradient is known (over the sort's
  // input keys and values, which are dead by then): count pairs.
  int* packed = nullptr;
  bool for_chunk(const loss::TopKSide& side, int64_t r, int64_t kk, int64_t vv) const {
    return buf && ids == side.ids.data && rows == r && k == kk && v == vv;
  }
};

// out[r, k] = hidden[r, :]·w[id_rk, :] (+ bias[0, id_rk]) on valid slots, 0 elsewhere (an id out of range is
// a padding slot: validate() has reported it). With dense 16-byte-aligned rows the slots are visited by id
// (runs made into `runs`), each weight row read once; the dot products have the same bits either way.
void gather_topk_logits(CudaExec& ex, const Block& hidden, const Block& w, const Block& bias,
                        const loss::TopKSide& side, const Block& out, SparseRuns& runs);
// The per-row outputs of sparse_forward_kl (null: not wanted) and the gradient scale (times *grad_scale_dev
// when given: the mean's 1 / count on the device).
struct SparseKlOut {
  float *loss = nullptr, *soft = nullptr, *lse = nullptr;
  float grad_scale = 1.0f;
  const float* grad_scale_dev = nullptr;
};
// The K-sparse top-K path in one pass when the divergence is forward KL (beta = 0, normalize_topk, w_hard =
// 0): per row the K logits, the loss, soft part and LSE of the gathered top-K row loss, g [rows, K] (its
// gradient, for the dW update) and dhidden (+)= Σ_k g_k·w[id_k] as an online softmax-weighted sum of the
// weight rows, each read once. Returns false (and queues nothing) when the layout or options are not this
// kernel's: dense 16-byte-aligned rows of one float dtype, H % 8 == 0, H <= 4096, K <= 4096.
bool sparse_forward_kl(CudaExec& ex, const Block& hidden, const Block& w, const Block& bias,
                       const loss::TopKSide& side, const Block& g, const SparseKlOut& out,
                       const Block& dhidden, bool accumulate_dhidden);
// dhidden[r, :] (+)= Σ_k g[r, k]·w[id_rk, :] (slots in order); dw[id, :] (+)= Σ g·hidden[r, :] and
// dbias[0, id] (+)= Σ g per id in row order (the runs of the gather, or a new sort), skipping g = 0; a
// gradient not accumulated is written whole (0 where no slot points). See ChunkExecutor::scatter_grads.
void scatter_topk_grads(CudaExec& ex, const Block& g, const Block& hidden, const Block& w,
                        const loss::TopKSide& side, const loss::SparseGrads& out, SparseRuns& runs);

}  // namespace retort::cuda::fused
