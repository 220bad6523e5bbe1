// set_rows: the case list (set_rows_cases.h) against its float64 reference, readers ordered after the write,
// the destination persisting across runs, chained writes, no memory of its own in the plan, ids out of range
// at run time (the destination left as it was), bad shapes and dtypes, and no gradient through it.
#include <gtest/gtest.h>

#include <algorithm>

#include "harness.h"
#include "set_rows_cases.h"
#include "expect_error.h"

namespace retort::test {
namespace {

void expect_mentions(const std::string& msg, std::initializer_list<const char*> parts) {
  for (const char* p : parts)
    EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' missing from: " << msg;
}

TEST(SetRows, CasesMatchTheReference) {
  for (const SetRowsCase& c : set_rows_cases()) {
    SCOPED_TRACE(c.name);
    const SetRowsResult r = run_set_rows_case(default_cpu_backend(), c);
    ASSERT_EQ(r.got.size(), r.expect.size());
    EXPECT_EQ(max_abs_diff(r.got, r.expect), 0.0) << "a copy (rounded to dst's dtype) must be exact";
  }
}

TEST(SetRows, ChainedWritesAndAReaderInTheSameGraph) {
  // Two writes into one cache, then a get_rows that reads rows from both: the second write sees the first's
  // result as its destination, and the reader runs after both.
  Context ctx(default_cpu_backend());
  Tensor* cache = ctx.tensor(DType::F32, {5, 2}, "cache");
  Tensor* a = ctx.input(DType::F32, {1, 2}, "a");
  Tensor* b = ctx.input(DType::F32, {2, 2}, "b");
  Tensor* ia = ctx.input(DType::I32, {1}, "ia");
  Tensor* ib = ctx.input(DType::I64, {2}, "ib");
  Tensor* pick = ctx.input(DType::I32, {3}, "pick");
  set_data(a, {1, 2});
  set_data(b, {3, 4, 5, 6});
  set_data_int(ia, {4});
  set_data_int(ib, {0, 2});
  set_data_int(pick, {4, 2, 1});
  Tensor* out = get_rows(ctx, set_rows(ctx, set_rows(ctx, cache, a, ia), b, ib), pick);
  out->flags |= kOutput;
  Graph g(ctx);
  g.forward(out);
  g.compute();
  EXPECT_EQ(get_data(out), (std::vector<float>{1, 2, 5, 6, 0, 0}));
  EXPECT_EQ(get_data(cache), (std::vector<float>{3, 4, 0, 0, 5, 6, 0, 0, 1, 2}));
  // The writes own no memory in the plan: they are the cache.
  for (const PlanSlot& s : g.plan().slots) EXPECT_NE(s.tensor->op, Op::SetRows);
  // A later run writes other rows; the earlier ones stay.
  set_data(a, {7, 8});
  set_data_int(ia, {1});
  set_data_int(ib, {3, 0});
  g.compute();
  EXPECT_EQ(get_data(cache), (std::vector<float>{5, 6, 7, 8, 5, 6, 3, 4, 1, 2}));
  EXPECT_EQ(get_data(out), (std::vector<float>{1, 2, 5, 6, 7, 8}));
}

TEST(SetRows, ResultAliasesTheDestination) {
  Context ctx(default_cpu_backend());
  Tensor* cache = ctx.tensor(DType::BF16, {2, 6, 4}, "cache");
  Tensor* win = slice(ctx, cache, 1, 2, 3);  // rows 2..4 of each batch
  Tensor* t = set_rows(ctx, win, ctx.input(DType::F32, {2, 1, 4}, "src"), ctx.input(DType::I32, {1}, "ids"));
  EXPECT_EQ(t->shape(), win->shape());
  EXPECT_EQ(t->dtype, DType::BF16);
  EXPECT_TRUE(t->is_view());
  EXPECT_EQ(t->view_src, cache);
  EXPECT_EQ(t->view_offs, win->view_offs);
  for (int d = 0; d < kMaxDims; ++d) EXPECT_EQ(t->nb[d], win->nb[d]);
}

// Runs set_rows with the given ids into a cache of `rows` rows; returns the error and the cache afterwards.
std::pair<std::string, std::vector<float>> run_ids(DType ids_type, int64_t rows,
                                                   const std::vector<int64_t>& ids) {
  Context ctx(default_cpu_backend());
  Tensor* cache = ctx.tensor(DType::F32, {rows, 2}, "cache");
  set_data(cache, std::vector<float>(size_t(rows * 2), 0.5f));
  const int64_t n = int64_t(ids.size());
  Tensor* src = ctx.input(DType::F32, {n, 2}, "src");
  set_data(src, std::vector<float>(size_t(n * 2), 9.0f));
  Tensor* id = ctx.input(ids_type, {n}, "ids");
  set_data_int(id, ids);
  Graph g(ctx);
  g.forward(set_rows(ctx, cache, src, id));
  std::string msg = error_of([&] { g.compute(); });
  return {msg, get_data(cache)};
}

TEST(SetRows, IdOutOfRangeThrowsAtRunTimeAndWritesNothing) {
  std::vector<int64_t> ids(3000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int64_t(i);
  ids[2777] = 3000;
  auto [m, cache] = run_ids(DType::I32, 3000, ids);
  expect_mentions(m, {"set_rows", "id 3000", "position 2777", "R = 3000"});
  EXPECT_TRUE(std::all_of(cache.begin(), cache.end(), [](float v) { return v == 0.5f; }))
      << "a bad id must leave the cache as it was";
  std::tie(m, cache) = run_ids(DType::I64, 4, {1, -1});
  expect_mentions(m, {"set_rows", "id -1", "[0, 4)"});
  std::tie(m, cache) = run_ids(DType::I64, 4, {int64_t(1) << 40});
  expect_mentions(m, {"set_rows", "1099511627776"});
}

TEST(SetRows, BadShapesAndDtypesThrow) {
  Context ctx(default_cpu_backend());
  Tensor* cache = ctx.tensor(DType::F32, {6, 4}, "cache");
  Tensor* src = ctx.tensor(DType::F32, {2, 4}, "src");
  Tensor* ids = ctx.tensor(DType::I32, {2}, "ids");
  std::string m = error_of([&] { set_rows(ctx, cache, src, ctx.tensor(DType::F32, {2})); });
  expect_mentions(m, {"set_rows", "f32[2]", "i32 or i64"});
  m = error_of([&] { set_rows(ctx, cache, src, ctx.tensor(DType::I32, {3})); });
  expect_mentions(m, {"set_rows", "i32[3]", "n = 2"});
  m = error_of([&] { set_rows(ctx, cache, ctx.tensor(DType::F32, {2, 5}), ids); });
  expect_mentions(m, {"set_rows", "[2, 5]", "[6, 4]", "D"});
  m = error_of([&] { set_rows(ctx, ctx.tensor(DType::F32, {2, 6, 4}), src, ids); });
  expect_mentions(m, {"set_rows", "[2, 6, 4]", "batch dims"});
  m = error_of([&] { set_rows(ctx, ctx.tensor(DType::I32, {6, 4}), src, ids); });
  expect_mentions(m, {"set_rows", "i32[6, 4]", "float"});
  m = error_of([&] { set_rows(ctx, cache, ctx.tensor(DType::I64, {2, 4}), ids); });
  expect_mentions(m, {"set_rows", "src", "float"});
  m = error_of([&] {
    Tensor* c3 = ctx.tensor(DType::F32, {3, 6, 4}, "c3");
    set_rows(ctx, c3, ctx.tensor(DType::F32, {3, 2, 4}), ctx.tensor(DType::I32, {2, 2}));
  });
  expect_mentions(m, {"set_rows", "[2, 2]", "batch dim"});
  m = error_of([&] { set_rows(ctx, add(ctx, cache, cache), src, ids); });
  expect_mentions(m, {"set_rows", "leaf", "outlives"});
  m = error_of([&] { set_rows(ctx, nullptr, src, ids); });
  expect_mentions(m, {"set_rows", "null"});
}

TEST(SetRows, HasNoGradient) {
  Context ctx(default_cpu_backend());
  Tensor* w = ctx.param(DType::F32, {4, 3}, "w");
  Tensor* x = ctx.input(DType::F32, {2, 3}, "x");
  Tensor* cache = ctx.tensor(DType::F32, {5, 4}, "cache");
  Tensor* ids = ctx.input(DType::I32, {2}, "ids");
  Tensor* k = matmul(ctx, x, w, false, true);  // [2, 4]
  Tensor* loss = sum(ctx, set_rows(ctx, cache, k, ids));
  Graph g(ctx);
  const std::string m = error_of([&] { g.backward(loss); });
  expect_mentions(m, {"set_rows", "no gradient"});
}

}  // namespace
}  // namespace retort::test
