// eval: the validation loss and perplexity of a model (a checkpoint, a GGUF file or a Hugging Face directory)
// on token shards.
#include <cmath>
#include <cstdio>

#include "common.h"

using namespace ex;

namespace {

const char* kHelp = R"(eval - validation loss and perplexity of a model.

Loads a checkpoint written by train or distill, or a pretrained model (a GGUF file or a Hugging Face
directory), and measures its mean next-token cross-entropy on the validation shards a checkpoint was
trained with (or --shards, --split): windows of the model's context (or --seq),
stride = the window, in stream order, --batch windows per forward, all of them or the first --max-batches
batches. Every program measures validation the same way, so the numbers compare. Prints the loss in
nats/token, bits/token, the perplexity, and a last line "val_loss=<nats>" for scripts.

Usage: eval --model PATH [options]

  --model PATH        checkpoint, GGUF file or Hugging Face directory (required; --ckpt is the same)
  --shards PREFIX     token shards (default: those recorded in a checkpoint; required for a pretrained
                      model, whose tokenizer must be the one they were made with)
  --split NAME        val or train (default val)
  --seq N             window length (default: a checkpoint's context; 1024 for a pretrained model)
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
  a.add("--ckpt", &ckpt), a.add("--model", &ckpt), a.add("--shards", &shards), a.add("--split", &split),
      a.add("--seq", &seq);
  a.add("--batch", &batch), a.add("--max-batches", &max_batches), a.add("--device", &device);
  a.add("--threads", &threads), a.add("--compute-dtype", &compute);
  a.parse(argc, argv);
  if (ckpt.empty()) a.fail("--model is required");
  if (batch < 1) a.fail("--batch must be >= 1");
  try {
    const PretrainedModel file = PretrainedModel::open(ckpt);
    const Checkpoint* ck = file.checkpoint();
    if (shards.empty() && ck) shards = ck->meta("shards");
    RT_CHECK(!shards.empty(), "eval: ", ckpt, " is a pretrained model: give --shards PREFIX");
    const auto paths = shards_for(shards, split, "eval");
    if (seq <= 0) seq = ck ? file.config().context : std::min<int64_t>(1024, file.config().context);
    RT_CHECK(seq <= file.config().context, "eval: --seq ", seq, " exceeds the model's context ",
             file.config().context);
    Device dev = pick_device(device, threads, "eval");
    Context ctx(*dev.backend);
    RunModel rm = load_run_model(file, ctx, pick_compute_dtype(compute, dev, "eval"), seq);
    Transformer& model = *rm.model;
    const TransformerConfig& cfg = model.config();
    // The shards' ids must be this model's: a vocabulary of another size is a mismatch, not a loss.
    const int64_t shard_vocab = shard_vocab_bound(paths);
    RT_CHECK(shard_vocab <= cfg.vocab, "eval: the shards ", shards, " hold token id ", shard_vocab - 1,
             ", outside the model's vocabulary of ", cfg.vocab, " (made with another tokenizer?)");
    const auto t0 = Clock::now();
    LmEvaluator ev(ctx, model, paths, batch, seq, max_batches);
    const double loss = ev.run();
    const double secs = seconds_since(t0);
    std::printf("eval %s on %s_%s_*, %lld tokens in windows of %lld, %s on %s, compute %s\n",
                rm.describe().c_str(), shards.c_str(), split.c_str(), (long long)ev.tokens_per_run(),
                (long long)seq, duration(secs).c_str(), dev.desc.c_str(),
                compute_desc(cfg.compute_dtype).c_str());
    std::printf("  loss %.4f nats/token, %.4f bits/token, perplexity %.3f\n", loss, loss / std::log(2.0),
                std::exp(loss));
    std::printf("val_loss=%.6f\n", loss);
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "eval: %s\n", e.what());
    return 1;
  }
}
