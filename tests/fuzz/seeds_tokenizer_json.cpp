// Writes small valid tokenizer.json files into the directory given as argv[1], the seed corpus of
// fuzz_tokenizer_json: each pre-tokenizer configuration retort reads, both merge spellings, added tokens, and
// a tokenizer_config.json after a NUL byte.
#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

void write(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string path = dir + "/" + name;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr || std::fwrite(text.data(), 1, text.size(), f) != text.size() || std::fclose(f) != 0) {
    std::fprintf(stderr, "seeds_tokenizer_json: cannot write %s\n", path.c_str());
    std::exit(1);
  }
}

std::string doc(const std::string& pre, const std::string& merges, const std::string& extra = "") {
  return R"({"version":"1.0","truncation":null,"padding":null,"added_tokens":[{"id":7,"content":"<|endoftext|>",)"
         R"("single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}],)"
         R"("normalizer":null,"pre_tokenizer":)" +
         pre +
         R"(,"post_processor":null,"decoder":{"type":"ByteLevel"},"model":{"type":"BPE","dropout":null,)"
         R"("unk_token":null,"fuse_unk":false,"byte_fallback":false,"vocab":{"a":0,"b":1,"ab":2,"\u0120":3,)"
         R"("\u0120ab":4,"1":5,"2":6,"<|endoftext|>":7},"merges":)" +
         merges + "}" + extra + "}";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: seeds_tokenizer_json DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  const std::string byte_level =
      R"({"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true})";
  const std::string digits =
      R"({"type":"Sequence","pretokenizers":[{"type":"Digits","individual_digits":true},)" + byte_level +
      "]}";
  const std::string split =
      R"({"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":)"
      R"("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},)"
      R"("behavior":"Isolated","invert":false},{"type":"ByteLevel","add_prefix_space":false,)"
      R"("trim_offsets":true,"use_regex":false}]})";
  write(dir, "bytelevel.json", doc(byte_level, R"(["a b","\u0120 ab"])"));
  write(dir, "digits.json", doc(digits, R"([["a","b"],["\u0120","ab"]])"));
  write(dir, "llama3.json", doc(split, R"(["a b","\u0120 ab"])"));
  write(dir, "with_config.json",
        doc(byte_level, R"(["a b"])") + std::string(1, '\0') +
            R"({"bos_token":"<|endoftext|>","eos_token":{"content":"<|endoftext|>"}})");
  return 0;
}
