#include "tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <queue>

#include "../core/error.h"
#include "file.h"
#include "json.h"
#include "pretokenize.h"
#include "unicode_classes.h"

namespace retort {

using io::file_error;

namespace {

constexpr char kMagic[] = "RTBPETOK";  // 8 bytes, no terminator in the file
constexpr uint32_t kVersion = 1;
constexpr uint32_t kPretokGpt2 = 1;
constexpr size_t kHeaderBytes = 40;
constexpr size_t kCrcOffset = 36;  // the checksum is the header's last field
// A long piece (a run of 100k punctuation marks, say) is cheap to encode but its cache entry is not worth
// keeping; the cache is also bounded so that encoding an endless stream cannot grow memory without limit.
constexpr size_t kMaxCachedPiece = 256;
constexpr size_t kMaxCacheEntries = size_t(1) << 20;

uint64_t pair_key(int32_t a, int32_t b) {
  return (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
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

}  // namespace

struct Tokenizer::Cache {
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
  };
  std::mutex mu;
  std::unordered_map<std::string, std::vector<int32_t>, Hash, std::equal_to<>> pieces;
};

Tokenizer::Tokenizer() : cache_(std::make_unique<Cache>()) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

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

// ---- building and checking the tables -------------------------------------------------------------------

void Tokenizer::build(const std::string& source) {
  auto fail = [&](const std::string& what) { file_error(source, what); };
  const int64_t n = int64_t(tokens_.size());
  if (n == 0 || n > INT32_MAX) fail("vocabulary size " + std::to_string(n) + " is out of range");

  std::vector<bool> special(size_t(n), false);
  for (int32_t s : special_ids_) {
    if (s < 0 || s >= n) fail("special token id " + std::to_string(s) + " is outside the vocabulary");
    if (special[size_t(s)]) fail("special token id " + std::to_string(s) + " is listed twice");
    if (tokens_[size_t(s)].empty()) fail("special token " + std::to_string(s) + " is empty");
    special[size_t(s)] = true;
  }
  ids_.clear();
  ids_.reserve(size_t(n));
  for (int32_t id = 0; id < n; ++id) {
    if (special[size_t(id)]) continue;
    const std::string& t = tokens_[size_t(id)];
    if (t.empty()) fail("token " + std::to_string(id) + " is empty");
    auto [it, fresh] = ids_.emplace(t, id);
    if (!fresh)
      fail("tokens " + std::to_string(it->second) + " and " + std::to_string(id) + " have the same bytes \"" +
           printable(t) + "\"");
  }
  std::vector<bool> made(size_t(n), false);  // a byte token, or the result of an earlier merge
  for (int b = 0; b < 256; ++b) {
    auto it = ids_.find(std::string(1, char(b)));
    if (it == ids_.end()) fail("no token for byte " + std::to_string(b) + ": byte-level BPE needs all 256");
    byte_id_[size_t(b)] = it->second;
    made[size_t(it->second)] = true;
  }
  merge_rank_.clear();
  merge_rank_.reserve(merges_.size());
  for (size_t r = 0; r < merges_.size(); ++r) {
    const Merge& m = merges_[r];
    std::string where = "merge " + std::to_string(r);
    for (int32_t id : {m.left, m.right, m.result})
      if (id < 0 || id >= n || special[size_t(id)])
        fail(where + " uses id " + std::to_string(id) + ", which is not an ordinary token");
    // Encoding applies merges in rank order, so a merge whose halves only appear later could never fire.
    if (!made[size_t(m.left)] || !made[size_t(m.right)])
      fail(where + " (\"" + printable(tokens_[size_t(m.left)]) + "\" + \"" +
           printable(tokens_[size_t(m.right)]) + "\") uses a token that no earlier merge makes");
    if (tokens_[size_t(m.result)] != tokens_[size_t(m.left)] + tokens_[size_t(m.right)])
      fail(where + " makes token " + std::to_string(m.result) + " (\"" +
           printable(tokens_[size_t(m.result)]) + "\"), which is not the concatenation of its halves");
    if (!merge_rank_.emplace(pair_key(m.left, m.right), int32_t(r)).second)
      fail(where + " repeats an earlier merge");
    made[size_t(m.result)] = true;
  }
  std::lock_guard<std::mutex> lock(cache_->mu);
  cache_->pieces.clear();
}

// ---- GPT-2's files --------------------------------------------------------------------------------------

Tokenizer Tokenizer::load_gpt2(const std::string& encoder_json_path, const std::string& vocab_bpe_path) {
  std::array<uint32_t, 256> to_unicode = gpt2_byte_to_unicode();
  std::unordered_map<uint32_t, uint8_t> to_byte;
  for (int b = 0; b < 256; ++b) to_byte[to_unicode[size_t(b)]] = uint8_t(b);
  // A token string in GPT-2's alphabet -> its raw bytes; nullopt-like false on a character outside it.
  auto to_bytes = [&](std::string_view s, std::string& out) {
    out.clear();
    for (size_t p = 0; p < s.size();) {
      uint32_t cp = 0;
      size_t len = io::utf8_decode(s, p, cp);
      if (len == 0) return false;
      auto it = to_byte.find(cp);
      if (it == to_byte.end()) return false;
      out += char(it->second);
      p += len;
    }
    return true;
  };

  Tokenizer tok;
  io::Json enc = io::parse_json(io::read_text_file(encoder_json_path), encoder_json_path);
  if (!enc.is(io::Json::Kind::Object))
    file_error(encoder_json_path,
               std::string("expected a JSON object of token -> id, got ") + io::json_kind_name(enc.kind));
  const size_t n = enc.keys.size();
  tok.tokens_.assign(n, std::string());
  std::vector<bool> seen(n, false);
  std::string bytes;
  for (size_t i = 0; i < n; ++i) {
    const std::string& key = enc.keys[i];
    const io::Json& v = enc.items[i];
    if (!v.is(io::Json::Kind::Int) || v.integer < 0 || v.integer >= int64_t(n))
      file_error(encoder_json_path,
                 "token \"" + printable(key) + "\" has id " +
                     (v.is(io::Json::Kind::Int) ? std::to_string(v.integer) : "(not an integer)") +
                     "; ids must be 0.." + std::to_string(n - 1));
    size_t id = size_t(v.integer);
    if (seen[id]) file_error(encoder_json_path, "id " + std::to_string(id) + " is given to two tokens");
    seen[id] = true;
    if (key == "<|endoftext|>") {
      tok.tokens_[id] = key;
      tok.special_ids_.push_back(int32_t(id));
    } else if (!to_bytes(key, bytes)) {
      file_error(encoder_json_path,
                 "token \"" + printable(key) + "\" has a character outside GPT-2's byte alphabet");
    } else {
      tok.tokens_[id] = bytes;
    }
  }
  std::unordered_map<std::string, int32_t> by_bytes;  // ordinary tokens only, to resolve merges
  for (size_t id = 0; id < n; ++id)
    if (std::find(tok.special_ids_.begin(), tok.special_ids_.end(), int32_t(id)) == tok.special_ids_.end())
      by_bytes.emplace(tok.tokens_[id], int32_t(id));

  std::string text = io::read_text_file(vocab_bpe_path);
  std::string a, b;
  size_t line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    std::string_view line(text.data() + pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_no == 1 && line.starts_with("#version"))) continue;
    auto where = [&] { return "line " + std::to_string(line_no) + " (\"" + printable(line) + "\")"; };
    size_t sp = line.find(' ');
    if (sp == 0 || sp == std::string_view::npos || sp + 1 == line.size() ||
        line.find(' ', sp + 1) != std::string_view::npos)
      file_error(vocab_bpe_path, where() + ": a merge line is two symbols separated by one space");
    if (!to_bytes(line.substr(0, sp), a) || !to_bytes(line.substr(sp + 1), b))
      file_error(vocab_bpe_path, where() + ": a character outside GPT-2's byte alphabet");
    auto ia = by_bytes.find(a), ib = by_bytes.find(b), ir = by_bytes.find(a + b);
    if (ia == by_bytes.end() || ib == by_bytes.end() || ir == by_bytes.end())
      file_error(vocab_bpe_path,
                 where() + ": the merge or one of its halves is not a token of " + encoder_json_path);
    tok.merges_.push_back({ia->second, ib->second, ir->second});
  }
  tok.build(encoder_json_path + " + " + vocab_bpe_path);
  return tok;
}

// ---- encoding -------------------------------------------------------------------------------------------

std::vector<int32_t> Tokenizer::bpe(std::string_view piece) const {
  // Merges fire lowest rank first and, within a rank, left to right (GPT-2's loop merges every occurrence of
  // the best pair left to right, then looks again). A heap of candidate pairs over a linked list of symbols
  // does the same in O(n log n), so a pathological 100 kB piece cannot take quadratic time.
  const int32_t n = int32_t(piece.size());
  const size_t len = piece.size();
  std::vector<int32_t> id(len), next(len), prev(len);
  for (int32_t i = 0; i < n; ++i) {
    id[size_t(i)] = byte_id_[uint8_t(piece[size_t(i)])];
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
  if (piece.size() == 1) {
    out.push_back(byte_id_[uint8_t(piece[0])]);
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
  io::gpt2_pretokenize(text, [&](std::string_view piece) { encode_piece(piece, out); });
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool allow_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3);
  if (!allow_special || special_ids_.empty()) {
    encode_ordinary(text, out);
    return out;
  }
  size_t pos = 0;
  while (pos < text.size()) {
    // The earliest special occurrence; on a tie at one position, the longest special wins.
    size_t best = std::string_view::npos;
    int32_t best_id = -1;
    for (int32_t s : special_ids_) {
      const std::string& name = tokens_[size_t(s)];
      size_t at = text.find(name, pos);
      if (at < best ||
          (at == best && at != std::string_view::npos && name.size() > tokens_[size_t(best_id)].size())) {
        best = at;
        best_id = s;
      }
    }
    if (best == std::string_view::npos) break;
    encode_ordinary(text.substr(pos, best - pos), out);
    out.push_back(best_id);
    pos = best + tokens_[size_t(best_id)].size();
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

const std::string& Tokenizer::token_bytes(int32_t id) const {
  RT_CHECK(id >= 0 && int64_t(id) < vocab_size(), "tokenizer: token id ", id,
           " is outside the vocabulary [0, ", vocab_size(), ")");
  return tokens_[size_t(id)];
}

int32_t Tokenizer::token_id(std::string_view bytes) const {
  auto it = ids_.find(std::string(bytes));
  return it == ids_.end() ? -1 : it->second;
}

int32_t Tokenizer::special_id(std::string_view name) const {
  for (int32_t s : special_ids_)
    if (tokens_[size_t(s)] == name) return s;
  return -1;
}

// ---- own file format ------------------------------------------------------------------------------------
// header (40 bytes): "RTBPETOK", u32 version, u32 pre-tokenizer (1 = GPT-2), u32 tokens, u32 merges,
//   u32 specials, u64 payload bytes, u32 CRC-32 of header bytes 0..36 followed by the payload
// payload: per token u32 length + bytes; per merge u32 left, right, result; per special u32 id.
void Tokenizer::save(const std::string& path) const {
  std::vector<uint8_t> payload;
  for (const std::string& t : tokens_) {
    io::append_le32(payload, uint32_t(t.size()));
    io::append_bytes(payload, t.data(), t.size());
  }
  for (const Merge& m : merges_) {
    io::append_le32(payload, uint32_t(m.left));
    io::append_le32(payload, uint32_t(m.right));
    io::append_le32(payload, uint32_t(m.result));
  }
  for (int32_t s : special_ids_) io::append_le32(payload, uint32_t(s));
  std::vector<uint8_t> header;
  io::append_bytes(header, kMagic, 8);
  io::append_le32(header, kVersion);
  io::append_le32(header, kPretokGpt2);
  io::append_le32(header, uint32_t(tokens_.size()));
  io::append_le32(header, uint32_t(merges_.size()));
  io::append_le32(header, uint32_t(special_ids_.size()));
  io::append_le64(header, payload.size());
  io::append_le32(header, io::crc32_update(io::crc32(header), payload.data(), payload.size()));
  io::write_file_atomic(path, [&](io::FileWriter& w) {
    w.write(header);
    w.write(payload);
  });
}

Tokenizer Tokenizer::load(const std::string& path) {
  std::vector<uint8_t> file = io::read_file(path);
  io::ByteReader r(file, path);
  r.expect_magic(std::string_view(kMagic, 8), "retort tokenizer");
  uint32_t version = r.u32("version");
  if (version != kVersion)
    r.fail("unsupported version ", version, " (this build reads tokenizer files of version ", kVersion, ")");
  uint32_t pretok = r.u32("pre-tokenizer");
  if (pretok != kPretokGpt2) r.fail("unknown pre-tokenizer ", pretok, " (this build knows 1 = GPT-2)");
  uint32_t n_tokens = r.u32("token count"), n_merges = r.u32("merge count"),
           n_special = r.u32("special count");
  uint64_t payload_bytes = r.u64("payload size");
  uint32_t crc = r.u32("checksum");
  if (payload_bytes > r.remaining())
    r.fail("truncated: the header promises ", payload_bytes, " payload bytes, but only ", r.remaining(),
           " follow it");
  if (payload_bytes < r.remaining())
    r.fail("size mismatch: the header promises ", payload_bytes, " payload bytes, but ", r.remaining(),
           " follow it");
  // Each token takes at least 4 bytes, each merge 12, each special 4: check before allocating anything.
  if (uint64_t(n_tokens) * 4 + uint64_t(n_merges) * 12 + uint64_t(n_special) * 4 > payload_bytes)
    r.fail("the header's counts (", n_tokens, " tokens, ", n_merges, " merges, ", n_special,
           " specials) do not fit in ", payload_bytes, " payload bytes");
  uint32_t got =
      io::crc32_update(io::crc32(file.data(), kCrcOffset), file.data() + kHeaderBytes, payload_bytes);
  if (got != crc)
    r.fail("checksum mismatch: the CRC-32 is ", got, ", the header says ", crc, " (corrupt file)");
  Tokenizer tok;
  tok.tokens_.reserve(n_tokens);
  for (uint32_t i = 0; i < n_tokens; ++i) {
    uint32_t len = r.u32("token length");
    std::span<const uint8_t> b = r.bytes(len, "token bytes");
    tok.tokens_.emplace_back(b.begin(), b.end());
  }
  tok.merges_.reserve(n_merges);
  for (uint32_t i = 0; i < n_merges; ++i) {
    Merge m;
    m.left = int32_t(r.u32("merge"));
    m.right = int32_t(r.u32("merge"));
    m.result = int32_t(r.u32("merge"));
    tok.merges_.push_back(m);
  }
  for (uint32_t i = 0; i < n_special; ++i) tok.special_ids_.push_back(int32_t(r.u32("special id")));
  if (r.remaining() != 0) r.fail(r.remaining(), " unexpected bytes after the tables");
  tok.build(path);
  return tok;
}

}  // namespace retort
