// The cuBLASLt pieces every retort GEMM shares (cuda_matmul.cu's graph matmul and the fused losses' chunk
// GEMMs, loss/chunk_gemm.h): the data type of a dtype, the alignment to promise, owners of the descriptors,
// and the preference that states the workspace and the alignments. Host-only header.
#pragma once
#include <cublasLt.h>

#include <cstdint>
#include <initializer_list>

#include "../core/dtype.h"
#include "../core/error.h"
#include "cuda_internal.h"

namespace retort::cuda {

// The cuBLASLt data type of a float dtype; throws retort::Error naming `what` for any other.
inline cudaDataType_t lt_type(DType t, const char* what) {
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
  RT_FAIL(what, ": GEMM operands must be f32, bf16 or f16, got ", dtype_name(t));
}

// The largest power of two (at most 256) dividing every address cuBLASLt will form from these byte offsets
// (base address, column step, batch steps). cuBLASLt assumes 256-byte aligned operands unless told
// otherwise, and views and odd leading dimensions are less aligned.
inline uint32_t lt_alignment(std::initializer_list<uint64_t> offsets) {
  uint64_t v = 0;
  for (uint64_t o : offsets) v |= o;
  uint32_t a = 256;
  while (a > 1 && (v & (a - 1))) a >>= 1;
  return a;
}

// Owners of the cuBLASLt descriptors.
struct LtMatmulDesc {
  cublasLtMatmulDesc_t d = nullptr;
  LtMatmulDesc() = default;
  LtMatmulDesc(const LtMatmulDesc&) = delete;
  LtMatmulDesc& operator=(const LtMatmulDesc&) = delete;
  ~LtMatmulDesc() {
    if (d) (void)cublasLtMatmulDescDestroy(d);
  }
};
struct LtLayout {
  cublasLtMatrixLayout_t l = nullptr;
  LtLayout() = default;
  LtLayout(const LtLayout&) = delete;
  LtLayout& operator=(const LtLayout&) = delete;
  ~LtLayout() {
    if (l) (void)cublasLtMatrixLayoutDestroy(l);
  }
};
struct LtPref {
  cublasLtMatmulPreference_t p = nullptr;
  LtPref() = default;
  LtPref(const LtPref&) = delete;
  LtPref& operator=(const LtPref&) = delete;
  ~LtPref() {
    if (p) (void)cublasLtMatmulPreferenceDestroy(p);
  }
};

// A matmul descriptor: f32 scale type, cuBLASLt's first operand op_x, its second op_y.
inline void lt_matmul_desc(LtMatmulDesc& md, cublasComputeType_t compute, cublasOperation_t op_x,
                           cublasOperation_t op_y) {
  RT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&md.d, compute, CUDA_R_32F));
  RT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(md.d, CUBLASLT_MATMUL_DESC_TRANSA, &op_x, sizeof(op_x)));
  RT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(md.d, CUBLASLT_MATMUL_DESC_TRANSB, &op_y, sizeof(op_y)));
}

// A preference with the workspace and the alignments of cuBLASLt's A (our B), B (our A) and C = D.
inline void lt_preference(LtPref& pref, uint64_t workspace, uint32_t al_a, uint32_t al_b, uint32_t al_c) {
  RT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref.p));
  RT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                       &workspace, sizeof(workspace)));
  RT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                       &al_a, sizeof(al_a)));
  RT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                       &al_b, sizeof(al_b)));
  RT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                       &al_c, sizeof(al_c)));
  RT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                       &al_c, sizeof(al_c)));
}

}  // namespace retort::cuda
