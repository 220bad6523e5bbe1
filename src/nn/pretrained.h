// Language models from the files people already have: a GGUF file (llama.cpp's format, quantized or not), a
// Hugging Face model directory (config.json, model.safetensors or its shards, tokenizer.json), or a retort
// checkpoint. Opening one reads its config and tokenizer and validates every tensor's name, type and shape
// against the config before anything is allocated; load_into() then fills a Transformer of that config.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../io/tokenizer.h"
#include "lm.h"
#include "transformer.h"

namespace retort {

enum class ModelFormat { Gguf, HuggingFace, Retort };
const char* model_format_name(ModelFormat f);  // "gguf", "hf", "retort"

class PretrainedModel {
 public:
  // Opens path: a directory with config.json is a Hugging Face model, a file starting with "GGUF" a GGUF
  // file, anything else a retort checkpoint. Architectures: llama (Llama 2/3, SmolLM, TinyLlama), mistral and
  // qwen2 (q/k/v biases). Throws retort::Error naming the file and the key or tensor at fault: an
  // unsupported architecture or feature (rope scaling, partial rotary, biases elsewhere), a missing or
  // misshapen tensor, a tensor the model does not use, a tokenizer whose size does not match the vocabulary.
  static PretrainedModel open(const std::string& path);

  const std::string& path() const;
  ModelFormat format() const;
  // The architecture as the file names it ("llama", "qwen2", "retort").
  const std::string& architecture() const;
  // The model's name from its metadata when it has one, else the file name.
  const std::string& name() const;
  // The config from the file's metadata (compute dtype f32; set it before building the Transformer).
  const TransformerConfig& config() const;
  // The file's tokenizer; for a retort checkpoint the one it embeds (null when it has none: a byte-level
  // model, or a checkpoint from before tokenizers were embedded, whose metadata names its tokenizer).
  std::shared_ptr<const Tokenizer> tokenizer() const;
  // "gguf llama 'SmolLM2 135M' (layers=30 d_model=576 ...), Q4_1/Q8_0/F32 weights".
  std::string describe() const;

  // The checkpoint behind a retort-format model (its metadata names its tokenizer and shards); null
  // otherwise.
  const Checkpoint* checkpoint() const;

  // Copies (dequantizes, converts) every parameter into model, whose config must equal config() in every
  // field but compute_dtype and context (else retort::Error naming both).
  void load_into(Transformer& model) const;

  struct Impl;

 private:
  std::shared_ptr<const Impl> impl_;
};

// A parameter's tensor name in GGUF files ("layer3.wq" -> "blk.3.attn_q.weight") and in Hugging Face files
// ("model.layers.3.self_attn.q_proj.weight"), for a name transformer_parameters() gives.
std::string gguf_tensor_name(const std::string& retort_name);
std::string hf_tensor_name(const std::string& retort_name);

// A model ready to run, from any file PretrainedModel::open takes: the one call a C++ app needs.
struct LoadedModel {
  std::unique_ptr<Transformer> model;          // parameters in the Context given to load_model
  std::shared_ptr<const Tokenizer> tokenizer;  // the file's (a checkpoint's embedded one); null: bytes/none
  std::string describe;                        // PretrainedModel::describe()
};
// Opens path (a retort checkpoint written by the programs or Python, a GGUF file or a Hugging Face
// directory), builds its Transformer in ctx with the config the file holds (matmuls in compute) and loads
// the weights. Throws retort::Error naming the file and the fault.
LoadedModel load_model(const std::string& path, Context& ctx, DType compute = DType::F32);

// Starts a student from its teacher's weights, as layer-dropping distillation does (DistilBERT's init): the
// embedding, the final norm and the head are copied, and student layer i takes teacher layer
// round(i · (L_t − 1) / (L_s − 1)) — evenly spaced, the first and the last kept. The two must agree in
// everything but the number of layers (fewer or as many in the student) and the tying of the head (a tied
// teacher's embedding fills an untied student's head). Returns the teacher layer of each student layer.
// Throws retort::Error naming both configs otherwise.
std::vector<int64_t> init_from_teacher(Transformer& student, const Transformer& teacher);

}  // namespace retort
