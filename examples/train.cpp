// train: tokenizes a text file into shards and trains a Llama-style language model on them, with
// checkpoints that resume bit-for-bit. The step itself is retort::LmTrainer (src/nn/lm.h). --help tells all.
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "common.h"

using namespace ex;

namespace {

const std::string kHelp =
    std::string(R"(train - tokenize a text, train a small language model on it with retort, save it.

1. Tokenizes --data with --tokenizer and writes token shards "<shards>_train_00000.bin" and
   "<shards>_val_00000.bin" (the last --val-frac of the tokens is held out for validation):
     bytes   every byte is a token (vocabulary 256, nothing to train)
     bpe     a byte-level BPE vocabulary of --vocab tokens, trained on the data and saved as
             "<shards>.tokenizer" (reused when it exists with that size)
     gpt2    GPT-2's vocabulary (50257 tokens) from the bundled data
     PATH    a pretrained model's own (a GGUF file or a Hugging Face directory): a student that shares
             its teacher's vocabulary
   Shards that already hold the same text under the same tokenizer are reused.
2. Trains a Llama-style decoder (RMSNorm, rotary positions, causal self-attention, SwiGLU MLP, tied
   embedding) on shuffled windows of --context tokens, --batch windows per step, with AdamW, a cosine
   learning-rate schedule with warmup and gradient-norm clipping. The loss is a fused linear cross-entropy:
   the lm head and the loss are one graph node that never holds the [tokens, vocabulary] logits.
3. Prints a progress bar (loss, learning rate, tokens/s, ETA), the validation loss before, every
   --eval-every steps and after, a sample continuing a held-out prompt, and a summary.
4. With --save PATH writes a checkpoint (safetensors: parameters, AdamW moments, step, loader position,
   model config, tokenizer identity and shard prefix) every --save-every steps and at the end, atomically:
   a run killed while saving leaves the previous checkpoint intact. --resume PATH continues a run from
   such a checkpoint exactly where it stopped: on the CPU the parameters come out bit-for-bit equal to an
   uninterrupted run's. eval, generate, teacher-cache and distill read these checkpoints.

Usage: train [options]

Data
  --data PATH         text to train on (default: the bundled King James Bible, )" RETORT_DATA_DIR R"(/kjv.txt)
  --max-bytes N       use only the first N bytes of the text, 0 for all (default 0)
  --tokenizer KIND    bytes, bpe, gpt2, or a model file / directory (default bytes)
  --vocab N           BPE vocabulary size with --tokenizer bpe (default 1024)
  --shards PREFIX     where the shards go (default: the data path without .txt, plus .<tokenizer>)
  --val-frac F        fraction of the tokens held out (default 0.05)
Model
  --layers N          transformer blocks (default 4)
  --d-model N         residual width (default 128)
  --heads N           attention heads (default 4); d-model / heads must be even
  --kv-heads N        key/value heads (grouped-query attention); must divide heads (default: heads)
  --d-ff N            SwiGLU hidden width (default: 8/3 d-model rounded up to a multiple of 32)
  --context N         tokens per window and the model's context (default 128)
Training
  --steps N           optimizer steps (default 300)
  --batch N           windows per step (default 16)
  --lr F              peak learning rate (default 3e-3); cosine decay to lr/10
  --warmup N          linear warmup steps (default: steps/20)
  --weight-decay F    AdamW decoupled weight decay (default 0.1)
  --clip F            global gradient-norm clip, 0 for none (default 1.0)
  --seed N            seeds the init and the batch order (default 1)
Checkpoints
  --save PATH         write a checkpoint here (at the end, and every --save-every steps)
  --save-every N      0 for only at the end (default 0)
  --resume PATH       continue the run saved in PATH (same model, data and seed; --steps is the total)
Machine
  --device D          auto, cpu or cuda (default auto: cuda when a GPU is usable)
  --threads N         CPU threads (default 0: all cores)
  --compute-dtype D   auto, f32, bf16 or f16: the dtype every matmul runs in; the weights stay f32
                      (default auto: bf16 on CUDA, f32 on the CPU)
Output
  --log-every N       progress line every N steps (default: steps/15)
  --eval-every N      validation every N steps, 0 for before and after only (default: steps/3)
  --eval-batches N    validation batches (default 16)
  --sample-len N      tokens to generate at the end, 0 for none (default 300)
  --temperature F     sampling temperature (default 0.8)
  --prompt TEXT       prompt for the sample (default: a line of the held-out text)
  --help              this text

Example: train --tokenizer bpe --vocab 2048 --steps 1000 --save build/teacher.safetensors
)");

struct Options {
  std::string data = RETORT_DATA_DIR "/kjv.txt", tokenizer = "bytes", shards, save, resume, prompt;
  int64_t max_bytes = 0, vocab = 1024, save_every = 0, log_every = -1, eval_every = -1, eval_batches = 16;
  int64_t sample_len = 300;
  double val_frac = 0.05;
  TransformerConfig model;
  TrainerOptions train;
  float temperature = 0.8f;
  std::string device = "auto", compute = "auto";
  int threads = 0;
};

}  // namespace

int main(int argc, char** argv) {
  Options o;
  o.train.warmup = -1;
  Args a("train", kHelp);
  a.add("--data", &o.data), a.add("--max-bytes", &o.max_bytes), a.add("--tokenizer", &o.tokenizer);
  a.add("--vocab", &o.vocab), a.add("--shards", &o.shards), a.add("--val-frac", &o.val_frac);
  a.add("--layers", &o.model.layers), a.add("--d-model", &o.model.d_model), a.add("--heads", &o.model.heads);
  a.add("--kv-heads", &o.model.kv_heads), a.add("--d-ff", &o.model.d_ff),
      a.add("--context", &o.model.context);
  a.add("--steps", &o.train.steps), a.add("--batch", &o.train.batch), a.add("--lr", &o.train.lr);
  a.add("--warmup", &o.train.warmup), a.add("--weight-decay", &o.train.weight_decay);
  a.add("--clip", &o.train.clip), a.add("--seed", &o.train.seed);
  a.add("--save", &o.save), a.add("--save-every", &o.save_every), a.add("--resume", &o.resume);
  a.add("--device", &o.device), a.add("--threads", &o.threads), a.add("--compute-dtype", &o.compute);
  a.add("--log-every", &o.log_every), a.add("--eval-every", &o.eval_every),
      a.add("--eval-batches", &o.eval_batches);
  a.add("--sample-len", &o.sample_len), a.add("--temperature", &o.temperature), a.add("--prompt", &o.prompt);
  a.parse(argc, argv);
  if (o.train.steps < 1) a.fail("--steps must be >= 1");
  if (o.train.batch < 1) a.fail("--batch must be >= 1");
  if (o.val_frac <= 0 || o.val_frac >= 0.5) a.fail("--val-frac must be in (0, 0.5)");
  if (o.train.lr <= 0) a.fail("--lr must be > 0");
  const bool model_tokenizer = o.tokenizer != "bytes" && o.tokenizer != "bpe" && o.tokenizer != "gpt2";
  if (model_tokenizer && !std::filesystem::exists(o.tokenizer))
    a.fail("--tokenizer is bytes, bpe, gpt2 or a model file or directory; " + o.tokenizer +
           " is none of them");
  if (o.train.warmup < 0) o.train.warmup = std::max<int64_t>(1, o.train.steps / 20);
  if (o.log_every <= 0) o.log_every = std::max<int64_t>(1, o.train.steps / 15);
  if (o.eval_every < 0) o.eval_every = std::max<int64_t>(1, o.train.steps / 3);
  o.train.min_lr = o.train.lr / 10;
  try {
    const auto t_start = Clock::now();
    // ---- tokenizer and shards ---------------------------------------------------------------------------
    DataOptions data{o.data, o.max_bytes, o.val_frac, o.shards};
    TextCodec codec = TextCodec::bytes();
    if (o.tokenizer == "gpt2") {
      codec = TextCodec::gpt2(RETORT_DATA_DIR);
    } else if (model_tokenizer) {
      codec = TextCodec::model(o.tokenizer);
    } else if (o.tokenizer == "bpe") {
      if (data.shards.empty()) {
        std::string base = o.data;
        if (base.size() > 4 && base.substr(base.size() - 4) == ".txt") base.resize(base.size() - 4);
        data.shards = base + ".bpe" + std::to_string(o.vocab);
        if (o.max_bytes > 0) data.shards += ".first" + std::to_string(o.max_bytes);
      }
      const std::string tok_path = data.shards + ".tokenizer";
      bool reuse = false;
      if (std::filesystem::exists(tok_path)) {
        codec = TextCodec::bpe_file(tok_path);
        reuse = codec.vocab() == o.vocab;
      }
      if (!reuse) {
        std::string text = io::read_text_file(o.data);
        if (o.max_bytes > 0 && int64_t(text.size()) > o.max_bytes) text.resize(size_t(o.max_bytes));
        std::printf("training a BPE vocabulary of %lld tokens on %zu bytes...\n", (long long)o.vocab,
                    text.size());
        std::fflush(stdout);
        BpeTrainOptions bo;
        bo.vocab_size = o.vocab;
        // Only the training part: the held-out text must stay unseen.
        Tokenizer::train(std::string_view(text).substr(0, size_t(double(text.size()) * (1 - o.val_frac))), bo)
            .save(tok_path);
        codec = TextCodec::bpe_file(tok_path);
      }
    }
    const ShardSet set = prepare_shards(data, codec, "train");
    o.shards = data.shards;
    o.model.vocab = codec.vocab();

    // ---- model ------------------------------------------------------------------------------------------
    Device dev = pick_device(o.device, o.threads, "train");
    o.model.compute_dtype = pick_compute_dtype(o.compute, dev, "train");
    Context ctx(*dev.backend);
    Transformer model(ctx, o.model, o.train.seed);
    const TransformerConfig& cfg = model.config();
    o.train.seq_len = cfg.context;
    LmTrainer trainer(ctx, model, set.train, o.train);
    LmEvaluator evaluator(ctx, model, set.val, o.train.batch, cfg.context, o.eval_batches);
    Sampler sampler(ctx, model);
    if (!o.resume.empty()) {
      const Checkpoint ck(o.resume);
      trainer.resume(ck);
      std::printf("resumed from %s at step %lld\n", o.resume.c_str(), (long long)trainer.steps_done());
    }

    std::printf("retort %s | device: %s | compute: %s\n", RETORT_VERSION, dev.desc.c_str(),
                compute_desc(cfg.compute_dtype).c_str());
    std::printf("model: %s, %.2fM parameters\n", cfg.describe().c_str(),
                double(model.parameter_count()) / 1e6);
    std::printf(
        "training: %lld steps x %lld windows x %lld tokens, lr %.2g (warmup %lld, cosine to %.2g), AdamW "
        "wd %.2g, clip %.2g, seed %llu\n",
        (long long)o.train.steps, (long long)o.train.batch, (long long)cfg.context, double(o.train.lr),
        (long long)o.train.warmup, double(o.train.min_lr), double(o.train.weight_decay), double(o.train.clip),
        (unsigned long long)o.train.seed);
    std::fflush(stdout);

    std::map<std::string, std::string> meta = codec.metadata();
    meta["shards"] = o.shards;
    meta["program"] = "train";
    meta["compute_dtype"] = dtype_name(cfg.compute_dtype);  // informative: checkpoints load in any
    auto save = [&](double val) {
      if (o.save.empty()) return;
      meta["val_loss"] = std::to_string(val);
      trainer.save(o.save, meta);
    };
    auto report_val = [&](int64_t step, double v) {
      std::printf("  validation @ step %lld: loss %.4f nats/token, perplexity %.2f\n", (long long)step, v,
                  std::exp(v));
      std::fflush(stdout);
    };
    const double val_before = evaluator.run();
    report_val(trainer.steps_done(), val_before);
    double val_after = val_before;

    // ---- training loop ----------------------------------------------------------------------------------
    const int64_t first = trainer.steps_done();
    Progress progress(o.train.steps, o.train.batch * cfg.context, o.log_every, first);
    std::vector<double> losses;
    for (int64_t step = first + 1; step <= o.train.steps; ++step) {
      const auto r = trainer.step();
      losses.push_back(r.loss);
      char f[128];
      std::snprintf(f, sizeof f, "loss %.4f | lr %.2e | |g| %.2f", r.loss, double(r.lr), r.grad_norm);
      progress.update(step, f);
      if (o.eval_every > 0 && step % o.eval_every == 0 && step != o.train.steps) {
        val_after = evaluator.run();
        report_val(step, val_after);
      }
      if (o.save_every > 0 && step % o.save_every == 0 && step != o.train.steps) save(val_after);
    }
    const double train_seconds = progress.elapsed();
    val_after = evaluator.run();
    report_val(trainer.steps_done(), val_after);
    save(val_after);
    if (!o.save.empty()) std::printf("checkpoint: %s\n", o.save.c_str());

    // ---- sample -----------------------------------------------------------------------------------------
    if (o.sample_len > 0) {
      std::string prompt = o.prompt;
      if (!a.given("--prompt")) prompt = heldout_prompt(set.val, codec);
      const auto out =
          sampler.generate(codec.encode(prompt), o.sample_len, o.temperature, 0, 1.0f, o.train.seed + 7);
      std::printf("\n---- sample (temperature %.2g, %lld tokens) ----\n%s%s\n---- end of sample ----\n",
                  double(o.temperature), (long long)o.sample_len, printable(prompt).c_str(),
                  printable(codec.decode(out)).c_str());
    }

    // ---- summary ----------------------------------------------------------------------------------------
    const int64_t done = o.train.steps - first;
    std::printf("\nsummary: %lld steps, %.2fM tokens in %s (%.0f tok/s) on %s; total %s\n", (long long)done,
                double(done * o.train.batch * cfg.context) / 1e6, duration(train_seconds).c_str(),
                progress.tokens_per_second(), dev.desc.c_str(), duration(seconds_since(t_start)).c_str());
    if (!losses.empty()) {
      const size_t tail = std::max<size_t>(1, losses.size() / 10);
      double last = 0;
      for (size_t i = losses.size() - tail; i < losses.size(); ++i) last += losses[i];
      std::printf("  training loss   %.4f -> %.4f (first step -> mean of the last %zu)\n", losses[0],
                  last / double(tail), tail);
    }
    std::printf("  validation loss %.4f -> %.4f nats/token (perplexity %.2f -> %.2f)\n", val_before,
                val_after, std::exp(val_before), std::exp(val_after));
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "\ntrain: %s\n", e.what());
    return 1;
  }
}
