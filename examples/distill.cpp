// distill: trains a student language model against a teacher's top-K next-token distribution, offline from a
// teacher-cache file or online with the teacher checkpoint in process. --help tells all.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <type_traits>

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
  --cache PREFIX   a teacher top-K cache written by teacher-cache (offline: the teacher never runs; the
                   cache's record must name this teacher, by a checksum of its weights, its tokenizer and
                   these shards, else it is refused), or
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
part, validation cross-entropy) as an SVG plot; and with --save a checkpoint like train's, which embeds the
tokenizer and records the teacher (--save-every, --save-minutes, Ctrl-C and --resume work the same way:
a resumed run keeps its student, loss and training options, and refuses another teacher or other data
unless --continue-on-new-data 1).

Exit status: 0 done, 1 failed (a bad file, a mismatched cache, out of memory), 2 a bad command line, 130 /
143 stopped by Ctrl-C / SIGTERM after saving.

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
  --save PATH  --save-every N  --save-minutes M (10)  --resume PATH  --continue-on-new-data B   as in train
                      (without --save, periodic and Ctrl-C saves go to distill-run.safetensors here)
Output
  --svg PATH          loss curves (default: the --save path with extension .svg, or distill.svg)
  --curves PATH       the same numbers as CSV (for a picture of several runs: tools/loss_picture.py)
  --log-every N  --eval-every N  --eval-windows N (256)  --sample-len N (200)  --temperature F (0.8)
                      (--eval-windows: the validation loss of train and eval, over the same windows)
Machine
  --device D  --threads N  --compute-dtype D      as in train (auto: bf16 matmuls on CUDA, f32 on the CPU;
                                                 an online teacher runs in the same compute dtype)
  --bucket-dtype D  --bucket-mib N  --zero1 B     as in train: several GPUs or processes under a launcher
                                                 (tools/launch.sh -n N); --batch is per process, rank 0
                                                 prints and saves; a cache is read at any world size
  --help              this text

Examples: distill --teacher build/demo/teacher.safetensors --cache build/data/kjv.bytes.topk16 --steps 500
          distill --teacher SmolLM2-135M-Instruct.Q4_1.gguf --data build/data/austen.txt --layers 4 \
                  --init-from-teacher 1 --steps 300
)";

std::string fstr(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.9g", v);
  return b;
}

struct Run {
  std::string teacher, cache_prefix, save, resume, svg, curves, device = "auto", compute = "auto", shards_opt;
  std::string bucket_dtype = "f32";
  DataOptions data;
  bool init_from_teacher = false, continue_on_new_data = false;
  int64_t k = 0, log_every = -1, eval_every = -1, eval_windows = kValidationWindows, save_every = 0;
  int64_t sample_len = 200;
  double save_minutes = 10;
  TopKDistillOptions kd;
  TransformerConfig sc;
  TrainerOptions to;
  float temperature = 0.8f;
  int threads = 0;
};

// A resumed run keeps what its checkpoint recorded: a flag that says otherwise is refused.
void same_as_run(const Args& a, const std::string& flag, const std::string& given, const std::string& was) {
  a.check(!a.given(flag) || given == was, flag + " " + given + " differs from the run's " + was +
                                              " (--resume keeps the student and its loss: drop the flag)");
}

int run(Args& a, Run& o, int argc, char** argv) {
  TopKDistillOptions& kd = o.kd;
  TransformerConfig& sc = o.sc;
  TrainerOptions& to = o.to;
  a.parse(argc, argv);
  a.check(!o.teacher.empty(), "--teacher is required");
  a.check(to.steps >= 1, "--steps must be >= 1");
  a.check(to.batch >= 1 && to.batch <= (int64_t(1) << 20), "--batch must be in [1, 2^20]");
  a.check(to.lr > 0 && to.lr < 10, "--lr must be in (0, 10)");
  a.check(o.k >= 0, "--k must be >= 1 (0: the cache's, or 16 online)");
  a.check(kd.w_hard >= 0 && kd.w_soft >= 0 && kd.w_hard + kd.w_soft > 0,
          "--w-hard and --w-soft must be >= 0, not both 0");
  a.check(kd.beta >= 0 && kd.beta <= 1, "--beta must be in [0, 1]");
  a.check(kd.temperature > 0, "--kd-temperature must be > 0");
  a.check(o.save_every >= 0 && o.save_minutes >= 0, "--save-every and --save-minutes must be >= 0");
  a.check(o.eval_windows >= 0, "--eval-windows must be >= 0 (0: all)");
  a.check(o.sample_len >= 0 && o.temperature >= 0, "--sample-len and --temperature must be >= 0");
  a.check(sc.context >= 0, "--context must be >= 1 (0: the teacher's)");
  a.check(o.resume.empty() || !a.given("--init-from-teacher"),
          "--init-from-teacher starts a run; --resume continues one");
  a.check(!o.continue_on_new_data || !o.resume.empty(), "--continue-on-new-data goes with --resume");
  a.check_machine(o.threads, o.device);
  a.check_model(sc);
  check_compute_dtype(a, o.compute);
  check_data_options(a, o.data);
  if (o.svg.empty())
    o.svg = o.save.empty() ? std::string("distill.svg")
                           : std::filesystem::path(o.save).replace_extension(".svg").string();
  if (!o.save.empty()) check_output_path(o.save, "--save");
  check_output_path(o.svg, "--svg");
  if (!o.curves.empty()) check_output_path(o.curves, "--curves");

  std::unique_ptr<Checkpoint> ck;
  if (!o.resume.empty()) {
    ck = std::make_unique<Checkpoint>(o.resume);
    a.check(ck->has_optimizer(), "--resume " + o.resume + " holds no optimizer state: start a new run");
    a.check(ck->meta("program") == "distill",
            "--resume " + o.resume + " is not a distill run (it was written by " +
                ck->meta("program", "an older build") + "): start a new run");
    const TransformerConfig& c = ck->config();
    same_as_run(a, "--layers", std::to_string(sc.layers), std::to_string(c.layers));
    same_as_run(a, "--d-model", std::to_string(sc.d_model), std::to_string(c.d_model));
    same_as_run(a, "--heads", std::to_string(sc.heads), std::to_string(c.heads));
    same_as_run(a, "--kv-heads", std::to_string(sc.kv_heads), std::to_string(c.kv_heads));
    same_as_run(a, "--d-ff", std::to_string(sc.d_ff), std::to_string(c.d_ff));
    same_as_run(a, "--context", std::to_string(sc.context), std::to_string(c.context));
    same_as_run(a, "--seed", std::to_string(to.seed), std::to_string(ck->state().seed));
    const auto rec = [&](const std::string& flag, const std::string& key, auto* v) {
      const std::string r = ck->meta(key);
      if (r.empty()) return;
      if (a.given(flag)) {
        char given[32], was[32];
        std::snprintf(given, sizeof given, "%g", double(*v));
        std::snprintf(was, sizeof was, "%g", std::stod(r));
        a.check(fstr(double(*v)) == r, flag + " " + given + " differs from the run's " + was +
                                           " (--resume keeps the student and its loss: drop the flag)");
        return;
      }
      *v = static_cast<std::remove_pointer_t<decltype(v)>>(std::stod(r));
    };
    resume_batch(a, *ck, dist::world_from_env().size, &to.batch);
    rec("--lr", "train.lr", &to.lr);
    rec("--warmup", "train.warmup", &to.warmup);
    rec("--weight-decay", "train.weight_decay", &to.weight_decay);
    rec("--clip", "train.clip", &to.clip);
    rec("--k", "distill.k", &o.k);
    rec("--w-hard", "distill.w_hard", &kd.w_hard);
    rec("--w-soft", "distill.w_soft", &kd.w_soft);
    rec("--beta", "distill.beta", &kd.beta);
    rec("--kd-temperature", "distill.temperature", &kd.temperature);
    if (!ck->meta("distill.normalize_topk").empty() && !a.given("--normalize-topk"))
      kd.normalize_topk = ck->meta("distill.normalize_topk") == "1";
    sc = c;
    to.seed = ck->state().seed;
    if (!a.given("--steps")) to.steps = std::max(ck->state().total_steps, ck->state().step);
    a.check(to.steps >= ck->state().step, "--steps " + std::to_string(to.steps) +
                                              " is fewer than the run has done (" +
                                              std::to_string(ck->state().step) + ")");
    if (!a.given("--shards") && !a.given("--data")) o.shards_opt = ck->meta("shards");
  }
  if (to.warmup < 0) to.warmup = std::max<int64_t>(1, to.steps / 20);
  a.check(to.warmup <= to.steps, "--warmup must be in [0, --steps]");
  if (o.log_every <= 0) o.log_every = std::max<int64_t>(1, to.steps / 15);
  if (o.eval_every < 0) o.eval_every = std::max<int64_t>(1, to.steps / 3);
  to.min_lr = to.lr / 10;

  const auto t_start = Clock::now();
  const PretrainedModel tfile = PretrainedModel::open(o.teacher);
  const TransformerConfig tcfg = tfile.config();
  if (sc.context <= 0) sc.context = tfile.checkpoint() ? tcfg.context : std::min<int64_t>(256, tcfg.context);
  a.check(sc.context <= tcfg.context, "--context " + std::to_string(sc.context) +
                                          " exceeds the teacher's context " + std::to_string(tcfg.context));
  // The student speaks the teacher's tokenizer: its vocabulary, and the shards made with it.
  const TextCodec codec = tfile.checkpoint() ? TextCodec::from_checkpoint(*tfile.checkpoint())
                                             : TextCodec::model(o.teacher, tfile.tokenizer());
  const std::string teacher_fp = model_fingerprint(tfile);
  if (ck) {
    check_same_vocab(tcfg, ck->config(), o.teacher, o.resume);
    const std::string was = ck->meta("teacher.fingerprint");
    if (!was.empty() && was != teacher_fp && !o.continue_on_new_data)
      throw UsageError("--resume " + o.resume + ": the run distilled from another teacher (" +
                       ck->meta("teacher") + ", " + was + "; --teacher is " + teacher_fp +
                       "); pass --continue-on-new-data 1 to go on with this one");
  }
  // The cache must be this teacher's, over these tokens: its record says whose it is (checked before the
  // text is tokenized; the tokens' checksum once the shards are known).
  std::unique_ptr<TopKCache> cache;
  std::map<std::string, std::string> rec;
  const auto field = [&](const std::string& key) {
    const auto it = rec.find(key);
    return it == rec.end() ? std::string("(none)") : it->second;
  };
  if (!o.cache_prefix.empty()) {
    rec = read_record(cache_record_path(o.cache_prefix));
    RT_CHECK(!rec.empty(), "--cache ", o.cache_prefix, ": no record ", cache_record_path(o.cache_prefix),
             " of its teacher (an incomplete cache, or one from an older teacher-cache): rebuild it with "
             "teacher-cache --teacher ",
             o.teacher);
    RT_CHECK(field("teacher.fingerprint") == teacher_fp, "--cache ", o.cache_prefix,
             " was written by another teacher: ", field("teacher"), " (", field("teacher.fingerprint"),
             "), not --teacher ", o.teacher, " (", teacher_fp, "); rebuild it with teacher-cache");
    RT_CHECK(field("tokenizer.crc32") == codec.metadata().at("tokenizer.crc32") &&
                 field("tokenizer") == codec.kind(),
             "--cache ", o.cache_prefix, " was made with another tokenizer (", field("tokenizer"), " ",
             field("tokenizer.crc32"), ", this teacher's ", codec.kind(), " ",
             codec.metadata().at("tokenizer.crc32"), ")");
    RT_CHECK(field("split") == "train", "--cache ", o.cache_prefix, " covers the '", field("split"),
             "' split; distill trains on 'train'");
    cache = std::make_unique<TopKCache>(open_teacher_cache(o.cache_prefix, rec));
    cache->check_vocab(tcfg.vocab);
    RT_CHECK(field("k") == "(none)" || field("k") == std::to_string(cache->k()),
             cache_record_path(o.cache_prefix), ": records K = ", field("k"), " but its shards hold K = ",
             cache->k());
    if (o.k <= 0) o.k = cache->k();
    RT_CHECK(o.k <= cache->k(), "--k ", o.k, " is larger than the cache ", o.cache_prefix,
             " holds (K = ", cache->k(), ")");
  } else if (o.k <= 0) {
    o.k = 16;
  }
  a.check(o.bucket_dtype == "f32" || o.bucket_dtype == "bf16",
          "--bucket-dtype is f32 or bf16, got '" + o.bucket_dtype + "'");
  a.check(to.bucket_mib >= 1 && to.bucket_mib <= 4096, "--bucket-mib must be in [1, 4096]");
  to.bucket_dtype = o.bucket_dtype == "bf16" ? DType::BF16 : DType::F32;
  Device dev = pick_device(o.device, o.threads);
  const auto group = join_world(dev);
  to.group = group.get();
  std::string shards = o.shards_opt;
  if (!o.data.data.empty()) {
    // Rank 0 makes the shards; the others wait for it, then find them made.
    if (!group->is_root()) group->host().barrier();
    o.data.shards = shards;
    prepare_shards(o.data, codec);
    shards = o.data.shards;
    if (group->is_root()) group->host().barrier();
  }
  if (shards.empty() && cache) shards = field("shards");  // the tokens the cache was made for
  if (shards.empty() && tfile.checkpoint()) shards = tfile.checkpoint()->meta("shards");
  if (shards.empty()) throw UsageError("a pretrained teacher needs --data TEXT or --shards PREFIX");
  shards = std::filesystem::absolute(shards).lexically_normal().string();
  const auto train_shards = shards_for(shards, "train");
  const auto val_shards = shards_for(shards, "val");
  const std::string shards_fp = shards_fingerprint(shards);
  if (ck) {
    const std::string was = ck->meta("shards.fingerprint");
    if (!was.empty() && was != shards_fp && !o.continue_on_new_data)
      throw UsageError("--resume " + o.resume + ": the shards " + shards + "_* hold other tokens than " +
                       "the run trained on (fingerprint " + shards_fp + ", the run's " + was +
                       "); pass --continue-on-new-data 1 to go on with them");
  }
  if (cache) {
    RT_CHECK(field("shards.fingerprint") == shards_fp, "--cache ", o.cache_prefix,
             " holds the teacher's candidates for other tokens: it was made over ", field("shards"),
             "_* (fingerprint ", field("shards.fingerprint"), "), this run trains on ", shards,
             "_* (fingerprint ", shards_fp, "); rebuild it with teacher-cache --shards ", shards);
  }
  check_shards_tokenizer(shards, codec, o.teacher);
  const int64_t shard_vocab = shard_vocab_bound(val_shards);
  RT_CHECK(shard_vocab <= tcfg.vocab, "vocabulary mismatch: the shards ", shards, "_* hold token id ",
           shard_vocab - 1, ", the teacher ", o.teacher, " has a vocabulary of ", tcfg.vocab,
           " (shards made with another tokenizer?)");
  if (!ck) {
    sc.vocab = tcfg.vocab;
    if (o.init_from_teacher) {
      // The teacher's widths, so its layers fit; only the depth is the student's own.
      sc.d_model = tcfg.d_model, sc.heads = tcfg.heads, sc.kv_heads = tcfg.kv_heads, sc.d_ff = tcfg.d_ff;
      sc.rope_theta = tcfg.rope_theta, sc.norm_eps = tcfg.norm_eps, sc.qkv_bias = tcfg.qkv_bias;
      sc.tie_embeddings = tcfg.tie_embeddings;
    } else {
      // A rotary base chosen for a long pretraining context fits the student's short one as well.
      sc.rope_theta = tcfg.rope_theta;
    }
    try {
      (void)sc.resolved();
    } catch (const Error& e) {
      a.fail(std::string("bad student shape: ") + e.what());
    }
  }
  RT_CHECK(o.k <= tcfg.vocab, "--k ", o.k, " exceeds the vocabulary ", tcfg.vocab);

  sc.compute_dtype = pick_compute_dtype(o.compute, dev);
  Context ctx(*dev.backend);
  // Online: the teacher in its own context (its parameters are constants here), same backend.
  std::unique_ptr<Context> tctx;
  std::unique_ptr<Transformer> tmodel;
  std::unique_ptr<Graph> tgraph;
  Tensor* ttokens = nullptr;
  TopKLogprobs ttop;
  if (!cache) {
    tctx = std::make_unique<Context>(*dev.backend);
    tmodel = std::move(load_run_model(tfile, *tctx, sc.compute_dtype, sc.context).model);
    tmodel->freeze_weights();  // the teacher only runs forward: its 16-bit weights made once
    ttokens = tctx->input(DType::I32, {to.batch, sc.context}, "teacher_tokens");
    // The teacher's top K per position from its lm head in chunks (the [B*T, V] logits never exist whole),
    // where its hidden states are: only [B*T, K] reaches the host.
    Tensor* th = tmodel->hidden(*tctx, ttokens);
    const TopKLogprobsOutputs head = fused_linear_topk_logprobs(*tctx, tmodel->head_input(*tctx, th),
                                                                tmodel->head_weight(*tctx), o.k, nullptr);
    ttop = {head.logprobs, head.ids};
    tgraph = std::make_unique<Graph>(*tctx);
    tgraph->forward(ttop.logprobs);
  }

  Transformer model(ctx, sc, to.seed);
  const TransformerConfig& cfg = model.config();
  std::string init_note = "random (seed " + std::to_string(to.seed) + ")";
  if (o.init_from_teacher && !ck) {
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
  head.k = o.k;
  head.cache = cache.get();
  LmTrainer trainer(ctx, model, train_shards, to, head);
  LmEvaluator evaluator(ctx, model, val_shards, to.batch, cfg.context, o.eval_windows);
  Sampler sampler(ctx, model);
  if (ck) {
    trainer.resume(*ck);
    std::printf("resumed from %s at step %lld of %lld\n", o.resume.c_str(), (long long)trainer.steps_done(),
                (long long)to.steps);
  }

  std::printf("retort %s | device: %s | compute: %s\n", RETORT_VERSION, dev.desc.c_str(),
              compute_desc(cfg.compute_dtype).c_str());
  if (!dev.note.empty()) std::printf("%s\n", dev.note.c_str());
  std::printf("teacher: %s\n", tfile.checkpoint() ? (o.teacher + " (" + tcfg.describe() + ")").c_str()
                                                  : tfile.describe().c_str());
  std::printf("teacher top-K: %s, K = %lld\n", cache ? ("cache " + o.cache_prefix).c_str() : "online",
              (long long)o.k);
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
      // Device to device on one backend: the teacher's top K never waits for the host (issue 24).
      copy_data(trainer.teacher_ids(), ttop.ids);
      copy_data(trainer.teacher_logprobs(), ttop.logprobs);
    };
    set_data(trainer.teacher_mask(), std::vector<float>(size_t(trainer.teacher_mask()->nelements()), 1.0f));
  }

  std::map<std::string, std::string> meta = codec.checkpoint_metadata();
  meta["shards"] = shards;
  meta["shards.fingerprint"] = shards_fp;
  meta["program"] = "distill";
  meta["compute_dtype"] = dtype_name(cfg.compute_dtype);  // informative: checkpoints load in any
  meta["teacher"] = std::filesystem::absolute(o.teacher).lexically_normal().string();
  meta["teacher.fingerprint"] = teacher_fp;
  meta["train.batch"] = std::to_string(to.batch * group->size());  // the whole step's
  meta["train.lr"] = fstr(to.lr);
  meta["train.warmup"] = std::to_string(to.warmup);
  meta["train.weight_decay"] = fstr(to.weight_decay);
  meta["train.clip"] = fstr(to.clip);
  meta["distill.k"] = std::to_string(o.k);
  meta["distill.w_hard"] = fstr(kd.w_hard);
  meta["distill.w_soft"] = fstr(kd.w_soft);
  meta["distill.beta"] = fstr(kd.beta);
  meta["distill.temperature"] = fstr(kd.temperature);
  meta["distill.normalize_topk"] = kd.normalize_topk ? "1" : "0";
  meta["val_windows"] = std::to_string(evaluator.windows());
  Series s_loss{"train loss", "#1f77b4", {}, {}}, s_soft{"soft part (T²·D)", "#ff7f0e", {}, {}},
      s_hard{"hard part (CE)", "#2ca02c", {}, {}}, s_val{"validation CE", "#d62728", {}, {}};
  Curves table;
  const int64_t step_tokens = to.batch * cfg.context * group->size();
  auto report_val = [&](int64_t step, double v) {
    table.validation(step, step * step_tokens, v);
    s_val.x.push_back(double(step));
    s_val.y.push_back(v);
    std::printf("  validation @ step %lld: cross-entropy %.4f nats/token, perplexity %.2f\n", (long long)step,
                v, std::exp(v));
    std::fflush(stdout);
  };
  const double val_before = evaluator.run();
  report_val(trainer.steps_done(), val_before);
  double val_after = val_before;
  auto save_ckpt = [&](const std::string& path) {
    meta["val_loss"] = fstr(val_after);
    // Every rank holds the same state, but for ZeRO-1's moments, which every rank gathers to rank 0.
    if (group->is_root() || trainer.zero1()) trainer.save(path, meta);
  };
  install_stop_handler("distill");
  const int64_t first = trainer.steps_done();
  Progress progress(to.steps, step_tokens, o.log_every, first);
  auto last_save = Clock::now();
  // Where the run is kept: --save, else (periodic and Ctrl-C saves only) distill-run.safetensors here.
  const std::string keep = o.save.empty() ? std::string("distill-run.safetensors") : o.save;
  bool kept = false;
  // Every rank decides together whether to stop (stop_agreed), before the first step and after each one.
  bool stop = stop_agreed(*group);
  for (int64_t step = first + 1; step <= to.steps && !stop; ++step) {
    const auto r = trainer.step(online);
    table.step(step, step * step_tokens, r.loss, kd.w_hard > 0 ? r.hard : NAN, r.soft);
    s_loss.x.push_back(double(step)), s_loss.y.push_back(r.loss);
    s_soft.x.push_back(double(step)), s_soft.y.push_back(r.soft);
    if (kd.w_hard > 0) s_hard.x.push_back(double(step)), s_hard.y.push_back(r.hard);
    char f[160];
    std::snprintf(f, sizeof f, "loss %.4f (hard %.3f soft %.3f) | lr %.2e", r.loss, r.hard, r.soft,
                  double(r.lr));
    progress.update(step, f);
    stop = stop_agreed(*group);
    if (step == to.steps || stop) break;
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
        save_ckpt(keep);
        kept = true;
      } catch (const Error& e) {
        std::printf("\nwarning: could not save the run: %s (training goes on)\n", e.what());
      }
      last_save = Clock::now();
    }
  }
  if (stop) {
    const std::string& path = keep;
    save_ckpt(path);
    std::printf(
        "\ndistill: stopped at step %lld of %lld; the run is saved in %s\n  continue with: distill "
        "--teacher %s%s --resume %s%s\n",
        (long long)trainer.steps_done(), (long long)to.steps, path.c_str(), o.teacher.c_str(),
        cache ? (" --cache " + o.cache_prefix).c_str() : "", path.c_str(),
        o.save.empty() ? "" : (" --save " + o.save).c_str());
    return stopped_status();
  }
  const double train_seconds = progress.elapsed();
  val_after = evaluator.run();
  report_val(trainer.steps_done(), val_after);
  if (!o.save.empty() || kept) save_ckpt(keep);
  std::vector<Series> curves = {s_loss, s_soft};
  if (kd.w_hard > 0) curves.push_back(s_hard);
  curves.push_back(s_val);
  if (group->is_root()) {
    write_svg(o.svg, "distill: student loss (nats/token)", curves);
    if (!o.curves.empty()) table.write(o.curves);
  }
  if (!o.save.empty() || kept) std::printf("checkpoint: %s\n", keep.c_str());
  std::printf("loss curves: %s\n", o.svg.c_str());

  if (o.sample_len > 0) {
    const std::string prompt = "\n";
    const auto out =
        sampler.generate(codec.encode(prompt), o.sample_len, o.temperature, 0, 1.0f, to.seed + 7);
    std::printf("\n---- sample (temperature %.2g) ----\n%s\n---- end of sample ----\n", double(o.temperature),
                printable(codec.decode(out)).c_str());
  }
  print_summary(to.steps - first, step_tokens, train_seconds, progress, dev.desc, t_start, "",
                val_before, val_after, evaluator.windows());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Run o;
  o.kd.w_hard = 0.5f;
  o.kd.w_soft = 0.5f;
  o.sc.layers = 2;
  o.sc.d_model = 64;
  o.sc.heads = 2;
  o.sc.context = 0;  // 0: the teacher checkpoint's, or 256 for a pretrained teacher
  o.to.warmup = -1;
  Args a("distill", kHelp);
  a.add("--teacher", &o.teacher), a.add("--cache", &o.cache_prefix), a.add("--k", &o.k);
  a.add("--shards", &o.shards_opt), a.add("--data", &o.data.data), a.add("--max-bytes", &o.data.max_bytes);
  a.add("--val-frac", &o.data.val_frac), a.add("--context", &o.sc.context);
  a.add("--init-from-teacher", &o.init_from_teacher);
  a.add("--w-hard", &o.kd.w_hard), a.add("--w-soft", &o.kd.w_soft), a.add("--beta", &o.kd.beta);
  a.add("--kd-temperature", &o.kd.temperature), a.add("--normalize-topk", &o.kd.normalize_topk);
  a.add("--layers", &o.sc.layers), a.add("--d-model", &o.sc.d_model), a.add("--heads", &o.sc.heads);
  a.add("--kv-heads", &o.sc.kv_heads), a.add("--d-ff", &o.sc.d_ff);
  a.add("--steps", &o.to.steps), a.add("--batch", &o.to.batch), a.add("--lr", &o.to.lr),
      a.add("--warmup", &o.to.warmup);
  a.add("--weight-decay", &o.to.weight_decay), a.add("--clip", &o.to.clip), a.add("--seed", &o.to.seed);
  a.add("--save", &o.save), a.add("--save-every", &o.save_every), a.add("--save-minutes", &o.save_minutes);
  a.add("--resume", &o.resume), a.add("--continue-on-new-data", &o.continue_on_new_data),
      a.add("--svg", &o.svg);
  a.add("--curves", &o.curves);
  a.add("--log-every", &o.log_every), a.add("--eval-every", &o.eval_every),
      a.add("--eval-windows", &o.eval_windows);
  a.add("--sample-len", &o.sample_len), a.add("--temperature", &o.temperature);
  a.add("--device", &o.device), a.add("--threads", &o.threads), a.add("--compute-dtype", &o.compute);
  a.add("--bucket-dtype", &o.bucket_dtype), a.add("--bucket-mib", &o.to.bucket_mib);
  a.add("--zero1", &o.to.zero1);
  return run_main(
      "distill", [&] { return run(a, o, argc, argv); },
      [&] {
        TransformerConfig c = o.sc;
        if (c.vocab <= 0) c.vocab = 256;
        return memory_hint(c, true, o.to.batch);
      });
}
