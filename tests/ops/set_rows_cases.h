// The set_rows case list, run on every backend (tests/ops/test_set_rows.cpp on the CPU, tests/cuda on the
// device): each case fills a destination, writes rows at distinct run-time ids twice (new rows and ids on the
// second run, so the first run's rows must persist where not overwritten), and returns what a reader of the
// result saw and what the destination holds, with the float64 reference of both.
#pragma once
#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "harness.h"

namespace retort::test {

struct SetRowsCase {
  std::string name;
  DType dst = DType::F32, src = DType::F32, ids = DType::I32;
  int64_t R = 9, D = 7, n = 4;  // dst [.., R, D], src [.., n, D]
  int64_t b2 = 1, b3 = 1;       // batch dims of dst and src
  bool ids_per_batch = false;   // ids [b3, b2, n] instead of [n]
  bool strided = false;         // dst a column window of a wider leaf, src a transposed view
};

inline std::vector<SetRowsCase> set_rows_cases() {
  std::vector<SetRowsCase> v;
  v.push_back({"set_rows_f32"});
  v.push_back({"set_rows_one_row", DType::F32, DType::F32, DType::I32, 5, 3, 1});
  v.push_back({"set_rows_all_rows", DType::F32, DType::F32, DType::I64, 6, 5, 6});
  v.push_back({"set_rows_bf16_dst", DType::BF16});
  v.push_back({"set_rows_f16_dst", DType::F16});
  v.push_back({"set_rows_bf16_both", DType::BF16, DType::BF16});
  v.push_back({"set_rows_f32_from_bf16", DType::F32, DType::BF16, DType::I64});
  v.push_back({"set_rows_batch_shared_ids", DType::F32, DType::F32, DType::I32, 8, 6, 3, 2, 3});
  v.push_back({"set_rows_batch_own_ids", DType::BF16, DType::F32, DType::I64, 8, 6, 3, 3, 2, true});
  v.push_back({"set_rows_strided", DType::F32, DType::F32, DType::I32, 7, 5, 3, 2, 1, false, true});
  v.push_back({"set_rows_strided_f16", DType::F16, DType::F32, DType::I32, 7, 33, 5, 1, 2, true, true});
  v.push_back({"set_rows_long_rows", DType::BF16, DType::F32, DType::I32, 12, 1000, 4, 2});
  return v;
}

struct SetRowsResult {
  Vec got;     // per run: the reader's copy of the result, then the destination's values
  Vec expect;  // the same from the float64 reference
};

// v rounded to dtype t as a store would round it.
inline double stored_as(DType t, double v) {
  alignas(8) uint8_t buf[8];
  store_f32(buf, t, 0, float(v));
  return load_f32(buf, t, 0);
}

inline SetRowsResult run_set_rows_case(Backend& be, const SetRowsCase& c) {
  reseed(c.name);
  Context ctx(be);
  const int64_t extra = c.strided ? 3 : 0;  // the window is columns [1, 1 + D) of rows D + 3 wide
  Tensor* base = ctx.tensor(c.dst, {c.b3, c.b2, c.R, c.D + extra}, "cache");
  Tensor* dst = c.strided ? slice(ctx, base, 0, 1, c.D) : base;
  Tensor* src_leaf = c.strided ? ctx.input(c.src, {c.b3, c.b2, c.D, c.n}, "src")
                               : ctx.input(c.src, {c.b3, c.b2, c.n, c.D}, "src");
  Tensor* src = c.strided ? transpose(ctx, src_leaf) : src_leaf;
  Tensor* ids = c.ids_per_batch ? ctx.input(c.ids, {c.b3, c.b2, c.n}, "ids") : ctx.input(c.ids, {c.n}, "ids");
  Tensor* written = set_rows(ctx, dst, src, ids);
  Tensor* reader = cast(ctx, written, DType::F32);  // a later op must see the new rows
  reader->flags |= kOutput;
  Graph g(ctx);
  g.forward(reader);
  g.set_poison(true);

  Vec init = random_vec(base->nelements(), -2, 2);
  set_data(base, std::vector<float>(init.begin(), init.end()));
  Ref ref;  // dst's values as stored, ggml order
  for (int d = 0; d < 4; ++d) ref.ne[d] = dst->ne[d];
  ref.v = to_f64(get_data(dst));
  SetRowsResult r;
  for (int run = 0; run < 2; ++run) {
    Vec sv = random_vec(src_leaf->nelements(), -3, 3);
    set_data(src_leaf, std::vector<float>(sv.begin(), sv.end()));
    const Vec s = to_f64(get_data(src));  // src's values as stored, in its logical order
    // Distinct ids per batch: the first n of a shuffle of [0, R).
    const int64_t id_batches = c.ids_per_batch ? c.b2 * c.b3 : 1;
    std::vector<int64_t> idv;
    for (int64_t b = 0; b < id_batches; ++b) {
      std::vector<int64_t> perm(size_t(c.R));
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng());
      idv.insert(idv.end(), perm.begin(), perm.begin() + c.n);
    }
    set_data_int(ids, idv);
    g.compute();
    for (int64_t i3 = 0; i3 < c.b3; ++i3)
      for (int64_t i2 = 0; i2 < c.b2; ++i2)
        for (int64_t i = 0; i < c.n; ++i) {
          const int64_t id = idv[size_t(c.ids_per_batch ? (i3 * c.b2 + i2) * c.n + i : i)];
          for (int64_t k = 0; k < c.D; ++k)
            ref.at(k, id, i2, i3) = stored_as(c.dst, s[size_t(((i3 * c.b2 + i2) * c.n + i) * c.D + k)]);
        }
    const Vec seen = to_f64(get_data(reader)), held = to_f64(get_data(dst));
    r.got.insert(r.got.end(), seen.begin(), seen.end());
    r.got.insert(r.got.end(), held.begin(), held.end());
    r.expect.insert(r.expect.end(), ref.v.begin(), ref.v.end());
    r.expect.insert(r.expect.end(), ref.v.begin(), ref.v.end());
  }
  return r;
}

}  // namespace retort::test
