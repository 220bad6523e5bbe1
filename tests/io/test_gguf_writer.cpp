// GgufWriter against retort's GGUF reader: every metadata type round trips, tensors land at aligned offsets
// and decode bit-exactly (F32, F16, BF16) or within Q8_0's step, and bad input throws before a file exists.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include "io/gguf_writer.h"
#include "io_test_util.h"
#include "retort.h"

namespace retort::test {
namespace {

using G = GgufWriter;

std::vector<float> ramp(int64_t n, float scale) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = scale * std::sin(0.37f * float(i) + 0.1f) * float(1 + i % 7);
  return v;
}

TEST(GgufWriter, EveryMetadataTypeRoundTrips) {
  G w;
  w.set("u8", G::u8(255));
  w.set("i8", G::i8(-128));
  w.set("u16", G::u16(65535));
  w.set("i16", G::i16(-32768));
  w.set("u32", G::u32(4000000000u));
  w.set("i32", G::i32(-2000000000));
  w.set("f32", G::f32(1e-5f));
  w.set("bool", G::boolean(true));
  w.set("string", G::string("héllo\n"));
  w.set("u64", G::u64(std::numeric_limits<uint64_t>::max()));
  w.set("i64", G::i64(std::numeric_limits<int64_t>::min()));
  w.set("f64", G::f64(-2.5e300));
  w.set("strings", G::strings({"a", "", "Ġthe"}));
  w.set("i32s", G::i32s({1, -2, 3}));
  w.set("f32s", G::f32s({0.5f, -1.0f}));
  w.set("u16s", G::array({G::u16(1), G::u16(2)}));
  w.set("nested", G::array({G::array({G::i8(-1)}), G::array({}, GgufType::F64)}));
  w.set("empty strings", G::strings({}));
  ScratchDir dir;
  const std::string p = dir.file("meta.gguf");
  w.write(p);
  GgufFile f(p);
  EXPECT_EQ(f.version(), 3u);
  ASSERT_EQ(f.metadata().size(), 18u);
  EXPECT_EQ(f.metadata()[0].first, "u8");  // in the order set
  EXPECT_EQ(f.find("u8")->type(), GgufType::U8);
  EXPECT_EQ(f.get_uint("u8"), 255u);
  EXPECT_EQ(f.get_int("i8"), -128);
  EXPECT_EQ(f.get_uint("u16"), 65535u);
  EXPECT_EQ(f.get_int("i16"), -32768);
  EXPECT_EQ(f.get_uint("u32"), 4000000000u);
  EXPECT_EQ(f.find("i32")->type(), GgufType::I32);
  EXPECT_EQ(f.get_int("i32"), -2000000000);
  EXPECT_EQ(float(f.get_float("f32")), 1e-5f);
  EXPECT_EQ(f.find("f32")->type(), GgufType::F32);
  EXPECT_TRUE(f.get_bool("bool"));
  EXPECT_EQ(f.get_string("string"), "héllo\n");
  EXPECT_EQ(f.get_uint("u64"), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(f.get_int("i64"), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(f.get_float("f64"), -2.5e300);
  EXPECT_EQ(f.get_string_array("strings"), (std::vector<std::string>{"a", "", "Ġthe"}));
  EXPECT_EQ(f.get_int_array("i32s"), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(f.get_float_array("f32s"), (std::vector<double>{0.5, -1.0}));
  EXPECT_EQ(f.find("u16s")->elem_type(), GgufType::U16);
  EXPECT_EQ(f.get_int_array("u16s"), (std::vector<int64_t>{1, 2}));
  const GgufValue& nested = *f.find("nested");
  ASSERT_EQ(nested.size(), 2u);
  EXPECT_EQ(nested.array_at(0).scalar_at(0).as_int(), -1);
  EXPECT_EQ(nested.array_at(1).elem_type(), GgufType::F64);
  EXPECT_EQ(nested.array_at(1).size(), 0u);
  EXPECT_EQ(f.find("empty strings")->size(), 0u);
  EXPECT_EQ(dir.entries().size(), 1u);  // no temporary left
}

TEST(GgufWriter, TensorsRoundTripBitExactAndAligned) {
  const std::vector<float> a = ramp(3 * 64, 0.02f), b = ramp(64, 3.0f), c = ramp(2 * 5 * 64, 1e-3f);
  G w;
  w.set("general.alignment", G::u32(64));
  w.add_tensor("a.f32", QuantType::F32, {3, 64}, a);
  w.add_tensor("b.f16", QuantType::F16, {64}, b);
  w.add_tensor("c.bf16", QuantType::BF16, {2, 5, 64}, c);
  w.add_tensor("d.q8_0", QuantType::Q8_0, {3, 64}, a);
  ScratchDir dir;
  const std::string p = dir.file("t.gguf");
  w.write(p);
  EXPECT_EQ(slurp(p), w.to_bytes());
  GgufFile f(p);
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.data_offset() % 64, 0u);
  ASSERT_EQ(f.tensors().size(), 4u);
  for (const auto& t : f.tensors()) EXPECT_EQ(t.offset % 64, 0u) << t.name;
  const auto& ta = f.tensor("a.f32");
  EXPECT_EQ(ta.shape, (Shape{3, 64}));
  EXPECT_EQ(ta.ne[0], 64);  // innermost first in the file
  EXPECT_EQ(f.dequantize(ta), a);
  const auto& tb = f.tensor("b.f16");
  EXPECT_EQ(tb.type, QuantType::F16);
  auto raw = f.tensor_bytes(tb);
  for (size_t i = 0; i < b.size(); ++i) ASSERT_EQ(io::load_le16(raw.data() + 2 * i), f32_to_f16(b[i])) << i;
  const auto& tc = f.tensor("c.bf16");
  EXPECT_EQ(tc.shape, (Shape{2, 5, 64}));
  raw = f.tensor_bytes(tc);
  for (size_t i = 0; i < c.size(); ++i) ASSERT_EQ(io::load_le16(raw.data() + 2 * i), f32_to_bf16(c[i])) << i;
  // Q8_0: each value within half a step (d / 2, d = max|x| / 127 of its block) of the original.
  const std::vector<float> q = f.dequantize(f.tensor("d.q8_0"));
  for (size_t blk = 0; blk < a.size() / 32; ++blk) {
    float amax = 0;
    for (size_t j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(a[blk * 32 + j]));
    for (size_t j = 0; j < 32; ++j)
      ASSERT_NEAR(q[blk * 32 + j], a[blk * 32 + j], amax / 127 * 0.5 + amax * 1e-3) << blk << " " << j;
  }
}

TEST(GgufWriter, Q8_0MatchesGgmlReferenceBlock) {
  // A block whose max is 127: d = 1 exactly, so q = round(x) half away from zero.
  std::vector<float> x(32, 0.0f);
  x[0] = 127, x[1] = 2.5f, x[2] = -2.5f, x[3] = 0.49f, x[4] = -127;
  std::vector<uint8_t> out;
  quantize_values(QuantType::Q8_0, x.data(), 32, out);
  ASSERT_EQ(out.size(), 34u);
  EXPECT_EQ(io::load_le16(out.data()), 0x3C00);  // 1.0 in f16
  EXPECT_EQ(int8_t(out[2]), 127);
  EXPECT_EQ(int8_t(out[3]), 3);
  EXPECT_EQ(int8_t(out[4]), -3);
  EXPECT_EQ(int8_t(out[5]), 0);
  EXPECT_EQ(int8_t(out[6]), -127);
  std::vector<float> zeros(32, 0.0f);  // d = 0: all quotients 0, no division by zero
  quantize_values(QuantType::Q8_0, zeros.data(), 32, out);
  for (size_t i = 0; i < 34; ++i) EXPECT_EQ(out[i], 0) << i;
}

TEST(GgufWriter, BadInputThrowsAndLeavesNoFile) {
  G w;
  w.set("k", G::u8(1));
  expect_error([&] { w.set("k", G::u8(2)); }, {"'k'", "set twice"});
  expect_error([&] { w.set("", G::u8(2)); }, {"empty metadata key"});
  expect_error([&] { w.set("general.alignment", G::u32(48)); }, {"48", "power of two"});
  expect_error([&] { w.set("general.alignment", G::u64(64)); }, {"alignment", "u64", "expected u32"});
  expect_error([&] { G::array({G::u8(1), G::i8(1)}); }, {"element 1", "i8", "u8"});
  expect_error(
      [&] {
        w.add_tensor("x", QuantType::Q8_0, {2, 48}, std::vector<float>(96));
      },
      {"'x'", "innermost dim (48)", "Q8_0", "32"});
  expect_error([&] { w.add_tensor("x", QuantType::Q4_K, {256}, std::vector<float>(256)); },
               {"'x'", "Q4_K", "F32, F16, BF16 and Q8_0"});
  expect_error(
      [&] {
        w.add_tensor("x", QuantType::F32, {2, 3}, std::vector<float>(5));
      },
      {"'x'", "5 values for 6 elements"});
  expect_error([&] { w.add_tensor(std::string(64, 'n'), QuantType::F32, {1}, {0.f}); }, {"1 to 63 bytes"});
  expect_error([&] { w.add_tensor("x", QuantType::F32, {}, {0.f}); }, {"'x'", "0 dims"});
  w.add_tensor("x", QuantType::F32, {1}, {0.f});
  expect_error([&] { w.add_tensor("x", QuantType::F32, {1}, {0.f}); }, {"'x'", "added twice"});

  // An output place that cannot be written: an error naming it, and nothing left behind.
  ScratchDir dir;
  const std::string missing = dir.file("no/such/dir/m.gguf");
  expect_error([&] { w.write(missing); }, {missing});
  EXPECT_TRUE(dir.entries().empty());
  std::filesystem::create_directory(dir.file("sub"));
  expect_error([&] { w.write(dir.file("sub")); }, {"sub"});
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"sub"});
  EXPECT_TRUE(std::filesystem::is_empty(dir.file("sub")));
}

}  // namespace
}  // namespace retort::test
