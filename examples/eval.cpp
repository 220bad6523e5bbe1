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
trained with (or --shards, --split): the first --eval-windows windows of the model's context (or --seq)
tokens, stride = the window, in stream order, --batch windows per forward. This is the validation loss
train and distill report (same windows, same default), so the numbers compare. Prints the loss in
nats/token, bits/token, the perplexity, and a last line "val_loss=<nats>" for scripts.

Exit status: 0 done, 1 failed (a bad file, a vocabulary mismatch, out of memory), 2 a bad command line.

Usage: eval --model PATH [options]

  --model PATH        checkpoint, GGUF file or Hugging Face directory (required; --ckpt is the same)
  --shards PREFIX     token shards (default: those recorded in a checkpoint; required for a pretrained
                      model, whose tokenizer must be the one they were made with)
  --split NAME        val or train (default val)
  --seq N             window length (default: a checkpoint's context; 1024 for a pretrained model)
  --batch N           windows per forward (default 16; the loss does not depend on it)
  --eval-windows N    windows measured, 0 for all (default 256, as in train and distill)
  --device D          auto, cpu or cuda (default auto)
  --threads N         CPU threads (default 0: all cores)
  --compute-dtype D   auto, f32, bf16 or f16: the dtype the matmuls run in (default auto: bf16 on CUDA, f32
                      on the CPU)
  --help              this text
)";

int run(Args& a, int argc, char** argv, std::string& ckpt, int64_t& batch) {
  std::string shards, split = "val", device = "auto", compute = "auto";
  int64_t seq = 0, windows = kValidationWindows;
  int threads = 0;
  a.add("--ckpt", &ckpt), a.add("--model", &ckpt), a.add("--shards", &shards), a.add("--split", &split),
      a.add("--seq", &seq);
  a.add("--batch", &batch), a.add("--eval-windows", &windows), a.add("--device", &device);
  a.add("--threads", &threads), a.add("--compute-dtype", &compute);
  a.parse(argc, argv);
  a.check(!ckpt.empty(), "--model is required");
  a.check(batch >= 1 && batch <= (int64_t(1) << 20), "--batch must be in [1, 2^20]");
  a.check(seq >= 0, "--seq must be >= 1 (0: the model's context)");
  a.check(windows >= 0, "--eval-windows must be >= 0 (0: all)");
  a.check(split == "val" || split == "train", "--split is val or train, got '" + split + "'");
  a.check_machine(threads, device);
  check_compute_dtype(a, compute);
  const PretrainedModel file = PretrainedModel::open(ckpt);
  const Checkpoint* ck = file.checkpoint();
  if (shards.empty() && ck) shards = ck->meta("shards");
  if (shards.empty()) throw UsageError(ckpt + " is a pretrained model: give --shards PREFIX");
  const auto paths = shards_for(shards, split);
  if (seq <= 0) seq = ck ? file.config().context : std::min<int64_t>(1024, file.config().context);
  a.check(seq <= file.config().context, "--seq " + std::to_string(seq) + " exceeds the model's context " +
                                            std::to_string(file.config().context));
  // The shards' ids must be this model's: a vocabulary of another size is a mismatch, not a loss.
  const int64_t shard_vocab = shard_vocab_bound(paths);
  RT_CHECK(shard_vocab <= file.config().vocab, "vocabulary mismatch: the shards ", shards, "_", split,
           "_* hold token id ", shard_vocab - 1, ", the model ", ckpt, " has a vocabulary of ",
           file.config().vocab, " (shards made with another tokenizer?)");
  Device dev = pick_device(device, threads);
  Context ctx(*dev.backend);
  RunModel rm = load_run_model(file, ctx, pick_compute_dtype(compute, dev), seq);
  check_shards_tokenizer(shards, rm.codec, ckpt);
  Transformer& model = *rm.model;
  model.freeze_weights();  // forward only: its 16-bit weights made once
  const TransformerConfig& cfg = model.config();
  const auto t0 = Clock::now();
  LmEvaluator ev(ctx, model, paths, batch, seq, windows);
  const double loss = ev.run();
  const double secs = seconds_since(t0);
  if (!dev.note.empty()) std::printf("%s\n", dev.note.c_str());
  std::printf("eval %s on %s_%s_*, %lld windows of %lld tokens, %s on %s, compute %s\n",
              rm.describe().c_str(), shards.c_str(), split.c_str(), (long long)ev.windows(), (long long)seq,
              duration(secs).c_str(), dev.desc.c_str(), compute_desc(cfg.compute_dtype).c_str());
  std::printf("  loss %.4f nats/token, %.4f bits/token, perplexity %.3f\n", loss, loss / std::log(2.0),
              std::exp(loss));
  std::printf("val_loss=%.6f\n", loss);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a("eval", kHelp);
  std::string ckpt;
  int64_t batch = 16;
  return run_main(
      "eval", [&] { return run(a, argc, argv, ckpt, batch); },
      [&] { return memory_hint(PretrainedModel::open(ckpt).config(), false, batch); });
}
