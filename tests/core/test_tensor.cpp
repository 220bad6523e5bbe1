// The tensor record: dtypes and their conversions, shapes and strides, host data through strided views,
// storage sharing of views, and the errors a caller can provoke.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "expect_error.h"
#include "harness.h"

namespace retort::test {
namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// ---- dtypes ----------------------------------------------------------------------------------------------

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::F32), 4u);
  EXPECT_EQ(dtype_size(DType::BF16), 2u);
  EXPECT_EQ(dtype_size(DType::F16), 2u);
  EXPECT_EQ(dtype_size(DType::I32), 4u);
  EXPECT_EQ(dtype_size(DType::I64), 8u);
  EXPECT_STREQ(dtype_name(DType::F32), "f32");
  EXPECT_STREQ(dtype_name(DType::BF16), "bf16");
  EXPECT_STREQ(dtype_name(DType::F16), "f16");
  EXPECT_STREQ(dtype_name(DType::I32), "i32");
  EXPECT_STREQ(dtype_name(DType::I64), "i64");
}

TEST(DType, FloatAndIntKinds) {
  for (int i = 0; i < kDTypeCount; ++i) {
    DType t = DType(i);
    EXPECT_NE(is_float(t), is_int(t)) << dtype_name(t);
  }
  EXPECT_TRUE(is_float(DType::BF16));
  EXPECT_TRUE(is_int(DType::I64));
}

// The bf16 value nearest to f in float64, ties to the even pattern (the reference for f32_to_bf16).
uint16_t bf16_reference(float f) {
  uint32_t u = to_bits(f);
  uint16_t lo = uint16_t(u >> 16);
  uint16_t hi = uint16_t(lo + 1);  // the next pattern away from zero (may be inf)
  double dl = std::abs(double(bf16_to_f32(lo)) - double(f));
  // Past the largest finite value IEEE rounds as if the exponent went on: the next step is 2^128, not inf.
  double vh =
      (hi & 0x7fffu) == 0x7f80u ? std::copysign(std::ldexp(1.0, 128), double(f)) : double(bf16_to_f32(hi));
  double dh = std::abs(vh - double(f));
  if ((u & 0xffffu) == 0) return lo;
  if (dl < dh) return lo;
  if (dh < dl) return hi;
  return (lo & 1u) ? hi : lo;
}

TEST(Bf16, EveryPatternRoundTrips) {
  int nans = 0;
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    float f = bf16_to_f32(uint16_t(h));
    if (std::isnan(f)) {
      ++nans;
      EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(f)))) << std::hex << h;
      continue;
    }
    ASSERT_EQ(f32_to_bf16(f), uint16_t(h)) << std::hex << h;
  }
  EXPECT_EQ(nans, 2 * 127);  // 2 signs x (2^7 - 1) non-zero mantissas
}

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808000u)), 0x3f80u);  // tie, even below
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f818000u)), 0x3f82u);  // tie, even above
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808001u)), 0x3f81u);  // just above the tie
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f807fffu)), 0x3f80u);  // just below the tie
  EXPECT_EQ(f32_to_bf16(from_bits(0xbf818000u)), 0xbf82u);  // negative, magnitude rounds the same way
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80u);
  EXPECT_EQ(f32_to_bf16(-2.0f), 0xc000u);
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000u);
}

TEST(Bf16, SubnormalsInfNaN) {
  EXPECT_EQ(f32_to_bf16(from_bits(0x00000001u)), 0x0000u);  // tiniest f32 subnormal rounds to zero
  EXPECT_EQ(f32_to_bf16(from_bits(0x00008000u)), 0x0000u);  // tie between 0 and 1: even
  EXPECT_EQ(f32_to_bf16(from_bits(0x00018000u)), 0x0002u);  // tie between 1 and 2: even
  EXPECT_EQ(f32_to_bf16(from_bits(0x00010000u)), 0x0001u);  // bf16 subnormal, exact
  EXPECT_EQ(bf16_to_f32(0x0001u), from_bits(0x00010000u));
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(f32_to_bf16(inf), 0x7f80u);
  EXPECT_EQ(f32_to_bf16(-inf), 0xff80u);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80u);  // rounds past the largest bf16
  EXPECT_EQ(f32_to_bf16(from_bits(0x7f7f7fffu)), 0x7f7fu);             // largest bf16 stays finite
  // A signalling NaN whose payload lives in the low bits must not turn into infinity when truncated.
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(from_bits(0x7f800001u)))));
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(from_bits(0xff800001u)))));
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(Bf16, RandomPatternsMatchNearestReference) {
  reseed("bf16_random");
  std::uniform_int_distribution<uint32_t> bits(0, 0xffffffffu);
  for (int i = 0; i < 200000; ++i) {
    float f = from_bits(bits(rng()));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_bf16(f), bf16_reference(f)) << std::hex << to_bits(f);
  }
}

// f16 value of a pattern computed in float64 from the IEEE definition.
double f16_value(uint16_t h) {
  int sign = (h & 0x8000u) ? -1 : 1;
  int exp = (h >> 10) & 0x1f;
  int man = h & 0x3ff;
  if (exp == 31) return man ? std::nan("") : sign * std::numeric_limits<double>::infinity();
  if (exp == 0) return sign * std::ldexp(double(man), -24);
  return sign * std::ldexp(double(1024 + man), exp - 25);
}

TEST(F16, EveryPatternDecodesAndRoundTrips) {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    float f = f16_to_f32(uint16_t(h));
    double want = f16_value(uint16_t(h));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << h;
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f)))) << std::hex << h;
      continue;
    }
    ASSERT_EQ(double(f), want) << std::hex << h;
    ASSERT_EQ(f32_to_f16(f), uint16_t(h)) << std::hex << h;
  }
}

TEST(F16, RoundsToNearestEvenAndSaturatesToInf) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00u);
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00u);      // tie, even below
  EXPECT_EQ(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02u);  // tie, even above
  EXPECT_EQ(f32_to_f16(std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f)), 0x3c01u);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bffu);
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bffu);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00u);  // the tie above the largest finite f16 rounds to inf
  EXPECT_EQ(f32_to_f16(-1e6f), 0xfc00u);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, 15) * 1.999f), 0x7bffu);
}

TEST(F16, SubnormalsInfNaN) {
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001u);     // smallest subnormal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000u);     // tie with zero: even
  EXPECT_EQ(f32_to_f16(std::ldexp(1.5f, -25)), 0x0001u);     // above the tie
  EXPECT_EQ(f32_to_f16(std::ldexp(3.0f, -25)), 0x0002u);     // 1.5 units: tie, even above
  EXPECT_EQ(f32_to_f16(std::ldexp(2047.0f, -25)), 0x0400u);  // 1023.5 units: tie into the normals
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -14)), 0x0400u);     // smallest normal
  EXPECT_EQ(f32_to_f16(-std::ldexp(1.0f, -24)), 0x8001u);
  EXPECT_EQ(f32_to_f16(from_bits(0x00000001u)), 0x0000u);  // f32 subnormal underflows
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000u);
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(f32_to_f16(inf), 0x7c00u);
  EXPECT_EQ(f32_to_f16(-inf), 0xfc00u);
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(from_bits(0x7f800001u)))));
}

TEST(F16, RandomValuesMatchNearestReference) {
  // Every finite f16 value, sorted, to find the nearest one by search.
  std::vector<std::pair<double, uint16_t>> table;
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    double v = f16_value(uint16_t(h));
    if (std::isfinite(v) && !(v == 0 && (h & 0x8000u))) table.push_back({v, uint16_t(h)});
  }
  std::sort(table.begin(), table.end());
  reseed("f16_random");
  std::uniform_real_distribution<double> e(-27, 17), m(1, 2);
  for (int i = 0; i < 200000; ++i) {
    float f = float(std::ldexp(m(rng()), int(std::floor(e(rng()))))) * (i % 2 ? -1.0f : 1.0f);
    uint16_t got = f32_to_f16(f);
    double a = std::abs(double(f));
    uint16_t want = 0x7c00u;  // from the tie above the largest finite value on, inf
    if (a < 65520.0) {
      auto it = std::lower_bound(table.begin(), table.end(), std::make_pair(a, uint16_t(0)));
      if (it == table.end()) {
        want = table.back().second;
      } else if (it->first == a || it == table.begin()) {
        want = it->second;
      } else {
        auto lo = it - 1;
        double dl = a - lo->first, dh = it->first - a;
        want = dl < dh ? lo->second : dh < dl ? it->second : (lo->second & 1u) ? it->second : lo->second;
      }
    }
    if (f < 0) want |= 0x8000u;
    ASSERT_EQ(got, want) << f;
  }
}

// ---- shapes, strides, contiguity --------------------------------------------------------------------------

TEST(Tensor, ShapeQueries) {
  Context ctx(default_cpu_backend());
  Tensor* t = ctx.tensor(DType::F32, {2, 3, 4});
  EXPECT_EQ(t->ne[0], 4);
  EXPECT_EQ(t->ne[1], 3);
  EXPECT_EQ(t->ne[2], 2);
  EXPECT_EQ(t->ne[3], 1);
  EXPECT_EQ(t->nb[0], 4u);
  EXPECT_EQ(t->nb[1], 16u);
  EXPECT_EQ(t->nb[2], 48u);
  EXPECT_EQ(t->nelements(), 24);
  EXPECT_EQ(t->nrows(), 6);
  EXPECT_EQ(t->n_dims(), 3);
  EXPECT_EQ(t->shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(t->nbytes(), 96u);
  EXPECT_TRUE(t->is_contiguous());
  EXPECT_TRUE(t->is_leaf());
  EXPECT_FALSE(t->is_view());
  Tensor* b = ctx.tensor(DType::BF16, {5});
  EXPECT_EQ(b->nbytes(), 10u);
  EXPECT_EQ(b->n_dims(), 1);
  // Trailing size-1 dims drop out of shape(); leading ones are kept.
  EXPECT_EQ(ctx.tensor(DType::F32, {1, 3})->shape(), (Shape{3}));
  EXPECT_EQ(ctx.tensor(DType::F32, {3, 1})->shape(), (Shape{3, 1}));
}

TEST(Tensor, FlagsOfParamsAndInputs) {
  Context ctx(default_cpu_backend());
  EXPECT_TRUE(ctx.param(DType::F32, {3}, "w")->has(kParam));
  EXPECT_TRUE(ctx.input(DType::I32, {3}, "ids")->has(kInput));
  EXPECT_FALSE(ctx.tensor(DType::F32, {3})->has(kParam));
  EXPECT_EQ(ctx.size(), 3u);
}

TEST(Tensor, FreshTensorsAreZero) {
  Context ctx(default_cpu_backend());
  for (DType t : {DType::F32, DType::BF16, DType::F16}) {
    auto v = get_data(ctx.tensor(t, {3, 5}));
    EXPECT_TRUE(std::all_of(v.begin(), v.end(), [](float x) { return x == 0; })) << dtype_name(t);
  }
  auto iv = get_data_int(ctx.tensor(DType::I64, {4}));
  EXPECT_TRUE(std::all_of(iv.begin(), iv.end(), [](int64_t x) { return x == 0; }));
}

TEST(Tensor, Contiguity) {
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.tensor(DType::F32, {4, 6});
  EXPECT_TRUE(x->is_contiguous());
  EXPECT_FALSE(transpose(ctx, x)->is_contiguous());
  EXPECT_TRUE(slice(ctx, x, 1, 1, 2)->is_contiguous());   // whole rows
  EXPECT_FALSE(slice(ctx, x, 0, 1, 3)->is_contiguous());  // part of each row
  EXPECT_TRUE(slice(ctx, x, 0, 0, 6)->is_contiguous());   // the whole row
  EXPECT_TRUE(reshape(ctx, x, {2, 12})->is_contiguous());
  // Swapping a size-1 dim does not change the layout.
  Tensor* r = ctx.tensor(DType::F32, {1, 6});
  EXPECT_TRUE(permute(ctx, r, 0, 2, 1, 3)->is_contiguous());
  // Transposing twice restores contiguity.
  EXPECT_TRUE(transpose(ctx, transpose(ctx, x))->is_contiguous());
}

TEST(Tensor, Describe) {
  Context ctx(default_cpu_backend());
  EXPECT_EQ(ctx.tensor(DType::F32, {4, 8}, "w")->describe(), "'w' f32[4, 8]");
  EXPECT_EQ(ctx.tensor(DType::BF16, {3})->describe(), "bf16[3]");
  EXPECT_EQ(ctx.tensor(DType::I64, {2, 1, 5})->describe(), "i64[2, 1, 5]");
  EXPECT_EQ(transpose(ctx, ctx.tensor(DType::F16, {2, 7}))->describe(), "f16[7, 2]");
}

TEST(Tensor, ShapeHelpers) {
  int64_t ne[kMaxDims];
  shape_to_ne({2, 3}, ne, "t");
  EXPECT_EQ(ne[0], 3);
  EXPECT_EQ(ne[1], 2);
  EXPECT_EQ(ne[2], 1);
  EXPECT_EQ(shape_str(ne), "[2, 3]");
  const int64_t one[kMaxDims] = {1, 1, 1, 1};
  EXPECT_EQ(shape_str(one), "[1]");
  Context ctx(default_cpu_backend());
  Tensor* a = ctx.tensor(DType::F32, {2, 3, 4});
  EXPECT_TRUE(same_shape(a, ctx.tensor(DType::BF16, {2, 3, 4})));
  EXPECT_FALSE(same_shape(a, ctx.tensor(DType::F32, {2, 4, 3})));
  EXPECT_TRUE(can_broadcast(ctx.tensor(DType::F32, {3, 1}), a));
  EXPECT_TRUE(can_broadcast(ctx.tensor(DType::F32, {1}), a));
  EXPECT_FALSE(can_broadcast(ctx.tensor(DType::F32, {2}), a));
  EXPECT_FALSE(can_broadcast(a, ctx.tensor(DType::F32, {3, 4})));
}

TEST(Tensor, BadShapesThrow) {
  Context ctx(default_cpu_backend());
  expect_error([&] { ctx.tensor(DType::F32, {1, 2, 3, 4, 5}, "big"); }, {"big", "1 to 4 dims", "5"});
  expect_error([&] { ctx.tensor(DType::F32, {}, "empty"); }, {"empty", "1 to 4 dims"});
  expect_error([&] { ctx.tensor(DType::F32, {3, 0}, "zero"); }, {"zero", ">= 1"});
  expect_error([&] { ctx.tensor(DType::F32, {-2}); }, {"tensor", "-2"});
  expect_error([&] { ctx.param(DType::I32, {3}, "ids"); }, {"param", "ids", "i32"});
}

// ---- host data --------------------------------------------------------------------------------------------

std::vector<float> iota(int n, float start = 0) {
  std::vector<float> v{};
  v.resize(size_t(n));
  for (int i = 0; i < n; ++i) v[size_t(i)] = start + float(i);
  return v;
}

TEST(TensorData, RoundTripEveryDType) {
  Context ctx(default_cpu_backend());
  std::vector<float> v = {1.5f, -2.25f, 3.0f, 0.0078125f, -1024.0f, 7.0f};  // exact in bf16 and f16
  for (DType t : {DType::F32, DType::BF16, DType::F16}) {
    Tensor* x = ctx.tensor(t, {2, 3});
    set_data(x, v);
    EXPECT_EQ(get_data(x), v) << dtype_name(t);
  }
  std::vector<int64_t> iv = {-5, 0, 7, 1 << 30, -(1 << 30), 42};
  for (DType t : {DType::I32, DType::I64}) {
    Tensor* x = ctx.tensor(t, {6});
    set_data_int(x, iv);
    EXPECT_EQ(get_data_int(x), iv) << dtype_name(t);
  }
  Tensor* big = ctx.tensor(DType::I64, {1});
  set_data_int(big, {int64_t(1) << 50});
  EXPECT_EQ(get_data_int(big)[0], int64_t(1) << 50);
}

TEST(TensorData, LowPrecisionStorageRounds) {
  Context ctx(default_cpu_backend());
  Tensor* b = ctx.tensor(DType::BF16, {2});
  set_data(b, {1.0f + std::ldexp(1.0f, -8), 1.0f + 3 * std::ldexp(1.0f, -8)});
  EXPECT_EQ(get_data(b), (std::vector<float>{1.0f, 1.0f + std::ldexp(1.0f, -6)}));
  Tensor* h = ctx.tensor(DType::F16, {2});
  set_data(h, {70000.0f, std::ldexp(1.0f, -26)});
  auto hv = get_data(h);
  EXPECT_TRUE(std::isinf(hv[0]));
  EXPECT_EQ(hv[1], 0.0f);
}

TEST(TensorData, ThroughTransposedView) {
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.tensor(DType::F32, {3, 4});  // rows 3, cols 4
  set_data(x, iota(12));
  Tensor* t = transpose(ctx, x);  // [4, 3]
  std::vector<float> want;
  for (int c = 0; c < 4; ++c)
    for (int r = 0; r < 3; ++r) want.push_back(float(r * 4 + c));
  EXPECT_EQ(get_data(t), want);
  // Writing through the view lands in the base in transposed places.
  set_data(t, iota(12, 100));
  auto base = get_data(x);
  for (int c = 0; c < 4; ++c)
    for (int r = 0; r < 3; ++r) EXPECT_EQ(base[size_t(r * 4 + c)], float(100 + c * 3 + r));
}

TEST(TensorData, ThroughSliceViewTouchesOnlyTheWindow) {
  Context ctx(default_cpu_backend());
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    Tensor* x = ctx.tensor(dt, {2, 3, 5});
    set_data(x, iota(30));
    Tensor* s = slice(ctx, x, 0, 1, 3);  // columns 1..3 of every row: [2, 3, 3]
    std::vector<float> want;
    for (int r = 0; r < 6; ++r)
      for (int c = 1; c < 4; ++c) want.push_back(float(r * 5 + c));
    EXPECT_EQ(get_data(s), want) << dtype_name(dt);
    set_data(s, std::vector<float>(18, -1.0f));
    auto base = get_data(x);
    for (int r = 0; r < 6; ++r)
      for (int c = 0; c < 5; ++c)
        EXPECT_EQ(base[size_t(r * 5 + c)], (c >= 1 && c < 4) ? -1.0f : float(r * 5 + c)) << dtype_name(dt);
  }
}

TEST(TensorData, IntThroughPermutedView) {
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.tensor(DType::I32, {2, 3});
  set_data_int(x, {0, 1, 2, 3, 4, 5});
  Tensor* t = transpose(ctx, x);
  EXPECT_EQ(get_data_int(t), (std::vector<int64_t>{0, 3, 1, 4, 2, 5}));
  set_data_int(t, {10, 13, 11, 14, 12, 15});
  EXPECT_EQ(get_data_int(x), (std::vector<int64_t>{10, 11, 12, 13, 14, 15}));
}

TEST(TensorData, BytesRoundTrip) {
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.tensor(DType::BF16, {2, 2});
  uint16_t raw[4] = {0x3f80, 0x4000, 0xbf80, 0x0000};
  set_bytes(x, raw, sizeof(raw));
  EXPECT_EQ(get_data(x), (std::vector<float>{1, 2, -1, 0}));
  auto bytes = get_bytes(transpose(ctx, x));
  ASSERT_EQ(bytes.size(), 8u);
  uint16_t back[4];
  std::memcpy(back, bytes.data(), 8);
  EXPECT_EQ(back[0], 0x3f80);
  EXPECT_EQ(back[1], 0xbf80);
  EXPECT_EQ(back[2], 0x4000);
  EXPECT_EQ(back[3], 0x0000);
  expect_error([&] { set_bytes(x, raw, 6); }, {"set_data", "bf16[2, 2]", "6 bytes"});
  // Into a caller's buffer: contiguous, and through a strided view; the size must match.
  uint16_t into[4] = {7, 7, 7, 7};
  get_bytes(x, into, sizeof(into));
  EXPECT_EQ(std::vector<uint16_t>(into, into + 4), std::vector<uint16_t>(raw, raw + 4));
  get_bytes(transpose(ctx, x), into, sizeof(into));
  EXPECT_EQ(std::vector<uint16_t>(into, into + 4), (std::vector<uint16_t>{0x3f80, 0xbf80, 0x4000, 0x0000}));
  expect_error([&] { get_bytes(x, into, 6); }, {"get_bytes", "bf16[2, 2]", "8 bytes", "buffer 6"});
}

// read_later: the bytes the tensor holds at the call, even once it is overwritten; strided views gathered.
TEST(TensorData, ReadLaterHoldsTheBytesOfItsTime) {
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.tensor(DType::F32, {2, 3}, "x");
  set_data(x, {1, 2, 3, 4, 5, 6});
  TensorRead a = read_later(x);
  TensorRead t = read_later(transpose(ctx, x));
  set_data(x, {9, 9, 9, 9, 9, 9});
  ASSERT_TRUE(a.valid());
  ASSERT_EQ(a.size(), 24u);
  const auto* p = static_cast<const float*>(a.wait());
  EXPECT_EQ(std::vector<float>(p, p + 6), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  const auto* q = static_cast<const float*>(t.wait());
  EXPECT_EQ(std::vector<float>(q, q + 6), (std::vector<float>{1, 4, 2, 5, 3, 6}));
  EXPECT_EQ(a.wait(), p);  // a second wait returns the same bytes
  TensorRead none;
  EXPECT_FALSE(none.valid());
  expect_error([&] { none.wait(); }, {"TensorRead::wait", "nothing was read"});
  expect_error([&] { read_later(tanh(ctx, x)); }, {"read_later", "no storage"});
}

TEST(TensorData, WrongSizesAndKindsThrow) {
  Context ctx(default_cpu_backend());
  Tensor* f = ctx.tensor(DType::F32, {2, 3}, "f");
  Tensor* i = ctx.tensor(DType::I32, {2}, "i");
  expect_error([&] { set_data(f, {1, 2, 3}); }, {"set_data", "'f' f32[2, 3]", "6 elements", "got 3"});
  expect_error([&] { set_data(i, {1, 2}); }, {"set_data", "'i' i32[2]", "set_data_int"});
  expect_error([&] { set_data_int(f, std::vector<int64_t>(6, 1)); }, {"set_data_int", "'f'"});
  expect_error([&] { set_data_int(i, {1}); }, {"set_data_int", "2 elements"});
  expect_error([&] { set_data_int(i, {int64_t(1) << 40, 0}); }, {"set_data_int", "does not fit", "i32"});
  expect_error([&] { get_data_int(f); }, {"get_data_int", "'f'"});
}

TEST(TensorData, UnplacedNodeThrows) {
  Context ctx(default_cpu_backend());
  Tensor* y = tanh(ctx, ctx.tensor(DType::F32, {3}));
  expect_error([&] { get_data(y); }, {"get_data", "no storage"});
  expect_error([&] { set_data(y, {1, 2, 3}); }, {"set_bytes", "no storage"});
}

// ---- views share storage ----------------------------------------------------------------------------------

TEST(Views, ShareStorageWithTheirBase) {
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.tensor(DType::F32, {2, 3, 4});
  set_data(x, iota(24));
  const char* base = static_cast<const char*>(x->data);
  Tensor* r = reshape(ctx, x, {6, 4});
  Tensor* p = permute(ctx, x, 2, 0, 1, 3);
  Tensor* t = transpose(ctx, x);
  Tensor* s = slice(ctx, x, 1, 1, 2);
  for (Tensor* v : {r, p, t, s}) {
    EXPECT_TRUE(v->is_view());
    EXPECT_EQ(v->view_src, x);
    EXPECT_EQ(v->src[0], x);
    EXPECT_EQ(v->op, Op::View);
  }
  EXPECT_EQ(r->data, x->data);
  EXPECT_EQ(p->data, x->data);
  EXPECT_EQ(static_cast<const char*>(s->data), base + 16);  // one row of 4 floats in
  // A write through the base is visible through every view, and the other way round.
  set_data(r, iota(24, 50));
  EXPECT_EQ(get_data(x)[5], 55.0f);
  EXPECT_EQ(get_data(s)[0], 54.0f);  // element (0, 1, 0) of x
  // A view of a view points at the root, with offsets added.
  Tensor* ss = slice(ctx, s, 0, 2, 2);
  EXPECT_EQ(ss->view_src, x);
  EXPECT_EQ(ss->view_offs, 16u + 8u);
  EXPECT_EQ(get_data(ss), (std::vector<float>{56, 57, 60, 61, 68, 69, 72, 73}));
}

TEST(Views, PermuteMovesSizesAndStrides) {
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.tensor(DType::F32, {2, 3, 4, 5});  // ne = {5, 4, 3, 2}
  Tensor* p = permute(ctx, x, 2, 0, 3, 1);           // x dim d becomes dim axes[d]
  EXPECT_EQ(p->ne[2], 5);
  EXPECT_EQ(p->ne[0], 4);
  EXPECT_EQ(p->ne[3], 3);
  EXPECT_EQ(p->ne[1], 2);
  EXPECT_EQ(p->nb[2], x->nb[0]);
  EXPECT_EQ(p->nb[0], x->nb[1]);
  EXPECT_EQ(p->nb[3], x->nb[2]);
  EXPECT_EQ(p->nb[1], x->nb[3]);
}

TEST(Views, WindowPastTheEndThrows) {
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.tensor(DType::F32, {4, 6}, "x");
  expect_error([&] { slice(ctx, x, 0, 4, 3); }, {"slice", "'x' f32[4, 6]", "[4, 7)", "6 elements"});
  expect_error([&] { slice(ctx, x, 1, 0, 5); }, {"slice", "runs past"});
  expect_error([&] { slice(ctx, x, 1, -1, 2); }, {"slice"});
  expect_error([&] { slice(ctx, x, 0, 0, 0); }, {"slice"});
  expect_error([&] { slice(ctx, x, 4, 0, 1); }, {"slice", "dim 4"});
  // A window of a window is checked against the window, not the base.
  Tensor* s = slice(ctx, x, 0, 2, 3);
  expect_error([&] { slice(ctx, s, 0, 1, 3); }, {"slice", "f32[4, 3]"});
}

TEST(Views, ReshapeOfNonContiguousThrows) {
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.tensor(DType::F32, {4, 6}, "x");
  expect_error([&] { reshape(ctx, transpose(ctx, x), {24}); }, {"reshape", "f32[6, 4]", "not contiguous"});
  expect_error([&] { reshape(ctx, slice(ctx, x, 0, 0, 3), {12}); }, {"reshape", "contiguous()"});
  expect_error([&] { reshape(ctx, x, {5, 5}); }, {"reshape", "'x' f32[4, 6]", "24 elements", "[5, 5]"});
}

TEST(Views, ShapeErrorsNameTheOp) {
  Context ctx(default_cpu_backend());
  Tensor* a = ctx.tensor(DType::F32, {4, 6}, "a");
  Tensor* b = ctx.tensor(DType::F32, {3, 6}, "b");
  Tensor* i = ctx.tensor(DType::I32, {4, 6}, "i");
  expect_error([&] { add(ctx, a, b); }, {"add", "'a' f32[4, 6]", "'b' f32[3, 6]"});
  expect_error([&] { mul(ctx, b, a); }, {"mul", "[4, 6]", "[3, 6]"});
  expect_error([&] { concat(ctx, a, b, 0); }, {"concat", "[4, 6]", "[3, 6]"});
  expect_error([&] { concat(ctx, a, i, 1); }, {"concat", "dtypes"});
  expect_error([&] { permute(ctx, a, 0, 0, 1, 2); }, {"permute", "'a' f32[4, 6]", "permutation"});
  expect_error([&] { cast(ctx, a, DType::I64); }, {"cast", "i64"});
  expect_error([&] { tanh(ctx, i); }, {"tanh", "i32[4, 6]"});
  expect_error([&] { sum_rows(ctx, i); }, {"sum_rows", "'i'"});
  const int64_t ne[kMaxDims] = {5, 4, 1, 1};
  expect_error([&] { repeat(ctx, a, ne); }, {"repeat", "[4, 6]", "[4, 5]"});
  expect_error([&] { reduce_to(ctx, a, ne); }, {"reduce_to", "[4, 6]", "[4, 5]"});
}

// copy_data stays on the backend (no host wait) when both tensors live there, goes through the host across
// backends, and refuses tensors that do not match.
TEST(Tensor, CopyDataOnOneBackendAndAcross) {
  CpuBackend a(1), b(1);
  Context ca(a), cb(b);
  Tensor* src = ca.tensor(DType::I32, {2, 3}, "src");
  Tensor* dst = ca.tensor(DType::I32, {6}, "dst");
  Tensor* far = cb.tensor(DType::I32, {3, 2}, "far");
  set_data_int(src, {1, -2, 3, 4, 5, 1 << 30});
  const uint64_t w0 = a.host_waits();
  copy_data(dst, src);
  EXPECT_EQ(a.host_waits(), w0);
  copy_data(far, src);
  EXPECT_EQ(get_data_int(dst), get_data_int(src));
  EXPECT_EQ(get_data_int(far), get_data_int(src));
  Tensor* f = ca.tensor(DType::F32, {6}, "f");
  expect_error([&] { copy_data(f, src); }, {"copy_data", "'src'", "'f'"});
  expect_error([&] { copy_data(ca.tensor(DType::I32, {5}, "five"), src); }, {"copy_data", "'five'"});
}

}  // namespace
}  // namespace retort::test
