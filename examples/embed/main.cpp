// embed: the smallest app that uses retort as a library. It loads a distilled student (a retort checkpoint,
// a GGUF file or a Hugging Face directory) with its tokenizer and streams a completion of a prompt.
// Build it against an installed retort:  c++ -std=c++20 main.cpp $(pkg-config --cflags --libs retort)
//   ./a.out student.safetensors "And God said" [tokens] [temperature]
#include <retort/retort.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s MODEL PROMPT [TOKENS=40] [TEMPERATURE=0.8]\n", argv[0]);
    return 2;
  }
  const std::string prompt = argv[2];
  const int64_t n = argc > 3 ? std::atoll(argv[3]) : 40;
  try {
    retort::Context ctx(retort::default_cpu_backend());
    retort::LoadedModel m = retort::load_model(argv[1], ctx);
    // A byte-level student has no tokenizer: its tokens are the text's bytes.
    std::vector<int32_t> ids;
    if (m.tokenizer)
      ids = m.tokenizer->encode(prompt, true);
    else
      for (unsigned char c : prompt) ids.push_back(c);
    auto text_of = [&](int32_t id) {
      return m.tokenizer ? m.tokenizer->decode({id}) : std::string(1, char(id));
    };

    retort::Generator gen(ctx, *m.model, {.slide = true});
    retort::SamplingOptions so;
    so.temperature = argc > 4 ? std::strtof(argv[4], nullptr) : 0.8f;
    so.seed = 1;
    std::vector<int32_t> stop;
    if (m.tokenizer && m.tokenizer->eos_id() >= 0) stop.push_back(m.tokenizer->eos_id());

    std::printf("%s", prompt.c_str());
    gen.generate(ids, n, so, stop, [&](int32_t id) {
      if (id != (stop.empty() ? -1 : stop[0])) std::printf("%s", text_of(id).c_str());
      std::fflush(stdout);  // stream each token as it comes
      return true;
    });
    std::printf("\n");
  } catch (const retort::Error& e) {
    std::fprintf(stderr, "embed: %s\n", e.what());
    return 1;
  }
  return 0;
}
