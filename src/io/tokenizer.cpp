// The tokenizer's tables, their checks, and encoding. Reading and writing files: tokenizer_files.cpp (own
// format, GPT-2's) and tokenizer_hf.cpp (tokenizer.json); training: bpe_train.cpp.
#include "tokenizer.h"

#include <cstdio>
#include <mutex>
#include <queue>

#include "../core/error.h"
#include "file.h"
#include "tokenizer_text.h"
#include "unicode_classes.h"

namespace retort {

using io::file_error;
using io::pair_key;
using io::printable;

namespace {

// A long piece (a run of 100k punctuation marks, say) is cheap to encode but its cache entry is not worth
// keeping; the cache is also bounded so that encoding an endless stream cannot grow memory without limit.
constexpr size_t kMaxCachedPiece = 256;
constexpr size_t kMaxCacheEntries = size_t(1) << 20;

// GPT-2's alphabet uses code points below U+0144 only: code point -> byte, or -1.
constexpr uint32_t kAlphabetEnd = 0x144;
std::array<int16_t, kAlphabetEnd> alphabet_to_byte() {
  std::array<int16_t, kAlphabetEnd> map;
  map.fill(-1);
  auto to_unicode = Tokenizer::gpt2_byte_to_unicode();
  for (int b = 0; b < 256; ++b) map[to_unicode[size_t(b)]] = int16_t(b);
  return map;
}

bool is_special_type(TokenType t) {
  return t == TokenType::Unknown || t == TokenType::Control || t == TokenType::UserDefined;
}

std::string in_quotes(std::string_view s) {
  std::string out = "\"";  // appended piecewise: GCC 12 warns (-Wrestrict) on "\"" + std::string + "\""
  out += io::printable(s);
  out += '"';
  return out;
}

}  // namespace

// ---- GPT-2's alphabet -----------------------------------------------------------------------------------

std::array<uint32_t, 256> Tokenizer::gpt2_byte_to_unicode() {
  // GPT-2 keeps the bytes that print as themselves ('!'..'~', '¡'..'¬', '®'..'ÿ') and moves the other 68
  // (controls, space, DEL, NBSP, soft hyphen, ...) to U+0100 onwards in byte order, so that every token is a
  // printable string without spaces and vocab.bpe can separate a merge's two halves with one space.
  std::array<uint32_t, 256> map{};
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    map[b] = keep ? b : next++;
  }
  return map;
}

namespace io {

bool gpt2_text_to_bytes(std::string_view s, std::string& out) {
  static const std::array<int16_t, kAlphabetEnd> to_byte = alphabet_to_byte();
  out.clear();
  for (size_t p = 0; p < s.size();) {
    uint32_t cp = 0;
    size_t len = utf8_decode(s, p, cp);
    if (len == 0 || cp >= kAlphabetEnd || to_byte[cp] < 0) return false;
    out += char(to_byte[cp]);
    p += len;
  }
  return true;
}

std::string bytes_to_gpt2_text(std::string_view bytes) {
  static const std::array<uint32_t, 256> to_unicode = Tokenizer::gpt2_byte_to_unicode();
  std::string out;
  for (unsigned char b : bytes) utf8_append(out, to_unicode[b]);
  return out;
}

std::string printable(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7f) {
      out += char(c);
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    }
  }
  return out;
}

}  // namespace io

struct Tokenizer::Cache {
  std::mutex mu;
  std::unordered_map<std::string, std::vector<int32_t>, Hash, std::equal_to<>> pieces;
};

Tokenizer::Tokenizer() : cache_(std::make_unique<Cache>()) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

// ---- building and checking the tables -------------------------------------------------------------------

void Tokenizer::build(const std::string& source, bool require_all_bytes) {
  auto fail = [&](const std::string& what) { file_error(source, what); };
  const int64_t n = int64_t(tokens_.size());
  if (n == 0 || n > INT32_MAX) fail("vocabulary size " + std::to_string(n) + " is out of range");
  RT_ASSERT(types_.size() == tokens_.size());
  switch (pre_) {
    case PreTokenizer::Gpt2:
    case PreTokenizer::Smollm:
    case PreTokenizer::Llama3:
    case PreTokenizer::Qwen2:
      break;
    default:
      fail("unknown pre-tokenizer " + std::to_string(int(pre_)));
  }

  ids_.clear();
  ids_.reserve(size_t(n));
  specials_.clear();
  special_ids_.clear();
  for (int32_t id = 0; id < n; ++id) {
    const std::string& t = tokens_[size_t(id)];
    const TokenType type = types_[size_t(id)];
    if (t.empty()) fail("token " + std::to_string(id) + " is empty");
    if (type == TokenType::Normal) {
      auto [it, fresh] = ids_.emplace(t, id);
      if (!fresh)
        fail("tokens " + std::to_string(it->second) + " and " + std::to_string(id) + " have the same bytes " +
             in_quotes(t));
    } else if (is_special_type(type)) {
      if (int32_t other = specials_.id_of(t); other >= 0)
        fail("tokens " + std::to_string(other) + " and " + std::to_string(id) +
             " are the same special token " + in_quotes(t));
      specials_.add(t, id);
      special_ids_.push_back(id);
    } else if (type != TokenType::Unused) {
      fail("token " + std::to_string(id) + " has unknown type " + std::to_string(int(type)));
    }
  }
  std::vector<bool> made(size_t(n), false);  // a byte token, or the result of an earlier merge
  for (int b = 0; b < 256; ++b) {
    const char c = char(b);
    auto it = ids_.find(std::string_view(&c, 1));
    byte_id_[size_t(b)] = it == ids_.end() ? -1 : it->second;
    if (it != ids_.end()) {
      made[size_t(it->second)] = true;
    } else if (require_all_bytes) {
      fail("no token for byte " + std::to_string(b) + ": byte-level BPE needs all 256");
    }
  }
  merge_rank_.clear();
  merge_rank_.reserve(merges_.size());
  for (size_t r = 0; r < merges_.size(); ++r) {
    const Merge& m = merges_[r];
    std::string where = "merge " + std::to_string(r);
    for (int32_t id : {m.left, m.right, m.result})
      if (id < 0 || id >= n || types_[size_t(id)] != TokenType::Normal)
        fail(where + " uses id " + std::to_string(id) + ", which is not an ordinary token");
    // Training adds a merge only once its halves exist, so a half that no earlier merge makes means the table
    // is out of order (a damaged or hand-edited file).
    if (!made[size_t(m.left)] || !made[size_t(m.right)])
      fail(where + " (" + in_quotes(tokens_[size_t(m.left)]) + " + " + in_quotes(tokens_[size_t(m.right)]) +
           ") uses a token that no earlier merge makes");
    if (tokens_[size_t(m.result)] != tokens_[size_t(m.left)] + tokens_[size_t(m.right)])
      fail(where + " makes token " + std::to_string(m.result) + " (" + in_quotes(tokens_[size_t(m.result)]) +
           "), which is not the concatenation of its halves");
    if (!merge_rank_.emplace(pair_key(m.left, m.right), int32_t(r)).second)
      fail(where + " repeats an earlier merge");
    made[size_t(m.result)] = true;
  }
  for (auto [what, id] : {std::pair{"BOS", bos_}, std::pair{"EOS", eos_}})
    if (id < -1 || id >= n)
      fail(std::string(what) + " token id " + std::to_string(id) + " is outside the vocabulary [0, " +
           std::to_string(n) + ")");
  std::lock_guard<std::mutex> lock(cache_->mu);
  cache_->pieces.clear();
}

// ---- model-file descriptions ----------------------------------------------------------------------------

Tokenizer Tokenizer::from_spec(const TokenizerSpec& spec) {
  const std::string source = spec.source.empty() ? "tokenizer spec" : spec.source;
  auto fail = [&](const std::string& what) { file_error(source, what); };
  const size_t n = spec.tokens.size();
  if (n == 0 || n > size_t(INT32_MAX)) fail("vocabulary size " + std::to_string(n) + " is out of range");
  if (!spec.types.empty() && spec.types.size() != n)
    fail("there are " + std::to_string(spec.types.size()) + " token types for " + std::to_string(n) +
         " tokens");

  Tokenizer tok;
  tok.tokens_.resize(n);
  tok.types_.resize(n);
  std::unordered_map<std::string_view, int32_t> by_text;  // Normal tokens' spellings -> id, for the merges
  by_text.reserve(n);
  for (size_t id = 0; id < n; ++id) {
    const std::string& s = spec.tokens[id];
    const int32_t type = spec.types.empty() ? int32_t(TokenType::Normal) : spec.types[id];
    auto where = [&] { return "token " + std::to_string(id) + " (" + in_quotes(s) + ")"; };
    if (type < int32_t(TokenType::Normal) || type > int32_t(TokenType::Unused))
      fail(where() + " has type " + std::to_string(type) +
           "; supported: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused");
    tok.types_[id] = TokenType(type);
    if (tok.types_[id] == TokenType::Normal) {
      if (!io::gpt2_text_to_bytes(s, tok.tokens_[id]))
        fail(where() + " has a character outside GPT-2's byte-to-unicode alphabet");
      if (auto [it, fresh] = by_text.emplace(s, int32_t(id)); !fresh)
        fail("tokens " + std::to_string(it->second) + " and " + std::to_string(id) + " have the same bytes " +
             in_quotes(tok.tokens_[id]));
    } else {
      tok.tokens_[id] = s;
    }
  }

  tok.merges_.reserve(spec.merges.size());
  std::string joined;
  for (size_t r = 0; r < spec.merges.size(); ++r) {
    std::string_view line = spec.merges[r];
    auto where = [&] { return "merge " + std::to_string(r) + " (" + in_quotes(line) + ")"; };
    size_t sp = line.find(' ');
    if (sp == 0 || sp == std::string_view::npos || sp + 1 == line.size() ||
        line.find(' ', sp + 1) != std::string_view::npos)
      fail(where() + ": a merge is two tokens separated by one space");
    std::string_view a = line.substr(0, sp), b = line.substr(sp + 1);
    joined.assign(a).append(b);
    auto ia = by_text.find(a), ib = by_text.find(b), ir = by_text.find(joined);
    if (ia == by_text.end() || ib == by_text.end())
      fail(where() + ": " + in_quotes(ia == by_text.end() ? a : b) + " is not an ordinary token");
    if (ir == by_text.end())
      fail(where() + ": the merged token " + in_quotes(joined) + " is not an ordinary token");
    tok.merges_.push_back({ia->second, ib->second, ir->second});
  }
  tok.pre_ = spec.pre;
  tok.bos_ = spec.bos;
  tok.eos_ = spec.eos;
  tok.add_bos_ = spec.add_bos;
  tok.ignore_merges_ = spec.ignore_merges;
  tok.build(source, /*require_all_bytes=*/false);
  return tok;
}

TokenizerSpec Tokenizer::to_spec() const {
  TokenizerSpec spec;
  spec.tokens.reserve(tokens_.size());
  spec.types.reserve(tokens_.size());
  for (size_t id = 0; id < tokens_.size(); ++id) {
    spec.tokens.push_back(token_text(int32_t(id)));
    spec.types.push_back(int32_t(types_[id]));
  }
  spec.merges.reserve(merges_.size());
  for (const Merge& m : merges_)
    spec.merges.push_back(spec.tokens[size_t(m.left)] + " " + spec.tokens[size_t(m.right)]);
  spec.pre = pre_;
  spec.bos = bos_;
  spec.eos = eos_;
  spec.add_bos = add_bos_;
  spec.ignore_merges = ignore_merges_;
  return spec;
}

// ---- encoding -------------------------------------------------------------------------------------------

std::vector<int32_t> Tokenizer::bpe(std::string_view piece) const {
  // Merges fire lowest rank first and, within a rank, left to right (GPT-2's loop merges every occurrence of
  // the best pair left to right, then looks again). A heap of candidate pairs over a linked list of symbols
  // does the same in O(n log n), so a pathological 100 kB piece cannot take quadratic time.
  std::vector<int32_t> id;
  id.reserve(piece.size());
  // A byte without a token is dropped before merging, so its neighbours may merge (Hugging Face's rule).
  for (char c : piece)
    if (int32_t b = byte_id_[uint8_t(c)]; b >= 0) id.push_back(b);
  const int32_t n = int32_t(id.size());
  if (n == 0) return id;
  std::vector<int32_t> next(static_cast<size_t>(n)), prev(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    next[size_t(i)] = i + 1 < n ? i + 1 : -1;
    prev[size_t(i)] = i - 1;
  }
  struct Cand {
    int32_t rank, pos, left, right;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto consider = [&](int32_t i) {
    int32_t j = next[size_t(i)];
    if (j < 0) return;
    auto it = merge_rank_.find(pair_key(id[size_t(i)], id[size_t(j)]));
    if (it != merge_rank_.end()) heap.push({it->second, i, id[size_t(i)], id[size_t(j)]});
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);
  constexpr int32_t kDead = -1;
  while (!heap.empty()) {
    Cand c = heap.top();
    heap.pop();
    int32_t i = c.pos, j = next[size_t(i)];
    // Stale: a symbol of this pair was merged away or changed since the candidate was pushed.
    if (id[size_t(i)] != c.left || j < 0 || id[size_t(j)] != c.right) continue;
    id[size_t(i)] = merges_[size_t(c.rank)].result;
    id[size_t(j)] = kDead;
    next[size_t(i)] = next[size_t(j)];
    if (next[size_t(j)] >= 0) prev[size_t(next[size_t(j)])] = i;
    if (prev[size_t(i)] >= 0) consider(prev[size_t(i)]);
    consider(i);
  }
  std::vector<int32_t> out;
  for (int32_t i = 0; i >= 0; i = next[size_t(i)]) out.push_back(id[size_t(i)]);
  return out;
}

void Tokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (ignore_merges_) {
    auto it = ids_.find(piece);
    if (it != ids_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (piece.size() == 1) {
    if (int32_t b = byte_id_[uint8_t(piece[0])]; b >= 0) out.push_back(b);
    return;
  }
  if (piece.size() > kMaxCachedPiece) {
    std::vector<int32_t> ids = bpe(piece);
    out.insert(out.end(), ids.begin(), ids.end());
    return;
  }
  {
    std::lock_guard<std::mutex> lock(cache_->mu);
    auto it = cache_->pieces.find(piece);
    if (it != cache_->pieces.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids = bpe(piece);
  out.insert(out.end(), ids.begin(), ids.end());
  std::lock_guard<std::mutex> lock(cache_->mu);
  if (cache_->pieces.size() >= kMaxCacheEntries) cache_->pieces.clear();
  cache_->pieces.emplace(std::string(piece), std::move(ids));
}

void Tokenizer::encode_ordinary(std::string_view text, std::vector<int32_t>& out) const {
  io::pretokenize(pre_, text, [&](std::string_view piece) { encode_piece(piece, out); });
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool allow_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3);
  size_t pos = 0;
  // One pass over the text: each search resumes where the last special ended.
  while (allow_special) {
    io::SpecialMatcher::Match m = specials_.find(text, pos);
    if (m.id < 0) break;
    encode_ordinary(text.substr(pos, m.pos - pos), out);
    out.push_back(m.id);
    pos = m.pos + m.len;
  }
  encode_ordinary(text.substr(pos), out);
  return out;
}

std::string Tokenizer::decode(const int32_t* ids, size_t n) const {
  std::string out;
  for (size_t i = 0; i < n; ++i) out += token_bytes(ids[i]);
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  return decode(ids.data(), ids.size());
}

// ---- lookups --------------------------------------------------------------------------------------------

const std::string& Tokenizer::token_bytes(int32_t id) const {
  RT_CHECK(id >= 0 && int64_t(id) < vocab_size(), "tokenizer: token id ", id,
           " is outside the vocabulary [0, ", vocab_size(), ")");
  return tokens_[size_t(id)];
}

std::string Tokenizer::token_text(int32_t id) const {
  const std::string& b = token_bytes(id);
  return types_[size_t(id)] == TokenType::Normal ? io::bytes_to_gpt2_text(b) : b;
}

int32_t Tokenizer::token_from_text(std::string_view text) const {
  if (int32_t id = specials_.id_of(text); id >= 0) return id;
  std::string bytes;
  if (io::gpt2_text_to_bytes(text, bytes))
    if (int32_t id = token_id(bytes); id >= 0) return id;
  // Unused tokens ("[PAD151643]") are in neither table.
  for (size_t id = 0; id < tokens_.size(); ++id)
    if (types_[id] == TokenType::Unused && tokens_[id] == text) return int32_t(id);
  return -1;
}

TokenType Tokenizer::token_type(int32_t id) const {
  token_bytes(id);  // range check
  return types_[size_t(id)];
}

bool Tokenizer::is_special(int32_t id) const {
  return is_special_type(token_type(id));
}

int32_t Tokenizer::token_id(std::string_view bytes) const {
  auto it = ids_.find(bytes);
  return it == ids_.end() ? -1 : it->second;
}

int32_t Tokenizer::special_id(std::string_view name) const {
  return specials_.id_of(name);
}

std::vector<uint8_t> Tokenizer::missing_bytes() const {
  std::vector<uint8_t> out;
  for (int b = 0; b < 256; ++b)
    if (byte_id_[size_t(b)] < 0) out.push_back(uint8_t(b));
  return out;
}

}  // namespace retort
