// The CPU GEMM in bf16 (bgemm): operands rounded to bf16 as they are packed, products summed in f32. With
// AVX-512 BF16 the panels hold bf16 pairs along k, as vdpbf16ps multiplies them: one instruction adds two
// products per f32 lane, twice an f32 FMA's work. The blocking and threading are sgemm's (gemm_driver.h);
// CPUs without the instructions run sgemm's f32 kernels on panels rounded the same way.
#include <algorithm>
#include <cstring>

#include "../core/error.h"
#include "gemm_driver.h"
#include "matmul_kernel.h"

#if defined(__x86_64__) || defined(__i386__)
#define RETORT_BF16_X86 1
#include <immintrin.h>
#endif

namespace retort::gemm {

#ifdef RETORT_BF16_X86
namespace {

#define RT_AVX512_BF16 __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512bf16")))

// Register tile: 8 rows x 32 columns = 16 zmm accumulators; a row's 32 columns are two zmm of bf16 pairs.
constexpr int kMR = 8;
constexpr int kNR = 32;
// Cache blocks: a KC x NR panel of B (16 KiB of bf16) stays in L1 while the micro-kernel sweeps the A block;
// the MC x KC block of A (96 KiB) stays in L2; the KC x NC block of B (1.5 MiB) in L3.
constexpr int64_t kKC = 256;
constexpr int64_t kMC = 192;
constexpr int64_t kNC = 3072;
// The most packed B (bf16) the whole-B path keeps at once: 1 MiB, an L2's worth shared by the threads.
constexpr int64_t kWholeBElems = int64_t(1) << 19;

uint16_t load_bf16(const char* p, DType t) {
  switch (t) {
    case DType::F32: {
      float v;
      std::memcpy(&v, p, sizeof v);
      return f32_to_bf16(v);
    }
    case DType::BF16: {
      uint16_t h;
      std::memcpy(&h, p, sizeof h);
      return h;
    }
    case DType::F16: {
      uint16_t h;
      std::memcpy(&h, p, sizeof h);
      return f32_to_bf16(f16_to_f32(h));
    }
    default:
      RT_ASSERT(false && "matmul: integer operand reached the kernel");
  }
  return 0;
}

// Packs pairs [p0, p1) of a panel of w <= W lines (stride si bytes) by kc steps along k (stride sk bytes):
// pair p of line i is d[(p * W + i) * 2 + e] = x[i, 2p + e], zero past line w and past step kc.
template <int W>
void pack_pairs_scalar(DType t, const char* base, int64_t si, int64_t sk, int w, int64_t kc, int64_t p0,
                       int64_t p1, uint16_t* d) {
  for (int64_t p = p0; p < p1; ++p) {
    uint16_t* o = d + p * W * 2;
    for (int i = 0; i < W; ++i)
      for (int e = 0; e < 2; ++e) {
        const int64_t k = 2 * p + e;
        o[2 * i + e] = i < w && k < kc ? load_bf16(base + i * si + k * sk, t) : uint16_t(0);
      }
  }
}

// Eight bf16 pairs (one 32-bit lane each) from a line contiguous along k: 16 values, converted when f32.
RT_AVX512_BF16 inline __m256i load_pairs8(const char* p, DType t) {
  if (t == DType::BF16) return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(reinterpret_cast<const float*>(p)));
}

// Sixteen values at p (contiguous) as bf16.
RT_AVX512_BF16 inline __m256i load_bf16x16(const char* p, DType t) {
  return load_pairs8(p, t);
}

// The 8 x 8 transpose of 32-bit lanes: afterwards r[k] holds lane k of every input.
RT_AVX512_BF16 inline void transpose8(__m256i ri[8]) {
  __m256 r[8], t[8], u[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_castsi256_ps(ri[i]);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    ri[i] = _mm256_castps_si256(_mm256_permute2f128_ps(u[i], u[i + 4], 0x20));
    ri[i + 4] = _mm256_castps_si256(_mm256_permute2f128_ps(u[i], u[i + 4], 0x31));
  }
}

// A full panel whose lines are each contiguous along k (sk = element size): per eight lines, eight pairs of
// each are read and transposed, so pairs land in the panel's (pair, line) order. Returns the pairs packed.
template <int W>
RT_AVX512_BF16 int64_t pack_lines_along_k(DType t, const char* base, int64_t si, int64_t kc, uint16_t* d) {
  const int64_t esz = int64_t(dtype_size(t));
  const int64_t p8 = kc / 16 * 8;  // whole groups of 8 pairs
  __m256i r[8];
  for (int64_t p = 0; p < p8; p += 8) {
    for (int g = 0; g < W / 8; ++g) {
      for (int i = 0; i < 8; ++i) r[i] = load_pairs8(base + (8 * g + i) * si + 2 * p * esz, t);
      transpose8(r);
      for (int j = 0; j < 8; ++j)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + ((p + j) * W + 8 * g) * 2), r[j]);
    }
  }
  return p8;
}

// A full panel whose lines are adjacent (si = element size), steps along k sk bytes apart: each pair is two
// steps interleaved value by value. Returns the pairs packed (every whole pair).
template <int W>
RT_AVX512_BF16 int64_t pack_lines_adjacent(DType t, const char* base, int64_t sk, int64_t kc, uint16_t* d) {
  const int64_t pairs = kc / 2;
  for (int64_t p = 0; p < pairs; ++p) {
    const char* r0 = base + 2 * p * sk;
    const char* r1 = r0 + sk;
    uint16_t* o = d + p * W * 2;
    for (int g = 0; g < W / 16; ++g) {
      const int64_t off = 16 * g * int64_t(dtype_size(t));
      const __m256i x0 = load_bf16x16(r0 + off, t), x1 = load_bf16x16(r1 + off, t);
      const __m256i lo = _mm256_unpacklo_epi16(x0, x1), hi = _mm256_unpackhi_epi16(x0, x1);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 32 * g), _mm256_permute2x128_si256(lo, hi, 0x20));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 32 * g + 16),
                          _mm256_permute2x128_si256(lo, hi, 0x31));
    }
    if constexpr (W % 16 != 0) {
      static_assert(W % 16 == 8);
      const int64_t off = (W - 8) * int64_t(dtype_size(t));
      // Eight values of each step: bf16 directly, or eight f32 converted.
      __m128i x0, x1;
      if (t == DType::BF16) {
        x0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r0 + off));
        x1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r1 + off));
      } else {
        x0 = (__m128i)_mm256_cvtneps_pbh(_mm256_loadu_ps(reinterpret_cast<const float*>(r0 + off)));
        x1 = (__m128i)_mm256_cvtneps_pbh(_mm256_loadu_ps(reinterpret_cast<const float*>(r1 + off)));
      }
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 2 * (W - 8)), _mm_unpacklo_epi16(x0, x1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 2 * (W - 8) + 8), _mm_unpackhi_epi16(x0, x1));
    }
  }
  return pairs;
}

// A panel of w <= W lines by kc steps as bf16 pairs; the vector loops take full panels of f32 or bf16 and
// the scalar loop the rest (edges, the odd last step, f16, other strides).
template <int W>
void pack_panel(const Operand& x, const char* base, int64_t si, int64_t sk, int w, int64_t kc, uint16_t* d) {
  const int64_t pairs = (kc + 1) / 2;
  int64_t done = 0;
  const int64_t esz = int64_t(dtype_size(x.dtype));
  if (w == W && (x.dtype == DType::F32 || x.dtype == DType::BF16)) {
    if (sk == esz)
      done = pack_lines_along_k<W>(x.dtype, base, si, kc, d);
    else if (si == esz)
      done = pack_lines_adjacent<W>(x.dtype, base, sk, kc, d);
  }
  pack_pairs_scalar<W>(x.dtype, base, si, sk, w, kc, done, pairs, d);
}

// pack_a for A whose rows are adjacent (A is the transpose of a row-major matrix, as the logits gradient in a
// weight gradient), f32 or bf16: each pair of steps along k reads the block's mc values of both steps as
// contiguous runs and deals the interleaved pairs out to the panels, so memory is read in order once instead
// of 32 bytes per panel with a page-sized stride. Returns the rows packed (whole panels; the rest is left).
RT_AVX512_BF16 int64_t pack_a_rows_adjacent(DType t, const char* base, int64_t sk, int64_t mc, int64_t kc,
                                            uint16_t* dst) {
  static_assert(kMR == 8);
  const int64_t rows16 = mc / 16 * 16, pairs = kc / 2, kp = (kc + 1) / 2 * 2;
  const int64_t esz = int64_t(dtype_size(t));
  // Successive steps are a page or more apart, too far for the hardware prefetcher: ask for a later one.
  constexpr int64_t kAhead = 8;
  for (int64_t p = 0; p < pairs; ++p) {
    const char* r0 = base + 2 * p * sk;
    const char* r1 = r0 + sk;
    if (2 * p + kAhead + 1 < kc)
      for (int64_t o = 0; o < rows16 * esz; o += 64) {
        __builtin_prefetch(r0 + kAhead * sk + o);
        __builtin_prefetch(r1 + kAhead * sk + o);
      }
    for (int64_t i = 0; i < rows16; i += 16) {
      const __m256i x0 = load_bf16x16(r0 + i * esz, t), x1 = load_bf16x16(r1 + i * esz, t);
      const __m256i lo = _mm256_unpacklo_epi16(x0, x1), hi = _mm256_unpackhi_epi16(x0, x1);
      // Rows i..i+7 go to panel i / 8, rows i+8..i+15 to the next one, each at pair p.
      uint16_t* d0 = dst + (i / kMR) * kMR * kp + p * 2 * kMR;
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(d0), _mm256_permute2x128_si256(lo, hi, 0x20));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(d0 + kMR * kp), _mm256_permute2x128_si256(lo, hi, 0x31));
    }
  }
  // A last odd step pairs with zeros.
  if (kc % 2)
    for (int64_t i = 0; i < rows16; ++i) {
      uint16_t* d = dst + (i / kMR) * kMR * kp + pairs * 2 * kMR + 2 * (i % kMR);
      d[0] = load_bf16(base + (kc - 1) * sk + i * esz, t);
      d[1] = 0;
    }
  return rows16;
}

struct Bf16Packer {
  using Elem = uint16_t;
  static constexpr int kMR = gemm::kMR, kNR = gemm::kNR;
  static constexpr int64_t kKC = gemm::kKC, kMC = gemm::kMC, kNC = gemm::kNC, kKUnit = 2;
  static constexpr int64_t kWholeBElems = gemm::kWholeBElems;
  static int64_t kp(int64_t kc) { return (kc + 1) / 2 * 2; }

  void pack_a(const Operand& a, int64_t i0, int64_t mc, int64_t p0, int64_t kc, uint16_t* dst) const {
    const char* base = static_cast<const char*>(a.data);
    int64_t done = 0;
    if ((a.dtype == DType::F32 || a.dtype == DType::BF16) && a.rs == int64_t(dtype_size(a.dtype)))
      done = pack_a_rows_adjacent(a.dtype, base + i0 * a.rs + p0 * a.cs, a.cs, mc, kc, dst);
    for (int64_t ip = done / kMR; ip * kMR < mc; ++ip) {
      const int w = int(std::min<int64_t>(kMR, mc - ip * kMR));
      pack_panel<kMR>(a, base + (i0 + ip * kMR) * a.rs + p0 * a.cs, a.rs, a.cs, w, kc,
                      dst + ip * kMR * kp(kc));
    }
  }
  void pack_b(const Operand& b, int64_t j0, int64_t nc, int64_t p0, int64_t kc, int64_t jp0, int64_t jp1,
              uint16_t* dst) const {
    const char* base = static_cast<const char*>(b.data);
    for (int64_t jp = jp0; jp < jp1; ++jp) {
      const int w = int(std::min<int64_t>(kNR, nc - jp * kNR));
      pack_panel<kNR>(b, base + (j0 + jp * kNR) * b.cs + p0 * b.rs, b.cs, b.rs, w, kc,
                      dst + jp * kNR * kp(kc));
    }
  }
  void ukernel(int64_t kp, const uint16_t* a, const uint16_t* b, float* c, int64_t ldc,
               bool accumulate) const;
};

// c[MR x NR] (=|+=) the panels' product: per pair of k steps, two zmm of B pairs and one broadcast A pair per
// row, 16 vdpbf16ps.
RT_AVX512_BF16 void ukernel_avx512_bf16(int64_t kp, const uint16_t* a, const uint16_t* b, float* c,
                                        int64_t ldc, bool accumulate) {
  __m512 acc[kMR][2];
  for (int i = 0; i < kMR; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (int i = 0; i < kMR; ++i) _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc), _MM_HINT_T0);
#pragma GCC unroll 2
  for (int64_t p = 0; p < kp / 2; ++p) {
    const __m512bh b0 = (__m512bh)_mm512_load_si512(b);
    const __m512bh b1 = (__m512bh)_mm512_load_si512(b + 32);
#pragma GCC unroll 8
    for (int i = 0; i < kMR; ++i) {
      int32_t pair;
      std::memcpy(&pair, a + 2 * i, sizeof pair);
      const __m512bh av = (__m512bh)_mm512_set1_epi32(pair);
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], av, b0);
      acc[i][1] = _mm512_dpbf16_ps(acc[i][1], av, b1);
    }
    a += 2 * kMR;
    b += 2 * kNR;
  }
#pragma GCC unroll 8
  for (int i = 0; i < kMR; ++i) detail::store_row32(c + i * ldc, acc[i][0], acc[i][1], accumulate);
}

void Bf16Packer::ukernel(int64_t kp, const uint16_t* a, const uint16_t* b, float* c, int64_t ldc,
                         bool accumulate) const {
  ukernel_avx512_bf16(kp, a, b, c, ldc, accumulate);
}

}  // namespace
#endif

void bgemm(int64_t m, int64_t n, int64_t k, const Operand& a, const Operand& b, float* c, int64_t ldc,
           ThreadPool* pool, Kernel kernel, bool accumulate) {
  RT_ASSERT(m > 0 && n > 0 && k > 0);
  RT_ASSERT(kernel_available(kernel));
  if (kernel != Kernel::Avx512Bf16)
    return gemm_f32_rounding_bf16(m, n, k, a, b, c, ldc, pool, kernel, accumulate);
#ifdef RETORT_BF16_X86
  detail::gemm_blocked(Bf16Packer{}, m, n, k, a, b, c, ldc, pool, accumulate);
#endif
}

}  // namespace retort::gemm
