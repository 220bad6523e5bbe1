#include "special_matcher.h"

namespace retort::io {

void SpecialMatcher::clear() {
  nodes_.assign(1, Node{});
  first_.fill(-1);
}

int32_t SpecialMatcher::child(int32_t node, uint8_t byte) const {
  if (node == 0) return first_[byte];
  for (const auto& [b, c] : nodes_[size_t(node)].next)
    if (b == byte) return c;
  return -1;
}

void SpecialMatcher::add(std::string_view s, int32_t id) {
  int32_t node = 0;
  for (unsigned char b : s) {
    int32_t c = child(node, b);
    if (c < 0) {
      c = int32_t(nodes_.size());
      nodes_.emplace_back();
      if (node == 0) {
        first_[b] = c;
      } else {
        nodes_[size_t(node)].next.emplace_back(b, c);
      }
    }
    node = c;
  }
  if (node != 0) nodes_[size_t(node)].id = id;
}

SpecialMatcher::Match SpecialMatcher::find(std::string_view text, size_t from) const {
  const size_t n = text.size();
  for (size_t p = from; p < n; ++p) {
    int32_t node = first_[uint8_t(text[p])];
    if (node < 0) continue;
    Match m;
    for (size_t q = p + 1;; ++q) {
      if (nodes_[size_t(node)].id >= 0) m = {p, q - p, nodes_[size_t(node)].id};
      if (q == n) break;
      node = child(node, uint8_t(text[q]));
      if (node < 0) break;
    }
    if (m.id >= 0) return m;
  }
  return {};
}

int32_t SpecialMatcher::id_of(std::string_view s) const {
  int32_t node = 0;
  for (unsigned char b : s) {
    node = child(node, b);
    if (node < 0) return -1;
  }
  return node == 0 ? -1 : nodes_[size_t(node)].id;
}

}  // namespace retort::io
