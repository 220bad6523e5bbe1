// train: trains a small byte-level Llama-style language model on a text file and prints a sample.
// The whole training step is in main(): build the graph once, then per step fill the batch, run forward and
// backward, clip, and update. Run with --help for the story and the options.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "retort.h"

#ifndef RETORT_DATA_DIR
#define RETORT_DATA_DIR "data"
#endif

using namespace retort;

namespace {

const char* kHelp = R"(train - train a small byte-level language model with retort, then write a sample.

Reads a text file as bytes (vocabulary 256: no tokenizer), holds out its last --val-frac for validation, and
trains a Llama-style decoder (RMSNorm, rotary positions, causal self-attention, SwiGLU MLP, tied embedding) on
random windows of --context bytes, --batch windows per step, with AdamW, a cosine learning-rate schedule with
warmup and global gradient-norm clipping. Every step is one graph built once and re-run with new data.

It prints a progress line with the training loss, learning rate, tokens per second and ETA; the validation
loss (nats and bits per byte) before training and every --eval-every steps; then a text sample continuing a
prompt taken from the held-out text; and a summary. With the defaults it runs a few minutes on two CPU cores,
and the loss falls from ln(256) = 5.5 towards 2 and below.

Usage: train [options]

Data
  --data PATH         text file to train on (default: the bundled King James Bible,
                      )" RETORT_DATA_DIR R"(/kjv.txt; austen.txt is next to it)
  --val-frac F        fraction held out at the end for validation (default 0.05)
Model
  --layers N          transformer blocks (default 4)
  --d-model N         width of the residual stream (default 128)
  --heads N           attention heads (default 4); d-model / heads must be even
  --kv-heads N        key/value heads for grouped-query attention; must divide heads (default: heads)
  --d-ff N            SwiGLU hidden width (default: 8/3 d-model rounded up to a multiple of 32)
  --context N         bytes per training window, and the model's context (default 128)
Training
  --steps N           optimizer steps (default 300)
  --batch N           windows per step (default 16)
  --lr F              peak learning rate (default 3e-3); decays along a cosine to lr/10
  --warmup N          linear warmup steps (default: steps/20)
  --weight-decay F    AdamW decoupled weight decay (default 0.1)
  --clip F            clip the global gradient norm to F; 0 turns clipping off (default 1.0)
  --seed N            seeds the init, the batches and the sampler (default 1)
Machine
  --device D          auto, cpu or cuda (default auto: cuda when a GPU is usable, else cpu)
  --threads N         CPU threads (default 0: all cores)
Output
  --log-every N       print a progress line every N steps (default: steps/15)
  --eval-every N      validation loss every N steps, 0 for only before and after (default: steps/3)
  --eval-batches N    validation batches per evaluation (default 8)
  --sample-len N      bytes to generate after training, 0 for none (default 400)
  --temperature F     sampling temperature (default 0.8)
  --prompt TEXT       prompt for the sample (default: the start of a line in the held-out text)
  --help              this text

Example: train --steps 1000 --layers 6 --d-model 192 --heads 6 --data build/data/austen.txt
)";

struct Options {
  std::string data = RETORT_DATA_DIR "/kjv.txt";
  double val_frac = 0.05;
  TransformerConfig model;
  int64_t steps = 300, batch = 16, warmup = -1, log_every = -1, eval_every = -1, eval_batches = 8;
  float lr = 3e-3f, weight_decay = 0.1f, clip = 1.0f, temperature = 0.8f;
  uint64_t seed = 1;
  std::string device = "auto";
  int threads = 0;
  int64_t sample_len = 400;
  std::string prompt;
  bool has_prompt = false;
};

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "train: %s\n(run train --help for the options)\n", msg.c_str());
  std::exit(2);
}

int64_t to_int(const std::string& flag, const char* v) {
  char* end = nullptr;
  long long x = std::strtoll(v, &end, 10);
  if (!*v || *end) usage_error(flag + " wants an integer, got '" + v + "'");
  return x;
}

double to_float(const std::string& flag, const char* v) {
  char* end = nullptr;
  double x = std::strtod(v, &end);
  if (!*v || *end || !std::isfinite(x)) usage_error(flag + " wants a number, got '" + v + "'");
  return x;
}

Options parse(int argc, char** argv) {
  Options o;
  std::string f;  // the flag being parsed, for the error messages of to_int / to_float
  const std::map<std::string, std::function<void(const char*)>> setters = {
      {"--data", [&](const char* v) { o.data = v; }},
      {"--val-frac", [&](const char* v) { o.val_frac = to_float(f, v); }},
      {"--layers", [&](const char* v) { o.model.layers = to_int(f, v); }},
      {"--d-model", [&](const char* v) { o.model.d_model = to_int(f, v); }},
      {"--heads", [&](const char* v) { o.model.heads = to_int(f, v); }},
      {"--kv-heads", [&](const char* v) { o.model.kv_heads = to_int(f, v); }},
      {"--d-ff", [&](const char* v) { o.model.d_ff = to_int(f, v); }},
      {"--context", [&](const char* v) { o.model.context = to_int(f, v); }},
      {"--steps", [&](const char* v) { o.steps = to_int(f, v); }},
      {"--batch", [&](const char* v) { o.batch = to_int(f, v); }},
      {"--lr", [&](const char* v) { o.lr = float(to_float(f, v)); }},
      {"--warmup", [&](const char* v) { o.warmup = to_int(f, v); }},
      {"--weight-decay", [&](const char* v) { o.weight_decay = float(to_float(f, v)); }},
      {"--clip", [&](const char* v) { o.clip = float(to_float(f, v)); }},
      {"--seed", [&](const char* v) { o.seed = uint64_t(to_int(f, v)); }},
      {"--device", [&](const char* v) { o.device = v; }},
      {"--threads", [&](const char* v) { o.threads = int(to_int(f, v)); }},
      {"--log-every", [&](const char* v) { o.log_every = to_int(f, v); }},
      {"--eval-every", [&](const char* v) { o.eval_every = to_int(f, v); }},
      {"--eval-batches", [&](const char* v) { o.eval_batches = to_int(f, v); }},
      {"--sample-len", [&](const char* v) { o.sample_len = to_int(f, v); }},
      {"--temperature", [&](const char* v) { o.temperature = float(to_float(f, v)); }},
      {"--prompt", [&](const char* v) { o.prompt = v, o.has_prompt = true; }},
  };
  for (int i = 1; i < argc; ++i) {
    f = argv[i];
    if (f == "--help" || f == "-h") {
      std::fputs(kHelp, stdout);
      std::exit(0);
    }
    const auto it = setters.find(f);
    if (it == setters.end()) usage_error("unknown option " + f);
    if (i + 1 >= argc) usage_error(f + " needs a value");
    it->second(argv[++i]);
  }
  if (o.steps < 1) usage_error("--steps must be >= 1");
  if (o.batch < 1) usage_error("--batch must be >= 1");
  if (o.val_frac <= 0 || o.val_frac >= 0.5) usage_error("--val-frac must be in (0, 0.5)");
  if (o.lr <= 0) usage_error("--lr must be > 0");
  if (o.clip < 0) usage_error("--clip must be >= 0");
  if (o.temperature <= 0) usage_error("--temperature must be > 0");
  if (o.eval_batches < 1) usage_error("--eval-batches must be >= 1");
  if (o.device != "auto" && o.device != "cpu" && o.device != "cuda")
    usage_error("--device is auto, cpu or cuda");
  if (o.warmup < 0) o.warmup = std::max<int64_t>(1, o.steps / 20);
  if (o.log_every <= 0) o.log_every = std::max<int64_t>(1, o.steps / 15);
  if (o.eval_every < 0) o.eval_every = std::max<int64_t>(1, o.steps / 3);
  return o;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  RT_CHECK(f.good(), "train: cannot open --data ", path,
           " (the bundled corpora are unpacked by the build: ninja -C build data/kjv.txt)");
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return s;
}

std::string duration(double s) {
  char buf[32];
  if (s < 60)
    std::snprintf(buf, sizeof buf, "%.0fs", s);
  else if (s < 3600)
    std::snprintf(buf, sizeof buf, "%dm%02ds", int(s) / 60, int(s) % 60);
  else
    std::snprintf(buf, sizeof buf, "%dh%02dm", int(s) / 3600, int(s) % 3600 / 60);
  return buf;
}

// Printable form of generated bytes: keeps text and newlines, shows other control bytes as '?'.
std::string printable(const std::string& s) {
  std::string out;
  for (unsigned char c : s)
    out += (c == '\n' || c == '\t' || (c >= 32 && c < 127) || c >= 128) ? char(c) : '?';
  return out;
}

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// B windows of T+1 bytes at the given offsets -> tokens [B, T] and next-byte targets [B, T].
void fill_batch(const std::string& text, const std::vector<int64_t>& offsets, int64_t T, Tensor* tokens,
                Tensor* targets) {
  std::vector<int64_t> x, y;
  x.reserve(offsets.size() * size_t(T));
  y.reserve(offsets.size() * size_t(T));
  for (int64_t o : offsets)
    for (int64_t t = 0; t < T; ++t) {
      x.push_back(static_cast<unsigned char>(text[size_t(o + t)]));
      y.push_back(static_cast<unsigned char>(text[size_t(o + t + 1)]));
    }
  set_data_int(tokens, x);
  set_data_int(targets, y);
}

}  // namespace

int main(int argc, char** argv) {
  const Options opt = parse(argc, argv);
  try {
    const std::string text = read_file(opt.data);
    const int64_t T = opt.model.context, B = opt.batch;
    const int64_t n_val = int64_t(double(text.size()) * opt.val_frac);
    const int64_t n_train = int64_t(text.size()) - n_val;
    RT_CHECK(n_val > T + 1 && n_train > T + 1, "train: ", opt.data, " has ", text.size(),
             " bytes, too few for windows of --context ", T, " bytes");
    const std::string train_text = text.substr(0, size_t(n_train));
    const std::string val_text = text.substr(size_t(n_train));

    // ---- device -----------------------------------------------------------------------------------------
    std::string why_no_cuda;
    const bool has_cuda = cuda_available(&why_no_cuda);
    RT_CHECK(opt.device != "cuda" || has_cuda, "train: --device cuda: ", why_no_cuda);
    const bool use_cuda = opt.device == "cuda" || (opt.device == "auto" && has_cuda);
    std::unique_ptr<Backend> backend;
    std::string device_desc;
    if (use_cuda) {
      backend = make_cuda_backend(0);
      device_desc = "cuda";
    } else {
      auto cpu = std::make_unique<CpuBackend>(opt.threads);
      device_desc = "cpu, " + std::to_string(cpu->threads()) + " threads";
      backend = std::move(cpu);
    }
    Context ctx(*backend);

    // ---- model and graphs -------------------------------------------------------------------------------
    Transformer model(ctx, opt.model, opt.seed);
    const TransformerConfig& cfg = model.config();
    RT_CHECK(cfg.vocab == 256, "train: the model must have vocab 256 (bytes)");

    // Training graph, built once: tokens/targets [B, T] are refilled every step.
    Tensor* tokens = ctx.input(DType::I32, {B, T}, "tokens");
    Tensor* targets = ctx.input(DType::I32, {B, T}, "targets");
    Tensor* logits = model.forward(ctx, tokens);   // [B*T, 256]
    Tensor* loss = lm_loss(ctx, logits, targets);  // scalar, mean over B*T
    Graph train(ctx);
    train.backward(loss);
    AdamWConfig adam;
    adam.lr = opt.lr;
    adam.beta1 = 0.9f;
    adam.beta2 = 0.95f;
    adam.weight_decay = opt.weight_decay;
    AdamW optimizer(train.params(), adam);

    // Validation graph: same parameters, forward only.
    Tensor* vtokens = ctx.input(DType::I32, {B, T}, "val_tokens");
    Tensor* vtargets = ctx.input(DType::I32, {B, T}, "val_targets");
    Tensor* vloss = lm_loss(ctx, model.forward(ctx, vtokens), vtargets);
    vloss->flags |= kOutput;
    Graph val(ctx);
    val.forward(vloss);

    // Generation graph: one window of the full context; row t of the logits predicts the byte after t, and
    // causal attention keeps it blind to the padding after the prompt.
    Tensor* gtokens = ctx.input(DType::I32, {1, T}, "gen_tokens");
    Tensor* glogits = model.forward(ctx, gtokens);  // [T, 256]
    glogits->flags |= kOutput;
    Graph gen(ctx);
    gen.forward(glogits);

    std::printf("retort %s | device: %s%s\n", RETORT_VERSION, device_desc.c_str(),
                use_cuda || opt.device == "cpu" ? "" : (" (no GPU: " + why_no_cuda + ")").c_str());
    std::printf("data: %s, %lld bytes (%lld train, %lld validation)\n", opt.data.c_str(),
                (long long)text.size(), (long long)n_train, (long long)n_val);
    std::printf("model: %s, %.2fM parameters\n", cfg.describe().c_str(),
                double(model.parameter_count()) / 1e6);
    std::printf(
        "training: %lld steps x %lld windows x %lld bytes, lr %.2g (warmup %lld, cosine to %.2g), "
        "AdamW wd %.2g, clip %.2g, seed %llu\n",
        (long long)opt.steps, (long long)B, (long long)T, double(opt.lr), (long long)opt.warmup,
        double(opt.lr) / 10, double(opt.weight_decay), double(opt.clip), (unsigned long long)opt.seed);
    std::printf("memory plan: training graph %.1f MiB, validation %.1f MiB\n",
                double(train.plan().arena_bytes) / (1 << 20), double(val.plan().arena_bytes) / (1 << 20));
    std::fflush(stdout);

    // Validation always reads the same windows, so evaluations are comparable.
    std::mt19937_64 rng(opt.seed * 0x9E3779B97F4A7C15ull + 1);
    std::vector<std::vector<int64_t>> val_offsets(static_cast<size_t>(opt.eval_batches));
    {
      std::uniform_int_distribution<int64_t> pick(0, n_val - T - 2);
      for (auto& offs : val_offsets)
        for (int64_t b = 0; b < B; ++b) offs.push_back(pick(rng));
    }
    auto evaluate = [&]() {
      double sum = 0;
      for (const auto& offs : val_offsets) {
        fill_batch(val_text, offs, T, vtokens, vtargets);
        val.compute();
        sum += get_data(vloss)[0];
      }
      return sum / double(val_offsets.size());
    };
    auto report_val = [&](int64_t step, double v) {
      std::printf("  validation @ step %lld: loss %.4f nats, %.3f bits/byte\n", (long long)step, v,
                  v / std::log(2.0));
      std::fflush(stdout);
    };

    const double val_before = evaluate();
    report_val(0, val_before);

    // ---- training loop ----------------------------------------------------------------------------------
    std::uniform_int_distribution<int64_t> pick(0, n_train - T - 2);
    std::vector<int64_t> offsets(static_cast<size_t>(B));
    const bool tty = isatty(fileno(stdout));
    const auto start = Clock::now();
    double first_loss = 0, val_after = val_before;
    std::vector<double> losses;
    for (int64_t step = 1; step <= opt.steps; ++step) {
      for (auto& o : offsets) o = pick(rng);
      fill_batch(train_text, offsets, T, tokens, targets);
      train.zero_grad();
      train.compute();  // forward + backward: loss, and every parameter's gradient in train.grad(p)
      const double l = get_data(loss)[0];
      RT_CHECK(std::isfinite(l), "train: the loss became ", l, " at step ", step,
               " (try a lower --lr or a smaller model)");
      const double gnorm = opt.clip > 0 ? clip_grad_norm(train, opt.clip) : 0.0;
      const float lr = cosine_lr(step, opt.warmup, opt.steps, opt.lr, opt.lr / 10);
      optimizer.step(train, lr);

      if (step == 1) first_loss = l;
      losses.push_back(l);
      const double elapsed = seconds_since(start);
      const double tok_s = double(step * B * T) / elapsed;
      const double eta = elapsed / double(step) * double(opt.steps - step);
      char line[256];
      std::snprintf(
          line, sizeof line, "step %5lld/%lld | loss %.4f | lr %.2e | |g| %.2f | %7.0f tok/s | ETA %s",
          (long long)step, (long long)opt.steps, l, double(lr), gnorm, tok_s, duration(eta).c_str());
      if (step % opt.log_every == 0 || step == opt.steps || step == 1) {
        std::printf("%s%s\n", tty ? "\r\033[K" : "", line);
      } else if (tty) {
        std::printf("\r\033[K%s", line);
      }
      std::fflush(stdout);
      if (opt.eval_every > 0 && step % opt.eval_every == 0 && step != opt.steps) report_val(step, evaluate());
    }
    const double train_seconds = seconds_since(start);
    val_after = evaluate();
    report_val(opt.steps, val_after);

    // ---- sample -----------------------------------------------------------------------------------------
    std::string sample;
    std::string prompt = opt.prompt;
    if (!opt.has_prompt) {
      // The start of a line in the held-out text: text the model has not trained on.
      size_t at = val_text.find('\n', val_text.size() / 2);
      at = at == std::string::npos ? 0 : at + 1;
      prompt = val_text.substr(at, 24);
    }
    if (opt.sample_len > 0) {
      std::string ctxt = prompt.empty() ? std::string("\n") : prompt;
      std::mt19937_64 srng(opt.seed + 7);
      const auto gstart = Clock::now();
      for (int64_t i = 0; i < opt.sample_len; ++i) {
        // The last T bytes, left-aligned, padded after with zeros that the causal mask keeps out of view.
        const std::string win = ctxt.size() > size_t(T) ? ctxt.substr(ctxt.size() - size_t(T)) : ctxt;
        std::vector<int64_t> ids(size_t(T), 0);
        for (size_t j = 0; j < win.size(); ++j) ids[j] = static_cast<unsigned char>(win[j]);
        set_data_int(gtokens, ids);
        gen.compute();
        const std::vector<float> all = get_data(glogits);
        const float* row = all.data() + (win.size() - 1) * 256;
        std::vector<double> p(256);
        const float mx = *std::max_element(row, row + 256);
        for (int v = 0; v < 256; ++v) p[size_t(v)] = std::exp(double(row[v] - mx) / opt.temperature);
        std::discrete_distribution<int> dist(p.begin(), p.end());
        const char c = char(dist(srng));
        ctxt += c;
        sample += c;
      }
      std::printf("\n---- sample (temperature %.2g, %lld bytes, %.1f bytes/s) ----\n%s",
                  double(opt.temperature), (long long)opt.sample_len,
                  double(opt.sample_len) / seconds_since(gstart), printable(prompt).c_str());
      std::printf("%s\n---- end of sample ----\n", printable(sample).c_str());
    }

    // ---- summary ----------------------------------------------------------------------------------------
    std::printf("\nsummary: %lld steps, %.2fM tokens in %s (%.0f tok/s) on %s\n", (long long)opt.steps,
                double(opt.steps * B * T) / 1e6, duration(train_seconds).c_str(),
                double(opt.steps * B * T) / train_seconds, device_desc.c_str());
    // The mean of the last tenth of the steps: one batch's loss is noisy.
    const size_t tail = std::max<size_t>(1, losses.size() / 10);
    double last = 0;
    for (size_t i = losses.size() - tail; i < losses.size(); ++i) last += losses[i];
    last /= double(tail);
    std::printf("  training loss   %.4f -> %.4f (first step -> mean of the last %zu)\n", first_loss, last,
                tail);
    std::printf("  validation loss %.4f -> %.4f nats (%.3f -> %.3f bits/byte; uniform is 8)\n", val_before,
                val_after, val_before / std::log(2.0), val_after / std::log(2.0));
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "\ntrain: %s\n", e.what());
    return 1;
  }
}
