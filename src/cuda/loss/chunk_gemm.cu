// The fused linear losses' chunk GEMMs on cuBLASLt (chunk_gemm.h).
//
// Row-major blocks. cuBLASLt is column-major: a block whose rows are contiguous (col_stride = element size)
// reads as its transpose with ld = row_stride; one whose columns are contiguous reads as itself with
// ld = col_stride. C [m, n] is row-major, seen as Cᵀ, so we ask for Cᵀ = op(B)ᵀ·op(A)ᵀ: cuBLASLt's first
// operand is our B, its second our A, and each gets op N when its memory view already is the factor needed,
// T otherwise (the same mapping as cuda_matmul.cu). A block with neither stride unit is copied first.
#include "chunk_gemm.h"

#include <algorithm>
#include <chrono>
#include <mutex>
#include <string>

#include "../lt_gemm.h"
#include "../tune_cache.h"
#include "cuda_chunk_kernels.h"
#include "phase_profile.h"

namespace retort::cuda {

using loss::Block;

namespace {

constexpr const char* kWhat = "cuda fused linear";

// How cuBLASLt sees a block in memory: the block's transpose (rows contiguous) or the block itself.
struct LtView {
  bool ok = false;
  bool shows_transpose = false;
  uint64_t rows = 0, cols = 0;  // of the column-major matrix cuBLASLt sees
  int64_t ld = 0;
};

LtView view_of(const Block& b) {
  const size_t es = dtype_size(b.dtype);
  if ((b.cols == 1 || b.col_stride == es) && b.row_stride % es == 0) {
    const int64_t ld = b.rows == 1 ? b.cols : int64_t(b.row_stride / es);
    if (ld >= b.cols && ld > 0) return {true, true, uint64_t(b.cols), uint64_t(b.rows), ld};
  }
  if ((b.rows == 1 || b.row_stride == es) && b.col_stride % es == 0) {
    const int64_t ld = b.cols == 1 ? b.rows : int64_t(b.col_stride / es);
    if (ld >= b.rows && ld > 0) return {true, false, uint64_t(b.rows), uint64_t(b.cols), ld};
  }
  return {};
}

}  // namespace

// Everything a cuBLASLt plan depends on: types, ops, compute type, the three layouts, the alignments and C's
// type.
using GemmKey = std::array<int64_t, 18>;

struct GemmPlan {
  GemmKey key{};
  LtMatmulDesc md;
  LtLayout lx, ly, lc;
  std::vector<LtAlgo> cands;     // cuBLASLt's candidates, its first choice first
  std::array<LtAlgo, 2> algo{};  // for beta = 0 and for beta != 0 (accumulating into C)
  std::array<int, 2> idx{};      // algo[]'s indices in cands
  bool tuned = false;            // algo[] timed (lt_fastest), or never to be
  int64_t entry = -1;            // its index in CudaExec::lt_tuned once timed
};

ChunkGemm::ChunkGemm(CudaExec& ex) : ex_(ex), tune_(ex.opts.gemm_tune) {}
ChunkGemm::~ChunkGemm() = default;

void ChunkGemm::run(const Block& a0, bool ta, const Block& b0, bool tb, const Block& c, float alpha,
                    float beta) {
  Block a = a0, b = b0;
  const int64_t m = ta ? a.cols : a.rows, k = ta ? a.rows : a.cols, n = tb ? b.rows : b.cols;
  RT_ASSERT(c.rows == m && c.cols == n && (tb ? b.cols : b.rows) == k);
  // A 16-bit C only as 16-bit logits: beta 0, and operands of its dtype (supports_16bit_logits), which
  // cuBLASLt can write from its f32 accumulators.
  const bool c16 = c.dtype != DType::F32;
  RT_ASSERT(c.col_stride == dtype_size(c.dtype) && (beta == 0.0f || beta == 1.0f));
  RT_ASSERT(!c16 || ((c.dtype == DType::BF16 || c.dtype == DType::F16) && beta == 0.0f &&
                     a.dtype == c.dtype && b.dtype == c.dtype));
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (beta == 0.0f) fused::zero(ex_, c);
    return;
  }
  // A C whose row count is not a multiple of 8 (the weight gradient [50257, H] of GPT-2's vocabulary) gets
  // only sm80 kernels from cuBLASLt, at about twice the time of the sm90 ones (H100): the rows up to a
  // multiple of 8 go first, the few left after (< 8: a thin GEMM of little work), each a GEMM of its own.
  if (const int64_t m_main = m / 8 * 8; m % 8 != 0 && m_main >= 1024) {
    auto part = [](const Block& x, bool t, int64_t r0, int64_t r) {
      if (!t) return x.sub_rows(r0, r);
      Block y = x;  // rows of C are columns of a transposed operand
      y.data = static_cast<char*>(x.data) + r0 * int64_t(x.col_stride);
      y.cols = r;
      return y;
    };
    run(part(a, ta, 0, m_main), ta, b, tb, c.sub_rows(0, m_main), alpha, beta);
    run(part(a, ta, m_main, m - m_main), ta, b, tb, c.sub_rows(m_main, m - m_main), alpha, beta);
    return;
  }
  std::vector<std::unique_ptr<DeviceBuffer>> keep;  // converted operands, freed once the GEMM is queued
  // cuBLASLt wants one input type: mixed operands are computed in f32 (slow path: a converted copy).
  if (a.dtype != b.dtype) {
    if (a.dtype != DType::F32) a = converted(a, DType::F32, keep);
    if (b.dtype != DType::F32) b = converted(b, DType::F32, keep);
  }
  LtView va = view_of(a), vb = view_of(b);
  if (!va.ok) va = view_of(a = converted(a, a.dtype, keep));
  if (!vb.ok) vb = view_of(b = converted(b, b.dtype, keep));
  const LtView vc = view_of(c);
  RT_ASSERT(va.ok && vb.ok && vc.ok && vc.shows_transpose);
  const cublasOperation_t op_x = (!tb) == vb.shows_transpose ? CUBLAS_OP_N : CUBLAS_OP_T;
  const cublasOperation_t op_y = (!ta) == va.shows_transpose ? CUBLAS_OP_N : CUBLAS_OP_T;
  const cublasComputeType_t compute =
      a.dtype == DType::F32 && ex_.opts.allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const int64_t es = int64_t(dtype_size(a.dtype));
  const GemmKey key = {
      int64_t(lt_type(b.dtype, kWhat)),
      int64_t(lt_type(a.dtype, kWhat)),
      int64_t(op_x),
      int64_t(op_y),
      int64_t(compute),
      int64_t(vb.rows),
      int64_t(vb.cols),
      vb.ld,
      int64_t(va.rows),
      int64_t(va.cols),
      va.ld,
      int64_t(vc.rows),
      int64_t(vc.cols),
      vc.ld,
      lt_alignment({uint64_t(uintptr_t(b.data)), uint64_t(vb.ld * es)}),
      lt_alignment({uint64_t(uintptr_t(a.data)), uint64_t(va.ld * es)}),
      lt_alignment({uint64_t(uintptr_t(c.data)), uint64_t(vc.ld * int64_t(dtype_size(c.dtype)))}),
      int64_t(lt_type(c.dtype, kWhat))};
  GemmPlan& plan = plan_for(key);
  // The algorithms are timed at the first call whose C may be clobbered first (beta = 0: this call
  // overwrites it); until then cuBLASLt's first choice. For
  // the accumulating algorithm (beta != 0) that is the first chunk's dW, before the chunks that add to it.
  // Once more at such a call LtTuned::kSettleSeconds later, in the clocks of a GPU under load.
  if (beta == 0.0f) {
    if (!plan.tuned) {
      tune(plan, a.data, b.data, c.data, alpha);
    } else if (plan.entry >= 0) {
      LtTuned& e = (*ex_.lt_tuned)[size_t(plan.entry)];
      if (!e.settled && std::chrono::duration<double>(std::chrono::steady_clock::now() - e.first).count() >=
                            LtTuned::kSettleSeconds) {
        e.settled = true;
        if (plan.cands.empty()) plan.cands = e.cands;
        retime(plan, a.data, b.data, c.data, alpha);
        e.algo = plan.algo;
        cache_store(plan);
      } else if (e.settled) {
        plan.algo = e.algo;
      }
    }
  }
  Phase phase(
      [&] {
        return "gemm " + std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) +
               (beta == 0.0f ? "" : " +=");
      },
      ex_.stream);
  RT_CUBLAS_CHECK(cublasLtMatmul(ex_.lt, plan.md.d, &alpha, b.data, plan.lx.l, a.data, plan.ly.l, &beta,
                                 c.data, plan.lc.l, c.data, plan.lc.l, &plan.algo[beta == 0.0f ? 0 : 1].algo,
                                 ex_.workspace, ex_.workspace_bytes, ex_.stream));
}

// A contiguous row-major copy of x in dtype dt.
Block ChunkGemm::converted(const Block& x, DType dt, std::vector<std::unique_ptr<DeviceBuffer>>& keep) {
  keep.push_back(ex_.temp(std::max<size_t>(size_t(x.rows * x.cols) * dtype_size(dt), 1)));
  fused::copy_block(ex_, x, dt, keep.back()->data());
  return Block::dense(keep.back()->data(), dt, x.rows, x.cols);
}

GemmPlan& ChunkGemm::plan_for(const GemmKey& key) {
  for (const auto& p : plans_)
    if (p->key == key) return *p;
  auto p = std::make_unique<GemmPlan>();
  p->key = key;
  const auto compute = cublasComputeType_t(key[4]);
  const auto op_x = cublasOperation_t(key[2]), op_y = cublasOperation_t(key[3]);
  lt_matmul_desc(p->md, compute, op_x, op_y);
  RT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->lx.l, cudaDataType_t(key[0]), uint64_t(key[5]),
                                             uint64_t(key[6]), key[7]));
  RT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->ly.l, cudaDataType_t(key[1]), uint64_t(key[8]),
                                             uint64_t(key[9]), key[10]));
  RT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->lc.l, cudaDataType_t(key[17]), uint64_t(key[11]),
                                             uint64_t(key[12]), key[13]));
  LtPref pref;
  lt_preference(pref, ex_.workspace_bytes, uint32_t(key[14]), uint32_t(key[15]), uint32_t(key[16]));
  // Timed by an earlier executor of this backend: no heuristic query at all.
  for (size_t i = 0; i < ex_.lt_tuned->size(); ++i) {
    const LtTuned& t = (*ex_.lt_tuned)[i];
    if (std::equal(key.begin(), key.end(), t.key.begin(), t.key.end())) {
      p->algo = t.algo;
      p->tuned = true;
      p->entry = int64_t(i);
      plans_.push_back(std::move(p));
      return *plans_.back();
    }
  }
  // Only f32 outputs accumulate (dW, dhidden); a 16-bit one (logits) has nothing to time unless All. At
  // most kMaxTunedShapes shapes per backend are timed (rows that change every step, such as a last short
  // chunk of varying size, would otherwise time a new shape each step); later ones take the first choice.
  const bool timed = (tune_ == GemmTune::All || (tune_ == GemmTune::Accumulating && key[17] == CUDA_R_32F)) &&
                     ex_.lt_tuned->size() < kMaxTunedShapes;
  p->cands = lt_candidates(ex_.lt, p->md.d, p->lx.l, p->ly.l, p->lc.l, pref.p, timed ? kTuneCandidates : 1);
  RT_CHECK(!p->cands.empty(), "cuda fused linear: cuBLASLt has no algorithm for a ", key[11], " x ", key[12],
           " GEMM (inputs ", key[0] == CUDA_R_32F ? "f32" : "16-bit", ")");
  p->algo[0] = p->algo[1] = p->cands[0];
  p->tuned = p->cands.size() < 2;
  // Picked by an earlier process on this device (CudaOptions::gemm_cache): those algorithms, untimed.
  if (timed && !p->tuned && cache_lookup(*p)) {
    p->tuned = true;
    p->entry = int64_t(ex_.lt_tuned->size());
    ex_.lt_tuned->push_back(LtTuned{std::vector<int64_t>(key.begin(), key.end()), p->algo, p->cands,
                                    std::chrono::steady_clock::now(), true});
    ++ex_.gemm_cache->hits;
  }
  plans_.push_back(std::move(p));
  return *plans_.back();
}

// The cache file's signature: what the candidates and their speeds depend on besides the GemmKey.
std::string ChunkGemm::cache_signature() const {
  cudaDeviceProp prop{};
  RT_CUDA_CHECK(cudaGetDeviceProperties(&prop, ex_.device));
  return std::string(prop.name) + " cc " + std::to_string(prop.major) + "." + std::to_string(prop.minor) +
         " sms " + std::to_string(prop.multiProcessorCount) + " cublasLt " +
         std::to_string(cublasLtGetVersion()) + " workspace " + std::to_string(ex_.workspace_bytes) +
         " candidates " + std::to_string(kTuneCandidates);
}
// Sets plan's algorithms from the cache file when it holds its key for as many candidates as plan has.
bool ChunkGemm::cache_lookup(GemmPlan& plan) {
  GemmCacheFile& f = *ex_.gemm_cache;
  if (f.path.empty()) return false;
  if (!f.loaded) {
    f.signature = cache_signature();
    for (TuneEntry& e : read_tune_cache(f.path, f.signature))
      f.entries[std::move(e.key)] = std::move(e.value);
    f.loaded = true;
  }
  const auto it = f.entries.find(std::vector<int64_t>(plan.key.begin(), plan.key.end()));
  if (it == f.entries.end()) return false;
  const std::vector<int64_t>& v = it->second;
  const int64_t n = int64_t(plan.cands.size());
  if (v.size() != 3 || v[0] != n || v[1] < 0 || v[1] >= n || v[2] < 0 || v[2] >= n) return false;
  plan.idx = {int(v[1]), int(v[2])};
  plan.algo = {plan.cands[size_t(v[1])], plan.cands[size_t(v[2])]};
  return true;
}
// Records plan's timed picks in the cache file (merged with what it holds, written atomically).
void ChunkGemm::cache_store(const GemmPlan& plan) {
  GemmCacheFile& f = *ex_.gemm_cache;
  if (f.path.empty() || plan.cands.size() < 2) return;
  if (f.signature.empty()) f.signature = cache_signature();
  TuneEntry e{std::vector<int64_t>(plan.key.begin(), plan.key.end()),
              {int64_t(plan.cands.size()), plan.idx[0], plan.idx[1]}};
  f.entries[e.key] = e.value;
  // One writer at a time in this process: the atomic write's temporary name is per process, and backends
  // on other threads may share the file.
  static std::mutex write_mu;
  std::lock_guard<std::mutex> lock(write_mu);
  write_tune_cache(f.path, f.signature, {e});
}

// Times plan's candidates on its own operands (the GEMM about to run, whose C this call overwrites) and
// keeps the fastest for beta = 0 (GemmTune::All) and, for f32 outputs (the accumulators: dW over chunks,
// dhidden when asked), for beta = 1, and records them per GEMM shape and backend (ex_.lt_tuned), where
// gemm() has them timed once more (retime) after LtTuned::kSettleSeconds. Waits for the stream.
void ChunkGemm::tune(GemmPlan& plan, const void* a, const void* b, void* c, float alpha) {
  plan.tuned = true;
  retime(plan, a, b, c, alpha);
  cache_store(plan);
  plan.entry = int64_t(ex_.lt_tuned->size());
  ex_.lt_tuned->push_back(LtTuned{std::vector<int64_t>(plan.key.begin(), plan.key.end()), plan.algo,
                                  plan.cands, std::chrono::steady_clock::now(), false});
}
void ChunkGemm::retime(GemmPlan& plan, const void* a, const void* b, void* c, float alpha) {
  const int n = int(plan.cands.size());
  for (int acc = tune_ == GemmTune::All ? 0 : 1; acc < (plan.key[17] == CUDA_R_32F ? 2 : 1); ++acc) {
    const float beta = float(acc);
    const int best = lt_fastest(n, ex_.stream, [&](int i) {
      RT_CUBLAS_CHECK(cublasLtMatmul(ex_.lt, plan.md.d, &alpha, b, plan.lx.l, a, plan.ly.l, &beta, c,
                                     plan.lc.l, c, plan.lc.l, &plan.cands[size_t(i)].algo, ex_.workspace,
                                     ex_.workspace_bytes, ex_.stream));
    });
    plan.algo[acc] = plan.cands[size_t(best)];
    plan.idx[acc] = best;
  }
  if (plan.key[17] != CUDA_R_32F) {
    plan.algo[1] = plan.algo[0];
    plan.idx[1] = plan.idx[0];
  }
}

}  // namespace retort::cuda
