// Helpers for CPU kernels: rows of strided tensors loaded to and stored from f32 scratch, whatever the dtype.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "../core/dtype.h"
#include "../core/tensor.h"
#include "../core/thread_pool.h"

namespace retort::cpu {

// Row r (over dims 1..3, dim 1 fastest) as (i1, i2, i3).
inline void row_coords(const Tensor* t, int64_t r, int64_t& i1, int64_t& i2, int64_t& i3) {
  i1 = r % t->ne[1];
  int64_t q = r / t->ne[1];
  i2 = q % t->ne[2];
  i3 = q / t->ne[2];
}

inline char* row_ptr(const Tensor* t, int64_t r) {
  int64_t i1, i2, i3;
  row_coords(t, r, i1, i2, i3);
  return static_cast<char*>(t->data) + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
}

// The row of b (broadcast over a) that pairs with row r of a.
inline char* broadcast_row_ptr(const Tensor* b, const Tensor* a, int64_t r) {
  int64_t i1, i2, i3;
  row_coords(a, r, i1, i2, i3);
  return static_cast<char*>(b->data) + (i1 % b->ne[1]) * b->nb[1] + (i2 % b->ne[2]) * b->nb[2] +
         (i3 % b->ne[3]) * b->nb[3];
}

// Loads n = t->ne[0] elements starting at p (stride t->nb[0]) as f32.
inline void load_row(const Tensor* t, const char* p, float* out) {
  const int64_t n = t->ne[0];
  if (t->nb[0] == t->elsize()) {
    switch (t->dtype) {
      case DType::F32: {
        const float* s = reinterpret_cast<const float*>(p);
        for (int64_t i = 0; i < n; ++i) out[i] = s[i];
        return;
      }
      case DType::BF16: {
        const uint16_t* s = reinterpret_cast<const uint16_t*>(p);
        for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(s[i]);
        return;
      }
      default: break;
    }
  }
  for (int64_t i = 0; i < n; ++i) out[i] = load_f32(p + i * t->nb[0], t->dtype, 0);
}
inline void load_row(const Tensor* t, int64_t r, float* out) { load_row(t, row_ptr(t, r), out); }

inline void store_row(const Tensor* t, char* p, const float* in) {
  const int64_t n = t->ne[0];
  if (t->nb[0] == t->elsize() && t->dtype == DType::F32) {
    float* d = reinterpret_cast<float*>(p);
    for (int64_t i = 0; i < n; ++i) d[i] = in[i];
    return;
  }
  for (int64_t i = 0; i < n; ++i) store_f32(p + i * t->nb[0], t->dtype, 0, in[i]);
}
inline void store_row(const Tensor* t, int64_t r, const float* in) { store_row(t, row_ptr(t, r), in); }

// Integer element i0 of row r (i32 or i64).
inline int64_t load_int(const Tensor* t, int64_t i0, int64_t r = 0) {
  return load_i64(row_ptr(t, r) + i0 * t->nb[0], t->dtype, 0);
}

// Runs fn(row, scratch...) over all rows of t in parallel; each worker gets `scratch_rows` f32 buffers of
// `scratch_len` floats, reused across its rows.
template <typename F>
void for_rows(ThreadPool& pool, int64_t nrows, int64_t scratch_len, int scratch_rows, F&& fn) {
  // Aim for chunks of roughly 16K elements so tiny rows do not pay a dispatch each.
  int64_t min_chunk = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, scratch_len));
  pool.parallel_for(nrows, [&](int64_t b, int64_t e) {
    std::vector<float> buf(size_t(scratch_len) * size_t(scratch_rows) + 1);
    for (int64_t r = b; r < e; ++r) fn(r, buf.data());
  }, min_chunk);
}

}  // namespace retort::cpu
