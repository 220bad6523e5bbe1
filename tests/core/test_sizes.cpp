// Checked size arithmetic: every finding of issue 25 that overflowed an element count, a byte size or an
// index (each crashed or wrapped before the fix), and a sweep of the public ops with sizes at the overflow
// edges (2^31, 2^32, 2^62, INT64_MAX) that must give a node of the exact shape or a retort::Error, never a
// wrapped shape. Run under ASan + UBSan by tools/test.sh, where a signed overflow is a failure too.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/checked.h"
#include "expect_error.h"
#include "harness.h"

namespace retort::test {
namespace {

constexpr int64_t k31 = int64_t(1) << 31, k32 = int64_t(1) << 32, k62 = int64_t(1) << 62;
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
const int64_t kEdges[] = {k31, k32, k62, k62 + 1, kMax, 0, -1, std::numeric_limits<int64_t>::min()};

// The exact element count of ne in 128 bits, or -1 when a dim is < 1.
__int128 exact_elements(const int64_t ne[kMaxDims]) {
  __int128 n = 1;
  for (int d = 0; d < kMaxDims; ++d) {
    if (ne[d] < 1) return -1;
    n *= ne[d];
  }
  return n;
}

// A node that was made must describe exactly what was asked for and fit a backend; its own size queries
// must then be exact.
void expect_sane(const Tensor* t) {
  const __int128 n = exact_elements(t->ne);
  ASSERT_GE(n, 1) << t->describe();
  ASSERT_LE(n * __int128(t->elsize()), __int128(kMaxTensorBytes)) << t->describe();
  EXPECT_EQ(__int128(t->nelements()), n) << t->describe();
  EXPECT_GE(__int128(t->nbytes()), __int128(t->elsize())) << t->describe();
}

TEST(CheckedSizes, HelpersThrowNamingTheContext) {
  EXPECT_EQ(checked_mul(int64_t(3), int64_t(5), "x"), 15);
  EXPECT_EQ(checked_add(size_t(3), size_t(5), "x"), 8u);
  expect_error([] { checked_mul(k32, k32, "my op ", 7); },
               {"my op 7", "4294967296 * 4294967296", "overflows"});
  expect_error([] { checked_add(kMax, int64_t(1), "adder"); }, {"adder", "overflows"});
  expect_error([] { checked_mul(size_t(1) << 40, size_t(1) << 40, "bytes"); }, {"bytes", "overflows"});
  expect_error([] { checked_bytes(-1, "reader"); }, {"reader", "-1 bytes"});
  expect_error([] { checked_bytes(kMaxTensorBytes + 1, "reader"); }, {"reader"});
  EXPECT_EQ(checked_bytes(kMaxTensorBytes, "reader"), size_t(kMaxTensorBytes));
}

// Issue 25: {2^32, 2^32} was 0 elements in a release build.
TEST(CheckedSizes, ElementCountThatWrapsIsAnError) {
  Context ctx(default_cpu_backend());
  expect_error([&] { ctx.tensor(DType::F32, {k32, k32}, "big"); }, {"big", "[4294967296, 4294967296]"});
  const int64_t ne[kMaxDims] = {k32, k32, 1, 1};
  expect_error([&] { shape_nelements(ne, "probe"); }, {"probe", "int64"});
  Tensor t;  // a record filled by hand is still counted with a check
  t.ne[0] = k32;
  t.ne[1] = k32;
  expect_error([&] { (void)t.nelements(); }, {"int64"});
}

// A shape whose bytes a backend cannot address is refused before any allocation (this one is 2^64 bytes).
TEST(CheckedSizes, BytesPastTheAddressSpaceAreRefusedBeforeAllocating) {
  Context ctx(default_cpu_backend());
  expect_error([&] { ctx.tensor(DType::F32, {k31, k31}, "w"); }, {"w", "2^48"});
  expect_error([&] { ctx.param(DType::F32, {k62}, "p"); }, {"p", "2^48"});
  expect_error([&] { ctx.input(DType::I64, {int64_t(1) << 46}, "ids"); }, {"ids", "2^48"});
  std::vector<float> host(4);
  expect_error([&] { ctx.wrap(DType::F32, {k62, 4}, host.data(), nullptr, {}, "wrapped"); }, {"wrapped"});
  expect_error(
      [&] {
        ctx.wrap(DType::F32, {2, 2}, host.data(), nullptr, {size_t(1) << 62, 4}, "strided");
      },
      {"strided"});
  EXPECT_EQ(ctx.size(), 0u) << "a refused tensor must not be left in the context";
}

// Issue 25: bytes near 2^64 wrapped to 0 in the 64-byte round-up and malloc aborted.
TEST(CheckedSizes, BackendAllocRefusesASizeThatWouldWrap) {
  Backend& be = default_cpu_backend();
  for (size_t bytes : {std::numeric_limits<size_t>::max() - 7, std::numeric_limits<size_t>::max(),
                       size_t(kMaxTensorBytes) + 1})
    expect_error([&] { be.alloc(bytes); }, {"cpu backend", "cannot allocate"});
}

// Issue 25: fill and repeat to {4, 2^62} wrote out of bounds.
TEST(CheckedSizes, FillAndRepeatToHugeShapesThrow) {
  Context ctx(default_cpu_backend());
  const int64_t ne[kMaxDims] = {k62, 4, 1, 1};
  expect_error([&] { fill(ctx, DType::F32, ne, 1.0f); }, {"fill", "int64"});
  Tensor* x = ctx.tensor(DType::F32, {4, 1}, "x");
  expect_error([&] { repeat(ctx, x, ne); }, {"repeat"});
}

// Issue 25: reshape to {2^62 + 1, 4} was accepted as 4 elements.
TEST(CheckedSizes, ReshapeWhoseCountWrapsThrows) {
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.tensor(DType::F32, {4}, "x");
  expect_error([&] { reshape(ctx, x, {k62 + 1, 4}); }, {"reshape", "int64"});
  expect_error([&] { reshape(ctx, x, {k32, k32, 1}); }, {"reshape"});
}

// Issue 25: slice(x, 0, INT64_MAX, 2) overflowed start + len in its own check.
TEST(CheckedSizes, SliceNearInt64MaxThrows) {
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.tensor(DType::F32, {3, 5}, "x");
  expect_error([&] { slice(ctx, x, 0, kMax, 2); }, {"slice", "past INT64_MAX"});
  expect_error([&] { slice(ctx, x, 0, 1, kMax); }, {"slice", "past INT64_MAX"});
  expect_error([&] { slice(ctx, x, 1, 2, kMax - 1); }, {"slice"});
  expect_error([&] { slice(ctx, x, 0, std::numeric_limits<int64_t>::min(), 2); }, {"slice"});
}

TEST(CheckedSizes, ConcatPastTheLimitThrows) {
  Context ctx(default_cpu_backend());
  const int64_t ne[kMaxDims] = {int64_t(1) << 46, 1, 1, 1};  // 2^48 bytes: the largest f32 node
  Tensor* a = fill(ctx, DType::F32, ne, 0.0f);
  expect_error([&] { concat(ctx, a, a, 0); }, {"concat", "2^48"});
}

// Issue 25: n_past = INT64_MAX overflowed query + n_past + 1 in the kernel; every key is visible instead.
TEST(CheckedSizes, CausalSoftmaxWithHugeNPastIsAPlainSoftmax) {
  Context ctx(default_cpu_backend());
  reseed("causal_huge_n_past");
  Tensor* x = ctx.tensor(DType::F32, {2, 3, 4}, "x");
  const Vec xv = random_vec(24, -2, 2);
  set_data(x, std::vector<float>(xv.begin(), xv.end()));
  Tensor* y = causal_softmax(ctx, x, 0.5f, kMax);
  y->flags |= kOutput;
  Graph g(ctx);
  g.forward(y);
  g.set_poison(true);
  g.compute();
  const std::vector<float> out = get_data(y);
  for (int r = 0; r < 6; ++r) {
    double m = -1e300, s = 0;
    for (int j = 0; j < 4; ++j) m = std::max(m, 0.5 * xv[size_t(r * 4 + j)]);
    for (int j = 0; j < 4; ++j) s += std::exp(0.5 * xv[size_t(r * 4 + j)] - m);
    for (int j = 0; j < 4; ++j)
      EXPECT_NEAR(out[size_t(r * 4 + j)], std::exp(0.5 * xv[size_t(r * 4 + j)] - m) / s, 1e-6)
          << "row " << r << " key " << j;
  }
}

// ---- the bad-argument sweep ------------------------------------------------------------------------------

// Every public op given operands or size arguments at the overflow edges: each call either throws
// retort::Error or makes a node whose shape is exactly right and addressable. Nodes are built, never run,
// so shapes of many GiB cost nothing.
TEST(BadArguments, PublicOpsAtTheOverflowEdges) {
  Context ctx(default_cpu_backend());
  int made = 0, refused = 0;
  auto attempt = [&](const char* what, auto&& f) {
    try {
      Tensor* t = f();
      ASSERT_NE(t, nullptr) << what;
      expect_sane(t);
      ++made;
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).find("internal error"), std::string::npos) << what << ": " << e.what();
      ++refused;
    }
  };
  Tensor* small = ctx.tensor(DType::F32, {2, 3}, "small");
  Tensor* ids = ctx.tensor(DType::I32, {3}, "ids");
  for (int64_t e : kEdges) {
    for (int pos = 0; pos < kMaxDims; ++pos) {
      int64_t ne[kMaxDims] = {1, 1, 1, 1};
      ne[pos] = e;
      int64_t ne2[kMaxDims] = {2, 1, 1, 1};
      ne2[pos] = e;
      attempt("fill", [&] { return fill(ctx, DType::F32, ne, 1.0f); });
      attempt("fill 2", [&] { return fill(ctx, DType::BF16, ne2, 1.0f); });
      attempt("repeat", [&] { return repeat(ctx, ctx.tensor(DType::F32, {1}, ""), ne); });
      attempt("reduce_to", [&] { return reduce_to(ctx, small, ne); });
      attempt("slice start", [&] { return slice(ctx, small, pos, e, 1); });
      attempt("slice len", [&] { return slice(ctx, small, pos, 1, e); });
      attempt("slice both", [&] { return slice(ctx, small, pos, e, e); });
      attempt("reshape", [&] { return reshape(ctx, small, {e, 6}); });
      attempt("reshape 2", [&] { return reshape(ctx, small, {e, e, e}); });
      attempt("causal_softmax", [&] { return causal_softmax(ctx, small, 1.0f, e); });
      // A huge but addressable operand (a node, never run) through every shape rule.
      Tensor* big = nullptr;
      try {
        big = fill(ctx, DType::F32, ne, 0.0f);
      } catch (const Error&) {
        continue;
      }
      attempt("concat", [&] { return concat(ctx, big, big, pos); });
      attempt("concat small", [&] { return concat(ctx, big, small, 0); });
      for (auto unary : {&neg, &exp, &log, &sqrt, &rsqrt, &tanh, &relu, &gelu, &silu, &sum_rows, &mean_rows,
                         &max_rows, &sum, &mean, &max, &softmax, &log_softmax, &contiguous, &transpose})
        attempt("unary", [&] { return unary(ctx, big); });
      attempt("add", [&] { return add(ctx, big, big); });
      attempt("mul broadcast", [&] { return mul(ctx, big, ctx.tensor(DType::F32, {1}, "")); });
      attempt("scale", [&] { return scale(ctx, big, 2.0f); });
      attempt("cast", [&] { return cast(ctx, big, DType::BF16); });
      attempt("permute", [&] { return permute(ctx, big, 3, 2, 1, 0); });
      attempt("matmul", [&] { return matmul(ctx, big, big, false, true); });
      attempt("matmul t", [&] { return matmul(ctx, big, big, true, false); });
      attempt("rms_norm", [&] { return rms_norm(ctx, big, 1e-6f); });
      attempt("layer_norm", [&] { return layer_norm(ctx, big, 1e-5f); });
      attempt("get_rows", [&] { return get_rows(ctx, big, ids); });
      attempt("cross_entropy", [&] { return cross_entropy(ctx, big, ids); });
      attempt("causal_softmax big", [&] { return causal_softmax(ctx, big, 1.0f, e); });
      attempt("slice big", [&] { return slice(ctx, big, pos, e - 1, 1); });
    }
  }
  EXPECT_GT(made, 0);
  EXPECT_GT(refused, 0);
}

// Found by tests/fuzz/fuzz_ops.cpp: fill(i32, -1e30) converted a float that int32 cannot hold (undefined
// behaviour, UBSan's finding). fill refuses a value the integer dtype cannot hold.
TEST(BadArguments, FillOfAnIntegerTensorNeedsAValueThatFits) {
  Context ctx(default_cpu_backend());
  const int64_t ne[kMaxDims] = {3, 1, 1, 1};
  for (float v :
       {-1e30f, 3e9f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()})
    expect_error([&] { fill(ctx, DType::I32, ne, v); }, {"fill", "does not fit i32"});
  expect_error([&] { fill(ctx, DType::I64, ne, 1e19f); }, {"fill", "does not fit i64"});
  Tensor* t = fill(ctx, DType::I64, ne, -5.75f);
  Tensor* u = fill(ctx, DType::I32, ne, -2147483648.0f);
  t->flags |= kOutput;
  u->flags |= kOutput;
  Graph g(ctx);
  g.forward(t);
  g.forward(u);
  g.compute();
  EXPECT_EQ(get_data_int(t), (std::vector<int64_t>{-5, -5, -5}));
  EXPECT_EQ(get_data_int(u), (std::vector<int64_t>{INT32_MIN, INT32_MIN, INT32_MIN}));
}

}  // namespace
}  // namespace retort::test
