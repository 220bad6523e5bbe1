// CPU benchmark of the fused linear losses against their floor: the three GEMMs a fused lm-head + loss cannot
// avoid (logits = hidden·Wᵀ, dhidden = dlogits·W, dW = dlogitsᵀ·hidden), timed with the same CPU GEMM on
// the same threads in the same run. Prints the median time of each and the ratio fused / GEMMs for
// cross-entropy and top-K distillation (dense path), and the K-sparse top-K path for information.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "ops/loss/chunk_scheduler.h"
#include "ops/matmul_kernel.h"
#include "retort.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  int threads = 2;
  int64_t n = 512, h = 256, v = 8192, k = 32;
  size_t budget = retort::kFusedLinearDefaultBudget;
  int warmup = 2, reps = 7, rounds = 3;
};

void usage(const char* prog) {
  std::printf(
      "usage: %s [--threads T] [--n N] [--h H] [--v V] [--k K] [--budget-mib M] [--reps R] [--warmup W]\n"
      "          [--rounds X]\n"
      "\n"
      "Times one forward + backward of fused_linear_cross_entropy and fused_linear_topk_kd (f32 hidden [N, "
      "H],\n"
      "weight [V, H], bias [V]; all gradients) through the chunk scheduler on the CPU executor, and the "
      "three\n"
      "GEMMs of the same shapes (logits [N, V], dhidden [N, H], dW [V, H]) with the same CPU GEMM. Each "
      "round\n"
      "runs W untimed and R timed repetitions of every variant in turn; the figures are medians over all\n"
      "rounds. The ratio fused / GEMMs is the overhead of the loss, the chunking and the bias (target <= "
      "1.3).\n"
      "\n"
      "  --threads T     threads (default 2)\n"
      "  --n/--h/--v     rows, hidden size, vocabulary (default 512, 256, 8192)\n"
      "  --k K           teacher top-K slots (default 32)\n"
      "  --budget-mib M  memory budget for the chunk logits in MiB (default 256: one chunk at the defaults)\n"
      "  --reps R        timed repetitions per round (default 7)\n"
      "  --warmup W      untimed repetitions per round (default 2)\n"
      "  --rounds X      rounds (default 3)\n",
      prog);
}

bool parse(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
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
    } else if (a == "--n") {
      o.n = next();
    } else if (a == "--h") {
      o.h = next();
    } else if (a == "--v") {
      o.v = next();
    } else if (a == "--k") {
      o.k = next();
    } else if (a == "--budget-mib") {
      o.budget = size_t(next()) << 20;
    } else if (a == "--reps") {
      o.reps = int(next());
    } else if (a == "--warmup") {
      o.warmup = int(next());
    } else if (a == "--rounds") {
      o.rounds = int(next());
    } else {
      std::fprintf(stderr, "unknown option %s (try --help)\n", a.c_str());
      return false;
    }
  }
  if (o.threads < 1 || o.n < 1 || o.h < 1 || o.v < 1 || o.k < 1 || o.k > o.v || o.budget < 1 || o.reps < 1 ||
      o.warmup < 0 || o.rounds < 1) {
    std::fprintf(stderr, "sizes, --threads, --budget-mib, --reps and --rounds must be >= 1, and K <= V\n");
    return false;
  }
  return true;
}

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
  const size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

template <typename F>
void time_runs(F&& f, int warmup, int reps, std::vector<double>& seconds) {
  for (int i = 0; i < warmup; ++i) f();
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    f();
    seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
}

}  // namespace

int main(int argc, char** argv) {
  using namespace retort;
  Options o;
  if (!parse(argc, argv, o)) return 2;
  const int64_t n = o.n, h = o.h, v = o.v, k = o.k;

  std::mt19937 gen(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto random = [&](int64_t count, float s) {
    std::vector<float> x(static_cast<size_t>(count));
    for (float& e : x) e = s * u(gen);
    return x;
  };
  std::vector<float> hidden = random(n * h, 1.0f), weight = random(v * h, 0.1f), bias = random(v, 0.1f);
  std::vector<float> logprobs = random(n * k, 1.0f);
  for (float& x : logprobs) x = -3.0f + x;  // in [-4, -2]
  std::vector<int32_t> labels(static_cast<size_t>(n)), ids(static_cast<size_t>(n * k));
  for (auto& y : labels) y = int32_t(gen() % uint64_t(v));
  for (auto& y : ids) y = int32_t(gen() % uint64_t(v));
  std::vector<float> dh(static_cast<size_t>(n * h)), dw(static_cast<size_t>(v * h)),
      db(static_cast<size_t>(v)), loss(1);
  std::vector<float> logits(
      static_cast<size_t>(n * v));  // the floor's [N, V] logits (and its logits gradient)

  ThreadPool pool(o.threads);
  // A fresh executor per run, as the graph node makes one (its scratch is allocated each time).
  auto run = [&](const loss::FusedLinearProblem& p) {
    auto ex = loss::make_cpu_chunk_executor(pool);
    loss::run_fused_linear(*ex, p);
  };
  auto problem = [&](loss::LossKind kind, bool normalize) {
    loss::FusedLinearProblem p;
    p.hidden = loss::Block::dense(hidden.data(), DType::F32, n, h);
    p.weight = loss::Block::dense(weight.data(), DType::F32, v, h);
    p.bias = loss::Block::dense(bias.data(), DType::F32, 1, v);
    p.spec.kind = kind;
    const loss::Block lab{labels.data(), DType::I32, n, 1, sizeof(int32_t), sizeof(int32_t)};
    p.spec.ce.labels = lab;
    p.spec.topk.ids = loss::Block::dense(ids.data(), DType::I32, n, k);
    p.spec.topk.logprobs = loss::Block::dense(logprobs.data(), DType::F32, n, k);
    p.spec.topk.normalize_topk = normalize;
    p.loss = loss.data();
    p.dhidden = loss::Block::dense(dh.data(), DType::F32, n, h);
    p.dweight = loss::Block::dense(dw.data(), DType::F32, v, h);
    p.dbias = loss::Block::dense(db.data(), DType::F32, 1, v);
    p.memory_budget = o.budget;
    p.what = "bench";
    return p;
  };
  const loss::FusedLinearProblem ce = problem(loss::LossKind::CrossEntropy, false);
  const loss::FusedLinearProblem kd = problem(loss::LossKind::TopK, false);
  const loss::FusedLinearProblem sparse = problem(loss::LossKind::TopK, true);

  // The floor: the same three GEMMs, row-major operands read through strides as the fused path reads them.
  const gemm::Kernel kern = gemm::best_kernel();
  auto op = [](const void* data, int64_t rs, int64_t cs) {
    gemm::Operand x;
    x.data = data;
    x.rs = rs * int64_t(sizeof(float));
    x.cs = cs * int64_t(sizeof(float));
    return x;
  };
  auto gemms = [&] {
    gemm::sgemm(n, v, h, op(hidden.data(), h, 1), op(weight.data(), 1, h), logits.data(), v, &pool, kern);
    gemm::sgemm(n, h, v, op(logits.data(), v, 1), op(weight.data(), h, 1), dh.data(), h, &pool, kern);
    gemm::sgemm(v, h, n, op(logits.data(), 1, v), op(hidden.data(), h, 1), dw.data(), h, &pool, kern);
  };

  const loss::ChunkPlan plan = loss::plan_chunks(ce);
  std::printf(
      "fused linear losses on the CPU: N=%lld H=%lld V=%lld K=%lld, f32, %d thread(s), GEMM kernel %s\n",
      (long long)n, (long long)h, (long long)v, (long long)k, o.threads, gemm::kernel_name(kern));
  std::printf("chunk: %lld rows of %lld padded logits (budget %.0f MiB)\n", (long long)plan.chunk_rows,
              (long long)plan.padded_vocab, double(o.budget) / double(1 << 20));

  std::vector<double> t_floor, t_ce, t_kd, t_sparse;
  const double load_before = load_average();
  for (int r = 0; r < o.rounds; ++r) {
    time_runs(gemms, o.warmup, o.reps, t_floor);
    time_runs([&] { run(ce); }, o.warmup, o.reps, t_ce);
    time_runs([&] { run(kd); }, o.warmup, o.reps, t_kd);
    time_runs([&] { run(sparse); }, o.warmup, o.reps, t_sparse);
  }
  std::printf("load average %.2f before, %.2f after (a busy machine skews every figure)\n", load_before,
              load_average());
  const double f = median(t_floor);
  const double gflop = 3 * 2.0 * double(n) * double(v) * double(h) * 1e-9;
  std::printf("3 GEMMs (floor)        : %9.3f ms  (%.1f GFLOP/s)\n", f * 1e3, gflop / f);
  std::printf("fused cross-entropy    : %9.3f ms  ratio %.3f\n", median(t_ce) * 1e3, median(t_ce) / f);
  std::printf("fused top-K KD (dense) : %9.3f ms  ratio %.3f\n", median(t_kd) * 1e3, median(t_kd) / f);
  std::printf("fused top-K KD (K-sparse, normalize_topk): %9.3f ms  (%.3f of the floor; no GEMMs)\n",
              median(t_sparse) * 1e3, median(t_sparse) / f);
  return 0;
}
