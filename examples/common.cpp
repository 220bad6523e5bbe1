#include "common.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <unistd.h>

namespace ex {

// ---- device ---------------------------------------------------------------------------------------------

bool gpu_usable() {
  std::string why;
  return cuda_available(&why);
}

Device pick_device(const std::string& choice, int threads) {
  if (choice != "auto" && choice != "cpu" && choice != "cuda")
    throw UsageError("--device is auto, cpu or cuda, got '" + choice + "'");
  std::string why;
  const bool has_cuda = cuda_available(&why);
  RT_CHECK(choice != "cuda" || has_cuda, "--device cuda: ", why);
  Device d;
  d.cuda = choice == "cuda" || (choice == "auto" && has_cuda);
  if (d.cuda) {
    const int local = dist::world_from_env().local_rank;
    d.backend = make_cuda_backend(local);
    d.desc = local ? "cuda:" + std::to_string(local) : std::string("cuda");
  } else {
    auto cpu = std::make_unique<CpuBackend>(threads);
    d.desc = "cpu, " + std::to_string(cpu->threads()) + " threads";
    if (choice == "auto") d.note = "no usable GPU (" + why + "): running on the CPU";
    d.backend = std::move(cpu);
  }
  return d;
}

std::unique_ptr<dist::ProcessGroup> join_world(const Device& dev) {
  const dist::World w = dist::world_from_env();
  auto g = std::make_unique<dist::ProcessGroup>(w, *dev.backend);
  if (w.rank != 0) RT_CHECK(std::freopen("/dev/null", "w", stdout) != nullptr, "cannot silence rank ", w.rank);
  if (w.size > 1)
    std::printf("world: %d processes over %s (%s); batches are per process\n", w.size, g->transport().c_str(),
                w.source.c_str());
  return g;
}

bool any_rank(dist::ProcessGroup& group, bool flag) {
  if (group.size() == 1) return flag;
  std::vector<int64_t> n{flag ? 1 : 0};
  group.host().all_reduce_sum(n);
  return n[0] > 0;
}

bool stop_agreed(dist::ProcessGroup& group) {
  return any_rank(group, stop_requested());
}

void resume_batch(const Args& a, const Checkpoint& ck, int world, int64_t* batch) {
  const std::string r = ck.meta("train.batch");
  if (r.empty()) return;
  const int64_t global = std::stoll(r), w = world;
  a.check(global % w == 0, "--resume " + ck.path() + ": the run's batch of " + r +
                               " windows per step does not split over " + std::to_string(w) +
                               " processes (use a number of processes that divides it)");
  a.check(!a.given("--batch") || *batch == global / w,
          "--batch " + std::to_string(*batch) + " differs from the run's " + std::to_string(global / w) +
              " per process (" + r + " over " + std::to_string(w) + " processes): drop the flag");
  *batch = global / w;
}

DType pick_compute_dtype(const std::string& choice, const Device& device) {
  if (choice == "auto") return default_compute_dtype(*device.backend);
  if (choice == "f32") return DType::F32;
  if (choice == "bf16") return DType::BF16;
  if (choice == "f16") return DType::F16;
  throw UsageError("--compute-dtype is auto, f32, bf16 or f16, got '" + choice + "'");
}

void check_compute_dtype(const Args& a, const std::string& choice) {
  a.check(choice == "auto" || choice == "f32" || choice == "bf16" || choice == "f16",
          "--compute-dtype is auto, f32, bf16 or f16, got '" + choice + "'");
}

std::string compute_desc(DType compute) {
  if (compute == DType::F32) return "f32";
  return std::string(dtype_name(compute)) + " matmuls, f32 master weights";
}

// ---- output ---------------------------------------------------------------------------------------------

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
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

std::string printable(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '\n' || c == '\t' || (c >= 32 && c < 127)) {
      out += char(c);
      ++i;
      continue;
    }
    const size_t len = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    bool ok = len > 0 && i + len <= s.size();
    for (size_t k = 1; ok && k < len; ++k) ok = (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80;
    if (ok) {
      out.append(s, i, len);
      i += len;
    } else {
      out += '?';
      ++i;
    }
  }
  return out;
}

Progress::Progress(int64_t total, int64_t tokens_per_step, int64_t every, int64_t first)
    : total_(total),
      tokens_per_step_(tokens_per_step),
      every_(std::max<int64_t>(1, every)),
      first_(first),
      last_(first),
      start_(Clock::now()),
      tty_(isatty(fileno(stdout))) {}

double Progress::tokens_per_second() const {
  const double t = elapsed();
  return t > 0 ? double((last_ - first_) * tokens_per_step_) / t : 0.0;
}

void print_summary(int64_t steps, int64_t tokens_per_step, double train_seconds, const Progress& progress,
                   const std::string& device, Clock::time_point start, const std::string& middle,
                   double val_before, double val_after, int64_t windows) {
  std::printf("\nsummary: %lld steps, %.2fM tokens in %s (%.0f tok/s) on %s; total %s\n", (long long)steps,
              double(steps * tokens_per_step) / 1e6, duration(train_seconds).c_str(),
              progress.tokens_per_second(), device.c_str(), duration(seconds_since(start)).c_str());
  std::fputs(middle.c_str(), stdout);
  std::printf("  validation loss %.4f -> %.4f nats/token (perplexity %.2f -> %.2f; %lld windows)\n",
              val_before, val_after, std::exp(val_before), std::exp(val_after), (long long)windows);
}

void Progress::update(int64_t step, const std::string& fields) {
  last_ = step;
  const double el = elapsed();
  const double done = double(step - first_);
  const double eta = done > 0 ? el / done * double(total_ - step) : 0.0;
  // A bar of 20 cells, so a glance tells how far the run is.
  const int cells = total_ > 0 ? int(20 * step / total_) : 20;
  std::string bar = "[" + std::string(size_t(cells), '#') + std::string(size_t(20 - cells), '.') + "]";
  char line[512];
  std::snprintf(line, sizeof line, "%s %5lld/%lld | %s | %7.0f tok/s | ETA %s", bar.c_str(), (long long)step,
                (long long)total_, fields.c_str(), tokens_per_second(), duration(eta).c_str());
  if (step % every_ == 0 || step == total_ || step == first_ + 1)
    std::printf("%s%s\n", tty_ ? "\r\033[K" : "", line);
  else if (tty_)
    std::printf("\r\033[K%s", line);
  std::fflush(stdout);
}

// ---- text codec -----------------------------------------------------------------------------------------

namespace {
uint32_t file_crc(const std::string& path) {
  const std::vector<uint8_t> b = io::read_file(path);
  return io::crc32(b.data(), b.size());
}

// The first n bytes of a file (fewer when it is shorter).
std::vector<uint8_t> read_prefix(const std::string& path, size_t n) {
  std::ifstream f(path, std::ios::binary);
  RT_CHECK(f.good(), path, ": cannot open");
  std::vector<uint8_t> b(n);
  f.read(reinterpret_cast<char*>(b.data()), std::streamsize(n));
  b.resize(size_t(f.gcount()));
  return b;
}

// CRC-32 of a whole file, read in pieces (a model file may be gigabytes).
uint32_t stream_crc(uint32_t crc, const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  RT_CHECK(f.good(), path, ": cannot open");
  std::vector<char> buf(size_t(1) << 20);
  while (f) {
    f.read(buf.data(), std::streamsize(buf.size()));
    crc = io::crc32_update(crc, buf.data(), size_t(f.gcount()));
  }
  return crc;
}
}  // namespace

std::string model_fingerprint(const PretrainedModel& m) {
  namespace fs = std::filesystem;
  char hex[16];
  if (const Checkpoint* ck = m.checkpoint()) return "crc32:" + ck->meta("crc32");
  uint32_t crc = 0;
  if (fs::is_directory(m.path())) {
    std::vector<std::string> files;
    for (const auto& e : fs::directory_iterator(m.path())) {
      const std::string name = e.path().filename().string();
      if (e.is_regular_file() &&
          (name == "config.json" || name == "tokenizer.json" || e.path().extension() == ".safetensors"))
        files.push_back(name);
    }
    std::sort(files.begin(), files.end());
    for (const std::string& f : files) {
      crc = io::crc32_update(crc, f.data(), f.size());
      crc = stream_crc(crc, (fs::path(m.path()) / f).string());
    }
  } else {
    crc = stream_crc(0, m.path());
  }
  std::snprintf(hex, sizeof hex, "%08x", crc);
  return std::string("crc32:") + hex;
}

TextCodec TextCodec::bytes() {
  return TextCodec();
}

// A checksum of what a vocabulary encodes by: tokens, types, merges, pre-tokenizer, BOS/EOS.
uint32_t vocabulary_crc(const Tokenizer& tok) {
  const TokenizerSpec spec = tok.to_spec();
  uint32_t crc = 0;
  auto add = [&](const std::string& s) { crc = io::crc32_update(crc, s.data(), s.size() + 1); };
  for (const std::string& t : spec.tokens) add(t);
  for (int32_t t : spec.types) crc = io::crc32_update(crc, &t, sizeof t);
  for (const std::string& m : spec.merges) add(m);
  add(std::string(pre_tokenizer_name(spec.pre)) + " " + std::to_string(spec.bos) + " " +
      std::to_string(spec.eos));
  return crc;
}

TextCodec TextCodec::model(const std::string& path, std::shared_ptr<const Tokenizer> tok) {
  RT_CHECK(tok != nullptr, path, ": the model has no tokenizer of its own");
  TextCodec c;
  c.kind_ = "model";
  c.file_ = std::filesystem::absolute(path).lexically_normal().string();
  c.crc_ = vocabulary_crc(*tok);
  c.tok_ = std::move(tok);
  return c;
}

TextCodec TextCodec::model(const std::string& path) {
  return model(path, PretrainedModel::open(path).tokenizer());
}

std::string TextCodec::short_name() const {
  if (kind_ == "model") {
    std::filesystem::path p(file_);
    return (p.has_extension() && p.extension() == ".gguf" ? p.stem() : p.filename()).string();
  }
  if (kind_ == "bpe") return "bpe" + std::to_string(vocab());
  return kind_;
}

TextCodec TextCodec::bpe_file(const std::string& path) {
  TextCodec c;
  c.kind_ = "bpe";
  c.file_ = std::filesystem::absolute(path).lexically_normal().string();
  c.tok_ = std::make_shared<Tokenizer>(Tokenizer::load(path));
  c.crc_ = file_crc(path);
  return c;
}

TextCodec TextCodec::gpt2(const std::string& data_dir) {
  TextCodec c;
  c.kind_ = "gpt2";
  c.file_ = std::filesystem::absolute(data_dir + "/gpt2").lexically_normal().string();
  c.tok_ = std::make_shared<Tokenizer>(
      Tokenizer::load_gpt2(data_dir + "/gpt2/encoder.json", data_dir + "/gpt2/vocab.bpe"));
  return c;
}

TextCodec TextCodec::from_checkpoint(const Checkpoint& ck) {
  const auto& md = ck.metadata();
  const std::string& path = ck.path();
  const auto get = [&](const std::string& k) {
    const auto it = md.find(k);
    return it == md.end() ? std::string() : it->second;
  };
  const std::string kind = get("tokenizer");
  if ((kind.empty() && !ck.tokenizer()) || kind == "bytes") return bytes();
  TextCodec c;
  c.kind_ = kind.empty() ? "embedded" : kind;
  c.file_ = get("tokenizer.file");
  c.crc_ = uint32_t(std::strtoul(get("tokenizer.crc32").c_str(), nullptr, 16));
  if (kind == "none") {
    c.vocab_ = ck.config().vocab;
    return c;
  }
  if ((c.tok_ = ck.tokenizer())) return c;
  // Checkpoints from before tokenizers were embedded name a file, which must still be there unchanged.
  TextCodec f;
  if (kind == "gpt2") {
    const std::string dir = c.file_;
    f = gpt2(dir.size() > 5 ? dir.substr(0, dir.size() - 5) : RETORT_DATA_DIR);
  } else if (kind == "model") {
    RT_CHECK(std::filesystem::exists(c.file_), path, ": its tokenizer is the one of the model ", c.file_,
             ", which is not there any more");
    f = model(c.file_);
  } else {
    RT_CHECK(kind == "bpe", path, ": unknown tokenizer '", kind, "' in checkpoint metadata");
    RT_CHECK(std::filesystem::exists(c.file_), path, ": its tokenizer ", c.file_,
             " is not there any more (this checkpoint predates embedded tokenizers)");
    f = bpe_file(c.file_);
  }
  char hex[16];
  std::snprintf(hex, sizeof hex, "%08x", f.crc_);
  RT_CHECK(kind == "gpt2" || get("tokenizer.crc32") == hex, path, ": the tokenizer ", c.file_,
           " changed since the checkpoint was written (crc32 ", hex, ", recorded ", get("tokenizer.crc32"),
           ")");
  return f;
}

std::vector<int32_t> TextCodec::encode(const std::string& text) const {
  RT_CHECK(kind_ != "none",
           "the model has no tokenizer (it was saved without one), so it cannot encode text");
  if (!tok_) {
    std::vector<int32_t> ids(text.size());
    for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
    return ids;
  }
  return tok_->encode(text, true);
}

std::string TextCodec::decode(const std::vector<int32_t>& ids) const {
  RT_CHECK(kind_ != "none",
           "the model has no tokenizer (it was saved without one), so it cannot decode text");
  if (!tok_) {
    std::string s;
    for (int32_t id : ids) s += char(id & 0xFF);
    return s;
  }
  return tok_->decode(ids);
}

int64_t TextCodec::vocab() const {
  return tok_ ? tok_->vocab_size() : vocab_;
}

std::map<std::string, std::string> TextCodec::metadata() const {
  char hex[16];
  std::snprintf(hex, sizeof hex, "%08x", crc_);
  std::map<std::string, std::string> md = {{"tokenizer", kind_},
                                           {"tokenizer.file", file_},
                                           {"tokenizer.vocab", std::to_string(vocab())},
                                           {"tokenizer.crc32", hex}};
  return md;
}

std::map<std::string, std::string> TextCodec::checkpoint_metadata() const {
  std::map<std::string, std::string> md = metadata();
  if (tok_) embed_tokenizer(md, *tok_);
  return md;
}

std::string TextCodec::describe() const {
  if (kind_ == "bytes") return "bytes (vocab 256)";
  if (kind_ == "none") return "none (a model saved without a tokenizer)";
  if (kind_ == "embedded")
    return "the tokenizer embedded in the checkpoint (vocab " + std::to_string(vocab()) + ")";
  if (kind_ == "model") return "the tokenizer of " + file_ + " (vocab " + std::to_string(vocab()) + ")";
  return kind_ + " (vocab " + std::to_string(vocab()) + ", " + file_ + ")";
}

RunModel load_run_model(const PretrainedModel& file, Context& ctx, DType compute, int64_t context) {
  const std::string& path = file.path();
  RunModel r{file, TextCodec::bytes(), nullptr, ""};
  if (const Checkpoint* ck = r.file.checkpoint()) {
    r.codec = TextCodec::from_checkpoint(*ck);
    r.shards = ck->meta("shards");
  } else {
    r.codec = TextCodec::model(path, r.file.tokenizer());
  }
  TransformerConfig cfg = r.file.config();
  cfg.compute_dtype = compute;
  if (context > 0) cfg.context = context;
  r.model = std::make_unique<Transformer>(ctx, cfg, 0, false);
  r.file.load_into(*r.model);
  return r;
}

std::string memory_hint(const TransformerConfig& config, bool training, int64_t batch) {
  const TransformerConfig c = config.resolved();
  const double d = double(c.d_model), kv = double(c.kv_heads * c.head_dim());
  const double block = d * (d + 2 * kv) + d * d + 3 * d * double(c.d_ff) + 2 * d;
  const double params = double(c.vocab) * d * (c.tie_embeddings ? 1 : 2) + double(c.layers) * block + d;
  const double bytes = params * 4 * (training ? 4 : 1);
  char b[320];
  std::snprintf(
      b, sizeof b,
      "the model alone needs %.1f MiB (%.1fM parameters%s; set by --layers, --d-model, --d-ff and the "
      "vocabulary of %lld), and its activations grow with --batch %lld x --context %lld: lower them",
      bytes / (1 << 20), params / 1e6, training ? " x4: weights, gradients, AdamW moments" : "",
      (long long)c.vocab, (long long)batch, (long long)c.context);
  return b;
}

std::string RunModel::describe() const {
  if (const Checkpoint* ck = file.checkpoint())
    return file.path() + " (" + model->config().describe() + ", step " + std::to_string(ck->state().step) +
           ")";
  return file.describe();
}

void check_data_options(const Args& a, const DataOptions& d) {
  a.check(d.val_frac > 0 && d.val_frac < 0.5,
          "--val-frac must be in (0, 0.5), got " + std::to_string(d.val_frac));
  a.check(d.max_bytes >= 0, "--max-bytes must be >= 0, got " + std::to_string(d.max_bytes));
  if (!d.data.empty())
    a.check(std::filesystem::is_regular_file(d.data), "--data " + d.data + " is not a file");
}

ShardSet prepare_shards(DataOptions& d, const TextCodec& codec) {
  namespace fs = std::filesystem;
  if (!(d.val_frac > 0 && d.val_frac < 0.5)) throw UsageError("--val-frac must be in (0, 0.5)");
  if (d.max_bytes < 0) throw UsageError("--max-bytes must be >= 0");
  if (!fs::is_regular_file(d.data)) throw UsageError("--data " + d.data + " is not a file");
  const bool chosen = !d.shards.empty();
  if (d.shards.empty()) {
    std::string base = d.data;
    if (base.size() > 4 && base.substr(base.size() - 4) == ".txt") base.resize(base.size() - 4);
    d.shards = base + "." + codec.short_name();
    if (d.max_bytes > 0) d.shards += ".first" + std::to_string(d.max_bytes);
  }
  d.shards = fs::absolute(d.shards).lexically_normal().string();
  // What the shards hold: the file, how much of it, the split and the tokenizer. Equal records, same shards.
  const auto md = codec.metadata();
  std::ostringstream rec;
  rec << "data=" << fs::absolute(d.data).lexically_normal().string() << "\nsize=" << fs::file_size(d.data)
      << "\nmax_bytes=" << d.max_bytes << "\nval_frac=" << d.val_frac << "\ntokenizer=" << codec.kind() << " "
      << md.at("tokenizer.file") << " " << md.at("tokenizer.crc32") << "\n";
  const std::string record_path = d.shards + ".source";
  ShardSet set;
  set.train = list_shards(d.shards, "train");
  set.val = list_shards(d.shards, "val");
  if (!set.train.empty() && !set.val.empty() && fs::exists(record_path) &&
      io::read_text_file(record_path) == rec.str()) {
    for (const auto& p : set.train) set.train_tokens += TokenShard(p).size();
    for (const auto& p : set.val) set.val_tokens += TokenShard(p).size();
    std::printf("data: reusing %s_* (%lld train + %lld validation tokens of %s)\n", d.shards.c_str(),
                (long long)set.train_tokens, (long long)set.val_tokens, d.data.c_str());
    return set;
  }
  try {
    check_output_prefix(d.shards, "--shards");
  } catch (const UsageError& e) {
    if (chosen) throw;
    throw UsageError(std::string(e.what()) +
                     "; by default the shards go beside the text: give --shards PREFIX in a writable place");
  }
  std::string text = io::read_text_file(d.data);
  if (d.max_bytes > 0 && int64_t(text.size()) > d.max_bytes) text.resize(size_t(d.max_bytes));
  RT_CHECK(!text.empty(), "--data ", d.data, " is empty: nothing to train on");
  const auto t0 = Clock::now();
  std::printf("data: tokenizing %zu bytes of %s with %s...\n", text.size(), d.data.c_str(),
              codec.describe().c_str());
  std::fflush(stdout);
  const std::vector<int32_t> ids = codec.encode(text);
  ShardWriteOptions so;
  so.val_fraction = d.val_frac;
  set = write_shards(ids, d.shards, codec.vocab(), so);
  const std::string r = rec.str();
  io::write_file_atomic(record_path, r.data(), r.size());
  std::printf("data: %lld train + %lld validation tokens in %s_* (%s)\n", (long long)set.train_tokens,
              (long long)set.val_tokens, d.shards.c_str(), duration(seconds_since(t0)).c_str());
  return set;
}

void check_shards_tokenizer(const std::string& prefix, const TextCodec& codec, const std::string& model) {
  const std::string record = prefix + ".source";
  if (!std::filesystem::exists(record)) return;
  std::istringstream in(io::read_text_file(record));
  std::string line, kind, file, crc;
  while (std::getline(in, line))
    if (line.rfind("tokenizer=", 0) == 0) {
      // "kind file crc", where file may be empty (bytes) or hold spaces: the kind first, the crc last.
      const std::string rest = line.substr(10);
      kind = rest.substr(0, rest.find(' '));
      crc = rest.substr(rest.rfind(' ') + 1);
      file = rest.size() > kind.size() + crc.size() + 1
                 ? rest.substr(kind.size() + 1, rest.size() - kind.size() - crc.size() - 2)
                 : "";
    }
  const auto md = codec.metadata();
  // Kinds compare where both name a vocabulary; an embedded one (from Python) has no file to compare with.
  const bool differ = kind.empty() || codec.kind() == "embedded" || codec.kind() == "none"
                          ? false
                          : (kind != codec.kind() && (kind == "bytes" || codec.kind() == "bytes")) ||
                                (kind == codec.kind() && crc != md.at("tokenizer.crc32"));
  RT_CHECK(!differ, "vocabulary mismatch: the shards ", prefix, "_* were made with the tokenizer ", kind, " ",
           file, " (crc32 ", crc, "), the model ", model, " uses ", codec.describe(), " (crc32 ",
           md.at("tokenizer.crc32"), ")");
}

std::string shards_fingerprint(const std::string& prefix) {
  uint32_t crc = 0;
  for (const char* split : {"train", "val"})
    for (const std::string& p : list_shards(prefix, split)) {
      // The header (magic, version, dtype, count, and the checksum of header and tokens) stands for the file.
      const std::vector<uint8_t> head = read_prefix(p, 32);
      crc = io::crc32_update(crc, split, std::strlen(split));
      crc = io::crc32_update(crc, head.data(), head.size());
    }
  char hex[16];
  std::snprintf(hex, sizeof hex, "%08x", crc);
  return hex;
}

int64_t shard_vocab_bound(const std::vector<std::string>& shards) {
  int32_t mx = -1;
  for (const std::string& p : shards)
    for (int32_t id : TokenShard(p).read_all()) mx = std::max(mx, id);
  return int64_t(mx) + 1;
}

std::string heldout_prompt(const std::vector<std::string>& val_shards, const TextCodec& codec) {
  if (val_shards.empty()) return "\n";
  const TokenShard shard(val_shards[0]);
  const int64_t n = std::min<int64_t>(shard.size(), 400), begin = (shard.size() - n) / 2;
  std::vector<int32_t> ids(static_cast<size_t>(n));
  shard.read(begin, n, ids.data());
  const std::string text = codec.decode(ids);
  const size_t at = text.find('\n', text.size() / 4);
  if (at == std::string::npos || at + 1 >= text.size()) return "\n";
  std::string line = text.substr(at + 1, 24);
  // Whole tokens only: cut at the last space, so the prompt does not end inside a word.
  const size_t sp = line.rfind(' ');
  return sp != std::string::npos && sp > 0 ? line.substr(0, sp) : line;
}

std::vector<std::string> shards_for(const std::string& prefix, const std::string& split) {
  RT_CHECK(!prefix.empty(), "no token shards: give --shards PREFIX (train writes them)");
  std::vector<std::string> v = list_shards(prefix, split);
  RT_CHECK(!v.empty(), "no shards ", prefix, "_", split, "_00000.bin (train --data writes them)");
  return v;
}

// ---- curves -------------------------------------------------------------------------------------------

void Curves::step(int64_t step, int64_t tokens, double loss, double hard, double soft) {
  rows_.push_back({step, tokens, loss, hard, soft, NAN});
}

void Curves::validation(int64_t step, int64_t tokens, double val) {
  if (rows_.empty() || rows_.back().step != step) rows_.push_back({step, tokens, NAN, NAN, NAN, NAN});
  rows_.back().val = val;
}

void Curves::write(const std::string& path) const {
  std::string text = "step,tokens,loss,hard,soft,val\n";
  const auto cell = [&](double v) {
    char b[32] = "";
    if (std::isfinite(v)) std::snprintf(b, sizeof b, "%.6g", v);
    text += ',';
    text += b;
  };
  for (const Row& r : rows_) {
    text += std::to_string(r.step) + "," + std::to_string(r.tokens);
    cell(r.loss), cell(r.hard), cell(r.soft), cell(r.val);
    text += '\n';
  }
  io::write_file_atomic(path, text.data(), text.size());
}

// ---- records ------------------------------------------------------------------------------------------

void write_record(const std::string& path, const std::map<std::string, std::string>& rec) {
  std::string text;
  for (const auto& [k, v] : rec) {
    RT_ASSERT(k.find('=') == std::string::npos && k.find('\n') == std::string::npos &&
              v.find('\n') == std::string::npos);
    text += k + "=" + v + "\n";
  }
  io::write_file_atomic(path, text.data(), text.size());
}

std::map<std::string, std::string> read_record(const std::string& path) {
  std::map<std::string, std::string> rec;
  if (!std::filesystem::exists(path)) return rec;
  std::istringstream in(io::read_text_file(path));
  std::string line;
  while (std::getline(in, line)) {
    const size_t eq = line.find('=');
    RT_CHECK(eq != std::string::npos, path, ": a line without '=': '", line, "'");
    rec[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return rec;
}

std::string cache_record_path(const std::string& prefix) {
  return prefix + ".teacher";
}

namespace {
// The CRC-32 that ends a top-K shard's 64-byte header (src/io/topk_cache.h).
uint32_t shard_header_crc(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  RT_CHECK(f.good(), path, ": cannot open the teacher cache shard (", std::strerror(errno), ")");
  unsigned char h[64] = {};
  f.read(reinterpret_cast<char*>(h), sizeof h);
  RT_CHECK(f.gcount() == std::streamsize(sizeof h), path, ": shorter than a teacher cache shard's header");
  return uint32_t(h[60]) | uint32_t(h[61]) << 8 | uint32_t(h[62]) << 16 | uint32_t(h[63]) << 24;
}
}  // namespace

std::string cache_files_entry(const std::vector<std::string>& shard_paths) {
  std::string out;
  for (const std::string& p : shard_paths) {
    if (!out.empty()) out += ',';
    out += std::filesystem::path(p).filename().string();
    out += ':';
    out += std::to_string(shard_header_crc(p));
  }
  return out;
}

TopKCache open_teacher_cache(const std::string& prefix, const std::map<std::string, std::string>& rec) {
  const auto it = rec.find("files");
  if (it == rec.end()) return TopKCache::open(prefix);
  const std::filesystem::path dir = std::filesystem::path(prefix).parent_path();
  const std::string record = cache_record_path(prefix);
  std::vector<std::string> paths;
  std::istringstream list(it->second);
  std::string item;
  while (std::getline(list, item, ',')) {
    const size_t colon = item.rfind(':');
    RT_CHECK(colon != std::string::npos && colon > 0 && item.find('/') == std::string::npos, record,
             ": a bad entry '", item, "' in its list of shards (expected name:crc)");
    const std::string path = (dir / item.substr(0, colon)).string();
    RT_CHECK(std::filesystem::exists(path), "teacher cache ", prefix, ": the shard ", path, " that ", record,
             " lists is missing (copy every rank's shards with the record)");
    const std::string want = item.substr(colon + 1), have = std::to_string(shard_header_crc(path));
    RT_CHECK(have == want, path, ": not the shard ", record, " lists (header checksum ", have, ", recorded ",
             want, "): a shard of another cache?");
    paths.push_back(path);
  }
  RT_CHECK(!paths.empty(), record, ": lists no shards");
  return TopKCache(paths);
}

// ---- SVG ------------------------------------------------------------------------------------------------

namespace {
// Round ticks (1, 2 or 5 times a power of ten) covering [lo, hi]; widens lo and hi to the outer ticks.
double nice_step(double& lo, double& hi) {
  const double raw = (hi - lo) / 5, mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = 10 * mag;
  for (double m : {1.0, 2.0, 5.0})
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  lo = std::floor(lo / step) * step;
  hi = std::ceil(hi / step) * step;
  return step;
}
}  // namespace

void write_svg(const std::string& path, const std::string& title, const std::vector<Series>& series) {
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  for (const Series& s : series)
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (!std::isfinite(s.y[i])) continue;
      x0 = std::min(x0, s.x[i]), x1 = std::max(x1, s.x[i]);
      y0 = std::min(y0, s.y[i]), y1 = std::max(y1, s.y[i]);
    }
  if (x0 > x1) x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  if (x1 == x0) x1 = x0 + 1;
  if (y1 == y0) y1 = y0 + 1;
  const double xs = nice_step(x0, x1), ys = nice_step(y0, y1);
  const double W = 720, H = 420, L = 60, R = 180, Tm = 40, Bm = 40;
  auto px = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
  auto py = [&](double y) { return H - Bm - (y - y0) / (y1 - y0) * (H - Tm - Bm); };
  std::ostringstream os;
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
     << "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" "
        "fill=\"white\"/>\n";
  os << "<text x=\"" << L << "\" y=\"24\" font-size=\"15\">" << title << "</text>\n";
  os << "<line x1=\"" << L << "\" y1=\"" << H - Bm << "\" x2=\"" << W - R << "\" y2=\"" << H - Bm
     << "\" stroke=\"black\"/>\n<line x1=\"" << L << "\" y1=\"" << Tm << "\" x2=\"" << L << "\" y2=\""
     << H - Bm << "\" stroke=\"black\"/>\n";
  char b[32];
  for (double yv = y0; yv <= y1 + ys / 2; yv += ys) {
    std::snprintf(b, sizeof b, "%g", std::abs(yv) < ys / 2 ? 0.0 : yv);
    os << "<text x=\"" << L - 6 << "\" y=\"" << py(yv) + 4 << "\" text-anchor=\"end\">" << b << "</text>\n";
    os << "<line x1=\"" << L << "\" y1=\"" << py(yv) << "\" x2=\"" << W - R << "\" y2=\"" << py(yv)
       << "\" stroke=\"#ddd\"/>\n";
  }
  for (double xv = x0; xv <= x1 + xs / 2; xv += xs) {
    std::snprintf(b, sizeof b, "%g", std::abs(xv) < xs / 2 ? 0.0 : xv);
    os << "<text x=\"" << px(xv) << "\" y=\"" << H - Bm + 16 << "\" text-anchor=\"middle\">" << b
       << "</text>\n";
  }
  os << "<text x=\"" << (L + W - R) / 2 << "\" y=\"" << H - 6 << "\" text-anchor=\"middle\">step</text>\n";
  int li = 0;
  for (const Series& s : series) {
    os << "<polyline fill=\"none\" stroke=\"" << s.color << "\" stroke-width=\"1.5\" points=\"";
    for (size_t i = 0; i < s.x.size(); ++i)
      if (std::isfinite(s.y[i])) os << px(s.x[i]) << "," << py(s.y[i]) << " ";
    os << "\"/>\n";
    const double ly = Tm + 10 + 18 * li++;
    os << "<line x1=\"" << W - R + 10 << "\" y1=\"" << ly << "\" x2=\"" << W - R + 30 << "\" y2=\"" << ly
       << "\" stroke=\"" << s.color << "\" stroke-width=\"2\"/><text x=\"" << W - R + 36 << "\" y=\""
       << ly + 4 << "\">" << s.name << "</text>\n";
  }
  os << "</svg>\n";
  const std::string text = os.str();
  io::write_file_atomic(path, text.data(), text.size());
}

}  // namespace ex

namespace ex {

Sampler::Sampler(Context& ctx, Transformer& model) : ctx_(ctx), model_(model) {}

std::vector<int32_t> Sampler::generate(const std::vector<int32_t>& prompt, int64_t n, float temperature,
                                       int64_t top_k, float top_p, uint64_t seed) {
  const std::vector<int32_t> start = prompt.empty() ? std::vector<int32_t>{0} : prompt;
  const int64_t context = model_.config().context;
  const int64_t need = std::min(context, std::max<int64_t>(1, int64_t(start.size()) + n - 1));
  if (!gen_ || gen_->max_len() < need) {
    // A power of two at least 64 long, so that a few growing requests do not each build a new cache.
    int64_t len = 64;
    while (len < need) len *= 2;
    GeneratorOptions go;
    go.max_len = std::min(len, context);
    go.slide = true;
    gen_.reset();
    gen_ = std::make_unique<Generator>(ctx_, model_, go);
  }
  SamplingOptions so;
  so.temperature = temperature;
  so.top_k = top_k;
  so.top_p = top_p;
  so.seed = seed;
  return gen_->generate(start, n, so);
}

}  // namespace ex
