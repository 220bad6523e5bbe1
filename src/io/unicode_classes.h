// Unicode character classes used by GPT-2's pre-tokenization pattern (\p{L}, \p{N}, \s), by code point.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace retort::io {

// General category L* (Lu, Ll, Lt, Lm, Lo), from the table in unicode_classes.cpp.
bool is_unicode_letter(uint32_t cp);
// General category N* (Nd, Nl, No), likewise.
bool is_unicode_number(uint32_t cp);
// The White_Space property (what \s means in GPT-2's regex library): \t \n \v \f \r, space, U+0085, U+00A0,
// U+1680, U+2000..U+200A, U+2028, U+2029, U+202F, U+205F, U+3000. (Python's str.isspace also counts
// U+001C..U+001F; the White_Space property does not.)
bool is_unicode_space(uint32_t cp);

// Decodes the UTF-8 sequence at text[pos] (pos < text.size()) into cp and returns its length in bytes, or 0
// when it is not valid UTF-8 (bad lead or continuation byte, truncated, overlong, surrogate, past U+10FFFF).
size_t utf8_decode(std::string_view text, size_t pos, uint32_t& cp);
// Appends cp (<= U+10FFFF) as UTF-8.
void utf8_append(std::string& out, uint32_t cp);

}  // namespace retort::io
