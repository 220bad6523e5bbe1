// Seeds for fuzz_ops: for each op of the harness, a few programs on the leaves a working call needs (student
// logits f32 [4, 6] as a parameter, labels i32 [4], teacher ids i32 [4, 3], teacher logprobs f32 [4, 3]), in
// the byte encoding fuzz_ops.cpp reads. Usage: seeds_ops DIR.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace {

constexpr int kOps = 56;  // the op codes of fuzz_ops.cpp

struct Program {
  std::vector<uint8_t> b;
  void put(std::initializer_list<int> v) {
    for (int x : v) b.push_back(uint8_t(x));
  }
  // dtype index (0 f32, 3 i32), dims (each 1..9), then the values' bytes.
  void leaf(int dtype, std::initializer_list<int> dims, bool param, int value_base, int spread) {
    put({dtype, int(dims.size()) - 1});
    int n = 1;
    for (int d : dims) {
      put({d - 1});
      n *= d;
    }
    if (dtype == 0) put({param ? 1 : 0});
    put({0});  // values from bytes
    for (int i = 0; i < n; ++i) put({value_base + i % spread});
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: seeds_ops DIR\n");
    return 2;
  }
  // Bytes after the op code: which pool entries it reads and its options (0: mostly defaults).
  const std::vector<std::vector<int>> tails = {
      {0, 1, 2, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1},
      {0, 2, 3, 0, 1, 0, 0, 1, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 1},
      {0, 0, 1, 1, 1, 3, 2, 1, 0, 1, 0, 1, 0, 1, 0, 1, 1, 1, 1, 1, 1},
  };
  int count = 0;
  for (int op = 0; op < kOps; ++op)
    for (const std::vector<int>& tail : tails) {
      Program p;
      p.put({3});                        // four leaves
      p.leaf(0, {4, 6}, true, 100, 60);  // logits in [-0.9, 1]
      p.leaf(3, {4}, false, 1, 6);       // labels 0..5
      p.leaf(3, {4, 3}, false, 1, 6);    // ids 0..5
      p.leaf(0, {4, 3}, false, 60, 20);  // logprobs in [-2.1, -1.5]
      p.put({op});
      for (int x : tail) p.b.push_back(uint8_t(x));
      const std::string path = std::string(argv[1]) + "/seed_" + std::to_string(op) + "_" +
                               std::to_string(count++ % int(tails.size()));
      std::FILE* f = std::fopen(path.c_str(), "wb");
      if (!f || std::fwrite(p.b.data(), 1, p.b.size(), f) != p.b.size() || std::fclose(f) != 0) {
        std::fprintf(stderr, "seeds_ops: cannot write %s\n", path.c_str());
        return 1;
      }
    }
  return 0;
}
