// GPT-2's pre-tokenization, by hand: the text is split into pieces as GPT-2's pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// would split it, and BPE then runs inside each piece. The pieces always concatenate back to the text, byte
// for byte, whatever the input (bytes that are not valid UTF-8 count as one "other" character each).
#pragma once
#include <string_view>
#include <vector>

namespace retort::io {

// Calls fn(piece) for each piece of text, in order.
template <typename Fn>
void gpt2_pretokenize(std::string_view text, Fn&& fn);

// Byte length of the piece that starts at byte `pos` of text (pos < text.size()).
size_t gpt2_piece_length(std::string_view text, size_t pos);

// All pieces, as views into text.
std::vector<std::string_view> gpt2_pretokenize(std::string_view text);

template <typename Fn>
void gpt2_pretokenize(std::string_view text, Fn&& fn) {
  for (size_t pos = 0; pos < text.size();) {
    size_t len = gpt2_piece_length(text, pos);
    fn(text.substr(pos, len));
    pos += len;
  }
}

}  // namespace retort::io
