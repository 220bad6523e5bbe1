// distill: trains a student language model against a teacher's top-K next-token distribution, offline from a
// teacher-cache file or online with the teacher checkpoint in process. --help tells all.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "common.h"

using namespace ex;

namespace {

const char* kHelp = R"(distill - train a small student language model from a teacher with retort.

The student (a Llama-style decoder like train's, usually smaller) trains on the teacher's token shards with
the loss, per position,
    w_hard · CE(student, next token)  +  w_soft · T² · D(teacher top-K ‖ student)
where D is forward KL (--beta 0), reverse KL (--beta 1) or the generalized Jensen-Shannon divergence between,
computed at temperature T over the teacher's K best candidates; with --normalize-topk the student's
distribution is renormalized over those K tokens too (and with --w-hard 0 the loss reads only K student
logits per position, no full-vocabulary matmul). The lm head and the loss are one fused graph node
(fused_linear_topk_kd): the [tokens, vocabulary] logits never exist whole.

The teacher's candidates come from
  --cache PREFIX   a teacher top-K cache written by teacher-cache (offline: the teacher never runs), or
  (no --cache)     the teacher itself, run in process on each batch (online).
Either way --teacher names the teacher — a checkpoint written by train, or a pretrained model as a GGUF
file (llama.cpp's format, quantized or not) or a Hugging Face directory — and the student takes its
tokenizer and vocabulary. The tokens come from the shards a teacher checkpoint was trained on, --shards, or
--data (a text tokenized with the teacher's tokenizer; held-out tail --val-frac). With --init-from-teacher
the student starts from the teacher's weights: its widths and heads, --layers of its layers (evenly spaced,
the first and last kept), its embedding, final norm and head, as layer-dropping distillation does.
Position t of the teacher data is the distribution of token t+1, the student's target at t.

It prints a progress bar (loss, hard and soft parts, tokens/s, ETA), the validation cross-entropy before,
every --eval-every steps and after, a sample, and a summary; writes the loss curves (training loss, its soft
part, validation cross-entropy) as an SVG plot; and with --save a checkpoint like train's (--resume works
the same way).

Usage: distill --teacher PATH [--cache PREFIX] [options]

Teacher and data
  --teacher PATH      teacher: checkpoint, GGUF file or Hugging Face directory (required)
  --cache PREFIX      teacher top-K cache (default: none, the teacher runs online)
  --k N               teacher candidates used per position (default: all the cache holds, or 16 online)
  --shards PREFIX     token shards (default: those a teacher checkpoint was trained on)
  --data PATH         a text to tokenize into shards instead (reused when they exist), --max-bytes N,
                      --val-frac F (0.05) as in train
Loss
  --w-hard F          weight of the cross-entropy with the true next token (default 0.5)
  --w-soft F          weight of the distillation term (default 0.5)
  --beta F            0 forward KL, 1 reverse KL, between: generalized JSD (default 0)
  --kd-temperature F  distillation temperature T (default 1)
  --normalize-topk B  0 or 1: renormalize the student over the K candidates (default 0)
Student
  --layers N --d-model N --heads N --kv-heads N --d-ff N   as in train (defaults 2, 64, 2, heads, auto)
  --context N         window length (default: a teacher checkpoint's context, else 256)
  --init-from-teacher B  0 or 1: start from the teacher's weights (then only --layers applies)
Training
  --steps N (300)  --batch N (16)  --lr F (3e-3)  --warmup N (steps/20)  --weight-decay F (0.1)
  --clip F (1.0)  --seed N (1)
Checkpoints
  --save PATH  --save-every N  --resume PATH     as in train
Output
  --svg PATH          loss curves (default: the --save path with extension .svg, or distill.svg)
  --log-every N  --eval-every N  --eval-batches N (16)  --sample-len N (200)  --temperature F (0.8)
Machine
  --device D  --threads N  --compute-dtype D      as in train (auto: bf16 matmuls on CUDA, f32 on the CPU;
                                                 an online teacher runs in the same compute dtype)
  --help              this text

Examples: distill --teacher build/demo/teacher.safetensors --cache build/data/kjv.bytes.topk16 --steps 500
          distill --teacher SmolLM2-135M-Instruct.Q4_1.gguf --data build/data/austen.txt --layers 4 \
                  --init-from-teacher 1 --steps 300
)";

}  // namespace

int main(int argc, char** argv) {
  std::string teacher, cache_prefix, save, resume, svg, device = "auto", compute = "auto", shards_opt;
  DataOptions data;
  bool init_from_teacher = false;
  int64_t k = 0, log_every = -1, eval_every = -1, eval_batches = 16, save_every = 0, sample_len = 200;
  TopKDistillOptions kd;
  kd.w_hard = 0.5f;
  kd.w_soft = 0.5f;
  TransformerConfig sc;
  sc.layers = 2;
  sc.d_model = 64;
  sc.heads = 2;
  sc.context = 0;  // 0: the teacher checkpoint's, or 256 for a pretrained teacher
  TrainerOptions to;
  to.warmup = -1;
  float temperature = 0.8f;
  int threads = 0;
  Args a("distill", kHelp);
  a.add("--teacher", &teacher), a.add("--cache", &cache_prefix), a.add("--k", &k);
  a.add("--shards", &shards_opt), a.add("--data", &data.data), a.add("--max-bytes", &data.max_bytes);
  a.add("--val-frac", &data.val_frac), a.add("--context", &sc.context);
  a.add("--init-from-teacher", &init_from_teacher);
  a.add("--w-hard", &kd.w_hard), a.add("--w-soft", &kd.w_soft), a.add("--beta", &kd.beta);
  a.add("--kd-temperature", &kd.temperature), a.add("--normalize-topk", &kd.normalize_topk);
  a.add("--layers", &sc.layers), a.add("--d-model", &sc.d_model), a.add("--heads", &sc.heads);
  a.add("--kv-heads", &sc.kv_heads), a.add("--d-ff", &sc.d_ff);
  a.add("--steps", &to.steps), a.add("--batch", &to.batch), a.add("--lr", &to.lr),
      a.add("--warmup", &to.warmup);
  a.add("--weight-decay", &to.weight_decay), a.add("--clip", &to.clip), a.add("--seed", &to.seed);
  a.add("--save", &save), a.add("--save-every", &save_every), a.add("--resume", &resume),
      a.add("--svg", &svg);
  a.add("--log-every", &log_every), a.add("--eval-every", &eval_every),
      a.add("--eval-batches", &eval_batches);
  a.add("--sample-len", &sample_len), a.add("--temperature", &temperature);
  a.add("--device", &device), a.add("--threads", &threads), a.add("--compute-dtype", &compute);
  a.parse(argc, argv);
  if (teacher.empty()) a.fail("--teacher is required");
  if (to.steps < 1 || to.batch < 1) a.fail("--steps and --batch must be >= 1");
  if (to.warmup < 0) to.warmup = std::max<int64_t>(1, to.steps / 20);
  if (log_every <= 0) log_every = std::max<int64_t>(1, to.steps / 15);
  if (eval_every < 0) eval_every = std::max<int64_t>(1, to.steps / 3);
  to.min_lr = to.lr / 10;
  if (svg.empty())
    svg = save.empty() ? std::string("distill.svg")
                       : std::filesystem::path(save).replace_extension(".svg").string();
  try {
    const auto t_start = Clock::now();
    Device dev = pick_device(device, threads, "distill");
    sc.compute_dtype = pick_compute_dtype(compute, dev, "distill");
    Context ctx(*dev.backend);
    const PretrainedModel tfile = PretrainedModel::open(teacher);
    const TransformerConfig tcfg = tfile.config();
    if (sc.context <= 0)
      sc.context = tfile.checkpoint() ? tcfg.context : std::min<int64_t>(256, tcfg.context);
    RT_CHECK(sc.context <= tcfg.context, "--context ", sc.context, " exceeds the teacher's context ",
             tcfg.context);
    // The student speaks the teacher's tokenizer: its vocabulary, and the shards made with it.
    const TextCodec codec = tfile.checkpoint()
                                ? TextCodec::from_metadata(tfile.checkpoint()->metadata(), teacher)
                                : TextCodec::model(teacher, tfile.tokenizer());
    std::string shards = shards_opt;
    if (!data.data.empty()) {
      data.shards = shards;
      prepare_shards(data, codec, "distill");
      shards = data.shards;
    }
    if (shards.empty() && tfile.checkpoint()) shards = tfile.checkpoint()->meta("shards");
    RT_CHECK(!shards.empty(), "a pretrained teacher needs --data TEXT or --shards PREFIX");
    const auto train_shards = shards_for(shards, "train", "distill");
    const auto val_shards = shards_for(shards, "val", "distill");
    sc.vocab = tcfg.vocab;
    if (init_from_teacher) {
      // The teacher's widths, so its layers fit; only the depth is the student's own.
      sc.d_model = tcfg.d_model, sc.heads = tcfg.heads, sc.kv_heads = tcfg.kv_heads, sc.d_ff = tcfg.d_ff;
      sc.rope_theta = tcfg.rope_theta, sc.norm_eps = tcfg.norm_eps, sc.qkv_bias = tcfg.qkv_bias;
      sc.tie_embeddings = tcfg.tie_embeddings;
    } else {
      // A rotary base chosen for a long pretraining context fits the student's short one as well.
      sc.rope_theta = tcfg.rope_theta;
    }
    std::unique_ptr<TopKCache> cache;
    if (!cache_prefix.empty()) {
      cache = std::make_unique<TopKCache>(TopKCache::open(cache_prefix));
      cache->check_vocab(tcfg.vocab);
      if (k <= 0) k = cache->k();
      RT_CHECK(k <= cache->k(), "distill: --k ", k, " is larger than the cache ", cache_prefix,
               " holds (K = ", cache->k(), ")");
    } else if (k <= 0) {
      k = 16;
    }
    RT_CHECK(k <= tcfg.vocab, "distill: --k ", k, " exceeds the vocabulary ", tcfg.vocab);

    // Online: the teacher in its own context (its parameters are constants here), same backend.
    std::unique_ptr<Context> tctx;
    std::unique_ptr<Transformer> tmodel;
    std::unique_ptr<Graph> tgraph;
    Tensor* ttokens = nullptr;
    TopKLogprobs ttop;
    if (!cache) {
      tctx = std::make_unique<Context>(*dev.backend);
      tmodel = std::move(load_run_model(tfile, *tctx, sc.compute_dtype, sc.context).model);
      ttokens = tctx->input(DType::I32, {to.batch, sc.context}, "teacher_tokens");
      // The teacher's top K per position computed where its logits are: only [B*T, K] reaches the host.
      ttop = topk_logprobs(*tctx, tmodel->forward(*tctx, ttokens), k);
      ttop.logprobs->flags |= kOutput;
      tgraph = std::make_unique<Graph>(*tctx);
      tgraph->forward(ttop.logprobs);
    }

    Transformer model(ctx, sc, to.seed);
    const TransformerConfig& cfg = model.config();
    std::string init_note = "random (seed " + std::to_string(to.seed) + ")";
    if (init_from_teacher && resume.empty()) {
      // The teacher's weights, once: an online teacher's own copy, or a load just for this.
      std::unique_ptr<Context> ictx;
      std::unique_ptr<Transformer> imodel;
      const Transformer* src = tmodel.get();
      if (!src) {
        ictx = std::make_unique<Context>(*dev.backend);
        imodel = std::move(load_run_model(tfile, *ictx, sc.compute_dtype, sc.context).model);
        src = imodel.get();
      }
      const std::vector<int64_t> layers = retort::init_from_teacher(model, *src);
      std::ostringstream note;
      note << "from the teacher: embedding, final norm and layers";
      for (int64_t l : layers) note << ' ' << l;
      init_note = note.str();
    }
    to.seq_len = cfg.context;
    DistillHead head;
    head.enabled = true;
    head.opts = kd;
    head.k = k;
    head.cache = cache.get();
    LmTrainer trainer(ctx, model, train_shards, to, head);
    LmEvaluator evaluator(ctx, model, val_shards, to.batch, cfg.context, eval_batches);
    Sampler sampler(ctx, model);
    if (!resume.empty()) {
      const Checkpoint ck(resume);
      check_same_vocab(tcfg, ck.config(), teacher, resume);
      trainer.resume(ck);
      std::printf("resumed from %s at step %lld\n", resume.c_str(), (long long)trainer.steps_done());
    }

    std::printf("retort %s | device: %s | compute: %s\n", RETORT_VERSION, dev.desc.c_str(),
                compute_desc(cfg.compute_dtype).c_str());
    std::printf("teacher: %s\n", tfile.checkpoint() ? (teacher + " (" + tcfg.describe() + ")").c_str()
                                                    : tfile.describe().c_str());
    std::printf("teacher top-K: %s, K = %lld\n", cache ? ("cache " + cache_prefix).c_str() : "online",
                (long long)k);
    std::printf("student: %s, %.2fM parameters, init %s; tokens: %s, from %s_*\n", cfg.describe().c_str(),
                double(model.parameter_count()) / 1e6, init_note.c_str(), codec.describe().c_str(),
                shards.c_str());
    std::printf(
        "loss: %.2g·CE + %.2g·T²·D, beta %.2g, T %.2g, normalize_topk %d; %lld steps x %lld x %lld, lr "
        "%.2g\n",
        double(kd.w_hard), double(kd.w_soft), double(kd.beta), double(kd.temperature), int(kd.normalize_topk),
        (long long)to.steps, (long long)to.batch, (long long)cfg.context, double(to.lr));
    std::fflush(stdout);

    std::function<void(const Batch&)> online;
    if (!cache) {
      online = [&](const Batch& b) {
        set_data_int(ttokens, std::vector<int64_t>(b.inputs.begin(), b.inputs.end()));
        tgraph->compute();
        const std::vector<float> lp = get_data(ttop.logprobs);
        set_data_int(trainer.teacher_ids(), get_data_int(ttop.ids));
        set_data(trainer.teacher_logprobs(), lp);
        set_data(trainer.teacher_mask(), std::vector<float>(lp.size(), 1.0f));
      };
    }

    std::map<std::string, std::string> meta = codec.metadata();
    meta["shards"] = shards;
    meta["program"] = "distill";
    meta["compute_dtype"] = dtype_name(cfg.compute_dtype);  // informative: checkpoints load in any
    meta["teacher"] = std::filesystem::absolute(teacher).lexically_normal().string();
    Series s_loss{"train loss", "#1f77b4", {}, {}}, s_soft{"soft part (T²·D)", "#ff7f0e", {}, {}},
        s_hard{"hard part (CE)", "#2ca02c", {}, {}}, s_val{"validation CE", "#d62728", {}, {}};
    auto report_val = [&](int64_t step, double v) {
      s_val.x.push_back(double(step));
      s_val.y.push_back(v);
      std::printf("  validation @ step %lld: cross-entropy %.4f nats/token, perplexity %.2f\n",
                  (long long)step, v, std::exp(v));
      std::fflush(stdout);
    };
    const double val_before = evaluator.run();
    report_val(trainer.steps_done(), val_before);
    double val_after = val_before;
    auto save_ckpt = [&]() {
      if (save.empty()) return;
      meta["val_loss"] = std::to_string(val_after);
      trainer.save(save, meta);
    };
    const int64_t first = trainer.steps_done();
    Progress progress(to.steps, to.batch * cfg.context, log_every, first);
    for (int64_t step = first + 1; step <= to.steps; ++step) {
      const auto r = trainer.step(online);
      s_loss.x.push_back(double(step)), s_loss.y.push_back(r.loss);
      s_soft.x.push_back(double(step)), s_soft.y.push_back(r.soft);
      if (kd.w_hard > 0) s_hard.x.push_back(double(step)), s_hard.y.push_back(r.hard);
      char f[160];
      std::snprintf(f, sizeof f, "loss %.4f (hard %.3f soft %.3f) | lr %.2e", r.loss, r.hard, r.soft,
                    double(r.lr));
      progress.update(step, f);
      if (eval_every > 0 && step % eval_every == 0 && step != to.steps) {
        val_after = evaluator.run();
        report_val(step, val_after);
      }
      if (save_every > 0 && step % save_every == 0 && step != to.steps) save_ckpt();
    }
    const double train_seconds = progress.elapsed();
    val_after = evaluator.run();
    report_val(trainer.steps_done(), val_after);
    save_ckpt();
    std::vector<Series> curves = {s_loss, s_soft};
    if (kd.w_hard > 0) curves.push_back(s_hard);
    curves.push_back(s_val);
    write_svg(svg, "distill: student loss (nats/token)", curves);
    if (!save.empty()) std::printf("checkpoint: %s\n", save.c_str());
    std::printf("loss curves: %s\n", svg.c_str());

    if (sample_len > 0) {
      const std::string prompt = "\n";
      const auto out = sampler.generate(codec.encode(prompt), sample_len, temperature, 0, 1.0f, to.seed + 7);
      std::printf("\n---- sample (temperature %.2g) ----\n%s\n---- end of sample ----\n", double(temperature),
                  printable(codec.decode(out)).c_str());
    }
    const int64_t done = to.steps - first;
    std::printf("\nsummary: %lld steps, %.2fM tokens in %s (%.0f tok/s) on %s; total %s\n", (long long)done,
                double(done * to.batch * cfg.context) / 1e6, duration(train_seconds).c_str(),
                progress.tokens_per_second(), dev.desc.c_str(), duration(seconds_since(t_start)).c_str());
    std::printf("  validation cross-entropy %.4f -> %.4f nats/token (perplexity %.2f -> %.2f)\n", val_before,
                val_after, std::exp(val_before), std::exp(val_after));
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "\ndistill: %s\n", e.what());
    return 1;
  }
}
