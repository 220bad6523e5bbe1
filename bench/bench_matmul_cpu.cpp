// CPU matmul benchmark: retort's matmul (a one-node graph on a CpuBackend) against OpenBLAS cblas_sgemm with
// the same thread count, measured in the same run. Prints GFLOP/s of each (median over timed runs after
// warm-up) and the ratio retort / OpenBLAS. Without OpenBLAS at build time it times retort alone.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ops/matmul_kernel.h"
#include "retort.h"

#ifdef RETORT_HAVE_OPENBLAS
#include <cblas.h>
#endif

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  int threads = 2;
  int64_t m = 1024, n = 1024, k = 1024;
  int warmup = 3;
  int reps = 10;
  int rounds = 3;
  bool bf16 = false;
};

void usage(const char* prog) {
  std::printf(
      "usage: %s [--threads N] [--size S | --mnk M N K] [--reps R] [--warmup W] [--rounds X]\n"
      "\n"
      "Times C = A B in f32 (A [M, K], B [K, N], all row-major) with retort's CPU matmul and, when built "
      "with\n"
      "OpenBLAS, with cblas_sgemm on the same number of threads. Each round runs W untimed and R timed\n"
      "multiplications of retort, then the same for OpenBLAS; the GFLOP/s printed are medians over all "
      "timed\n"
      "runs, and the ratio is retort / OpenBLAS.\n"
      "\n"
      "  --threads N   threads for both libraries (default 2)\n"
      "  --size S      M = N = K = S (default 1024)\n"
      "  --mnk M N K   a rectangular problem\n"
      "  --reps R      timed runs per round (default 10)\n"
      "  --warmup W    untimed runs per round (default 3)\n"
      "  --rounds X    alternating rounds (default 3)\n"
      "  --dtype D     f32 or bf16: retort's operands (bf16: A and B stored bf16, the bf16 GEMM; OpenBLAS\n"
      "                multiplies the same values in f32)\n",
      prog);
}

bool parse(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> long long {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return std::atoll(argv[++i]);
    };
    if (a == "--help" || a == "-h") {
      usage(argv[0]);
      std::exit(0);
    } else if (a == "--threads") {
      o.threads = int(next());
    } else if (a == "--size") {
      o.m = o.n = o.k = next();
    } else if (a == "--mnk") {
      o.m = next();
      o.n = next();
      o.k = next();
    } else if (a == "--reps") {
      o.reps = int(next());
    } else if (a == "--warmup") {
      o.warmup = int(next());
    } else if (a == "--rounds") {
      o.rounds = int(next());
    } else if (a == "--dtype") {
      const std::string d = i + 1 < argc ? argv[++i] : "";
      if (d != "f32" && d != "bf16") {
        std::fprintf(stderr, "--dtype is f32 or bf16, got '%s'\n", d.c_str());
        return false;
      }
      o.bf16 = d == "bf16";
    } else {
      std::fprintf(stderr, "unknown option %s (try --help)\n", a.c_str());
      return false;
    }
  }
  if (o.threads < 1 || o.m < 1 || o.n < 1 || o.k < 1 || o.reps < 1 || o.warmup < 0 || o.rounds < 1) {
    std::fprintf(stderr, "all sizes, --threads, --reps and --rounds must be >= 1\n");
    return false;
  }
  return true;
}

// The 1-minute load average: other processes on the machine skew a wall-clock benchmark, so it is printed.
double load_average() {
  double l = -1;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &l) != 1) l = -1;
    std::fclose(f);
  }
  return l;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

template <typename F>
void time_runs(F&& f, int warmup, int reps, std::vector<double>& seconds) {
  for (int i = 0; i < warmup; ++i) f();
  for (int i = 0; i < reps; ++i) {
    auto t0 = Clock::now();
    f();
    seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
}

}  // namespace

int main(int argc, char** argv) {
  using namespace retort;
  Options o;
  if (!parse(argc, argv, o)) return 2;
  const double flops = 2.0 * double(o.m) * double(o.n) * double(o.k);

  std::vector<float> ha(size_t(o.m * o.k)), hb(size_t(o.k * o.n));
  std::mt19937 gen(42);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (auto& x : ha) x = dist(gen);
  for (auto& x : hb) x = dist(gen);
  // With bf16 operands both libraries multiply the same (bf16) values.
  if (o.bf16)
    for (auto* v : {&ha, &hb})
      for (auto& x : *v) x = bf16_to_f32(f32_to_bf16(x));
  const DType dt = o.bf16 ? DType::BF16 : DType::F32;

  CpuBackend backend(o.threads);
  Context ctx(backend);
  Tensor* a = ctx.input(dt, {o.m, o.k}, "A");
  Tensor* b = ctx.input(dt, {o.k, o.n}, "B");
  set_data(a, ha);
  set_data(b, hb);
  Tensor* c = matmul(ctx, a, b);
  c->flags |= kOutput;
  Graph graph(ctx);
  graph.forward(c);

  std::printf("matmul %s M=%lld N=%lld K=%lld, %d thread(s), retort kernel %s\n", dtype_name(dt),
              (long long)o.m, (long long)o.n, (long long)o.k, o.threads,
              gemm::kernel_name(o.bf16 ? gemm::best_bf16_kernel() : gemm::best_kernel()));
#ifdef RETORT_HAVE_OPENBLAS
  openblas_set_num_threads(o.threads);
  const char* ct = std::getenv("OPENBLAS_CORETYPE");
  std::printf("%s: core %s, %d thread(s)%s%s\n", OPENBLAS_VERSION, openblas_get_corename(),
              openblas_get_num_threads(), ct ? ", OPENBLAS_CORETYPE=" : "", ct ? ct : "");
  std::vector<float> hc(size_t(o.m * o.n));
  auto run_blas = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(o.m), int(o.n), int(o.k), 1.0f, ha.data(),
                int(o.k), hb.data(), int(o.n), 0.0f, hc.data(), int(o.n));
  };
#else
  std::printf(
      "OpenBLAS: not found at build time, timing retort alone (install libopenblas-dev and "
      "reconfigure, or run bench/run_cpu_matmul.sh)\n");
#endif

  std::vector<double> t_retort, t_blas;
  const double load_before = load_average();
  for (int r = 0; r < o.rounds; ++r) {
    time_runs([&] { graph.compute(); }, o.warmup, o.reps, t_retort);
#ifdef RETORT_HAVE_OPENBLAS
    time_runs(run_blas, o.warmup, o.reps, t_blas);
    // OpenBLAS's idle workers spin for a while before they sleep; let them settle so they do not steal
    // cycles from the next retort round.
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
#endif
  }

  std::printf("load average %.2f before, %.2f after (a busy machine skews both figures)\n", load_before,
              load_average());
  const double g_retort = flops / median(t_retort) * 1e-9;
  std::printf("retort   : %8.2f GFLOP/s  (median %.3f ms over %zu runs; best %.2f GFLOP/s)\n", g_retort,
              median(t_retort) * 1e3, t_retort.size(),
              flops / *std::min_element(t_retort.begin(), t_retort.end()) * 1e-9);
#ifdef RETORT_HAVE_OPENBLAS
  const double g_blas = flops / median(t_blas) * 1e-9;
  std::printf("OpenBLAS : %8.2f GFLOP/s  (median %.3f ms over %zu runs; best %.2f GFLOP/s)\n", g_blas,
              median(t_blas) * 1e3, t_blas.size(),
              flops / *std::min_element(t_blas.begin(), t_blas.end()) * 1e-9);
  // The two results must agree, or the timing means nothing.
  std::vector<float> mine = get_data(c);
  double num = 0, den = 0;
  for (size_t i = 0; i < mine.size(); ++i) {
    num += double(mine[i] - hc[i]) * double(mine[i] - hc[i]);
    den += double(hc[i]) * double(hc[i]);
  }
  const double rel = std::sqrt(num / std::max(den, 1e-300));
  std::printf("ratio retort / OpenBLAS: %.3f   (results agree to %.1e relative)\n", g_retort / g_blas, rel);
  // bf16 operands: the same products, summed in another order (vdpbf16ps flushes denormals too).
  if (!(rel < (o.bf16 ? 1e-3 : 1e-4))) {
    std::fprintf(stderr, "retort and OpenBLAS disagree (relative error %.3e)\n", rel);
    return 1;
  }
#endif
  return 0;
}
