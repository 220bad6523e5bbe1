// generate: text from a checkpoint, continuing a prompt, with temperature, top-k and top-p sampling.
#include <cstdio>

#include "common.h"

using namespace ex;

namespace {

const char* kHelp = R"(generate - sample text from a checkpoint.

Loads a checkpoint written by train or distill and its tokenizer (recorded in the checkpoint), encodes
--prompt, and appends --len tokens, each drawn from the model's next-token distribution: the logits divided
by --temperature, cut to the --top-k most likely tokens (0: no cut), then to the smallest set whose
probability reaches --top-p (1: no cut), renormalized. --temperature 0 takes the most likely token (greedy).
Keys and values of past tokens are cached, so each new token costs one token's work. When the text outgrows
the model's context, generation goes on from its newest context / 2 tokens. Prints the prompt and its
continuation (bytes that are not text show as '?'), and the speed.

Usage: generate --ckpt PATH [options]

  --ckpt PATH         checkpoint (required)
  --prompt TEXT       text to continue (default: a newline)
  --len N             tokens to generate (default 200)
  --temperature F     >= 0 (default 0.8)
  --top-k N           >= 0 (default 0)
  --top-p F           in (0, 1] (default 1)
  --seed N            sampling seed (default 1)
  --device D          auto, cpu or cuda (default auto)
  --threads N         CPU threads (default 0: all cores)
  --help              this text

Example: generate --ckpt build/demo/student-distilled.safetensors --prompt "And God said" --top-p 0.9
)";

}  // namespace

int main(int argc, char** argv) {
  std::string ckpt, prompt = "\n", device = "auto";
  int64_t len = 200, top_k = 0;
  float temperature = 0.8f, top_p = 1.0f;
  uint64_t seed = 1;
  int threads = 0;
  Args a("generate", kHelp);
  a.add("--ckpt", &ckpt), a.add("--prompt", &prompt), a.add("--len", &len),
      a.add("--temperature", &temperature);
  a.add("--top-k", &top_k), a.add("--top-p", &top_p), a.add("--seed", &seed), a.add("--device", &device);
  a.add("--threads", &threads);
  a.parse(argc, argv);
  if (ckpt.empty()) a.fail("--ckpt is required");
  if (len < 0) a.fail("--len must be >= 0");
  if (temperature < 0) a.fail("--temperature must be >= 0");
  if (top_k < 0) a.fail("--top-k must be >= 0");
  if (!(top_p > 0 && top_p <= 1)) a.fail("--top-p must be in (0, 1]");
  try {
    const Checkpoint ck(ckpt);
    const TextCodec codec = TextCodec::from_metadata(ck.metadata(), ckpt);
    RT_CHECK(codec.vocab() == ck.config().vocab, "generate: ", ckpt, ": the tokenizer has ", codec.vocab(),
             " tokens, the model ", ck.config().vocab);
    Device dev = pick_device(device, threads, "generate");
    Context ctx(*dev.backend);
    Transformer model(ctx, ck.config());
    ck.load_model(model);
    Sampler sampler(ctx, model);
    const auto t0 = Clock::now();
    const auto out = sampler.generate(codec.encode(prompt), len, temperature, top_k, top_p, seed);
    const double secs = seconds_since(t0);
    std::printf("%s%s\n", printable(prompt).c_str(), printable(codec.decode(out)).c_str());
    std::fprintf(stderr,
                 "(%lld tokens in %s, %.1f tokens/s on %s; temperature %.2g, top-k %lld, top-p %.2g)\n",
                 (long long)len, duration(secs).c_str(), secs > 0 ? double(len) / secs : 0.0,
                 dev.desc.c_str(), double(temperature), (long long)top_k, double(top_p));
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "generate: %s\n", e.what());
    return 1;
  }
}
