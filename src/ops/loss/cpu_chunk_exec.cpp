// The CPU ChunkExecutor: the packed CPU GEMM (matmul_kernel.h) and the CPU row kernels (row_kernels.h), on
// the thread pool of the backend. Every helper splits its work by rows or columns so that each output
// element is computed by one thread in a fixed order: results do not depend on the thread count.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <vector>

#include "../../core/error.h"
#include "../../core/thread_pool.h"
#include "../matmul_kernel.h"
#include "../vec_math.h"
#include "chunk_scheduler.h"

namespace retort::loss {

namespace {

// Scratch blocks an executor frees are kept for the next one: the graph makes an executor per compute, a
// training loop asks for the same sizes every step, and fresh pages cost a page fault and a kernel zero-fill
// each (about 5 % of a small fused loss on the CPU). At most kCacheBytes are kept, the most recently freed
// first; a request takes a kept block of at least its size and at most twice it.
class ScratchCache {
 public:
  static constexpr size_t kCacheBytes = size_t(256) << 20;

  void* take(size_t size) {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = kept_.size(); i-- > 0;) {
      const Block b = kept_[i];
      if (b.size >= size && b.size <= 2 * size) {
        kept_.erase(kept_.begin() + std::ptrdiff_t(i));
        held_ -= b.size;
        return b.p;
      }
    }
    return nullptr;
  }
  // Keeps p (of `size` bytes) if it fits under the cap after dropping the oldest blocks, else frees it.
  void give(void* p, size_t size) {
    if (size > kCacheBytes) {
      std::free(p);
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    while (held_ + size > kCacheBytes && !kept_.empty()) {
      std::free(kept_.front().p);
      held_ -= kept_.front().size;
      kept_.erase(kept_.begin());
    }
    kept_.push_back({p, size});
    held_ += size;
  }

 private:
  struct Block {
    void* p;
    size_t size;
  };
  std::mutex mu_;
  std::vector<Block> kept_;
  size_t held_ = 0;
};

// Never destroyed (an executor freed during static destruction still finds it); what it keeps stays
// reachable until the process ends.
ScratchCache& scratch_cache() {
  static ScratchCache* c = new ScratchCache;
  return *c;
}

struct CacheDeleter {
  size_t size = 0;
  void operator()(void* p) const { scratch_cache().give(p, size); }
};
using Memory = std::unique_ptr<void, CacheDeleter>;

Memory alloc_aligned(size_t bytes) {
  const size_t size = (std::max<size_t>(bytes, 1) + 255) / 256 * 256;
  void* p = scratch_cache().take(size);
  if (!p) p = std::aligned_alloc(256, size);
  if (!p) RT_FAIL("fused linear loss: cannot allocate ", bytes, " bytes of scratch");
  return Memory(p, CacheDeleter{size});
}

// The GEMM operand for op(b): element (r, c) of b, or of bᵀ when trans.
gemm::Operand operand(const Block& b, bool trans) {
  gemm::Operand o;
  o.data = b.data;
  o.dtype = b.dtype;
  o.rs = int64_t(trans ? b.col_stride : b.row_stride);
  o.cs = int64_t(trans ? b.row_stride : b.col_stride);
  return o;
}

float* f32_row(const Block& b, int64_t r) {
  return reinterpret_cast<float*>(b.row(r));
}

// Element (r, c) of a float block as f32.
float get_f(const Block& b, int64_t r, int64_t c) {
  return load_f32(b.row(r) + size_t(c) * b.col_stride, b.dtype, 0);
}

int64_t get_i(const Block& b, int64_t r, int64_t c) {
  return load_i64(b.row(r) + size_t(c) * b.col_stride, b.dtype, 0);
}

// Row r of a float block as f32 into out[0..cols).
void load_row_f32(const Block& b, int64_t r, float* out) {
  if (b.dtype == DType::F32 && b.col_stride == sizeof(float)) {
    std::memcpy(out, b.row(r), size_t(b.cols) * sizeof(float));
    return;
  }
  for (int64_t c = 0; c < b.cols; ++c) out[c] = get_f(b, r, c);
}

// The same slot rule as the top-K row kernel: padding (mask 0 or logprob −inf) is never looked up.
bool slot_valid(const TopKSide& s, int64_t r, int64_t k) {
  if (!s.mask.empty()) {
    const bool on = is_int(s.mask.dtype) ? get_i(s.mask, r, k) != 0 : get_f(s.mask, r, k) != 0.0f;
    if (!on) return false;
  }
  return get_f(s.logprobs, r, k) != -std::numeric_limits<float>::infinity();
}

// Memory the system can give without swapping: /proc/meminfo's MemAvailable (read defensively), else the free
// pages sysconf reports, else 0 (unknown). Read once per process: every step of a run chunks alike.
size_t available_memory() {
  static const size_t bytes = [] {
    if (std::FILE* f = std::fopen("/proc/meminfo", "r")) {
      char line[256];
      unsigned long long kib = 0;
      bool found = false;
      while (!found && std::fgets(line, sizeof(line), f))
        found = std::sscanf(line, "MemAvailable: %llu kB", &kib) == 1;
      std::fclose(f);
      if (found && kib > 0 && kib < (1ull << 50)) return size_t(kib) * 1024;
    }
    const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? size_t(pages) * size_t(page) : size_t(0);
  }();
  return bytes;
}

class CpuChunkExecutor final : public ChunkExecutor {
 public:
  // The CPU's row kernels read f32 logits (logits16 off): 16-bit logits_dtype asks only for a bf16 gradient
  // in the gradient GEMMs (gradient_may_round_to, multiply_for).
  ExecutorCaps caps() const override {
    ExecutorCaps c;
    c.auto_budget = fused_linear_auto_budget(available_memory(), kFusedLinearAutoMaxCpu);
    return c;
  }

  explicit CpuChunkExecutor(ThreadPool& pool)
      : pool_(pool), kernel_(gemm::best_kernel()), bf16_kernel_(gemm::best_bf16_kernel()) {}

  int64_t validate(const LossSpec& spec, int64_t rows, int64_t v, Reduction,
                   const std::string& what) override {
    return check_side(spec, rows, v, what);
  }

  void gradient_may_round_to(DType dt) override { round_gradient_ = dt == DType::BF16; }

  void* scratch(size_t bytes) override {
    buffers_.push_back(alloc_aligned(bytes));
    return buffers_.back().get();
  }

  void gemm(const Block& a, bool trans_a, const Block& b, bool trans_b, const Block& c, float alpha,
            float beta) override {
    const int64_t m = trans_a ? a.cols : a.rows, k = trans_a ? a.rows : a.cols;
    const int64_t n = trans_b ? b.rows : b.cols;
    RT_ASSERT(c.rows == m && c.cols == n && (trans_b ? b.cols : b.rows) == k);
    RT_ASSERT(c.dtype == DType::F32 && c.col_stride == sizeof(float));
    RT_ASSERT(beta == 0.0f || beta == 1.0f);
    const int64_t ldc = int64_t(c.row_stride / sizeof(float));
    const gemm::Operand oa = operand(a, trans_a), ob = operand(b, trans_b);
    const Multiply how = multiply_for(a.dtype, b.dtype, m, oa, ob);
    if (beta == 0.0f) {
      run(how, m, n, k, oa, ob, f32_row(c, 0), ldc, false);
      if (alpha != 1.0f) scale_block(c, alpha);
      return;
    }
    // C += A·B is added by the GEMM's own tile stores (dW, [V, H], read and written once). A scaled sum, or a
    // few rows for the dot-product path (which overwrites C), goes through a bounded temporary, a block of
    // rows of C at a time: a few MiB, not another C.
    if (alpha == 1.0f && how != Multiply::Dot) {
      run(how, m, n, k, oa, ob, f32_row(c, 0), ldc, true);
      return;
    }
    const int64_t rows = std::min(m, std::max<int64_t>(16, kTempBytes / (int64_t(sizeof(float)) * n)));
    float* tmp = temp(rows * n);
    for (int64_t i0 = 0; i0 < m; i0 += rows) {
      const int64_t mb = std::min(rows, m - i0);
      gemm::Operand ai = oa;
      ai.data = static_cast<const char*>(oa.data) + i0 * oa.rs;
      run(how, mb, n, k, ai, ob, tmp, n, false);
      pool_.parallel_for(
          mb,
          [&](int64_t r0, int64_t r1) {
            for (int64_t r = r0; r < r1; ++r) {
              float* dst = f32_row(c, i0 + r);
              const float* src = tmp + r * n;
              for (int64_t j = 0; j < n; ++j) dst[j] += alpha * src[j];
            }
          },
          std::max<int64_t>(1, 16384 / n));
    }
  }

  void add_bias(const Block& c, const Block& bias) override {
    std::vector<float> b(static_cast<size_t>(c.cols));
    load_row_f32(bias, 0, b.data());
    for_rows(c, [&](float* row) {
      for (int64_t j = 0; j < c.cols; ++j) row[j] += b[size_t(j)];
    });
  }

  void column_sums(const Block& g, const Block& dbias, bool accumulate) override {
    // Columns in strips, each strip summed by one thread down the rows in order, in double.
    constexpr int64_t kStrip = 256;
    const int64_t strips = (g.cols + kStrip - 1) / kStrip;
    float* out = f32_row(dbias, 0);
    pool_.parallel_for(strips, [&](int64_t s0, int64_t s1) {
      double acc[kStrip];
      for (int64_t s = s0; s < s1; ++s) {
        const int64_t j0 = s * kStrip, j1 = std::min(g.cols, j0 + kStrip);
        std::fill(acc, acc + (j1 - j0), 0.0);
        for (int64_t r = 0; r < g.rows; ++r) {
          const float* row = f32_row(g, r);
          for (int64_t j = j0; j < j1; ++j) acc[j - j0] += row[j];
        }
        for (int64_t j = j0; j < j1; ++j) out[j] = float((accumulate ? out[j] : 0.0) + acc[j - j0]);
      }
    });
  }

  void scale_rows(const Block& g, const Block& u) override {
    pool_.parallel_for(g.rows, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const float s = get_f(u, r, 0);
        float* row = f32_row(g, r);
        for (int64_t j = 0; j < g.cols; ++j) row[j] *= s;
      }
    });
  }

  void zero(const Block& b) override {
    for_rows(b, [&](float* row) { std::memset(row, 0, size_t(b.cols) * sizeof(float)); });
  }

  void row_loss(const LossSpec& spec, const Block& logits, const RowOut& out) override {
    loss::row_loss(spec, logits, out, pool_);
  }

  void reduce(const float* v, int64_t n, float scale, float* out) override {
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += v[i];
    *out = float(s * double(scale));
  }

  void gather_logits(const Block& hidden, const Block& w, const Block& bias, const TopKSide& side,
                     const Block& out) override {
    const int64_t h = hidden.cols, kk = out.cols;
    pool_.parallel_for(
        hidden.rows,
        [&](int64_t r0, int64_t r1) {
          std::vector<float> buf(2 * size_t(h));
          float* x = buf.data();
          float* wr = x + h;
          for (int64_t r = r0; r < r1; ++r) {
            load_row_f32(hidden, r, x);
            float* o = f32_row(out, r);
            for (int64_t k = 0; k < kk; ++k) {
              if (!slot_valid(side, r, k)) {
                o[k] = 0.0f;
                continue;
              }
              const int64_t id = get_i(side.ids, r, k);
              const float* wp = weight_row(w, id, wr);
              o[k] = vmath::dot(x, wp, h) + (bias.empty() ? 0.0f : get_f(bias, 0, id));
            }
          }
        },
        std::max<int64_t>(1, 4096 / std::max<int64_t>(1, h * kk)));
  }

  void scatter_grads(const Block& g, const Block& hidden, const Block& w, const TopKSide& side,
                     const SparseGrads& out) override {
    const int64_t rows = g.rows, kk = g.cols, h = hidden.cols;
    const Block &dhidden = out.dhidden, &dw = out.dweight, &dbias = out.dbias;
    const bool accumulate_dhidden = out.accumulate_dhidden;
    if (!dw.empty() && !out.accumulate_dweight) zero(dw);
    if (!dbias.empty() && !out.accumulate_dbias) zero(dbias);
    if (!dhidden.empty()) {
      pool_.parallel_for(rows, [&](int64_t r0, int64_t r1) {
        std::vector<float> wr(static_cast<size_t>(h));
        for (int64_t r = r0; r < r1; ++r) {
          float* d = f32_row(dhidden, r);
          if (!accumulate_dhidden) std::fill(d, d + h, 0.0f);
          const float* gr = f32_row(g, r);
          for (int64_t k = 0; k < kk; ++k) {
            if (gr[k] == 0.0f || !slot_valid(side, r, k)) continue;
            const float* wp = weight_row(w, get_i(side.ids, r, k), wr.data());
            vmath::axpy(gr[k], wp, d, h);
          }
        }
      });
    }
    if (dw.empty() && dbias.empty()) return;
    // Every (id, row, slot) of a valid slot, sorted by id with rows in order: each id's updates are then
    // applied by one thread in row order, so dW does not depend on threads or chunks, and needs no atomics.
    struct Entry {
      int64_t id;
      int64_t r, k;
    };
    std::vector<Entry> entries;
    entries.reserve(size_t(rows * kk));
    for (int64_t r = 0; r < rows; ++r) {
      const float* gr = f32_row(g, r);
      for (int64_t k = 0; k < kk; ++k)
        if (gr[k] != 0.0f && slot_valid(side, r, k)) entries.push_back({get_i(side.ids, r, k), r, k});
    }
    std::stable_sort(entries.begin(), entries.end(),
                     [](const Entry& a, const Entry& b) { return a.id < b.id; });
    // Hidden rows as f32 once (a row may feed K updates).
    std::vector<float> xs;
    const bool direct = hidden.dtype == DType::F32 && hidden.col_stride == sizeof(float);
    if (!direct && !dw.empty()) {
      xs.resize(size_t(rows * h));
      for (int64_t r = 0; r < rows; ++r) load_row_f32(hidden, r, xs.data() + r * h);
    }
    auto x_row = [&](int64_t r) {
      return direct ? reinterpret_cast<const float*>(hidden.row(r)) : xs.data() + r * h;
    };
    // Split the sorted list into parts that start at a new id.
    const int64_t total = int64_t(entries.size());
    const int64_t parts = std::min<int64_t>(total, 4 * int64_t(pool_.size()));
    std::vector<int64_t> starts{0};
    for (int64_t p = 1; p < parts; ++p) {
      int64_t s = std::max(starts.back(), total * p / parts);
      while (s < total && s > 0 && entries[size_t(s)].id == entries[size_t(s - 1)].id) ++s;
      if (s > starts.back() && s < total) starts.push_back(s);
    }
    starts.push_back(total);
    pool_.parallel_for(int64_t(starts.size()) - 1, [&](int64_t p0, int64_t p1) {
      for (int64_t e = starts[size_t(p0)]; e < starts[size_t(p1)]; ++e) {
        const Entry& en = entries[size_t(e)];
        const float gv = f32_row(g, en.r)[en.k];
        if (!dbias.empty()) f32_row(dbias, 0)[en.id] += gv;
        if (dw.empty()) continue;
        float* d = f32_row(dw, en.id);
        const float* x = x_row(en.r);
        vmath::axpy(gv, x, d, h);
      }
    });
  }

 private:
  static constexpr int64_t kTempBytes = int64_t(8) << 20;

  // How a chunk GEMM multiplies. Two bf16 operands multiply exactly in f32 in either GEMM: the bf16 one
  // (twice the f32 rate) where best_bf16_kernel says it pays, else sgemm (its packing is faster). A bf16
  // operand beside an f32 one runs in bf16, the f32 one rounded as it is packed, only when the problem
  // accepted bf16 logits (round_gradient_): that is the gradient GEMMs reading the f32 logits gradient beside
  // bf16 hidden states or weights, as a GPU's 16-bit logits would. Everything else is sgemm's, exact.
  enum class Multiply { F32, Dot, Bf16 };
  Multiply multiply_for(DType da, DType db, int64_t m, const gemm::Operand& oa,
                        const gemm::Operand& ob) const {
    const bool bf16 = (da == DType::BF16 || db == DType::BF16) && da != DType::F16 && db != DType::F16;
    if (bf16 && da != db && round_gradient_) return Multiply::Bf16;
    if (gemm::gemv_applies(m, oa, ob)) return Multiply::Dot;
    if (da != db) return Multiply::F32;
    return bf16 && bf16_kernel_ == gemm::Kernel::Avx512Bf16 ? Multiply::Bf16 : Multiply::F32;
  }
  void run(Multiply how, int64_t m, int64_t n, int64_t k, const gemm::Operand& a, const gemm::Operand& b,
           float* c, int64_t ldc, bool accumulate) {
    if (how == Multiply::Bf16)
      gemm::bgemm(m, n, k, a, b, c, ldc, &pool_, bf16_kernel_, accumulate);
    else
      gemm::sgemm(m, n, k, a, b, c, ldc, &pool_, kernel_, accumulate);
  }

  // Row id of the weight as f32: a pointer into w when it is f32 and dense along the row, else a copy.
  static const float* weight_row(const Block& w, int64_t id, float* buf) {
    if (w.dtype == DType::F32 && w.col_stride == sizeof(float))
      return reinterpret_cast<const float*>(w.row(id));
    load_row_f32(w, id, buf);
    return buf;
  }

  float* temp(int64_t floats) {
    const size_t bytes = size_t(floats) * sizeof(float);
    if (temp_bytes_ < bytes) {
      temp_ = alloc_aligned(bytes);
      temp_bytes_ = bytes;
    }
    return static_cast<float*>(temp_.get());
  }

  template <typename F>
  void for_rows(const Block& b, F&& fn) {
    pool_.parallel_for(
        b.rows,
        [&](int64_t r0, int64_t r1) {
          for (int64_t r = r0; r < r1; ++r) fn(f32_row(b, r));
        },
        std::max<int64_t>(1, 16384 / std::max<int64_t>(1, b.cols)));
  }

  void scale_block(const Block& c, float s) {
    for_rows(c, [&](float* row) {
      for (int64_t j = 0; j < c.cols; ++j) row[j] *= s;
    });
  }

  ThreadPool& pool_;
  gemm::Kernel kernel_, bf16_kernel_;
  bool round_gradient_ = false;
  std::vector<Memory> buffers_;
  Memory temp_;
  size_t temp_bytes_ = 0;
};

}  // namespace

std::unique_ptr<ChunkExecutor> make_cpu_chunk_executor(ThreadPool& pool) {
  return std::make_unique<CpuChunkExecutor>(pool);
}

}  // namespace retort::loss
