// Finds special-token strings ("<|endoftext|>", "<|im_start|>", ...) in text in one pass over it: a trie of
// the specials' bytes, entered only at bytes that start one. The leftmost occurrence wins, and of the
// specials that start there, the longest (Hugging Face's added-token splitter uses the same rule). The cost
// is O(text bytes × longest special) whatever the number of specials.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace retort::io {

class SpecialMatcher {
 public:
  SpecialMatcher() { clear(); }

  void clear();
  // Adds s (non-empty) as special `id`; adding the same string again replaces its id.
  void add(std::string_view s, int32_t id);
  bool empty() const { return nodes_.size() == 1; }

  struct Match {
    size_t pos = std::string_view::npos;  // npos: no special at or after `from`
    size_t len = 0;
    int32_t id = -1;
  };
  // The leftmost-longest special in text at or after byte `from`.
  Match find(std::string_view text, size_t from) const;
  // The id of the special spelled exactly s, or -1.
  int32_t id_of(std::string_view s) const;

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> next;  // byte -> child node; few per node except near the root
    int32_t id = -1;                                // the special that ends here, or -1
  };
  int32_t child(int32_t node, uint8_t byte) const;
  std::vector<Node> nodes_;           // nodes_[0] is the root
  std::array<int32_t, 256> first_{};  // the root's children by byte, -1 where no special starts with it
};

}  // namespace retort::io
