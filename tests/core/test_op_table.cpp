// The static completeness check of the op table: every op has a CPU kernel, every op marked differentiable
// has a backward rule, and the names of the op list are unique. A failure lists every op that is missing
// something, so adding an Op to src/core/op.h without registering it in its family file fails here, not in
// some later graph.
#include <gtest/gtest.h>

#include <regex>
#include <set>
#include <string>
#include <vector>

#include "core/op_table.h"
#include "harness.h"

namespace retort::test {
namespace {

// The enumerators' own names, from the op list (so a missing entry is reported by what to look for there).
const std::vector<std::string>& enum_names() {
  static const std::vector<std::string> names = {
#define RT_OP(e, name, kernels) #e,
#include "core/op_list.h"
#undef RT_OP
      "Count"};
  return names;
}

std::string enum_name(Op op) {
  const size_t i = size_t(op);
  if (i < enum_names().size()) return std::string("Op::") + enum_names()[i];
  return "op #" + std::to_string(i);
}

// "name (Op::X)" of an op, for the lists below.
std::string label(int i) {
  return std::string(op_name(Op(i))) + " (" + enum_name(Op(i)) + ")";
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

TEST(OpTable, NamesAreUniqueSnakeCase) {
  std::set<std::string> seen;
  std::vector<std::string> bad;
  const std::regex snake("[a-z][a-z0-9_]*");
  for (int i = 0; i < kOpCount; ++i) {
    const std::string n = kOpNames[i];
    if (!seen.insert(n).second || !std::regex_match(n, snake)) bad.push_back(label(i));
  }
  EXPECT_TRUE(bad.empty()) << "op names repeated or not snake_case in src/core/op_list.h: " << join(bad);
  EXPECT_STREQ(op_name(Op::Count), "?");
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

TEST(OpTable, EnumNamesFollowTheEnum) {
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

TEST(OpTable, StructuralOpsAreTheNodesThatOnlyAlias) {
  // No backend launches anything for these (the CUDA backend skips them by this list); the CPU entries of
  // the two graph nodes are no-ops.
  std::vector<std::string> structural;
  for (int i = 0; i < kOpCount; ++i)
    if (kOpKernels[i] == OpKernels::Structural) structural.push_back(enum_name(Op(i)));
  EXPECT_EQ(join(structural), "Op::None, Op::View, Op::AuxOutput");
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
