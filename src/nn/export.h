// A trained model out to where people run models: a GGUF file for llama.cpp, or a Hugging Face directory
// (config.json, model.safetensors, tokenizer.json, tokenizer_config.json, generation_config.json). Both carry
// the tokenizer: the model's own (a pretrained teacher's, one retort trained), or for a byte-level model
// (no tokenizer) the 256 byte tokens with GPT-2's pre-tokenizer. Everything the target cannot express is
// refused before a byte is written, and a failed export leaves nothing at the output path.
#pragma once
#include <string>

#include "../core/quant.h"
#include "../io/tokenizer.h"
#include "transformer.h"

namespace retort {

struct ExportOptions {
  // The weights' type. GGUF: F32, F16, BF16 or Q8_0 for the matrices, the norms and biases F32 always.
  // Hugging Face: F32, F16 or BF16 for every tensor.
  QuantType dtype = QuantType::F16;
  std::string name = "retort student";  // GGUF's general.name
};

// The tokenizer a byte-level model's exports carry: ids 0..255 are the bytes, GPT-2's pre-tokenizer, no
// merges, no specials; it encodes any text to its bytes, as a byte-level model reads it.
Tokenizer byte_tokenizer();

// The vocabulary as written to a file for a model with `vocab` rows: tok's (null: byte_tokenizer()),
// padded with Unused tokens "[PAD<id>]" up to vocab. Throws retort::Error naming `where` when tok has more
// tokens than vocab, tok is null and vocab is not 256, or two tokens share a spelling (GGUF and
// tokenizer.json need unique token strings).
TokenizerSpec export_vocabulary(const Tokenizer* tok, int64_t vocab, const std::string& where);

// Writes model and its tokenizer as a GGUF file at path: architecture llama (qwen2 with q/k/v biases), the
// metadata llama.cpp needs, tensors under llama.cpp's names (retort's q/k layout is GGUF's). Throws
// retort::Error naming path when the model, its vocabulary or the dtype cannot be expressed (Q8_0 with an
// inner dim that is not a multiple of 32, an odd head size, ...) or the file cannot be written.
void export_gguf(const Transformer& model, const Tokenizer* tok, const std::string& path,
                 const ExportOptions& options = {});

// Writes model and its tokenizer as a Hugging Face directory at dir (made if missing; the five files are
// replaced, others left alone): LlamaForCausalLM (Qwen2ForCausalLM with q/k/v biases), q and k permuted to
// Hugging Face's rotate-half layout. The files are staged in a sibling temporary directory and moved in
// only when all are written. Throws retort::Error naming dir as export_gguf does.
void export_hf(const Transformer& model, const Tokenizer* tok, const std::string& dir,
               const ExportOptions& options = {});

}  // namespace retort
