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
   model config, training options, the tokenizer itself and which shards it trained on) at the end, every
   --save-every steps and every --save-minutes minutes, atomically: a run killed while saving leaves the
   previous checkpoint intact. The checkpoint stands alone: copied anywhere, eval and generate read it.
5. Ctrl-C (or SIGTERM) stops the run at the end of the current step and saves it (to --save, or to
   train-run.safetensors in the current directory), then says how to continue; a second Ctrl-C
   aborts at once. --resume PATH continues a run from its checkpoint exactly where it stopped, with the
   model, tokenizer, training options and data recorded in it (flags given must agree; --steps may grow):
   on the CPU the parameters come out bit-for-bit equal to an uninterrupted run's. Other data is refused
   unless --continue-on-new-data 1.

Exit status: 0 done, 1 failed (a bad file, out of memory), 2 a bad command line, 130 / 143 stopped by
Ctrl-C / SIGTERM after saving.

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
  --save PATH         write a checkpoint here (at the end, and as below); its directory is made
  --save-every N      also every N steps, 0 for none (default 0)
  --save-minutes M    also every M minutes of training, 0 for none (default 10); without --save these
                      saves (and Ctrl-C's) go to train-run.safetensors in the current directory
  --resume PATH       continue the run saved in PATH (its model, tokenizer, options and data; --steps is
                      the total, default the run's)
  --continue-on-new-data B  0 or 1: let --resume go on with other data than the run's (default 0)
Machine
  --device D          auto, cpu or cuda (default auto: cuda when a GPU is usable)
  --threads N         CPU threads (default 0: all cores)
  --compute-dtype D   auto, f32, bf16 or f16: the dtype every matmul runs in; the weights stay f32
                      (default auto: bf16 on CUDA, f32 on the CPU; bf16 on an AMD CPU with AVX-512
                      BF16 runs the lm head about twice as fast, its operands rounded to bf16)
Several GPUs or processes (started by tools/launch.sh -n N, torchrun, mpirun or srun: see README)
  --bucket-dtype D    f32 or bf16: the dtype gradients travel in between processes (default f32)
  --bucket-mib N      gradient bucket size in MiB, each summed as soon as backward finishes it (default 25)
  --zero1 B           0 or 1: split AdamW's moments over the processes (ZeRO-1: 1/N of the optimizer
                      state each, the same steps; default 0)
                      --batch is per process; rank 0 prints and writes the checkpoints
Output
  --log-every N       progress line every N steps (default: steps/15)
  --eval-every N      validation every N steps, 0 for before and after only (default: steps/3)
  --eval-windows N    validation windows (default 256, 0 for all): the first N windows of --context tokens
                      of the held-out split, the same validation loss eval and distill report
  --sample-len N      tokens to generate at the end, 0 for none (default 300)
  --temperature F     sampling temperature (default 0.8)
  --prompt TEXT       prompt for the sample (default: a line of the held-out text)
  --curves PATH       write the losses per step and the validation losses as CSV (for a picture)
  --help              this text

Example: train --tokenizer bpe --vocab 2048 --steps 1000 --save build/teacher.safetensors
)");

struct Options {
  std::string data = RETORT_DATA_DIR "/kjv.txt", tokenizer = "bytes", shards, save, resume, prompt, curves;
  int64_t max_bytes = 0, vocab = 1024, save_every = 0, log_every = -1, eval_every = -1;
  int64_t eval_windows = kValidationWindows, sample_len = 300;
  double save_minutes = 10, val_frac = 0.05;
  bool continue_on_new_data = false;
  TransformerConfig model;
  TrainerOptions train;
  float temperature = 0.8f;
  std::string device = "auto", compute = "auto", bucket_dtype = "f32";
  int threads = 0;
};

std::string fstr(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.9g", v);
  return b;
}

// A resumed run keeps what its checkpoint recorded: a flag that says otherwise is refused.
void same_as_run(const Args& a, const std::string& flag, int64_t given, int64_t recorded) {
  a.check(!a.given(flag) || given == recorded,
          flag + " " + std::to_string(given) + " differs from the run's " + std::to_string(recorded) +
              " (--resume keeps the model and data of the run: drop the flag)");
}

// Training options a checkpoint records, read back for --resume (a missing one keeps the flag's value).
void recorded(const Checkpoint& ck, const Args& a, const std::string& flag, const std::string& key,
              float* v) {
  const std::string r = ck.meta(key);
  if (r.empty() || a.given(flag)) return;
  *v = std::stof(r);
}
void recorded(const Checkpoint& ck, const Args& a, const std::string& flag, const std::string& key,
              int64_t* v) {
  const std::string r = ck.meta(key);
  if (r.empty() || a.given(flag)) return;
  *v = std::stoll(r);
}

int run(Args& a, Options& o, int argc, char** argv) {
  a.parse(argc, argv);
  // ---- every flag checked before any work -----------------------------------------------------------------
  a.check(o.train.steps >= 1, "--steps must be >= 1");
  a.check(o.train.batch >= 1 && o.train.batch <= (int64_t(1) << 20), "--batch must be in [1, 2^20]");
  a.check(o.train.lr > 0 && o.train.lr < 10, "--lr must be in (0, 10)");
  a.check(o.train.weight_decay >= 0, "--weight-decay must be >= 0");
  a.check(o.train.clip >= 0, "--clip must be >= 0 (0: no clipping)");
  a.check(o.save_every >= 0 && o.save_minutes >= 0, "--save-every and --save-minutes must be >= 0");
  a.check(o.eval_windows >= 0, "--eval-windows must be >= 0 (0: all)");
  a.check(o.sample_len >= 0 && o.temperature >= 0, "--sample-len and --temperature must be >= 0");
  a.check(o.vocab >= 257 && o.vocab <= (int64_t(1) << 20), "--vocab must be in [257, 2^20]");
  a.check_machine(o.threads, o.device);
  a.check_model(o.model);
  check_compute_dtype(a, o.compute);
  DataOptions data{o.data, o.max_bytes, o.val_frac, o.shards};
  check_data_options(a, data);
  if (!o.save.empty()) check_output_path(o.save, "--save");
  if (!o.curves.empty()) check_output_path(o.curves, "--curves");

  std::unique_ptr<Checkpoint> ck;
  TextCodec codec = TextCodec::bytes();
  const bool model_tokenizer = o.tokenizer != "bytes" && o.tokenizer != "bpe" && o.tokenizer != "gpt2";
  if (!o.resume.empty()) {
    ck = std::make_unique<Checkpoint>(o.resume);
    a.check(ck->has_optimizer(), "--resume " + o.resume +
                                     " holds no optimizer state (a model saved for use, "
                                     "not a run): start a new run");
    a.check(ck->meta("program") != "distill",
            "--resume " + o.resume + " is a distill run: continue it with distill --resume");
    const TransformerConfig& c = ck->config();
    same_as_run(a, "--layers", o.model.layers, c.layers);
    same_as_run(a, "--d-model", o.model.d_model, c.d_model);
    same_as_run(a, "--heads", o.model.heads, c.heads);
    same_as_run(a, "--kv-heads", o.model.kv_heads, c.kv_heads);
    same_as_run(a, "--d-ff", o.model.d_ff, c.d_ff);
    same_as_run(a, "--context", o.model.context, c.context);
    same_as_run(a, "--seed", int64_t(o.train.seed), int64_t(ck->state().seed));
    resume_batch(a, *ck, dist::world_from_env().size, &o.train.batch);
    o.model = c;
    o.train.seed = ck->state().seed;
    codec = TextCodec::from_checkpoint(*ck);
    a.check(
        !a.given("--tokenizer") || o.tokenizer == codec.kind() ||
            (model_tokenizer && codec.kind() == "model"),
        "--tokenizer " + o.tokenizer + " differs from the run's (" + codec.describe() + "): drop the flag");
    if (!a.given("--steps")) o.train.steps = std::max(ck->state().total_steps, ck->state().step);
    a.check(o.train.steps >= ck->state().step, "--steps " + std::to_string(o.train.steps) +
                                                   " is fewer than the run has done (" +
                                                   std::to_string(ck->state().step) + ")");
    recorded(*ck, a, "--lr", "train.lr", &o.train.lr);
    recorded(*ck, a, "--weight-decay", "train.weight_decay", &o.train.weight_decay);
    recorded(*ck, a, "--clip", "train.clip", &o.train.clip);
    recorded(*ck, a, "--warmup", "train.warmup", &o.train.warmup);
    // The data: the run's own shards, unless flags name other data.
    const bool data_flags =
        a.given("--data") || a.given("--shards") || a.given("--max-bytes") || a.given("--val-frac");
    if (!data_flags) {
      data.shards = ck->meta("shards");
      data.data = ck->meta("data", o.data);
      data.max_bytes = std::stoll(ck->meta("data.max_bytes", "0"));
      data.val_frac = std::stod(ck->meta("data.val_frac", "0.05"));
    } else if (!o.continue_on_new_data && !a.given("--shards") && !ck->meta("data").empty()) {
      // Other text is refused before it is tokenized (the shards' checksum decides when --shards is given).
      const std::string abs = std::filesystem::absolute(data.data).lexically_normal().string();
      if (abs != ck->meta("data") || std::to_string(data.max_bytes) != ck->meta("data.max_bytes") ||
          fstr(data.val_frac) != ck->meta("data.val_frac"))
        throw UsageError("--resume " + o.resume + " trained on " + ck->meta("data") + " (--max-bytes " +
                         ck->meta("data.max_bytes") + ", --val-frac " + ck->meta("data.val_frac") +
                         "), not on these data flags; drop them, or pass --continue-on-new-data 1");
    }
  } else {
    a.check(!o.continue_on_new_data, "--continue-on-new-data goes with --resume");
    if (model_tokenizer && !std::filesystem::exists(o.tokenizer))
      a.fail("--tokenizer is bytes, bpe, gpt2 or a model file or directory; " + o.tokenizer +
             " is none of them");
    // The model's shape, checked now with a stand-in vocabulary: the tokenizer's comes later.
    TransformerConfig probe = o.model;
    probe.vocab = o.tokenizer == "bpe" ? o.vocab : 256;
    try {
      (void)probe.resolved();
    } catch (const Error& e) {
      a.fail(std::string("bad model shape: ") + e.what());
    }
  }
  if (o.train.warmup < 0) o.train.warmup = std::max<int64_t>(1, o.train.steps / 20);
  a.check(o.train.warmup <= o.train.steps, "--warmup must be in [0, --steps]");
  if (o.log_every <= 0) o.log_every = std::max<int64_t>(1, o.train.steps / 15);
  if (o.eval_every < 0) o.eval_every = std::max<int64_t>(1, o.train.steps / 3);
  o.train.min_lr = o.train.lr / 10;

  const auto t_start = Clock::now();
  a.check(o.bucket_dtype == "f32" || o.bucket_dtype == "bf16",
          "--bucket-dtype is f32 or bf16, got '" + o.bucket_dtype + "'");
  a.check(o.train.bucket_mib >= 1 && o.train.bucket_mib <= 4096, "--bucket-mib must be in [1, 4096]");
  o.train.bucket_dtype = o.bucket_dtype == "bf16" ? DType::BF16 : DType::F32;
  Device dev = pick_device(o.device, o.threads);
  const auto group = join_world(dev);
  o.train.group = group.get();
  // ---- tokenizer and shards -----------------------------------------------------------------------------
  // Rank 0 makes them; the others wait for it, then find them made and read them.
  if (!group->is_root()) group->host().barrier();
  if (ck) {
    // The recorded shards when they are still there; else the recorded text tokenized again.
    const bool have = !data.shards.empty() && !list_shards(data.shards, "train").empty() &&
                      !list_shards(data.shards, "val").empty();
    if (!have) {
      a.check(!data.data.empty() && std::filesystem::is_regular_file(data.data),
              "the shards the run trained on (" + data.shards + "_*) are gone and so is its text (" +
                  data.data + "): give --data or --shards");
    }
  } else if (o.tokenizer == "gpt2") {
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
      check_output_prefix(data.shards, "--shards");
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
  ShardSet set;
  if (ck && !data.shards.empty() && !list_shards(data.shards, "train").empty() &&
      !list_shards(data.shards, "val").empty()) {
    set.train = list_shards(data.shards, "train");
    set.val = list_shards(data.shards, "val");
    std::printf("data: the run's shards %s_*\n", data.shards.c_str());
  } else {
    set = prepare_shards(data, codec);
  }
  if (group->is_root()) group->host().barrier();
  o.shards = std::filesystem::absolute(data.shards).lexically_normal().string();
  const std::string fingerprint = shards_fingerprint(o.shards);
  if (ck) {
    const std::string was = ck->meta("shards.fingerprint");
    if (!was.empty() && was != fingerprint) {
      if (!o.continue_on_new_data)
        throw UsageError("--resume " + o.resume + ": the shards " + o.shards +
                         "_* hold other tokens than the run "
                         "trained on (fingerprint " +
                         fingerprint + ", the run's " + was +
                         "); pass --continue-on-new-data 1 to go on with them");
      std::printf("note: continuing on other data than the run's (--continue-on-new-data)\n");
    }
  }
  if (!ck) o.model.vocab = codec.vocab();
  // Every id must be a row of the embedding: other shards are another tokenizer's, not a loss.
  const int64_t shard_vocab = shard_vocab_bound(set.val);
  RT_CHECK(shard_vocab <= o.model.vocab, "vocabulary mismatch: the shards ", o.shards, "_* hold token id ",
           shard_vocab - 1, ", the model's vocabulary has ", o.model.vocab,
           " tokens (made with another tokenizer?)");

  // ---- model ------------------------------------------------------------------------------------------
  o.model.compute_dtype = pick_compute_dtype(o.compute, dev);
  Context ctx(*dev.backend);
  Transformer model(ctx, o.model, o.train.seed);
  const TransformerConfig& cfg = model.config();
  o.train.seq_len = cfg.context;
  LmTrainer trainer(ctx, model, set.train, o.train);
  LmEvaluator evaluator(ctx, model, set.val, o.train.batch, cfg.context, o.eval_windows);
  Sampler sampler(ctx, model);
  if (ck) {
    trainer.resume(*ck);
    std::printf("resumed from %s at step %lld of %lld\n", o.resume.c_str(), (long long)trainer.steps_done(),
                (long long)o.train.steps);
  }

  std::printf("retort %s | device: %s | compute: %s\n", RETORT_VERSION, dev.desc.c_str(),
              compute_desc(cfg.compute_dtype).c_str());
  if (!dev.note.empty()) std::printf("%s\n", dev.note.c_str());
  std::printf("model: %s, %.2fM parameters\n", cfg.describe().c_str(), double(model.parameter_count()) / 1e6);
  std::printf(
      "training: %lld steps x %lld windows x %lld tokens, lr %.2g (warmup %lld, cosine to %.2g), AdamW "
      "wd %.2g, clip %.2g, seed %llu\n",
      (long long)o.train.steps, (long long)o.train.batch, (long long)cfg.context, double(o.train.lr),
      (long long)o.train.warmup, double(o.train.min_lr), double(o.train.weight_decay), double(o.train.clip),
      (unsigned long long)o.train.seed);
  std::fflush(stdout);

  std::map<std::string, std::string> meta = codec.checkpoint_metadata();
  meta["shards"] = o.shards;
  meta["shards.fingerprint"] = fingerprint;
  meta["data"] = std::filesystem::absolute(data.data).lexically_normal().string();
  meta["data.max_bytes"] = std::to_string(data.max_bytes);
  meta["data.val_frac"] = fstr(data.val_frac);
  meta["train.batch"] = std::to_string(o.train.batch * group->size());  // the whole step's
  meta["train.lr"] = fstr(o.train.lr);
  meta["train.warmup"] = std::to_string(o.train.warmup);
  meta["train.weight_decay"] = fstr(o.train.weight_decay);
  meta["train.clip"] = fstr(o.train.clip);
  meta["program"] = "train";
  meta["compute_dtype"] = dtype_name(cfg.compute_dtype);  // informative: checkpoints load in any
  meta["val_windows"] = std::to_string(evaluator.windows());
  // Every rank holds the same parameters and moments: rank 0 alone writes them.
  auto save = [&](const std::string& path, double val) {
    meta["val_loss"] = fstr(val);
    if (group->is_root() || trainer.zero1()) trainer.save(path, meta);  // ZeRO-1: every rank gathers
  };
  Curves curves;
  const int64_t step_tokens = o.train.batch * cfg.context * group->size();
  auto report_val = [&](int64_t step, double v) {
    curves.validation(step, step * step_tokens, v);
    std::printf("  validation @ step %lld: loss %.4f nats/token, perplexity %.2f\n", (long long)step, v,
                std::exp(v));
    std::fflush(stdout);
  };
  const double val_before = evaluator.run();
  report_val(trainer.steps_done(), val_before);
  double val_after = val_before;

  // ---- training loop ----------------------------------------------------------------------------------
  install_stop_handler("train");
  const int64_t first = trainer.steps_done();
  Progress progress(o.train.steps, step_tokens, o.log_every, first);
  std::vector<double> losses;
  auto last_save = Clock::now();
  // Where the run is kept: --save, else (periodic and Ctrl-C saves only) train-run.safetensors here.
  const std::string keep = o.save.empty() ? std::string("train-run.safetensors") : o.save;
  bool kept = false;
  // Every rank decides together whether to stop (stop_agreed), before the first step and after each one.
  bool stop = stop_agreed(*group);
  for (int64_t step = first + 1; step <= o.train.steps && !stop; ++step) {
    const auto r = trainer.step();
    losses.push_back(r.loss);
    curves.step(step, step * step_tokens, r.loss, r.loss, NAN);
    char f[128];
    std::snprintf(f, sizeof f, "loss %.4f | lr %.2e | |g| %.2f", r.loss, double(r.lr), r.grad_norm);
    progress.update(step, f);
    stop = stop_agreed(*group);
    if (step == o.train.steps || stop) break;
    if (o.eval_every > 0 && step % o.eval_every == 0) {
      val_after = evaluator.run();
      report_val(step, val_after);
    }
    const bool by_steps = o.save_every > 0 && step % o.save_every == 0;
    bool by_time = o.save_minutes > 0 && seconds_since(last_save) >= 60 * o.save_minutes;
    if (trainer.zero1()) by_time = any_rank(*group, by_time);  // a ZeRO-1 save needs every rank
    if ((by_steps && !o.save.empty()) || by_time) {
      // A failed periodic save costs a warning, not the run: the next one may succeed.
      try {
        save(keep, val_after);
        kept = true;
      } catch (const Error& e) {
        std::printf("\nwarning: could not save the run: %s (training goes on)\n", e.what());
      }
      last_save = Clock::now();
    }
  }
  if (stop) {
    const std::string& path = keep;
    save(path, val_after);
    std::printf(
        "\ntrain: stopped at step %lld of %lld; the run is saved in %s\n  continue with: train --resume "
        "%s%s\n",
        (long long)trainer.steps_done(), (long long)o.train.steps, path.c_str(), path.c_str(),
        o.save.empty() ? "" : (" --save " + o.save).c_str());
    return stopped_status();
  }
  const double train_seconds = progress.elapsed();
  val_after = evaluator.run();
  report_val(trainer.steps_done(), val_after);
  if (!o.curves.empty()) curves.write(o.curves);
  // Without --save the run ends unsaved, unless a periodic save already kept it: then it keeps the end too.
  if (!o.save.empty() || kept) {
    save(keep, val_after);
    std::printf("checkpoint: %s\n", keep.c_str());
  }

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
  std::string middle;
  if (!losses.empty()) {
    const size_t tail = std::max<size_t>(1, losses.size() / 10);
    double last = 0;
    for (size_t i = losses.size() - tail; i < losses.size(); ++i) last += losses[i];
    char line[160];
    std::snprintf(line, sizeof line, "  training loss   %.4f -> %.4f (first step -> mean of the last %zu)\n",
                  losses[0], last / double(tail), tail);
    middle = line;
  }
  print_summary(o.train.steps - first, step_tokens, train_seconds, progress, dev.desc, t_start, middle,
                val_before, val_after, evaluator.windows());
  return 0;
}

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
  a.add("--save", &o.save), a.add("--save-every", &o.save_every), a.add("--save-minutes", &o.save_minutes);
  a.add("--resume", &o.resume), a.add("--continue-on-new-data", &o.continue_on_new_data);
  a.add("--device", &o.device), a.add("--threads", &o.threads), a.add("--compute-dtype", &o.compute);
  a.add("--bucket-dtype", &o.bucket_dtype), a.add("--bucket-mib", &o.train.bucket_mib);
  a.add("--zero1", &o.train.zero1);
  a.add("--log-every", &o.log_every), a.add("--eval-every", &o.eval_every),
      a.add("--eval-windows", &o.eval_windows);
  a.add("--sample-len", &o.sample_len), a.add("--temperature", &o.temperature), a.add("--prompt", &o.prompt);
  a.add("--curves", &o.curves);
  return run_main(
      "train", [&] { return run(a, o, argc, argv); },
      [&] {
        TransformerConfig c = o.model;
        if (c.vocab <= 0) c.vocab = 256;
        return memory_hint(c, true, o.train.batch);
      });
}
