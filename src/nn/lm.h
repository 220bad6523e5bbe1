// Language-model training at the library level: checkpoints (a Transformer, its AdamW state and where the
// data loader stands, in one safetensors file written atomically), the loss heads as fused linear losses
// (the [tokens, vocab] logits never exist whole), and a trainer that owns one training step.
//
// It lives in src/nn rather than in examples/ because everything here is what a C++ app embedding retort or
// the tests need as much as the example programs do: resume must be bit-for-bit, and a test can only pin
// that if it drives the very code the programs run. The programs keep only their command lines and output.
#pragma once
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "../core/context.h"
#include "../core/graph.h"
#include "../dist/process_group.h"
#include "../io/batch_loader.h"
#include "../io/tokenizer.h"
#include "../io/topk_cache.h"
#include "../ops/loss/losses.h"
#include "data_parallel.h"
#include "optim.h"
#include "transformer.h"

namespace retort {

// ---- checkpoints ----------------------------------------------------------------------------------------
// A checkpoint is a safetensors file: the parameters (f32, by their names: "tok_emb", "layer0.wq", ...),
// optionally "adam.m.<name>" and "adam.v.<name>", and string metadata:
//   format "retort-lm-checkpoint", version "1", crc32 (of every tensor's bytes in file order, then of the
//   other metadata as sorted "key=value\n" lines: a flipped byte anywhere but in the JSON framing is caught),
//   the model config (config.vocab, config.layers, ...), the training state (step, total_steps, seed,
//   loader.epoch, loader.cursor, adam.* hyper-parameters), and whatever the caller adds (tokenizer identity,
//   shard prefix, ...). A checkpoint made to be used alone embeds its tokenizer ("tokenizer.data", see
//   embed_tokenizer), so nothing outside the file is needed to turn its ids back into text.

inline constexpr const char* kCheckpointFormat = "retort-lm-checkpoint";

// Where a run stands: enough, with the parameters and the AdamW moments, to continue bit-for-bit.
struct TrainState {
  int64_t step = 0;         // optimizer steps taken
  int64_t total_steps = 0;  // the schedule's length
  uint64_t seed = 0;        // the loader's seed
  int64_t loader_epoch = 0, loader_cursor = 0;
};

std::map<std::string, std::string> config_to_metadata(const TransformerConfig& c);
// Throws retort::Error naming `path` on a missing or malformed field.
TransformerConfig config_from_metadata(const std::map<std::string, std::string>& md, const std::string& path);

// Adds tok to checkpoint metadata as "tokenizer.data" (its own file format, base64), with "tokenizer.vocab".
void embed_tokenizer(std::map<std::string, std::string>& metadata, const Tokenizer& tok);

// Writes model (+ optimizer moments when given) and metadata atomically: a crash leaves the old file or the
// new one. extra must not use the reserved keys (format, version, crc32, config.*, state.*).
void save_checkpoint(const std::string& path, const Transformer& model, const AdamW* optimizer,
                     const TrainState& state, const std::map<std::string, std::string>& extra = {});
// The same with the moments given for each of model's parameters (m[i] and v[i] shaped as parameter i; both
// empty: none) and the optimizer's step count: what a ZeRO-1 run assembles from its ranks.
void save_checkpoint(const std::string& path, const Transformer& model, const std::vector<const Tensor*>& m,
                     const std::vector<const Tensor*>& v, int64_t step, const TrainState& state,
                     const std::map<std::string, std::string>& extra = {});

// A checkpoint opened and validated: missing or truncated file, not safetensors, wrong format (magic),
// unsupported version, checksum mismatch, malformed config, a config that does not match the stored tensors
// (a missing, extra or differently shaped one) — each a retort::Error naming the file and the fault, before
// anything is allocated from the config. The file stays mapped while this object lives.
class Checkpoint {
 public:
  // verify_checksum = false skips the crc32 (for tools that inspect damaged files, and the fuzzer); every
  // other check still runs.
  explicit Checkpoint(const std::string& path, bool verify_checksum = true);
  ~Checkpoint();
  Checkpoint(Checkpoint&&) noexcept;
  Checkpoint& operator=(Checkpoint&&) noexcept;

  const std::string& path() const { return path_; }
  const TransformerConfig& config() const { return config_; }
  const TrainState& state() const { return state_; }
  bool has_optimizer() const;
  // Metadata value, or fallback when absent.
  std::string meta(const std::string& key, const std::string& fallback = "") const;
  const std::map<std::string, std::string>& metadata() const;
  // The tokenizer embedded by embed_tokenizer (validated when the checkpoint opens); null when it has none.
  std::shared_ptr<const Tokenizer> tokenizer() const { return tokenizer_; }

  // Copies the parameters into model, whose config must equal this one (else a retort::Error naming both).
  void load_model(Transformer& model) const;
  // Copies the AdamW moments and step count; throws when the checkpoint has none or the shapes differ.
  void load_optimizer(AdamW& optimizer, const Transformer& model) const;
  // Copies the stored tensor `name` into t, which must have its shape (else a retort::Error naming the file).
  void load_tensor(Tensor* t, const std::string& name) const;

 private:
  // Throws naming the file unless its tensors are exactly those config_ implies, with those shapes.
  void check_tensors() const;

  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string path_;
  TransformerConfig config_;
  TrainState state_;
  std::shared_ptr<const Tokenizer> tokenizer_;
};

// Throws retort::Error unless the two models share a vocabulary (distillation needs the same token ids).
void check_same_vocab(const TransformerConfig& teacher, const TransformerConfig& student,
                      const std::string& teacher_name, const std::string& student_name);

// ---- loss heads -----------------------------------------------------------------------------------------
// tokens i32 [B, T], targets i32 [B, T] (targets[b][t] = the token after tokens[b][t]).

// Mean next-token cross-entropy through fused_linear_cross_entropy on the model's final hidden states.
LossOutputs lm_cross_entropy(Context& ctx, Transformer& model, Tensor* tokens, Tensor* targets);
// w_hard·CE + w_soft·T²·KD(teacher top-K ‖ student) through fused_linear_topk_kd; teacher ids / logprobs /
// mask [B*T, K] (row b*T + t: the teacher's candidates for targets[b][t]).
LossOutputs lm_topk_distill(Context& ctx, Transformer& model, Tensor* tokens, Tensor* targets,
                            Tensor* teacher_ids, Tensor* teacher_logprobs, Tensor* mask,
                            const TopKDistillOptions& opts);

// ---- trainer --------------------------------------------------------------------------------------------
struct TrainerOptions {
  int64_t steps = 300, batch = 16, seq_len = 128, warmup = 10;
  float lr = 3e-3f, min_lr = 3e-4f, weight_decay = 0.1f, clip = 1.0f;
  uint64_t seed = 1;
  // A step whose loss or gradient norm is not finite stops training with a retort::Error naming the step,
  // and for a gradient the parameter and its first non-finite value; with this on, the batch is skipped
  // instead (no update, StepResult::skipped set) and training goes on.
  bool skip_nonfinite = false;
  // Data parallelism over group (null, or a world of 1: this process alone, and nothing is added to the
  // step). batch is then per rank: each step takes batch x world windows, rank r rows [r*batch, (r+1)*batch);
  // gradients are summed in buckets of bucket_mib MiB travelling as bucket_dtype (F32 or BF16).
  dist::ProcessGroup* group = nullptr;
  DType bucket_dtype = DType::F32;
  int64_t bucket_mib = kDefaultBucketMiB;
  // ZeRO-1 (with a group of several ranks): AdamW's moments are split over the ranks, each rank updating its
  // share of the parameters (zero_shard in data_parallel.h) and gathering the rest, so the optimizer state
  // per rank is 1/world of it. The steps equal those without it.
  bool zero1 = false;
};

// What the loss is: plain cross-entropy, or top-K distillation from a cache (offline) or from side data the
// caller fills each step (online: set_side before each step through the before_step hook).
struct DistillHead {
  bool enabled = false;
  TopKDistillOptions opts;
  int64_t k = 0;                     // teacher candidates per position
  const TopKCache* cache = nullptr;  // offline: gathered per batch; null: the caller fills ids/logprobs/mask
};

// One training run's step: loader → batch → forward+backward → clip → AdamW with a cosine schedule, all in
// one graph (the optimizer's ops are its last), so the host waits for the device once per step, to read the
// loss. The model's parameters live in ctx; the trainer adds its graph to ctx.
class LmTrainer {
 public:
  LmTrainer(Context& ctx, Transformer& model, const std::vector<std::string>& train_shards,
            const TrainerOptions& options, const DistillHead& head = {});

  struct StepResult {
    double loss = 0, hard = 0, soft = 0, grad_norm = 0;
    float lr = 0;
    bool skipped = false;  // the loss or a gradient was not finite and skip_nonfinite is on: no update
  };
  // Runs step number steps_done()+1. before_compute, when set, sees the batch (and may fill the teacher
  // inputs: teacher_ids(), teacher_logprobs(), teacher_mask()) before the graph runs. On a device the
  // next step's batch is read (and before_compute called for it) while this step's graph runs, so the
  // loader is then one batch ahead of state(); device work before_compute queues lands after this step's.
  StepResult step(const std::function<void(const Batch&)>& before_compute = nullptr);

  int64_t steps_done() const { return optimizer_->steps(); }
  // The optimizer (with ZeRO-1, over this rank's pieces of the parameters only).
  const AdamW& optimizer() const { return *optimizer_; }
  TrainState state() const;
  // With ZeRO-1 every rank must call save (the moments are gathered to rank 0, which alone writes).
  void save(const std::string& path, const std::map<std::string, std::string>& extra = {}) const;
  bool zero1() const { return zero_ != nullptr; }
  // How the gradients are exchanged (buckets, embeddings gathered sparsely); all zero in a world of 1.
  const GradSync& grad_sync() const { return sync_; }
  // Loads parameters, moments, step and loader position from a checkpoint of the same model and seed.
  void resume(const Checkpoint& ckpt);

  Tensor* teacher_ids() const { return t_ids_; }
  Tensor* teacher_logprobs() const { return t_logprobs_; }
  Tensor* teacher_mask() const { return t_mask_; }
  const BatchLoader& loader() const { return *loader_; }
  const Graph& graph() const { return *graph_; }
  const TrainerOptions& options() const { return opt_; }

 private:
  Context& ctx_;
  Transformer& model_;
  TrainerOptions opt_;
  DistillHead head_;
  std::unique_ptr<BatchLoader> loader_;
  std::unique_ptr<Graph> graph_;
  std::unique_ptr<AdamW> optimizer_;
  Tensor *tokens_ = nullptr, *targets_ = nullptr;
  Tensor *t_ids_ = nullptr, *t_logprobs_ = nullptr, *t_mask_ = nullptr;
  LossOutputs out_;
  Tensor* summary_ = nullptr;  // f32 [4 + parts]: the optimizer's stats, then the hard and soft parts
  GradSync sync_;              // data parallelism: set when the world is larger than 1
  std::unique_ptr<ZeroShard> zero_;  // ZeRO-1: this rank's share of the parameters
  Batch batch_;
  TopKBatch topk_;
  // The next step's batch read and queued ahead (devices only), where the loader stood before it, and an
  // error reading it, thrown at the step it was for.
  void stage(const std::function<void(const Batch&)>& before_compute);
  bool staged_ = false;
  int64_t staged_epoch_ = 0, staged_cursor_ = 0;
  std::exception_ptr staged_error_;
};

// The validation loss every program reports (train, distill, eval, the demo): the mean next-token
// cross-entropy in nats per token over the first `windows` windows of the shards (all of them when windows
// <= 0), windows of seq_len tokens at stride seq_len in stream order. Run `batch` windows at a time; the
// number does not depend on the batch beyond f32 rounding. The graph is built once.
inline constexpr int64_t kValidationWindows = 256;  // the programs' default: enough to compare, quick to run

class LmEvaluator {
 public:
  LmEvaluator(Context& ctx, Transformer& model, const std::vector<std::string>& shards, int64_t batch,
              int64_t seq_len, int64_t windows = kValidationWindows);
  double run();
  int64_t windows() const { return windows_; }
  int64_t tokens_per_run() const { return windows_ * T_; }

 private:
  std::unique_ptr<BatchLoader> loader_;
  std::unique_ptr<Graph> graph_;
  Tensor *tokens_ = nullptr, *targets_ = nullptr, *loss_ = nullptr;
  int64_t B_ = 0, T_ = 0, windows_ = 0;
};

}  // namespace retort
