// flash_attention's forward on Hopper tensor cores (wgmma), for head dim 64: built as sm_90a code only (meson
// compiles attention_sm90.cu for that target when sm_90 is asked for); elsewhere it reports that it cannot
// run and cuda_attention.cu's mma.sync kernel serves.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace retort::cuda {

struct AttentionFwdArgs {
  const void* q;  // [B, Tq, H, D], 16-bit
  const void* k;  // [B, Tk, KV, D]
  const void* v;  // [B, Tk, KV, D]
  void* o;        // [B, Tq, H, D]
  float* lse;     // [B, H, Tq], natural log; -inf for a row that sees no key
  int B, Tq, Tk, H, KV, D;
  int causal, n_past;
  float scale_log2;  // scale · log2(e)
  bool bf16;         // else f16
};

// Runs the forward and returns true when this build and device have the Hopper kernel for these arguments
// (compute capability 9.0, an sm_90a build, D 64); returns false, launching nothing, otherwise.
bool attention_fwd_sm90(const AttentionFwdArgs& a, cudaStream_t stream);
// Whether device runs the Hopper kernel (compute capability 9.0 and an sm_90a build).
bool attention_sm90_available(int device);

}  // namespace retort::cuda
