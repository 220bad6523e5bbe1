// The CPU selection of a row's K best logits, shared by topk_logprobs (src/ops/topk.cpp) and the fused
// teacher head's row kernel (src/ops/loss/topk_rows.cpp), so both order a row's top K alike: larger value
// first, equal values by smaller id.
#pragma once
#include <cstdint>
#include <vector>

namespace retort::topk {

struct Entry {
  float v;
  int32_t id;
};

// a comes before b in the output: the larger value, then the smaller id.
inline bool better(const Entry& a, const Entry& b) {
  return a.v > b.v || (a.v == b.v && a.id < b.id);
}

// Per-thread buffers of select_row, reused row after row.
struct Scratch {
  std::vector<float> block_max, nth;
  std::vector<Entry> cand;
};

// The K best entries of z[0, V) into s.cand[0, K), best first; *m = the row max and *log_s = log Σ exp(z − m)
// (summed in double; 0 for a row of -inf only). z is overwritten by the exponentials (a NaN stays NaN there,
// so a caller can find its column). Returns false, with the outputs unspecified, when the row holds NaN or
// +inf. Requires 1 <= K <= V.
bool select_row(float* z, int64_t V, int64_t K, Scratch& s, float* m, double* log_s);

}  // namespace retort::topk
