#include "tune_cache.h"

#include <sys/stat.h>

#include <charconv>
#include <set>
#include <string_view>

#include "../core/atomic_file.h"

namespace retort::cuda {

namespace {

constexpr std::string_view kMagic = "retort tune cache 1";
constexpr std::string_view kSignature = "signature ";
constexpr size_t kMaxNumbers = 64;
constexpr size_t kMaxEntries = 100000;

// The integers of s (separated by spaces or tabs); false on anything else or more than kMaxNumbers.
bool parse_ints(std::string_view s, std::vector<int64_t>& out) {
  out.clear();
  size_t i = 0;
  while (true) {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
    if (i == s.size()) return !out.empty();
    int64_t v = 0;
    const auto [p, ec] = std::from_chars(s.data() + i, s.data() + s.size(), v);
    if (ec != std::errc() || p == s.data() + i) return false;
    i = size_t(p - s.data());
    if (i < s.size() && s[i] != ' ' && s[i] != '\t') return false;
    if (out.size() == kMaxNumbers) return false;
    out.push_back(v);
  }
}

bool file_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

struct Parsed {
  std::string signature;
  std::vector<TuneEntry> entries;
};

Parsed parse(const std::string& path, const std::string& text) {
  Parsed out;
  std::vector<std::string_view> lines;
  std::string_view rest(text);
  while (!rest.empty()) {
    const size_t nl = rest.find('\n');
    lines.push_back(rest.substr(0, nl));
    if (nl == std::string_view::npos) break;
    rest.remove_prefix(nl + 1);
  }
  if (lines.empty() || lines[0] != kMagic)
    file_error(path, "not a retort tune cache (the first line is not \"" + std::string(kMagic) + "\")");
  if (lines.size() < 2 || lines[1].substr(0, kSignature.size()) != kSignature)
    file_error(path, "line 2: expected \"signature <text>\"");
  out.signature = std::string(lines[1].substr(kSignature.size()));
  std::set<std::vector<int64_t>> seen;
  for (size_t n = 2; n < lines.size(); ++n) {
    const std::string_view line = lines[n];
    if (line.empty()) continue;
    const std::string where = "line " + std::to_string(n + 1) + ": ";
    const size_t colon = line.find(':');
    TuneEntry e;
    if (colon == std::string_view::npos || !parse_ints(line.substr(0, colon), e.key) ||
        !parse_ints(line.substr(colon + 1), e.value))
      file_error(path, where + "expected \"<integers> : <integers>\" (at most " +
                           std::to_string(kMaxNumbers) + " each), got \"" + std::string(line.substr(0, 120)) +
                           "\"");
    if (!seen.insert(e.key).second) file_error(path, where + "the key is repeated");
    if (out.entries.size() == kMaxEntries)
      file_error(path, "more than " + std::to_string(kMaxEntries) + " entries");
    out.entries.push_back(std::move(e));
  }
  return out;
}

}  // namespace

std::vector<TuneEntry> read_tune_cache(const std::string& path, const std::string& signature) {
  if (!file_exists(path)) return {};
  Parsed p = parse(path, read_text_file(path));
  if (p.signature != signature) return {};
  return std::move(p.entries);
}

void write_tune_cache(const std::string& path, const std::string& signature,
                      const std::vector<TuneEntry>& entries) {
  if (signature.find('\n') != std::string::npos) file_error(path, "the signature holds a newline");
  for (const TuneEntry& e : entries)
    if (e.key.empty() || e.value.empty() || e.key.size() > kMaxNumbers || e.value.size() > kMaxNumbers)
      file_error(path,
                 "a tune cache entry needs 1 to " + std::to_string(kMaxNumbers) + " key and value numbers");
  std::vector<TuneEntry> merged;
  std::set<std::vector<int64_t>> ours;
  for (const TuneEntry& e : entries) ours.insert(e.key);
  if (file_exists(path)) {
    Parsed old = parse(path, read_text_file(path));
    if (old.signature == signature)
      for (TuneEntry& e : old.entries)
        if (!ours.count(e.key)) merged.push_back(std::move(e));
  }
  std::set<std::vector<int64_t>> written;
  for (const TuneEntry& e : entries)
    if (written.insert(e.key).second) merged.push_back(e);  // the first of repeated keys in `entries`
  if (merged.size() > kMaxEntries) file_error(path, "more than " + std::to_string(kMaxEntries) + " entries");
  std::string text(kMagic);
  text += '\n';
  text += kSignature;
  text += signature;
  text += '\n';
  for (const TuneEntry& e : merged) {
    for (int64_t k : e.key) text += std::to_string(k) + ' ';
    text += ':';
    for (int64_t v : e.value) text += ' ' + std::to_string(v);
    text += '\n';
  }
  write_file_atomic(path, text.data(), text.size());
}

}  // namespace retort::cuda
