// The static completeness check of the op table: every op has a name and a CPU kernel, and every op marked
// differentiable has a backward rule. A failure lists every op that is missing something, so adding an Op to
// src/core/op.h without registering it in its family file fails here, not in some later graph.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "core/op_table.h"
#include "harness.h"

namespace retort::test {
namespace {

// The enumerators' own names, read from the one list there is, src/core/op.h's enum (so a missing entry is
// reported by what to look for there, and nothing here needs an edit when an op is added).
std::vector<std::string> read_enum_names() {
  std::ifstream in(std::string(RETORT_SOURCE_DIR) + "/src/core/op.h");
  std::vector<std::string> names;
  bool inside = false;
  const std::regex enumerator(R"re(^\s*([A-Z][A-Za-z0-9]*)\s*(=[^,]*)?,?\s*(//.*)?$)re");
  for (std::string line; std::getline(in, line);) {
    if (!inside) {
      inside = line.find("enum class Op ") != std::string::npos;
      continue;
    }
    if (line.find("};") != std::string::npos) break;
    std::smatch m;
    if (std::regex_match(line, m, enumerator)) names.push_back(m[1].str());
  }
  return names;
}

const std::vector<std::string>& enum_names() {
  static const std::vector<std::string> names = read_enum_names();
  return names;
}

std::string enum_name(Op op) {
  const size_t i = size_t(op);
  if (i < enum_names().size()) return std::string("Op::") + enum_names()[i];
  return "op #" + std::to_string(i);
}

// "name (Op::X)" of an op, for the lists below.
std::string label(int i) {
  const char* n = op_info(Op(i)).name;
  return std::string(n ? n : "<unregistered>") + " (" + enum_name(Op(i)) + ")";
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

TEST(OpTable, EveryOpHasAName) {
  std::vector<std::string> missing;
  for (int i = int(Op::None) + 1; i < kOpCount; ++i)
    if (!op_info(Op(i)).name) missing.push_back(enum_name(Op(i)));
  EXPECT_TRUE(missing.empty()) << missing.size() << " ops have no entry in the op table (not registered by "
                               << "their family's register_*_ops): " << join(missing);
}

TEST(OpTable, NamesAreUnique) {
  std::set<std::string> seen;
  std::vector<std::string> dup;
  for (int i = 0; i < kOpCount; ++i) {
    const char* n = op_info(Op(i)).name;
    if (n && !seen.insert(n).second) dup.push_back(label(i));
  }
  EXPECT_TRUE(dup.empty()) << "duplicate op names: " << join(dup);
}

TEST(OpTable, EveryOpHasACpuKernel) {
  std::vector<std::string> missing;
  for (int i = int(Op::None) + 1; i < kOpCount; ++i)
    if (!op_info(Op(i)).cpu) missing.push_back(label(i));
  EXPECT_TRUE(missing.empty()) << missing.size() << " ops have no CPU kernel: " << join(missing);
}

TEST(OpTable, EveryDifferentiableOpHasABackwardRule) {
  std::vector<std::string> missing;
  for (int i = int(Op::None) + 1; i < kOpCount; ++i) {
    const OpInfo& info = op_info(Op(i));
    // An unregistered entry reads as differentiable with no rule: it is listed here as well as above.
    if (info.differentiable && !info.backward) missing.push_back(label(i));
  }
  EXPECT_TRUE(missing.empty()) << missing.size()
                               << " differentiable ops have no backward rule: " << join(missing);
}

TEST(OpTable, NonDifferentiableOpsAreTheExpectedOnes) {
  // Gradient-only ops, structural nodes and set_rows (a cache write is state, not a function of the
  // parameters) are not differentiated through; the other public ops all are.
  const Op internal[] = {Op::Fill,     Op::Accumulate, Op::AuxOutput, Op::ReluBack,
                         Op::GeluBack, Op::SiluBack,   Op::MaxBack,   Op::SetRows};
  for (Op op : internal) EXPECT_FALSE(op_info(op).differentiable) << label(int(op));
  const Op pub[] = {Op::View,  Op::Cont, Op::Concat,  Op::Add, Op::Sub,    Op::Mul,      Op::Div,
                    Op::Scale, Op::Tanh, Op::SumRows, Op::Max, Op::Repeat, Op::ReduceTo, Op::SliceBack};
  for (Op op : pub) EXPECT_TRUE(op_info(op).differentiable) << label(int(op));
}

TEST(OpTable, EnumNamesAreReadFromOpH) {
  // Every enumerator and Count, in order: a misread list would point messages at the wrong op.
  ASSERT_EQ(enum_names().size(), size_t(kOpCount) + 1);
  EXPECT_EQ(enum_names().back(), "Count");
  EXPECT_EQ(enum_name(Op::None), "Op::None");
  EXPECT_EQ(enum_name(Op::Add), "Op::Add");
  EXPECT_EQ(enum_name(Op::MaxBack), "Op::MaxBack");
  EXPECT_EQ(enum_name(Op::Matmul), "Op::Matmul");
  EXPECT_EQ(enum_name(Op::TopKDistill), "Op::TopKDistill");
  EXPECT_EQ(enum_name(Op(kOpCount - 1)), "Op::" + enum_names()[size_t(kOpCount) - 1]);
}

TEST(OpTable, LeafEntry) {
  EXPECT_STREQ(op_name(Op::None), "leaf");
  EXPECT_EQ(op_info(Op::None).cpu, nullptr);
  EXPECT_FALSE(op_info(Op::None).differentiable);
}

TEST(OpTable, NamesMatchTheOpConstructors) {
  // Spot checks that the table's names are the ones errors and the API use.
  EXPECT_STREQ(op_name(Op::Add), "add");
  EXPECT_STREQ(op_name(Op::SumRows), "sum_rows");
  EXPECT_STREQ(op_name(Op::View), "view");
  EXPECT_STREQ(op_name(Op::Cont), "contiguous");
  EXPECT_STREQ(op_name(Op::Concat), "concat");
}

TEST(OpTable, RunningAnOpWithoutKernelThrows) {
  // The CPU backend refuses an op it has no kernel for with an error, never a crash (a leaf has none).
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.input(DType::F32, {2}, "x");
  int64_t ne[kMaxDims] = {2, 1, 1, 1};
  Tensor* n = ctx.node(Op::None, DType::F32, ne);
  n->src[0] = x;
  n->data = x->data;
  EXPECT_THROW(default_cpu_backend().run(n), Error);
}

}  // namespace
}  // namespace retort::test
