// Helpers the tokenizer's files share: GPT-2's byte-to-unicode alphabet in both directions, and token text
// made safe to quote in an error message.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace retort::io {

// The raw bytes of a token spelled in GPT-2's alphabet ("Ġthe" -> " the"); false when s has a character
// outside the alphabet (or is not UTF-8).
bool gpt2_text_to_bytes(std::string_view s, std::string& out);
// The token's spelling in GPT-2's alphabet (" the" -> "Ġthe").
std::string bytes_to_gpt2_text(std::string_view bytes);
// s with every byte outside printable ASCII written as \xNN, for error messages.
std::string printable(std::string_view s);

inline uint64_t pair_key(int32_t a, int32_t b) {
  return (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
}

}  // namespace retort::io
