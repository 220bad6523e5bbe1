// What the example programs share and a library user would not want: command-line parsing, failure
// reporting, stopping and output paths (cli.cpp), picking the device, the progress line, the text codec
// behind
// --tokenizer, shard and cache records, and a small SVG plot (common.cpp). The training itself
// (checkpoints, loss heads, the step, evaluation) is library code in src/nn/lm.h.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "retort.h"

#ifndef RETORT_DATA_DIR
#define RETORT_DATA_DIR "data"
#endif

namespace ex {

using namespace retort;

// ---- command line ---------------------------------------------------------------------------------------
// A fault in the command line (a bad flag, a value out of range, an output path that cannot be written):
// run_main prints it with a pointer to --help and exits 2.
struct UsageError : Error {
  using Error::Error;
};

// Flags take one value each ("--steps 100" or "--steps=100"); --help prints the help text and exits 0; a bad
// flag or value throws UsageError.
class Args {
 public:
  Args(std::string prog, std::string help) : prog_(std::move(prog)), help_(std::move(help)) {}
  void add(const std::string& flag, int64_t* v);
  void add(const std::string& flag, int* v);
  void add(const std::string& flag, uint64_t* v);
  void add(const std::string& flag, float* v);
  void add(const std::string& flag, double* v);
  void add(const std::string& flag, std::string* v);
  void add(const std::string& flag, bool* v);  // "0"/"1"/"true"/"false"/"on"/"off"
  void parse(int argc, char** argv);
  bool given(const std::string& flag) const { return given_.count(flag) != 0; }
  [[noreturn]] void fail(const std::string& msg) const;
  void check(bool ok, const std::string& msg) const {
    if (!ok) fail(msg);
  }
  // The checks every program makes of --threads (0..1024) and --device (auto, cpu, cuda).
  void check_machine(int threads, const std::string& device) const;
  // Ranges of the model flags (--layers, --d-model, --heads, --kv-heads, --d-ff, --context), before their
  // product can overflow a size: TransformerConfig::resolved() checks how they fit together.
  void check_model(const TransformerConfig& c) const;

 private:
  std::string prog_, help_;
  std::map<std::string, std::function<void(const std::string&)>> setters_;
  std::map<std::string, bool> given_;
};

// Runs a program's body and turns every way it can fail into one line on stderr, "prog: what failed", and an
// exit status: 2 for a usage error, 1 for a runtime failure (a bad file, out of memory: memory_hint() names
// the options that set the size), the body's own status otherwise.
int run_main(const std::string& prog, const std::function<int()>& body,
             const std::function<std::string()>& memory_hint = nullptr);

// ---- stopping -------------------------------------------------------------------------------------------
// SIGINT and SIGTERM ask a long run to stop at the end of its current step (stop_requested() turns true and a
// line says so); a second one ends the program at once, as the default action does.
void install_stop_handler(const std::string& prog);
bool stop_requested();
int stop_signal();  // the signal that asked, 0 for none
// The exit status of a run stopped by stop_signal() after saving its work: 128 + the signal, as a shell
// reports it (SIGINT's when another rank was asked: stop_agreed).
int stopped_status();

// ---- output paths ---------------------------------------------------------------------------------------
// Makes sure a file can be written at path before any work starts: creates its directory, and refuses a
// directory or a place this process cannot write (throws UsageError naming flag); removes the temporaries a
// killed writer of path left.
void check_output_path(const std::string& path, const std::string& flag);
// The same for the files "<prefix>_..." and "<prefix>.xyz" that a prefix names.
void check_output_prefix(const std::string& prefix, const std::string& flag);
// Removes "<path>.tmp.<pid>" files that a killed writer of path left (its process is gone); returns how many.
int remove_stale_temporaries(const std::string& path);

// ---- device ---------------------------------------------------------------------------------------------
struct Device {
  std::unique_ptr<Backend> backend;
  std::string desc;  // "cpu, 2 threads" / "cuda"
  std::string note;  // why auto chose the CPU ("no usable GPU (...): running on the CPU"), to print once
  bool cuda = false;
};
// choice: auto (cuda when usable), cpu, cuda. Throws retort::Error for cuda without a usable GPU. On CUDA
// the device is LOCAL_RANK's (0 without a launcher).
Device pick_device(const std::string& choice, int threads);
// Joins the world the launcher environment describes (RANK, WORLD_SIZE, ...; a world of 1 without them) on
// dev's backend. On every rank but 0, stdout goes to /dev/null, so a run prints its progress once; errors
// still reach stderr. Throws retort::Error on bad variables or a failed rendezvous.
std::unique_ptr<dist::ProcessGroup> join_world(const Device& dev);
// Whether the run stops now: stop_requested() on any rank of group, so that every rank stops after the same
// step (one asked at a different step than the others would leave them waiting in a collective). Every rank
// must call it at the same points of its loop; in a world of 1 it costs nothing.
bool stop_agreed(dist::ProcessGroup& group);
// flag on any rank of group (every rank calls it at the same point; a world of 1: flag).
bool any_rank(dist::ProcessGroup& group, bool flag);
// --resume at any number of processes: a checkpoint records the whole step's batch (all processes, key
// "train.batch"), and each of `world` processes takes its share; --batch, when given, must be that share.
// Fails (UsageError) when the batch does not split over world.
void resume_batch(const Args& a, const Checkpoint& ck, int world, int64_t* batch);
// True when auto would pick CUDA (for GPU-sized defaults).
bool gpu_usable();
// --compute-dtype: auto (bf16 on CUDA, f32 on the CPU: default_compute_dtype), f32, bf16 or f16. Throws
// UsageError for anything else (check_compute_dtype does so before any work).
DType pick_compute_dtype(const std::string& choice, const Device& device);
void check_compute_dtype(const Args& a, const std::string& choice);
// "bf16 matmuls, f32 master weights" / "f32".
std::string compute_desc(DType compute);

// ---- output ---------------------------------------------------------------------------------------------
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t);
std::string duration(double seconds);  // "42s", "3m05s", "1h02m"
// Printable form of generated bytes: text and well-formed UTF-8 stay, other bytes become '?'.
std::string printable(const std::string& s);

// A progress line: on a terminal it redraws itself in place, elsewhere it prints every `every` steps and the
// last. Shows step/total, the caller's fields, tokens per second and the ETA.
class Progress {
 public:
  Progress(int64_t total, int64_t tokens_per_step, int64_t every, int64_t first = 0);
  void update(int64_t step, const std::string& fields);
  double elapsed() const { return seconds_since(start_); }
  double tokens_per_second() const;

 private:
  int64_t total_, tokens_per_step_, every_, first_, last_ = 0;
  Clock::time_point start_;
  bool tty_;
};

// The end-of-run summary train and distill print: steps, tokens, speed and time on dev, the lines in
// `middle` as given, then the validation loss before and after over `windows` windows (LmEvaluator's).
void print_summary(int64_t steps, int64_t tokens_per_step, double train_seconds, const Progress& progress,
                   const std::string& device, Clock::time_point start, const std::string& middle,
                   double val_before, double val_after, int64_t windows);

// ---- text codec -----------------------------------------------------------------------------------------
// The tokenizer a run uses: "bytes" (vocab 256, no tokenizer file), "bpe" (a vocabulary trained on the data,
// saved in a file), "gpt2" (GPT-2's, from the bundled data) or "model" (a pretrained model's). Checkpoints
// carry its identity (tokenizer, tokenizer.file, tokenizer.vocab, tokenizer.crc32) and the tokenizer itself,
// so every later program decodes alike with nothing but the checkpoint. A checkpoint written from Python
// says "embedded" (a tokenizer without a file of its own) or "none".
class TextCodec {
 public:
  static TextCodec bytes();
  // The tokenizer of a pretrained model (a GGUF file or a Hugging Face directory), recorded in checkpoints by
  // the model's absolute path and a checksum of the vocabulary.
  static TextCodec model(const std::string& path);
  // A pretrained model's tokenizer, already loaded (PretrainedModel::tokenizer()).
  static TextCodec model(const std::string& path, std::shared_ptr<const Tokenizer> tok);
  static TextCodec bpe_file(const std::string& path);
  static TextCodec gpt2(const std::string& data_dir);
  // A checkpoint's: the tokenizer it embeds, under the identity it recorded (an older checkpoint names a
  // file: throws retort::Error naming the checkpoint when that file is gone or changed).
  static TextCodec from_checkpoint(const Checkpoint& ck);

  std::vector<int32_t> encode(const std::string& text) const;
  std::string decode(const std::vector<int32_t>& ids) const;
  int64_t vocab() const;
  const std::string& kind() const { return kind_; }
  // The identity: tokenizer (kind), tokenizer.file, tokenizer.vocab, tokenizer.crc32.
  std::map<std::string, std::string> metadata() const;
  // The identity and the tokenizer itself (embed_tokenizer), for a checkpoint that must stand alone.
  std::map<std::string, std::string> checkpoint_metadata() const;
  std::string describe() const;
  const Tokenizer* tokenizer() const { return tok_.get(); }  // null for bytes
  // A short name for file names: "bytes", "bpe1024", "gpt2", or the model file's stem.
  std::string short_name() const;

 private:
  std::string kind_ = "bytes", file_;
  uint32_t crc_ = 0;
  int64_t vocab_ = 256;  // without a tokenizer: bytes, or "none" (a Python-saved model's vocabulary)
  std::shared_ptr<const Tokenizer> tok_;
};

// ---- models -------------------------------------------------------------------------------------------
// A model a program runs: a retort checkpoint (from train or distill), a GGUF file or a Hugging Face
// directory, loaded into ctx with its tokenizer.
struct RunModel {
  PretrainedModel file;
  TextCodec codec;
  std::unique_ptr<Transformer> model;
  std::string shards;            // the shards a retort checkpoint was trained on; "" for a pretrained model
  std::string describe() const;  // "SmolLM2 135M (gguf llama, Q4_1/Q8_0/F32 weights; layers=30 ...)"
};
// Loads path with compute dtype `compute` and, when context > 0, that context (the longest window the
// program will run). Throws retort::Error naming the file.
RunModel load_run_model(const PretrainedModel& file, Context& ctx, DType compute, int64_t context);
inline RunModel load_run_model(const std::string& path, Context& ctx, DType compute, int64_t context) {
  return load_run_model(PretrainedModel::open(path), ctx, compute, context);
}
// What identifies a model's weights: a retort checkpoint's own checksum, or a CRC-32 of the file (a GGUF) or
// of config.json, tokenizer.json and the safetensors files (a Hugging Face directory). "crc32:1a2b3c4d".
std::string model_fingerprint(const PretrainedModel& m);

// One line for an out-of-memory failure: what the model of c needs for its f32 weights (and, training, their
// gradients and AdamW's two moments), and which options set the rest.
std::string memory_hint(const TransformerConfig& c, bool training, int64_t batch);

// ---- data ---------------------------------------------------------------------------------------------
// The text a run trains on, tokenized into train and validation shards (the last val_frac of the tokens).
struct DataOptions {
  std::string data;       // a text file
  int64_t max_bytes = 0;  // only its first max_bytes bytes (0: all)
  double val_frac = 0.05;
  std::string shards;  // the shard prefix (default: data without .txt, the codec's short name, .first<N>)
};
// The checks of --data, --max-bytes and --val-frac, before any work.
void check_data_options(const Args& a, const DataOptions& d);
// Tokenizes data.data with codec into shards at data.shards (filled in when empty; made absolute), or reuses
// the shards there when a record beside them ("<prefix>.source") says they hold the same bytes of the same
// file under the same tokenizer. The place is checked for writing before the text is read. Prints what it
// did. Throws retort::Error naming the file at fault.
ShardSet prepare_shards(DataOptions& data, const TextCodec& codec);
// Throws retort::Error ("vocabulary mismatch") when the record beside the shards of prefix says they were
// made with another tokenizer than codec; shards without a record pass (the id range is checked elsewhere).
void check_shards_tokenizer(const std::string& prefix, const TextCodec& codec, const std::string& model);
// A short checksum of every shard of prefix (both splits): equal fingerprints, the same tokens.
std::string shards_fingerprint(const std::string& prefix);
// One more than the largest token id in the shards (reads them all).
int64_t shard_vocab_bound(const std::vector<std::string>& shards);
// The start of a line from the middle of the held-out tokens, about 24 bytes, as a sample's prompt.
std::string heldout_prompt(const std::vector<std::string>& val_shards, const TextCodec& codec);

// ---- checkpoint helpers ---------------------------------------------------------------------------------
// The shards recorded in a checkpoint ("shards" metadata) for a split, or those of prefix when given.
std::vector<std::string> shards_for(const std::string& prefix, const std::string& split);

// ---- records ------------------------------------------------------------------------------------------
// A small "key=value" text file beside other files saying what they hold (a teacher cache's teacher, its
// tokenizer and shards), written atomically. read_record gives {} for a missing file.
void write_record(const std::string& path, const std::map<std::string, std::string>& rec);
std::map<std::string, std::string> read_record(const std::string& path);
// The record of a teacher top-K cache: "<prefix>.teacher".
std::string cache_record_path(const std::string& prefix);
// The record's "files" entry for a cache's shards: each file's name (beside the record) and the CRC-32 its
// header ends with, which covers the shard's sizes, positions and records checksum.
std::string cache_files_entry(const std::vector<std::string>& shard_paths);
// Opens the teacher cache at prefix as its record lists it ("files": one process's shards or every rank's;
// the positions they cover, not who wrote them, say where a batch's slots are, so any world size reads any
// cache). A listed shard that is missing, or whose header is not the one recorded (a shard of another
// cache), is a retort::Error naming the file; the shards' own checks follow (TopKCache). A record without
// "files" (a cache of an older teacher-cache): the shards "<prefix>_00000.topk", ...
TopKCache open_teacher_cache(const std::string& prefix, const std::map<std::string, std::string>& rec);

// ---- curves -------------------------------------------------------------------------------------------
// The numbers behind a loss picture, one row per step: tokens trained on, the training loss (and its hard
// and soft parts) and the validation loss where it was measured. Written as CSV ("step,tokens,loss,hard,
// soft,val", empty where not measured) for tools/loss_picture.py.
class Curves {
 public:
  void step(int64_t step, int64_t tokens, double loss, double hard, double soft);
  void validation(int64_t step, int64_t tokens, double val);
  void write(const std::string& path) const;  // atomically

 private:
  struct Row {
    int64_t step, tokens;
    double loss, hard, soft, val;
  };
  std::vector<Row> rows_;
};

// ---- SVG ------------------------------------------------------------------------------------------------
struct Series {
  std::string name, color;
  std::vector<double> x, y;
};
// A line chart of the series (x: step, y: loss) with axes, ticks and a legend, written atomically.
void write_svg(const std::string& path, const std::string& title, const std::vector<Series>& series);

}  // namespace ex

namespace ex {

// ---- sampling -------------------------------------------------------------------------------------------
// The programs' sampling: the library's Generator (KV-cached, src/nn/generate.h), its cache sized to the
// request (at most the model's context) and sliding when the text outgrows the context.
class Sampler {
 public:
  Sampler(Context& ctx, Transformer& model);
  // Continues prompt (empty: token 0) by n tokens: logits / temperature, then the top_k best (0: all), then
  // the smallest set whose probability reaches top_p (1: all); temperature 0 takes the argmax.
  std::vector<int32_t> generate(const std::vector<int32_t>& prompt, int64_t n, float temperature,
                                int64_t top_k, float top_p, uint64_t seed);

 private:
  Context& ctx_;
  Transformer& model_;
  std::unique_ptr<Generator> gen_;  // made on first use, remade larger when a request needs it
};

}  // namespace ex
