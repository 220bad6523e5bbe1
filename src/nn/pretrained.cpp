#include "pretrained.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <set>

#include "../core/context.h"
#include "../core/error.h"
#include "../io/file.h"
#include "../io/gguf.h"
#include "../io/json.h"
#include "../io/safetensors.h"
#include "lm.h"

namespace retort {

namespace fs = std::filesystem;
using io::file_error;

const char* model_format_name(ModelFormat f) {
  switch (f) {
    case ModelFormat::Gguf:
      return "gguf";
    case ModelFormat::HuggingFace:
      return "hf";
    case ModelFormat::Retort:
      return "retort";
  }
  return "?";
}

// One parameter's source: where it is in the file (for messages) and its stored blocks, which the backend
// holding the parameter decodes (on the GPU for a model that lives there), or, when the values need a
// host-side transform first, a function producing them in f32.
struct TensorSource {
  std::string file_name;
  Shape shape;  // as stored, outermost first
  QuantType type = QuantType::F32;
  const uint8_t* raw = nullptr;      // whole blocks of `type`, or null
  std::function<void(float*)> read;  // when raw is null: the elements, outermost-first row-major order
};

struct PretrainedModel::Impl {
  std::string path, arch, name;
  ModelFormat format = ModelFormat::Retort;
  TransformerConfig config;
  std::shared_ptr<const Tokenizer> tokenizer;
  std::string weights;                         // "Q4_1/Q8_0/F32", "bf16", "f32"
  std::map<std::string, TensorSource> params;  // by retort parameter name
  std::shared_ptr<const void> keep;            // the open file(s) the readers point into
  std::unique_ptr<Checkpoint> checkpoint;      // the retort format loads through Checkpoint
};

namespace {

std::string shape_text(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

bool starts_with_magic(const std::string& path, std::string_view magic) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return false;
  char buf[8] = {};
  const size_t n = std::fread(buf, 1, magic.size(), f);
  std::fclose(f);
  return n == magic.size() && std::string_view(buf, n) == magic;
}

// Checks that the file's tensors are exactly the parameters of cfg with their shapes: every retort name is
// present once, nothing is left over.
void check_tensor_set(const std::string& path, const TransformerConfig& cfg,
                      const std::map<std::string, TensorSource>& params) {
  std::set<std::string> want;
  for (const ParamSpec& s : transformer_parameters(cfg)) {
    want.insert(s.name);
    auto it = params.find(s.name);
    if (it == params.end())
      file_error(path, "no tensor for parameter " + s.name + " (shape " + shape_text(s.shape) +
                           ") of a model with " + cfg.describe());
    if (it->second.shape != s.shape)
      file_error(path, "tensor " + it->second.file_name + " has shape " + shape_text(it->second.shape) +
                           ", expected " + shape_text(s.shape) + " for " + cfg.describe());
  }
  for (const auto& [name, src] : params)
    if (!want.count(name))
      file_error(path, "tensor " + src.file_name + " is not a parameter of a model with " + cfg.describe());
}

std::string join_types(const std::set<std::string>& types) {
  std::string s;
  for (const std::string& t : types) s += (s.empty() ? "" : "/") + t;
  return s;
}

// ---- GGUF -------------------------------------------------------------------------------------------------

// The tokenizer in a GGUF's tokenizer.ggml.* keys (byte-level BPE only: "gpt2" is how GGUF names it).
Tokenizer gguf_tokenizer(const GgufFile& g) {
  const std::string model = g.get_string("tokenizer.ggml.model");
  if (model != "gpt2")
    file_error(g.path(),
               "tokenizer.ggml.model is '" + model +
                   "': retort reads byte-level BPE vocabularies ('gpt2'), not SentencePiece ('llama') "
                   "or others");
  TokenizerSpec spec;
  spec.source = g.path();
  spec.tokens = g.get_string_array("tokenizer.ggml.tokens");
  if (g.has("tokenizer.ggml.token_type"))
    for (int64_t t : g.get_int_array("tokenizer.ggml.token_type")) spec.types.push_back(int32_t(t));
  if (!spec.types.empty() && spec.types.size() != spec.tokens.size())
    file_error(g.path(), "tokenizer.ggml.token_type has " + std::to_string(spec.types.size()) +
                             " entries for " + std::to_string(spec.tokens.size()) + " tokens");
  if (g.has("tokenizer.ggml.merges")) spec.merges = g.get_string_array("tokenizer.ggml.merges");
  try {
    spec.pre = parse_pre_tokenizer(g.get_string("tokenizer.ggml.pre", "default"));
  } catch (const Error& e) {
    file_error(g.path(), std::string("tokenizer.ggml.pre: ") + e.what());
  }
  spec.ignore_merges = spec.pre == PreTokenizer::Llama3;
  auto id = [&](const char* key) {
    if (!g.has(key)) return int32_t(-1);
    const uint64_t v = g.get_uint(key);
    if (v >= spec.tokens.size())
      file_error(g.path(), std::string(key) + " is " + std::to_string(v) + ", outside the " +
                               std::to_string(spec.tokens.size()) + " tokens");
    return int32_t(v);
  };
  spec.bos = id("tokenizer.ggml.bos_token_id");
  spec.eos = id("tokenizer.ggml.eos_token_id");
  spec.add_bos = g.get_bool("tokenizer.ggml.add_bos_token", false);
  return Tokenizer::from_spec(spec);
}

// GGUF's tensor names for a retort parameter name ("layer3.wq" -> "blk.3.attn_q.weight").
std::string gguf_name(const std::string& retort_name) {
  static const std::map<std::string, std::string> top = {
      {"tok_emb", "token_embd.weight"}, {"final_norm", "output_norm.weight"}, {"lm_head", "output.weight"}};
  static const std::map<std::string, std::string> block = {{"attn_norm", "attn_norm.weight"},
                                                           {"wq", "attn_q.weight"},
                                                           {"wk", "attn_k.weight"},
                                                           {"wv", "attn_v.weight"},
                                                           {"bq", "attn_q.bias"},
                                                           {"bk", "attn_k.bias"},
                                                           {"bv", "attn_v.bias"},
                                                           {"wo", "attn_output.weight"},
                                                           {"mlp_norm", "ffn_norm.weight"},
                                                           {"w_gate", "ffn_gate.weight"},
                                                           {"w_up", "ffn_up.weight"},
                                                           {"w_down", "ffn_down.weight"}};
  if (auto it = top.find(retort_name); it != top.end()) return it->second;
  const size_t dot = retort_name.find('.');
  const std::string layer = retort_name.substr(5, dot - 5);  // "layer<N>."
  return "blk." + layer + "." + block.at(retort_name.substr(dot + 1));
}

void rotate_half_to_pairs(float* w, int64_t heads, int64_t hd, int64_t cols);

void open_gguf(PretrainedModel::Impl& m) {
  auto file = std::make_shared<GgufFile>(m.path);
  const GgufFile& g = *file;
  m.keep = file;
  m.format = ModelFormat::Gguf;
  m.arch = g.get_string("general.architecture");
  if (m.arch != "llama" && m.arch != "qwen2")
    file_error(m.path, "architecture '" + m.arch + "' is not supported (retort loads llama and qwen2)");
  m.name = g.get_string("general.name", fs::path(m.path).filename().string());
  const std::string a = m.arch + ".";
  TransformerConfig& c = m.config;
  c.layers = int64_t(g.get_uint(a + "block_count"));
  c.d_model = int64_t(g.get_uint(a + "embedding_length"));
  c.d_ff = int64_t(g.get_uint(a + "feed_forward_length"));
  c.heads = int64_t(g.get_uint(a + "attention.head_count"));
  c.kv_heads = int64_t(g.get_uint(a + "attention.head_count_kv", uint64_t(c.heads)));
  c.context = int64_t(g.get_uint(a + "context_length"));
  c.norm_eps = float(g.get_float(a + "attention.layer_norm_rms_epsilon"));
  c.rope_theta = float(g.get_float(a + "rope.freq_base", 10000.0));
  if (c.heads > 0 && c.d_model % c.heads == 0) {
    const uint64_t hd = uint64_t(c.d_model / c.heads);
    if (g.get_uint(a + "rope.dimension_count", hd) != hd)
      file_error(m.path, a + "rope.dimension_count is " +
                             std::to_string(g.get_uint(a + "rope.dimension_count")) +
                             ": retort rotates the whole head (" + std::to_string(hd) +
                             "); partial RoPE is not supported");
    if (g.get_uint(a + "attention.key_length", hd) != hd ||
        g.get_uint(a + "attention.value_length", hd) != hd)
      file_error(m.path, "a head size other than embedding_length / head_count is not supported");
  }
  const std::string scaling = g.get_string(a + "rope.scaling.type", "none");
  if (scaling != "none" || g.find_tensor("rope_freqs.weight"))
    file_error(m.path, "RoPE scaling ('" + (scaling == "none" ? std::string("rope_freqs.weight") : scaling) +
                           "') is not supported");
  c.qkv_bias = m.arch == "qwen2";
  c.tie_embeddings = g.find_tensor("output.weight") == nullptr;

  // The tokenizer first: it gives the vocabulary when the metadata has no vocab_size.
  m.tokenizer = std::make_shared<const Tokenizer>(gguf_tokenizer(g));
  c.vocab = int64_t(g.get_uint(a + "vocab_size", uint64_t(m.tokenizer->vocab_size())));
  if (c.vocab != m.tokenizer->vocab_size())
    file_error(m.path, a + "vocab_size is " + std::to_string(c.vocab) + " but the tokenizer has " +
                           std::to_string(m.tokenizer->vocab_size()) + " tokens");
  try {
    c = c.resolved();
  } catch (const Error& e) {
    file_error(m.path, std::string("model config: ") + e.what());
  }

  // Every layer is several tensors: a layer count the file cannot hold is refused before it sizes anything.
  if (c.layers > int64_t(g.tensors().size()))
    file_error(m.path, a + "block_count is " + std::to_string(c.layers) + " but the file holds " +
                           std::to_string(g.tensors().size()) + " tensors");
  std::map<std::string, std::string> by_gguf;  // GGUF name -> retort name
  for (const ParamSpec& s : transformer_parameters(c)) by_gguf[gguf_name(s.name)] = s.name;
  std::set<std::string> types;
  for (const GgufFile::TensorInfo& t : g.tensors()) {
    auto it = by_gguf.find(t.name);
    if (it == by_gguf.end())
      file_error(m.path,
                 "tensor " + t.name + " is not a parameter of a " + m.arch + " model with " + c.describe());
    if (!quant_traits(t.type).dequantizable)
      file_error(m.path,
                 "tensor " + t.name + " has type " + quant_name(t.type) + ", which retort cannot dequantize");
    types.insert(quant_name(t.type));
    const std::string& rn = it->second;
    const uint8_t* raw = file->tensor_bytes(t).data();
    const bool is_q = rn.ends_with(".wq") || rn.ends_with(".bq"),
               is_k = rn.ends_with(".wk") || rn.ends_with(".bk");
    if (m.arch == "qwen2" && (is_q || is_k)) {
      // llama.cpp runs qwen2 with NeoX RoPE, so its q/k rows are in HF's rotate-half order, not llama's
      // pairs.
      const int64_t heads = is_q ? c.heads : c.kv_heads, hd = c.head_dim();
      const int64_t cols = rn.ends_with(".bq") || rn.ends_with(".bk") ? 1 : c.d_model;
      const GgufFile::TensorInfo* ti = &t;
      m.params[rn] = {t.name, t.shape, QuantType::F32, nullptr, [file, ti, heads, hd, cols](float* out) {
                        file->dequantize(*ti, out);
                        rotate_half_to_pairs(out, heads, hd, cols);
                      }};
      continue;
    }
    m.params[rn] = {t.name, t.shape, t.type, raw, nullptr};
  }
  check_tensor_set(m.path, c, m.params);
  m.weights = join_types(types);
}

// ---- Hugging Face -----------------------------------------------------------------------------------------

int64_t json_int(const io::Json& cfg, const std::string& key, const std::string& path,
                 int64_t fallback = -1) {
  const io::Json* v = cfg.find(key);
  if (!v || v->is(io::Json::Kind::Null)) {
    if (fallback >= 0) return fallback;
    file_error(path, "\"" + key + "\" is missing");
  }
  if (!v->is(io::Json::Kind::Int)) file_error(path, "\"" + key + "\" must be an integer");
  return v->integer;
}

double json_num(const io::Json& cfg, const std::string& key, const std::string& path, double fallback) {
  const io::Json* v = cfg.find(key);
  if (!v || v->is(io::Json::Kind::Null)) return fallback;
  if (v->is(io::Json::Kind::Int)) return double(v->integer);
  if (!v->is(io::Json::Kind::Float)) file_error(path, "\"" + key + "\" must be a number");
  return v->number;
}

bool json_bool(const io::Json& cfg, const std::string& key, const std::string& path, bool fallback) {
  const io::Json* v = cfg.find(key);
  if (!v || v->is(io::Json::Kind::Null)) return fallback;
  if (!v->is(io::Json::Kind::Bool)) file_error(path, "\"" + key + "\" must be true or false");
  return v->boolean;
}

// HF's name for a retort parameter name ("layer3.wq" -> "model.layers.3.self_attn.q_proj.weight").
std::string hf_name(const std::string& retort_name) {
  static const std::map<std::string, std::string> top = {{"tok_emb", "model.embed_tokens.weight"},
                                                         {"final_norm", "model.norm.weight"},
                                                         {"lm_head", "lm_head.weight"}};
  static const std::map<std::string, std::string> block = {{"attn_norm", "input_layernorm.weight"},
                                                           {"wq", "self_attn.q_proj.weight"},
                                                           {"wk", "self_attn.k_proj.weight"},
                                                           {"wv", "self_attn.v_proj.weight"},
                                                           {"bq", "self_attn.q_proj.bias"},
                                                           {"bk", "self_attn.k_proj.bias"},
                                                           {"bv", "self_attn.v_proj.bias"},
                                                           {"wo", "self_attn.o_proj.weight"},
                                                           {"mlp_norm", "post_attention_layernorm.weight"},
                                                           {"w_gate", "mlp.gate_proj.weight"},
                                                           {"w_up", "mlp.up_proj.weight"},
                                                           {"w_down", "mlp.down_proj.weight"}};
  if (auto it = top.find(retort_name); it != top.end()) return it->second;
  const size_t dot = retort_name.find('.');
  return "model.layers." + retort_name.substr(5, dot - 5) + "." + block.at(retort_name.substr(dot + 1));
}

// HF stores q and k for rotate-half RoPE (element i of a head pairs with i + hd/2); retort and GGUF pair
// adjacent elements (2i, 2i + 1). Row (head, half, i) moves to (head, i, half); cols is 1 for a bias.
void rotate_half_to_pairs(float* w, int64_t heads, int64_t hd, int64_t cols) {
  std::vector<float> tmp(size_t(hd * cols));
  for (int64_t h = 0; h < heads; ++h) {
    float* head = w + h * hd * cols;
    for (int64_t half = 0; half < 2; ++half)
      for (int64_t i = 0; i < hd / 2; ++i)
        std::memcpy(&tmp[size_t((2 * i + half) * cols)], head + (half * hd / 2 + i) * cols,
                    size_t(cols) * sizeof(float));
    std::memcpy(head, tmp.data(), tmp.size() * sizeof(float));
  }
}

void open_hf(PretrainedModel::Impl& m) {
  m.format = ModelFormat::HuggingFace;
  const std::string cfg_path = (fs::path(m.path) / "config.json").string();
  const io::Json cfg = io::parse_json(io::read_text_file(cfg_path), cfg_path);
  if (!cfg.is(io::Json::Kind::Object)) file_error(cfg_path, "expected a JSON object");
  const io::Json* mt = cfg.find("model_type");
  if (!mt || !mt->is(io::Json::Kind::String)) file_error(cfg_path, "\"model_type\" is missing");
  m.arch = mt->string;
  if (m.arch != "llama" && m.arch != "mistral" && m.arch != "qwen2")
    file_error(cfg_path,
               "model_type '" + m.arch + "' is not supported (retort loads llama, mistral and qwen2)");
  m.name = fs::path(m.path).filename().string();
  TransformerConfig& c = m.config;
  c.vocab = json_int(cfg, "vocab_size", cfg_path);
  c.d_model = json_int(cfg, "hidden_size", cfg_path);
  c.d_ff = json_int(cfg, "intermediate_size", cfg_path);
  c.layers = json_int(cfg, "num_hidden_layers", cfg_path);
  c.heads = json_int(cfg, "num_attention_heads", cfg_path);
  c.kv_heads = json_int(cfg, "num_key_value_heads", cfg_path, c.heads);
  c.context = json_int(cfg, "max_position_embeddings", cfg_path);
  c.norm_eps = float(json_num(cfg, "rms_norm_eps", cfg_path, 1e-6));
  c.rope_theta = float(json_num(cfg, "rope_theta", cfg_path, 10000.0));
  c.qkv_bias = m.arch == "qwen2";
  if (const io::Json* rs = cfg.find("rope_scaling"); rs && !rs->is(io::Json::Kind::Null))
    file_error(cfg_path, "\"rope_scaling\" is set: RoPE scaling is not supported");
  if (json_bool(cfg, "attention_bias", cfg_path, false) && m.arch != "qwen2")
    file_error(cfg_path, "\"attention_bias\" is true: biases on the output projection are not supported");
  if (json_bool(cfg, "mlp_bias", cfg_path, false))
    file_error(cfg_path, "\"mlp_bias\" is true: not supported");
  if (c.heads > 0 && c.d_model % c.heads == 0 &&
      json_int(cfg, "head_dim", cfg_path, c.d_model / c.heads) != c.d_model / c.heads)
    file_error(cfg_path, "\"head_dim\" other than hidden_size / num_attention_heads is not supported");
  if (const int64_t sw = json_int(cfg, "sliding_window", cfg_path, 0);
      sw > 0 && json_bool(cfg, "use_sliding_window", cfg_path, m.arch == "mistral"))
    c.context = std::min(c.context, sw);  // within the window, sliding-window attention is plain attention
  // The tensors: one file, or shards listed by the index.
  std::map<std::string, std::string> where;  // HF tensor name -> file
  std::vector<std::string> files;
  const fs::path index = fs::path(m.path) / "model.safetensors.index.json";
  if (fs::exists(index)) {
    const io::Json ix = io::parse_json(io::read_text_file(index.string()), index.string());
    const io::Json* wm = ix.is(io::Json::Kind::Object) ? ix.find("weight_map") : nullptr;
    if (!wm || !wm->is(io::Json::Kind::Object)) file_error(index.string(), "\"weight_map\" is missing");
    for (size_t i = 0; i < wm->keys.size(); ++i) {
      const io::Json& f = wm->items[i];
      if (!f.is(io::Json::Kind::String) || f.string.find('/') != std::string::npos || f.string.empty())
        file_error(index.string(),
                   "weight_map[\"" + wm->keys[i] + "\"] must be a file name in the directory");
      where[wm->keys[i]] = f.string;
      if (std::find(files.begin(), files.end(), f.string) == files.end()) files.push_back(f.string);
    }
  } else {
    files.push_back("model.safetensors");
  }
  auto shards = std::make_shared<std::map<std::string, SafeTensors>>();
  for (const std::string& f : files) shards->emplace(f, SafeTensors((fs::path(m.path) / f).string()));
  m.keep = shards;

  // Without the key, the head is tied exactly when the files hold no lm_head.weight.
  bool has_head = false;
  for (const auto& [file, st] : *shards) has_head = has_head || st.has("lm_head.weight");
  c.tie_embeddings = json_bool(cfg, "tie_word_embeddings", cfg_path, !has_head);
  try {
    c = c.resolved();
  } catch (const Error& e) {
    file_error(cfg_path, std::string("model config: ") + e.what());
  }

  const std::string tok_path = (fs::path(m.path) / "tokenizer.json").string();
  m.tokenizer = std::make_shared<const Tokenizer>(Tokenizer::load_hf(tok_path));
  // Checkpoints pad the embedding past the tokenizer (Qwen2: 151936 rows, 151665 tokens); fewer is an error.
  if (m.tokenizer->vocab_size() > c.vocab)
    file_error(tok_path, "has " + std::to_string(m.tokenizer->vocab_size()) +
                             " tokens, more than the model's vocab_size " + std::to_string(c.vocab));

  size_t stored = 0;
  for (const auto& [file, st] : *shards) stored += st.names().size();
  if (c.layers > int64_t(stored))
    file_error(cfg_path, "\"num_hidden_layers\" is " + std::to_string(c.layers) + " but the files hold " +
                             std::to_string(stored) + " tensors");
  std::map<std::string, std::string> by_hf;
  for (const ParamSpec& s : transformer_parameters(c)) by_hf[hf_name(s.name)] = s.name;
  std::set<std::string> types;
  for (const auto& [file, st] : *shards) {
    for (const std::string& n : st.names()) {
      if (!where.empty() && where.count(n) && where[n] != file)
        file_error(st.path(), "holds " + n + ", which the index places in " + where[n]);
      // Buffers some exports carry that are not parameters.
      if (n.find("rotary_emb.inv_freq") != std::string::npos) continue;
      auto it = by_hf.find(n);
      if (it == by_hf.end())
        file_error(st.path(),
                   "tensor " + n + " is not a parameter of a " + m.arch + " model with " + c.describe());
      if (m.params.count(it->second)) file_error(st.path(), "tensor " + n + " appears in two files");
      const DType dt = st.dtype(n);
      if (!is_float(dt))
        file_error(st.path(), "tensor " + n + " is " + dtype_name(dt) + ", expected f32, bf16 or f16");
      types.insert(dtype_name(dt));
      const SafeTensors* sp = &st;
      const std::string& rn = it->second;
      const bool is_q = rn.ends_with(".wq") || rn.ends_with(".bq");
      const bool is_k = rn.ends_with(".wk") || rn.ends_with(".bk");
      const int64_t heads = is_q ? c.heads : c.kv_heads, hd = c.head_dim();
      const int64_t cols = rn.ends_with(".bq") || rn.ends_with(".bk") ? 1 : c.d_model;
      if (!is_q && !is_k) {
        const QuantType qt = dt == DType::BF16  ? QuantType::BF16
                             : dt == DType::F16 ? QuantType::F16
                                                : QuantType::F32;
        m.params[rn] = {n, st.shape(n), qt, sp->bytes(n).data(), nullptr};
        continue;
      }
      m.params[rn] = {n, st.shape(n), QuantType::F32, nullptr, [sp, n, dt, heads, hd, cols](float* out) {
                        const auto b = sp->bytes(n);
                        const int64_t count = int64_t(b.size() / dtype_size(dt));
                        for (int64_t i = 0; i < count; ++i) out[i] = load_f32(b.data(), dt, i);
                        rotate_half_to_pairs(out, heads, hd, cols);
                      }};
    }
  }
  check_tensor_set(m.path, c, m.params);
  m.weights = join_types(types);
}

}  // namespace

std::string gguf_tensor_name(const std::string& retort_name) {
  return gguf_name(retort_name);
}
std::string hf_tensor_name(const std::string& retort_name) {
  return hf_name(retort_name);
}

PretrainedModel PretrainedModel::open(const std::string& path) {
  auto m = std::make_shared<Impl>();
  m->path = path;
  if (fs::is_directory(path)) {
    if (!fs::exists(fs::path(path) / "config.json"))
      file_error(path, "a directory without config.json is not a Hugging Face model");
    open_hf(*m);
  } else if (starts_with_magic(path, "GGUF")) {
    open_gguf(*m);
  } else {
    m->checkpoint = std::make_unique<Checkpoint>(path);
    m->format = ModelFormat::Retort;
    m->arch = "retort";
    m->name = fs::path(path).filename().string();
    m->config = m->checkpoint->config();
    m->tokenizer = m->checkpoint->tokenizer();
    m->weights = "f32";
  }
  PretrainedModel p;
  p.impl_ = m;
  return p;
}

const std::string& PretrainedModel::path() const {
  return impl_->path;
}
ModelFormat PretrainedModel::format() const {
  return impl_->format;
}
const std::string& PretrainedModel::architecture() const {
  return impl_->arch;
}
const std::string& PretrainedModel::name() const {
  return impl_->name;
}
const TransformerConfig& PretrainedModel::config() const {
  return impl_->config;
}
std::shared_ptr<const Tokenizer> PretrainedModel::tokenizer() const {
  return impl_->tokenizer;
}
const Checkpoint* PretrainedModel::checkpoint() const {
  return impl_->checkpoint.get();
}

std::string PretrainedModel::describe() const {
  return std::string(model_format_name(impl_->format)) + " " + impl_->arch + " '" + impl_->name + "' (" +
         impl_->config.describe() + "), " + impl_->weights + " weights";
}

LoadedModel load_model(const std::string& path, Context& ctx, DType compute) {
  const PretrainedModel file = PretrainedModel::open(path);
  TransformerConfig c = file.config();
  c.compute_dtype = compute;
  LoadedModel m;
  m.model = std::make_unique<Transformer>(ctx, c, 0, false);
  file.load_into(*m.model);
  m.tokenizer = file.tokenizer();
  m.describe = file.describe();
  return m;
}

void PretrainedModel::load_into(Transformer& model) const {
  const Impl& m = *impl_;
  RT_CHECK(same_architecture(model.config(), m.config), "load model ", m.path, ": the model has ",
           model.config().describe(), ", the file ", m.config.describe());
  if (m.checkpoint) {
    m.checkpoint->load_model(model);
    return;
  }
  std::vector<float> buf;
  for (Tensor* p : model.parameters()) {
    auto it = m.params.find(p->name);
    RT_CHECK(it != m.params.end(), "load model ", m.path, ": no tensor for parameter ", p->name);
    const TensorSource& src = it->second;
    if (src.raw) {
      p->backend().dequantize_into(p, src.type, src.raw);
      continue;
    }
    buf.resize(size_t(p->nelements()));
    src.read(buf.data());
    set_data(p, buf);
  }
}

std::vector<int64_t> init_from_teacher(Transformer& student, const Transformer& teacher) {
  const TransformerConfig &s = student.config(), &t = teacher.config();
  RT_CHECK(s.vocab == t.vocab && s.d_model == t.d_model && s.heads == t.heads && s.kv_heads == t.kv_heads &&
               s.d_ff == t.d_ff && s.qkv_bias == t.qkv_bias && s.layers <= t.layers,
           "init_from_teacher: the student (", s.describe(), ") must have the teacher's (", t.describe(),
           ") vocabulary, widths and heads, and at most its layers");
  auto copy = [](Tensor* dst, const Tensor* src) { set_data(dst, get_data(src)); };
  std::vector<int64_t> map(size_t(s.layers));
  for (int64_t i = 0; i < s.layers; ++i) {
    map[size_t(i)] = s.layers == 1 ? 0 : (i * (t.layers - 1) + (s.layers - 1) / 2) / (s.layers - 1);
    const TransformerBlock &d = student.blocks()[size_t(i)], &f = teacher.blocks()[size_t(map[size_t(i)])];
    for (auto [dst, src] : {std::pair{d.attn_norm, f.attn_norm},
                            {d.wq, f.wq},
                            {d.wk, f.wk},
                            {d.wv, f.wv},
                            {d.wo, f.wo},
                            {d.mlp_norm, f.mlp_norm},
                            {d.w_gate, f.w_gate},
                            {d.w_up, f.w_up},
                            {d.w_down, f.w_down},
                            {d.bq, f.bq},
                            {d.bk, f.bk},
                            {d.bv, f.bv}})
      if (dst) copy(dst, src);
  }
  copy(student.embedding(), teacher.embedding());
  copy(student.final_norm(), teacher.final_norm());
  if (!s.tie_embeddings) copy(student.lm_head(), teacher.lm_head());
  return map;
}

}  // namespace retort
