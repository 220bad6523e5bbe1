// Small f32 GEMMs on tiles that already sit in cache (the CPU flash attention's score, probability and
// gradient tiles): no packing, A read through any pair of strides (so Aᵀ costs nothing), B row-major with its
// width a multiple of kTileLanes (callers pad with zeros). Register-blocked with AVX-512 or AVX2+FMA when the
// CPU has them (decided once, like the GEMM's kernel), plain loops otherwise. Each C element is summed over
// t in order 0..k-1 with one FMA per term, so the result does not depend on where the tile sits or on the
// thread. Private to src/ops (and the tests).
#pragma once
#include <cstdint>

#include "vec_math.h"

namespace retort::tile {

// B's and C's widths are multiples of this many floats.
inline constexpr int64_t kTileLanes = 16;

// The same instruction sets as vmath's, chosen the same way.
using vmath::best_impl;
using vmath::Impl;
using vmath::impl_available;
using vmath::impl_name;

// C[r, c] = Σ_t a[r·ars + t·ats] · b[t·ldb + c] for r < m, c < n (n a multiple of kTileLanes), or += with
// accumulate; C's rows are ldc floats apart. k = 0 gives zeros (or leaves C as it is).
void gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t ars, int64_t ats, const float* b,
          int64_t ldb, float* c, int64_t ldc, bool accumulate, Impl impl = best_impl());

}  // namespace retort::tile
