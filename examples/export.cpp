// export: a model out to llama.cpp (GGUF) or to the Hugging Face world (a model directory).
#include <cstdio>
#include <filesystem>

#include "common.h"

using namespace ex;

namespace {

const char* kHelp = R"(export - write a model as a GGUF file (llama.cpp) or a Hugging Face directory.

Reads a checkpoint written by train or distill (or any model generate takes: a GGUF file, a Hugging Face
directory) with its tokenizer, and writes it where people run models:

  --format gguf  one file for llama.cpp and its front ends (architecture llama, or qwen2 for a model with
                 q/k/v biases), with the tokenizer in its tokenizer.ggml.* keys. --dtype sets the matrices'
                 type: f16 (default), bf16, f32 or q8_0; the norms stay f32.
  --format hf    a directory with config.json, model.safetensors (q and k in Hugging Face's rotate-half
                 layout), tokenizer.json, tokenizer_config.json and generation_config.json, for the
                 `transformers` library. --dtype f32 (default for hf), f16 or bf16.

The tokenizer is the model's: the teacher's for a student that shares it, the vocabulary retort trained
(--tokenizer bpe), or for a byte-level student the 256 bytes as tokens, with GPT-2's pre-tokenizer. A model
whose vocabulary has more rows than its tokenizer has tokens gets "[PAD<id>]" tokens. The output is written
atomically: a failure (a setting the format cannot hold, such as q8_0 with rows that are not a multiple of 32;
two tokens with one spelling; a place that cannot be written) leaves nothing at --out.

Exit status: 0 done, 1 failed, 2 a bad command line.

Usage: export --checkpoint PATH --format gguf|hf --out PATH [options]

  --checkpoint PATH   the model (a retort checkpoint, GGUF file or Hugging Face directory; --model is the same)
  --format F          gguf or hf (default: gguf when --out ends in .gguf, else required)
  --dtype D           f16, bf16, f32 or q8_0 (gguf only) (default: f16 for gguf, f32 for hf)
  --out PATH          the GGUF file, or the Hugging Face directory (made if missing)
  --name TEXT         the model's name in the GGUF metadata (default: --out's file name without .gguf)
  --prompt TEXT       the prompt in the llama.cpp command printed at the end (default "Once upon a time")
  --help              this text

Examples: export --checkpoint build/demo/student-distilled.safetensors --out student.gguf
          export --checkpoint build/demo/student-distilled.safetensors --format hf --dtype bf16 --out student-hf
)";

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

uint64_t bytes_at(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return fs::file_size(path, ec);
  uint64_t n = 0;
  for (const auto& e : fs::directory_iterator(path, ec))
    if (e.is_regular_file(ec)) n += e.file_size(ec);
  return n;
}

int run(Args& a, int argc, char** argv) {
  namespace fs = std::filesystem;
  std::string ckpt, format, dtype, out, name, prompt = "Once upon a time";
  a.add("--checkpoint", &ckpt), a.add("--model", &ckpt), a.add("--format", &format), a.add("--dtype", &dtype);
  a.add("--out", &out), a.add("--name", &name), a.add("--prompt", &prompt);
  a.parse(argc, argv);
  a.check(!ckpt.empty(), "--checkpoint is required");
  a.check(!out.empty(), "--out is required");
  if (format.empty()) {
    a.check(fs::path(out).extension() == ".gguf",
            "--format is required (gguf or hf) when --out does not end in .gguf");
    format = "gguf";
  }
  a.check(format == "gguf" || format == "hf", "--format is gguf or hf, got '" + format + "'");
  if (dtype.empty()) dtype = format == "gguf" ? "f16" : "f32";
  ExportOptions eo;
  if (dtype == "f32") {
    eo.dtype = QuantType::F32;
  } else if (dtype == "f16") {
    eo.dtype = QuantType::F16;
  } else if (dtype == "bf16") {
    eo.dtype = QuantType::BF16;
  } else if (dtype == "q8_0" && format == "gguf") {
    eo.dtype = QuantType::Q8_0;
  } else {
    a.fail("--dtype is f16, bf16, f32" + std::string(format == "gguf" ? " or q8_0" : " (q8_0 is gguf only)") +
           ", got '" + dtype + "'");
  }
  if (format == "gguf") {
    check_output_path(out, "--out");
  } else {
    std::error_code ec;
    a.check(!fs::exists(out, ec) || fs::is_directory(out, ec),
            "--out " + out + " exists and is not a directory (a Hugging Face export is a directory)");
  }
  eo.name = name.empty() ? fs::path(out).filename().replace_extension().string() : name;

  const auto t0 = Clock::now();
  Context ctx(default_cpu_backend());
  const PretrainedModel file = PretrainedModel::open(ckpt);
  RunModel rm = load_run_model(file, ctx, DType::F32, 0);
  const Tokenizer* tok = rm.codec.tokenizer();
  std::printf(
      "model: %s\ntokenizer: %s\n", rm.describe().c_str(),
      tok ? rm.codec.describe().c_str() : "byte-level: exported as 256 byte tokens, GPT-2 pre-tokenizer");
  if (format == "gguf")
    export_gguf(*rm.model, tok, out, eo);
  else
    export_hf(*rm.model, tok, out, eo);
  std::printf("wrote %s (%s, %s weights, %.1f MB) in %s\n", out.c_str(),
              format == "gguf" ? "GGUF" : "Hugging Face directory", dtype.c_str(),
              double(bytes_at(out)) / 1e6, duration(seconds_since(t0)).c_str());
  if (format == "gguf") {
    std::printf("run it in llama.cpp:\n  llama-completion -m %s -p %s -n 64 --temp 0\n",
                shell_quote(out).c_str(), shell_quote(prompt).c_str());
  } else {
    std::printf("load it in Python:\n  transformers.AutoModelForCausalLM.from_pretrained(%s)\n",
                shell_quote(out).c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a("export", kHelp);
  return run_main("export", [&] { return run(a, argc, argv); });
}
