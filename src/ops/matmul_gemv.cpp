// The CPU GEMM's path for a few rows of A against a B whose columns are contiguous (B = Wᵀ for a row-major
// weight W [N, K], what x Wᵀ reads): each element of C is a dot product of an A row with a W row. A decode
// step multiplies one token's row by every weight, so W streams from memory once, where the packed GEMM would
// first copy all of W into panels to use one row of its 6-row tiles.
#include "matmul_kernel.h"

#if defined(__x86_64__) || defined(__i386__)
#define RETORT_GEMV_X86 1
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstring>
#include <vector>

#include "../core/error.h"
#include "../core/thread_pool.h"

namespace retort::gemm {

namespace {

// Below this many bytes of B per thread, waking another thread costs more than the bandwidth it adds.
constexpr int64_t kMinBytesPerThread = 512 * 1024;
// Columns per block: four dot products share each load of the A row.
constexpr int64_t kCols = 4;

inline float load_b(const char* p, DType t) {
  if (t == DType::F32) {
    float v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, p, sizeof h);
  return bf16_to_f32(h);
}

// c[i, j] for rows i < m and columns [j0, j1): a is [m, k] f32 contiguous, column j of B starts at b + j *
// cs.
void gemv_portable(int64_t m, int64_t k, const float* a, const char* b, int64_t cs, DType bt, int64_t j0,
                   int64_t j1, float* c, int64_t ldc) {
  const int64_t es = int64_t(dtype_size(bt));
  for (int64_t j = j0; j < j1; ++j) {
    const char* col = b + j * cs;
    for (int64_t i = 0; i < m; ++i) {
      float s = 0.0f;
      for (int64_t p = 0; p < k; ++p) s += a[i * k + p] * load_b(col + p * es, bt);
      c[i * ldc + j] = s;
    }
  }
}

#ifdef RETORT_GEMV_X86
__attribute__((target("avx2,fma"), always_inline)) inline __m256 load8(const char* p, DType t) {
  if (t == DType::F32) return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  // bf16 is the top half of an f32: widen and shift.
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

__attribute__((target("avx2,fma"), always_inline)) inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

__attribute__((target("avx2,fma"))) void gemv_avx2(int64_t m, int64_t k, const float* a, const char* b,
                                                   int64_t cs, DType bt, int64_t j0, int64_t j1, float* c,
                                                   int64_t ldc) {
  const int64_t es = int64_t(dtype_size(bt));
  const int64_t k8 = k / 8 * 8;
  int64_t j = j0;
  for (; j + kCols <= j1; j += kCols) {
    const char* col[kCols];
    for (int64_t q = 0; q < kCols; ++q) col[q] = b + (j + q) * cs;
    for (int64_t i = 0; i < m; ++i) {
      const float* ai = a + i * k;
      __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(),
             s3 = _mm256_setzero_ps();
      for (int64_t p = 0; p < k8; p += 8) {
        const __m256 av = _mm256_loadu_ps(ai + p);
        s0 = _mm256_fmadd_ps(av, load8(col[0] + p * es, bt), s0);
        s1 = _mm256_fmadd_ps(av, load8(col[1] + p * es, bt), s1);
        s2 = _mm256_fmadd_ps(av, load8(col[2] + p * es, bt), s2);
        s3 = _mm256_fmadd_ps(av, load8(col[3] + p * es, bt), s3);
      }
      float r[kCols] = {hsum(s0), hsum(s1), hsum(s2), hsum(s3)};
      for (int64_t p = k8; p < k; ++p)
        for (int64_t q = 0; q < kCols; ++q) r[q] += ai[p] * load_b(col[q] + p * es, bt);
      for (int64_t q = 0; q < kCols; ++q) c[i * ldc + j + q] = r[q];
    }
  }
  gemv_portable(m, k, a, b, cs, bt, j, j1, c, ldc);
}
#endif

}  // namespace

bool gemv_applies(int64_t m, const Operand& a, const Operand& b) {
  (void)a;
  return m <= kGemvMaxRows && (b.dtype == DType::F32 || b.dtype == DType::BF16) &&
         b.rs == int64_t(dtype_size(b.dtype));
}

void gemv(int64_t m, int64_t n, int64_t k, const Operand& a, const Operand& b, float* c, int64_t ldc,
          ThreadPool* pool, Kernel kernel) {
  RT_ASSERT(m > 0 && n > 0 && k > 0 && gemv_applies(m, a, b));
  // A's few rows as contiguous f32, whatever its dtype and strides.
  std::vector<float> ar(static_cast<size_t>(m * k));
  const char* abase = static_cast<const char*>(a.data);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t p = 0; p < k; ++p) ar[size_t(i * k + p)] = load_f32(abase + i * a.rs + p * a.cs, a.dtype, 0);
  const char* bbase = static_cast<const char*>(b.data);
  auto run = [&](int64_t j0, int64_t j1) {
#ifdef RETORT_GEMV_X86
    // Memory-bound: AVX2's dot products keep up with the stream on an AVX-512 CPU too.
    if (kernel == Kernel::Avx2 || kernel == Kernel::Avx512)
      return gemv_avx2(m, k, ar.data(), bbase, b.cs, b.dtype, j0, j1, c, ldc);
#endif
    (void)kernel;
    gemv_portable(m, k, ar.data(), bbase, b.cs, b.dtype, j0, j1, c, ldc);
  };
  const int64_t bytes = n * k * int64_t(dtype_size(b.dtype));
  const int threads = pool ? int(std::clamp<int64_t>(bytes / kMinBytesPerThread, 1, pool->size())) : 1;
  if (threads == 1) return run(0, n);
  // Blocks of kCols columns, split evenly.
  const int64_t blocks = (n + kCols - 1) / kCols;
  pool->parallel_for(
      threads,
      [&](int64_t t0, int64_t t1) {
        run(std::min(n, blocks * t0 / threads * kCols), std::min(n, blocks * t1 / threads * kCols));
      },
      1);
}

}  // namespace retort::gemm
