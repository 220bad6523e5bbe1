// The fused linear losses' chunk GEMMs (ChunkExecutor::gemm) on cuBLASLt, on the blocks' own strides: f32
// accumulation and f32 C, or a 16-bit C (16-bit logits, beta 0) from operands of that dtype; bf16 / f16
// operands on the tensor cores, f32 operands in full f32 (TF32 only when the backend allows it). Descriptors,
// layouts and the chosen algorithm are kept per shape and types (a chunk loop repeats three or four shapes);
// algorithms are timed per CudaOptions::gemm_tune and kept in CudaOptions::gemm_cache across processes.
// Host-only header.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../../ops/loss/row_kernels.h"
#include "../cuda_internal.h"

namespace retort::cuda {

struct GemmPlan;

class ChunkGemm {
 public:
  explicit ChunkGemm(CudaExec& ex);
  ~ChunkGemm();
  ChunkGemm(const ChunkGemm&) = delete;
  ChunkGemm& operator=(const ChunkGemm&) = delete;

  // c = alpha · op(a) · op(b) + beta · c, with the contract of loss::ChunkExecutor::gemm.
  void run(const loss::Block& a, bool trans_a, const loss::Block& b, bool trans_b, const loss::Block& c,
           float alpha, float beta);

 private:
  using Block = loss::Block;
  // A contiguous row-major copy of x in dtype dt, kept alive by keep.
  Block converted(const Block& x, DType dt, std::vector<std::unique_ptr<DeviceBuffer>>& keep);
  GemmPlan& plan_for(const std::array<int64_t, 18>& key);
  std::string cache_signature() const;
  bool cache_lookup(GemmPlan& plan);
  void cache_store(const GemmPlan& plan);
  void tune(GemmPlan& plan, const void* a, const void* b, void* c, float alpha);
  void retime(GemmPlan& plan, const void* a, const void* b, void* c, float alpha);

  static constexpr int kTuneCandidates = 8;
  static constexpr size_t kMaxTunedShapes = 64;

  CudaExec& ex_;
  GemmTune tune_;  // CudaOptions::gemm_tune, or RETORT_GEMM_TUNE (read when the backend was made)
  std::vector<std::unique_ptr<GemmPlan>> plans_;
};

}  // namespace retort::cuda
