// Shared pieces of the CUDA tests: a fixture that skips visibly without a device, one backend shared by the
// op tests, and a runner that builds the same graph on the CPU and on CUDA from the same random inputs and
// compares outputs and gradients by normalized MSE.
#pragma once
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "harness.h"
#include "io/shards.h"

namespace retort::test {

// The backend every op test shares (made on first use; tests that look at allocator state make their own).
Backend& cuda_backend();

// Every CUDA test derives from this: without a usable device it skips with the reason.
class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda_available(&why)) GTEST_SKIP() << "CUDA unavailable: " << why;
  }
};

// A graph to run on both backends. Inputs are drawn from the harness generator seeded with the name, so both
// runs see the same values; float inputs marked differentiable become parameters when grads is on.
struct CompareCase {
  std::string name;
  std::vector<Input> inputs;
  std::function<Tensor*(Context&, const std::vector<Tensor*>&)> build;
  bool grads = true;
  double tol = 1e-10;       // on the nmse of the outputs, CUDA against CPU
  double grad_tol = 1e-10;  // on the nmse of each parameter gradient
};

struct GraphResult {
  Vec out;
  std::vector<Vec> grads;  // one per parameter input, in input order
};

// Builds and computes c on be (the gradients come from backward(sum(out * w)) with random weights w).
GraphResult run_graph(Backend& be, const CompareCase& c);

// Runs c on the CPU and on CUDA and EXPECTs the outputs and gradients to agree; returns false if not.
bool compare_with_cpu(const CompareCase& c);

// A directory for a test's files (token shards), removed at the end of the test.
struct ScratchDir {
  ScratchDir() {
    path = std::filesystem::temp_directory_path() / ("retort_cuda_" + std::to_string(std::random_device{}()));
    std::filesystem::create_directories(path);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  std::string file(const std::string& name) const { return (path / name).string(); }
  std::filesystem::path path;
};

// Token shards of a training test: `tokens` tokens over vocab, from a generator seeded with seed, where two
// tokens in three follow their predecessor (next = prev * mul + add mod vocab) so there is something to
// learn; a tenth held out for validation.
struct ShardRecipe {
  uint32_t seed;
  size_t tokens;
  int64_t tokens_per_shard;
  int32_t mul, add;
};
ShardSet make_shards(const ScratchDir& dir, int64_t vocab, const ShardRecipe& r);

// The message of the retort::Error f throws (a failure if it throws nothing).
std::string error_of(const std::function<void()>& f);

}  // namespace retort::test
