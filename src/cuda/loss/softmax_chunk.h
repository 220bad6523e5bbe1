// The softmax-epilogue chunk (softmax_chunk.cu: the GEMM, built for sm_90a only; softmax_rows.cu: the row
// pass): a fused loss chunk whose logits never make a round trip through memory. For losses whose logits
// gradient is a scaled softmax plus one entry per row (cross-entropy without label smoothing or softcap;
// top-K forward KL at T = 1, see SoftmaxRows), with c_m = z[m, y_m] computed first (one dot product per row):
//   E [rows, Vg] bf16 = exp(z − c) and part [rows, tiles] f32 = its row sums per 256-column tile, written by
//       the logits GEMM's epilogue (a persistent TMA + wgmma kernel: z itself is never stored);
//   S_m = Σ part, lse_m = c_m + log S_m, loss_m = log S_m + z_loss·lse_m² (since c_m = z at the label);
//   the logits gradient G = s_m·E' with s_m = coef_m·(1 + 2·z_loss·lse_m)/S_m and E' = E except
//       E'[m, y_m] = E[m, y_m] − S_m/(1 + 2·z_loss·lse_m) (the one-hot term, folded in by the row kernel);
//   dhidden = diag(s)·(E'·W) and dW (+)= E'ᵀ·(diag(s)·hidden): cuBLASLt GEMMs on E' with s applied to their
//       small side (the executor runs them).
// A row whose sum leaves [2^-100, 2^100] (its loss is beyond ~69 nats of the label's shift, an E overflowed
// to inf, or non-finite inputs) is recomputed exactly by a slow per-row kernel, which writes its true
// gradient row into E with s = 1 (so no inf meets the gradient GEMMs). Host-only header.
#pragma once
#include <cstddef>
#include <cstdint>

#include "../cuda_internal.h"
#include "distill_rows.h"

namespace retort::cuda {

// Whether the epilogue GEMM can run on this device: this build holds sm_90a code and the device is
// compute capability 9.0.
bool softmax_epilogue_supported(int device);

// How the epilogue GEMM's two consumer warpgroups share the work: both on one 128 x 256 tile, their epilogues
// together while the tensor cores wait (Cooperative), or each on 64 x 256 tiles of its own, their mainloops
// in turn so that one's epilogue runs under the other's wgmmas (PingPong: hides the epilogue, but a W tile
// then serves 64 rows instead of 128, so L2 traffic per flop is 5/3 of the cooperative's; it wins at small
// H, where the epilogue is a large part of a tile's time, and loses at large H: bench/HISTORY.md, session
// 19).
enum class SoftmaxSchedule { Cooperative = 1, PingPong = 2 };
// The schedule the CUDA executor picks by default (CudaOptions::softmax_pingpong = -1): ping-pong up to this
// H.
inline constexpr int64_t kSoftmaxPingPongMaxH = 1024;

// bf16 row-major operands, rows 16-byte aligned (ld a multiple of 8 elements, base 16-byte aligned).
struct SoftmaxGemm {
  const void* x = nullptr;  // [rows, h]
  int64_t ldx = 0;
  const void* w = nullptr;  // [wrows, h]
  int64_t ldw = 0;
  int64_t rows = 0, h = 0, wrows = 0, v = 0;  // v ≤ wrows: columns ≥ v of E are 0 and not summed
  void* e = nullptr;                          // [rows, lde] bf16 (nullptr: forward only, E not written)
  int64_t lde = 0;
  const float* shift = nullptr;  // [rows]
  float* part = nullptr;         // [rows, softmax_tiles(wrows)]
  SoftmaxSchedule schedule = SoftmaxSchedule::Cooperative;
};
// The 256-column tiles of a row: the part buffer holds this many floats per row.
int64_t softmax_tiles(int64_t wrows);
// Queues the epilogue GEMM on stream. Throws retort::Error when the layout is not as above.
void softmax_gemm(const SoftmaxGemm& g, int sm_count, cudaStream_t stream);

// The per-row side of a chunk: cross-entropy, or top-K distillation with forward KL at T = 1 over the full
// vocabulary's Q (its gradient is also a scaled softmax plus one entry per slot and one at the label):
//   hard = lse − z_y (with labels), soft = Σ_slots p_k (log p_k − (z_{id_k} − lse)), p_k = exp(logprob_k),
//   loss = w_hard·hard + w_soft·soft + z_loss·lse² (cross-entropy: w_hard 1, no slots),
//   G = coef·[(w_hard + 2·z_loss·lse + w_soft·Σ p_k)·softmax − w_hard·[j = y] − w_soft·Σ_k p_k·[j = id_k]].
// Slot k is valid when mask != 0 (or no mask), logprob != −inf and 0 ≤ id < v, as in the row kernels.
struct SoftmaxRows {
  const float* part = nullptr;
  int64_t tiles = 0, rows = 0, v = 0, wrows = 0;
  const float* shift = nullptr;
  const int64_t* labels = nullptr;  // contiguous, or nullptr: every row counts, no hard part
  int64_t ignore = -100;
  float z_loss = 0.0f, w_hard = 1.0f, w_soft = 0.0f;
  // Slots (k > 0): ids contiguous i64 [rows, k]; z at the ids f32 [rows, k] (0 on invalid slots), or, when
  // zk is null, shift + ln E[m, id] from the bf16 block e_read (|error| ≤ 2^-8, for 16-bit logits, whose
  // row pass reads z from bf16: |error| ≤ 2^-9·|z|; a slot whose E underflowed takes the exact kernel).
  int64_t k = 0;
  const int64_t* ids = nullptr;
  const float* zk = nullptr;
  const void* e_read = nullptr;
  SideMatrix logprobs, mask;  // [rows, k]; mask may have no data
  float* loss = nullptr;      // [rows] or nullptr
  float* lse = nullptr;       // [rows] or nullptr
  float* hard = nullptr;      // [rows] or nullptr (unweighted)
  float* soft = nullptr;      // [rows] or nullptr (unweighted)
  // Gradient (e set): coef_m = grad_scale · (*scale_dev when set) · upstream[m] (1 without upstream).
  void* e = nullptr;
  int64_t lde = 0;
  float grad_scale = 1.0f;
  const float* scale_dev = nullptr;
  SideMatrix upstream;     // [rows, 1] any float dtype, or no data
  float* s = nullptr;      // [rows] the row scales
  void* xs = nullptr;      // [rows, h] bf16: s_m·hidden[m, :] for dW, or nullptr
  int32_t* bad = nullptr;  // [rows] 1: recomputed by the exact kernel
  // hidden and W (the shift, the exact kernel).
  const void* x = nullptr;
  int64_t ldx = 0;
  const void* w = nullptr;
  int64_t ldw = 0, h = 0;
};
// The most slots the row kernels take.
inline constexpr int64_t kSoftmaxMaxSlots = 128;

// The shift: shift[m] = hidden[m, :]·W[y_m, :] in f32 with labels (y_m = labels_in[m], or 0 for an ignored or
// out-of-range label), copying the labels into r.labels as i64; without labels the largest z at a valid slot.
// labels_in: [rows, 1] int of any stride (its data null without labels).
void softmax_shift(const SoftmaxRows& r, const SideMatrix& labels_in, float* shift, cudaStream_t stream);
// The row statistics, losses and (with e) the row scales, the folded entries and xs; then the exact
// recomputation of the rows marked bad. Both queued on stream.
void softmax_rows(const SoftmaxRows& r, cudaStream_t stream);

// The last few columns of E' (and rows of W) that the dhidden GEMM left out (cols < 8; 0: none): E'[m, j]
// at e + m·lde + j and W[j, :] at w + j·ldw, bf16, j < cols.
struct ScaleAddTail {
  int64_t cols = 0;
  const void* e = nullptr;
  int64_t lde = 0;
  const void* w = nullptr;
  int64_t ldw = 0;
};
// dh[m, :] = (accumulate ? dh[m, :] : 0) + s[m]·(t[m, :] + Σ_j E'[m, j]·W[j, :]) over the tail's columns
// (f32; t may be dh itself when not accumulating; s[m] = 0 adds nothing, whatever t holds).
void scale_add_rows(float* dh, int64_t dh_ld, const float* t, int64_t t_ld, int64_t rows, int64_t h,
                    const float* s, bool accumulate, const ScaleAddTail& tail, int sm_count,
                    cudaStream_t stream);

// Rows recomputed by the exact fallback since the process started (all devices).
size_t softmax_fallback_rows();

// Raises kernel's dynamic shared memory limit to bytes on the current device when it is lower (attributes are
// per device): the epilogue GEMM's and the exact fallback's launches.
void allow_smem(const void* kernel, size_t bytes);

}  // namespace retort::cuda
