// The fused_linear_topk_logprobs cases every backend runs — tests/ops/test_fused_topk_head.cpp on the CPU,
// tests/cuda/test_cuda_topk_head.cpp on CUDA — with their inputs, a float64 reference (logits h·wᵀ in
// double, a stable sort by value, the log-sum-exp and the targets' nll), the unfused composition
// (matmul + topk_logprobs + cross_entropy_loss Sum on the same backend) and the checks between them.
#pragma once
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "harness.h"

namespace retort::test {

enum class HeadFill {
  Random,    // hidden, weight U(-1, 1): distinct logits, near ties only by chance
  Integers,  // hidden, weight small integers: every logit exact in any summation order, many equal ones
  Huge,      // hidden U(-30, 30), weight U(-30, 30): logits of ±1e4
};

struct HeadCase {
  std::string name;
  int64_t n = 1, v = 1, h = 1, k = 1;
  DType dtype = DType::F32;  // of hidden and weight
  HeadFill fill = HeadFill::Random;
  int64_t chunk_rows = 0;    // > 0: forced; 0: from logits_budget
  size_t logits_budget = 0;  // 0: automatic
  bool targets = true;
  int64_t ignore_every = 0;  // > 0: every such row's target is ignore_index (-100)
};
inline std::ostream& operator<<(std::ostream& os, const HeadCase& c) {
  return os << c.name;
}

// Small and odd shapes, V not a multiple of anything, K = 1 and K = V, ties, ignored rows, no targets,
// several chunks (forced and from a small budget) and one, bf16 and f16 inputs, SmolLM2's V = 49,152.
std::vector<HeadCase> head_cases();

// A case's inputs as float64 values of what is stored (rounded to the dtype): hidden [n][h], weight [v][h],
// targets [n] (-100 for ignored rows).
struct HeadInput {
  Vec hidden, weight;
  std::vector<int64_t> targets;
};
HeadInput make_head_input(const HeadCase& c);

struct HeadResult {
  std::vector<float> logprobs;  // [n][k]
  std::vector<int64_t> ids;     // [n][k]
  std::vector<float> lse;       // [n]
  double nll = 0;               // the summed nll (0 without targets)
  int64_t valid = 0;            // reference only: rows with a target that counts
  Vec logits;                   // reference only: [n][v] float64
};
// Float64 reference.
HeadResult head_reference(const HeadCase& c, const HeadInput& in);
// fused_linear_topk_logprobs on backend, every output poisoned before the run.
HeadResult run_head(Backend& backend, const HeadCase& c, const HeadInput& in);
// matmul + topk_logprobs + cross_entropy_loss(Sum, return_lse) on backend.
HeadResult run_unfused(Backend& backend, const HeadCase& c, const HeadInput& in);

// Checks got against the float64 reference: every slot's logprob within tol of ref logits[id] − lse, ids
// distinct and ordered (a slot's reference logit never more than tol below the next one's, and the reference
// K-th best never more than tol above the worst chosen), lse within tol, nll within tol·(1 + valid rows).
// exact_ids: the ids must equal the reference's (exact logits, so ties are real ties broken by id).
void expect_matches_reference(const HeadCase& c, const HeadResult& got, const HeadResult& ref, double tol,
                              bool exact_ids);
// Checks a against b (two computations of the same logits): ids equal wherever b's value at that slot is
// more than tol away from its neighbours' (a near tie may break either way), values within tol.
void expect_close(const HeadCase& c, const HeadResult& a, const HeadResult& b, double tol);

}  // namespace retort::test
