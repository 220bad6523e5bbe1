// CPU benchmark of the fused linear losses against their floor: the three GEMMs a fused lm-head + loss cannot
// avoid (logits = hidden·Wᵀ, dhidden = dlogits·W, dW = dlogitsᵀ·hidden), timed with the same CPU GEMM on
// the same threads in the same run. Prints the median time of each and the ratio fused / GEMMs for
// cross-entropy, top-K distillation with a hard CE (dense path) and online JSD distillation (whose floor adds
// the teacher's logits GEMM), and the K-sparse top-K path for information.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
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
  int64_t n = 512, h = 256, v = 8192, k = 32, ht = 512;
  size_t budget = size_t(256) << 20;
  int warmup = 2, reps = 7, rounds = 3;
  std::string only;  // ce, kd, sparse or jsd: time the floor and that case only (for profiling)
};

void usage(const char* prog) {
  std::printf(
      "usage: %s [--threads T] [--n N] [--h H] [--ht HT] [--v V] [--k K] [--budget-mib M] [--reps R]\n"
      "          [--warmup W] [--rounds X] [--only ce|kd|sparse|jsd]\n"
      "\n"
      "Times one forward + backward of fused_linear_cross_entropy, fused_linear_topk_kd (K slots, beta 0,\n"
      "w_hard 0.5) and fused_linear_distill (JSD, beta 0.5, online teacher of hidden size HT) through the\n"
      "chunk scheduler on the CPU executor (f32 hidden [N, H], weight [V, H], bias [V]; all gradients), and\n"
      "the GEMMs they cannot avoid (logits [N, V], dhidden [N, H], dW [V, H]; plus the teacher's logits\n"
      "[N, V] for JSD) with the same CPU GEMM. Each round runs W untimed and R timed repetitions of every\n"
      "variant in turn; times are medians, and a ratio is the median over repetitions of the case's time "
      "over\n"
      "the GEMMs' time in the same repetition: the overhead of the loss, the chunking and the bias\n"
      "(target <= 1.3).\n"
      "\n"
      "  --threads T     threads (default 2)\n"
      "  --n/--h/--v     rows, hidden size, vocabulary (default 512, 256, 8192)\n"
      "  --ht HT         teacher hidden size for JSD (default 512)\n"
      "  --k K           teacher top-K slots (default 32)\n"
      "  --budget-mib M  memory budget for the chunk logits in MiB (default 256: one chunk at the defaults)\n"
      "  --reps R        timed repetitions per round (default 7)\n"
      "  --warmup W      untimed repetitions per round (default 2)\n"
      "  --rounds X      rounds (default 3)\n"
      "  --only CASE     time the GEMMs and this case only (for profiling)\n",
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
    } else if (a == "--only" && i + 1 < argc) {
      o.only = argv[++i];
    } else if (a == "--ht") {
      o.ht = next();
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
  if (o.threads < 1 || o.n < 1 || o.h < 1 || o.v < 1 || o.k < 1 || o.k > o.v || o.ht < 1 || o.budget < 1 ||
      o.reps < 1 || o.warmup < 0 || o.rounds < 1) {
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

double seconds_of(const std::function<void()>& f) {
  const auto t0 = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  using namespace retort;
  Options o;
  if (!parse(argc, argv, o)) return 2;
  const int64_t n = o.n, h = o.h, v = o.v, k = o.k, ht = o.ht;

  std::mt19937 gen(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto random = [&](int64_t count, float s) {
    std::vector<float> x(static_cast<size_t>(count));
    for (float& e : x) e = s * u(gen);
    return x;
  };
  std::vector<float> hidden = random(n * h, 1.0f), weight = random(v * h, 0.1f), bias = random(v, 0.1f);
  std::vector<float> t_hidden = random(n * ht, 1.0f), t_weight = random(v * ht, 0.1f);
  std::vector<float> logprobs = random(n * k, 1.0f);
  for (float& x : logprobs) x = -3.0f + x;  // in [-4, -2]
  std::vector<int32_t> labels(static_cast<size_t>(n)), ids(static_cast<size_t>(n * k));
  for (auto& y : labels) y = int32_t(gen() % uint64_t(v));
  for (auto& y : ids) y = int32_t(gen() % uint64_t(v));
  std::vector<float> dh(static_cast<size_t>(n * h)), dw(static_cast<size_t>(v * h)),
      db(static_cast<size_t>(v)), loss(1);
  // The floor's [N, V] logits (and its logits gradient), and the teacher's logits for JSD.
  std::vector<float> logits(static_cast<size_t>(n * v)), t_logits(static_cast<size_t>(n * v));

  ThreadPool pool(o.threads);
  // A fresh executor per run, as the graph node makes one (its scratch is allocated each time).
  auto run = [&](const loss::FusedLinearProblem& p) {
    auto ex = loss::make_cpu_chunk_executor(pool);
    loss::run_fused_linear(*ex, p);
  };
  auto problem = [&](loss::LossKind kind, bool normalize, float w_hard) {
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
    p.spec.topk.labels = lab;
    p.spec.topk.w_hard = w_hard;
    p.spec.distill.div.beta = 0.5f;
    if (kind == loss::LossKind::Distill) {
      p.teacher_hidden = loss::Block::dense(t_hidden.data(), DType::F32, n, ht);
      p.teacher_weight = loss::Block::dense(t_weight.data(), DType::F32, v, ht);
    }
    p.loss = loss.data();
    p.dhidden = loss::Block::dense(dh.data(), DType::F32, n, h);
    p.dweight = loss::Block::dense(dw.data(), DType::F32, v, h);
    p.dbias = loss::Block::dense(db.data(), DType::F32, 1, v);
    p.logits_budget = o.budget;
    p.what = "bench";
    return p;
  };
  // The GPU benchmark's cases at a small shape: CE; top-K KD with a hard CE (w_hard 0.5); the K-sparse path
  // (normalize_topk, no hard loss); online JSD (beta 0.5).
  const loss::FusedLinearProblem ce = problem(loss::LossKind::CrossEntropy, false, 0.0f);
  const loss::FusedLinearProblem kd = problem(loss::LossKind::TopK, false, 0.5f);
  const loss::FusedLinearProblem sparse = problem(loss::LossKind::TopK, true, 0.0f);
  const loss::FusedLinearProblem jsd = problem(loss::LossKind::Distill, false, 0.0f);

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
  auto teacher_gemm = [&] {
    gemm::sgemm(n, v, ht, op(t_hidden.data(), ht, 1), op(t_weight.data(), 1, ht), t_logits.data(), v, &pool,
                kern);
  };

  const loss::ChunkPlan plan = loss::plan_chunks(ce);
  std::printf(
      "fused linear losses on the CPU: N=%lld H=%lld V=%lld K=%lld (JSD teacher H=%lld), f32, %d thread(s), "
      "GEMM kernel %s\n",
      (long long)n, (long long)h, (long long)v, (long long)k, (long long)ht, o.threads,
      gemm::kernel_name(kern));
  std::printf("chunk: %lld rows of %lld padded logits (budget %.0f MiB)\n", (long long)plan.chunk_rows,
              (long long)plan.padded_vocab, double(o.budget) / double(1 << 20));

  // Every repetition times each variant once, in turn (the floor's GEMMs next to each case), and a case's
  // ratio is the median over repetitions of its time over the floor of the same repetition: a shared
  // machine's slow and fast spells then move both sides of a ratio alike.
  struct Variant {
    std::string key;
    std::function<void()> f;
    std::vector<double> t;
  };
  std::vector<Variant> vs;
  vs.push_back({"floor", gemms, {}});
  vs.push_back({"teacher", teacher_gemm, {}});
  for (auto [key, p] : {std::pair<const char*, const loss::FusedLinearProblem*>{"ce", &ce},
                        {"kd", &kd},
                        {"sparse", &sparse},
                        {"jsd", &jsd}})
    if (o.only.empty() || o.only == key) vs.push_back({key, [&run, p] { run(*p); }, {}});
  const double load_before = load_average();
  for (int r = 0; r < o.rounds; ++r) {
    for (int i = 0; i < o.warmup; ++i)
      for (Variant& x : vs) x.f();
    for (int i = 0; i < o.reps; ++i)
      for (Variant& x : vs) x.t.push_back(seconds_of(x.f));
  }
  std::printf("load average %.2f before, %.2f after (a busy machine skews every figure)\n", load_before,
              load_average());
  const std::vector<double>& tf = vs[0].t;
  const std::vector<double>& tt = vs[1].t;
  auto find = [&](const char* key) -> const Variant* {
    for (const Variant& x : vs)
      if (x.key == key) return &x;
    return nullptr;
  };
  // Median over repetitions of t / floor (with the teacher's GEMM in the floor for JSD).
  auto ratio = [&](const Variant& x, bool teacher) {
    std::vector<double> r;
    for (size_t i = 0; i < x.t.size(); ++i) r.push_back(x.t[i] / (tf[i] + (teacher ? tt[i] : 0.0)));
    return median(r);
  };
  const double f = median(tf);
  std::vector<double> ft_v;
  for (size_t i = 0; i < tf.size(); ++i) ft_v.push_back(tf[i] + tt[i]);
  const double gflop = 3 * 2.0 * double(n) * double(v) * double(h) * 1e-9;
  std::printf("3 GEMMs (floor)             : %9.3f ms  (%.1f GFLOP/s)\n", f * 1e3, gflop / f);
  std::printf("+ teacher GEMM (JSD floor)  : %9.3f ms\n", median(ft_v) * 1e3);
  double worst = 0.0;
  auto report = [&](const char* key, const char* label, bool teacher, bool target) {
    const Variant* x = find(key);
    if (!x) return;
    const double r = ratio(*x, teacher);
    std::printf("%-28s: %9.3f ms  ratio %.3f%s\n", label, median(x->t) * 1e3, r,
                !target   ? " (information: no GEMMs)"
                : teacher ? " (to the floor with the teacher GEMM)"
                          : "");
    if (target) worst = std::max(worst, r);
  };
  report("ce", "fused cross-entropy", false, true);
  report("kd", "fused top-K KD + hard CE", false, true);
  report("jsd", "fused online JSD (beta 0.5)", true, true);
  report("sparse", "fused top-K KD, K-sparse", false, false);
  std::printf("worst ratio %.3f (target <= 1.3: %s)\n", worst, worst <= 1.3 ? "met" : "missed");
  return 0;
}
