// Small in-cache f32 GEMMs for the CPU attention tiles (see tile_gemm.h).
#include "tile_gemm.h"

#if defined(__x86_64__) || defined(__i386__)
#define RETORT_TILE_X86 1
#include <immintrin.h>
#endif

#include <algorithm>

#include "../core/error.h"

namespace retort::tile {

namespace {

void gemm_portable(int64_t m, int64_t n, int64_t k, const float* a, int64_t ars, int64_t ats, const float* b,
                   int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  for (int64_t r = 0; r < m; ++r) {
    float* cr = c + r * ldc;
    if (!accumulate) std::fill(cr, cr + n, 0.0f);
    for (int64_t t = 0; t < k; ++t) {
      const float av = a[r * ars + t * ats];
      const float* bt = b + t * ldb;
      for (int64_t j = 0; j < n; ++j) cr[j] += av * bt[j];
    }
  }
}

#ifdef RETORT_TILE_X86
#define RT_TILE_AVX2 __attribute__((target("avx2,fma")))
#define RT_TILE_AVX512 __attribute__((target("avx2,fma,avx512f")))

// R rows of C by NV vectors of 16: R·NV accumulators stay in registers for the whole k loop; each step loads
// NV vectors of B's row t and broadcasts one element of A per row.
template <int R, int NV>
RT_TILE_AVX512 void block_avx512(int64_t k, const float* a, int64_t ars, int64_t ats, const float* b,
                                 int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  __m512 s[R][NV];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      s[r][v] = accumulate ? _mm512_loadu_ps(c + r * ldc + 16 * v) : _mm512_setzero_ps();
  for (int64_t t = 0; t < k; ++t) {
    __m512 bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = _mm512_loadu_ps(b + t * ldb + 16 * v);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512 av = _mm512_set1_ps(a[r * ars + t * ats]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) s[r][v] = _mm512_fmadd_ps(av, bv[v], s[r][v]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(c + r * ldc + 16 * v, s[r][v]);
}

template <int R>
RT_TILE_AVX512 void columns_avx512(int nv, int64_t k, const float* a, int64_t ars, int64_t ats,
                                   const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  switch (nv) {
    case 4:
      return block_avx512<R, 4>(k, a, ars, ats, b, ldb, c, ldc, accumulate);
    case 3:
      return block_avx512<R, 3>(k, a, ars, ats, b, ldb, c, ldc, accumulate);
    case 2:
      return block_avx512<R, 2>(k, a, ars, ats, b, ldb, c, ldc, accumulate);
    default:
      return block_avx512<R, 1>(k, a, ars, ats, b, ldb, c, ldc, accumulate);
  }
}

// Slabs of 64 columns (B's slab, k × 64 floats, stays in L1 while the rows go by), 4 rows at a time.
RT_TILE_AVX512 void gemm_avx512(int64_t m, int64_t n, int64_t k, const float* a, int64_t ars, int64_t ats,
                                const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  for (int64_t c0 = 0; c0 < n; c0 += 64) {
    const int nv = int(std::min<int64_t>(4, (n - c0) / 16));
    const float* bs = b + c0;
    int64_t r = 0;
    for (; r + 4 <= m; r += 4)
      columns_avx512<4>(nv, k, a + r * ars, ars, ats, bs, ldb, c + r * ldc + c0, ldc, accumulate);
    const float* ar = a + r * ars;
    float* cr = c + r * ldc + c0;
    switch (m - r) {
      case 3:
        columns_avx512<3>(nv, k, ar, ars, ats, bs, ldb, cr, ldc, accumulate);
        break;
      case 2:
        columns_avx512<2>(nv, k, ar, ars, ats, bs, ldb, cr, ldc, accumulate);
        break;
      case 1:
        columns_avx512<1>(nv, k, ar, ars, ats, bs, ldb, cr, ldc, accumulate);
        break;
      default:
        break;
    }
  }
}

// AVX2 has 16 registers: R rows by two vectors of 8 (12 accumulators at R = 6, two for B, one broadcast).
template <int R>
RT_TILE_AVX2 void block_avx2(int64_t k, const float* a, int64_t ars, int64_t ats, const float* b, int64_t ldb,
                             float* c, int64_t ldc, bool accumulate) {
  __m256 s[R][2];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    s[r][0] = accumulate ? _mm256_loadu_ps(c + r * ldc) : _mm256_setzero_ps();
    s[r][1] = accumulate ? _mm256_loadu_ps(c + r * ldc + 8) : _mm256_setzero_ps();
  }
  for (int64_t t = 0; t < k; ++t) {
    const __m256 b0 = _mm256_loadu_ps(b + t * ldb), b1 = _mm256_loadu_ps(b + t * ldb + 8);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 av = _mm256_broadcast_ss(a + r * ars + t * ats);
      s[r][0] = _mm256_fmadd_ps(av, b0, s[r][0]);
      s[r][1] = _mm256_fmadd_ps(av, b1, s[r][1]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(c + r * ldc, s[r][0]);
    _mm256_storeu_ps(c + r * ldc + 8, s[r][1]);
  }
}

RT_TILE_AVX2 void gemm_avx2(int64_t m, int64_t n, int64_t k, const float* a, int64_t ars, int64_t ats,
                            const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  for (int64_t c0 = 0; c0 < n; c0 += 16) {
    const float* bs = b + c0;
    int64_t r = 0;
    for (; r + 6 <= m; r += 6)
      block_avx2<6>(k, a + r * ars, ars, ats, bs, ldb, c + r * ldc + c0, ldc, accumulate);
    const float* ar = a + r * ars;
    float* cr = c + r * ldc + c0;
    switch (m - r) {
      case 5:
        block_avx2<5>(k, ar, ars, ats, bs, ldb, cr, ldc, accumulate);
        break;
      case 4:
        block_avx2<4>(k, ar, ars, ats, bs, ldb, cr, ldc, accumulate);
        break;
      case 3:
        block_avx2<3>(k, ar, ars, ats, bs, ldb, cr, ldc, accumulate);
        break;
      case 2:
        block_avx2<2>(k, ar, ars, ats, bs, ldb, cr, ldc, accumulate);
        break;
      case 1:
        block_avx2<1>(k, ar, ars, ats, bs, ldb, cr, ldc, accumulate);
        break;
      default:
        break;
    }
  }
}

#endif

}  // namespace

void gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t ars, int64_t ats, const float* b,
          int64_t ldb, float* c, int64_t ldc, bool accumulate, Impl impl) {
  RT_ASSERT(n % kTileLanes == 0 && m >= 0 && k >= 0 && impl_available(impl));
#ifdef RETORT_TILE_X86
  if (impl == Impl::Avx512) return gemm_avx512(m, n, k, a, ars, ats, b, ldb, c, ldc, accumulate);
  if (impl == Impl::Avx2) return gemm_avx2(m, n, k, a, ars, ats, b, ldb, c, ldc, accumulate);
#endif
  gemm_portable(m, n, k, a, ars, ats, b, ldb, c, ldc, accumulate);
}

}  // namespace retort::tile
