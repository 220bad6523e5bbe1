// One distillation training step of a GPT-2-vocabulary student, timed end to end: tokens/s, ms/step, model
// FLOPs per token, achieved TFLOP/s and MFU against the device's dense bf16 peak, and peak device memory.
//
// The step is retort::LmTrainer's, unchanged (src/nn/lm.h): the batch from a token shard, the student's
// forward and backward with the lm head and the loss fused (fused_linear_topk_kd), gradient-norm clipping,
// AdamW with the cosine schedule. Only the data is synthetic: random tokens in a scratch shard, and a
// teacher top-K per position made like an offline cache's (distinct random ids, log-softmax values sorted
// best first), copied to the device every step as LmTrainer's cache path does.
//
// On a GPU (issue 5's shape: 6 layers x d_model 512, context 512, vocab 50257, batch 16, K 64):
//   meson setup build-cuda -Dcuda=enabled -Dsm_arch=90 && ninja -C build-cuda bench/bench_distill_step
//   ./build-cuda/bench/bench_distill_step
// Anywhere, a tiny shape to check the program itself: ./build/bench/bench_distill_step --cpu
//
// Data parallel: started by a launcher (tools/launch.sh -n 4 build-cuda/bench/bench_distill_step), each rank
// runs the same per-GPU batch, the gradients are summed over NCCL, and rank 0 reports the world's tokens/s;
// it then times the gradients' all-reduce alone, the figure the exposed communication is measured against
// (tools/multi_gpu.sh compares worlds of 1, 2 and 4).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <unordered_set>
#include <vector>

#include "retort.h"

#include <unistd.h>

#if RETORT_HAS_CUDA
#include <cuda_runtime.h>
#endif

namespace {

using namespace retort;
using Clock = std::chrono::steady_clock;

struct Options {
  bool cpu = false;
  int threads = 0;
  int64_t layers = 6, d_model = 512, heads = 8, kv_heads = 0, d_ff = 0, context = 512, vocab = 50257, batch = 16,
          k = 64;
  int64_t steps = 10, warmup = 3;
  float w_hard = 0.5f;
  std::string mode = "both", compute = "bf16", bucket_dtype = "f32";
  int64_t bucket_mib = kDefaultBucketMiB;
  double peak_tflops = 0;  // 0: from the device name
  bool graphs = true;      // CudaOptions::graphs
  bool zero1 = false;      // TrainerOptions::zero1
  int64_t head_mib = 0;    // teacher mode: FusedLinearOptions::logits_budget in MiB (0: automatic)
};

const char* kUsage = R"(usage: bench_distill_step [options]

Times LmTrainer's distillation step (offline top-K KD from synthetic teacher data) for a Llama-style student
and prints tokens/s, ms/step, model FLOPs/token, achieved TFLOP/s, MFU and peak device memory, for
  dense:  w_hard·CE + (1 - w_hard)·KD over the full vocabulary (fused_linear_topk_kd, labels given)
  sparse: KD only, normalize_topk, no labels: the K-sparse path (K student logits per position)
  teacher: a teacher's forward as teacher-cache runs it (no autograd): the lm head in chunks
          (fused_linear_topk_logprobs: the top K log-probs and the summed cross-entropy, no [N, V] logits),
          the top K read back to the host each batch (not part of "both"); e.g.
          SmolLM2-135M's shape: --mode teacher --layers 30 --d-model 576 --heads 9 --kv-heads 3 --d-ff 1536
          --vocab 49152 --context 1024 --batch 32
Each mode: --warmup untimed steps, then --steps timed steps between device synchronizations.

  --cpu              run on the CPU at a tiny shape (layers 2, d-model 64, heads 4, context 32, vocab 1000,
                     batch 2, K 16, steps 3, warmup 1, f32) unless those flags are given too
  --threads N        CPU threads (default: all cores)
  --layers N (6)  --d-model N (512)  --heads N (8)  --kv-heads N (heads)  --d-ff N (the config's default)
  --context N (512)  --vocab N (50257)
  --batch N (16 sequences)  --k N (64)  --steps N (10)  --warmup N (3)
  --w-hard F         weight of the cross-entropy in the dense mode (default 0.5; KD gets 1 - w_hard)
  --mode M           both, dense, sparse or teacher (default both)
  --compute-dtype D  bf16, f16 or f32 (default bf16 on CUDA, f32 with --cpu)
  --peak-tflops F    the dense peak for MFU (default: from the device name; H100 SXM / H200: 989)
  --graphs 0|1       CUDA Graph replay of the step (default 1); with it on, the warm-up goes on until the step
                     is replayed (the fused loss's GEMM timings settle first: about 2 s), at most 30 s
  --bucket-dtype D   data parallel: gradient buckets travel as f32 or bf16 (default f32)
  --bucket-mib N     data parallel: gradient bucket size in MiB (default 25)
  --zero1 0|1        data parallel: AdamW's moments split over the ranks (ZeRO-1; default 0)
  --head-mib N       teacher mode: the lm head's chunk logits budget in MiB (default 0: automatic)
Under a launcher (RANK, WORLD_SIZE, ... set: tools/launch.sh -n N) every rank runs --batch sequences and
rank 0 prints the world's tokens/s.
)";

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "bench_distill_step: %s\n\n%s", msg.c_str(), kUsage);
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  std::unordered_set<std::string> given;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    if (f == "--help" || f == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (f == "--cpu") {
      o.cpu = true;
      continue;
    }
    if (i + 1 >= argc) usage_error(f + " needs a value");
    const std::string v = argv[++i];
    given.insert(f);
    char* end = nullptr;
    auto num = [&]() {
      const double x = std::strtod(v.c_str(), &end);
      if (v.empty() || *end || !std::isfinite(x)) usage_error(f + " wants a number, got '" + v + "'");
      return x;
    };
    auto integer = [&]() {
      const double x = num();
      if (x != std::floor(x) || x < 0) usage_error(f + " wants a non-negative integer, got '" + v + "'");
      return int64_t(x);
    };
    if (f == "--graphs") {
      if (v != "0" && v != "1") usage_error("--graphs is 0 or 1, got '" + v + "'");
      o.graphs = v == "1";
    } else if (f == "--threads")
      o.threads = int(integer());
    else if (f == "--layers")
      o.layers = integer();
    else if (f == "--d-model")
      o.d_model = integer();
    else if (f == "--heads")
      o.heads = integer();
    else if (f == "--kv-heads")
      o.kv_heads = integer();
    else if (f == "--d-ff")
      o.d_ff = integer();
    else if (f == "--context")
      o.context = integer();
    else if (f == "--vocab")
      o.vocab = integer();
    else if (f == "--batch")
      o.batch = integer();
    else if (f == "--k")
      o.k = integer();
    else if (f == "--steps")
      o.steps = integer();
    else if (f == "--warmup")
      o.warmup = integer();
    else if (f == "--w-hard")
      o.w_hard = float(num());
    else if (f == "--peak-tflops")
      o.peak_tflops = num();
    else if (f == "--mode")
      o.mode = v;
    else if (f == "--compute-dtype")
      o.compute = v;
    else if (f == "--bucket-dtype")
      o.bucket_dtype = v;
    else if (f == "--bucket-mib")
      o.bucket_mib = integer();
    else if (f == "--zero1")
      o.zero1 = integer() != 0;
    else if (f == "--head-mib") {
      o.head_mib = integer();
      if (o.head_mib < 0) usage_error("--head-mib must be >= 0");
    } else
      usage_error("unknown option " + f);
  }
  if (o.cpu) {
    // A shape the CPU finishes in seconds; flags given explicitly win.
    auto def = [&](const char* flag, int64_t& field, int64_t value) {
      if (!given.count(flag)) field = value;
    };
    def("--layers", o.layers, 2), def("--d-model", o.d_model, 64), def("--heads", o.heads, 4);
    def("--context", o.context, 32), def("--vocab", o.vocab, 1000), def("--batch", o.batch, 2);
    def("--k", o.k, 16), def("--steps", o.steps, 3), def("--warmup", o.warmup, 1);
    if (!given.count("--compute-dtype")) o.compute = "f32";
  }
  if (o.bucket_dtype != "f32" && o.bucket_dtype != "bf16")
    usage_error("--bucket-dtype is f32 or bf16, got '" + o.bucket_dtype + "'");
  if (o.mode != "both" && o.mode != "dense" && o.mode != "sparse" && o.mode != "teacher")
    usage_error("--mode is both, dense, sparse or teacher");
  if (o.compute != "bf16" && o.compute != "f16" && o.compute != "f32")
    usage_error("--compute-dtype is bf16, f16 or f32");
  if (o.steps < 1 || o.batch < 1 || o.k < 1 || o.k > o.vocab)
    usage_error("need steps, batch >= 1, 1 <= K <= vocab");
  if (o.w_hard < 0 || o.w_hard > 1) usage_error("--w-hard must be in [0, 1]");
  return o;
}

DType dtype_of(const std::string& s) {
  return s == "bf16" ? DType::BF16 : s == "f16" ? DType::F16 : DType::F32;
}

// The device's name and its dense 16-bit tensor-core peak in TFLOP/s (0 when unknown). Peaks are NVIDIA's
// datasheet figures without sparsity.
struct DeviceInfo {
  std::string name = "cpu";
  double peak_tflops = 0;
};

DeviceInfo device_info(bool cuda) {
  DeviceInfo d;
#if RETORT_HAS_CUDA
  if (cuda) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, 0) == cudaSuccess) d.name = p.name;
    const std::string& n = d.name;
    auto has = [&](const char* s) { return n.find(s) != std::string::npos; };
    if (has("H100") && has("PCIe"))
      d.peak_tflops = 756;
    else if (has("H100") && has("NVL"))
      d.peak_tflops = 835;
    else if (has("H100") || has("H200") || has("H800") || has("GH200"))
      d.peak_tflops = 989;  // SXM (HBM3 / HBM3e): 989.4 dense bf16
    else if (has("A100"))
      d.peak_tflops = 312;
    else if (has("L40S"))
      d.peak_tflops = 362;
  }
#else
  (void)cuda;
#endif
  return d;
}

// A token shard of random ids in a scratch directory, removed on destruction.
struct ScratchShard {
  std::filesystem::path dir;
  std::vector<std::string> paths;
  ScratchShard(int64_t tokens, int64_t vocab, uint64_t seed) {
    dir = std::filesystem::temp_directory_path() /
          ("retort_bench_distill_" + std::to_string(uint64_t(::getpid())) + "_" + std::to_string(seed));
    std::filesystem::create_directories(dir);
    std::mt19937_64 rng(seed);
    std::vector<int32_t> ids(static_cast<size_t>(tokens));
    for (auto& x : ids) x = int32_t(rng() % uint64_t(vocab));
    const std::string path = (dir / "tokens.bin").string();
    write_token_shard(path, ids, token_dtype_for_vocab(vocab));
    paths.push_back(path);
  }
  ~ScratchShard() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

// Teacher top-K rows as an offline cache holds them: K distinct random ids, and log-probabilities that are a
// log-softmax of random logits sorted best first, with a fifth of the probability mass left outside the K
// (a cache keeps only the head of the distribution).
struct TeacherSet {
  std::vector<int64_t> ids;
  std::vector<float> logprobs, mask;
};

TeacherSet make_teacher(int64_t rows, int64_t K, int64_t V, uint64_t seed) {
  TeacherSet t;
  t.ids.reserve(size_t(rows * K));
  t.logprobs.reserve(size_t(rows * K));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::vector<float> z(static_cast<size_t>(K));
  std::unordered_set<int64_t> used;
  for (int64_t r = 0; r < rows; ++r) {
    used.clear();
    while (int64_t(used.size()) < K) {
      const int64_t id = int64_t(rng() % uint64_t(V));
      if (used.insert(id).second) t.ids.push_back(id);
    }
    for (auto& x : z) x = nd(rng);
    std::sort(z.begin(), z.end(), std::greater<float>());
    double s = 0;
    for (float x : z) s += std::exp(double(x - z[0]));
    const double lse = double(z[0]) + std::log(s / 0.8);  // 0.8 of the mass in the top K
    for (float x : z) t.logprobs.push_back(float(double(x) - lse));
  }
  t.mask.assign(size_t(rows * K), 1.0f);
  return t;
}

struct ModeResult {
  std::string name, tag;
  // The process's CPU time (all threads) per timed step: steadier than the wall clock on a busy host.
  double cpu_ms_per_step = 0;
  double ms_per_step = 0, tokens_per_s = 0, flops_per_token = 0, tflops = 0, mfu = 0;
  double peak_gib = -1, first_loss = 0, last_loss = 0;
  double state_mib = 0;  // AdamW's moments on this rank
  int64_t extra_warmup = 0;  // warm-up steps beyond --warmup until the step replayed
  std::string graph;         // how the timed steps ran
  std::string host;          // where the host's time per step went, where a mode measures it
};

// Model FLOPs per token (forward + backward = 3 × forward, 2 FLOPs per multiply-add): 6·P for every weight
// that takes part in a matmul — the blocks' projections and, for the lm head, V·d (dense modes) or K·d (the
// K-sparse mode computes only K logits per position) — plus the standard 12·layers·context·d_model for the
// attention scores and probs·V. Norm weights and the embedding lookup do no matmul and are left out.
double flops_per_token(const TransformerConfig& c, int64_t K, bool sparse) {
  const double d = double(c.d_model), hd = double(c.head_dim());
  const double attn_w = d * double(c.heads) * hd * 2 + d * double(c.kv_heads) * hd * 2;  // q, o; k, v
  const double mlp_w = 3 * d * double(c.d_ff);
  const double head = d * double(sparse ? K : c.vocab);
  const double P = double(c.layers) * (attn_w + mlp_w) + head;
  return 6 * P + 12 * double(c.layers) * double(c.context) * d;
}

TransformerConfig model_config(const Options& o) {
  TransformerConfig c;
  c.vocab = o.vocab;
  c.context = o.context;
  c.layers = o.layers;
  c.d_model = o.d_model;
  c.heads = o.heads;
  c.kv_heads = o.kv_heads;
  c.d_ff = o.d_ff;
  c.compute_dtype = dtype_of(o.compute);
  return c.resolved();
}

// --warmup steps, then (on CUDA with --graphs 1) more until the step replays from its CUDA Graph.
void warm_up(const Options& o, Backend& backend, bool cuda, ModeResult& r, const std::function<double()>& step,
             dist::ProcessGroup& pg) {
  for (int64_t s = 0; s < o.warmup; ++s) r.first_loss = step();
  if (cuda && o.graphs) {
    const size_t replays = cuda_graph_stats(backend).replays;
    const auto t0 = Clock::now();
    // Every rank runs as many steps (their collectives pair up): on while any rank still waits to replay.
    auto waiting = [&] {
      std::vector<int64_t> w{cuda_graph_stats(backend).replays == replays &&
                             std::chrono::duration<double>(Clock::now() - t0).count() < 30};
      if (pg.size() > 1) pg.host().all_reduce_sum(w);
      return w[0] > 0;
    };
    while (waiting()) {
      r.first_loss = step();
      ++r.extra_warmup;
    }
    const CudaGraphStats gs = cuda_graph_stats(backend);
    r.graph = gs.replays > replays ? "replayed (CUDA Graph)" : "eager (not recorded: " + gs.last_failure + ")";
  } else {
    r.graph = cuda ? "eager (--graphs 0)" : "eager";
  }
  backend.synchronize();
  pg.host().barrier();  // every rank starts the clock together
  if (cuda) cuda_reset_peak(backend);  // the timed steps' peak (and RETORT_OP_PROFILE table) only
}

// --steps timed steps; fills the rates from the FLOPs per token.
// drain: takes what the last step left in flight (a pipelined step's reads), inside the timed span.
void time_steps(const Options& o, Backend& backend, bool cuda, const DeviceInfo& dev, ModeResult& r,
                const std::function<double()>& step, int world, const std::function<void()>& drain = {}) {
  const std::clock_t c0 = std::clock();
  const auto t0 = Clock::now();
  for (int64_t s = 0; s < o.steps; ++s) {
    const double loss = step();
    if (o.warmup == 0 && s == 0) r.first_loss = loss;
    r.last_loss = loss;
  }
  if (drain) drain();
  backend.synchronize();
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  const double tokens = double(o.steps * o.batch * o.context * world);  // the world's
  r.ms_per_step = secs * 1e3 / double(o.steps);
  r.cpu_ms_per_step = double(std::clock() - c0) * 1e3 / CLOCKS_PER_SEC / double(o.steps);
  r.tokens_per_s = tokens / secs;
  r.tflops = r.flops_per_token * r.tokens_per_s / 1e12;
  // The world's FLOPs over the world's peak: every rank has one device like this one.
  const double peak = (o.peak_tflops > 0 ? o.peak_tflops : dev.peak_tflops) * double(world);
  r.mfu = peak > 0 ? r.tflops / peak : 0;
  if (cuda) r.peak_gib = double(cuda_memory_stats(backend).peak_bytes) / double(1ull << 30);
}

// The teacher's side of distillation as teacher-cache runs it: forward, top K, summed CE, top K to the host.
ModeResult run_teacher(const Options& o, Backend& backend, bool cuda, const DeviceInfo& dev,
                       dist::ProcessGroup& pg) {
  ModeResult r;
  r.name = "teacher forward (top-" + std::to_string(o.k) + " log-probs + summed CE, read back each batch)";
  r.tag = "teacher";
  if (cuda) cuda_reset_peak(backend);
  Context ctx(backend);
  const TransformerConfig c = model_config(o);
  Transformer model(ctx, c, 1);
  model.freeze_weights();  // as teacher-cache does
  const int64_t B = o.batch, T = o.context;
  Tensor* tokens = ctx.input(DType::I32, {B, T}, "tokens");
  Tensor* targets = ctx.input(DType::I32, {B * T}, "targets");
  // What teacher-cache builds: the lm head in chunks, one row pass each for the top K, the LSE and the nll.
  Tensor* hidden = model.hidden(ctx, tokens);
  FusedLinearOptions f;
  f.logits_budget = size_t(o.head_mib) << 20;
  const TopKLogprobsOutputs top = fused_linear_topk_logprobs(ctx, model.head_input(ctx, hidden),
                                                             model.head_weight(ctx), o.k, targets, {}, f);
  Tensor* nll = top.nll_sum;
  Graph g(ctx);
  g.forward(top.logprobs);
  std::vector<std::vector<int64_t>> sets;
  std::mt19937_64 rng(5);
  for (int i = 0; i < 2; ++i) {
    std::vector<int64_t> v(size_t(B * T));
    for (int64_t& t : v) t = int64_t(rng() % uint64_t(o.vocab));
    sets.push_back(std::move(v));
  }
  int64_t calls = 0;
  std::vector<float> lp(size_t(B * T * o.k));
  std::vector<int32_t> ids(size_t(B * T * o.k));
  // As teacher-cache pipelines it: a batch's reads are queued behind it, and the host takes them (copying
  // them out stands in for the cache's writes) after queuing the next batch.
  TensorRead in_lp, in_ids, in_nll;
  double last_loss = 0;
  const auto take_reads = [&] {
    if (!in_lp.valid()) return;
    std::memcpy(lp.data(), in_lp.wait(), lp.size() * sizeof(float));
    std::memcpy(ids.data(), in_ids.wait(), ids.size() * sizeof(int32_t));
    last_loss = double(static_cast<const float*>(in_nll.wait())[0]) / double(B * T);
    in_lp = TensorRead{};
    in_ids = TensorRead{};
    in_nll = TensorRead{};
  };
  // Host seconds per phase, summed over the steps: inputs, launch, waiting for the previous batch's reads
  // (the device runs this batch meanwhile), queuing this batch's reads.
  double phase[4] = {};
  const auto step = [&] {
    using clock = std::chrono::steady_clock;
    const std::vector<int64_t>& x = sets[size_t(calls++ % 2)];
    const auto t0 = clock::now();
    set_data_int(tokens, x);
    set_data_int(targets, x);
    const auto t1 = clock::now();
    g.compute();
    const auto t2 = clock::now();
    take_reads();
    const auto t3 = clock::now();
    in_lp = read_later(top.logprobs);
    in_ids = read_later(top.ids);
    in_nll = read_later(nll);
    const auto t4 = clock::now();
    const std::chrono::duration<double> d[4] = {t1 - t0, t2 - t1, t3 - t2, t4 - t3};
    for (int i = 0; i < 4; ++i) phase[i] += d[i].count();
    return last_loss;
  };
  // Forward only: a third of the training FLOPs per token.
  r.flops_per_token = flops_per_token(c, o.k, false) / 3;
  warm_up(o, backend, cuda, r, step, pg);
  take_reads();  // the warm-up's last batch, outside the timed span
  for (double& p : phase) p = 0;
  const int64_t before = calls;
  time_steps(o, backend, cuda, dev, r, step, pg.size(), take_reads);
  const double per = 1e3 / double(std::max<int64_t>(1, calls - before));
  // The forward alone, back to back with no reads between (what a pipelined caller would see).
  backend.synchronize();
  const auto d0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 5; ++i) g.compute();
  backend.synchronize();
  const double fwd_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - d0).count() / 5;
  char buf[260];
  std::snprintf(buf, sizeof buf,
                "inputs %.2f ms, launch %.2f, the previous batch's reads (wait + copy) %.2f, queuing reads %.2f; "
                "5 forwards back to back without reads: %.2f ms each",
                phase[0] * per, phase[1] * per, phase[2] * per, phase[3] * per, fwd_ms);
  r.host = buf;
  return r;
}

ModeResult run_mode(const Options& o, bool sparse, Backend& backend, bool cuda, const DeviceInfo& dev,
                    const ScratchShard& shard, const std::vector<TeacherSet>& teacher, dist::ProcessGroup& pg) {
  ModeResult r;
  r.name = sparse ? "K-sparse KD (w_hard 0, normalize_topk)"
                  : "KD + CE (dense head, w_hard " + std::to_string(o.w_hard).substr(0, 4) + ")";
  r.tag = sparse ? "sparse" : "dense";
  if (cuda) cuda_reset_peak(backend);
  Context ctx(backend);
  const TransformerConfig c = model_config(o);
  Transformer model(ctx, c, 1);
  TrainerOptions to;
  // Room for the warm-up that waits for the CUDA Graph recording: every timed step is one of the run's, so it
  // reads the next batch ahead as a real run does.
  to.steps = o.warmup + o.steps + 4000;
  to.warmup = 2;
  to.batch = o.batch;
  to.seq_len = o.context;
  to.lr = 3e-4f;
  to.min_lr = 3e-5f;
  to.group = &pg;
  to.bucket_dtype = o.bucket_dtype == "bf16" ? DType::BF16 : DType::F32;
  to.bucket_mib = o.bucket_mib;
  to.zero1 = o.zero1;
  DistillHead head;
  head.enabled = true;
  head.k = o.k;
  head.opts.w_hard = sparse ? 0.0f : o.w_hard;
  head.opts.w_soft = sparse ? 1.0f : 1.0f - o.w_hard;
  head.opts.normalize_topk = sparse;
  LmTrainer trainer(ctx, model, shard.paths, to, head);
  if (pg.size() > 1 && pg.rank() == 0)
    std::printf("gradient exchange: %d all-reduce bucket(s), %d embedding(s) gathered sparsely\n",
                trainer.grad_sync().buckets, trainer.grad_sync().sparse);
  for (const auto* moments : {&trainer.optimizer().m(), &trainer.optimizer().v()})
    for (const Tensor* t : *moments) r.state_mib += double(t->nbytes()) / (1 << 20);
  int64_t calls = 0;
  const auto fill = [&](const Batch&) {
    const TeacherSet& t = teacher[size_t(calls++ % int64_t(teacher.size()))];
    set_data_int(trainer.teacher_ids(), t.ids);
    set_data(trainer.teacher_logprobs(), t.logprobs);
    set_data(trainer.teacher_mask(), t.mask);
  };
  const auto step = [&] { return trainer.step(fill).loss; };
  r.flops_per_token = flops_per_token(model.config(), o.k, sparse);
  warm_up(o, backend, cuda, r, step, pg);
  time_steps(o, backend, cuda, dev, r, step, pg.size());
  return r;
}

// The time of summing every gradient once over the world with nothing to overlap: what a step would add if
// none of its all-reduce were hidden behind backward.
double allreduce_ms(const Options& o, const TransformerConfig& c, Backend& backend, dist::ProcessGroup& pg) {
  Context ctx(backend);
  Transformer model(ctx, c, 1);
  const DType wire = o.bucket_dtype == "bf16" ? DType::BF16 : DType::F32;
  Tensor* buf = ctx.tensor(wire, {model.parameter_count()}, "grads");
  Collective& comm = *pg.device();
  auto once = [&] {
    comm.all_reduce_sum(buf->data, buf->nelements(), wire);
    comm.join();
  };
  for (int i = 0; i < 3; ++i) once();
  backend.synchronize();
  pg.host().barrier();
  const int reps = 10;
  const auto t0 = Clock::now();
  for (int i = 0; i < reps; ++i) once();
  backend.synchronize();
  return std::chrono::duration<double>(Clock::now() - t0).count() * 1e3 / reps;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  try {
    std::string why;
    const bool cuda = !o.cpu && cuda_available(&why);
    if (!o.cpu && !cuda) usage_error("no usable GPU (" + why + "); run with --cpu for the tiny CPU shape");
    std::unique_ptr<Backend> backend;
    const dist::World world = dist::world_from_env();
    // Only rank 0 reports; the others' errors still reach stderr.
    if (world.rank != 0 && !std::freopen("/dev/null", "w", stdout)) return 1;
    CudaOptions co;
    co.graphs = o.graphs;
    if (cuda)
      backend = make_cuda_backend(world.local_rank, co);
    else
      backend = std::make_unique<CpuBackend>(o.threads);
    const DeviceInfo dev = device_info(cuda);
    dist::ProcessGroup pg(world, *backend);
    const double peak = o.peak_tflops > 0 ? o.peak_tflops : dev.peak_tflops;
    const int64_t N = o.batch * o.context;

    const TransformerConfig shown = model_config(o);
    std::printf("bench_distill_step | retort %s | device: %s (%s)\n", RETORT_VERSION, dev.name.c_str(),
                backend->name().c_str());
    if (pg.size() > 1)
      std::printf("world: %d ranks over %s (%s), per-rank batch %lld, gradient buckets %s %lld MiB%s\n",
                  pg.size(), pg.transport().c_str(), world.source.c_str(), (long long)o.batch,
                  o.bucket_dtype.c_str(), (long long)o.bucket_mib, o.zero1 ? ", ZeRO-1" : "");
    std::printf("student: %s, compute %s (f32 master weights)\n", shown.describe().c_str(),
                o.compute.c_str());
    std::printf(
        "step: batch %lld x %lld = %lld tokens, offline top-K K = %lld, AdamW + clip 1.0; %lld warmup + "
        "%lld timed steps per mode\n",
        (long long)o.batch, (long long)o.context, (long long)N, (long long)o.k, (long long)o.warmup,
        (long long)o.steps);
    if (o.peak_tflops > 0)
      std::printf("peak for MFU: %.1f TFLOP/s (--peak-tflops)\n", peak);
    else if (peak > 0)
      std::printf(
          "peak for MFU: %.1f TFLOP/s, the dense bf16 tensor-core peak of '%s' (override: --peak-tflops)\n",
          peak, dev.name.c_str());
    else
      std::printf("peak for MFU: unknown for this device (give --peak-tflops); MFU not reported\n");
    std::fflush(stdout);

    // Enough tokens for a few epochs' worth of distinct windows; teacher sets rotate so no two consecutive
    // steps copy the same data.
    const ScratchShard shard(std::max<int64_t>(N * 4, (o.context + 1) * o.batch * 2), o.vocab, 7);
    std::vector<TeacherSet> teacher;
    for (uint64_t s = 0; s < 2; ++s) teacher.push_back(make_teacher(N, o.k, o.vocab, 100 + s));

    std::vector<ModeResult> results;
    if (o.mode == "teacher") results.push_back(run_teacher(o, *backend, cuda, dev, pg));
    if (o.mode == "both" || o.mode == "dense")
      results.push_back(run_mode(o, false, *backend, cuda, dev, shard, teacher, pg));
    if (o.mode == "both" || o.mode == "sparse")
      results.push_back(run_mode(o, true, *backend, cuda, dev, shard, teacher, pg));
    for (const ModeResult& r : results) {
      std::printf("%s:\n", r.name.c_str());
      std::printf("  %.0f tokens/s, %.2f ms/step; loss %.4f (last warmup step) -> %.4f (last timed step)\n",
                  r.tokens_per_s, r.ms_per_step, r.first_loss, r.last_loss);
      std::printf(
          "  model FLOPs/token %.4g (6·P + 12·layers·context·d_model, the lm head in P as %s·d_model), "
          "achieved %.3g TFLOP/s",
          r.flops_per_token, r.tag == "sparse" ? "K" : "vocab", r.tflops);
      if (peak > 0) std::printf(", MFU %.1f%%", 100 * r.mfu);
      std::printf("\n");
      if (r.peak_gib >= 0) std::printf("  peak device memory %.2f GiB (retort's allocator)\n", r.peak_gib);
      std::printf("  optimizer state %.1f MiB on rank 0\n", r.state_mib);
      std::printf("  launches: %s, after %lld extra warm-up steps\n", r.graph.c_str(), (long long)r.extra_warmup);
      if (!r.host.empty()) std::printf("  host per step: %s\n", r.host.c_str());
    }
    std::string line = "summary: " + dev.name + (pg.size() > 1 ? " x" + std::to_string(pg.size()) : "") + ", L" + std::to_string(o.layers) + " d" +
                       std::to_string(o.d_model) + " T" + std::to_string(o.context) + " V" +
                       std::to_string(o.vocab) + " B" + std::to_string(o.batch) + " K" + std::to_string(o.k) +
                       " " + o.compute;
    for (const ModeResult& r : results) {
      char buf[200];
      std::snprintf(buf, sizeof buf, " | %s %.0f tok/s %.1f ms/step (cpu %.1f ms/step)", r.tag.c_str(),
                    r.tokens_per_s, r.ms_per_step, r.cpu_ms_per_step);
      line += buf;
      if (peak > 0) {
        std::snprintf(buf, sizeof buf, " MFU %.1f%%", 100 * r.mfu);
        line += buf;
      }
      if (r.peak_gib >= 0) {
        std::snprintf(buf, sizeof buf, " %.1f GiB", r.peak_gib);
        line += buf;
      }
      std::snprintf(buf, sizeof buf, " state %.1f MiB", r.state_mib);
      line += buf;
    }
    if (pg.size() > 1) {
      char buf[200];
      std::snprintf(buf, sizeof buf, " | allreduce alone %.2f ms", allreduce_ms(o, shown, *backend, pg));
      line += buf;
    }
    std::printf("%s\n", line.c_str());
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_distill_step: %s\n", e.what());
    return 1;
  }
}
