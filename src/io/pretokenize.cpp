#include "pretokenize.h"

#include <cstdint>

#include "unicode_classes.h"

namespace retort::io {

namespace {

enum class Cls { Letter, Number, Space, Other };

struct Char {
  uint32_t cp;  // kInvalid for a byte that does not start a valid UTF-8 sequence
  size_t len;   // bytes
};
constexpr uint32_t kInvalid = 0xFFFFFFFFu;

// Invalid UTF-8 bytes stand alone as one "other" character each, which keeps the split a partition.
Char decode(std::string_view text, size_t pos) {
  uint32_t cp = 0;
  size_t n = utf8_decode(text, pos, cp);
  return n == 0 ? Char{kInvalid, 1} : Char{cp, n};
}

Cls classify(uint32_t cp) {
  if (cp == kInvalid) return Cls::Other;
  if (is_unicode_letter(cp)) return Cls::Letter;
  if (is_unicode_number(cp)) return Cls::Number;
  if (is_unicode_space(cp)) return Cls::Space;
  return Cls::Other;
}

// Length of the contraction ('s 't 're 've 'm 'll 'd) at pos, or 0. Case-sensitive, like GPT-2's pattern.
size_t contraction(std::string_view text, size_t pos) {
  if (text[pos] != '\'' || pos + 1 >= text.size()) return 0;
  char a = text[pos + 1];
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (pos + 2 >= text.size()) return 0;
  char b = text[pos + 2];
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

}  // namespace

size_t gpt2_piece_length(std::string_view text, size_t pos) {
  const size_t n = text.size();
  if (size_t c = contraction(text, pos)) return c;

  // " ?\p{L}+", " ?\p{N}+", " ?[^\s\p{L}\p{N}]+": an optional space, then a maximal run of one class. Each
  // alternative is greedy with nothing after it, so the longest run is the match and no backtracking is
  // needed.
  Char first = decode(text, pos);
  size_t start = pos + (first.cp == ' ' ? 1 : 0);
  if (start < n) {
    Char c = decode(text, start);
    Cls cls = classify(c.cp);
    if (cls != Cls::Space) {
      size_t end = start + c.len;
      while (end < n) {
        Char d = decode(text, end);
        if (classify(d.cp) != cls) break;
        end += d.len;
      }
      return end - pos;
    }
  }

  // Here text[pos] is whitespace. "\s+(?!\S)": the whole run if it reaches the end of the text; otherwise the
  // run minus its last character, which is left to prefix the next piece (" word"); "\s+" when that would
  // leave nothing (a single whitespace character before a non-space).
  size_t end = pos, last = pos;
  while (end < n) {
    Char d = decode(text, end);
    if (classify(d.cp) != Cls::Space) break;
    last = end;
    end += d.len;
  }
  if (end == n || last == pos) return end - pos;
  return last - pos;
}

std::vector<std::string_view> gpt2_pretokenize(std::string_view text) {
  std::vector<std::string_view> out;
  gpt2_pretokenize(text, [&](std::string_view p) { out.push_back(p); });
  return out;
}

}  // namespace retort::io
