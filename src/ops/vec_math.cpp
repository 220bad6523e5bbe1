// Elementwise exp / log and row sums for the CPU row kernels (see vec_math.h).
#include "vec_math.h"

#if defined(__x86_64__) || defined(__i386__)
#define RETORT_VMATH_X86 1
#include <immintrin.h>
#endif

#include <cmath>
#include <limits>

#include "matmul_kernel.h"

namespace retort::vmath {

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// ---- portable -----------------------------------------------------------------------------------------

double exp_affine_portable(const float* x, float* out, int64_t n, float m, float scale, float shift, float a,
                           float c, bool accumulate) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = a * std::exp((x[i] - m) * scale - shift) + c;
    out[i] = accumulate ? out[i] + v : v;
    sum += out[i];
  }
  return sum;
}

float sum_exp_portable(const float* x, int64_t n, float m, float scale) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += std::exp((x[i] - m) * scale);
  return s;
}

float max_portable(const float* x, int64_t n) {
  float r = -kInf;
  for (int64_t i = 0; i < n; ++i) r = x[i] > r ? x[i] : r;  // NaN never wins
  return r;
}

float dot_portable(const float* a, const float* b, int64_t n) {
  // Four partial sums let the compiler keep independent chains.
  float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += a[i] * b[i];
    s1 += a[i + 1] * b[i + 1];
    s2 += a[i + 2] * b[i + 2];
    s3 += a[i + 3] * b[i + 3];
  }
  for (; i < n; ++i) s0 += a[i] * b[i];
  return (s0 + s1) + (s2 + s3);
}

void axpy_portable(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

double sum_portable(const float* x, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += x[i];
  return s;
}

// ---- AVX2 + FMA -----------------------------------------------------------------------------------------

#ifdef RETORT_VMATH_X86
#define RT_AVX2 __attribute__((target("avx2,fma")))

RT_AVX2 inline __m256 set1(float v) {
  return _mm256_set1_ps(v);
}

// exp of 8 lanes: x = n·ln2 + r with |r| <= ln2/2 (ln2 split in two for an exact n·ln2_hi), a degree-7
// polynomial for e^r in [0.7, 1.42), and 2^n added to its exponent field. Below ln(FLT_MIN) n = −126 would
// need r < 0 (a result below FLT_MIN): those lanes are 0. Above ln(FLT_MAX): +inf. NaN propagates.
RT_AVX2 inline __m256 exp8(__m256 x) {
  const __m256 lo = set1(-87.33654475f);  // ln(FLT_MIN)
  // The largest float whose exp is finite (ln FLT_MAX = 88.7228391...): above it +inf.
  const __m256 hi = set1(88.7228317f);
  const __m256 xc = _mm256_min_ps(hi, _mm256_max_ps(lo, x));  // NaN stays NaN (second operand)
  const __m256 fn = _mm256_round_ps(_mm256_mul_ps(xc, set1(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(fn, set1(0.693359375f), xc);
  r = _mm256_fnmadd_ps(fn, set1(-2.12194440e-4f), r);
  __m256 y = set1(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, r, set1(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, r, set1(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, r, set1(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, r, set1(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, r, set1(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, set1(1.0f)));
  // n in [-126, 128]; y's exponent field is 126 or 127, so the sum stays in [0, 255] (n = 128 only with y <
  // 1, at most FLT_MAX; NaN lanes convert to INT_MIN, whose shifted value is 0).
  const __m256i n = _mm256_slli_epi32(_mm256_cvtps_epi32(fn), 23);
  y = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(y), n));
  y = _mm256_andnot_ps(_mm256_cmp_ps(x, lo, _CMP_LT_OQ), y);
  return _mm256_blendv_ps(y, set1(kInf), _mm256_cmp_ps(x, hi, _CMP_GT_OQ));
}

// log of 8 lanes: x = f·2^e with f in [√½, √2), log x = e·ln2 + log f, log(1 + t) by a degree-8 polynomial
// in t = f − 1. Subnormal inputs are scaled by 2^23 first.
RT_AVX2 inline __m256 log8(__m256 x) {
  const __m256 small = _mm256_cmp_ps(x, set1(1.17549435e-38f), _CMP_LT_OQ);
  const __m256 xs = _mm256_blendv_ps(x, _mm256_mul_ps(x, set1(8388608.0f)), small);
  const __m256i bits = _mm256_castps_si256(xs);
  __m256 e = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(bits, 23), _mm256_set1_epi32(126)));
  e = _mm256_sub_ps(e, _mm256_and_ps(small, set1(23.0f)));
  // f in [0.5, 1): the mantissa with the exponent of 0.5.
  __m256 f = _mm256_castsi256_ps(
      _mm256_or_si256(_mm256_and_si256(bits, _mm256_set1_epi32(0x007fffff)), _mm256_set1_epi32(0x3f000000)));
  const __m256 below = _mm256_cmp_ps(f, set1(0.707106781186547524f), _CMP_LT_OQ);
  const __m256 twice = _mm256_and_ps(f, below);  // f again where f < √½ (then 2f − 1, one exponent less)
  f = _mm256_add_ps(_mm256_sub_ps(f, set1(1.0f)), twice);
  e = _mm256_sub_ps(e, _mm256_and_ps(below, set1(1.0f)));
  const __m256 z = _mm256_mul_ps(f, f);
  __m256 y = set1(7.0376836292e-2f);
  y = _mm256_fmadd_ps(y, f, set1(-1.1514610310e-1f));
  y = _mm256_fmadd_ps(y, f, set1(1.1676998740e-1f));
  y = _mm256_fmadd_ps(y, f, set1(-1.2420140846e-1f));
  y = _mm256_fmadd_ps(y, f, set1(1.4249322787e-1f));
  y = _mm256_fmadd_ps(y, f, set1(-1.6668057665e-1f));
  y = _mm256_fmadd_ps(y, f, set1(2.0000714765e-1f));
  y = _mm256_fmadd_ps(y, f, set1(-2.4999993993e-1f));
  y = _mm256_fmadd_ps(y, f, set1(3.3333331174e-1f));
  y = _mm256_mul_ps(_mm256_mul_ps(y, f), z);
  y = _mm256_fmadd_ps(e, set1(-2.12194440e-4f), y);
  y = _mm256_fnmadd_ps(z, set1(0.5f), y);
  __m256 r = _mm256_add_ps(f, y);
  r = _mm256_fmadd_ps(e, set1(0.693359375f), r);
  r = _mm256_blendv_ps(r, set1(-kInf), _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_EQ_OQ));
  r = _mm256_blendv_ps(r, set1(std::numeric_limits<float>::quiet_NaN()),
                       _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ));
  r = _mm256_blendv_ps(r, set1(kInf), _mm256_cmp_ps(x, set1(kInf), _CMP_EQ_OQ));
  return _mm256_blendv_ps(r, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

// The lanes i < rem of a tail (0 < rem < 8).
RT_AVX2 inline __m256i tail_mask(int64_t rem) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(rem)), idx);
}

// Horizontal sums and max in a fixed order.
RT_AVX2 inline float hsum(__m256 v) {
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  q = _mm_add_ss(q, _mm_shuffle_ps(q, q, 1));
  return _mm_cvtss_f32(q);
}
RT_AVX2 inline double hsum(__m256d v) {
  __m128d q = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
  q = _mm_add_sd(q, _mm_unpackhi_pd(q, q));
  return _mm_cvtsd_f64(q);
}
RT_AVX2 inline float hmax(__m256 v) {
  __m128 q = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  q = _mm_max_ps(q, _mm_movehl_ps(q, q));
  q = _mm_max_ss(q, _mm_shuffle_ps(q, q, 1));
  return _mm_cvtss_f32(q);
}

RT_AVX2 float dot_avx2(const float* a, const float* b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  float r = hsum(_mm256_add_ps(s0, s1));
  for (; i < n; ++i) r += a[i] * b[i];
  return r;
}

RT_AVX2 void axpy_avx2(float a, const float* x, float* y, int64_t n) {
  const __m256 va = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += a * x[i];
}

RT_AVX2 inline void add_pd(__m256 v, __m256d& s0, __m256d& s1) {
  s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
  s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
}

RT_AVX2 inline __m256 affine_term(__m256 v, __m256 vm, __m256 vs, __m256 vsh, __m256 va, __m256 vc) {
  return _mm256_fmadd_ps(va, exp8(_mm256_fmsub_ps(_mm256_sub_ps(v, vm), vs, vsh)), vc);
}

RT_AVX2 double exp_affine_avx2(const float* x, float* out, int64_t n, float m, float scale, float shift,
                               float a, float c, bool accumulate) {
  // (No lambdas here: they would not inherit the target attribute.)
  const __m256 vm = set1(m), vs = set1(scale), vsh = set1(shift), va = set1(a), vc = set1(c);
  __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 r = affine_term(_mm256_loadu_ps(x + i), vm, vs, vsh, va, vc);
    if (accumulate) r = _mm256_add_ps(_mm256_loadu_ps(out + i), r);
    _mm256_storeu_ps(out + i, r);
    add_pd(r, s0, s1);
  }
  if (i < n) {
    const __m256i mask = tail_mask(n - i);
    __m256 r = affine_term(_mm256_maskload_ps(x + i, mask), vm, vs, vsh, va, vc);
    if (accumulate) r = _mm256_add_ps(_mm256_maskload_ps(out + i, mask), r);
    _mm256_maskstore_ps(out + i, mask, r);
    add_pd(_mm256_and_ps(r, _mm256_castsi256_ps(mask)), s0, s1);
  }
  return hsum(_mm256_add_pd(s0, s1));
}

template <bool kLog>
RT_AVX2 void map_avx2(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    _mm256_storeu_ps(x + i, kLog ? log8(v) : exp8(v));
  }
  if (i < n) {
    const __m256i mask = tail_mask(n - i);
    const __m256 v = _mm256_maskload_ps(x + i, mask);
    _mm256_maskstore_ps(x + i, mask, kLog ? log8(v) : exp8(v));
  }
}

RT_AVX2 inline __m256 shifted_exp(__m256 v, __m256 vm, __m256 vs) {
  return exp8(_mm256_mul_ps(_mm256_sub_ps(v, vm), vs));
}

RT_AVX2 float sum_exp_avx2(const float* x, int64_t n, float m, float scale) {
  const __m256 vm = set1(m), vs = set1(scale);
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_add_ps(s0, shifted_exp(_mm256_loadu_ps(x + i), vm, vs));
    s1 = _mm256_add_ps(s1, shifted_exp(_mm256_loadu_ps(x + i + 8), vm, vs));
  }
  if (i + 8 <= n) {
    s0 = _mm256_add_ps(s0, shifted_exp(_mm256_loadu_ps(x + i), vm, vs));
    i += 8;
  }
  if (i < n) {
    const __m256i mask = tail_mask(n - i);
    s1 = _mm256_add_ps(
        s1, _mm256_and_ps(shifted_exp(_mm256_maskload_ps(x + i, mask), vm, vs), _mm256_castsi256_ps(mask)));
  }
  return hsum(_mm256_add_ps(s0, s1));
}

RT_AVX2 float max_avx2(const float* x, int64_t n) {
  // max_ps(v, acc) returns acc when v is NaN: NaNs never win.
  __m256 r0 = set1(-kInf), r1 = set1(-kInf);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    r0 = _mm256_max_ps(_mm256_loadu_ps(x + i), r0);
    r1 = _mm256_max_ps(_mm256_loadu_ps(x + i + 8), r1);
  }
  if (i + 8 <= n) {
    r0 = _mm256_max_ps(_mm256_loadu_ps(x + i), r0);
    i += 8;
  }
  if (i < n) {
    const __m256i mask = tail_mask(n - i);
    const __m256 v =
        _mm256_blendv_ps(set1(-kInf), _mm256_maskload_ps(x + i, mask), _mm256_castsi256_ps(mask));
    r1 = _mm256_max_ps(v, r1);
  }
  return hmax(_mm256_max_ps(r0, r1));
}

RT_AVX2 double sum_avx2(const float* x, int64_t n) {
  __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) add_pd(_mm256_loadu_ps(x + i), s0, s1);
  if (i < n) add_pd(_mm256_maskload_ps(x + i, tail_mask(n - i)), s0, s1);  // masked lanes load 0
  return hsum(_mm256_add_pd(s0, s1));
}

// ---- AVX-512 (exp and the passes around it; the rest runs the AVX2 code) ---------------------------------

#define RT_AVX512 __attribute__((target("avx2,fma,avx512f")))
// GCC 12's avx512fintrin.h starts max, min, roundscale and extract from a self-initialized "undefined"
// register, which -Wuninitialized reports at every use.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

RT_AVX512 inline __m512 set16(float v) {
  return _mm512_set1_ps(v);
}

// exp8's algorithm and coefficients on 16 lanes, with 2^n applied by scalef (exact for the normal results it
// is used for: lanes below ln(FLT_MIN) are set to 0 as in exp8), so a lane gets exp8's bits.
RT_AVX512 inline __m512 exp16(__m512 x) {
  const __m512 lo = set16(-87.33654475f), hi = set16(88.7228317f);
  const __m512 xc = _mm512_min_ps(hi, _mm512_max_ps(lo, x));  // NaN stays NaN (second operand)
  const __m512 fn = _mm512_roundscale_ps(_mm512_mul_ps(xc, set16(1.44269504088896341f)),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(fn, set16(0.693359375f), xc);
  r = _mm512_fnmadd_ps(fn, set16(-2.12194440e-4f), r);
  __m512 y = set16(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, r, set16(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, r, set16(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, r, set16(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, r, set16(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, r, set16(5.0000001201e-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, set16(1.0f)));
  y = _mm512_scalef_ps(y, fn);
  y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ), _mm512_setzero_ps());
  return _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, hi, _CMP_GT_OQ), set16(kInf));
}

RT_AVX512 inline __mmask16 tail_mask16(int64_t rem) {
  return __mmask16((1u << rem) - 1u);
}

RT_AVX512 inline void add_pd16(__m512 v, __m512d& s0, __m512d& s1) {
  s0 = _mm512_add_pd(s0, _mm512_cvtps_pd(_mm512_castps512_ps256(v)));
  s1 = _mm512_add_pd(s1, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
}

RT_AVX512 double exp_affine_avx512(const float* x, float* out, int64_t n, float m, float scale, float shift,
                                   float a, float c, bool accumulate) {
  const __m512 vm = set16(m), vs = set16(scale), vsh = set16(shift), va = set16(a), vc = set16(c);
  __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    __m512 r = _mm512_fmadd_ps(va, exp16(_mm512_fmsub_ps(_mm512_sub_ps(v, vm), vs, vsh)), vc);
    if (accumulate) r = _mm512_add_ps(_mm512_loadu_ps(out + i), r);
    _mm512_storeu_ps(out + i, r);
    add_pd16(r, s0, s1);
  }
  if (i < n) {
    const __mmask16 mask = tail_mask16(n - i);
    const __m512 v = _mm512_maskz_loadu_ps(mask, x + i);
    __m512 r = _mm512_fmadd_ps(va, exp16(_mm512_fmsub_ps(_mm512_sub_ps(v, vm), vs, vsh)), vc);
    if (accumulate) r = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, out + i), r);
    _mm512_mask_storeu_ps(out + i, mask, r);
    add_pd16(_mm512_maskz_mov_ps(mask, r), s0, s1);
  }
  return _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
}

RT_AVX512 void exp_avx512(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, exp16(_mm512_loadu_ps(x + i)));
  if (i < n) {
    const __mmask16 mask = tail_mask16(n - i);
    _mm512_mask_storeu_ps(x + i, mask, exp16(_mm512_maskz_loadu_ps(mask, x + i)));
  }
}

RT_AVX512 float sum_exp_avx512(const float* x, int64_t n, float m, float scale) {
  const __m512 vm = set16(m), vs = set16(scale);
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm512_add_ps(s0, exp16(_mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), vm), vs)));
    s1 = _mm512_add_ps(s1, exp16(_mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i + 16), vm), vs)));
  }
  if (i + 16 <= n) {
    s0 = _mm512_add_ps(s0, exp16(_mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), vm), vs)));
    i += 16;
  }
  if (i < n) {
    const __mmask16 mask = tail_mask16(n - i);
    const __m512 e = exp16(_mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, x + i), vm), vs));
    s1 = _mm512_add_ps(s1, _mm512_maskz_mov_ps(mask, e));
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

RT_AVX512 float max_avx512(const float* x, int64_t n) {
  // max_ps(v, acc) returns acc when v is NaN: NaNs never win.
  __m512 r0 = set16(-kInf), r1 = set16(-kInf);
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    r0 = _mm512_max_ps(_mm512_loadu_ps(x + i), r0);
    r1 = _mm512_max_ps(_mm512_loadu_ps(x + i + 16), r1);
  }
  if (i + 16 <= n) {
    r0 = _mm512_max_ps(_mm512_loadu_ps(x + i), r0);
    i += 16;
  }
  if (i < n) r1 = _mm512_max_ps(_mm512_mask_loadu_ps(set16(-kInf), tail_mask16(n - i), x + i), r1);
  return _mm512_reduce_max_ps(_mm512_max_ps(r0, r1));
}

bool cpu_has_avx512f() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && gemm::kernel_available(gemm::Kernel::Avx2);
  }();
  return has;
}
#pragma GCC diagnostic pop
#endif

}  // namespace

bool impl_available(Impl impl) {
#ifdef RETORT_VMATH_X86
  if (impl == Impl::Avx512) return cpu_has_avx512f();
  return impl == Impl::Portable || gemm::kernel_available(gemm::Kernel::Avx2);
#else
  return impl == Impl::Portable;
#endif
}

Impl best_impl() {
  static const Impl best = impl_available(Impl::Avx512) ? Impl::Avx512
                           : impl_available(Impl::Avx2) ? Impl::Avx2
                                                        : Impl::Portable;
  return best;
}

const char* impl_name(Impl impl) {
  switch (impl) {
    case Impl::Avx512: return "avx512";
    case Impl::Avx2: return "avx2+fma";
    default: return "portable";
  }
}

double exp_affine(const float* x, float* out, int64_t n, float m, float scale, float shift, float a, float c,
                  bool accumulate, Impl impl) {
#ifdef RETORT_VMATH_X86
  if (impl == Impl::Avx512) return exp_affine_avx512(x, out, n, m, scale, shift, a, c, accumulate);
  if (impl == Impl::Avx2) return exp_affine_avx2(x, out, n, m, scale, shift, a, c, accumulate);
#endif
  (void)impl;
  return exp_affine_portable(x, out, n, m, scale, shift, a, c, accumulate);
}

void exp(float* x, int64_t n, Impl impl) {
#ifdef RETORT_VMATH_X86
  if (impl == Impl::Avx512) return exp_avx512(x, n);
  if (impl == Impl::Avx2) return map_avx2<false>(x, n);
#endif
  (void)impl;
  for (int64_t i = 0; i < n; ++i) x[i] = std::exp(x[i]);
}

void log(float* x, int64_t n, Impl impl) {
#ifdef RETORT_VMATH_X86
  if (impl != Impl::Portable) return map_avx2<true>(x, n);  // Avx512 too
#endif
  (void)impl;
  for (int64_t i = 0; i < n; ++i) x[i] = std::log(x[i]);
}

float sum_exp(const float* x, int64_t n, float m, float scale, Impl impl) {
#ifdef RETORT_VMATH_X86
  if (impl == Impl::Avx512) return sum_exp_avx512(x, n, m, scale);
  if (impl == Impl::Avx2) return sum_exp_avx2(x, n, m, scale);
#endif
  (void)impl;
  return sum_exp_portable(x, n, m, scale);
}

float max(const float* x, int64_t n, Impl impl) {
#ifdef RETORT_VMATH_X86
  if (impl == Impl::Avx512) return max_avx512(x, n);
  if (impl == Impl::Avx2) return max_avx2(x, n);
#endif
  (void)impl;
  return max_portable(x, n);
}

double sum(const float* x, int64_t n, Impl impl) {
#ifdef RETORT_VMATH_X86
  if (impl != Impl::Portable) return sum_avx2(x, n);  // Avx512 too
#endif
  (void)impl;
  return sum_portable(x, n);
}

float dot(const float* a, const float* b, int64_t n, Impl impl) {
#ifdef RETORT_VMATH_X86
  if (impl != Impl::Portable) return dot_avx2(a, b, n);  // Avx512 too
#endif
  (void)impl;
  return dot_portable(a, b, n);
}

void axpy(float a, const float* x, float* y, int64_t n, Impl impl) {
#ifdef RETORT_VMATH_X86
  if (impl != Impl::Portable) return axpy_avx2(a, x, y, n);  // Avx512 too
#endif
  (void)impl;
  axpy_portable(a, x, y, n);
}

}  // namespace retort::vmath
