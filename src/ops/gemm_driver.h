// The CPU GEMM's blocking and threading, shared by its f32 and bf16 forms: the classic five-loop blocking
// (Goto / BLIS). Blocks of B (KC x NC) are packed into column panels NR wide and shared by the threads; each
// thread packs its own blocks of A (MC x KC) into row panels MR tall, and a micro-kernel multiplies one A
// panel by one B panel into an MR x NR tile of C held in registers. What a form packs and how it multiplies
// is its Packer (matmul_kernel.cpp: f32 panels; matmul_bf16.cpp: bf16 pairs); everything here is the same for
// both. Private to src/ops.
#pragma once

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "../core/error.h"
#include "../core/thread_pool.h"
#include "matmul_kernel.h"

namespace retort::gemm::detail {

// Below this many flops per thread, waking another thread costs more than it saves.
inline constexpr double kMinFlopsPerThread = 4.0e6;

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
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#endif
  }
  const int n_;
  std::atomic<int> count_{0};
  std::atomic<int> generation_{0};
};

#if defined(__x86_64__) || defined(__i386__)
// One row of a 32-wide C tile from two zmm accumulators, stored or added to what C holds (the AVX-512 f32 and
// bf16 micro-kernels).
__attribute__((target("avx512f"), always_inline)) inline void store_row32(float* r, __m512 lo, __m512 hi,
                                                                          bool accumulate) {
  if (accumulate) {
    lo = _mm512_add_ps(lo, _mm512_loadu_ps(r));
    hi = _mm512_add_ps(hi, _mm512_loadu_ps(r + 16));
  }
  _mm512_storeu_ps(r, lo);
  _mm512_storeu_ps(r + 16, hi);
}
#endif

inline int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}
inline int64_t round_up(int64_t a, int64_t b) {
  return ceil_div(a, b) * b;
}

// Splits `total` into ceil(total / max_block) nearly equal blocks, each a multiple of `unit` (but the last):
// equal blocks avoid a thin tail block that would stream a whole B panel for a few rows.
inline int64_t balanced_block(int64_t total, int64_t max_block, int64_t unit) {
  int64_t blocks = ceil_div(total, max_block);
  return std::min(max_block, round_up(ceil_div(total, blocks), unit));
}

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
template <typename T>
using AlignedBuf = std::unique_ptr<T, FreeDeleter>;

template <typename T>
AlignedBuf<T> alloc_elems(int64_t n) {
  size_t bytes = size_t(round_up(std::max<int64_t>(n, 1) * int64_t(sizeof(T)), 64));
  T* p = static_cast<T*>(std::aligned_alloc(64, bytes));
  if (!p) RT_FAIL("matmul: cannot allocate ", bytes, " bytes of packing buffer");
  return AlignedBuf<T>(p);
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

// A Packer P provides:
//   Elem                          the packed element type;
//   kMR, kNR, kKC, kMC, kNC       the register tile and the cache blocks;
//   kKUnit                        the k steps one packed element group spans (blocks but the last are
//                                 multiples of it);
//   kWholeBElems                  the most packed B elements the whole-B path keeps at once;
//   kp(kc)                        a panel's packed length along k for kc steps (kc rounded up to kKUnit);
//   pack_a(a, i0, mc, p0, kc, dst)               rows [i0, i0 + mc) as MR-row panels of kp(kc) steps;
//   pack_b(b, j0, nc, p0, kc, jp0, jp1, dst)     the column panels [jp0, jp1) of a block of nc columns;
//   ukernel(kp, a, b, c, ldc, accumulate)         c[MR x NR] (=|+=) the panels' product.

// One packed A block (mc rows) times the packed B panels [jp0, jp1) of a block nc columns wide, into C.
template <typename P>
void macro_kernel(const P& pk, int64_t mc, int64_t nc, int64_t kc, int64_t jp0, int64_t jp1,
                  const typename P::Elem* ap, const typename P::Elem* bp, float* c, int64_t ldc,
                  bool accumulate) {
  constexpr int MR = P::kMR, NR = P::kNR;
  alignas(64) float tile[MR * NR];
  const int64_t kp = P::kp(kc);
  for (int64_t jp = jp0; jp < jp1; ++jp) {
    const int64_t nr = std::min<int64_t>(NR, nc - jp * NR);
    const typename P::Elem* bpanel = bp + jp * NR * kp;
    for (int64_t ip = 0; ip * MR < mc; ++ip) {
      const int64_t mr = std::min<int64_t>(MR, mc - ip * MR);
      float* ct = c + ip * MR * ldc + jp * NR;
      if (mr == MR && nr == NR) {
        pk.ukernel(kp, ap + ip * MR * kp, bpanel, ct, ldc, accumulate);
        continue;
      }
      // Edge tile: compute the full tile aside and keep only the valid part.
      pk.ukernel(kp, ap + ip * MR * kp, bpanel, tile, NR, false);
      for (int64_t i = 0; i < mr; ++i)
        for (int64_t j = 0; j < nr; ++j)
          ct[i * ldc + j] = (accumulate ? ct[i * ldc + j] : 0.0f) + tile[i * NR + j];
    }
  }
}

// A tall C with few columns and a long k (a weight gradient: [V, H] = dlogitsᵀ [V, rows] · hidden [rows, H]):
// all of B is packed once, then each thread runs its row blocks with k innermost, so a block's C tile is
// read and written once from cache instead of once per k block from memory.
template <typename P>
void gemm_whole_b(const P& pk, int64_t m, int64_t n, int64_t k, const Operand& a, const Operand& b, float* c,
                  int64_t ldc, ThreadPool* pool, int threads, int64_t kc_max, bool accumulate) {
  using E = typename P::Elem;
  constexpr int MR = P::kMR, NR = P::kNR;
  const int64_t n_panels = ceil_div(n, NR), k_blocks = ceil_div(k, kc_max);
  const int64_t b_block = n_panels * NR * P::kp(kc_max);
  AlignedBuf<E> bbuf = alloc_elems<E>(b_block * k_blocks);
  const int64_t m_panels = ceil_div(m, MR);
  std::vector<AlignedBuf<E>> abufs;
  for (int t = 0; t < threads; ++t)
    abufs.push_back(alloc_elems<E>(round_up(std::min(m, P::kMC), MR) * P::kp(kc_max)));
  SpinBarrier barrier(threads);
  run_threads(pool, threads, [&](int t, int nthreads) {
    // The threads pack B's k blocks between them, then wait until all of B is there.
    for (int64_t pb = t; pb < k_blocks; pb += nthreads) {
      const int64_t pc = pb * kc_max;
      pk.pack_b(b, 0, n, pc, std::min(kc_max, k - pc), 0, n_panels, bbuf.get() + pb * b_block);
    }
    if (nthreads > 1) barrier.wait();
    const int64_t m0 = std::min(m, m_panels * t / nthreads * MR);
    const int64_t m1 = std::min(m, m_panels * (t + 1) / nthreads * MR);
    if (m0 >= m1) return;
    E* ap = abufs[size_t(t)].get();
    const int64_t mc_max = balanced_block(m1 - m0, P::kMC, MR);
    for (int64_t ic = m0; ic < m1; ic += mc_max) {
      const int64_t mc = std::min(mc_max, m1 - ic);
      for (int64_t pb = 0; pb < k_blocks; ++pb) {
        const int64_t pc = pb * kc_max, kc = std::min(kc_max, k - pc);
        pk.pack_a(a, ic, mc, pc, kc, ap);
        macro_kernel(pk, mc, n, kc, 0, n_panels, ap, bbuf.get() + pb * b_block, c + ic * ldc, ldc,
                     accumulate || pb > 0);
      }
    }
  });
}

// C[M, N] (=|+=) A B with packer pk, on up to pool's threads.
template <typename P>
void gemm_blocked(const P& pk, int64_t m, int64_t n, int64_t k, const Operand& a, const Operand& b, float* c,
                  int64_t ldc, ThreadPool* pool, bool accumulate) {
  using E = typename P::Elem;
  constexpr int MR = P::kMR, NR = P::kNR;
  int threads = 1;
  if (pool && pool->size() > 1) {
    double flops = 2.0 * double(m) * double(n) * double(k);
    threads = int(std::clamp<double>(flops / kMinFlopsPerThread, 1.0, double(pool->size())));
  }
  const int64_t m_panels = ceil_div(m, MR);
  // Split rows between threads when each gets at least two row panels; otherwise (a short, wide C) split the
  // columns of each B block, and every thread packs the few rows of A it needs itself.
  const bool split_rows = m_panels >= 2 * threads;

  const int64_t kc_max = balanced_block(k, P::kKC, P::kKUnit);
  const int64_t nc_max = balanced_block(n, P::kNC, NR);
  const int64_t b_elems = round_up(nc_max, NR) * P::kp(kc_max);
  const int64_t k_blocks = ceil_div(k, kc_max);
  if (split_rows && nc_max == n && k_blocks > 1 && b_elems * k_blocks <= P::kWholeBElems)
    return gemm_whole_b(pk, m, n, k, a, b, c, ldc, pool, threads, kc_max, accumulate);
  // Split rows share each packed B block; two buffers let a thread pack the next block while a slower one
  // still reads the current block, so one barrier per block suffices.
  AlignedBuf<E> bbufs[2] = {alloc_elems<E>(b_elems), alloc_elems<E>(split_rows && threads > 1 ? b_elems : 1)};
  std::vector<AlignedBuf<E>> abufs;
  for (int t = 0; t < threads; ++t)
    abufs.push_back(alloc_elems<E>(round_up(std::min(m, P::kMC), MR) * P::kp(kc_max)));
  SpinBarrier barrier(threads);

  // Everything thread t of nthreads does. One parallel region per GEMM: waking the pool's threads per block
  // costs tens of microseconds each, and far more when the machine is busy.
  auto run = [&](int t, int nthreads) {
    E* ap = abufs[size_t(t)].get();
    int step = 0;
    for (int64_t jc = 0; jc < n; jc += nc_max) {
      const int64_t nc = std::min(nc_max, n - jc);
      const int64_t n_panels = ceil_div(nc, NR);
      for (int64_t pc = 0; pc < k; pc += kc_max, ++step) {
        const int64_t kc = std::min(kc_max, k - pc);
        // Split columns share one B buffer, each thread packing and reading its own panels; but a block's
        // panels move (a shorter last block of n or k re-divides them and shifts their offsets), so no thread
        // may pack the next block while another still reads this one.
        if (!split_rows && nthreads > 1 && step > 0) barrier.wait();
        // This thread's share: rows [m0, m1) and B panels [jp0, jp1); with split rows it packs panels
        // [pp0, pp1) of the block for everyone.
        int64_t m0 = 0, m1 = m, jp0 = 0, jp1 = n_panels, pp0, pp1;
        E* bp = bbufs[nthreads > 1 && split_rows ? step % 2 : 0].get();
        if (split_rows) {
          m0 = std::min(m, m_panels * t / nthreads * MR);
          m1 = std::min(m, m_panels * (t + 1) / nthreads * MR);
          pp0 = n_panels * t / nthreads;
          pp1 = n_panels * (t + 1) / nthreads;
        } else {
          jp0 = pp0 = n_panels * t / nthreads;
          jp1 = pp1 = n_panels * (t + 1) / nthreads;
        }
        pk.pack_b(b, jc, nc, pc, kc, pp0, pp1, bp);
        if (split_rows && nthreads > 1) barrier.wait();  // the whole B block is packed
        if (m0 >= m1 || jp0 >= jp1) continue;
        const int64_t mc_max = balanced_block(m1 - m0, P::kMC, MR);
        for (int64_t ic = m0; ic < m1; ic += mc_max) {
          const int64_t mc = std::min(mc_max, m1 - ic);
          pk.pack_a(a, ic, mc, pc, kc, ap);
          macro_kernel(pk, mc, nc, kc, jp0, jp1, ap, bp, c + ic * ldc + jc, ldc, accumulate || pc > 0);
        }
      }
    }
  };

  run_threads(pool, threads, run);
}

}  // namespace retort::gemm::detail
