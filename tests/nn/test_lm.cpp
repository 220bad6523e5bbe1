// The language-model layer (src/nn/lm.h): checkpoints round-trip, resume is bit-exact on the CPU, every bad
// file is refused with an error naming it and the fault, and a process killed while writing a checkpoint
// leaves a loadable one behind (the old or the new).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <limits>
#include <cstring>
#include <random>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../io/io_test_util.h"
#include "core/cpu_backend.h"
#include "io/file.h"
#include "io/safetensors.h"
#include "io/shards.h"
#include "io/topk_cache.h"
#include "nn/lm.h"
#include "nn/pretrained.h"

namespace retort {
namespace {

using test::expect_error;
using test::ScratchDir;

TransformerConfig tiny_config() {
  TransformerConfig c;
  c.vocab = 48;
  c.context = 8;
  c.layers = 1;
  c.d_model = 16;
  c.heads = 2;
  return c;
}

// Random tokens written as shards "<dir>/d_train_*.bin" and "<dir>/d_val_*.bin".
ShardSet make_shards(const ScratchDir& dir, int64_t vocab, int64_t n = 4000, uint64_t seed = 3) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::vector<int32_t> toks(static_cast<size_t>(n));
  // A little structure (each token likely follows from the previous) so the model has something to learn.
  for (size_t i = 0; i < toks.size(); ++i)
    toks[i] = i > 0 && rng() % 3 ? int32_t((toks[i - 1] * 7 + 3) % vocab) : int32_t(rng() % uint32_t(vocab));
  ShardWriteOptions o;
  o.val_fraction = 0.1;
  o.tokens_per_shard = 1500;  // several shards: the loader crosses boundaries
  return write_shards(toks, dir.file("d"), vocab, o);
}

TrainerOptions tiny_train() {
  TrainerOptions o;
  o.steps = 8;
  o.batch = 3;
  o.seq_len = 8;
  o.warmup = 2;
  o.lr = 1e-2f;
  o.min_lr = 1e-3f;
  o.seed = 5;
  return o;
}

std::vector<std::vector<uint8_t>> param_bytes(const Transformer& m) {
  std::vector<std::vector<uint8_t>> out;
  for (const Tensor* p : m.parameters()) out.push_back(get_bytes(p));
  return out;
}

TEST(Checkpoint, RoundTripParamsMomentsStateAndMetadata) {
  ScratchDir dir;
  const ShardSet set = make_shards(dir, 48);
  CpuBackend be(1);
  Context ctx(be);
  Transformer model(ctx, tiny_config(), 11);
  LmTrainer tr(ctx, model, set.train, tiny_train());
  for (int i = 0; i < 3; ++i) tr.step();
  const std::string path = dir.file("ck.safetensors");
  tr.save(path, {{"tokenizer", "bytes"}, {"shards", "somewhere"}});

  const Checkpoint ck(path);
  EXPECT_EQ(ck.config().describe(), model.config().describe());
  EXPECT_EQ(ck.state().step, 3);
  EXPECT_EQ(ck.state().seed, 5u);
  EXPECT_EQ(ck.state().loader_cursor, tr.loader().cursor());
  EXPECT_EQ(ck.meta("shards"), "somewhere");
  EXPECT_TRUE(ck.has_optimizer());

  CpuBackend be2(1);
  Context ctx2(be2);
  Transformer other(ctx2, tiny_config(), 999);  // a different init, overwritten by the load
  ck.load_model(other);
  EXPECT_EQ(param_bytes(other), param_bytes(model));
  AdamW opt(other.parameters(), AdamWConfig{});
  ck.load_optimizer(opt, other);
  EXPECT_EQ(opt.steps(), 3);
  // The moments are the trainer's, bit for bit (checked through a second save: same bytes on disk).
  const std::string again = dir.file("again.safetensors");
  save_checkpoint(again, other, &opt, ck.state(), {{"tokenizer", "bytes"}, {"shards", "somewhere"}});
  EXPECT_EQ(test::slurp(again), test::slurp(path));

  // A checkpoint without optimizer state still loads a model, but cannot resume.
  const std::string bare = dir.file("bare.safetensors");
  save_checkpoint(bare, model, nullptr, TrainState{});
  EXPECT_FALSE(Checkpoint(bare).has_optimizer());
  expect_error([&] { Checkpoint(bare).load_optimizer(opt, other); }, {bare, "no optimizer state"});
  expect_error(
      [&] {
        save_checkpoint(bare, model, nullptr, TrainState{}, {{"config.vocab", "1"}});
      },
      {"reserved"});
}

// A checkpoint embeds its tokenizer: load_model gives back the model and a tokenizer that encodes alike, from
// the file alone; a tokenizer larger than the model's vocabulary is refused when the file opens.
TEST(Checkpoint, EmbeddedTokenizerTravelsWithTheFile) {
  ScratchDir dir;
  std::string corpus;
  for (int i = 0; i < 200; ++i) corpus += "In the beginning God created the heaven and the earth. ";
  BpeTrainOptions bo;
  bo.vocab_size = 280;
  const Tokenizer tok = Tokenizer::train(corpus, bo);
  CpuBackend be(1);
  Context ctx(be);
  TransformerConfig c = tiny_config();
  c.vocab = 300;
  Transformer model(ctx, c, 4);
  std::map<std::string, std::string> md = {{"tokenizer", "bpe"}};
  embed_tokenizer(md, tok);
  const std::string path = dir.file("m.safetensors");
  save_checkpoint(path, model, nullptr, TrainState{}, md);

  Context ctx2(be);
  const LoadedModel m = load_model(path, ctx2);
  ASSERT_NE(m.tokenizer, nullptr);
  EXPECT_EQ(m.tokenizer->vocab_size(), tok.vocab_size());
  EXPECT_EQ(m.tokenizer->encode("God created the earth", true), tok.encode("God created the earth", true));
  EXPECT_EQ(m.model->config().describe(), model.config().describe());
  EXPECT_EQ(param_bytes(*m.model), param_bytes(model));
  // Without one (a byte-level run), there is none to give.
  save_checkpoint(path, model, nullptr, TrainState{}, {{"tokenizer", "bytes"}});
  EXPECT_EQ(Checkpoint(path).tokenizer(), nullptr);

  Transformer small(ctx, tiny_config(), 4);  // vocabulary 48 < 280 tokens
  std::map<std::string, std::string> big;
  embed_tokenizer(big, tok);
  const std::string bad = dir.file("bad.safetensors");
  save_checkpoint(bad, small, nullptr, TrainState{}, big);
  expect_error([&] { Checkpoint{bad}; }, {bad, "embedded tokenizer has 280 tokens", "vocabulary of 48"});
}

// Train k steps, save, resume in a fresh context for m steps == train k+m steps straight: bit-equal.
TEST(Checkpoint, ResumeIsBitExact) {
  ScratchDir dir;
  const ShardSet set = make_shards(dir, 48);
  const int k = 5;
  TrainerOptions opt = tiny_train();
  opt.steps = 12;  // more windows than one epoch holds? 3600/8/3 = 150 batches: no, but the cosine runs out

  CpuBackend be(2);
  Context ctx(be);
  Transformer straight(ctx, tiny_config(), 11);
  LmTrainer a(ctx, straight, set.train, opt);
  for (int i = 0; i < opt.steps; ++i) a.step();

  const std::string path = dir.file("mid.safetensors");
  {
    CpuBackend be1(2);
    Context c1(be1);
    Transformer first(c1, tiny_config(), 11);
    LmTrainer b(c1, first, set.train, opt);
    for (int i = 0; i < k; ++i) b.step();
    b.save(path);
  }
  CpuBackend be2(2);
  Context c2(be2);
  Transformer resumed(c2, tiny_config(), 77);  // another init: everything must come from the checkpoint
  LmTrainer c(c2, resumed, set.train, opt);
  c.resume(Checkpoint(path));
  EXPECT_EQ(c.steps_done(), k);
  for (int i = k; i < opt.steps; ++i) c.step();
  EXPECT_EQ(c.steps_done(), opt.steps);
  EXPECT_EQ(c.loader().cursor(), a.loader().cursor());
  const auto pa = param_bytes(straight), pc = param_bytes(resumed);
  ASSERT_EQ(pa.size(), pc.size());
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_EQ(pa[i], pc[i]) << straight.parameters()[i]->name;
  // And training moved them: the test would pass trivially otherwise.
  CpuBackend be3(1);
  Context c3(be3);
  Transformer init(c3, tiny_config(), 11);
  EXPECT_NE(param_bytes(init), pa);

  // Resuming with another seed would replay other batches: refused.
  TrainerOptions other = opt;
  other.seed = 6;
  CpuBackend be4(1);
  Context c4(be4);
  Transformer m4(c4, tiny_config(), 11);
  LmTrainer d(c4, m4, set.train, other);
  expect_error([&] { d.resume(Checkpoint(path)); }, {path, "seed"});
}

TEST(Checkpoint, BadFilesNameTheFileAndTheFault) {
  ScratchDir dir;
  const ShardSet set = make_shards(dir, 48);
  CpuBackend be(1);
  Context ctx(be);
  Transformer model(ctx, tiny_config(), 1);
  const std::string good = dir.file("good.safetensors");
  save_checkpoint(good, model, nullptr, TrainState{});
  const size_t size = test::slurp(good).size();

  // Missing.
  const std::string missing = dir.file("nope.safetensors");
  expect_error([&] { Checkpoint{missing}; }, {missing});
  // Truncated.
  const std::string trunc = dir.file("trunc.safetensors");
  test::spit(trunc, test::slurp(good));
  test::truncate_to(trunc, size - 100);
  expect_error([&] { Checkpoint{trunc}; }, {trunc});
  // Corrupt: one bit of a parameter flipped (the last bytes are tensor data).
  const std::string bad = dir.file("corrupt.safetensors");
  test::spit(bad, test::slurp(good));
  test::flip_byte(bad, size - 10);
  expect_error([&] { Checkpoint{bad}; }, {bad, "checksum"});
  // Not a checkpoint: a token shard, and a safetensors file without the checkpoint format.
  expect_error([&] { Checkpoint{set.train[0]}; }, {set.train[0]});
  const std::string plain = dir.file("plain.safetensors");
  save_safetensors(plain, {{"w", model.parameters()[0]}});
  expect_error([&] { Checkpoint{plain}; }, {plain, "wrong magic", "not a retort checkpoint"});
  // A checkpoint where a shard or a cache is expected.
  expect_error([&] { TokenShard{good}; }, {good, "magic"});
  expect_error([&] { TopKCache(std::vector<std::string>{good}); }, {good, "magic"});

  // Wrong vocabulary: a model of another vocabulary, and shards whose tokens exceed it.
  TransformerConfig big = tiny_config();
  big.vocab = 64;
  Transformer other(ctx, big, 1);
  expect_error([&] { Checkpoint(good).load_model(other); }, {good, "vocab=48", "vocab=64"});
  std::vector<int32_t> toks = {1, 2, 60};
  expect_error([&] { write_shards(toks, dir.file("v"), 48); }, {"60"});
}

// The validation loss is one number whatever batch runs it: the same windows (the first N, or all), each
// counted once, a last partial batch included.
TEST(Evaluator, SameWindowsWhateverTheBatch) {
  ScratchDir dir;
  const ShardSet set = make_shards(dir, 48);
  CpuBackend be(1);
  Context ctx(be);
  Transformer model(ctx, tiny_config(), 2);
  LmEvaluator all1(ctx, model, set.val, 1, 8, 0);
  const double ref = all1.run();
  EXPECT_EQ(all1.windows(), (400 - 1) / 8);  // 10 % of 4000 tokens held out; a window needs 8 + 1
  for (int64_t batch : {3, 7, 64}) {
    LmEvaluator ev(ctx, model, set.val, batch, 8, 0);
    EXPECT_EQ(ev.windows(), all1.windows());
    EXPECT_NEAR(ev.run(), ref, 1e-5) << "batch " << batch;
  }
  // The first 13 windows: a prefix of the same stream, so batch 1 and batch 5 (3 batches, the last partial)
  // agree, and differ from all of them.
  LmEvaluator first1(ctx, model, set.val, 1, 8, 13), first5(ctx, model, set.val, 5, 8, 13);
  EXPECT_EQ(first5.windows(), 13);
  EXPECT_EQ(first5.tokens_per_run(), 13 * 8);
  const double f1 = first1.run();
  EXPECT_NEAR(first5.run(), f1, 1e-5);
  EXPECT_GT(std::abs(f1 - ref), 1e-6);
}

TEST(Checkpoint, TeacherStudentVocabularyAndCacheK) {
  ScratchDir dir;
  const ShardSet set = make_shards(dir, 48);
  TransformerConfig s = tiny_config(), t = tiny_config();
  t.vocab = 50;
  expect_error([&] { check_same_vocab(t, s, "teacher.st", "student.st"); },
               {"vocabulary mismatch", "teacher.st", "50", "student.st", "48"});

  // A cache of K = 4 over the training positions.
  TopKCacheSpec spec;
  spec.vocab_size = 48;
  spec.k = 4;
  const std::string prefix = dir.file("cache");
  {
    TopKCacheWriter w(prefix, spec);
    int64_t pos = 0;
    for (const std::string& p : set.train) {
      const int64_t n = TokenShard(p).size();
      std::vector<int32_t> ids(size_t(n * 4));
      std::vector<float> lp(size_t(n * 4));
      for (int64_t i = 0; i < n * 4; ++i)
        ids[size_t(i)] = int32_t(i % 48), lp[size_t(i)] = -1.0f - float(i % 4);
      w.write(pos, n, ids.data(), lp.data());
      pos += n;
    }
    w.finish();
  }
  const TopKCache cache = TopKCache::open(prefix);
  CpuBackend be(1);
  Context ctx(be);
  Transformer model(ctx, s, 1);
  DistillHead head;
  head.enabled = true;
  head.cache = &cache;
  head.k = 5;
  expect_error([&] { LmTrainer(ctx, model, set.train, tiny_train(), head); }, {"K = 5", "cache", "K = 4"});
  head.k = 4;
  Transformer wide(ctx, t, 1);
  expect_error([&] { LmTrainer(ctx, wide, set.train, tiny_train(), head); }, {"48", "50"});
  // K within the cache: a distillation step runs and gives a finite loss.
  LmTrainer ok(ctx, model, set.train, tiny_train(), head);
  EXPECT_TRUE(std::isfinite(ok.step().loss));
  // With a hard loss the step reports both parts, still from its one read.
  head.opts.w_hard = 0.5f;
  head.opts.w_soft = 0.7f;
  LmTrainer parts(ctx, model, set.train, tiny_train(), head);
  for (int i = 0; i < 2; ++i) {
    const uint64_t w0 = be.host_waits();
    const LmTrainer::StepResult r = parts.step();
    EXPECT_EQ(be.host_waits() - w0, 1u);
    EXPECT_GT(r.hard, 0);
    EXPECT_GT(r.soft, 0);
    EXPECT_NEAR(r.loss, 0.5 * r.hard + 0.7 * r.soft, 1e-5 * r.loss);
  }
}

// A child process writes checkpoints in a loop, alternating two models; the parent kills it with SIGKILL at
// random moments. Whatever moment it dies, the file on disk must load and equal one of the two models.
TEST(Checkpoint, KilledWhileWritingLosesNothing) {
  ScratchDir dir;
  const std::string path = dir.file("ck.safetensors");
  CpuBackend be(1);
  Context ctx(be);
  TransformerConfig c = tiny_config();
  c.d_model = 64;  // a bigger file: more time spent inside the write
  c.layers = 2;
  Transformer a(ctx, c, 1), b(ctx, c, 2);
  save_checkpoint(path, a, nullptr, TrainState{});
  const auto pa = param_bytes(a), pb = param_bytes(b);
  std::mt19937 rng(7);
  int seen_a = 0, seen_b = 0;
  for (int round = 0; round < 12; ++round) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      // The child: no threads of the parent survive fork, so it only writes (save_checkpoint copies from host
      // memory on the CPU backend, no thread pool involved).
      for (int i = 0;; ++i) save_checkpoint(path, i % 2 ? a : b, nullptr, TrainState{});
    }
    usleep(useconds_t(2000 + rng() % 40000));
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status));
    const Checkpoint ck(path);
    Context c2(be);
    Transformer m(c2, c, 99);
    ck.load_model(m);
    const auto pm = param_bytes(m);
    EXPECT_TRUE(pm == pa || pm == pb) << "round " << round;
    seen_a += pm == pa;
    seen_b += pm == pb;
  }
  EXPECT_EQ(seen_a + seen_b, 12);
}

// Writes a checkpoint with the given metadata and tensors whose crc32 is valid, as a crafted file would have
// it.
void write_crafted(const std::string& path, const std::vector<std::pair<std::string, const Tensor*>>& tensors,
                   std::map<std::string, std::string> md) {
  md["crc32"] = "0";
  save_safetensors(path, tensors, md);
  const SafeTensors st(path);
  uint32_t crc = 0;
  for (const std::string& n : st.names()) {
    const auto b = st.bytes(n);
    crc = io::crc32_update(crc, b.data(), b.size());
  }
  for (const auto& [k, v] : md) {
    if (k == "crc32") continue;
    const std::string line = k + "=" + v + "\n";
    crc = io::crc32_update(crc, line.data(), line.size());
  }
  char hex[16];
  std::snprintf(hex, sizeof hex, "%08x", crc);
  md["crc32"] = hex;
  save_safetensors(path, tensors, md);
}

long max_rss_kib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

// Issue 25: a small checkpoint with a valid crc32 and config.vocab = 2^62 - 1 made the programs allocate the
// model before any check (heap corruption); vocab 2^27 allocated 3 GiB for 76 s. The config is now checked
// against the stored tensors first: a clean error, fast, with no allocation from the config.
TEST(Checkpoint, ConfigThatDisagreesWithItsTensorsIsRefusedBeforeAllocating) {
  ScratchDir dir;
  CpuBackend be(1);
  Context ctx(be);
  Transformer model(ctx, tiny_config(), 1);
  std::vector<std::pair<std::string, const Tensor*>> tensors;
  for (const Tensor* p : model.parameters()) tensors.emplace_back(p->name, p);
  std::map<std::string, std::string> md = config_to_metadata(model.config());
  md["format"] = kCheckpointFormat;
  md["version"] = "1";
  for (const char* k :
       {"state.step", "state.total_steps", "state.seed", "state.loader_epoch", "state.loader_cursor"})
    md[k] = "0";
  const std::string ok = dir.file("ok.safetensors");
  write_crafted(ok, tensors, md);
  {
    const Checkpoint ck(ok);  // the crafting itself is sound
    Transformer m(ctx, ck.config(), 3);
    ck.load_model(m);
    EXPECT_EQ(param_bytes(m), param_bytes(model));
  }
  const long rss0 = max_rss_kib();
  const auto t0 = std::chrono::steady_clock::now();
  for (const char* vocab : {"4611686018427387903", "134217728", "49"}) {
    auto bad = md;
    bad["config.vocab"] = vocab;
    const std::string p = dir.file(std::string("vocab") + vocab + ".safetensors");
    write_crafted(p, tensors, bad);
    // Past 2^31 the config alone is refused; below, the embedding's stored shape gives it away.
    expect_error([&] { Checkpoint{p}; },
                 {p, std::strlen(vocab) > 10 ? "vocab = " : "tensor 'tok_emb' has shape"});
    // No tensors at all (the 440-byte file): nothing to build a model from.
    const std::string bare = dir.file(std::string("bare") + vocab + ".safetensors");
    write_crafted(bare, {}, bad);
    EXPECT_LT(test::slurp(bare).size(), 1000u);
    expect_error([&] { Checkpoint{bare}; },
                 {bare, std::strlen(vocab) > 10 ? "vocab = " : "no tensor 'tok_emb'"});
  }
  // A huge d_ff and layer count, a missing layer, an extra tensor, a negative step.
  for (auto [key, value] :
       std::vector<std::pair<std::string, std::string>>{{"config.d_ff", "4611686018427387903"},
                                                        {"config.layers", "2"},
                                                        {"config.d_model", "2147483648"}}) {
    auto bad = md;
    bad[key] = value;
    const std::string p = dir.file("bad_" + key + ".safetensors");
    write_crafted(p, tensors, bad);
    expect_error([&] { Checkpoint{p}; }, {p});
  }
  auto extra = tensors;
  extra.emplace_back("stowaway", model.parameters()[0]);
  const std::string px = dir.file("extra.safetensors");
  write_crafted(px, extra, md);
  expect_error([&] { Checkpoint{px}; }, {px, "stowaway", "not part of the model"});
  auto neg = md;
  neg["state.step"] = "-5";
  const std::string pn = dir.file("neg.safetensors");
  write_crafted(pn, tensors, neg);
  expect_error([&] { Checkpoint{pn}; }, {pn, "negative", "step -5"});
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(secs, 1.0);
  EXPECT_LT(max_rss_kib() - rss0, 100 * 1024) << "KiB of peak memory added while refusing the files";
}

// A non-finite loss stops training naming the step, or with skip_nonfinite skips the batch and leaves the
// parameters untouched.
TEST(Trainer, NonFiniteStepStopsOrIsSkipped) {
  ScratchDir dir;
  const ShardSet set = make_shards(dir, 48);
  for (bool skip : {false, true}) {
    CpuBackend be(1);
    Context ctx(be);
    Transformer model(ctx, tiny_config(), 11);
    TrainerOptions opt = tiny_train();
    opt.skip_nonfinite = skip;
    LmTrainer tr(ctx, model, set.train, opt);
    tr.step();
    Tensor* w = model.parameters().back();
    std::vector<float> v = get_data(w);
    v[3] = std::numeric_limits<float>::quiet_NaN();
    set_data(w, v);
    const auto before = param_bytes(model);
    if (!skip) {
      expect_error([&] { tr.step(); }, {"trainer", "step 2"});
      continue;
    }
    const LmTrainer::StepResult r = tr.step();
    EXPECT_TRUE(r.skipped);
    EXPECT_EQ(tr.steps_done(), 1);
    EXPECT_EQ(param_bytes(model), before);
  }
}

// A training step waits for the device once: the read of its loss, norm and parts. The optimizer, the clip
// and the non-finite check run as ops of the step's graph (issue 24). Counted on the CPU backend, whose reads
// count like a device's; tests/cuda/test_cuda_optim.cpp counts the same on a GPU.
TEST(Trainer, OneHostWaitPerStep) {
  ScratchDir dir;
  const ShardSet set = make_shards(dir, 48);
  for (float clip : {1.0f, 0.0f}) {
    SCOPED_TRACE(testing::Message() << "clip " << clip);
    CpuBackend be(1);
    Context ctx(be);
    Transformer model(ctx, tiny_config(), 11);
    TrainerOptions opt = tiny_train();
    opt.clip = clip;
    LmTrainer tr(ctx, model, set.train, opt);
    for (int i = 0; i < 4; ++i) {
      const uint64_t w0 = be.host_waits();
      const LmTrainer::StepResult r = tr.step();
      EXPECT_EQ(be.host_waits() - w0, 1u) << "step " << i + 1;
      EXPECT_FALSE(r.skipped);
      EXPECT_TRUE(std::isfinite(r.loss) && r.loss > 0);
      EXPECT_GT(r.grad_norm, 0);
    }
    EXPECT_EQ(tr.steps_done(), 4);
  }
}

}  // namespace
}  // namespace retort
