// generate: text from a model (a checkpoint, a GGUF file or a Hugging Face directory), continuing a prompt or
// answering it as a chat, with temperature, top-k and top-p sampling.
#include <algorithm>
#include <cstdio>

#include "common.h"

using namespace ex;

namespace {

const char* kHelp = R"(generate - sample text from a model.

Loads a checkpoint written by train or distill, or a pretrained model (a GGUF file or a Hugging Face
directory), and its tokenizer, encodes --prompt, and appends up to --len tokens (fewer when the model ends
its text with its end-of-sequence token), each drawn from the model's next-token distribution: the logits divided
by --temperature, cut to the --top-k most likely tokens (0: no cut), then to the smallest set whose
probability reaches --top-p (1: no cut), renormalized. --temperature 0 takes the most likely token (greedy).
Keys and values of past tokens are cached, so each new token costs one token's work. When the text outgrows
the model's context, generation goes on from its newest context / 2 tokens. Prints the prompt and its
continuation as it comes (bytes that are not text show as '?'), and the speed.

With --chat the prompt is a user's message: it is wrapped in the model's chat format (ChatML, used by
SmolLM2 and Qwen2: <|im_start|>user ... <|im_end|> <|im_start|>assistant), with --system as the system
message when given, and generation stops at the end of the assistant's turn.

Exit status: 0 done, 1 failed (a bad file, out of memory), 2 a bad command line.

Usage: generate --model PATH [options]

  --model PATH        checkpoint, GGUF file or Hugging Face directory (required; --ckpt is the same)
  --prompt TEXT       text to continue (default: a newline)
  --chat B            0 or 1: answer --prompt as a chat message (default 0)
  --system TEXT       the chat's system message (default: none)
  --len N             tokens to generate (default 200)
  --temperature F     >= 0 (default 0.8)
  --top-k N           >= 0 (default 0)
  --top-p F           in (0, 1] (default 1)
  --seed N            sampling seed (default 1)
  --device D          auto, cpu or cuda (default auto)
  --threads N         CPU threads (default 0: all cores)
  --help              this text

Examples: generate --model build/demo/student-distilled.safetensors --prompt "And God said" --top-p 0.9
          generate --model SmolLM2-135M-Instruct.Q4_1.gguf --chat 1 --prompt "What is the capital of France?"
)";

int run(Args& a, int argc, char** argv) {
  std::string ckpt, prompt = "\n", device = "auto", system;
  int64_t len = 200, top_k = 0;
  float temperature = 0.8f, top_p = 1.0f;
  uint64_t seed = 1;
  int threads = 0;
  bool chat = false;
  a.add("--ckpt", &ckpt), a.add("--model", &ckpt), a.add("--prompt", &prompt), a.add("--len", &len),
      a.add("--temperature", &temperature);
  a.add("--top-k", &top_k), a.add("--top-p", &top_p), a.add("--seed", &seed), a.add("--device", &device);
  a.add("--threads", &threads), a.add("--chat", &chat), a.add("--system", &system);
  a.parse(argc, argv);
  a.check(!ckpt.empty(), "--model is required");
  a.check(len >= 0 && len <= (int64_t(1) << 30), "--len must be in [0, 2^30]");
  a.check(temperature >= 0, "--temperature must be >= 0");
  a.check(top_k >= 0, "--top-k must be >= 0");
  a.check(top_p > 0 && top_p <= 1, "--top-p must be in (0, 1]");
  a.check_machine(threads, device);
  {
    Device dev = pick_device(device, threads);
    Context ctx(*dev.backend);
    const PretrainedModel file = PretrainedModel::open(ckpt);
    RunModel rm = load_run_model(file, ctx, default_compute_dtype(*dev.backend), 0);
    rm.model->freeze_weights();  // forward only: its 16-bit weights made once
    const TextCodec& codec = rm.codec;
    RT_CHECK(codec.vocab() <= rm.model->config().vocab, "vocabulary mismatch: ", ckpt, ": the tokenizer has ",
             codec.vocab(), " tokens, the model ", rm.model->config().vocab);
    const Tokenizer* tok = codec.tokenizer();
    std::vector<int32_t> stop;
    if (tok && tok->eos_id() >= 0) stop.push_back(tok->eos_id());
    std::string text = prompt;
    if (chat) {
      const int32_t end = tok ? tok->special_id("<|im_end|>") : -1;
      RT_CHECK(tok && tok->special_id("<|im_start|>") >= 0 && end >= 0,
               "--chat needs a model with a "
               "ChatML chat format (<|im_start|> / <|im_end|> tokens, as SmolLM2 and Qwen2 have); ",
               ckpt, " has none");
      text.clear();
      if (!system.empty()) text += "<|im_start|>system\n" + system + "<|im_end|>\n";
      text += "<|im_start|>user\n" + prompt + "<|im_end|>\n<|im_start|>assistant\n";
      stop.push_back(end);
    }
    const std::vector<int32_t> ids = codec.encode(text);  // special tokens as themselves
    RT_CHECK(!ids.empty(), "the prompt encodes to no tokens");
    GeneratorOptions go;
    go.slide = true;
    go.max_len = std::min<int64_t>(rm.model->config().context, int64_t(ids.size()) + len);
    Generator gen(ctx, *rm.model, go);
    SamplingOptions so;
    so.temperature = temperature, so.top_k = top_k, so.top_p = top_p, so.seed = seed;
    if (!chat) std::printf("%s", printable(prompt).c_str());
    std::fflush(stdout);
    // Streams whole characters: bytes of a UTF-8 sequence split across tokens wait for the rest.
    std::string pending;
    int64_t produced = 0;
    const auto t0 = Clock::now();
    gen.generate(ids, len, so, stop, [&](int32_t id) {
      ++produced;
      if (std::find(stop.begin(), stop.end(), id) != stop.end()) return true;
      pending += codec.decode({id});
      size_t lead = pending.size();
      while (lead > 0 && (uint8_t(pending[lead - 1]) & 0xC0) == 0x80) --lead;
      size_t cut = pending.size();
      if (lead > 0) {
        const uint8_t c = uint8_t(pending[lead - 1]);
        const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        if (pending.size() - (lead - 1) < need) cut = lead - 1;
      }
      std::printf("%s", printable(pending.substr(0, cut)).c_str());
      std::fflush(stdout);
      pending.erase(0, cut);
      return true;
    });
    std::printf("%s\n", printable(pending).c_str());
    const double secs = seconds_since(t0);
    std::fprintf(stderr,
                 "(%s: %lld tokens in %s, %.1f tokens/s on %s; temperature %.2g, top-k %lld, top-p %.2g)\n",
                 rm.file.name().c_str(), (long long)produced, duration(secs).c_str(),
                 secs > 0 ? double(produced) / secs : 0.0, dev.desc.c_str(), double(temperature),
                 (long long)top_k, double(top_p));
    return 0;
  }
}

}  // namespace

int main(int argc, char** argv) {
  Args a("generate", kHelp);
  return run_main("generate", [&] { return run(a, argc, argv); });
}
