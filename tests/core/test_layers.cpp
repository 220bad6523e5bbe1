// The shape of src/ that DESIGN.md's layout table promises, checked on the files themselves: no include runs
// from a lower layer to a higher one (core <- ops, io <- cuda, nn), and no source file outgrows the size at
// which STYLE.md asks for a split. Reads the tree at RETORT_SOURCE_DIR.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

namespace retort::test {
namespace {

namespace fs = std::filesystem;

const fs::path kSrc = fs::path(RETORT_SOURCE_DIR) / "src";

// The folders each layer may include besides its own (DESIGN.md, "Layout").
const std::map<std::string, std::set<std::string>> kMayInclude = {
    {"core", {}},
    {"ops", {"core"}},
    {"io", {"core"}},
    {"cuda", {"core", "ops"}},
    {"dist", {"core", "cuda"}},  // the process group: its GPU collective is NCCL's, made in src/cuda
    {"nn", {"core", "ops", "io", "dist"}},
};

// Arrows that still run the wrong way, each with the issue that removes it; the list may only shrink.
const std::set<std::string> kKnownWrongArrows = {
    "cuda/loss/cuda_chunk_exec.cu -> io/tune_cache.h",  // issue 26: the GEMM algorithm cache into src/cuda
};

bool is_source(const fs::path& p) {
  const std::string e = p.extension().string();
  return e == ".cpp" || e == ".h" || e == ".cu" || e == ".cuh";
}

std::vector<fs::path> sources() {
  std::vector<fs::path> out;
  for (const auto& e : fs::recursive_directory_iterator(kSrc))
    if (e.is_regular_file() && is_source(e.path())) out.push_back(e.path());
  return out;
}

TEST(Layers, SourceTreeIsThere) {
  ASSERT_TRUE(fs::is_directory(kSrc / "core")) << kSrc;
  EXPECT_GT(sources().size(), size_t(50));
}

TEST(Layers, NoIncludeRunsUpward) {
  const std::regex include(R"re(^\s*#\s*include\s*"([^"]+)")re");
  std::set<std::string> seen_known;
  for (const fs::path& f : sources()) {
    const fs::path rel = fs::relative(f, kSrc);
    const std::string layer = rel.begin()->string();
    const auto allowed = kMayInclude.find(layer);
    if (allowed == kMayInclude.end()) continue;  // retort.h, the public umbrella header
    std::ifstream in(f);
    std::string line;
    while (std::getline(in, line)) {
      std::smatch m;
      if (!std::regex_search(line, m, include)) continue;
      const fs::path target = (f.parent_path() / m[1].str()).lexically_normal();
      const fs::path trel = target.lexically_relative(kSrc);
      if (trel.empty() || trel.begin()->string() == ".." || !fs::exists(target)) continue;  // not in src/
      const std::string tlayer = trel.begin()->string();
      if (tlayer == layer || allowed->second.count(tlayer) || !kMayInclude.count(tlayer)) continue;
      const std::string arrow = rel.generic_string() + " -> " + trel.generic_string();
      if (kKnownWrongArrows.count(arrow)) {
        seen_known.insert(arrow);
        continue;
      }
      ADD_FAILURE() << arrow << ": " << layer << " may include only its own files and "
                    << (allowed->second.empty() ? std::string("nothing else") : *allowed->second.begin())
                    << (allowed->second.size() > 1 ? " and the others of DESIGN.md's layout table" : "");
    }
  }
  for (const std::string& a : kKnownWrongArrows)
    EXPECT_TRUE(seen_known.count(a)) << a << " is gone: take it off kKnownWrongArrows";
}

// Files over kMaxLines today, with their size then: they may shrink (and leave the list), never grow.
constexpr int kMaxLines = 700;
const std::map<std::string, int> kOversized = {
    {"cuda/loss/cuda_chunk_exec.cu", 951}, {"cuda/loss/cuda_sparse_topk.cu", 830},
    {"cuda/loss/distill_full.cu", 787},    {"cuda/loss/row_losses.cu", 849},
    {"cuda/loss/softmax_chunk.cu", 766},
};

TEST(Layers, NoSourceFileOutgrowsASplit) {
  for (const fs::path& f : sources()) {
    std::ifstream in(f);
    int lines = 0;
    for (std::string l; std::getline(in, l);) ++lines;
    const std::string rel = fs::relative(f, kSrc).generic_string();
    const auto known = kOversized.find(rel);
    const int limit = known == kOversized.end() ? kMaxLines : known->second;
    EXPECT_LE(lines, limit) << rel << " has " << lines << " lines"
                            << (known == kOversized.end() ? "; split it by concern (STYLE.md)"
                                                          : ": an oversized file may only shrink");
  }
}

}  // namespace
}  // namespace retort::test
