// Math over f32 arrays for the CPU kernels: elementwise exp and log, sums and max (softmax statistics and
// loss gradients), dot and axpy (the K-sparse path's weight rows); eight lanes at a time with AVX2+FMA when
// the CPU has it (decided once, like the GEMM's kernel), one element at a time with std:: functions
// otherwise.
//
// The AVX2 versions are range reduction + minimax polynomial (the classic single-precision Cephes
// coefficients): within 2 ulp of the exact value on normal results. They differ from std:: at the edges in
// documented ways: exp(x) is exactly 0 below ln(FLT_MIN) ≈ −87.34 (no subnormal results), +inf above
// ln(FLT_MAX); log(0) = −inf, log(x < 0) = NaN, log(+inf) = +inf; NaN in, NaN out. Every result depends only
// on its input (tails go through the same lanes), and every sum is taken in a fixed order for a given n, so
// results do not depend on where an array starts or on the thread that computes it.
#pragma once
#include <cstdint>

namespace retort::vmath {

// Avx512 runs exp, exp_affine, sum_exp and max on 16 lanes (the same exp, lane for lane), AVX2 the rest.
enum class Impl { Portable, Avx2, Avx512 };
Impl best_impl();                // Avx512 with AVX-512F, else Avx2 when the CPU has AVX2 and FMA
bool impl_available(Impl impl);  // Portable always
const char* impl_name(Impl impl);

// out[i] = a·exp((x[i] − m)·scale − shift) + c, plus out[i]'s old value when accumulate; returns Σ out[i] in
// f64. x and out may be the same array (in place); otherwise they must not overlap.
double exp_affine(const float* x, float* out, int64_t n, float m, float scale, float shift, float a, float c,
                  bool accumulate = false, Impl impl = best_impl());
// x[i] = exp(x[i]); x[i] = log(x[i]).
void exp(float* x, int64_t n, Impl impl = best_impl());
void log(float* x, int64_t n, Impl impl = best_impl());
// Σ exp((x[i] − m)·scale) in f32.
float sum_exp(const float* x, int64_t n, float m, float scale, Impl impl = best_impl());
// The largest x[i], NaNs skipped (−inf when n = 0 or every value is NaN or −inf).
float max(const float* x, int64_t n, Impl impl = best_impl());
// Σ x[i] in f64.
double sum(const float* x, int64_t n, Impl impl = best_impl());
// Σ a[i]·b[i] in f32 (the K-sparse path's dot products with weight rows); y[i] += a·x[i].
float dot(const float* a, const float* b, int64_t n, Impl impl = best_impl());
void axpy(float a, const float* x, float* y, int64_t n, Impl impl = best_impl());

}  // namespace retort::vmath
