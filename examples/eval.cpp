// eval: the validation loss and perplexity of a checkpoint on token shards.
#include <cmath>
#include <cstdio>

#include "common.h"

using namespace ex;

namespace {

const char* kHelp = R"(eval - validation loss and perplexity of a checkpoint.

Loads a checkpoint written by train or distill and measures its mean next-token cross-entropy on the
validation shards it was trained with (or --shards, --split): windows of the model's context (or --seq),
stride = the window, in stream order, --batch windows per forward, all of them or the first --max-batches
batches. Every program measures validation the same way, so the numbers compare. Prints the loss in
nats/token, bits/token, the perplexity, and a last line "val_loss=<nats>" for scripts.

Usage: eval --ckpt PATH [options]

  --ckpt PATH         checkpoint (required)
  --shards PREFIX     token shards (default: those recorded in the checkpoint)
  --split NAME        val or train (default val)
  --seq N             window length (default: the model's context)
  --batch N           windows per forward (default 16)
  --max-batches N     0 for every window (default 0)
  --device D          auto, cpu or cuda (default auto)
  --threads N         CPU threads (default 0: all cores)
  --compute-dtype D   auto, f32, bf16 or f16: the dtype the matmuls run in (default auto: bf16 on CUDA, f32
                      on the CPU)
  --help              this text
)";

}  // namespace

int main(int argc, char** argv) {
  std::string ckpt, shards, split = "val", device = "auto", compute = "auto";
  int64_t seq = 0, batch = 16, max_batches = 0;
  int threads = 0;
  Args a("eval", kHelp);
  a.add("--ckpt", &ckpt), a.add("--shards", &shards), a.add("--split", &split), a.add("--seq", &seq);
  a.add("--batch", &batch), a.add("--max-batches", &max_batches), a.add("--device", &device);
  a.add("--threads", &threads), a.add("--compute-dtype", &compute);
  a.parse(argc, argv);
  if (ckpt.empty()) a.fail("--ckpt is required");
  if (batch < 1) a.fail("--batch must be >= 1");
  try {
    const Checkpoint ck(ckpt);
    if (shards.empty()) shards = ck.meta("shards");
    const auto paths = shards_for(shards, split, "eval");
    if (seq <= 0) seq = ck.config().context;
    RT_CHECK(seq <= ck.config().context, "eval: --seq ", seq, " exceeds the model's context ",
             ck.config().context);
    Device dev = pick_device(device, threads, "eval");
    TransformerConfig cfg = ck.config();
    cfg.compute_dtype = pick_compute_dtype(compute, dev, "eval");
    Context ctx(*dev.backend);
    Transformer model(ctx, cfg);
    ck.load_model(model);
    const auto t0 = Clock::now();
    LmEvaluator ev(ctx, model, paths, batch, seq, max_batches);
    const double loss = ev.run();
    const double secs = seconds_since(t0);
    std::printf("eval %s (%s, step %lld, %s) on %s_%s_*, %lld tokens, %s on %s, compute %s\n", ckpt.c_str(),
                ck.config().describe().c_str(), (long long)ck.state().step, ck.meta("program", "?").c_str(),
                shards.c_str(), split.c_str(), (long long)ev.tokens_per_run(), duration(secs).c_str(),
                dev.desc.c_str(), compute_desc(cfg.compute_dtype).c_str());
    std::printf("  loss %.4f nats/token, %.4f bits/token, perplexity %.3f\n", loss, loss / std::log(2.0),
                std::exp(loss));
    std::printf("val_loss=%.6f\n", loss);
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "eval: %s\n", e.what());
    return 1;
  }
}
