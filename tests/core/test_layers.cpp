// The shape of src/ that DESIGN.md's layout table promises, checked on the files themselves: no include runs
// from a lower layer to a higher one (core <- ops, io <- cuda, nn), no source file outgrows the size at
// which STYLE.md asks for a split, and no function outside the kernels outgrows one screenful or two
// (kMaxFunctionLines). Reads the tree at RETORT_SOURCE_DIR.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
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

// The arrow "<file> -> <target>" when `file` (in src/) includes `target` (the text between the quotes)
// against the layout table; empty when the include is allowed or does not name a file of another layer in
// src/.
std::string wrong_arrow(const fs::path& file, const std::string& target_text) {
  const fs::path rel = fs::relative(file, kSrc);
  const std::string layer = rel.begin()->string();
  const auto allowed = kMayInclude.find(layer);
  if (allowed == kMayInclude.end()) return "";  // retort.h, the public umbrella header
  const fs::path target = (file.parent_path() / target_text).lexically_normal();
  const fs::path trel = target.lexically_relative(kSrc);
  if (trel.empty() || trel.begin()->string() == ".." || !fs::exists(target)) return "";  // not in src/
  const std::string tlayer = trel.begin()->string();
  if (tlayer == layer || allowed->second.count(tlayer) || !kMayInclude.count(tlayer)) return "";
  return rel.generic_string() + " -> " + trel.generic_string();
}

TEST(Layers, NoIncludeRunsUpward) {
  const std::regex include(R"re(^\s*#\s*include\s*"([^"]+)")re");
  for (const fs::path& f : sources()) {
    std::ifstream in(f);
    std::string line;
    while (std::getline(in, line)) {
      std::smatch m;
      if (!std::regex_search(line, m, include)) continue;
      const std::string arrow = wrong_arrow(f, m[1].str());
      if (arrow.empty()) continue;
      const std::string layer = fs::relative(f, kSrc).begin()->string();
      const auto& allowed = kMayInclude.at(layer);
      ADD_FAILURE() << arrow << ": " << layer << " may include only its own files and "
                    << (allowed.empty() ? std::string("nothing else") : *allowed.begin())
                    << (allowed.size() > 1 ? " and the others of DESIGN.md's layout table" : "");
    }
  }
}

TEST(Layers, TheArrowCheckSeesAWrongInclude) {
  // The arrows issue 26 removed, put back on paper: each must be caught, the allowed ones must not.
  EXPECT_EQ(wrong_arrow(kSrc / "cuda/loss/chunk_gemm.cu", "../../io/file.h"),
            "cuda/loss/chunk_gemm.cu -> io/file.h");
  EXPECT_EQ(wrong_arrow(kSrc / "core/graph.cpp", "../ops/ops.h"), "core/graph.cpp -> ops/ops.h");
  EXPECT_EQ(wrong_arrow(kSrc / "io/file.cpp", "../cuda/tune_cache.h"), "io/file.cpp -> cuda/tune_cache.h");
  EXPECT_EQ(wrong_arrow(kSrc / "cuda/loss/chunk_gemm.cu", "../tune_cache.h"), "");
  EXPECT_EQ(wrong_arrow(kSrc / "cuda/tune_cache.cpp", "../core/atomic_file.h"), "");
  EXPECT_EQ(wrong_arrow(kSrc / "io/file.h", "../core/atomic_file.h"), "");
  EXPECT_EQ(wrong_arrow(kSrc / "core/graph.cpp", "<vector>"), "");
}

constexpr int kMaxLines = 700;

TEST(Layers, NoSourceFileOutgrowsASplit) {
  for (const fs::path& f : sources()) {
    std::ifstream in(f);
    int lines = 0;
    for (std::string l; std::getline(in, l);) ++lines;
    const std::string rel = fs::relative(f, kSrc).generic_string();
    EXPECT_LE(lines, kMaxLines) << rel << " has " << lines << " lines; split it by concern (STYLE.md)";
  }
}

// ---- function length
// ---------------------------------------------------------------------------------------
//
// The rule: a function defined in src/ spans at most kMaxFunctionLines lines, from the line of its opening
// brace to the line of its closing one (lambdas and local classes count with the function around them).
// Kernels are exempt: functions declared __global__ or __device__ (a kernel's length follows its pipeline,
// and cutting it means more registers or more launches). A function is a brace block opened at namespace or
// class scope whose head (the text since the previous ';', '{' or '}') ends in ')' with at most qualifiers
// after it (const, noexcept, override, final, a trailing return type, a constructor's initializer list).
// Ceilings for the functions over the limit today: they may shrink (and leave the list), never grow.
constexpr int kMaxFunctionLines = 150;
const std::map<std::string, int> kLongFunctions = {};

// The text of a file with comments, string and character literals blanked (newlines kept, so line numbers
// hold) and preprocessor lines dropped.
std::string code_of(const fs::path& f) {
  std::ifstream in(f);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string out(s.size(), ' ');
  bool line_start = true;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '\n') {
      out[i] = '\n';
      line_start = true;
      continue;
    }
    if (line_start && c == '#') {  // a directive, with its continuation lines
      for (; i + 1 < s.size() && !(s[i + 1] == '\n' && s[i] != '\\'); ++i)
        if (s[i] == '\n') out[i] = '\n';
      continue;
    }
    if (c != ' ' && c != '\t') line_start = false;
    if (c == '/' && i + 1 < s.size() && s[i + 1] == '/') {
      while (i + 1 < s.size() && s[i + 1] != '\n') ++i;
    } else if (c == '/' && i + 1 < s.size() && s[i + 1] == '*') {
      for (i += 2; i + 1 < s.size() && !(s[i] == '*' && s[i + 1] == '/'); ++i)
        if (s[i] == '\n') out[i] = '\n';
      ++i;
    } else if (c == 'R' && i + 2 < s.size() && s[i + 1] == '"') {  // a raw string R"d( ... )d"
      const size_t open = s.find('(', i);
      const std::string end = ")" + s.substr(i + 2, open - i - 2) + "\"";
      const size_t close = s.find(end, open);
      for (size_t j = i; j < close + end.size() && j < s.size(); ++j)
        if (s[j] == '\n') out[j] = '\n';
      i = close + end.size() - 1;
    } else if (c == '"' || (c == '\'' && !(i > 0 && std::isxdigit(static_cast<unsigned char>(s[i - 1]))))) {
      for (++i; i < s.size() && s[i] != c; ++i)
        if (s[i] == '\\') ++i;
    } else {
      out[i] = c;
    }
  }
  return out;
}

// Whether a block head opens a function body (see the rule above) and is not a kernel.
bool opens_function(std::string head, bool* kernel) {
  static const std::regex control(R"re(^\s*(if|for|while|switch|catch|else|do|return)\b)re");
  static const std::regex scope(R"re(\b(namespace|class|struct|union|enum)\b[^()]*$)re");
  static const std::regex tail(
      R"re(\)\s*(const|noexcept|override|final|mutable|volatile|&|&&|\s)*(->\s*[\w:<>,\s\*&]+)?\s*$)re");
  static const std::regex init_list(R"re(\)\s*:\s*[\w:]+\s*[\({][\s\S]*[\)}]\s*$)re");
  if (std::regex_search(head, control) || std::regex_search(head, scope)) return false;
  // An initializer (T x = f(...) {...} does not occur, but T x = {...} does): '=' before the parameters.
  const size_t eq = head.find('='), paren = head.find('(');
  if (eq != std::string::npos && eq < paren && head.find("operator") == std::string::npos) return false;
  if (!std::regex_search(head, tail) && !std::regex_search(head, init_list)) return false;
  *kernel = head.find("__global__") != std::string::npos || head.find("__device__") != std::string::npos;
  return true;
}

struct LongFunction {
  std::string where;  // file:line
  int lines;
};

std::vector<LongFunction> long_functions(const fs::path& f, int limit) {
  static const std::regex scope_word(R"re(\b(namespace|class|struct|union|enum|extern)\b)re");
  static const std::regex ends_in_value(R"re((=|\w|\))\s*$)re");
  const std::string code = code_of(f);
  enum Kind { Scope, Function, Kernel, Other };  // Other: an initializer's braces, or a block in a body
  struct Open {
    Kind kind;
    int line;           // of the opening brace
    size_t head_start;  // an initializer's braces belong to the head around them: restored at its end
  };
  std::vector<Open> stack;
  std::vector<LongFunction> out;
  size_t head_start = 0;
  int line = 1;
  for (size_t i = 0; i < code.size(); ++i) {
    const char c = code[i];
    if (c == '\n') ++line;
    if (c == ';') head_start = i + 1;
    if (c == '{') {
      const bool in_function =
          std::any_of(stack.begin(), stack.end(), [](const Open& o) { return o.kind != Scope; });
      Kind k = Other;
      if (!in_function) {
        const std::string head = code.substr(head_start, i - head_start);
        bool kernel = false;
        if (opens_function(head, &kernel))
          k = kernel ? Kernel : Function;
        else if (std::regex_search(head, scope_word) ||
                 head.find_first_not_of(" \t\n") == std::string::npos ||
                 !std::regex_search(head, ends_in_value))
          k = Scope;
      }
      stack.push_back({k, line, head_start});
      head_start = i + 1;
    } else if (c == '}') {
      if (!stack.empty()) {
        const Open o = stack.back();
        stack.pop_back();
        if (o.kind == Function && line - o.line + 1 > limit)
          out.push_back(
              {fs::relative(f, kSrc).generic_string() + ":" + std::to_string(o.line), line - o.line + 1});
        const bool initializer =
            o.kind == Other &&
            std::none_of(stack.begin(), stack.end(), [](const Open& e) { return e.kind != Scope; });
        head_start = initializer ? o.head_start : i + 1;
        continue;
      }
      head_start = i + 1;
    }
  }
  return out;
}

TEST(Layers, NoFunctionOutgrowsTheLimit) {
  std::set<std::string> seen;
  int found = 0;
  for (const fs::path& f : sources()) {
    for (const LongFunction& lf : long_functions(f, kMaxFunctionLines)) {
      ++found;
      const std::string file = lf.where.substr(0, lf.where.find(':'));
      const auto known = kLongFunctions.find(lf.where);
      if (known != kLongFunctions.end()) {
        seen.insert(lf.where);
        EXPECT_LE(lf.lines, known->second) << lf.where << ": a long function may only shrink";
        continue;
      }
      ADD_FAILURE() << lf.where << ": a function of " << lf.lines << " lines (at most " << kMaxFunctionLines
                    << " outside kernels): split it into named steps";
    }
  }
  for (const auto& [where, lines] : kLongFunctions)
    EXPECT_TRUE(seen.count(where)) << where << " is no longer over the limit: take it off kLongFunctions";
  EXPECT_GE(found, int(kLongFunctions.size()));
}

// The rule's reader on a small sample: it must see functions, skip kernels and not count scopes.
TEST(Layers, FunctionLengthReaderSeesFunctions) {
  const fs::path dir = fs::temp_directory_path() / "retort_test_layers";
  fs::create_directories(dir);
  const fs::path f = dir / "sample.cu";
  {
    std::ofstream out(f);
    out << "namespace a {\nstruct S {\n  int f() const {\n";
    for (int i = 0; i < 5; ++i) out << "    x();  // } {\n";
    out << "  }\n};\n__global__ void k(int* p) {\n";
    for (int i = 0; i < 9; ++i) out << "  p[0] = 1;\n";
    out << "}\nvoid g(int n) {\n  auto l = [&](int i) { return \"}\"; };\n";
    for (int i = 0; i < 7; ++i) out << "  if (n) {\n  }\n";
    out << "}\nS::S() : v_(1), w_{2} {\n";
    for (int i = 0; i < 3; ++i) out << "  y();\n";
    out << "}\n}  // namespace a\n";
  }
  const std::vector<LongFunction> got = long_functions(f, 4);
  fs::remove_all(dir);
  ASSERT_EQ(got.size(), 3u);  // f (7 lines), g (17), the constructor (5); not the kernel (11) nor the scopes
  EXPECT_EQ(got[0].lines, 7);
  EXPECT_EQ(got[1].lines, 17);
  EXPECT_EQ(got[2].lines, 5);
}

}  // namespace
}  // namespace retort::test
