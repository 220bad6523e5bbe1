// teacher-cache: runs a teacher (a retort checkpoint, a GGUF file or a Hugging Face directory) over the
// training shards and writes its top-K next-token candidates per position to a teacher top-K cache
// (src/io/topk_cache.h), which distill reads.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <future>

#include "common.h"

using namespace ex;

namespace {

const char* kHelp =
    R"(teacher-cache - write a teacher's top-K next-token distribution for every position of the shards.

Loads the teacher — a checkpoint written by train, a pretrained model as a GGUF file (llama.cpp's format;
quantized weights are decoded on load) or a Hugging Face directory — reads the token shards (those a
checkpoint was trained on, --shards, or --data tokenized with the teacher's tokenizer), and runs the teacher
over them window by window in stream order: windows of --context tokens, stride = the window, the batch
loader's windows exactly. For each position p it keeps the K most likely next tokens and
their log-probabilities, log softmax(teacher logits at p), best first (selected where the logits are, on
the GPU with --device cuda: only K per position reaches the host), and writes them to
"<out>_00000.topk", ... — checksummed shards that distill memory-maps. Position p holds the teacher's
distribution for token p+1, the one predicted from p: a training batch row starting at s reads [s, s+T) and
lines up with its targets. Every shard is written atomically.

The cache is written under "<out>.incomplete_*" and takes its name only when complete, with a record
"<out>.teacher" (the teacher's identity and a checksum of its weights, its tokenizer, the shards and their
checksum) that distill checks: a cache of another teacher, tokenizer or text is refused there. A previous
cache at --out stays valid until the new one replaces it. Ctrl-C (or SIGTERM) stops after the current
batch and removes the incomplete cache (exit 130 / 143); a second Ctrl-C aborts at once.

Several processes (tools/launch.sh -n N, one per GPU): rank r runs the teacher over its share of the windows
and writes "<out>_r<r>_00000.topk", ...; the record lists every rank's shards with their header checksums,
and distill reads the cache at any number of processes (a missing shard or one of another cache is refused).
The ranks must share the file system of --out.

Cost: one teacher forward per position, and on disk per position K·4 bytes of ids, K·2 (bf16) or K·4 (f32)
of logprobs and K valid flags.

Exit status: 0 done, 1 failed (a bad file, a vocabulary mismatch, out of memory), 2 a bad command line,
130 / 143 stopped by Ctrl-C / SIGTERM.

Usage: teacher-cache --teacher PATH [options]

  --teacher PATH      teacher: checkpoint, GGUF file or Hugging Face directory (required)
  --k N               candidates per position (default 16)
  --out PREFIX        cache prefix (default: <shards>.topk<K>); its directory is made
  --shards PREFIX     token shards (default: the ones recorded in a teacher checkpoint, or --data's)
  --data PATH         a text to tokenize with the teacher's tokenizer into shards (reused when they exist)
  --max-bytes N       only the first N bytes of --data (default 0: all)
  --val-frac F        the held-out fraction of --data's tokens (default 0.05)
  --context N         tokens per window (default: a checkpoint's context, 1024 for a pretrained model)
  --split NAME        train or val (default train)
  --dtype D           bf16 or f32 logprobs (default bf16)
  --compute-dtype D   auto, f32, bf16 or f16: the teacher's matmuls (default auto: bf16 on CUDA, f32 on
                      the CPU)
  --batch N           windows per forward (default 16)
  --device D          auto, cpu or cuda (default auto)
  --threads N         CPU threads (default 0: all cores)
  --help              this text

Examples: teacher-cache --teacher build/demo/teacher.safetensors --k 32
          teacher-cache --teacher SmolLM2-135M-Instruct.Q4_1.gguf --data build/data/austen.txt --k 64
)";

// Removes the files of a cache being written under prefix (shards and their temporaries).
void remove_cache_files(const std::string& prefix) {
  namespace fs = std::filesystem;
  const fs::path p(prefix);
  const fs::path dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  const std::string stem = p.filename().string() + "_";
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    // "<stem>00000.topk", a rank's "<stem>r<R>_00000.topk", and their temporaries "....topk.tmp.<pid>";
    // nothing else.
    if (name.compare(0, stem.size(), stem) != 0) continue;
    size_t at = stem.size();
    if (at < name.size() && name[at] == 'r') {
      size_t d = at + 1;
      while (d < name.size() && std::isdigit(static_cast<unsigned char>(name[d]))) ++d;
      if (d == at + 1 || d >= name.size() || name[d] != '_') continue;
      at = d + 1;
    }
    bool ours = name.size() >= at + 10 && name.compare(at + 5, 5, ".topk") == 0 &&
                (name.size() == at + 10 || name.compare(at + 10, 5, ".tmp.") == 0);
    for (size_t i = 0; ours && i < 5; ++i) ours = std::isdigit(static_cast<unsigned char>(name[at + i]));
    if (ours) fs::remove(e.path(), ec);
  }
}

int run(Args& a, int argc, char** argv, std::string& teacher, int64_t& batch) {
  std::string out, shards, split = "train", dtype = "bf16", device = "auto", compute = "auto";
  int64_t k = 16, context = 0;
  int threads = 0;
  DataOptions data;
  a.add("--teacher", &teacher), a.add("--k", &k), a.add("--out", &out), a.add("--shards", &shards);
  a.add("--data", &data.data), a.add("--max-bytes", &data.max_bytes), a.add("--val-frac", &data.val_frac);
  a.add("--context", &context), a.add("--compute-dtype", &compute);
  a.add("--split", &split), a.add("--dtype", &dtype), a.add("--batch", &batch), a.add("--device", &device);
  a.add("--threads", &threads);
  a.parse(argc, argv);
  a.check(!teacher.empty(), "--teacher is required");
  a.check(dtype == "bf16" || dtype == "f32", "--dtype is bf16 or f32, got '" + dtype + "'");
  a.check(batch >= 1 && batch <= (int64_t(1) << 20), "--batch must be in [1, 2^20]");
  a.check(context >= 0, "--context must be >= 1 (0: the teacher's)");
  a.check(k >= 1, "--k must be >= 1");
  a.check(split == "train" || split == "val", "--split is train or val, got '" + split + "'");
  a.check_machine(threads, device);
  check_compute_dtype(a, compute);
  check_data_options(a, data);
  if (!out.empty()) check_output_prefix(out, "--out");

  const PretrainedModel tfile = PretrainedModel::open(teacher);
  const TransformerConfig& tcfg = tfile.config();
  if (context == 0) context = tfile.checkpoint() ? tcfg.context : std::min<int64_t>(1024, tcfg.context);
  a.check(context <= tcfg.context, "--context " + std::to_string(context) +
                                       " exceeds the teacher's context " + std::to_string(tcfg.context));
  a.check(k <= tcfg.vocab,
          "--k " + std::to_string(k) + " must be in [1, vocab " + std::to_string(tcfg.vocab) + "]");
  TextCodec codec = tfile.checkpoint() ? TextCodec::from_checkpoint(*tfile.checkpoint())
                                       : TextCodec::model(teacher, tfile.tokenizer());
  if (!data.data.empty()) {
    data.shards = shards;
    prepare_shards(data, codec);
    shards = data.shards;
  }
  if (shards.empty() && tfile.checkpoint()) shards = tfile.checkpoint()->meta("shards");
  if (shards.empty()) throw UsageError("a pretrained teacher needs --data TEXT or --shards PREFIX");
  shards = std::filesystem::absolute(shards).lexically_normal().string();
  if (out.empty()) {
    out = shards + ".topk" + std::to_string(k);
    check_output_prefix(out, "--out");
  }
  const std::vector<std::string> paths = shards_for(shards, split);
  check_shards_tokenizer(shards, codec, teacher);
  const int64_t shard_vocab = shard_vocab_bound(paths);
  RT_CHECK(shard_vocab <= tcfg.vocab, "vocabulary mismatch: the shards ", shards, "_", split,
           "_* hold token id ", shard_vocab - 1, ", the teacher ", teacher, " has a vocabulary of ",
           tcfg.vocab, " (shards made with another tokenizer?)");

  Device dev = pick_device(device, threads);
  const std::unique_ptr<dist::ProcessGroup> group = join_world(dev);
  Context ctx(*dev.backend);
  RunModel tm = load_run_model(tfile, ctx, pick_compute_dtype(compute, dev), context);
  Transformer& model = *tm.model;
  model.freeze_weights();  // a forward-only model: its 16-bit weights made once
  const TransformerConfig& cfg = model.config();
  const int64_t T = cfg.context, V = cfg.vocab;
  BatchLoaderOptions lo;
  lo.batch = 1;
  lo.seq_len = T;
  lo.shuffle = false;
  BatchLoader probe(paths, lo);
  const int64_t windows = probe.windows();
  // Rank r of N caches the windows [W r / N, W (r+1) / N) into shards of its own; every rank runs the same
  // number of batches (the last may hold none of its windows), so they stop together (stop_agreed).
  const int64_t N = group->size(), r = group->rank();
  const int64_t w_lo = windows * r / N, w_hi = windows * (r + 1) / N, mine = w_hi - w_lo;
  const int64_t B = std::max<int64_t>(1, std::min(batch, (windows + N - 1) / N));
  lo.batch = B;
  BatchLoader loader(paths, lo);
  loader.seek(0, w_lo);
  // The lm head runs in chunks on the device (the [B*T, V] logits never exist whole): the graph hands back
  // the top K per position and the summed loss, so the host reads [B*T, K] instead of [B*T, V].
  Tensor* tokens = ctx.input(DType::I32, {B, T}, "tokens");
  Tensor* targets = ctx.input(DType::I32, {B * T}, "targets");  // -100 beyond the windows that count
  Tensor* hidden = model.hidden(ctx, tokens);
  // [B*T, K] each, best first, and the teacher's own loss summed over the targets that count.
  const TopKLogprobsOutputs top =
      fused_linear_topk_logprobs(ctx, model.head_input(ctx, hidden), model.head_weight(ctx), k, targets);
  Tensor* nll_sum = top.nll_sum;
  Graph g(ctx);
  g.forward(top.logprobs);

  // Written under a name of its own, so that the cache at `out` stays whole until this one is.
  const std::string partial = out + ".incomplete";
  // One process writes "<out>_00000.topk", ...; rank r of several "<out>_r<r>_00000.topk", ...
  const std::string part = N > 1 ? "_r" + std::to_string(r) : "";
  if (group->is_root()) remove_cache_files(partial);  // left by a run that was killed
  if (N > 1) group->host().barrier();
  TopKCacheSpec spec;
  spec.vocab_size = V;
  spec.k = k;
  spec.dtype = dtype == "bf16" ? LogprobDType::BF16 : LogprobDType::F32;
  auto writer = std::make_unique<TopKCacheWriter>(partial + part, spec);
  std::printf("retort %s | device: %s | compute: %s\nteacher: %s\n", RETORT_VERSION, dev.desc.c_str(),
              compute_desc(cfg.compute_dtype).c_str(), tm.describe().c_str());
  if (!dev.note.empty()) std::printf("%s\n", dev.note.c_str());
  std::printf("caching top-%lld (%s) for %lld windows x %lld positions of %s_%s_* -> %s_*.topk\n",
              (long long)k, dtype.c_str(), (long long)windows, (long long)T, shards.c_str(), split.c_str(),
              out.c_str());
  std::fflush(stdout);

  install_stop_handler("teacher-cache");
  const int64_t steps = ((windows + N - 1) / N + B - 1) / B;
  Progress progress(steps, B * T, std::max<int64_t>(1, steps / 10));
  std::vector<int32_t> x(size_t(B * T)), y(size_t(B * T));
  std::vector<int64_t> labels(static_cast<size_t>(B * T)), x64(size_t(B * T));
  // A batch's results on their way to the host: the device runs the next batch while they are written out.
  struct InFlight {
    TensorRead lp, ids, nll;
    std::vector<int64_t> starts;
    int64_t rows = 0;
  };
  InFlight prev, being_written;
  double nll = 0;
  int64_t done = 0, finished = 0;
  // The records, their checksums and each full shard's fsync take a thread of their own, so that this one
  // keeps the device fed; the device's calls (the waits below) stay on this thread. Declared after the
  // writer and the buffers it reads, so it is joined before they go.
  std::future<void> writing;
  auto finish_write = [&] {
    if (!writing.valid()) return;
    writing.get();  // the writer's error, if any, is this thread's
    done += being_written.rows;
    being_written = InFlight{};
    progress.update(++finished, "windows " + std::to_string(done) + "/" + std::to_string(mine));
  };
  auto write_prev = [&] {
    if (!prev.lp.valid()) return;
    const auto* lp = static_cast<const float*>(prev.lp.wait());
    const auto* ids = static_cast<const int32_t*>(prev.ids.wait());
    nll += double(static_cast<const float*>(prev.nll.wait())[0]);  // a sanity number for the summary
    finish_write();
    being_written = std::move(prev);
    prev = InFlight{};
    writing = std::async(std::launch::async, [&writer, &w = being_written, lp, ids, T, k] {
      for (int64_t b = 0; b < w.rows; ++b) writer->write(w.starts[size_t(b)], T, ids + b * T * k, lp + b * T * k);
    });
  };
  bool stop = stop_agreed(*group);
  int64_t queued = 0;
  for (int64_t s = 1; s <= steps && !stop; ++s) {
    std::vector<int64_t> starts(static_cast<size_t>(B));
    loader.next(x.data(), y.data(), starts.data());
    // The last batch runs into the next rank's windows (or the next epoch): only this rank's count.
    const int64_t rows = std::clamp<int64_t>(mine - queued, 0, B);
    queued += rows;
    for (int64_t i = 0; i < B * T; ++i) {
      labels[size_t(i)] = i < rows * T ? y[size_t(i)] : -100;
      x64[size_t(i)] = x[size_t(i)];
    }
    set_data_int(tokens, x64);
    set_data_int(targets, labels);
    g.compute();
    write_prev();  // the previous batch, while this one runs
    // Queued behind this batch and ahead of the next, which overwrites the graph's outputs.
    prev = InFlight{read_later(top.logprobs), read_later(top.ids), read_later(nll_sum), std::move(starts), rows};
    stop = stop_agreed(*group);
  }
  if (!stop) write_prev();
  finish_write();
  if (stop) {
    writer.reset();
    if (N > 1) group->host().barrier();
    if (group->is_root()) remove_cache_files(partial);
    std::printf(
        "\nteacher-cache: stopped after %lld of %lld windows; the incomplete cache is removed%s\n",
        (long long)done, (long long)windows,
        std::filesystem::exists(cache_record_path(out)) ? " (the previous cache at --out is intact)" : "");
    return stopped_status();
  }
  const std::vector<std::string> written = writer->finish();
  // The new cache replaces the old: its record goes first (a cache without one is refused), then the shards.
  // With several ranks, rank 0 clears the old cache while the others wait, each renames its own shards, and
  // rank 0 lists them all in the record (the ranks share the file system of --out).
  if (group->is_root()) {
    std::filesystem::remove(cache_record_path(out));
    remove_cache_files(out);
  }
  if (N > 1) group->host().barrier();
  std::vector<int64_t> counts(size_t(N), 0);
  counts[size_t(r)] = int64_t(written.size());
  for (size_t i = 0; i < written.size(); ++i) {
    const std::string to = out + written[i].substr(partial.size());
    std::filesystem::rename(written[i], to);
  }
  std::vector<double> totals{nll, double(done)};
  if (N > 1) {
    group->host().all_reduce_sum(counts);
    group->host().all_reduce_sum(totals);
  }
  if (!group->is_root()) return 0;
  std::vector<std::string> files;
  for (int64_t q = 0; q < N; ++q)
    for (int64_t i = 0; i < counts[size_t(q)]; ++i) {
      char idx[32];
      std::snprintf(idx, sizeof idx, "_%05lld.topk", (long long)i);
      files.push_back(out + (N > 1 ? "_r" + std::to_string(q) : std::string()) + idx);
    }
  std::map<std::string, std::string> rec = codec.metadata();
  rec["files"] = cache_files_entry(files);
  const TopKCache cache = open_teacher_cache(out, rec);
  RT_CHECK(cache.positions() == windows * T, "teacher-cache: the shards of ", N, " rank(s) hold ",
           cache.positions(), " positions, expected ", windows * T);
  rec["teacher"] = std::filesystem::absolute(teacher).lexically_normal().string();
  rec["teacher.fingerprint"] = model_fingerprint(tfile);
  rec["shards"] = shards;
  rec["shards.fingerprint"] = shards_fingerprint(shards);
  rec["split"] = split;
  rec["context"] = std::to_string(T);
  rec["k"] = std::to_string(k);
  rec["positions"] = std::to_string(cache.positions());
  write_record(cache_record_path(out), rec);
  const int64_t per = k * 4 + k * (dtype == "bf16" ? 2 : 4) + k;
  // With several ranks: every rank's positions over rank 0's time (the ranks step together).
  const double rate =
      N > 1 ? double(cache.positions()) / std::max(progress.elapsed(), 1e-9) : progress.tokens_per_second();
  std::printf("\nsummary: %lld positions in %s (%.0f tok/s) on %s\n", (long long)cache.positions(),
              duration(progress.elapsed()).c_str(), rate, dev.desc.c_str());
  std::printf("  %zu cache shard(s), about %.1f MiB; the teacher's loss on them %.4f nats/token\n",
              files.size(), double(cache.positions() * ((per + 3) / 4 * 4)) / (1 << 20),
              totals[0] / (totals[1] * double(T)));
  std::printf("cache: %s\n", out.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a("teacher-cache", kHelp);
  std::string teacher;
  int64_t batch = 16;
  return run_main(
      "teacher-cache", [&] { return run(a, argc, argv, teacher, batch); },
      [&] { return memory_hint(PretrainedModel::open(teacher).config(), false, batch); });
}
