// The topk_logprobs cases every backend runs — tests/ops/test_topk.cpp on the CPU against the float64
// reference here, tests/cuda/test_cuda_topk.cpp on CUDA against the CPU — with their inputs (random, ties,
// signed zeros, -inf, sorted rows, peaks one CUDA thread would hold, ±1e4) and layouts (contiguous, rows
// read through a transposed view, rows cut from wider ones).
#pragma once
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "harness.h"

namespace retort::test {

enum class TopKFill {
  Uniform,      // U(-4, 4)
  Normal,       // N(0, 3²): a long upper tail, like logits
  Ties,         // integers 0..3: most entries tie, the K-th value among them
  SignedZeros,  // -0, +0, -1, 0.5: -0 and +0 are equal values, ordered by id
  NegInf,       // 30 % -inf; row 0 all -inf, row 1 two finite entries
  Rising,       // ascending rows: every entry beats the ones before it
  Falling,      // descending rows: the best come first
  AllEqual,     // one value everywhere: the ids 0..K-1
  Huge,         // U(-1e4, 1e4)
  Peaks,        // U(-4, 0) with peaks every 4096 columns and a block of 40 in a row
};

enum class TopKLayout {
  Contiguous,
  Transposed,  // stored [V, N], read through transpose(): elements strided by N
  Sliced,      // columns [5, 5 + V) of rows of V + 12: rows strided, starts unaligned
};

struct TopKCase {
  std::string name;
  int64_t n = 1, v = 1, k = 1;
  DType dtype = DType::F32;
  TopKFill fill = TopKFill::Uniform;
  TopKLayout layout = TopKLayout::Contiguous;
};
// Names the case in gtest's messages.
inline std::ostream& operator<<(std::ostream& os, const TopKCase& c) {
  return os << c.name;
}

// The case list: small and odd shapes, K = 1 and K = V, V = 49152 and 151936 with K = 64, every dtype and
// layout, and every fill.
std::vector<TopKCase> topk_cases();

// A case's logits on ctx's backend (values drawn from the case's name) and their stored values as float64,
// row-major [n][v] (rounded to the dtype as stored).
struct TopKInput {
  Tensor* logits = nullptr;
  Vec values;
};
TopKInput make_topk_input(Context& ctx, const TopKCase& c);

struct TopKResult {
  std::vector<float> logprobs;  // [n][k]
  std::vector<int64_t> ids;     // [n][k]
};
// Float64 reference by sorting each row: (value desc, id asc); logprobs x - (max + log Σ exp(x - max)); a row
// of -inf only gives -inf and ids 0..k-1.
TopKResult topk_reference(const Vec& values, int64_t n, int64_t v, int64_t k);
// Builds and computes topk_logprobs for the case on backend.
TopKResult run_topk(Backend& backend, const TopKCase& c);

}  // namespace retort::test
