// teacher-cache: runs a teacher checkpoint over the training shards and writes its top-K next-token
// candidates per position to a teacher top-K cache (src/io/topk_cache.h), which distill reads.
#include <cmath>
#include <cstdio>

#include "common.h"

using namespace ex;

namespace {

const char* kHelp =
    R"(teacher-cache - write a teacher's top-K next-token distribution for every position of the shards.

Loads the teacher checkpoint (written by train), reads the token shards it was trained on (or --shards), and
runs the teacher over them window by window in stream order: windows of the teacher's context, stride = the
context, the batch loader's windows exactly. For each position p it keeps the K most likely next tokens and
their log-probabilities, log softmax(teacher logits at p), best first, and writes them to
"<out>_00000.topk", ... — checksummed shards that distill memory-maps. Position p holds the teacher's
distribution for token p+1, the one predicted from p: a training batch row starting at s reads [s, s+T) and
lines up with its targets. Every shard is written atomically.

Cost: one teacher forward per position, and on disk per position K·4 bytes of ids, K·2 (bf16) or K·4 (f32)
of logprobs and K valid flags.

Usage: teacher-cache --teacher CKPT [options]

  --teacher PATH      teacher checkpoint (required)
  --k N               candidates per position (default 16)
  --out PREFIX        cache prefix (default: <shards>.topk<K>)
  --shards PREFIX     token shards (default: the ones recorded in the teacher checkpoint)
  --split NAME        train or val (default train)
  --dtype D           bf16 or f32 logprobs (default bf16)
  --batch N           windows per forward (default 16)
  --device D          auto, cpu or cuda (default auto)
  --threads N         CPU threads (default 0: all cores)
  --help              this text

Example: teacher-cache --teacher build/demo/teacher.safetensors --k 32
)";

}  // namespace

int main(int argc, char** argv) {
  std::string teacher, out, shards, split = "train", dtype = "bf16", device = "auto";
  int64_t k = 16, batch = 16;
  int threads = 0;
  Args a("teacher-cache", kHelp);
  a.add("--teacher", &teacher), a.add("--k", &k), a.add("--out", &out), a.add("--shards", &shards);
  a.add("--split", &split), a.add("--dtype", &dtype), a.add("--batch", &batch), a.add("--device", &device);
  a.add("--threads", &threads);
  a.parse(argc, argv);
  if (teacher.empty()) a.fail("--teacher is required");
  if (dtype != "bf16" && dtype != "f32") a.fail("--dtype is bf16 or f32");
  if (batch < 1) a.fail("--batch must be >= 1");
  try {
    const Checkpoint ck(teacher);
    const TransformerConfig cfg = ck.config();
    RT_CHECK(k >= 1 && k <= cfg.vocab, "teacher-cache: --k ", k, " must be in [1, vocab ", cfg.vocab, "]");
    if (shards.empty()) shards = ck.meta("shards");
    if (out.empty()) out = shards + ".topk" + std::to_string(k);
    const std::vector<std::string> paths = shards_for(shards, split, "teacher-cache");

    Device dev = pick_device(device, threads, "teacher-cache");
    Context ctx(*dev.backend);
    Transformer model(ctx, cfg);
    ck.load_model(model);
    const int64_t T = cfg.context, V = cfg.vocab;
    BatchLoaderOptions lo;
    lo.batch = 1;
    lo.seq_len = T;
    lo.shuffle = false;
    BatchLoader probe(paths, lo);
    const int64_t windows = probe.windows();
    const int64_t B = std::min(batch, windows);
    lo.batch = B;
    BatchLoader loader(paths, lo);
    Tensor* tokens = ctx.input(DType::I32, {B, T}, "tokens");
    Tensor* logits = model.forward(ctx, tokens);
    logits->flags |= kOutput;
    Graph g(ctx);
    g.forward(logits);

    TopKCacheSpec spec;
    spec.vocab_size = V;
    spec.k = k;
    spec.dtype = dtype == "bf16" ? LogprobDType::BF16 : LogprobDType::F32;
    TopKCacheWriter writer(out, spec);
    std::printf("retort %s | device: %s\nteacher: %s (%s, step %lld)\n", RETORT_VERSION, dev.desc.c_str(),
                teacher.c_str(), cfg.describe().c_str(), (long long)ck.state().step);
    std::printf("caching top-%lld (%s) for %lld windows x %lld positions of %s_%s_* -> %s_*.topk\n",
                (long long)k, dtype.c_str(), (long long)windows, (long long)T, shards.c_str(), split.c_str(),
                out.c_str());
    std::fflush(stdout);

    const int64_t steps = (windows + B - 1) / B;
    Progress progress(steps, B * T, std::max<int64_t>(1, steps / 10));
    std::vector<int32_t> x(size_t(B * T)), y(size_t(B * T)), ids(size_t(T * k));
    std::vector<int64_t> starts(static_cast<size_t>(B));
    std::vector<float> lp(size_t(T * k));
    double nll = 0;
    int64_t done = 0;
    for (int64_t s = 1; s <= steps; ++s) {
      loader.next(x.data(), y.data(), starts.data());
      set_data_int(tokens, std::vector<int64_t>(x.begin(), x.end()));
      g.compute();
      const std::vector<float> z = get_data(logits);
      // The last batch wraps into the next epoch: only the windows not cached yet count.
      const int64_t rows = std::min(B, windows - done);
      for (int64_t b = 0; b < rows; ++b) {
        topk_logprobs(z.data() + b * T * V, T, V, k, ids.data(), lp.data());
        writer.write(starts[size_t(b)], T, ids.data(), lp.data());
        // The teacher's own loss on these windows, as a sanity number in the summary.
        for (int64_t t = 0; t < T; ++t) {
          const float* row = z.data() + (b * T + t) * V;
          const float mx = *std::max_element(row, row + V);
          double se = 0;
          for (int64_t v = 0; v < V; ++v) se += std::exp(double(row[v] - mx));
          nll += double(mx) + std::log(se) - double(row[y[size_t(b * T + t)]]);
        }
      }
      done += rows;
      progress.update(s, "windows " + std::to_string(done) + "/" + std::to_string(windows));
    }
    const std::vector<std::string> written = writer.finish();
    const TopKCache cache = TopKCache::open(out);
    const int64_t rec = k * 4 + k * (dtype == "bf16" ? 2 : 4) + k;
    std::printf("\nsummary: %lld positions in %s (%.0f tok/s) on %s\n", (long long)cache.positions(),
                duration(progress.elapsed()).c_str(), progress.tokens_per_second(), dev.desc.c_str());
    std::printf("  %zu cache shard(s), about %.1f MiB; the teacher's loss on them %.4f nats/token\n",
                written.size(), double(cache.positions() * ((rec + 3) / 4 * 4)) / (1 << 20),
                nll / double(done * T));
    std::printf("cache: %s\n", out.c_str());
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "\nteacher-cache: %s\n", e.what());
    return 1;
  }
}
