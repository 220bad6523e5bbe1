// The softmax-epilogue chunk (softmax_chunk.cu, built for sm_90a only): a fused loss chunk whose logits never
// make a round trip through memory. For losses whose logits gradient is a scaled softmax plus one entry per
// row (cross-entropy without label smoothing or softcap), with c_m = z[m, y_m] computed first (one dot
// product per row):
//   E [rows, Vg] bf16 = exp(z − c) and part [tiles, rows] f32 = its row sums per 256-column tile, written by
//       the logits GEMM's epilogue (a persistent TMA + wgmma kernel: z itself is never stored);
//   S_m = Σ part, lse_m = c_m + log S_m, loss_m = log S_m + z_loss·lse_m² (since c_m = z at the label);
//   the logits gradient G = s_m·E' with s_m = coef_m·(1 + 2·z_loss·lse_m)/S_m and E' = E except
//       E'[m, y_m] = E[m, y_m] − S_m/(1 + 2·z_loss·lse_m) (the one-hot term, folded in by the row kernel);
//   dhidden = diag(s)·(E'·W) and dW (+)= E'ᵀ·(diag(s)·hidden): cuBLASLt GEMMs on E' with s applied to their
//       small side (the executor runs them).
// E is clamped at 2^126 so it is always finite; a row whose sum leaves [2^-100, 2^100] (its loss is beyond
// ~69 nats of the label's shift, or non-finite inputs) is recomputed exactly by a slow per-row kernel, which
// writes its true gradient row into E with s = 1. Host-only header.
#pragma once
#include <cstddef>
#include <cstdint>

#include "../cuda_internal.h"
#include "distill_rows.h"

namespace retort::cuda {

// Whether the epilogue GEMM can run on this device: this build holds sm_90a code and the device is
// compute capability 9.0.
bool softmax_epilogue_supported(int device);

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
  float* part = nullptr;         // [tiles(wrows), rows]
};
// The 256-column tiles of a row: the part buffer holds this many floats per row.
int64_t softmax_tiles(int64_t wrows);
// Queues the epilogue GEMM on stream. Throws retort::Error when the layout is not as above.
void softmax_gemm(const SoftmaxGemm& g, int sm_count, cudaStream_t stream);

// shift[m] = hidden[m, :]·W[y_m, :] in f32 (y_m = labels[m], or 0 for an ignored or out-of-range label).
void label_logits(const void* x, int64_t ldx, const void* w, int64_t ldw, int64_t rows, int64_t h,
                  const int64_t* labels, int64_t ignore, int64_t v, float* shift, cudaStream_t stream);

struct SoftmaxCeRows {
  const float* part = nullptr;
  int64_t tiles = 0, rows = 0, v = 0, wrows = 0;
  const float* shift = nullptr;
  const int64_t* labels = nullptr;
  int64_t ignore = -100;
  float z_loss = 0.0f;
  float* loss = nullptr;  // [rows] or nullptr
  float* lse = nullptr;   // [rows] or nullptr
  // Gradient (e set): coef_m = grad_scale · (*scale_dev when set) · upstream[m] (1 without upstream).
  void* e = nullptr;
  int64_t lde = 0;
  float grad_scale = 1.0f;
  const float* scale_dev = nullptr;
  SideMatrix upstream;     // [rows, 1] any float dtype, or no data
  float* s = nullptr;      // [rows] the row scales
  int32_t* bad = nullptr;  // [rows] 1: recomputed by softmax_ce_fallback
  // The fallback's inputs.
  const void* x = nullptr;
  int64_t ldx = 0;
  const void* w = nullptr;
  int64_t ldw = 0, h = 0;
};
// The row statistics, losses and (with e) the row scales and the one-hot fold; then the exact recomputation
// of the rows marked bad. Both queued on stream.
void softmax_ce_rows(const SoftmaxCeRows& r, cudaStream_t stream);

// dh[m, :] = (accumulate ? dh[m, :] : 0) + s[m]·t[m, :] (f32; t may be dh itself when not accumulating).
void scale_add_rows(float* dh, int64_t dh_ld, const float* t, int64_t t_ld, int64_t rows, int64_t h,
                    const float* s, bool accumulate, cudaStream_t stream);
// out[m, :] = bf16(s[m]·x[m, :]) (x bf16 rows of stride ldx, out dense [rows, h]).
void scale_rows_bf16(const void* x, int64_t ldx, int64_t rows, int64_t h, const float* s, void* out,
                     cudaStream_t stream);

// Rows recomputed by the exact fallback since the process started (all devices).
size_t softmax_fallback_rows();

}  // namespace retort::cuda
