// GPU benchmark of the fused linear losses against their floor, in one process: the GEMMs a fused lm-head +
// loss cannot avoid, timed with cuBLASLt on bf16 inputs with f32 accumulation and f32 outputs —
//   logits [N, Vp] = h·Wᵀ,  dh [N, H] = dlogits·W,  dW [Vp, H] = dlogitsᵀ·h  (dlogits bf16, Vp = V rounded up
//   to 128), plus the teacher's logits [N, Vp] = th·Wtᵀ for online distillation —
// then retort's fused op forward + backward (the graph built once and computed repeatedly), both timed with
// CUDA events on the backend's stream, alternately (floor, retort, floor, ...: the H100 caps its power and
// its clocks follow, so both see the same conditions), medians after warmup runs. Also the peak device memory
// the fused step allocates beyond its graph's own buffers (the allocator's peak minus what was in use
// before).
// By default retort runs with the product's defaults: chunk logits in the inputs' dtype (bf16 here) and the
// automatic memory budget; --logits f32 | bf16 | f16 and --budget-mib N override them (the floor is the same
// either way).
// GEMM algorithms. The floor (--floor best, the default): each of its GEMMs takes the fastest of cuBLASLt's
// first 8 candidates, timed after the preheat (in steady state: a pick timed on a cool GPU need not hold
// under the power cap), so the floor is the best cuBLASLt does on these shapes, not its heuristic's first
// choice (up to 17 % slower on an H100: bench/HISTORY.md, session 15); --floor first: the first choice.
// retort
// (--gemm-tune, CudaOptions::gemm_tune, default the product's): its executor times its GEMMs at first use
// (cuda/lt_tune.h) — all of them (all), the accumulating ones only (acc), or none (off).
//
// Targets (ratio retort / floor, or absolute ms for the K-sparse top-K path, which has no GEMM to compare
// with): CE 1.08, CE small 1.15, top-K KD + hard CE 1.12, K-sparse top-K 2 ms, online JSD 1.15.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "cuda/loss/phase_profile.h"
#include "cuda/lt_tune.h"
#include "retort.h"

namespace {

#define CK(x)                                                                                 \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)
#define LT(x)                                                                         \
  do {                                                                                \
    cublasStatus_t s_ = (x);                                                          \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                \
      std::fprintf(stderr, "%s:%d %s: status %d\n", __FILE__, __LINE__, #x, int(s_)); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

using namespace retort;

enum class Kind { CE, TopK, TopKSparse, Jsd };

struct Case {
  std::string name;
  Kind kind;
  int64_t n, h, v, ht = 0, k = 0;
  double target;  // ratio, or ms for TopKSparse
};

// ---- device fills (a hash of the index: no host staging of gigabytes) -------------------------------------

__device__ __forceinline__ float hash01(uint64_t i, uint32_t seed) {
  uint64_t x = i * 0x9E3779B97F4A7C15ull + seed * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  return float(x >> 40) / float(1ull << 24);
}

__global__ void fill_bf16(__nv_bfloat16* p, int64_t n, uint32_t seed, float scale) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    p[i] = __float2bfloat16((2.0f * hash01(uint64_t(i), seed) - 1.0f) * scale);
}

// Labels in [0, v), every 16th row ignored (-100); ids in [0, v).
__global__ void fill_ints(int32_t* p, int64_t n, uint32_t seed, int64_t v, bool some_ignored) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    p[i] = some_ignored && i % 16 == 5 ? -100 : int32_t(hash01(uint64_t(i), seed) * float(v)) % int32_t(v);
}

// Teacher log-probabilities of K slots: decreasing, all finite.
__global__ void fill_logprobs(float* p, int64_t n, int64_t k) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    p[i] = -1.0f - 0.1f * float(i % k);
}

void fill(Tensor* t, uint32_t seed, float scale, cudaStream_t s) {
  fill_bf16<<<1024, 256, 0, s>>>(static_cast<__nv_bfloat16*>(t->data), t->nelements(), seed, scale);
  CK(cudaGetLastError());
}

// ---- the floor: cuBLASLt on row-major operands ------------------------------------------------------------

struct Lt {
  cublasLtHandle_t h = nullptr;
  void* ws = nullptr;
  size_t ws_bytes = size_t(32) << 20;
};

GemmTune g_tune = CudaOptions{}.gemm_tune;  // retort's: --gemm-tune off | acc | all (default: the product's)
// The floor's algorithms (--floor best | first): the fastest of cuBLASLt's first 8 candidates, timed once the
// GPU is in steady state (after the preheat), or cuBLASLt's first choice.
bool g_floor_best = true;
bool g_floor_steady = false;  // set by time_pair_ms once the preheat is done
struct FloorAlgo {
  std::tuple<int64_t, int64_t, int64_t, bool, bool> key;  // m, n, k, ta, tb
  std::vector<retort::cuda::LtAlgo> cands;
  size_t pick = 0;
  bool timed = false;
};
std::vector<FloorAlgo> g_floor_algos;

// C [m, n] f32 (row-major) = op(A)·op(B), A and B bf16 row-major: A [m, k] (or [k, m] when ta), B [k, n]
// (or [n, k] when tb). cuBLASLt is column-major, so it computes Cᵀ = op(B)ᵀ·op(A)ᵀ on the same memory.
void gemm_rm(Lt& lt, const void* a, bool ta, const void* b, bool tb, float* c, int64_t m, int64_t n,
             int64_t k, cudaStream_t s) {
  cublasLtMatmulDesc_t md;
  LT(cublasLtMatmulDescCreate(&md, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t opx = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opy = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  LT(cublasLtMatmulDescSetAttribute(md, CUBLASLT_MATMUL_DESC_TRANSA, &opx, sizeof(opx)));
  LT(cublasLtMatmulDescSetAttribute(md, CUBLASLT_MATMUL_DESC_TRANSB, &opy, sizeof(opy)));
  cublasLtMatrixLayout_t lx, ly, lc;
  // B in memory: rows_b x cols_b row-major = (cols_b x rows_b) column-major, ld cols_b.
  const int64_t rb = tb ? n : k, cb = tb ? k : n, ra = ta ? k : m, ca = ta ? m : k;
  LT(cublasLtMatrixLayoutCreate(&lx, CUDA_R_16BF, uint64_t(cb), uint64_t(rb), cb));
  LT(cublasLtMatrixLayoutCreate(&ly, CUDA_R_16BF, uint64_t(ca), uint64_t(ra), ca));
  LT(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, uint64_t(n), uint64_t(m), n));
  cublasLtMatmulPreference_t pref;
  LT(cublasLtMatmulPreferenceCreate(&pref));
  LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &lt.ws_bytes,
                                          sizeof(lt.ws_bytes)));
  const float alpha = 1.0f, beta = 0.0f;
  const auto key = std::make_tuple(m, n, k, ta, tb);
  auto known =
      std::find_if(g_floor_algos.begin(), g_floor_algos.end(), [&](const auto& e) { return e.key == key; });
  if (known == g_floor_algos.end()) {
    FloorAlgo f;
    f.key = key;
    f.cands = retort::cuda::lt_candidates(lt.h, md, lx, ly, lc, pref, g_floor_best ? 8 : 1);
    if (f.cands.empty()) {
      std::fprintf(stderr, "cuBLASLt: no algorithm for %lld x %lld x %lld\n", (long long)m, (long long)n,
                   (long long)k);
      std::exit(1);
    }
    f.timed = f.cands.size() < 2;
    g_floor_algos.push_back(std::move(f));
    known = g_floor_algos.end() - 1;
  }
  if (!known->timed && g_floor_steady) {  // 7 round-robin samples of 3 runs each, in steady state
    known->timed = true;
    known->pick = size_t(retort::cuda::lt_fastest(
        int(known->cands.size()), s,
        [&](int i) {
          LT(cublasLtMatmul(lt.h, md, &alpha, b, lx, a, ly, &beta, c, lc, c, lc,
                            &known->cands[size_t(i)].algo, lt.ws, lt.ws_bytes, s));
        },
        7, 3));
  }
  // Under RETORT_CHUNK_PROFILE=1 each floor GEMM is a phase of the fused ops' profile too, printed beside
  // their GEMMs of the same shape.
  retort::cuda::Phase phase(
      [&] { return "floor gemm " + std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k); },
      s);
  LT(cublasLtMatmul(lt.h, md, &alpha, b, lx, a, ly, &beta, c, lc, c, lc, &known->cands[known->pick].algo,
                    lt.ws, lt.ws_bytes, s));
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatrixLayoutDestroy(ly);
  cublasLtMatrixLayoutDestroy(lx);
  cublasLtMatmulDescDestroy(md);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Keeps the stream busy for about `ns` nanoseconds (one thread sleeping), so the host queues what follows
// while the GPU is still busy: the timed region then holds device time, not the host's launch latency.
__global__ void hold_kernel(long long ns) {
  const long long t0 = clock64();  // cycles; at >= 1 GHz, ns cycles are >= ns nanoseconds
  while (clock64() - t0 < ns) __nanosleep(1000);
}

double g_preheat_s = 5.0;  // --preheat S

// Medians of fa and fb, timed alternately after warmup runs of each, in the order a b, b a, a b, ...: the
// H100 caps its power and its clocks follow the load (the floor's GEMMs draw the most), so each is timed as
// often right after the other as before it, rather than all of one and then all of the other. Before that,
// fa runs back to back for g_preheat_s seconds: a GPU that starts cool (or warm from an earlier case) runs
// the first seconds of GEMMs at higher clocks, and the floor, all GEMMs, gains more from that than retort
// (session 14 saw floors 3-12 % slower after minutes of load than on a fresh GPU, and ratios move with
// them). Each pair starts behind a 2 ms hold kernel, so neither is timed with the GPU waiting for the
// host's first launch; host_ms (if given) receives the median host time of queuing one fb.
std::pair<double, double> time_pair_ms(cudaStream_t s, int warmup, int reps, const std::function<void()>& fa,
                                       const std::function<void()>& fb, double* host_ms = nullptr) {
  g_floor_steady = false;
  const auto heat0 = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - heat0).count() < g_preheat_s) {
    fa();
    CK(cudaStreamSynchronize(s));
  }
  g_floor_steady = true;  // the floor's algorithms not yet timed are timed at its next run (--floor best)
  for (int i = 0; i < warmup; ++i) {
    fa();
    fb();
  }
  CK(cudaStreamSynchronize(s));
  cudaEvent_t e0, e1, e2;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaEventCreate(&e2));
  std::vector<double> ta, tb, th;
  auto host_timed_b = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    fb();
    th.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  };
  for (int i = 0; i < reps; ++i) {
    const bool a_first = i % 2 == 0;
    hold_kernel<<<1, 1, 0, s>>>(2000000);
    CK(cudaGetLastError());
    CK(cudaEventRecord(e0, s));
    if (a_first)
      fa();
    else
      host_timed_b();
    CK(cudaEventRecord(e1, s));
    if (a_first)
      host_timed_b();
    else
      fa();
    CK(cudaEventRecord(e2, s));
    CK(cudaEventSynchronize(e2));
    float x = 0, y = 0;
    CK(cudaEventElapsedTime(&x, e0, e1));
    CK(cudaEventElapsedTime(&y, e1, e2));
    ta.push_back(a_first ? x : y);
    tb.push_back(a_first ? y : x);
  }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  CK(cudaEventDestroy(e2));
  if (host_ms) *host_ms = median(th);
  return {median(ta), median(tb)};
}

int64_t pad128(int64_t v) {
  return (v + 127) / 128 * 128;
}

// The floor's operands and GEMMs: run() queues the three student GEMMs (plus the teacher's).
struct Floor {
  const Case& c;
  cudaStream_t s;
  Lt lt;
  std::vector<void*> bufs;
  __nv_bfloat16 *h = nullptr, *w = nullptr, *dlogits = nullptr, *th = nullptr, *tw = nullptr;
  float *logits = nullptr, *dh = nullptr, *dw = nullptr, *tlogits = nullptr;
  int64_t vp = 0;

  Floor(const Case& cc, cudaStream_t ss) : c(cc), s(ss), vp(pad128(cc.v)) {
    LT(cublasLtCreate(&lt.h));
    CK(cudaMalloc(&lt.ws, lt.ws_bytes));
    h = static_cast<__nv_bfloat16*>(dev(size_t(c.n * c.h) * 2));
    w = static_cast<__nv_bfloat16*>(dev(size_t(vp * c.h) * 2));
    logits = static_cast<float*>(dev(size_t(c.n * vp) * 4));
    dlogits = static_cast<__nv_bfloat16*>(dev(size_t(c.n * vp) * 2));
    dh = static_cast<float*>(dev(size_t(c.n * c.h) * 4));
    dw = static_cast<float*>(dev(size_t(vp * c.h) * 4));
    if (c.kind == Kind::Jsd) {
      th = static_cast<__nv_bfloat16*>(dev(size_t(c.n * c.ht) * 2));
      tw = static_cast<__nv_bfloat16*>(dev(size_t(vp * c.ht) * 2));
      tlogits = static_cast<float*>(dev(size_t(c.n * vp) * 4));
      fill_bf16<<<1024, 256, 0, s>>>(th, c.n * c.ht, 11, 1.0f);
      fill_bf16<<<1024, 256, 0, s>>>(tw, vp * c.ht, 12, 0.02f);
    }
    fill_bf16<<<1024, 256, 0, s>>>(h, c.n * c.h, 1, 1.0f);
    fill_bf16<<<1024, 256, 0, s>>>(w, vp * c.h, 2, 0.02f);
    fill_bf16<<<1024, 256, 0, s>>>(dlogits, c.n * vp, 3, 1e-4f);
    CK(cudaGetLastError());
  }
  Floor(const Floor&) = delete;
  Floor& operator=(const Floor&) = delete;
  ~Floor() {
    (void)cudaStreamSynchronize(s);
    for (void* p : bufs) (void)cudaFree(p);
    (void)cudaFree(lt.ws);
    cublasLtDestroy(lt.h);
  }
  void* dev(size_t bytes) {
    void* p = nullptr;
    CK(cudaMalloc(&p, bytes));
    bufs.push_back(p);
    return p;
  }
  void run() {
    gemm_rm(lt, h, false, w, true, logits, c.n, vp, c.h, s);
    if (th) gemm_rm(lt, th, false, tw, true, tlogits, c.n, vp, c.ht, s);
    gemm_rm(lt, dlogits, false, w, false, dh, c.n, c.h, vp, s);
    gemm_rm(lt, dlogits, true, h, false, dw, vp, c.h, c.n, s);
  }
};

struct Result {
  double ms = 0, floor_ms = 0, peak_mib = 0, host_ms = 0;
};

// retort's fused node, forward and backward, timed alternately with the floor (whose buffers are raw
// cudaMalloc, outside the allocator whose peak is read).
Result retort_ms(const Case& c, Backend& be, size_t budget, std::optional<DType> logits_dtype, int warmup,
                 int reps) {
  auto s = static_cast<cudaStream_t>(be.stream_handle());
  Result r;
  Floor floor(c, s);
  {
    Context ctx(be);
    Tensor* h = ctx.param(DType::BF16, {c.n, c.h}, "hidden");
    Tensor* w = ctx.param(DType::BF16, {c.v, c.h}, "weight");
    fill(h, 1, 1.0f, s);
    fill(w, 2, 0.02f, s);
    FusedLinearOptions f;
    f.logits_budget = budget;
    if (c.kind != Kind::TopKSparse) f.logits_dtype = logits_dtype;  // the K-sparse path has no logits block
    Tensor* labels = ctx.input(DType::I32, {c.n}, "labels");
    fill_ints<<<1024, 256, 0, s>>>(static_cast<int32_t*>(labels->data), c.n, 5, c.v, true);
    CK(cudaGetLastError());
    Tensor* loss = nullptr;
    if (c.kind == Kind::CE) {
      loss = fused_linear_cross_entropy(ctx, h, w, nullptr, labels, {}, f).loss;
    } else if (c.kind == Kind::TopK || c.kind == Kind::TopKSparse) {
      Tensor* ids = ctx.input(DType::I32, {c.n, c.k}, "ids");
      Tensor* lp = ctx.input(DType::F32, {c.n, c.k}, "logprobs");
      fill_ints<<<1024, 256, 0, s>>>(static_cast<int32_t*>(ids->data), c.n * c.k, 7, c.v, false);
      fill_logprobs<<<1024, 256, 0, s>>>(static_cast<float*>(lp->data), c.n * c.k, c.k);
      CK(cudaGetLastError());
      TopKDistillOptions o;
      o.beta = 0.0f;
      if (c.kind == Kind::TopK) {
        o.w_hard = 0.5f;
      } else {
        o.normalize_topk = true;
        o.w_hard = 0.0f;
      }
      loss = fused_linear_topk_kd(ctx, h, w, nullptr, ids, lp, nullptr, labels, o, f).loss;
    } else {
      Tensor* th = ctx.input(DType::BF16, {c.n, c.ht}, "teacher_hidden");
      Tensor* tw = ctx.input(DType::BF16, {c.v, c.ht}, "teacher_weight");
      fill(th, 11, 1.0f, s);
      fill(tw, 12, 0.02f, s);
      DistillOptions o;
      o.beta = 0.5f;
      loss = fused_linear_distill(ctx, h, w, nullptr, th, tw, nullptr, labels, o, f).loss;
    }
    loss->flags |= kOutput;
    Graph g(ctx);
    g.forward(loss);
    g.backward(loss);
    g.compute();  // the arena and the allocator's cache
    be.synchronize();
    const CudaMemoryStats before = cuda_memory_stats(be);
    cuda_reset_peak(be);
    // One training step's gradients: zero_grad() then compute(), so the weight gradient is written fresh as
    // by the floor's beta = 0 GEMM (the fused op overwrites its accumulator; no clearing pass).
    std::tie(r.floor_ms, r.ms) = time_pair_ms(
        s, warmup, reps, [&] { floor.run(); },
        [&] {
          g.zero_grad();
          g.compute();
        },
        &r.host_ms);
    be.synchronize();  // reports a device-side error, if any
    const CudaMemoryStats after = cuda_memory_stats(be);
    r.peak_mib = double(after.peak_bytes - before.bytes_in_use) / double(1 << 20);
    float lv = 0;
    be.read(&lv, loss->data, sizeof(float));
    std::printf("  loss %.5f, host time to queue one step %.3f ms\n", double(lv), r.host_ms);
  }
  cuda_empty_cache(be);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  size_t budget_mib = 0;  // --budget-mib N | auto (the default: the product's automatic budget)
  int warmup = 2, reps = 10;
  std::string only;  // --only SUBSTRING: run the cases whose name contains it (for profiling one case)
  std::optional<DType> logits_dtype;  // --logits auto (the default: the inputs' dtype) | f32 | bf16 | f16
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      quick = true;
    } else if (a == "--budget-mib" && i + 1 < argc) {
      const std::string b = argv[++i];
      budget_mib = b == "auto" ? 0 : size_t(std::max(1LL, std::atoll(b.c_str())));
    } else if (a == "--only" && i + 1 < argc) {
      only = argv[++i];
    } else if (a == "--logits" && i + 1 < argc &&
               (std::string(argv[i + 1]) == "f32" || std::string(argv[i + 1]) == "bf16" ||
                std::string(argv[i + 1]) == "f16" || std::string(argv[i + 1]) == "auto")) {
      const std::string d = argv[++i];
      if (d == "auto")
        logits_dtype.reset();
      else
        logits_dtype = d == "bf16" ? DType::BF16 : d == "f16" ? DType::F16 : DType::F32;
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::max(5, std::atoi(argv[++i]));
    } else if (a == "--preheat" && i + 1 < argc) {
      g_preheat_s = std::max(0.0, std::atof(argv[++i]));
    } else if (a == "--floor" && i + 1 < argc &&
               (std::string(argv[i + 1]) == "best" || std::string(argv[i + 1]) == "first")) {
      g_floor_best = std::string(argv[++i]) == "best";
    } else if (a == "--gemm-tune" && i + 1 < argc &&
               (std::string(argv[i + 1]) == "off" || std::string(argv[i + 1]) == "acc" ||
                std::string(argv[i + 1]) == "all")) {
      const std::string m = argv[++i];
      g_tune = m == "off" ? GemmTune::Off : m == "acc" ? GemmTune::Accumulating : GemmTune::All;
    } else {
      std::printf(
          "usage: %s [--quick] [--budget-mib M] [--logits f32|bf16|f16] [--reps R] [--only NAME] "
          "[--gemm-tune off|acc|all] [--floor best|first] [--preheat S]\n"
          "  --quick         smaller shapes (N / 8, H / 2, V / 4)\n"
          "  --budget-mib M  the fused ops' memory budget for chunk logits (default 2048: chunks of "
          "thousands\n"
          "                  of rows, so that each GEMM is large and dW is read-modified-written few times;\n"
          "                  auto: the product's default, FusedLinearOptions::logits_budget 0)\n"
          "  --logits D      the chunk logits' dtype in the fused ops (default f32; bf16: half the bytes "
          "per\n"
          "                  row, 16-bit logits gradient in place)\n"
          "  --reps R        timed repetitions of each, alternating, medians reported (default 10, at least "
          "5)\n"
          "  --only NAME     only the case named NAME, or those whose name contains NAME (e.g. 'K-sparse', "
          "for a profiler)\n"
          "  --preheat S     seconds of the floor's GEMMs before each case's timing (default 5; 0: none)\n"
          "  --gemm-tune M   retort's GEMMs timed at first use, the fastest of cuBLASLt's first 8 kept: all "
          "(default),\n"
          "                  acc: the accumulating ones only, off: none (cuBLASLt's first choice)\n"
          "  --floor F       the floor's GEMM algorithms: best (default: the fastest of cuBLASLt's first 8, "
          "timed\n"
          "                  after the preheat) or first (cuBLASLt's first choice)\n",
          argv[0]);
      return a == "--help" ? 0 : 2;
    }
  }
  std::string why;
  if (!cuda_available(&why)) {
    std::printf("CUDA unavailable: %s\n", why.c_str());
    return 0;
  }
  std::vector<Case> cases = {
      {"CE", Kind::CE, 8192, 4096, 128256, 0, 0, 1.08},
      {"CE small", Kind::CE, 16384, 768, 50257, 0, 0, 1.15},
      {"top-K KD + hard CE (K=64)", Kind::TopK, 8192, 2048, 128256, 0, 64, 1.12},
      {"K-sparse top-K (K=64)", Kind::TopKSparse, 8192, 2048, 128256, 0, 64, 2.0},
      {"online JSD (Ht=4096)", Kind::Jsd, 8192, 2048, 128256, 4096, 0, 1.15},
  };
  if (quick)
    for (Case& c : cases) {
      c.n /= 8;
      c.h /= 2;
      c.ht /= 2;
      c.v /= 4;
    }
  CudaOptions opts;
  opts.gemm_tune = g_tune;
  auto be = make_cuda_backend(0, opts);
  auto s = static_cast<cudaStream_t>(be->stream_handle());
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf(
      "device: %s; budget %s MiB; bf16 inputs, f32 accumulation and gradients; %s chunk logits; %.0f s "
      "preheat; GEMM algorithms: %s; %s%s\n",
      prop.name, budget_mib ? std::to_string(budget_mib).c_str() : "auto",
      logits_dtype ? dtype_name(*logits_dtype) : "default (the inputs' dtype)", g_preheat_s,
      g_floor_best ? "floor: the fastest of cuBLASLt's first 8 in steady state (--floor best)"
                   : "floor: cuBLASLt's first choice (--floor first)",
      g_tune == GemmTune::All   ? "retort: every GEMM timed at first use (--gemm-tune all)"
      : g_tune == GemmTune::Off ? "retort: cuBLASLt's first choice (--gemm-tune off)"
                                : "retort: its accumulating GEMMs timed at first use (--gemm-tune acc)",
      quick ? "; --quick shapes" : "");
  struct Row {
    Case c;
    double floor = 0;
    Result r;
  };
  std::vector<Row> rows;
  // --only NAME: that case if a case has exactly this name, else the cases whose name contains it.
  const bool exact = std::any_of(cases.begin(), cases.end(), [&](const Case& x) { return x.name == only; });
  for (const Case& c : cases) {
    if (!only.empty() && (exact ? c.name != only : c.name.find(only) == std::string::npos)) continue;
    std::printf("%s: N=%lld H=%lld V=%lld%s\n", c.name.c_str(), (long long)c.n, (long long)c.h,
                (long long)c.v, c.ht ? (" Ht=" + std::to_string(c.ht)).c_str() : "");
    Row row{c, 0.0, Result{}};
    try {
      row.r = retort_ms(c, *be, budget_mib << 20, logits_dtype, warmup, reps);
    } catch (const Error& e) {
      std::printf("  retort failed: %s\n", e.what());
      row.r.ms = -1;
    }
    row.floor = row.r.floor_ms;
    std::printf("  floor %.3f ms, retort %.3f ms\n", row.floor, row.r.ms);
    rows.push_back(row);
  }
  std::printf("\n%-28s | %9s | %10s | %6s | %14s | %s\n", "case", "floor ms", "retort ms", "ratio",
              "peak extra MiB", "target");
  bool ran = true;
  for (const Row& r : rows) {
    const bool abs = r.c.kind == Kind::TopKSparse;
    const double ratio = r.r.ms / r.floor;
    const bool met = r.r.ms > 0 && (abs ? r.r.ms <= r.c.target : ratio <= r.c.target);
    ran &= r.r.ms > 0;
    char target[32];
    std::snprintf(target, sizeof(target), abs ? "%.0f ms" : "%.2f", r.c.target);
    std::printf("%-28s | %9.3f | %10.3f | %6.3f | %14.1f | %s %s\n", r.c.name.c_str(), r.floor, r.r.ms, ratio,
                r.r.peak_mib, target, met ? "met" : "MISSED");
  }
  // A missed target is a finding, printed above; only a run that failed is an error.
  return ran ? 0 : 1;
}
