// The CUDA backend: device buffers from a caching allocator, one stream, cuBLASLt GEMMs and kernels for every
// core op. Available when retort was built with CUDA (RETORT_HAS_CUDA) and a device is present.
//
// Errors found on the device (an id or label out of range, a NaN teacher logprob) cannot throw where they
// happen: the kernel sets a flag, and the next synchronize() or read() on the backend throws retort::Error
// naming the op and the value.
#pragma once
#include <cstddef>
#include <memory>
#include <string>

#include "../core/backend.h"

namespace retort {

// Which of the fused linear losses' GEMMs choose their cuBLASLt algorithm by timing (CudaOptions::gemm_tune).
enum class GemmTune {
  Off,           // cuBLASLt's first choice for every GEMM
  Accumulating,  // timed for the GEMMs that add into their output (dW over chunks, dhidden when asked)
  All,           // timed for every GEMM shape
};

struct CudaOptions {
  // f32 matmuls may use TF32 tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32): several times faster, but products
  // keep only 10 bits of mantissa (about 1e-3 relative error). Off by default.
  bool allow_tf32 = false;
  // Use the plain CUDA GEMM kernel instead of cuBLASLt for every matmul (for tests and debugging; slow).
  bool simple_gemm = false;
  // cuBLASLt workspace size in bytes (taken once from the allocator).
  size_t gemm_workspace_bytes = size_t(32) << 20;
  // Fused linear losses: which GEMMs time cuBLASLt's first 8 candidate algorithms for their shape (at the
  // first call that overwrites its output, on the GEMM's own operands, per backend; and once more at such a
  // call 2 s or more later, when the GPU runs at the clocks its power cap allows under load) and keep the
  // fastest (cuBLASLt's first choice unless another is > 3 % faster). The steps that time wait for the
  // timings (~0.1-0.5 s at LLM sizes), and two processes may pick different algorithms, whose results differ
  // in f32 rounding (Off for bitwise-reproducible runs); at most 64 shapes per backend are timed, later ones
  // take the first choice. Default All: on an H100 cuBLASLt's first choice is 11-17 % slower than another of
  // its first 8 candidates for the 16-bit logits GEMMs in steady state, and 5-12 % for dW += Gᵀ·H
  // (bench/HISTORY.md, sessions 14 and 15). Environment: RETORT_GEMM_TUNE (see cuda_options_from_env).
  GemmTune gemm_tune = GemmTune::All;
  // A file that keeps the timed picks across processes (empty: none): a GEMM shape that gemm_tune times,
  // found there under this device's signature (its name, SM count, cuBLASLt version and workspace size) takes
  // the recorded algorithms without timing, so runs on one machine pick the same algorithms and round alike;
  // each shape timed is added (merged with the file, written atomically: src/cuda/tune_cache.h). A pick is
  // recorded when first timed and again when timed the second time; delete the file to time afresh. A
  // malformed file is a retort::Error naming it at the first fused GEMM. Environment: RETORT_GEMM_CACHE.
  std::string gemm_cache;
  // Fused cross-entropy on sm_90a (H100 / H200) with bf16 hidden and weight, no bias, no label smoothing and
  // no softcap: each chunk's logits GEMM forms exp(z − z_label) in its epilogue, so the logits never make the
  // round trip through memory that a row pass costs (src/cuda/loss/softmax_chunk.h; the gradient GEMMs
  // read that bf16 matrix, as they read the bf16 gradient otherwise). Other losses, options and devices take
  // the row-pass path.
  bool softmax_epilogue = true;
  // How that epilogue GEMM's two consumer warpgroups share the work. Ping-pong (1): each takes 64 x 256 tiles
  // of its own and they run their mainloops in turn, so one's epilogue (the exponentials and the bf16
  // stores) runs while the other's matrix instructions keep the tensor cores busy. Cooperative (0): both
  // work on one 128 x 256 tile and the tensor cores wait during their epilogue, with 3/5 of the ping-pong's
  // L2 traffic per flop. -1 (the default): ping-pong for H ≤ 1,024, where the epilogue is a large part of
  // each tile's time (H100, session 19: fused CE at H = 768 1.13-1.15x its floor against 1.17; top-K at
  // H = 2,048 1.16 against 1.07-1.10). Other values throw retort::Error from make_cuda_backend.
  int softmax_pingpong = -1;
  // flash_attention's forward at head dim 64 on sm_90a (H100 / H200) runs on wgmma (src/cuda/attention_sm90.h);
  // off, or on other devices and head dims, the mma.sync kernel every sm_80+ device runs (tests compare both).
  bool hopper_attention = true;
  // A graph that runs again with the same nodes, parameters and placement (a training step, a teacher
  // forward over same-shaped batches) has its launches recorded as a CUDA Graph at its second run and
  // replayed from then on: one launch instead of hundreds, the same kernels in the same order, so
  // bit-identical results. Recording waits until the fused losses' GEMM timings have settled; a list whose
  // launchers cannot be recorded runs eagerly. The recording keeps the temporaries it used for the graph's
  // life.
  bool graphs = true;
  // Every node's kernels timed with a pair of CUDA events, summed per op and per op and shape, printed to
  // stderr when the backend goes away (cuda_reset_peak restarts the count). Turns CUDA Graph replay off, so
  // it times eager launches. Environment: RETORT_OP_PROFILE.
  bool op_profile = false;
  // The fused losses' phases (each GEMM by shape, each row loss, the whole op) timed in context by CUDA
  // events, medians and means printed to stderr at exit (src/cuda/loss/phase_profile.h). Process-wide: the
  // first backend made with it on turns it on. Environment: RETORT_CHUNK_PROFILE.
  bool chunk_profile = false;
};

// The environment's word on a CudaOptions, read in this one place (make_cuda_backend calls it on the options
// it is given, so a program gets the switches without code):
//   RETORT_GEMM_TUNE=0|1|2     gemm_tune: Off, Accumulating, All
//   RETORT_GEMM_CACHE=<path>   gemm_cache
//   RETORT_OP_PROFILE=1        op_profile (0 or unset: as given)
//   RETORT_CHUNK_PROFILE=1     chunk_profile (0 or unset: as given)
// An unset or empty variable leaves the option as given. Throws retort::Error naming the variable when a
// value is not one of those.
CudaOptions cuda_options_from_env(CudaOptions options);

// True when retort was built with CUDA and at least one device is usable; why_not gets the reason otherwise.
// Never throws and never aborts: a missing device or a failing driver is a reason, not a crash.
bool cuda_available(std::string* why_not = nullptr);
// A backend on the given device. Throws retort::Error when CUDA is unavailable (the message says why).
std::unique_ptr<Backend> make_cuda_backend(int device = 0, const CudaOptions& options = {});

// What the caching device allocator of a CUDA backend holds. Sizes are the allocator's rounded block sizes.
struct CudaMemoryStats {
  size_t bytes_in_use = 0;    // live buffers (tensors, arenas, workspace, temporaries)
  size_t peak_bytes = 0;      // the highest bytes_in_use since the backend was made or cuda_reset_peak
  size_t bytes_cached = 0;    // freed blocks kept for reuse
  size_t bytes_reserved = 0;  // bytes_in_use + bytes_cached: what the backend holds on the device
  size_t alloc_calls = 0;     // allocations served
  size_t device_allocs = 0;   // of those, how many needed cudaMalloc (cache misses)
};

// Allocator statistics of a CUDA backend. Throws retort::Error if backend is not a CUDA backend.
CudaMemoryStats cuda_memory_stats(Backend& backend);
// Sets peak_bytes to the current bytes_in_use (and restarts the RETORT_OP_PROFILE table when it is on).
// Throws retort::Error if backend is not a CUDA backend.
void cuda_reset_peak(Backend& backend);
// Returns cached (free) blocks to the device. Throws retort::Error if backend is not a CUDA backend.
void cuda_empty_cache(Backend& backend);
// Whether the CUDA backend has a kernel for op (asks no device; op_list.h says which ops must have one).
// Throws retort::Error when retort was built without CUDA or op is outside the op list.
bool cuda_has_kernel(Op op);
// How many GEMM shapes the backend's fused linear losses timed cuBLASLt's algorithms for
// (CudaOptions::gemm_tune). Throws retort::Error if backend is not a CUDA backend.
size_t cuda_tuned_gemms(Backend& backend);
// How many of those took their algorithms from CudaOptions::gemm_cache instead of timing them. Throws
// retort::Error if backend is not a CUDA backend.
size_t cuda_cached_gemms(Backend& backend);
// The softmax-epilogue path (CudaOptions::softmax_epilogue): chunks the backend ran on it, and rows that
// any backend of this process had to recompute exactly because their sum left the epilogue's range (a loss
// beyond ~69 nats at the label's shift, or non-finite inputs). Throws retort::Error if backend is not a
// CUDA backend.
struct CudaSoftmaxEpilogueStats {
  bool supported = false;  // the build and the device can run it (sm_90a code, compute capability 9.0)
  size_t chunks = 0;
  size_t fallback_rows = 0;
};
CudaSoftmaxEpilogueStats cuda_softmax_epilogue_stats(Backend& backend);
// Whether flash_attention's forward at head dim 64 runs the wgmma kernel on this backend
// (CudaOptions::hopper_attention on, an sm_90a build, a device of compute capability 9.0). Throws
// retort::Error if backend is not a CUDA backend.
bool cuda_hopper_attention(Backend& backend);

// CUDA Graph recording (CudaOptions::graphs) of a CUDA backend: node lists recorded, runs replayed from a
// recording, recordings abandoned (a launcher could not be recorded; the list ran eagerly), and the last
// abandonment's reason. Throws retort::Error if backend is not a CUDA backend.
struct CudaGraphStats {
  size_t captures = 0;
  size_t replays = 0;
  size_t failures = 0;
  std::string last_failure;
};
CudaGraphStats cuda_graph_stats(Backend& backend);

}  // namespace retort
