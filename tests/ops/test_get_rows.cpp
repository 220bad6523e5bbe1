// get_rows: forward against float64, the scatter-add gradient against central differences (ids repeat, so
// rows collect several contributions), multi-dim ids, strided tables and ids, bf16 tables, ids out of range
// at run time, bad shapes, and a gradient that is bit-identical for any thread count.
#include <gtest/gtest.h>

#include <cstring>

#include "harness.h"
#include "expect_error.h"

namespace retort::test {
namespace {

// Reference: out(i0, r) = table(i0, ids[r]) with the ids flattened in ggml order.
Vec gather(const Ref& table, const Ref& ids) {
  const int64_t d = table.ne[0];
  Vec out;
  out.reserve(size_t(d * ids.size()));
  for (double id : ids.v)
    for (int64_t i = 0; i < d; ++i) out.push_back(table.at(i, int64_t(id)));
  return out;
}

// The message of the retort::Error that f throws (a failure if it throws nothing or something else).
void expect_mentions(const std::string& msg, std::initializer_list<const char*> parts) {
  for (const char* p : parts)
    EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' missing from: " << msg;
}

OpCase plain_case(const std::string& name, int64_t rows, int64_t d, Shape ids_shape, DType ids_type) {
  OpCase c;
  c.name = name;
  c.inputs = {{Shape{rows, d}}, {ids_shape, ids_type, false, 0, double(rows)}};
  c.build = [](Context& ctx, const std::vector<Tensor*>& in) { return get_rows(ctx, in[0], in[1]); };
  c.reference = [](const std::vector<Ref>& in) { return gather(in[0], in[1]); };
  c.fwd_tol = 0;  // a copy: exact
  c.grad_tol = 1e-10;
  return c;
}

TEST(GetRows, MatchesReferenceAndGradients) {
  // More ids than rows, so ids repeat and the scatter-add sums several gradient rows into one.
  EXPECT_TRUE(run_case(plain_case("get_rows_5x3_7", 5, 3, {7}, DType::I32)));
  EXPECT_TRUE(run_case(plain_case("get_rows_one_row", 1, 4, {3}, DType::I32)));
  EXPECT_TRUE(run_case(plain_case("get_rows_d1", 10, 1, {4}, DType::I32)));
  EXPECT_TRUE(run_case(plain_case("get_rows_d13", 6, 13, {20}, DType::I32)));
  EXPECT_TRUE(run_case(plain_case("get_rows_one_id", 6, 5, {1}, DType::I32)));
}

TEST(GetRows, I64Ids) {
  EXPECT_TRUE(run_case(plain_case("get_rows_i64", 9, 6, {11}, DType::I64)));
}

TEST(GetRows, TwoDimIdsGiveBatchTimeRows) {
  OpCase c = plain_case("get_rows_bt", 7, 5, {3, 4}, DType::I32);
  EXPECT_TRUE(run_case(c));
  Context ctx(default_cpu_backend());
  Tensor* out = get_rows(ctx, ctx.tensor(DType::F32, {7, 5}), ctx.tensor(DType::I32, {3, 4}));
  EXPECT_EQ(out->shape(), (Shape{3, 4, 5}));
}

TEST(GetRows, ThreeDimIdsGiveFourDimResult) {
  EXPECT_TRUE(run_case(plain_case("get_rows_3d", 4, 3, {2, 3, 2}, DType::I64)));
}

TEST(GetRows, TransposedTable) {
  // The table is read through a transposed view: element (i, r) of the view sits at stride R * 4 bytes.
  OpCase c;
  c.name = "get_rows_transposed_table";
  c.inputs = {{Shape{4, 6}}, {Shape{9}, DType::I32, false, 0, 6}};  // stored [D = 4, R = 6]
  c.build = [](Context& ctx, const std::vector<Tensor*>& in) {
    return get_rows(ctx, transpose(ctx, in[0]), in[1]);
  };
  c.reference = [](const std::vector<Ref>& in) {
    const Ref& s = in[0];  // ne = {6, 4}: s.at(r, i) is row r, column i of the view
    Vec out;
    for (double id : in[1].v)
      for (int64_t i = 0; i < s.ne[1]; ++i) out.push_back(s.at(int64_t(id), i));
    return out;
  };
  c.fwd_tol = 0;
  c.grad_tol = 1e-10;
  EXPECT_TRUE(run_case(c));
}

TEST(GetRows, SlicedTableColumns) {
  OpCase c;
  c.name = "get_rows_sliced_table";
  c.inputs = {{Shape{5, 8}}, {Shape{6}, DType::I32, false, 0, 5}};
  // Columns 2..6 of each row: a view whose rows are strided by the full width.
  c.build = [](Context& ctx, const std::vector<Tensor*>& in) {
    return get_rows(ctx, slice(ctx, in[0], 0, 2, 5), in[1]);
  };
  c.reference = [](const std::vector<Ref>& in) {
    Vec out;
    for (double id : in[1].v)
      for (int64_t i = 2; i < 7; ++i) out.push_back(in[0].at(i, int64_t(id)));
    return out;
  };
  c.fwd_tol = 0;
  c.grad_tol = 1e-10;
  EXPECT_TRUE(run_case(c));
}

TEST(GetRows, TransposedIds) {
  OpCase c;
  c.name = "get_rows_transposed_ids";
  c.inputs = {{Shape{8, 3}}, {Shape{4, 2}, DType::I64, false, 0, 8}};  // ids stored [4, 2], used as [2, 4]
  c.build = [](Context& ctx, const std::vector<Tensor*>& in) {
    return get_rows(ctx, in[0], transpose(ctx, in[1]));
  };
  c.reference = [](const std::vector<Ref>& in) {
    const Ref& ids = in[1];  // ne = {2, 4}; the view has ne = {4, 2}
    Vec out;
    for (int64_t j = 0; j < ids.ne[0]; ++j)
      for (int64_t i = 0; i < ids.ne[1]; ++i)
        for (int64_t k = 0; k < in[0].ne[0]; ++k) out.push_back(in[0].at(k, int64_t(ids.at(j, i))));
    return out;
  };
  c.fwd_tol = 0;
  c.grad_tol = 1e-10;
  EXPECT_TRUE(run_case(c));
}

TEST(GetRows, Bf16Table) {
  OpCase c = plain_case("get_rows_bf16", 6, 7, {10}, DType::I32);
  c.inputs[0].dtype = DType::BF16;
  c.fwd_tol = 0;       // the stored bf16 values are copied exactly
  c.grad_tol = 1e-10;  // the gradient accumulates in f32 whatever the table's dtype
  EXPECT_TRUE(run_case(c));
  Context ctx(default_cpu_backend());
  EXPECT_EQ(get_rows(ctx, ctx.tensor(DType::BF16, {3, 2}), ctx.tensor(DType::I32, {2}))->dtype, DType::BF16);
}

// Builds table [rows, d] and ids [n], fills them, and computes get_rows; returns the error message if any.
std::string run_with_ids(DType ids_type, int64_t rows, const std::vector<int64_t>& ids) {
  Context ctx(default_cpu_backend());
  Tensor* table = ctx.input(DType::F32, {rows, 3}, "table");
  set_data(table, std::vector<float>(size_t(rows * 3), 0.5f));
  Tensor* id = ctx.input(ids_type, {int64_t(ids.size())}, "ids");
  set_data_int(id, ids);
  Tensor* out = get_rows(ctx, table, id);
  Graph g(ctx);
  g.forward(out);
  return error_of([&] { g.compute(); });
}

TEST(GetRows, IdOutOfRangeThrowsAtRunTime) {
  // Many ids so the bad one lands in a worker thread's share: the pool must carry the error back.
  std::vector<int64_t> ids(4000, 2);
  ids[3777] = 5;
  std::string m = run_with_ids(DType::I32, 5, ids);
  expect_mentions(m, {"get_rows", "id 5", "R = 5", "3777"});
  ids[3777] = -1;
  m = run_with_ids(DType::I64, 5, ids);
  expect_mentions(m, {"get_rows", "id -1", "R = 5"});
  m = run_with_ids(DType::I64, 5, {int64_t(1) << 40});
  expect_mentions(m, {"get_rows", "1099511627776"});
}

TEST(GetRows, IdsAreCheckedOnEveryRun) {
  // Ids are an input refilled between runs of one graph: a bad id on a later run must still be caught.
  Context ctx(default_cpu_backend());
  Tensor* table = ctx.param(DType::F32, {4, 2}, "table");
  Tensor* ids = ctx.input(DType::I32, {3}, "ids");
  set_data_int(ids, {0, 1, 2});
  Graph g(ctx);
  g.backward(sum(ctx, get_rows(ctx, table, ids)));
  g.compute();
  set_data_int(ids, {0, 4, 2});
  std::string m = error_of([&] { g.compute(); });
  expect_mentions(m, {"get_rows", "id 4", "R = 4"});
}

TEST(GetRows, BadShapesAndDtypesThrow) {
  Context ctx(default_cpu_backend());
  Tensor* table = ctx.tensor(DType::F32, {6, 4});
  std::string m = error_of([&] { get_rows(ctx, table, ctx.tensor(DType::F32, {3})); });
  expect_mentions(m, {"get_rows", "f32[3]", "i32 or i64"});
  m = error_of([&] { get_rows(ctx, ctx.tensor(DType::F32, {2, 6, 4}), ctx.tensor(DType::I32, {3})); });
  expect_mentions(m, {"get_rows", "[2, 6, 4]", "2-D"});
  m = error_of([&] { get_rows(ctx, ctx.tensor(DType::I32, {6, 4}), ctx.tensor(DType::I32, {3})); });
  expect_mentions(m, {"get_rows", "i32[6, 4]", "float"});
  m = error_of([&] { get_rows(ctx, table, ctx.tensor(DType::I32, {2, 2, 2, 2})); });
  expect_mentions(m, {"get_rows", "[2, 2, 2, 2]"});
}

// Computes the table gradient of sum(get_rows(table, ids) * w) on a backend with the given thread count.
std::vector<uint8_t> scatter_grad(CpuBackend& be, int64_t rows, int64_t d, const std::vector<int64_t>& ids,
                                  const std::vector<float>& w) {
  Context ctx(be);
  Tensor* table = ctx.param(DType::F32, {rows, d}, "table");
  Tensor* id = ctx.input(DType::I32, {int64_t(ids.size())}, "ids");
  set_data_int(id, ids);
  Tensor* wt = ctx.input(DType::F32, {int64_t(ids.size()), d}, "w");
  set_data(wt, w);
  Graph g(ctx);
  g.backward(sum(ctx, mul(ctx, get_rows(ctx, table, id), wt)));
  g.set_poison(true);
  g.compute();
  return get_bytes(g.grad(table));
}

TEST(GetRows, ScatterAddIsDeterministicAcrossThreadCounts) {
  reseed("get_rows_determinism");
  const int64_t rows = 7, d = 33, n = 6000;
  std::vector<int64_t> ids = random_ints(n, 0, rows - 1);  // the last row is never picked
  Vec wd = random_vec(n * d, -1, 1);
  std::vector<float> w(wd.begin(), wd.end());
  CpuBackend one(1), four(4);
  std::vector<uint8_t> a = scatter_grad(one, rows, d, ids, w);
  std::vector<uint8_t> b = scatter_grad(four, rows, d, ids, w);
  std::vector<uint8_t> c = scatter_grad(four, rows, d, ids, w);
  ASSERT_EQ(a.size(), size_t(rows * d * 4));
  EXPECT_EQ(a, b) << "the scatter-add differs between 1 and 4 threads";
  EXPECT_EQ(b, c) << "the scatter-add differs between two runs";

  // And it is the sum (f32 rounding aside), with exact zeros for the row no id names.
  std::vector<float> got(size_t(rows * d));
  std::memcpy(got.data(), a.data(), a.size());
  Vec expect(size_t(rows * d), 0.0);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < d; ++i) expect[size_t(ids[size_t(r)] * d + i)] += w[size_t(r * d + i)];
  EXPECT_LE(nmse(to_f64(got), expect), 1e-12);
  for (int64_t i = 0; i < d; ++i) EXPECT_EQ(got[size_t((rows - 1) * d + i)], 0.0f);
}

}  // namespace
}  // namespace retort::test
