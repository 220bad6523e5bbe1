// The CPU GEMM in f32: packing into f32 panels and the f32 micro-kernels (AVX2+FMA, portable), driven by the
// blocking in gemm_driver.h. Packing is where strides, transposes and bf16/f16 storage are absorbed: the
// micro-kernel only ever sees contiguous, aligned f32 panels.
#include "matmul_kernel.h"

#if defined(__x86_64__) || defined(__i386__)
#define RETORT_GEMM_X86 1
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstring>

#include "../core/error.h"
#include "gemm_driver.h"

namespace retort::gemm {

namespace {

// Register tiles and cache blocks, one per f32 micro-kernel. AVX2: 6 rows x 16 columns = 12 ymm accumulators,
// plus 2 for B and 1 for the broadcast A value, fills the 16 ymm registers. AVX-512: 12 x 32 = 24 zmm
// accumulators and 2 for B of 32 zmm (the A value is broadcast from memory inside each FMA); on a core with
// two 512-bit FMA units that is twice AVX2's products per cycle. Cache blocks: a KC x NR panel of B stays in
// L1 while the micro-kernel sweeps the MC x KC block of A (in L2); the KC x NC block of B lives in L3.
// AVX-512's B panel is twice as wide, so half as deep: 16 KiB either way.
struct TileAvx2 {
  static constexpr int kMR = 6, kNR = 16;
  static constexpr int64_t kKC = 256, kMC = 168, kNC = 3072;
};
struct TileAvx512 {
  static constexpr int kMR = 12, kNR = 32;
  static constexpr int64_t kKC = 128, kMC = 168, kNC = 3072;
};
// The most packed B (floats) that the whole-B path keeps at once: 1 MiB, an L2's worth shared by the threads.
constexpr int64_t kWholeBFloats = int64_t(1) << 18;

// ---- packing
// ------------------------------------------------------------------------------------------------

struct LoadF32 {
  float operator()(const char* p) const {
    float v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
};
struct LoadBF16 {
  float operator()(const char* p) const {
    uint16_t h;
    std::memcpy(&h, p, sizeof h);
    return bf16_to_f32(h);
  }
};
struct LoadF16 {
  float operator()(const char* p) const {
    uint16_t h;
    std::memcpy(&h, p, sizeof h);
    return f16_to_f32(h);
  }
};
// A load and then the value rounded to bf16: the bf16 GEMM's operands on a CPU without bf16 dot products.
template <typename Load>
struct RoundBf16 {
  float operator()(const char* p) const { return bf16_to_f32(f32_to_bf16(Load{}(p))); }
};

bool cpu_has_avx2_fma() {
#ifdef RETORT_GEMM_X86
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return has;
#else
  return false;
#endif
}

// AVX-512 F with AVX2+FMA (the packing's transposes); __builtin_cpu_supports also checks that the OS saves
// the zmm state (XCR0), not only CPUID.
bool cpu_has_avx512f() {
#ifdef RETORT_GEMM_X86
  static const bool has = [] {
    __builtin_cpu_init();
    return cpu_has_avx2_fma() && __builtin_cpu_supports("avx512f");
  }();
  return has;
#else
  return false;
#endif
}

// AVX-512 BF16 dot products (vdpbf16ps) with the AVX-512 registers the bf16 micro-kernel uses; the library
// saves and restores zmm state through the OS, which __builtin_cpu_supports checks (XCR0) along with CPUID.
bool cpu_has_avx512_bf16() {
#ifdef RETORT_GEMM_X86
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
  }();
  return has;
#else
  return false;
#endif
}

#ifdef RETORT_GEMM_X86
// The 8 x 8 transpose of r[0..7] in place: afterwards r[k] holds element k of every input row.
__attribute__((target("avx2,fma"), always_inline)) inline void transpose8(__m256 r[8]) {
  __m256 t[8], u[8];
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
    r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

// The transposing pack (d[k * W + i] = rows[i][k]) eight steps of k at a time, eight lines at a time (the
// last group of W % 8 lines padded with zeros and stored masked); returns how many steps it packed (a
// multiple of 8), the rest is left to the scalar loop.
template <int W>
__attribute__((target("avx2,fma"))) int64_t pack_transposed_avx2(const float* const* rows, int64_t kc,
                                                                 float* d) {
  constexpr int kTail = W % 8;
  const __m256i tail_lanes =
      _mm256_cmpgt_epi32(_mm256_set1_epi32(kTail), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  const int64_t k8 = kc / 8 * 8;
  __m256 r[8];
  for (int64_t k = 0; k < k8; k += 8) {
    float* o = d + k * W;
    for (int g = 0; g < W; g += 8) {
      const int lines = std::min(8, W - g);
      for (int i = 0; i < lines; ++i) r[i] = _mm256_loadu_ps(rows[g + i] + k);
      for (int i = lines; i < 8; ++i) r[i] = _mm256_setzero_ps();
      transpose8(r);
      if (lines == 8)
        for (int j = 0; j < 8; ++j) _mm256_storeu_ps(o + j * W + g, r[j]);
      else
        for (int j = 0; j < 8; ++j) _mm256_maskstore_ps(o + j * W + g, tail_lanes, r[j]);
    }
  }
  return k8;
}
#endif

// Packs a panel of w <= W lines (stride si bytes) by kc steps along k (stride sk bytes) as d[k * W + i],
// zero-padding lines w..W-1 so edge tiles can run the full micro-kernel.
template <int W, typename Load>
void pack_panel_generic(const char* base, int64_t si, int64_t sk, int w, int64_t kc, float* d, Load load) {
  for (int64_t k = 0; k < kc; ++k) {
    const char* p = base + k * sk;
    float* o = d + k * W;
    int i = 0;
    for (; i < w; ++i) o[i] = load(p + i * si);
    for (; i < W; ++i) o[i] = 0.0f;
  }
}

template <int W>
void pack_panel(const Operand& x, const char* base, int64_t si, int64_t sk, int w, int64_t kc, float* d,
                bool round) {
  if (round && x.dtype == DType::F32)
    return pack_panel_generic<W>(base, si, sk, w, kc, d, RoundBf16<LoadF32>{});
  if (round && x.dtype == DType::F16)
    return pack_panel_generic<W>(base, si, sk, w, kc, d, RoundBf16<LoadF16>{});
  if (x.dtype == DType::F32 && w == W) {
    if (si == int64_t(sizeof(float))) {
      // The panel's lines are adjacent in memory: W consecutive floats per step (a plain vector copy).
      for (int64_t k = 0; k < kc; ++k) {
        std::memcpy(d + k * W, base + k * sk, W * sizeof(float));
      }
      return;
    }
    if (sk == int64_t(sizeof(float))) {
      // Each line is contiguous along k: read W streams side by side, a transpose through the packing.
      const float* rows[W];
      for (int i = 0; i < W; ++i) rows[i] = reinterpret_cast<const float*>(base + i * si);
      int64_t k = 0;
#ifdef RETORT_GEMM_X86
      if (cpu_has_avx2_fma()) k = pack_transposed_avx2<W>(rows, kc, d);
#endif
      for (; k < kc; ++k)
        for (int i = 0; i < W; ++i) d[k * W + i] = rows[i][k];
      return;
    }
  }
  switch (x.dtype) {
    case DType::F32:
      pack_panel_generic<W>(base, si, sk, w, kc, d, LoadF32{});
      break;
    case DType::BF16:
      pack_panel_generic<W>(base, si, sk, w, kc, d, LoadBF16{});
      break;
    case DType::F16:
      pack_panel_generic<W>(base, si, sk, w, kc, d, LoadF16{});
      break;
    default:
      RT_ASSERT(false && "matmul: integer operand reached the kernel");
  }
}

// pack_a for f32 A whose rows are adjacent floats (A is the transpose of a row-major matrix, as dlogitsᵀ in a
// weight gradient): each step along k reads the block's mc floats as one contiguous run and deals them out
// to the panels, so memory is read in order once instead of once per panel with a page-sized stride.
template <int kMR>
void pack_a_rows_adjacent(const char* base, int64_t sk, int64_t mc, int64_t kc, float* dst) {
  const int64_t full = mc / kMR;
  const int tail = int(mc - full * kMR);
  // Successive steps are a page or more apart, too far for the hardware prefetcher: ask for a later one.
  constexpr int64_t kAhead = 8;
  const int64_t bytes = mc * int64_t(sizeof(float));
  for (int64_t k = 0; k < kc; ++k) {
    if (k + kAhead < kc)
      for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(base + (k + kAhead) * sk + o);
    const float* src = reinterpret_cast<const float*>(base + k * sk);
    float* d = dst + k * kMR;
    for (int64_t ip = 0; ip < full; ++ip, src += kMR, d += kMR * kc)
      std::memcpy(d, src, kMR * sizeof(float));  // one vector move, not kMR scalar ones
    if (tail) {
      int i = 0;
      for (; i < tail; ++i) d[i] = src[i];
      for (; i < kMR; ++i) d[i] = 0.0f;
    }
  }
}

// Rows [i0, i0 + mc) x k [p0, p0 + kc) of A as ceil(mc / MR) row panels, each MR x kc.
template <int kMR>
void pack_a(const Operand& a, int64_t i0, int64_t mc, int64_t p0, int64_t kc, float* dst, bool round) {
  const char* base = static_cast<const char*>(a.data);
  if (!round && a.dtype == DType::F32 && a.rs == int64_t(sizeof(float)))
    return pack_a_rows_adjacent<kMR>(base + i0 * a.rs + p0 * a.cs, a.cs, mc, kc, dst);
  for (int64_t ip = 0; ip * kMR < mc; ++ip) {
    int w = int(std::min<int64_t>(kMR, mc - ip * kMR));
    pack_panel<kMR>(a, base + (i0 + ip * kMR) * a.rs + p0 * a.cs, a.rs, a.cs, w, kc, dst + ip * kMR * kc,
                    round);
  }
}

// Column panels [jp0, jp1) (NR wide) of the B block at k [p0, p0 + kc), columns [j0, j0 + nc).
template <int kNR>
void pack_b(const Operand& b, int64_t j0, int64_t nc, int64_t p0, int64_t kc, int64_t jp0, int64_t jp1,
            float* dst, bool round) {
  const char* base = static_cast<const char*>(b.data);
  for (int64_t jp = jp0; jp < jp1; ++jp) {
    int w = int(std::min<int64_t>(kNR, nc - jp * kNR));
    pack_panel<kNR>(b, base + (j0 + jp * kNR) * b.cs + p0 * b.rs, b.cs, b.rs, w, kc, dst + jp * kNR * kc,
                    round);
  }
}

// ---- micro-kernels
// -------------------------------------------------------------------------------------------- c[MR x NR]
// (row stride ldc) = (accumulate ? c : 0) + sum over k of a[k * MR + i] * b[k * NR + j].
using MicroKernel = void (*)(int64_t kc, const float* a, const float* b, float* c, int64_t ldc,
                             bool accumulate);

// The portable and AVX2 kernels share AVX2's tile.
constexpr int kMR = TileAvx2::kMR;
constexpr int kNR = TileAvx2::kNR;

void ukernel_portable(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, bool accumulate) {
  float acc[kMR][kNR] = {};
  for (int64_t k = 0; k < kc; ++k, a += kMR, b += kNR)
    for (int i = 0; i < kMR; ++i)
      for (int j = 0; j < kNR; ++j) acc[i][j] += a[i] * b[j];
  for (int i = 0; i < kMR; ++i)
    for (int j = 0; j < kNR; ++j) c[i * ldc + j] = (accumulate ? c[i * ldc + j] : 0.0f) + acc[i][j];
}

#ifdef RETORT_GEMM_X86
// (A lambda would not inherit the target attribute, hence a helper.)
__attribute__((target("avx2,fma"), always_inline)) inline void store_row_avx2(float* r, __m256 lo, __m256 hi,
                                                                              bool accumulate) {
  if (accumulate) {
    lo = _mm256_add_ps(lo, _mm256_loadu_ps(r));
    hi = _mm256_add_ps(hi, _mm256_loadu_ps(r + 8));
  }
  _mm256_storeu_ps(r, lo);
  _mm256_storeu_ps(r + 8, hi);
}

__attribute__((target("avx2,fma"))) void ukernel_avx2(int64_t kc, const float* a, const float* b, float* c,
                                                      int64_t ldc, bool accumulate) {
  __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps();
  __m256 c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps();
  __m256 c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps();
  __m256 c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps();
  __m256 c40 = _mm256_setzero_ps(), c41 = _mm256_setzero_ps();
  __m256 c50 = _mm256_setzero_ps(), c51 = _mm256_setzero_ps();
  // Warm the C tile while the loop runs, so the final load/store does not stall on memory.
  for (int i = 0; i < kMR; ++i) _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc), _MM_HINT_T0);
#pragma GCC unroll 4
  for (int64_t k = 0; k < kc; ++k) {
    const __m256 b0 = _mm256_load_ps(b);
    const __m256 b1 = _mm256_load_ps(b + 8);
    __m256 av = _mm256_broadcast_ss(a + 0);
    c00 = _mm256_fmadd_ps(av, b0, c00);
    c01 = _mm256_fmadd_ps(av, b1, c01);
    av = _mm256_broadcast_ss(a + 1);
    c10 = _mm256_fmadd_ps(av, b0, c10);
    c11 = _mm256_fmadd_ps(av, b1, c11);
    av = _mm256_broadcast_ss(a + 2);
    c20 = _mm256_fmadd_ps(av, b0, c20);
    c21 = _mm256_fmadd_ps(av, b1, c21);
    av = _mm256_broadcast_ss(a + 3);
    c30 = _mm256_fmadd_ps(av, b0, c30);
    c31 = _mm256_fmadd_ps(av, b1, c31);
    av = _mm256_broadcast_ss(a + 4);
    c40 = _mm256_fmadd_ps(av, b0, c40);
    c41 = _mm256_fmadd_ps(av, b1, c41);
    av = _mm256_broadcast_ss(a + 5);
    c50 = _mm256_fmadd_ps(av, b0, c50);
    c51 = _mm256_fmadd_ps(av, b1, c51);
    a += kMR;
    b += kNR;
  }
  store_row_avx2(c + 0 * ldc, c00, c01, accumulate);
  store_row_avx2(c + 1 * ldc, c10, c11, accumulate);
  store_row_avx2(c + 2 * ldc, c20, c21, accumulate);
  store_row_avx2(c + 3 * ldc, c30, c31, accumulate);
  store_row_avx2(c + 4 * ldc, c40, c41, accumulate);
  store_row_avx2(c + 5 * ldc, c50, c51, accumulate);
}

#define RT_AVX512_F32 __attribute__((target("avx2,fma,avx512f")))

RT_AVX512_F32 void ukernel_avx512(int64_t kc, const float* a, const float* b, float* c, int64_t ldc,
                                  bool accumulate) {
  constexpr int MR = TileAvx512::kMR, NR = TileAvx512::kNR;
  __m512 acc[MR][2];
#pragma GCC unroll 12
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
#pragma GCC unroll 12
  for (int i = 0; i < MR; ++i) _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc), _MM_HINT_T0);
#pragma GCC unroll 2
  for (int64_t k = 0; k < kc; ++k) {
    const __m512 b0 = _mm512_load_ps(b);
    const __m512 b1 = _mm512_load_ps(b + 16);
#pragma GCC unroll 12
    for (int i = 0; i < MR; ++i) {
      const __m512 av = _mm512_set1_ps(a[i]);
      acc[i][0] = _mm512_fmadd_ps(av, b0, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(av, b1, acc[i][1]);
    }
    a += MR;
    b += NR;
  }
#pragma GCC unroll 12
  for (int i = 0; i < MR; ++i) detail::store_row32(c + i * ldc, acc[i][0], acc[i][1], accumulate);
}
#endif

MicroKernel avx2_kernel() {
#ifdef RETORT_GEMM_X86
  return ukernel_avx2;
#else
  return ukernel_portable;  // unreachable: kernel_available(Avx2) is false off x86
#endif
}

// The f32 form for gemm_driver.h, on a tile's blocking; with round, every operand is rounded to bf16 as it is
// packed.
template <typename Tile>
struct F32Packer {
  using Elem = float;
  static constexpr int kMR = Tile::kMR, kNR = Tile::kNR;
  static constexpr int64_t kKC = Tile::kKC, kMC = Tile::kMC, kNC = Tile::kNC, kKUnit = 1;
  static constexpr int64_t kWholeBElems = kWholeBFloats;
  static int64_t kp(int64_t kc) { return kc; }

  MicroKernel uk;
  bool round;

  void pack_a(const Operand& a, int64_t i0, int64_t mc, int64_t p0, int64_t kc, float* dst) const {
    gemm::pack_a<kMR>(a, i0, mc, p0, kc, dst, round);
  }
  void pack_b(const Operand& b, int64_t j0, int64_t nc, int64_t p0, int64_t kc, int64_t jp0, int64_t jp1,
              float* dst) const {
    gemm::pack_b<kNR>(b, j0, nc, p0, kc, jp0, jp1, dst, round);
  }
  void ukernel(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, bool accumulate) const {
    uk(kc, a, b, c, ldc, accumulate);
  }
};

// The f32 GEMM on kernel (Portable, Avx2 or Avx512), operands rounded to bf16 while packing with round.
void gemm_f32(int64_t m, int64_t n, int64_t k, const Operand& a, const Operand& b, float* c, int64_t ldc,
              ThreadPool* pool, Kernel kernel, bool accumulate, bool round) {
#ifdef RETORT_GEMM_X86
  if (kernel == Kernel::Avx512)
    return detail::gemm_blocked(F32Packer<TileAvx512>{ukernel_avx512, round}, m, n, k, a, b, c, ldc, pool,
                                accumulate);
#endif
  detail::gemm_blocked(F32Packer<TileAvx2>{kernel == Kernel::Avx2 ? avx2_kernel() : ukernel_portable, round},
                       m, n, k, a, b, c, ldc, pool, accumulate);
}

}  // namespace

bool kernel_available(Kernel k) {
  switch (k) {
    case Kernel::Portable:
      return true;
    case Kernel::Avx2:
      return cpu_has_avx2_fma();
    case Kernel::Avx512:
      return cpu_has_avx512f();
    case Kernel::Avx512Bf16:
      return cpu_has_avx512_bf16();
  }
  return false;
}
Kernel best_kernel() {
  if (cpu_has_avx512f()) return Kernel::Avx512;
  return cpu_has_avx2_fma() ? Kernel::Avx2 : Kernel::Portable;
}
Kernel best_bf16_kernel() {
  // vdpbf16ps pays where it does twice the products of an f32 FMA per cycle: AMD's Zen 4 and 5 (1.9x the f32
  // GEMM). Intel's cores issue it at the rate of their two 512-bit f32 FMAs, and there the f32 kernel on
  // operands rounded while packing is 1.8x faster (bench/RESULTS.md, "The CPU step, AVX-512 f32 GEMM").
  static const bool pays = [] {
#ifdef RETORT_GEMM_X86
    __builtin_cpu_init();
    return cpu_has_avx512_bf16() && __builtin_cpu_is("amd");
#else
    return false;
#endif
  }();
  return pays ? Kernel::Avx512Bf16 : best_kernel();
}
const char* kernel_name(Kernel k) {
  switch (k) {
    case Kernel::Portable:
      return "portable";
    case Kernel::Avx2:
      return "avx2+fma";
    case Kernel::Avx512:
      return "avx512";
    case Kernel::Avx512Bf16:
      return "avx512-bf16";
  }
  return "?";
}

void sgemm(int64_t m, int64_t n, int64_t k, const Operand& a, const Operand& b, float* c, int64_t ldc,
           ThreadPool* pool, Kernel kernel, bool accumulate) {
  RT_ASSERT(m > 0 && n > 0 && k > 0);
  RT_ASSERT(kernel != Kernel::Avx512Bf16 && kernel_available(kernel));
  RT_ASSERT(!accumulate || !gemv_applies(m, a, b));
  if (gemv_applies(m, a, b)) return gemv(m, n, k, a, b, c, ldc, pool, kernel);
  gemm_f32(m, n, k, a, b, c, ldc, pool, kernel, accumulate, false);
}

void gemm_f32_rounding_bf16(int64_t m, int64_t n, int64_t k, const Operand& a, const Operand& b, float* c,
                            int64_t ldc, ThreadPool* pool, Kernel kernel, bool accumulate) {
  RT_ASSERT(kernel != Kernel::Avx512Bf16 && kernel_available(kernel));
  gemm_f32(m, n, k, a, b, c, ldc, pool, kernel, accumulate, true);
}

}  // namespace retort::gemm
