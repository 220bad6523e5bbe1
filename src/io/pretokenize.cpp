#include "pretokenize.h"

#include <string>

#include "../core/error.h"
#include "unicode_classes.h"

namespace retort {

PreTokenizer parse_pre_tokenizer(std::string_view name) {
  if (name == "gpt2" || name == "gpt-2" || name == "default") return PreTokenizer::Gpt2;
  if (name == "smollm") return PreTokenizer::Smollm;
  if (name == "llama3" || name == "llama-bpe") return PreTokenizer::Llama3;
  if (name == "qwen2") return PreTokenizer::Qwen2;
  RT_FAIL("unsupported pre-tokenizer \"", std::string(name),
          "\" (supported: gpt2, gpt-2, default, smollm, llama3, llama-bpe, qwen2)");
}

const char* pre_tokenizer_name(PreTokenizer pre) {
  switch (pre) {
    case PreTokenizer::Gpt2:
      return "gpt2";
    case PreTokenizer::Smollm:
      return "smollm";
    case PreTokenizer::Llama3:
      return "llama3";
    case PreTokenizer::Qwen2:
      return "qwen2";
  }
  return "?";
}

}  // namespace retort

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

bool is_number_at(std::string_view text, size_t pos) {
  return classify(decode(text, pos).cp) == Cls::Number;
}

// End of the maximal run of class `cls` that starts at pos.
size_t run_end(std::string_view text, size_t pos, Cls cls) {
  while (pos < text.size()) {
    Char d = decode(text, pos);
    if (classify(d.cp) != cls) break;
    pos += d.len;
  }
  return pos;
}

// Length of the contraction ('s 't 're 've 'm 'll 'd) at pos, or 0. GPT-2's pattern is case-sensitive;
// Llama 3's matches under (?i), where Unicode case folding also lets U+017F (long s) match 's'.
size_t contraction(std::string_view text, size_t pos, bool any_case) {
  if (text[pos] != '\'' || pos + 1 >= text.size()) return 0;
  auto lower = [&](char c) { return any_case && c >= 'A' && c <= 'Z' ? char(c - 'A' + 'a') : c; };
  char a = lower(text[pos + 1]);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (any_case && text.substr(pos + 1, 2) == "\xC5\xBF") return 3;  // 'ſ
  if (pos + 2 >= text.size()) return 0;
  char b = lower(text[pos + 2]);
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

// GPT-2's pattern. With digits_apart (Smollm), every number character is a piece of its own and the text
// between two of them is split as if it were a whole text, so a number also ends the text for the
// lookahead of \s+(?!\S).
size_t gpt2_like_piece(std::string_view text, size_t pos, bool digits_apart) {
  const size_t n = text.size();
  auto at_end = [&](size_t p) { return p == n || (digits_apart && is_number_at(text, p)); };
  Char first = decode(text, pos);
  if (digits_apart && classify(first.cp) == Cls::Number) return first.len;
  if (size_t c = contraction(text, pos, false)) return c;

  // " ?\p{L}+", " ?\p{N}+", " ?[^\s\p{L}\p{N}]+": an optional space, then a maximal run of one class. Each
  // alternative is greedy with nothing after it, so the longest run is the match and no backtracking is
  // needed.
  size_t start = pos + (first.cp == ' ' ? 1 : 0);
  if (start < n) {
    Cls cls = classify(decode(text, start).cp);
    if (cls != Cls::Space && !(digits_apart && cls == Cls::Number)) return run_end(text, start, cls) - pos;
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
  if (at_end(end) || last == pos) return end - pos;
  return last - pos;
}

bool is_cr_or_lf(uint32_t cp) {
  return cp == '\r' || cp == '\n';
}

// Llama 3's pattern (max_digits 3) and Qwen2's (max_digits 1). The alternatives are tried in order; each is
// matched by scanning forward, with the few backtracking cases worked out below.
size_t llama3_like_piece(std::string_view text, size_t pos, int max_digits) {
  const size_t n = text.size();
  if (size_t c = contraction(text, pos, true)) return c;
  Char first = decode(text, pos);
  Cls cls = classify(first.cp);

  // "[^\r\n\p{L}\p{N}]?\p{L}+": one optional character that is none of those, then letters. When the
  // character at pos is a letter the option is empty; when it is anything else but CR, LF or a number the
  // option takes it, and a letter must follow.
  if (cls == Cls::Letter) return run_end(text, pos, Cls::Letter) - pos;
  if (cls != Cls::Number && !is_cr_or_lf(first.cp)) {
    size_t start = pos + first.len;
    if (start < n && classify(decode(text, start).cp) == Cls::Letter)
      return run_end(text, start, Cls::Letter) - pos;
  }

  // "\p{N}{1,3}" (or "\p{N}").
  if (cls == Cls::Number) {
    size_t end = pos;
    for (int i = 0; i < max_digits && end < n; ++i) {
      Char d = decode(text, end);
      if (classify(d.cp) != Cls::Number) break;
      end += d.len;
    }
    return end - pos;
  }

  // " ?[^\s\p{L}\p{N}]+[\r\n]*": an optional space, a run of "other" characters, then any CR and LF.
  size_t start = pos + (first.cp == ' ' ? 1 : 0);
  if (start < n && classify(decode(text, start).cp) == Cls::Other) {
    size_t end = run_end(text, start, Cls::Other);
    while (end < n && (text[end] == '\r' || text[end] == '\n')) ++end;
    return end - pos;
  }

  // Here the character at pos is whitespace. "\s*[\r\n]+": \s* first takes the whole run, then gives back
  // until a CR or LF can follow, so the match ends after the run's last CR or LF (when it has one).
  size_t end = pos, last = pos, after_newline = 0;
  while (end < n) {
    Char d = decode(text, end);
    if (classify(d.cp) != Cls::Space) break;
    last = end;
    end += d.len;
    if (is_cr_or_lf(d.cp)) after_newline = end;
  }
  if (after_newline != 0) return after_newline - pos;
  // "\s+(?!\S)" and "\s+", as in GPT-2's pattern.
  if (end == n || last == pos) return end - pos;
  return last - pos;
}

}  // namespace

size_t gpt2_piece_length(std::string_view text, size_t pos) {
  return gpt2_like_piece(text, pos, false);
}

size_t piece_length(PreTokenizer pre, std::string_view text, size_t pos) {
  switch (pre) {
    case PreTokenizer::Gpt2:
      return gpt2_like_piece(text, pos, false);
    case PreTokenizer::Smollm:
      return gpt2_like_piece(text, pos, true);
    case PreTokenizer::Llama3:
      return llama3_like_piece(text, pos, 3);
    case PreTokenizer::Qwen2:
      return llama3_like_piece(text, pos, 1);
  }
  RT_FAIL("pretokenize: unknown pre-tokenizer ", int(pre));
}

std::vector<std::string_view> pretokenize(PreTokenizer pre, std::string_view text) {
  std::vector<std::string_view> out;
  pretokenize(pre, text, [&](std::string_view p) { out.push_back(p); });
  return out;
}

std::vector<std::string_view> gpt2_pretokenize(std::string_view text) {
  return pretokenize(PreTokenizer::Gpt2, text);
}

}  // namespace retort::io
