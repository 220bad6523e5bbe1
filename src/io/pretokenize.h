// Pre-tokenization by hand: the text is split into pieces as a model's regular expression would split it, and
// BPE then runs inside each piece. Four variants, named as GGUF's `tokenizer.ggml.pre` names them:
//   Gpt2    's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   Smollm  every \p{N} character a piece of its own, then Gpt2 on the text between them (Hugging Face:
//           Sequence[Digits(individual_digits=True), ByteLevel(use_regex=True)])
//   Llama3  (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
//           \s*[\r\n]+|\s+(?!\S)|\s+
//   Qwen2   Llama3 with \p{N} (one digit) in place of \p{N}{1,3}
// Each runs in linear time, and the pieces always concatenate back to the text, byte for byte, whatever the
// input: bytes that are not valid UTF-8 count as one "other" character each (neither letter, number nor
// space).
#pragma once
#include <cstdint>
#include <string_view>
#include <vector>

namespace retort {

enum class PreTokenizer : uint8_t { Gpt2 = 1, Smollm = 2, Llama3 = 3, Qwen2 = 4 };

// The variant GGUF's `tokenizer.ggml.pre` calls `name`: "gpt2", "gpt-2" (llama.cpp's spelling) or "default"
// (Gpt2), "smollm", "llama3" or "llama-bpe" (Llama3), "qwen2". Throws retort::Error naming the value and the
// supported names otherwise.
PreTokenizer parse_pre_tokenizer(std::string_view name);
// "gpt2", "smollm", "llama3", "qwen2".
const char* pre_tokenizer_name(PreTokenizer pre);

}  // namespace retort

namespace retort::io {

// Byte length of the piece that starts at byte `pos` of text (pos < text.size()).
size_t piece_length(PreTokenizer pre, std::string_view text, size_t pos);
size_t gpt2_piece_length(std::string_view text, size_t pos);

// Calls fn(piece) for each piece of text, in order.
template <typename Fn>
void pretokenize(PreTokenizer pre, std::string_view text, Fn&& fn) {
  for (size_t pos = 0; pos < text.size();) {
    size_t len = piece_length(pre, text, pos);
    fn(text.substr(pos, len));
    pos += len;
  }
}
template <typename Fn>
void gpt2_pretokenize(std::string_view text, Fn&& fn) {
  pretokenize(PreTokenizer::Gpt2, text, fn);
}

// All pieces, as views into text.
std::vector<std::string_view> pretokenize(PreTokenizer pre, std::string_view text);
std::vector<std::string_view> gpt2_pretokenize(std::string_view text);

}  // namespace retort::io
