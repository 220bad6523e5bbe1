// Tokenizer files: GPT-2's encoder.json + vocab.bpe, and retort's own checksummed format.
#include "../core/error.h"
#include "file.h"
#include "json.h"
#include "tokenizer.h"
#include "tokenizer_text.h"

namespace retort {

using io::file_error;
using io::printable;

// ---- GPT-2's files --------------------------------------------------------------------------------------

Tokenizer Tokenizer::load_gpt2(const std::string& encoder_json_path, const std::string& vocab_bpe_path) {
  Tokenizer tok;
  io::Json enc = io::parse_json(io::read_text_file(encoder_json_path), encoder_json_path);
  if (!enc.is(io::Json::Kind::Object))
    file_error(encoder_json_path,
               std::string("expected a JSON object of token -> id, got ") + io::json_kind_name(enc.kind));
  const size_t n = enc.keys.size();
  tok.tokens_.assign(n, std::string());
  tok.types_.assign(n, TokenType::Normal);
  std::vector<bool> seen(n, false);
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
      tok.types_[id] = TokenType::Control;
    } else if (!io::gpt2_text_to_bytes(key, tok.tokens_[id])) {
      file_error(encoder_json_path,
                 "token \"" + printable(key) + "\" has a character outside GPT-2's byte alphabet");
    }
  }
  std::unordered_map<std::string, int32_t> by_bytes;  // ordinary tokens only, to resolve merges
  for (size_t id = 0; id < n; ++id)
    if (tok.types_[id] == TokenType::Normal) by_bytes.emplace(tok.tokens_[id], int32_t(id));

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
    if (!io::gpt2_text_to_bytes(line.substr(0, sp), a) || !io::gpt2_text_to_bytes(line.substr(sp + 1), b))
      file_error(vocab_bpe_path, where() + ": a character outside GPT-2's byte alphabet");
    auto ia = by_bytes.find(a), ib = by_bytes.find(b), ir = by_bytes.find(a + b);
    if (ia == by_bytes.end() || ib == by_bytes.end() || ir == by_bytes.end())
      file_error(vocab_bpe_path,
                 where() + ": the merge or one of its halves is not a token of " + encoder_json_path);
    tok.merges_.push_back({ia->second, ib->second, ir->second});
  }
  tok.build(encoder_json_path + " + " + vocab_bpe_path, /*require_all_bytes=*/true);
  return tok;
}

// ---- own file format ------------------------------------------------------------------------------------
// Version 2 (written):
//   header (48 bytes): "RTBPETOK", u32 version, u32 pre-tokenizer (PreTokenizer's value), u32 tokens,
//     u32 merges, u32 flags (bit 0 add_bos, bit 1 ignore_merges), u64 payload bytes, i32 BOS, i32 EOS,
//     u32 CRC-32 of header bytes 0..44 followed by the payload
//   payload: per token u8 type (TokenType), u32 length, bytes; per merge u32 left, right, result.
// Version 1 (read only):
//   header (40 bytes): "RTBPETOK", u32 version, u32 pre-tokenizer (1 = GPT-2), u32 tokens, u32 merges,
//     u32 specials, u64 payload bytes, u32 CRC-32 of header bytes 0..36 followed by the payload
//   payload: per token u32 length + bytes; per merge u32 left, right, result; per special u32 id (Control).

namespace {

constexpr char kMagic[] = "RTBPETOK";  // 8 bytes, no terminator in the file
constexpr uint32_t kVersion = 2;
constexpr size_t kHeaderBytesV1 = 40, kHeaderBytesV2 = 48;
constexpr uint32_t kFlagAddBos = 1, kFlagIgnoreMerges = 2;

}  // namespace

std::vector<uint8_t> Tokenizer::to_bytes() const {
  std::vector<uint8_t> payload;
  for (size_t id = 0; id < tokens_.size(); ++id) {
    payload.push_back(uint8_t(types_[id]));
    io::append_le32(payload, uint32_t(tokens_[id].size()));
    io::append_bytes(payload, tokens_[id].data(), tokens_[id].size());
  }
  for (const Merge& m : merges_) {
    io::append_le32(payload, uint32_t(m.left));
    io::append_le32(payload, uint32_t(m.right));
    io::append_le32(payload, uint32_t(m.result));
  }
  std::vector<uint8_t> header;
  io::append_bytes(header, kMagic, 8);
  io::append_le32(header, kVersion);
  io::append_le32(header, uint32_t(pre_));
  io::append_le32(header, uint32_t(tokens_.size()));
  io::append_le32(header, uint32_t(merges_.size()));
  io::append_le32(header, (add_bos_ ? kFlagAddBos : 0) | (ignore_merges_ ? kFlagIgnoreMerges : 0));
  io::append_le64(header, payload.size());
  io::append_le32(header, uint32_t(bos_));
  io::append_le32(header, uint32_t(eos_));
  io::append_le32(header, io::crc32_update(io::crc32(header), payload.data(), payload.size()));
  header.insert(header.end(), payload.begin(), payload.end());
  return header;
}

void Tokenizer::save(const std::string& path) const {
  const std::vector<uint8_t> bytes = to_bytes();
  io::write_file_atomic(path, bytes.data(), bytes.size());
}

Tokenizer Tokenizer::load(const std::string& path) {
  const std::vector<uint8_t> file = io::read_file(path);
  return from_bytes(file, path);
}

Tokenizer Tokenizer::from_bytes(std::span<const uint8_t> file, const std::string& path) {
  io::ByteReader r(file, path);
  r.expect_magic(std::string_view(kMagic, 8), "retort tokenizer");
  uint32_t version = r.u32("version");
  if (version != 1 && version != kVersion)
    r.fail("unsupported version ", version, " (this build reads tokenizer files of versions 1 and ", kVersion,
           ")");
  const bool v1 = version == 1;
  uint32_t pre = r.u32("pre-tokenizer");
  if (pre < 1 || pre > 4 || (v1 && pre != 1))
    r.fail("unknown pre-tokenizer ", pre, v1 ? " (version 1 knows 1 = GPT-2)" : " (this build knows 1..4)");
  uint32_t n_tokens = r.u32("token count"), n_merges = r.u32("merge count");
  uint32_t n_special = 0, flags = 0;
  if (v1) {
    n_special = r.u32("special count");
  } else {
    flags = r.u32("flags");
    if (flags & ~(kFlagAddBos | kFlagIgnoreMerges)) r.fail("unknown flags ", flags);
  }
  uint64_t payload_bytes = r.u64("payload size");
  int32_t bos = -1, eos = -1;
  if (!v1) {
    bos = int32_t(r.u32("BOS id"));
    eos = int32_t(r.u32("EOS id"));
  }
  const size_t header_bytes = v1 ? kHeaderBytesV1 : kHeaderBytesV2;
  uint32_t crc = r.u32("checksum");
  if (payload_bytes > r.remaining())
    r.fail("truncated: the header promises ", payload_bytes, " payload bytes, but only ", r.remaining(),
           " follow it");
  if (payload_bytes < r.remaining())
    r.fail("size mismatch: the header promises ", payload_bytes, " payload bytes, but ", r.remaining(),
           " follow it");
  // Each token takes at least 4 bytes (5 in version 2), each merge 12, each special 4: check before
  // allocating anything.
  if (uint64_t(n_tokens) * (v1 ? 4 : 5) + uint64_t(n_merges) * 12 + uint64_t(n_special) * 4 > payload_bytes)
    r.fail("the header's counts (", n_tokens, " tokens, ", n_merges, " merges, ", n_special,
           " specials) do not fit in ", payload_bytes, " payload bytes");
  uint32_t got =
      io::crc32_update(io::crc32(file.data(), header_bytes - 4), file.data() + header_bytes, payload_bytes);
  if (got != crc)
    r.fail("checksum mismatch: the CRC-32 is ", got, ", the header says ", crc, " (corrupt file)");
  Tokenizer tok;
  tok.pre_ = PreTokenizer(pre);
  tok.bos_ = bos;
  tok.eos_ = eos;
  tok.add_bos_ = flags & kFlagAddBos;
  tok.ignore_merges_ = flags & kFlagIgnoreMerges;
  tok.tokens_.reserve(n_tokens);
  tok.types_.assign(n_tokens, TokenType::Normal);
  for (uint32_t i = 0; i < n_tokens; ++i) {
    if (!v1) {
      uint8_t type = r.u8("token type");
      if (type < uint8_t(TokenType::Normal) || type > uint8_t(TokenType::Unused))
        r.fail("token ", i, " has unknown type ", int(type));
      tok.types_[i] = TokenType(type);
    }
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
  for (uint32_t i = 0; i < n_special; ++i) {
    uint32_t s = r.u32("special id");
    if (s >= n_tokens) r.fail("special token id ", s, " is outside the vocabulary");
    if (tok.types_[s] != TokenType::Normal) r.fail("special token id ", s, " is listed twice");
    tok.types_[s] = TokenType::Control;
  }
  if (r.remaining() != 0) r.fail(r.remaining(), " unexpected bytes after the tables");
  // Version 1 files were written only for GPT-2's and trained vocabularies, which have every byte.
  tok.build(path, /*require_all_bytes=*/v1);
  return tok;
}

}  // namespace retort
