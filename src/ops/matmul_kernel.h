// The CPU GEMM behind matmul: C = A B with A [M, K] and B [K, N] read through byte strides in any float
// dtype, C f32 row-major. Cache-blocked with packed panels (the packing step absorbs strides, transposes and
// dtypes) and a register-blocked micro-kernel: AVX-512 or AVX2+FMA where the CPU has it, else a portable one.
// Its bf16 form (bgemm) rounds both operands to bf16 and multiplies bf16 pairs with AVX-512 BF16 on AMD CPUs
// that have it. Private to src/ops (and the tests); the op itself is matmul() in ops.h.
#pragma once
#include <cstdint>

#include "../core/dtype.h"

namespace retort {

class ThreadPool;

namespace gemm {

// Avx512Bf16 is bgemm's only (bf16 pairs, vdpbf16ps); sgemm takes Portable, Avx2 or Avx512 (f32 FMAs on zmm).
enum class Kernel { Portable, Avx2, Avx512, Avx512Bf16 };

// True when this CPU can run kernel k (Portable always can).
bool kernel_available(Kernel k);
// The fastest f32 kernel this CPU can run (for sgemm), decided once.
Kernel best_kernel();
// The fastest kernel for bgemm: Avx512Bf16 on AMD CPUs that have it (where it is twice the f32 rate), else
// best_kernel().
Kernel best_bf16_kernel();
const char* kernel_name(Kernel k);

// A matrix operand: element (r, c) lives at data + r * rs + c * cs (byte strides; any sign is not needed,
// only non-negative strides occur).
struct Operand {
  const void* data = nullptr;
  DType dtype = DType::F32;
  int64_t rs = 0;  // bytes between rows
  int64_t cs = 0;  // bytes between columns
};

// C[M, N] (row stride ldc floats) = A[M, K] B[K, N], or C += A B with accumulate (not for a problem
// gemv_applies to). Runs on pool's threads when pool is given and the problem is big enough to pay for it;
// pool == nullptr runs on the calling thread only.
void sgemm(int64_t m, int64_t n, int64_t k, const Operand& a, const Operand& b, float* c, int64_t ldc,
           ThreadPool* pool, Kernel kernel, bool accumulate = false);

// C[M, N] (=|+=) bf16(A) bf16(B): sgemm's contract, but each operand element rounded to bf16 (to nearest
// even; bf16 operands as they are) and the products summed in f32 — a bf16 GEMM's numerics, as on a GPU. With
// Avx512Bf16 the packed panels hold bf16 pairs along k for vdpbf16ps (twice the products per instruction of
// an f32 FMA); Portable, Avx2 and Avx512 round while packing f32 panels and run sgemm's kernels: the same
// rounded operands, sums in another order. Never the dot-product path (it has no rounding).
void bgemm(int64_t m, int64_t n, int64_t k, const Operand& a, const Operand& b, float* c, int64_t ldc,
           ThreadPool* pool, Kernel kernel, bool accumulate = false);
// bgemm with Portable, Avx2 or Avx512 (matmul_kernel.cpp); bgemm itself is in matmul_bf16.cpp.
void gemm_f32_rounding_bf16(int64_t m, int64_t n, int64_t k, const Operand& a, const Operand& b, float* c,
                            int64_t ldc, ThreadPool* pool, Kernel kernel, bool accumulate);

// The most rows of A that sgemm multiplies by dot products (gemv) instead of packed panels.
inline constexpr int64_t kGemvMaxRows = 4;
// True when sgemm takes the dot-product path: at most kGemvMaxRows rows, and B f32 or bf16 with each column
// contiguous (rs = element size: B is Wᵀ of a row-major W, as in x Wᵀ).
bool gemv_applies(int64_t m, const Operand& a, const Operand& b);
// sgemm's arguments, for a problem gemv_applies to (matmul_gemv.cpp).
void gemv(int64_t m, int64_t n, int64_t k, const Operand& a, const Operand& b, float* c, int64_t ldc,
          ThreadPool* pool, Kernel kernel);

}  // namespace gemm
}  // namespace retort
