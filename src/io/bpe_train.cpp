// Tokenizer::train: byte-level BPE merges learned from pre-tokenized piece counts.
#include <algorithm>
#include <queue>
#include <unordered_map>

#include "../core/error.h"
#include "pretokenize.h"
#include "tokenizer.h"

namespace retort {

namespace {

uint64_t pair_key(int32_t a, int32_t b) {
  return (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
}
int32_t pair_left(uint64_t k) {
  return int32_t(k >> 32);
}
int32_t pair_right(uint64_t k) {
  return int32_t(k & 0xffffffffu);
}

// A heap entry: a pair and its count when pushed. Counts change as merges happen; every change pushes a fresh
// entry, and an entry whose count no longer matches the pair's current count is stale and skipped.
struct Entry {
  int64_t count;
  uint64_t pair;
  // Max-heap order: larger count first; on a tie the smaller (left, right) ids first, which makes the result
  // independent of hash-map iteration order.
  bool operator<(const Entry& o) const { return count != o.count ? count < o.count : pair > o.pair; }
};

}  // namespace

Tokenizer Tokenizer::train(std::string_view corpus, const BpeTrainOptions& options) {
  const int64_t n_special = int64_t(options.special_tokens.size());
  RT_CHECK(options.vocab_size >= 256 + n_special && options.vocab_size <= INT32_MAX,
           "Tokenizer::train: vocab_size must be at least 256 + the ", n_special, " special tokens, got ",
           options.vocab_size);
  RT_CHECK(options.min_frequency >= 1, "Tokenizer::train: min_frequency must be >= 1, got ",
           options.min_frequency);
  for (size_t i = 0; i < options.special_tokens.size(); ++i) {
    RT_CHECK(!options.special_tokens[i].empty(), "Tokenizer::train: special token ", i, " is empty");
    for (size_t j = 0; j < i; ++j)
      RT_CHECK(options.special_tokens[i] != options.special_tokens[j], "Tokenizer::train: special token \"",
               options.special_tokens[i], "\" is listed twice");
  }

  // Unique pieces with their counts, sorted so that nothing downstream depends on hash order.
  std::unordered_map<std::string_view, int64_t> counts;
  io::pretokenize(options.pre, corpus, [&](std::string_view p) { ++counts[p]; });
  std::vector<std::pair<std::string_view, int64_t>> pieces(counts.begin(), counts.end());
  std::sort(pieces.begin(), pieces.end());
  counts.clear();

  Tokenizer tok;
  for (int b = 0; b < 256; ++b) tok.tokens_.emplace_back(1, char(b));
  std::unordered_map<std::string, int32_t> known;  // bytes -> id of the tokens made so far
  for (int b = 0; b < 256; ++b) known.emplace(tok.tokens_[size_t(b)], b);

  std::vector<std::vector<int32_t>> words(pieces.size());
  std::vector<int64_t> freq(pieces.size());
  std::unordered_map<uint64_t, int64_t> pair_count;
  std::unordered_map<uint64_t, std::vector<int32_t>> where;  // pair -> words that had it (may be stale)
  for (size_t w = 0; w < pieces.size(); ++w) {
    freq[w] = pieces[w].second;
    for (char c : pieces[w].first) words[w].push_back(int32_t(uint8_t(c)));
    for (size_t i = 0; i + 1 < words[w].size(); ++i) {
      uint64_t k = pair_key(words[w][i], words[w][i + 1]);
      pair_count[k] += freq[w];
      auto& list = where[k];
      if (list.empty() || list.back() != int32_t(w)) list.push_back(int32_t(w));
    }
  }
  std::priority_queue<Entry> heap;
  for (auto& [k, c] : pair_count) heap.push({c, k});

  const int64_t target = options.vocab_size - n_special;
  std::vector<int32_t> merged;
  std::unordered_map<uint64_t, int64_t> delta;
  std::vector<int64_t> stamp(words.size(), -1);  // last merge step that rewrote each word
  for (int64_t step = 0; int64_t(tok.tokens_.size()) < target && !heap.empty(); ++step) {
    Entry top = heap.top();
    heap.pop();
    auto pc = pair_count.find(top.pair);
    if (pc == pair_count.end() || pc->second != top.count) continue;  // stale
    if (top.count < options.min_frequency) break;
    const int32_t a = pair_left(top.pair), b = pair_right(top.pair);
    std::string bytes = tok.tokens_[size_t(a)] + tok.tokens_[size_t(b)];
    // Different merge orders in different words can build the same string twice ("a"+"bc" and "ab"+"c"): the
    // second merge then reuses the existing token instead of adding a duplicate.
    auto [kit, fresh] = known.emplace(bytes, int32_t(tok.tokens_.size()));
    const int32_t c = kit->second;
    if (fresh) tok.tokens_.push_back(std::move(bytes));
    tok.merges_.push_back({a, b, c});

    delta.clear();
    std::vector<int32_t> affected = std::move(where[top.pair]);
    where.erase(top.pair);
    for (int32_t w : affected) {
      if (stamp[size_t(w)] == step) continue;  // listed twice
      stamp[size_t(w)] = step;
      std::vector<int32_t>& s = words[size_t(w)];
      merged.clear();
      bool hit = false;
      for (size_t i = 0; i < s.size(); ++i) {
        if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
          merged.push_back(c);
          ++i;
          hit = true;
        } else {
          merged.push_back(s[i]);
        }
      }
      if (!hit) continue;  // stale listing: an earlier merge already consumed the pair here
      const int64_t f = freq[size_t(w)];
      for (size_t i = 0; i + 1 < s.size(); ++i) delta[pair_key(s[i], s[i + 1])] -= f;
      for (size_t i = 0; i + 1 < merged.size(); ++i) {
        uint64_t k = pair_key(merged[i], merged[i + 1]);
        delta[k] += f;
        if (merged[i] == c || merged[i + 1] == c) {
          auto& list = where[k];
          if (list.empty() || list.back() != w) list.push_back(w);
        }
      }
      s.swap(merged);
    }
    // Apply in key order so the heap sees the same pushes on every platform.
    std::vector<std::pair<uint64_t, int64_t>> changes(delta.begin(), delta.end());
    std::sort(changes.begin(), changes.end());
    for (auto& [k, d] : changes) {
      if (d == 0) continue;
      int64_t& cnt = pair_count[k];
      cnt += d;
      if (cnt <= 0) {
        pair_count.erase(k);
      } else {
        heap.push({cnt, k});
      }
    }
  }

  tok.types_.assign(tok.tokens_.size(), TokenType::Normal);
  for (const std::string& s : options.special_tokens) {
    tok.tokens_.push_back(s);
    tok.types_.push_back(TokenType::Control);
  }
  tok.pre_ = options.pre;
  tok.build("trained vocabulary", /*require_all_bytes=*/true);
  return tok;
}

}  // namespace retort
