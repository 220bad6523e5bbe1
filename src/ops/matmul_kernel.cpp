// The CPU GEMM: the classic five-loop blocking (Goto / BLIS). Blocks of B (KC x NC) are packed into column
// panels NR wide and shared by the threads; each thread packs its own blocks of A (MC x KC) into row panels
// MR tall, and a micro-kernel multiplies one A panel by one B panel into an MR x NR tile of C held in
// registers. Packing is where strides, transposes and bf16/f16 storage are absorbed: the micro-kernel only
// ever sees contiguous, aligned f32 panels.
#include "matmul_kernel.h"

#if defined(__x86_64__) || defined(__i386__)
#define RETORT_GEMM_X86 1
#include <immintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <thread>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "../core/error.h"
#include "../core/thread_pool.h"

namespace retort::gemm {

namespace {

// Register tile: 6 rows x 16 columns = 12 ymm accumulators, plus 2 for B and 1 for the broadcast A value,
// fits the 16 ymm registers of AVX2 exactly.
constexpr int kMR = 6;
constexpr int kNR = 16;
// Cache blocks. A KC x NR panel of B (16 KiB) stays in L1 while the micro-kernel sweeps the A block; the MC x
// KC block of A (~160 KiB) stays in L2 (512 KiB per core on this Zen); the KC x NC block of B lives in L3.
constexpr int64_t kKC = 256;
constexpr int64_t kMC = 168;
constexpr int64_t kNC = 3072;
// Below this many flops per thread, waking another thread costs more than it saves.
constexpr double kMinFlopsPerThread = 4.0e6;
// The most packed B (floats) that sgemm_whole_b keeps at once: 1 MiB, an L2's worth shared by the threads.
constexpr int64_t kWholeBFloats = int64_t(1) << 18;

// A barrier for the threads of one GEMM, which are all running: spinning keeps them on their cores between
// blocks (a sleeping thread takes a scheduler round trip to wake), and yielding after a while keeps a
// descheduled partner from being starved by the spinner on a busy machine.
class SpinBarrier {
 public:
  explicit SpinBarrier(int n) : n_(n) {}
  void wait() {
    const int gen = generation_.load(std::memory_order_acquire);
    if (count_.fetch_add(1, std::memory_order_acq_rel) == n_ - 1) {
      count_.store(0, std::memory_order_relaxed);
      generation_.fetch_add(1, std::memory_order_release);
      return;
    }
    for (int spins = 0; generation_.load(std::memory_order_acquire) == gen; ++spins) {
      if (spins < 20000)
        cpu_relax();
      else
        std::this_thread::yield();
    }
  }

 private:
  static void cpu_relax() {
#ifdef RETORT_GEMM_X86
    _mm_pause();
#endif
  }
  const int n_;
  std::atomic<int> count_{0};
  std::atomic<int> generation_{0};
};

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}
int64_t round_up(int64_t a, int64_t b) {
  return ceil_div(a, b) * b;
}

// Splits `total` into ceil(total / max_block) nearly equal blocks, each a multiple of `unit` (but the last):
// equal blocks avoid a thin tail block that would stream a whole B panel for a few rows.
int64_t balanced_block(int64_t total, int64_t max_block, int64_t unit) {
  int64_t blocks = ceil_div(total, max_block);
  return std::min(max_block, round_up(ceil_div(total, blocks), unit));
}

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};
using AlignedFloats = std::unique_ptr<float, FreeDeleter>;

AlignedFloats alloc_floats(int64_t n) {
  size_t bytes = size_t(round_up(std::max<int64_t>(n, 1) * int64_t(sizeof(float)), 64));
  float* p = static_cast<float*>(std::aligned_alloc(64, bytes));
  if (!p) RT_FAIL("matmul: cannot allocate ", bytes, " bytes of packing buffer");
  return AlignedFloats(p);
}

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

// The transposing pack (d[k * W + i] = rows[i][k]) eight steps of k at a time for W = 6 or 16; returns how
// many steps it packed (a multiple of 8), the rest is left to the scalar loop.
template <int W>
__attribute__((target("avx2,fma"))) int64_t pack_transposed_avx2(const float* const* rows, int64_t kc,
                                                                 float* d) {
  static_assert(W == kMR || W == kNR);
  const int64_t k8 = kc / 8 * 8;
  __m256 r[8];
  for (int64_t k = 0; k < k8; k += 8) {
    float* o = d + k * W;
    if constexpr (W == kNR) {
      for (int h = 0; h < 2; ++h) {
        for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(rows[8 * h + i] + k);
        transpose8(r);
        for (int j = 0; j < 8; ++j) _mm256_storeu_ps(o + j * W + 8 * h, r[j]);
      }
    } else {
      for (int i = 0; i < W; ++i) r[i] = _mm256_loadu_ps(rows[i] + k);
      for (int i = W; i < 8; ++i) r[i] = _mm256_setzero_ps();
      transpose8(r);
      // Each step's 8 lanes hold W rows and 8 - W zeros; storing in order lets the next step overwrite the
      // zeros, and the last step stores its W lanes only.
      for (int j = 0; j < 7; ++j) _mm256_storeu_ps(o + j * W, r[j]);
      static_assert(kMR == 6, "the mask below keeps 6 lanes");
      const __m256i first_w = _mm256_setr_epi32(-1, -1, -1, -1, -1, -1, 0, 0);
      _mm256_maskstore_ps(o + 7 * W, first_w, r[7]);
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
void pack_panel(const Operand& x, const char* base, int64_t si, int64_t sk, int w, int64_t kc, float* d) {
  if (x.dtype == DType::F32 && w == W) {
    if (si == int64_t(sizeof(float))) {
      // The panel's lines are adjacent in memory: W consecutive floats per step (a plain vector copy).
      for (int64_t k = 0; k < kc; ++k) {
        const float* p = reinterpret_cast<const float*>(base + k * sk);
        for (int i = 0; i < W; ++i) d[k * W + i] = p[i];
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
      for (int i = 0; i < kMR; ++i) d[i] = src[i];
    if (tail) {
      int i = 0;
      for (; i < tail; ++i) d[i] = src[i];
      for (; i < kMR; ++i) d[i] = 0.0f;
    }
  }
}

// Rows [i0, i0 + mc) x k [p0, p0 + kc) of A as ceil(mc / MR) row panels, each MR x kc.
void pack_a(const Operand& a, int64_t i0, int64_t mc, int64_t p0, int64_t kc, float* dst) {
  const char* base = static_cast<const char*>(a.data);
  if (a.dtype == DType::F32 && a.rs == int64_t(sizeof(float)))
    return pack_a_rows_adjacent(base + i0 * a.rs + p0 * a.cs, a.cs, mc, kc, dst);
  for (int64_t ip = 0; ip * kMR < mc; ++ip) {
    int w = int(std::min<int64_t>(kMR, mc - ip * kMR));
    pack_panel<kMR>(a, base + (i0 + ip * kMR) * a.rs + p0 * a.cs, a.rs, a.cs, w, kc, dst + ip * kMR * kc);
  }
}

// Column panels [jp0, jp1) (NR wide) of the B block at k [p0, p0 + kc), columns [j0, j0 + nc).
void pack_b(const Operand& b, int64_t j0, int64_t nc, int64_t p0, int64_t kc, int64_t jp0, int64_t jp1,
            float* dst) {
  const char* base = static_cast<const char*>(b.data);
  for (int64_t jp = jp0; jp < jp1; ++jp) {
    int w = int(std::min<int64_t>(kNR, nc - jp * kNR));
    pack_panel<kNR>(b, base + (j0 + jp * kNR) * b.cs + p0 * b.rs, b.cs, b.rs, w, kc, dst + jp * kNR * kc);
  }
}

// ---- micro-kernels
// -------------------------------------------------------------------------------------------- c[MR x NR]
// (row stride ldc) = (accumulate ? c : 0) + sum over k of a[k * MR + i] * b[k * NR + j].
using MicroKernel = void (*)(int64_t kc, const float* a, const float* b, float* c, int64_t ldc,
                             bool accumulate);

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
#endif

// One packed A block (mc rows) times the packed B panels [jp0, jp1) of a block nc columns wide, into C.
void macro_kernel(MicroKernel uk, int64_t mc, int64_t nc, int64_t kc, int64_t jp0, int64_t jp1,
                  const float* ap, const float* bp, float* c, int64_t ldc, bool accumulate) {
  alignas(64) float tile[kMR * kNR];
  for (int64_t jp = jp0; jp < jp1; ++jp) {
    const int64_t nr = std::min<int64_t>(kNR, nc - jp * kNR);
    const float* bpanel = bp + jp * kNR * kc;
    for (int64_t ip = 0; ip * kMR < mc; ++ip) {
      const int64_t mr = std::min<int64_t>(kMR, mc - ip * kMR);
      float* ct = c + ip * kMR * ldc + jp * kNR;
      if (mr == kMR && nr == kNR) {
        uk(kc, ap + ip * kMR * kc, bpanel, ct, ldc, accumulate);
        continue;
      }
      // Edge tile: compute the full tile aside and keep only the valid part.
      uk(kc, ap + ip * kMR * kc, bpanel, tile, kNR, false);
      for (int64_t i = 0; i < mr; ++i)
        for (int64_t j = 0; j < nr; ++j)
          ct[i * ldc + j] = (accumulate ? ct[i * ldc + j] : 0.0f) + tile[i * kNR + j];
    }
  }
}

// Runs fn(t, nthreads) on `threads` threads of pool (one parallel region), or on the caller alone.
template <typename F>
void run_threads(ThreadPool* pool, int threads, F&& fn) {
  if (threads == 1) {
    fn(0, 1);
    return;
  }
  pool->parallel_for(threads, [&](int64_t t0, int64_t t1) {
    // parallel_for gives each of `threads` shares one index, unless it runs the whole range inline (a nested
    // call): then this thread does everything alone.
    if (t1 - t0 == 1)
      fn(int(t0), threads);
    else
      fn(0, 1);
  });
}

// A tall C with few columns and a long k (a weight gradient: [V, H] = dlogitsᵀ [V, rows] · hidden [rows, H]):
// all of B is packed once, then each thread runs its row blocks with k innermost, so a block's C tile is
// read and written once from cache instead of once per k block from memory.
void sgemm_whole_b(int64_t m, int64_t n, int64_t k, const Operand& a, const Operand& b, float* c, int64_t ldc,
                   ThreadPool* pool, MicroKernel uk, int threads, int64_t kc_max, bool accumulate) {
  const int64_t n_panels = ceil_div(n, kNR), k_blocks = ceil_div(k, kc_max);
  const int64_t b_block = n_panels * kNR * kc_max;
  AlignedFloats bbuf = alloc_floats(b_block * k_blocks);
  const int64_t m_panels = ceil_div(m, kMR);
  std::vector<AlignedFloats> abufs;
  for (int t = 0; t < threads; ++t) abufs.push_back(alloc_floats(round_up(std::min(m, kMC), kMR) * kc_max));
  SpinBarrier barrier(threads);
  run_threads(pool, threads, [&](int t, int nthreads) {
    // The threads pack B's k blocks between them, then wait until all of B is there.
    for (int64_t pb = t; pb < k_blocks; pb += nthreads) {
      const int64_t pc = pb * kc_max;
      pack_b(b, 0, n, pc, std::min(kc_max, k - pc), 0, n_panels, bbuf.get() + pb * b_block);
    }
    if (nthreads > 1) barrier.wait();
    const int64_t m0 = std::min(m, m_panels * t / nthreads * kMR);
    const int64_t m1 = std::min(m, m_panels * (t + 1) / nthreads * kMR);
    if (m0 >= m1) return;
    float* ap = abufs[size_t(t)].get();
    const int64_t mc_max = balanced_block(m1 - m0, kMC, kMR);
    for (int64_t ic = m0; ic < m1; ic += mc_max) {
      const int64_t mc = std::min(mc_max, m1 - ic);
      for (int64_t pb = 0; pb < k_blocks; ++pb) {
        const int64_t pc = pb * kc_max, kc = std::min(kc_max, k - pc);
        pack_a(a, ic, mc, pc, kc, ap);
        macro_kernel(uk, mc, n, kc, 0, n_panels, ap, bbuf.get() + pb * b_block, c + ic * ldc, ldc,
                     accumulate || pb > 0);
      }
    }
  });
}

MicroKernel avx2_kernel() {
#ifdef RETORT_GEMM_X86
  return ukernel_avx2;
#else
  return ukernel_portable;  // unreachable: kernel_available(Avx2) is false off x86
#endif
}

}  // namespace

bool kernel_available(Kernel k) {
  return k == Kernel::Portable || cpu_has_avx2_fma();
}
Kernel best_kernel() {
  return cpu_has_avx2_fma() ? Kernel::Avx2 : Kernel::Portable;
}
const char* kernel_name(Kernel k) {
  return k == Kernel::Avx2 ? "avx2+fma" : "portable";
}

void sgemm(int64_t m, int64_t n, int64_t k, const Operand& a, const Operand& b, float* c, int64_t ldc,
           ThreadPool* pool, Kernel kernel, bool accumulate) {
  RT_ASSERT(m > 0 && n > 0 && k > 0);
  RT_ASSERT(kernel_available(kernel));
  RT_ASSERT(!accumulate || !gemv_applies(m, a, b));
  if (gemv_applies(m, a, b)) return gemv(m, n, k, a, b, c, ldc, pool, kernel);
  const MicroKernel uk = kernel == Kernel::Avx2 ? avx2_kernel() : ukernel_portable;

  int threads = 1;
  if (pool && pool->size() > 1) {
    double flops = 2.0 * double(m) * double(n) * double(k);
    threads = int(std::clamp<double>(flops / kMinFlopsPerThread, 1.0, double(pool->size())));
  }
  const int64_t m_panels = ceil_div(m, kMR);
  // Split rows between threads when each gets at least two row panels; otherwise (a short, wide C) split the
  // columns of each B block, and every thread packs the few rows of A it needs itself.
  const bool split_rows = m_panels >= 2 * threads;

  const int64_t kc_max = balanced_block(k, kKC, 1);
  const int64_t nc_max = balanced_block(n, kNC, kNR);
  const int64_t b_floats = round_up(nc_max, kNR) * kc_max;
  const int64_t k_blocks = ceil_div(k, kc_max);
  if (split_rows && nc_max == n && k_blocks > 1 && b_floats * k_blocks <= kWholeBFloats)
    return sgemm_whole_b(m, n, k, a, b, c, ldc, pool, uk, threads, kc_max, accumulate);
  // Split rows share each packed B block; two buffers let a thread pack the next block while a slower one
  // still reads the current block, so one barrier per block suffices.
  AlignedFloats bbufs[2] = {alloc_floats(b_floats), alloc_floats(split_rows && threads > 1 ? b_floats : 1)};
  std::vector<AlignedFloats> abufs;
  for (int t = 0; t < threads; ++t) abufs.push_back(alloc_floats(round_up(std::min(m, kMC), kMR) * kc_max));
  SpinBarrier barrier(threads);

  // Everything thread t of nthreads does. One parallel region per GEMM: waking the pool's threads per block
  // costs tens of microseconds each, and far more when the machine is busy.
  auto run = [&](int t, int nthreads) {
    float* ap = abufs[size_t(t)].get();
    int step = 0;
    for (int64_t jc = 0; jc < n; jc += nc_max) {
      const int64_t nc = std::min(nc_max, n - jc);
      const int64_t n_panels = ceil_div(nc, kNR);
      for (int64_t pc = 0; pc < k; pc += kc_max, ++step) {
        const int64_t kc = std::min(kc_max, k - pc);
        // Split columns share one B buffer, each thread packing and reading its own panels; but a block's
        // panels move (a shorter last block of n or k re-divides them and shifts their offsets), so no thread
        // may pack the next block while another still reads this one.
        if (!split_rows && nthreads > 1 && step > 0) barrier.wait();
        // This thread's share: rows [m0, m1) and B panels [jp0, jp1); with split rows it packs panels
        // [pp0, pp1) of the block for everyone.
        int64_t m0 = 0, m1 = m, jp0 = 0, jp1 = n_panels, pp0, pp1;
        float* bp = bbufs[nthreads > 1 && split_rows ? step % 2 : 0].get();
        if (split_rows) {
          m0 = std::min(m, m_panels * t / nthreads * kMR);
          m1 = std::min(m, m_panels * (t + 1) / nthreads * kMR);
          pp0 = n_panels * t / nthreads;
          pp1 = n_panels * (t + 1) / nthreads;
        } else {
          jp0 = pp0 = n_panels * t / nthreads;
          jp1 = pp1 = n_panels * (t + 1) / nthreads;
        }
        pack_b(b, jc, nc, pc, kc, pp0, pp1, bp);
        if (split_rows && nthreads > 1) barrier.wait();  // the whole B block is packed
        if (m0 >= m1 || jp0 >= jp1) continue;
        const int64_t mc_max = balanced_block(m1 - m0, kMC, kMR);
        for (int64_t ic = m0; ic < m1; ic += mc_max) {
          const int64_t mc = std::min(mc_max, m1 - ic);
          pack_a(a, ic, mc, pc, kc, ap);
          macro_kernel(uk, mc, nc, kc, jp0, jp1, ap, bp, c + ic * ldc + jc, ldc, accumulate || pc > 0);
        }
      }
    }
  };

  run_threads(pool, threads, run);
}

}  // namespace retort::gemm
