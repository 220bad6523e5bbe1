#include "lm.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <set>
#include <span>
#include <utility>

#include "../core/cpu_backend.h"
#include "../core/error.h"
#include "../io/file.h"
#include "../io/safetensors.h"
#include "../ops/loss/fused_linear.h"
#include "../ops/ops.h"

namespace retort {

namespace {

int64_t parse_int(const std::map<std::string, std::string>& md, const std::string& key,
                  const std::string& path) {
  const auto it = md.find(key);
  if (it == md.end()) io::file_error(path, "checkpoint metadata lacks '" + key + "'");
  try {
    size_t used = 0;
    const long long v = std::stoll(it->second, &used);
    if (used == it->second.size()) return v;
  } catch (const std::exception&) {
  }
  io::file_error(path, "checkpoint metadata '" + key + "' = '" + it->second + "' is not an integer");
}

float parse_float(const std::map<std::string, std::string>& md, const std::string& key,
                  const std::string& path) {
  const auto it = md.find(key);
  if (it == md.end()) io::file_error(path, "checkpoint metadata lacks '" + key + "'");
  try {
    size_t used = 0;
    const float v = std::stof(it->second, &used);
    if (used == it->second.size()) return v;
  } catch (const std::exception&) {
  }
  io::file_error(path, "checkpoint metadata '" + key + "' = '" + it->second + "' is not a number");
}

std::string shape_text(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// %.9g round-trips every float.
std::string float_str(float f) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", double(f));
  return buf;
}

// The metadata's part of the checksum: sorted "key=value\n" lines, crc32 itself left out.
uint32_t metadata_crc(uint32_t crc, const std::map<std::string, std::string>& md) {
  for (const auto& [k, v] : md) {
    if (k == "crc32") continue;
    const std::string line = k + "=" + v + "\n";
    crc = io::crc32_update(crc, line.data(), line.size());
  }
  return crc;
}

constexpr char kBase64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string base64(std::span<const uint8_t> b) {
  std::string out;
  out.reserve((b.size() + 2) / 3 * 4);
  for (size_t i = 0; i < b.size(); i += 3) {
    const uint32_t n = uint32_t(b[i]) << 16 | (i + 1 < b.size() ? uint32_t(b[i + 1]) << 8 : 0) |
                       (i + 2 < b.size() ? uint32_t(b[i + 2]) : 0);
    out += kBase64[n >> 18 & 63];
    out += kBase64[n >> 12 & 63];
    out += i + 1 < b.size() ? kBase64[n >> 6 & 63] : '=';
    out += i + 2 < b.size() ? kBase64[n & 63] : '=';
  }
  return out;
}

std::vector<uint8_t> unbase64(const std::string& s, const std::string& path) {
  int8_t val[256];
  std::fill(val, val + 256, int8_t(-1));
  for (int i = 0; i < 64; ++i) val[uint8_t(kBase64[i])] = int8_t(i);
  if (s.size() % 4 != 0) io::file_error(path, "checkpoint metadata 'tokenizer.data' is not base64");
  std::vector<uint8_t> out;
  out.reserve(s.size() / 4 * 3);
  for (size_t i = 0; i < s.size(); i += 4) {
    uint32_t n = 0;
    int pad = 0;
    for (size_t j = 0; j < 4; ++j) {
      const char c = s[i + j];
      const bool tail = c == '=' && i + 4 == s.size() && j >= 2 && (j == 3 || s[i + 3] == '=');
      if (!tail && val[uint8_t(c)] < 0)
        io::file_error(path, "checkpoint metadata 'tokenizer.data' is not base64");
      pad += tail;
      n = n << 6 | (tail ? 0 : uint32_t(val[uint8_t(c)]));
    }
    out.push_back(uint8_t(n >> 16));
    if (pad < 2) out.push_back(uint8_t(n >> 8));
    if (pad < 1) out.push_back(uint8_t(n));
  }
  return out;
}

bool reserved_key(const std::string& k) {
  return k == "format" || k == "version" || k == "crc32" || k.rfind("config.", 0) == 0 ||
         k.rfind("state.", 0) == 0;
}

}  // namespace

std::map<std::string, std::string> config_to_metadata(const TransformerConfig& c) {
  return {
      {"config.vocab", std::to_string(c.vocab)},   {"config.context", std::to_string(c.context)},
      {"config.layers", std::to_string(c.layers)}, {"config.d_model", std::to_string(c.d_model)},
      {"config.heads", std::to_string(c.heads)},   {"config.kv_heads", std::to_string(c.kv_heads)},
      {"config.d_ff", std::to_string(c.d_ff)},     {"config.rope_theta", float_str(c.rope_theta)},
      {"config.norm_eps", float_str(c.norm_eps)},  {"config.tie_embeddings", c.tie_embeddings ? "1" : "0"},
      {"config.qkv_bias", c.qkv_bias ? "1" : "0"}};
}

TransformerConfig config_from_metadata(const std::map<std::string, std::string>& md,
                                       const std::string& path) {
  TransformerConfig c;
  c.vocab = parse_int(md, "config.vocab", path);
  c.context = parse_int(md, "config.context", path);
  c.layers = parse_int(md, "config.layers", path);
  c.d_model = parse_int(md, "config.d_model", path);
  c.heads = parse_int(md, "config.heads", path);
  c.kv_heads = parse_int(md, "config.kv_heads", path);
  c.d_ff = parse_int(md, "config.d_ff", path);
  c.rope_theta = parse_float(md, "config.rope_theta", path);
  c.norm_eps = parse_float(md, "config.norm_eps", path);
  c.tie_embeddings = parse_int(md, "config.tie_embeddings", path) != 0;
  // Absent in checkpoints written before biases existed: those models have none.
  c.qkv_bias = md.count("config.qkv_bias") != 0 && parse_int(md, "config.qkv_bias", path) != 0;
  try {
    return c.resolved();
  } catch (const Error& e) {
    io::file_error(path, std::string("bad model config in checkpoint: ") + e.what());
  }
}

void embed_tokenizer(std::map<std::string, std::string>& metadata, const Tokenizer& tok) {
  metadata["tokenizer.data"] = base64(tok.to_bytes());
  metadata["tokenizer.vocab"] = std::to_string(tok.vocab_size());
}

void save_checkpoint(const std::string& path, const Transformer& model, const AdamW* optimizer,
                     const TrainState& state, const std::map<std::string, std::string>& extra) {
  std::vector<const Tensor*> m, v;
  if (optimizer) {
    RT_CHECK(optimizer->m().size() == model.parameters().size(), "save_checkpoint: ", path,
             ": the optimizer does not hold the model's parameters");
    m.assign(optimizer->m().begin(), optimizer->m().end());
    v.assign(optimizer->v().begin(), optimizer->v().end());
  }
  save_checkpoint(path, model, m, v, optimizer ? optimizer->steps() : state.step, state, extra);
}

void save_checkpoint(const std::string& path, const Transformer& model, const std::vector<const Tensor*>& m,
                     const std::vector<const Tensor*>& v, int64_t step, const TrainState& state,
                     const std::map<std::string, std::string>& extra) {
  std::vector<std::pair<std::string, const Tensor*>> tensors;
  const auto& params = model.parameters();
  for (const Tensor* p : params) tensors.emplace_back(p->name, p);
  RT_CHECK(m.size() == v.size() && (m.empty() || m.size() == params.size()), "save_checkpoint: ", path, ": ",
           m.size(), " and ", v.size(), " moments for ", params.size(), " parameters");
  for (size_t i = 0; i < m.size(); ++i) tensors.emplace_back("adam.m." + params[i]->name, m[i]);
  for (size_t i = 0; i < v.size(); ++i) tensors.emplace_back("adam.v." + params[i]->name, v[i]);
  std::map<std::string, std::string> md = config_to_metadata(model.config());
  for (const auto& [k, v] : extra) {
    RT_CHECK(!reserved_key(k), "save_checkpoint: ", path, ": metadata key '", k, "' is reserved");
    md[k] = v;
  }
  md["format"] = kCheckpointFormat;
  md["version"] = "1";
  md["state.step"] = std::to_string(step);
  md["state.total_steps"] = std::to_string(state.total_steps);
  md["state.seed"] = std::to_string(state.seed);
  md["state.loader_epoch"] = std::to_string(state.loader_epoch);
  md["state.loader_cursor"] = std::to_string(state.loader_cursor);
  uint32_t crc = 0;
  for (const auto& [name, t] : tensors) {
    const std::vector<uint8_t> b = get_bytes(t);
    crc = io::crc32_update(crc, b.data(), b.size());
  }
  char hex[16];
  std::snprintf(hex, sizeof hex, "%08x", metadata_crc(crc, md));
  md["crc32"] = hex;
  save_safetensors(path, tensors, md);
}

struct Checkpoint::Impl {
  explicit Impl(const std::string& path) : st(path) {}
  SafeTensors st;
};

Checkpoint::Checkpoint(const std::string& path, bool verify_checksum) : path_(path) {
  impl_ = std::make_unique<Impl>(path);  // missing, truncated, not safetensors: SafeTensors names the fault
  const auto& md = impl_->st.metadata();
  const auto fmt = md.find("format");
  if (fmt == md.end() || fmt->second != kCheckpointFormat)
    io::file_error(path, "wrong magic: metadata format is '" +
                             (fmt == md.end() ? std::string("(none)") : fmt->second) + "', expected '" +
                             kCheckpointFormat + "' (not a retort checkpoint)");
  if (meta("version") != "1")
    io::file_error(path, "unsupported checkpoint version '" + meta("version") + "' (this build reads 1)");
  uint32_t crc = 0;
  for (const std::string& n : impl_->st.names()) {
    if (!verify_checksum) break;
    const auto b = impl_->st.bytes(n);
    crc = io::crc32_update(crc, b.data(), b.size());
  }
  char hex[16];
  std::snprintf(hex, sizeof hex, "%08x", metadata_crc(crc, md));
  if (verify_checksum && meta("crc32") != hex)
    io::file_error(path, "checksum mismatch: stored crc32 " + meta("crc32", "(none)") + ", computed " + hex +
                             " (the file is corrupt)");
  config_ = config_from_metadata(md, path);
  check_tensors();
  state_.step = parse_int(md, "state.step", path);
  state_.total_steps = parse_int(md, "state.total_steps", path);
  state_.seed = uint64_t(parse_int(md, "state.seed", path));
  state_.loader_epoch = parse_int(md, "state.loader_epoch", path);
  state_.loader_cursor = parse_int(md, "state.loader_cursor", path);
  if (const auto it = md.find("tokenizer.data"); it != md.end()) {
    tokenizer_ = std::make_shared<Tokenizer>(
        Tokenizer::from_bytes(unbase64(it->second, path), path + " (its embedded tokenizer)"));
    if (tokenizer_->vocab_size() > config_.vocab)
      io::file_error(path, "its embedded tokenizer has " + std::to_string(tokenizer_->vocab_size()) +
                               " tokens, more than the model's vocabulary of " +
                               std::to_string(config_.vocab));
  }
  if (state_.step < 0 || state_.total_steps < 0 || state_.loader_epoch < 0 || state_.loader_cursor < 0)
    io::file_error(path, "negative training state (step " + std::to_string(state_.step) + ", total_steps " +
                             std::to_string(state_.total_steps) + ", loader epoch " +
                             std::to_string(state_.loader_epoch) + ", cursor " +
                             std::to_string(state_.loader_cursor) + ")");
}

// The config drives every allocation a loader makes, so it is trusted only once each tensor it implies is
// stored with that shape: the stored tensors lie inside the file (SafeTensors checked their offsets), so this
// bounds every size by the file's own.
void Checkpoint::check_tensors() const {
  const SafeTensors& st = impl_->st;
  std::set<std::string> want;
  const bool adam = st.has("adam.m.tok_emb");
  for (const ParamSpec& s : transformer_parameters(config_)) {
    for (const std::string& name :
         adam ? std::vector<std::string>{s.name, "adam.m." + s.name, "adam.v." + s.name}
              : std::vector<std::string>{s.name}) {
      want.insert(name);
      if (!st.has(name))
        io::file_error(path_, "no tensor '" + name + "' (shape " + shape_text(s.shape) + ") for the model " +
                                  config_.describe() + " its config describes");
      if (st.shape(name) != s.shape)
        io::file_error(path_, "tensor '" + name + "' has shape " + shape_text(st.shape(name)) +
                                  ", but the config (" + config_.describe() + ") implies " +
                                  shape_text(s.shape));
      if (!is_float(st.dtype(name)))
        io::file_error(path_,
                       "tensor '" + name + "' is " + dtype_name(st.dtype(name)) + ", expected a float type");
    }
  }
  for (const std::string& name : st.names())
    if (!want.count(name))
      io::file_error(path_, "tensor '" + name + "' is not part of the model " + config_.describe() +
                                (adam ? " or its optimizer state" : "") + " the config describes");
}

Checkpoint::~Checkpoint() = default;
Checkpoint::Checkpoint(Checkpoint&&) noexcept = default;
Checkpoint& Checkpoint::operator=(Checkpoint&&) noexcept = default;

bool Checkpoint::has_optimizer() const {
  return impl_->st.has("adam.m.tok_emb");
}

std::string Checkpoint::meta(const std::string& key, const std::string& fallback) const {
  const auto& md = impl_->st.metadata();
  const auto it = md.find(key);
  return it == md.end() ? fallback : it->second;
}

const std::map<std::string, std::string>& Checkpoint::metadata() const {
  return impl_->st.metadata();
}

void Checkpoint::load_model(Transformer& model) const {
  const TransformerConfig& c = model.config();
  if (!same_architecture(c, config_))
    io::file_error(
        path_, "checkpoint holds a model " + config_.describe() + ", not the " + c.describe() + " asked for");
  for (Tensor* p : model.parameters()) impl_->st.load_into(p, p->name);
}

void Checkpoint::load_tensor(Tensor* t, const std::string& name) const {
  impl_->st.load_into(t, name);
}

void Checkpoint::load_optimizer(AdamW& optimizer, const Transformer& model) const {
  if (!has_optimizer()) io::file_error(path_, "checkpoint holds no optimizer state (cannot resume from it)");
  const auto& params = model.parameters();
  RT_CHECK(optimizer.m().size() == params.size(), "checkpoint ", path_,
           ": the optimizer does not hold the model's parameters");
  for (size_t i = 0; i < params.size(); ++i) {
    impl_->st.load_into(optimizer.m()[i], "adam.m." + params[i]->name);
    impl_->st.load_into(optimizer.v()[i], "adam.v." + params[i]->name);
  }
  optimizer.set_steps(state_.step);
}

void check_same_vocab(const TransformerConfig& teacher, const TransformerConfig& student,
                      const std::string& teacher_name, const std::string& student_name) {
  RT_CHECK(teacher.vocab == student.vocab, "vocabulary mismatch: teacher ", teacher_name, " has vocab ",
           teacher.vocab, ", student ", student_name, " has vocab ", student.vocab,
           " (distillation needs the same tokenizer)");
}

// ---- loss heads -----------------------------------------------------------------------------------------

namespace {
Tensor* flat_labels(Context& ctx, Tensor* targets) {
  RT_CHECK(targets != nullptr && is_int(targets->dtype), "lm loss: targets must be an integer tensor");
  Tensor* t = targets->is_contiguous() ? targets : contiguous(ctx, targets);
  return reshape(ctx, t, {targets->nelements()});
}
}  // namespace

LossOutputs lm_cross_entropy(Context& ctx, Transformer& model, Tensor* tokens, Tensor* targets) {
  Tensor* h = model.hidden(ctx, tokens);
  RT_CHECK(targets->nelements() == h->nrows(), "lm_cross_entropy: targets ", targets->describe(),
           " must match tokens ", tokens->describe());
  // In the compute dtype (bf16 hidden and weight under mixed precision): the fused op accumulates in f32
  // and hands back f32 gradients, which reach the f32 parameters through the casts' backward.
  return fused_linear_cross_entropy(ctx, model.head_input(ctx, h), model.head_weight(ctx), nullptr,
                                    flat_labels(ctx, targets), {});
}

LossOutputs lm_topk_distill(Context& ctx, Transformer& model, Tensor* tokens, Tensor* targets,
                            Tensor* teacher_ids, Tensor* teacher_logprobs, Tensor* mask,
                            const TopKDistillOptions& opts) {
  Tensor* h = model.hidden(ctx, tokens);
  RT_CHECK(targets->nelements() == h->nrows(), "lm_topk_distill: targets ", targets->describe(),
           " must match tokens ", tokens->describe());
  // Labels only when the hard loss needs them: without them (and with normalize_topk) the fused op takes its
  // K-sparse path, which skips the full-vocabulary GEMMs.
  Tensor* labels = opts.w_hard > 0 ? flat_labels(ctx, targets) : nullptr;
  return fused_linear_topk_kd(ctx, model.head_input(ctx, h), model.head_weight(ctx), nullptr, teacher_ids,
                              teacher_logprobs, mask, labels, opts);
}

// ---- trainer --------------------------------------------------------------------------------------------

LmTrainer::LmTrainer(Context& ctx, Transformer& model, const std::vector<std::string>& train_shards,
                     const TrainerOptions& options, const DistillHead& head)
    : ctx_(ctx), model_(model), opt_(options), head_(head) {
  RT_CHECK(!model.frozen(),
           "trainer: the model's weights are frozen (Transformer::freeze_weights, for a model "
           "that only runs forward): its forward reads 16-bit copies that training would not update");
  RT_CHECK(opt_.steps >= 1 && opt_.batch >= 1 && opt_.seq_len >= 1,
           "trainer: steps, batch and seq_len must be >= 1");
  RT_CHECK(opt_.seq_len <= model.config().context, "trainer: seq_len ", opt_.seq_len,
           " exceeds the model's context ", model.config().context);
  RT_CHECK(opt_.warmup >= 0 && opt_.warmup <= opt_.steps, "trainer: warmup ", opt_.warmup,
           " must be in [0, steps]");
  BatchLoaderOptions lo;
  lo.batch = opt_.batch;
  lo.seq_len = opt_.seq_len;
  lo.seed = opt_.seed;
  const bool parallel = opt_.group && opt_.group->size() > 1;
  if (parallel) {
    lo.rank = opt_.group->rank();
    lo.world = opt_.group->size();
    RT_CHECK(opt_.bucket_mib >= 1 && opt_.bucket_mib <= 4096, "trainer: bucket size ", opt_.bucket_mib,
             " MiB must be in [1, 4096]");
  }
  loader_ = std::make_unique<BatchLoader>(train_shards, lo);
  const int64_t B = opt_.batch, T = opt_.seq_len, N = B * T;
  tokens_ = ctx.input(DType::I32, {B, T}, "tokens");
  targets_ = ctx.input(DType::I32, {B, T}, "targets");
  if (head_.enabled) {
    RT_CHECK(head_.k >= 1, "trainer: distillation needs K >= 1, got ", head_.k);
    if (head_.cache) {
      head_.cache->check_vocab(model.config().vocab);
      RT_CHECK(head_.k <= head_.cache->k(), "trainer: K = ", head_.k,
               " is larger than the teacher cache holds (K = ", head_.cache->k(), ")");
    }
    t_ids_ = ctx.input(DType::I32, {N, head_.k}, "teacher_ids");
    t_logprobs_ = ctx.input(DType::F32, {N, head_.k}, "teacher_logprobs");
    t_mask_ = ctx.input(DType::F32, {N, head_.k}, "teacher_mask");
    TopKDistillOptions o = head_.opts;
    o.return_parts = o.w_hard > 0;
    out_ = lm_topk_distill(ctx, model, tokens_, targets_, t_ids_, t_logprobs_, t_mask_, o);
  } else {
    out_ = lm_cross_entropy(ctx, model, tokens_, targets_);
  }
  graph_ = std::make_unique<Graph>(ctx);
  if (out_.hard) graph_->forward(out_.hard);
  if (out_.soft) graph_->forward(out_.soft);
  // Data parallel: the backward is seeded with this rank's share of the step's tokens (set in stage()).
  graph_->backward(out_.loss, parallel ? ctx.tensor(DType::F32, {1}, "data_parallel.weight") : nullptr);
  AdamWConfig adam;
  adam.lr = opt_.lr;
  adam.beta1 = 0.9f;
  adam.beta2 = 0.95f;
  adam.weight_decay = opt_.weight_decay;
  Tensor* loss = out_.loss;
  if (parallel && opt_.zero1) {
    zero_ = std::make_unique<ZeroShard>(zero_shard(*graph_, *opt_.group->device(), opt_.bucket_mib << 20));
    optimizer_ = std::make_unique<AdamW>(zero_->params, adam);
  } else {
    optimizer_ = std::make_unique<AdamW>(model.parameters(), adam);
  }
  if (parallel) {
    std::vector<Tensor*> parts;
    for (Tensor* part : {out_.hard, out_.soft})
      if (part) parts.push_back(part);
    sync_ = append_grad_sync(*graph_, *opt_.group->device(), out_.loss, parts, opt_.bucket_dtype,
                             opt_.bucket_mib << 20);
    loss = sync_.loss;
  }
  // The update, the clip and the non-finite check run on the device as the graph's last ops; what the host
  // needs to know of a step (loss, parts, norm, applied) is gathered into one tensor, read once.
  const double clip = opt_.clip > 0 ? opt_.clip : 0.0;
  if (zero_) {
    summary_ = optimizer_->append_step(*graph_, loss, clip, zero_->grads, zero_->full_grads);
    append_param_gather(*graph_, *opt_.group->device(), *zero_, summary_);
  } else {
    summary_ = optimizer_->append_step(*graph_, loss, clip);
  }
  // With data parallelism the parts are summed in place by the loss's all_reduce, which the update (and so
  // this concat, made after it) runs after.
  for (Tensor* part : {out_.hard, out_.soft})
    if (part) summary_ = concat(ctx, summary_, reshape(ctx, part, {1}), 0);
  summary_->flags |= kOutput;
  graph_->forward(summary_);
}

void LmTrainer::stage(const std::function<void(const Batch&)>& before_compute) {
  const int64_t B = opt_.batch, T = opt_.seq_len;
  batch_.B = B;
  batch_.T = T;
  batch_.inputs.resize(size_t(B * T));
  batch_.targets.resize(size_t(B * T));
  batch_.starts.resize(size_t(B));
  loader_->next(batch_.inputs.data(), batch_.targets.data(), batch_.starts.data());
  set_data_int(tokens_, std::vector<int64_t>(batch_.inputs.begin(), batch_.inputs.end()));
  set_data_int(targets_, std::vector<int64_t>(batch_.targets.begin(), batch_.targets.end()));
  if (head_.enabled && head_.cache) {
    topk_ = head_.cache->gather(batch_.starts, T, head_.k);
    set_data_int(t_ids_, std::vector<int64_t>(topk_.ids.begin(), topk_.ids.end()));
    set_data(t_logprobs_, topk_.logprobs);
    set_data(t_mask_, topk_.mask);
  }
  if (before_compute) before_compute(batch_);
  if (sync_.weight) {
    // This rank's share of the step's valid targets, from one host-side sum (no wait for the device).
    int64_t mine = 0;
    for (int32_t y : batch_.targets) mine += y != -100;
    std::vector<int64_t> all{mine};
    opt_.group->host().all_reduce_sum(all);
    set_data(sync_.weight, {all[0] > 0 ? float(double(mine) / double(all[0]))
                                       : 1.0f / float(opt_.group->size())});
  }
}

LmTrainer::StepResult LmTrainer::step(const std::function<void(const Batch&)>& before_compute) {
  if (staged_error_) std::rethrow_exception(std::exchange(staged_error_, nullptr));
  if (!staged_) stage(before_compute);
  staged_ = false;
  StepResult r;
  const int64_t step = optimizer_->steps() + 1;
  const float lr = cosine_lr(std::min(step, opt_.steps), opt_.warmup, opt_.steps, opt_.lr, opt_.min_lr);
  optimizer_->begin_step(lr);
  graph_->zero_grad();
  graph_->compute();
  // On a device the graph runs while the host reads the next batch and queues its copies behind it, so the
  // device does not sit idle between steps. A failure there surfaces at the next step, where it belongs.
  if (!ctx_.backend().is_host() && step < opt_.steps) {
    staged_epoch_ = loader_->epoch();
    staged_cursor_ = loader_->cursor();
    try {
      stage(before_compute);
      staged_ = true;
    } catch (...) {
      staged_error_ = std::current_exception();
      loader_->seek(staged_epoch_, staged_cursor_);
    }
  }
  // The step's one wait for the device: {loss, grad norm, clip scale, applied, hard?, soft?}.
  const std::vector<float> s =
      opt_.group ? opt_.group->read_bounded(summary_, detail::concat("training step ", step)) : get_data(summary_);
  const bool applied = s[kStatOk] != 0.0f;
  optimizer_->end_step(applied);
  r.loss = s[kStatLoss];
  r.grad_norm = s[kStatNorm];
  size_t next = kOptStats;
  if (out_.hard) r.hard = s[next++];
  if (out_.soft) r.soft = s[next++];
  if (head_.enabled && !out_.soft) r.soft = head_.opts.w_soft > 0 ? r.loss / head_.opts.w_soft : 0;
  if (applied) {
    r.lr = lr;
    return r;
  }
  // The device skipped the update: the loss or the gradient norm is not finite (a finite loss can still come
  // with NaN gradients, a NaN that a max or a masked sum dropped).
  if (!std::isfinite(r.loss)) {
    RT_CHECK(opt_.skip_nonfinite, "trainer: the loss became ", r.loss, " at step ", step,
             " (try a lower --lr or a smaller model)");
  } else if (!opt_.skip_nonfinite) {
    check_finite_gradients(*graph_, detail::concat("trainer: step ", step, " (loss ", r.loss, ")"));
    RT_FAIL("trainer: the gradient norm became ", r.grad_norm, " at step ", step);
  }
  r.skipped = true;
  return r;
}

TrainState LmTrainer::state() const {
  TrainState s;
  s.step = optimizer_->steps();
  s.total_steps = opt_.steps;
  s.seed = opt_.seed;
  // Where the next step's batch starts (read ahead already on a device: staged_).
  s.loader_epoch = staged_ ? staged_epoch_ : loader_->epoch();
  s.loader_cursor = staged_ ? staged_cursor_ : loader_->cursor();
  return s;
}

void LmTrainer::save(const std::string& path, const std::map<std::string, std::string>& extra) const {
  if (!zero_) return save_checkpoint(path, model_, optimizer_.get(), state(), extra);
  // ZeRO-1: the whole moments on rank 0, in host tensors, so the checkpoint resumes at any world size.
  const auto whole =
      gather_moments(*zero_, optimizer_->m(), optimizer_->v(), opt_.group->host(), model_.parameters());
  if (whole.empty()) return;
  CpuBackend cpu(1);
  Context host(cpu);
  std::vector<const Tensor*> m, v;
  const auto& params = model_.parameters();
  for (size_t i = 0; i < 2 * params.size(); ++i) {
    Tensor* t = host.tensor(DType::F32, params[i % params.size()]->shape());
    set_data(t, whole[i]);
    (i < params.size() ? m : v).push_back(t);
  }
  save_checkpoint(path, model_, m, v, optimizer_->steps(), state(), extra);
}

void LmTrainer::resume(const Checkpoint& ckpt) {
  RT_CHECK(ckpt.state().seed == opt_.seed, "resume from ", ckpt.path(), ": it was trained with seed ",
           ckpt.state().seed, ", this run has seed ", opt_.seed, " (the batches would differ)");
  ckpt.load_model(model_);
  if (zero_) {
    // This rank's pieces of the whole moments the checkpoint holds (written at any world size).
    if (!ckpt.has_optimizer()) ckpt.load_optimizer(*optimizer_, model_);  // throws its error
    CpuBackend cpu(1);
    Context host(cpu);
    scatter_moments(*zero_, optimizer_->m(), optimizer_->v(), [&](const Tensor* p, bool second) {
      Tensor* t = host.tensor(DType::F32, p->shape());
      ckpt.load_tensor(t, (second ? "adam.v." : "adam.m.") + p->name);
      return get_data(t);
    });
    optimizer_->set_steps(ckpt.state().step);
  } else {
    ckpt.load_optimizer(*optimizer_, model_);
  }
  loader_->seek(ckpt.state().loader_epoch, ckpt.state().loader_cursor);
  staged_ = false;
  staged_error_ = nullptr;
}

// ---- evaluation -----------------------------------------------------------------------------------------

LmEvaluator::LmEvaluator(Context& ctx, Transformer& model, const std::vector<std::string>& shards,
                         int64_t batch, int64_t seq_len, int64_t windows)
    : T_(seq_len) {
  RT_CHECK(!shards.empty(), "evaluate: no validation shards");
  RT_CHECK(batch >= 1, "evaluate: batch must be >= 1, got ", batch);
  BatchLoaderOptions lo;
  lo.batch = 1;
  lo.seq_len = seq_len;
  lo.shuffle = false;
  const int64_t all = BatchLoader(shards, lo).windows();
  windows_ = windows > 0 ? std::min(windows, all) : all;
  B_ = std::max<int64_t>(1, std::min(batch, windows_));
  lo.batch = B_;
  loader_ = std::make_unique<BatchLoader>(shards, lo);
  tokens_ = ctx.input(DType::I32, {B_, T_}, "eval_tokens");
  targets_ = ctx.input(DType::I32, {B_, T_}, "eval_targets");
  loss_ = lm_cross_entropy(ctx, model, tokens_, targets_).loss;  // mean over the targets not -100
  loss_->flags |= kOutput;
  graph_ = std::make_unique<Graph>(ctx);
  graph_->forward(loss_);
}

double LmEvaluator::run() {
  loader_->seek(0, 0);
  double sum = 0;
  std::vector<int32_t> x(size_t(B_ * T_)), y(size_t(B_ * T_));
  std::vector<int64_t> labels(size_t(B_ * T_));
  for (int64_t done = 0; done < windows_; done += B_) {
    loader_->next(x.data(), y.data());
    // The last batch may hold windows past the ones that count: their targets are ignored.
    const int64_t rows = std::min(B_, windows_ - done);
    for (int64_t i = 0; i < B_ * T_; ++i) labels[size_t(i)] = i < rows * T_ ? y[size_t(i)] : -100;
    set_data_int(tokens_, std::vector<int64_t>(x.begin(), x.end()));
    set_data_int(targets_, labels);
    graph_->compute();
    sum += double(get_data(loss_)[0]) * double(rows * T_);
  }
  return sum / double(windows_ * T_);
}

}  // namespace retort
