// The CUDA launcher table against the op list (src/core/op_list.h): every op marked Every has a CUDA kernel,
// and an op without one is marked CpuOnly (or Structural), so a new op that forgets its CUDA launcher, or its
// mark, fails here. Asks no device: it runs wherever retort was built with CUDA.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "core/op.h"
#include "core/op_table.h"
#include "cuda/cuda_backend.h"
#include "retort_config.h"

namespace retort::test {
namespace {

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

TEST(CudaLaunchers, EveryOpHasOneOrIsMarkedWithout) {
  if (!RETORT_HAS_CUDA) GTEST_SKIP() << "retort was built without CUDA: there is no launcher table";
  std::vector<std::string> missing, unmarked;
  for (int i = 0; i < kOpCount; ++i) {
    const bool has = cuda_has_kernel(Op(i));
    if (kOpKernels[i] == OpKernels::Every && !has) missing.push_back(op_name(Op(i)));
    if (kOpKernels[i] != OpKernels::Every && has) unmarked.push_back(op_name(Op(i)));
  }
  EXPECT_TRUE(missing.empty())
      << "ops marked Every in src/core/op_list.h without a CUDA launcher (register one "
      << "in their src/cuda family file, or mark them CpuOnly): " << join(missing);
  EXPECT_TRUE(unmarked.empty())
      << "ops with a CUDA launcher marked CpuOnly or Structural in src/core/op_list.h: " << join(unmarked);
}

TEST(CudaLaunchers, AskingOutsideTheListThrows) {
  // Built without CUDA, every call is the stub's error; with it, an op past the list is one.
  EXPECT_THROW(cuda_has_kernel(Op::Count), Error);
  if (!RETORT_HAS_CUDA) {
    EXPECT_THROW(cuda_has_kernel(Op::Add), Error);
  }
}

}  // namespace
}  // namespace retort::test
