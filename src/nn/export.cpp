#include "export.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <set>

#include "../core/context.h"
#include "../core/cpu_backend.h"
#include "../core/error.h"
#include "../io/file.h"
#include "../io/gguf_writer.h"
#include "../io/safetensors.h"
#include "pretrained.h"

namespace retort {

namespace fs = std::filesystem;

namespace {

// llama.cpp's names for retort's pre-tokenizers (its "gpt2" is spelled "gpt-2"; "default" is another regex).
const char* gguf_pre_name(PreTokenizer pre) {
  switch (pre) {
    case PreTokenizer::Gpt2:
      return "gpt-2";
    case PreTokenizer::Smollm:
      return "smollm";
    case PreTokenizer::Llama3:
      return "llama-bpe";
    case PreTokenizer::Qwen2:
      return "qwen2";
  }
  return "?";
}

// llama.cpp's LLAMA_FTYPE of a file whose matrices are all of one type.
uint32_t gguf_file_type(QuantType t) {
  switch (t) {
    case QuantType::F32:
      return 0;
    case QuantType::F16:
      return 1;
    case QuantType::Q8_0:
      return 7;
    default:
      return 32;  // BF16
  }
}

// Each parameter's shape as the config implies it (Tensor::shape() drops outer dims of 1).
std::map<std::string, Shape> param_shapes(const TransformerConfig& c) {
  std::map<std::string, Shape> m;
  for (const ParamSpec& s : transformer_parameters(c)) m[s.name] = s.shape;
  return m;
}

// HF stores q and k for rotate-half RoPE: row (head, i, half) of retort's adjacent pairs moves to
// (head, half, i). cols is the row length (1 for a bias).
void pairs_to_rotate_half(std::vector<float>& w, int64_t heads, int64_t hd, int64_t cols) {
  std::vector<float> tmp(size_t(hd * cols));
  for (int64_t h = 0; h < heads; ++h) {
    float* head = w.data() + h * hd * cols;
    for (int64_t i = 0; i < hd / 2; ++i)
      for (int64_t half = 0; half < 2; ++half)
        std::copy(head + (2 * i + half) * cols, head + (2 * i + half + 1) * cols,
                  tmp.begin() + (half * hd / 2 + i) * cols);
    std::copy(tmp.begin(), tmp.end(), head);
  }
}

// The heads of a q or k weight or bias (whose rows RoPE rotates), 0 for any other parameter.
int64_t qk_heads(const TransformerConfig& c, const std::string& name) {
  if (name.ends_with(".wq") || name.ends_with(".bq")) return c.heads;
  if (name.ends_with(".wk") || name.ends_with(".bk")) return c.kv_heads;
  return 0;
}

std::string float_text(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", double(v));
  std::string s = buf;
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // a JSON float, not an integer
  return s;
}

// The model's config resolved, and the checks every export makes.
TransformerConfig export_config(const Transformer& model, const std::string& path) {
  const TransformerConfig c = model.config().resolved();
  for (const Tensor* p : model.parameters())
    RT_CHECK(p->dtype == DType::F32, "export ", path, ": parameter ", p->name, " is ", dtype_name(p->dtype),
             ", expected f32");
  return c;
}

}  // namespace

Tokenizer byte_tokenizer() {
  TokenizerSpec spec;
  spec.source = "byte-level vocabulary";
  for (int b = 0; b < 256; ++b) {
    const std::string bytes(1, char(b));
    std::string text;
    const auto alphabet = Tokenizer::gpt2_byte_to_unicode();
    const uint32_t cp = alphabet[size_t(b)];
    // UTF-8 of a code point below U+0800 (GPT-2's alphabet stops at U+0143).
    if (cp < 0x80) {
      text += char(cp);
    } else {
      text += char(0xC0 | (cp >> 6));
      text += char(0x80 | (cp & 0x3F));
    }
    spec.tokens.push_back(text);
  }
  spec.pre = PreTokenizer::Gpt2;
  return Tokenizer::from_spec(spec);
}

TokenizerSpec export_vocabulary(const Tokenizer* tok, int64_t vocab, const std::string& where) {
  // Without a tokenizer only a model of the 256 bytes is byte-level; any other is missing its vocabulary.
  RT_CHECK(
      tok || vocab == 256, "export ", where, ": the model has a vocabulary of ", vocab,
      " but no tokenizer (only a 256-token model is byte-level): give the tokenizer it was trained with");
  TokenizerSpec spec = tok ? tok->to_spec() : byte_tokenizer().to_spec();
  spec.source = where;
  RT_CHECK(int64_t(spec.tokens.size()) <= vocab, "export ", where, ": the tokenizer has ", spec.tokens.size(),
           " tokens, more than the model's vocabulary of ", vocab);
  if (spec.types.empty()) spec.types.assign(spec.tokens.size(), int32_t(TokenType::Normal));
  std::map<std::string, size_t> first;
  for (size_t id = 0; id < spec.tokens.size(); ++id) {
    auto [it, fresh] = first.emplace(spec.tokens[id], id);
    RT_CHECK(fresh, "export ", where, ": tokens ", it->second, " and ", id, " are both spelled \"",
             spec.tokens[id], "\"; GGUF and tokenizer.json need unique token strings");
  }
  for (int64_t id = int64_t(spec.tokens.size()); id < vocab; ++id) {
    const std::string pad = "[PAD" + std::to_string(id) + "]";
    RT_CHECK(!first.count(pad), "export ", where, ": the padding token \"", pad, "\" is already token ",
             first[pad], "; GGUF and tokenizer.json need unique token strings");
    spec.tokens.push_back(pad);
    spec.types.push_back(int32_t(TokenType::Unused));
  }
  return spec;
}

void export_gguf(const Transformer& model, const Tokenizer* tok, const std::string& path,
                 const ExportOptions& o) {
  const TransformerConfig c = export_config(model, path);
  const QuantType dt = o.dtype;
  RT_CHECK(dt == QuantType::F32 || dt == QuantType::F16 || dt == QuantType::BF16 || dt == QuantType::Q8_0,
           "export ", path, ": GGUF weights can be F32, F16, BF16 or Q8_0, not ", quant_name(dt));
  const TokenizerSpec spec = export_vocabulary(tok, c.vocab, path);
  // llama.cpp derives ignore_merges from the pre-tokenizer, so a vocabulary where they disagree cannot be
  // said in GGUF.
  RT_CHECK(spec.ignore_merges == (spec.pre == PreTokenizer::Llama3), "export ", path,
           ": a tokenizer with pre-tokenizer ", pre_tokenizer_name(spec.pre), " and ignore_merges ",
           spec.ignore_merges ? "on" : "off",
           " cannot be expressed in GGUF (llama.cpp ignores merges exactly ", "for llama-bpe)");
  const std::map<std::string, Shape> shapes = param_shapes(c);
  for (const auto& [name, shape] : shapes)
    if (shape.size() == 2 && shape.back() % quant_traits(dt).block_elems != 0)
      RT_FAIL("export ", path, ": ", quant_name(dt), " stores rows in blocks of ",
              quant_traits(dt).block_elems, " but ", name, " has rows of ", shape.back(), " (", c.describe(),
              "); use f16, bf16 or f32");

  const std::string arch = c.qkv_bias ? "qwen2" : "llama";
  const std::string a = arch + ".";
  GgufWriter w;
  using G = GgufWriter;
  w.set("general.architecture", G::string(arch));
  w.set("general.name", G::string(o.name));
  w.set("general.file_type", G::u32(gguf_file_type(dt)));
  w.set("general.quantization_version", G::u32(2));
  w.set(a + "vocab_size", G::u32(uint32_t(c.vocab)));
  w.set(a + "context_length", G::u32(uint32_t(c.context)));
  w.set(a + "embedding_length", G::u32(uint32_t(c.d_model)));
  w.set(a + "block_count", G::u32(uint32_t(c.layers)));
  w.set(a + "feed_forward_length", G::u32(uint32_t(c.d_ff)));
  w.set(a + "attention.head_count", G::u32(uint32_t(c.heads)));
  w.set(a + "attention.head_count_kv", G::u32(uint32_t(c.kv_heads)));
  w.set(a + "rope.dimension_count", G::u32(uint32_t(c.head_dim())));
  w.set(a + "rope.freq_base", G::f32(c.rope_theta));
  w.set(a + "attention.layer_norm_rms_epsilon", G::f32(c.norm_eps));
  w.set("tokenizer.ggml.model", G::string("gpt2"));
  w.set("tokenizer.ggml.pre", G::string(gguf_pre_name(spec.pre)));
  w.set("tokenizer.ggml.tokens", G::strings(spec.tokens));
  w.set("tokenizer.ggml.token_type", G::i32s(spec.types));
  w.set("tokenizer.ggml.merges", G::strings(spec.merges));
  if (spec.bos >= 0) w.set("tokenizer.ggml.bos_token_id", G::u32(uint32_t(spec.bos)));
  if (spec.eos >= 0) w.set("tokenizer.ggml.eos_token_id", G::u32(uint32_t(spec.eos)));
  w.set("tokenizer.ggml.add_bos_token", G::boolean(spec.add_bos));
  w.set("tokenizer.ggml.add_eos_token", G::boolean(false));

  for (const Tensor* p : model.parameters()) {
    const Shape& shape = shapes.at(p->name);
    std::vector<float> v = get_data(p);
    // llama.cpp runs qwen2 with NeoX RoPE: its q/k rows are stored in rotate-half order, as HF stores them.
    if (const int64_t heads = qk_heads(c, p->name); arch == "qwen2" && heads > 0)
      pairs_to_rotate_half(v, heads, c.head_dim(), shape.size() == 2 ? c.d_model : 1);
    w.add_tensor(gguf_tensor_name(p->name), shape.size() == 2 ? dt : QuantType::F32, shape, std::move(v));
  }
  w.write(path);
}

namespace {

std::string hf_config_json(const TransformerConfig& c, const TokenizerSpec& spec, const char* torch_dtype) {
  const bool qwen = c.qkv_bias;
  auto id = [](int32_t v) { return v < 0 ? std::string("null") : std::to_string(v); };
  std::string s = "{\n";
  s += std::string("  \"architectures\": [\"") + (qwen ? "Qwen2ForCausalLM" : "LlamaForCausalLM") + "\"],\n";
  s += std::string("  \"model_type\": \"") + (qwen ? "qwen2" : "llama") + "\",\n";
  s += "  \"vocab_size\": " + std::to_string(c.vocab) + ",\n";
  s += "  \"hidden_size\": " + std::to_string(c.d_model) + ",\n";
  s += "  \"intermediate_size\": " + std::to_string(c.d_ff) + ",\n";
  s += "  \"num_hidden_layers\": " + std::to_string(c.layers) + ",\n";
  s += "  \"num_attention_heads\": " + std::to_string(c.heads) + ",\n";
  s += "  \"num_key_value_heads\": " + std::to_string(c.kv_heads) + ",\n";
  s += "  \"head_dim\": " + std::to_string(c.head_dim()) + ",\n";
  s += "  \"max_position_embeddings\": " + std::to_string(c.context) + ",\n";
  s += "  \"rms_norm_eps\": " + float_text(c.norm_eps) + ",\n";
  s += "  \"rope_theta\": " + float_text(c.rope_theta) + ",\n";
  s += "  \"rope_scaling\": null,\n";
  s += "  \"hidden_act\": \"silu\",\n";
  if (!qwen) s += "  \"attention_bias\": false,\n  \"mlp_bias\": false,\n";
  if (qwen) s += "  \"use_sliding_window\": false,\n";
  s += "  \"attention_dropout\": 0.0,\n";
  s += "  \"initializer_range\": 0.02,\n";
  s += std::string("  \"tie_word_embeddings\": ") + (c.tie_embeddings ? "true" : "false") + ",\n";
  s += "  \"bos_token_id\": " + id(spec.bos) + ",\n";
  s += "  \"eos_token_id\": " + id(spec.eos) + ",\n";
  s += std::string("  \"torch_dtype\": \"") + torch_dtype + "\",\n";
  s += "  \"use_cache\": true\n}\n";
  return s;
}

std::string hf_generation_config_json(const TokenizerSpec& spec) {
  auto id = [](int32_t v) { return v < 0 ? std::string("null") : std::to_string(v); };
  return "{\n  \"bos_token_id\": " + id(spec.bos) + ",\n  \"eos_token_id\": " + id(spec.eos) +
         ",\n  \"do_sample\": true,\n  \"temperature\": 0.8\n}\n";
}

// A staging directory beside dir, removed (with what is in it) unless released.
class StagingDir {
 public:
  explicit StagingDir(const fs::path& dir) {
    path_ = dir.parent_path() / (dir.filename().string() + ".tmp." + std::to_string(::getpid()));
    std::error_code ec;
    fs::remove_all(path_, ec);  // a previous attempt of this pid
    if (!fs::create_directories(path_, ec) || ec)
      io::file_error(dir.string(), "cannot create the staging directory " + path_.string() + ": " +
                                       (ec ? ec.message() : std::string("it exists")));
  }
  ~StagingDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

}  // namespace

void export_hf(const Transformer& model, const Tokenizer* tok, const std::string& dir,
               const ExportOptions& o) {
  const TransformerConfig c = export_config(model, dir);
  const QuantType qt = o.dtype;
  RT_CHECK(qt == QuantType::F32 || qt == QuantType::F16 || qt == QuantType::BF16, "export ", dir,
           ": Hugging Face weights can be F32, F16 or BF16, not ", quant_name(qt));
  const DType dt = qt == QuantType::F32 ? DType::F32 : qt == QuantType::F16 ? DType::F16 : DType::BF16;
  const char* torch_dtype = dt == DType::F32 ? "float32" : dt == DType::F16 ? "float16" : "bfloat16";
  const TokenizerSpec spec = export_vocabulary(tok, c.vocab, dir);
  const std::string tokenizer_json = hf_tokenizer_json(spec);
  const std::string tokenizer_config = hf_tokenizer_config_json(spec, c.context);

  fs::path out(dir);
  if (out.filename().empty()) out = out.parent_path();  // "dir/" names dir
  std::error_code ec;
  RT_CHECK(!fs::exists(out, ec) || fs::is_directory(out, ec), "export ", dir,
           ": exists and is not a directory (a Hugging Face export is a directory)");
  if (!out.parent_path().empty() && !fs::exists(out.parent_path(), ec)) {
    fs::create_directories(out.parent_path(), ec);
    if (ec) io::file_error(dir, "cannot create its parent directory: " + ec.message());
  }
  StagingDir stage(out);

  // The weights in HF's names and layout, converted to dt on the host.
  Context host(default_cpu_backend());
  std::vector<std::pair<std::string, const Tensor*>> tensors;
  const std::map<std::string, Shape> shapes = param_shapes(c);
  for (const Tensor* p : model.parameters()) {
    const Shape& shape = shapes.at(p->name);
    std::vector<float> v = get_data(p);
    if (const int64_t heads = qk_heads(c, p->name); heads > 0)
      pairs_to_rotate_half(v, heads, c.head_dim(), shape.size() == 2 ? c.d_model : 1);
    Tensor* t = host.tensor(dt, shape, hf_tensor_name(p->name));
    set_data(t, v);
    tensors.emplace_back(t->name, t);
  }
  const fs::path s = stage.path();
  save_safetensors((s / "model.safetensors").string(), tensors, {{"format", "pt"}});
  auto text = [&](const char* name, const std::string& body) {
    io::write_file_atomic((s / name).string(), body.data(), body.size());
  };
  text("config.json", hf_config_json(c, spec, torch_dtype));
  text("generation_config.json", hf_generation_config_json(spec));
  text("tokenizer.json", tokenizer_json);
  text("tokenizer_config.json", tokenizer_config);

  // Everything is written: move the files in, each rename atomic.
  fs::create_directories(out, ec);
  if (ec) io::file_error(dir, "cannot create the directory: " + ec.message());
  for (const char* name : {"model.safetensors", "tokenizer.json", "tokenizer_config.json",
                           "generation_config.json", "config.json"}) {
    fs::rename(s / name, out / name, ec);
    if (ec) io::file_error((out / name).string(), "cannot move the exported file in: " + ec.message());
  }
}

}  // namespace retort
