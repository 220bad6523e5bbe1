#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "gguf_builder.h"
#include "io/gguf.h"
#include "io_test_util.h"
#include "retort.h"

namespace retort::test {
namespace {

using G = GgufBuilder;
using Bytes = G::Bytes;

// The same file through the map (a real path) and from memory must fail alike; returns the map's message.
std::string expect_bad(const Bytes& b, const std::vector<std::string>& needles) {
  ScratchDir dir;
  const std::string p = dir.file("bad.gguf");
  spit(p, b);
  std::vector<std::string> with_path = needles;
  with_path.push_back(p);
  std::string m = expect_error([&] { GgufFile f(p); }, with_path);
  with_path.back() = "mem.gguf";
  expect_error([&] { GgufFile f(b, "mem.gguf"); }, with_path);
  return m;
}

Bytes f32_bytes(const std::vector<float>& v) {
  Bytes b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// A Q8_0 block: d = 0.5 (f16 0x3800), q = i - 16.
Bytes q8_0_block() {
  Bytes b = {0x00, 0x38};
  for (int i = 0; i < 32; ++i) b.push_back(uint8_t(int8_t(i - 16)));
  return b;
}

// Every value type once, arrays of each, nested arrays, and three tensors.
G rich(uint32_t version) {
  G g;
  g.version = version;
  g.kv("u8", G::U8, G::scalar<uint8_t>(255))
      .kv("i8", G::I8, G::scalar<int8_t>(-128))
      .kv("u16", G::U16, G::scalar<uint16_t>(65535))
      .kv("i16", G::I16, G::scalar<int16_t>(-32768))
      .kv("u32", G::U32, G::scalar<uint32_t>(4294967295u))
      .kv("i32", G::I32, G::scalar<int32_t>(-2147483647 - 1))
      .kv("f32", G::F32, G::scalar<float>(0.1f))
      .kv("bool", G::BOOL, G::scalar<uint8_t>(1))
      .kv_str("str", std::string("h\xc3\xa9llo\0x", 8))
      .kv_str("empty", "")
      .kv("u64", G::U64, G::scalar<uint64_t>(UINT64_MAX))
      .kv("i64", G::I64, G::scalar<int64_t>(INT64_MIN))
      .kv("f64", G::F64, G::scalar<double>(-1e300))
      .kv("a.u8", G::ARRAY, G::array_of<uint8_t>(G::U8, {0, 7, 255}))
      .kv("a.i8", G::ARRAY, G::array_of<int8_t>(G::I8, {-1, 2}))
      .kv("a.u16", G::ARRAY, G::array_of<uint16_t>(G::U16, {65535}))
      .kv("a.i16", G::ARRAY, G::array_of<int16_t>(G::I16, {-300, 300}))
      .kv("a.u32", G::ARRAY, G::array_of<uint32_t>(G::U32, {1, 2, 3}))
      .kv("a.i32", G::ARRAY, G::array_of<int32_t>(G::I32, {-5}))
      .kv("a.f32", G::ARRAY, G::array_of<float>(G::F32, {1.5f, -0.25f}))
      .kv("a.bool", G::ARRAY, G::array_of<uint8_t>(G::BOOL, {1, 0, 1}))
      .kv("a.str", G::ARRAY, G::string_array({"a", "", "ccc"}))
      .kv("a.u64", G::ARRAY, G::array_of<uint64_t>(G::U64, {uint64_t(1) << 63}))
      .kv("a.i64", G::ARRAY, G::array_of<int64_t>(G::I64, {-(int64_t(1) << 40)}))
      .kv("a.f64", G::ARRAY, G::array_of<double>(G::F64, {2.5}))
      .kv("a.empty", G::ARRAY, G::array(G::F32, 0, {}));
  // [[1, 2], [], [[“x”]]] is not expressible (one element type per array), so: [[1, 2], []] of arrays of
  // u32, and [[["x", "y"]]] three deep.
  Bytes inner = G::array_of<uint32_t>(G::U32, {1, 2});
  G::append(inner, G::array(G::U32, 0, {}));
  g.kv("a.nested", G::ARRAY, G::array(G::ARRAY, 2, inner));
  g.kv("a.deep", G::ARRAY, G::array(G::ARRAY, 1, G::array(G::ARRAY, 1, G::string_array({"x", "y"}))));
  g.kv_str("general.name", "tiny");
  g.tensor("w", {3, 2}, 0, f32_bytes({1, 2, 3, 4, 5, 6}));
  g.tensor("q", {32}, 8, q8_0_block());
  g.tensor("h", {5}, 1, {0x00, 0x3c, 0x00, 0xc0, 0x00, 0x00, 0x00, 0x7c, 0x01, 0x00});  // 1 -2 0 inf 2^-24
  return g;
}

TEST(Gguf, EveryMetadataTypeRoundTripsInV2AndV3) {
  for (uint32_t version : {2u, 3u}) {
    SCOPED_TRACE(version);
    GgufFile f(rich(version).build(), "rich.gguf");
    EXPECT_EQ(f.version(), version);
    EXPECT_EQ(f.metadata().size(), 29u);
    EXPECT_EQ(f.metadata().front().first, "u8");
    EXPECT_EQ(f.get_uint("u8"), 255u);
    EXPECT_EQ(f.get_int("i8"), -128);
    EXPECT_EQ(f.get_uint("u16"), 65535u);
    EXPECT_EQ(f.get_int("i16"), -32768);
    EXPECT_EQ(f.get_uint("u32"), 4294967295u);
    EXPECT_EQ(f.get_int("i32"), -2147483648LL);
    EXPECT_EQ(f.get_float("f32"), double(0.1f));
    EXPECT_TRUE(f.get_bool("bool"));
    EXPECT_EQ(f.get_string("str"), std::string("h\xc3\xa9llo\0x", 8));
    EXPECT_EQ(f.get_string("empty"), "");
    EXPECT_EQ(f.get_uint("u64"), UINT64_MAX);
    EXPECT_EQ(f.get_int("i64"), INT64_MIN);
    EXPECT_EQ(f.get_float("f64"), -1e300);
    EXPECT_EQ(f.get_float("i8"), -128.0);  // integers are numbers too
    EXPECT_EQ(f.find("i16")->type(), GgufType::I16);
    EXPECT_EQ(f.get_int_array("a.u8"), (std::vector<int64_t>{0, 7, 255}));
    EXPECT_EQ(f.get_int_array("a.i8"), (std::vector<int64_t>{-1, 2}));
    EXPECT_EQ(f.get_int_array("a.u16"), (std::vector<int64_t>{65535}));
    EXPECT_EQ(f.get_int_array("a.i16"), (std::vector<int64_t>{-300, 300}));
    EXPECT_EQ(f.get_int_array("a.u32"), (std::vector<int64_t>{1, 2, 3}));
    EXPECT_EQ(f.get_int_array("a.i32"), (std::vector<int64_t>{-5}));
    EXPECT_EQ(f.get_float_array("a.f32"), (std::vector<double>{1.5, -0.25}));
    EXPECT_EQ(f.get_string_array("a.str"), (std::vector<std::string>{"a", "", "ccc"}));
    EXPECT_EQ(f.get_int_array("a.i64"), (std::vector<int64_t>{-(int64_t(1) << 40)}));
    EXPECT_EQ(f.get_float_array("a.f64"), (std::vector<double>{2.5}));
    const GgufValue& b = *f.find("a.bool");
    ASSERT_EQ(b.size(), 3u);
    EXPECT_EQ(b.elem_type(), GgufType::Bool);
    EXPECT_TRUE(b.scalar_at(0).as_bool());
    EXPECT_FALSE(b.scalar_at(1).as_bool());
    EXPECT_EQ(f.find("a.u64")->scalar_at(0).as_uint(), uint64_t(1) << 63);
    EXPECT_EQ(f.find("a.empty")->size(), 0u);
    EXPECT_EQ(f.find("a.empty")->describe(), "array of f32");
    const GgufValue& n = *f.find("a.nested");
    ASSERT_EQ(n.size(), 2u);
    EXPECT_EQ(n.array_at(0).scalar_at(1).as_uint(), 2u);
    EXPECT_EQ(n.array_at(1).size(), 0u);
    EXPECT_EQ(f.find("a.deep")->array_at(0).array_at(0).string_at(1), "y");
    EXPECT_EQ(f.get_string("general.name"), "tiny");
    EXPECT_EQ(f.find("missing"), nullptr);
  }
}

TEST(Gguf, TypedGettersNameTheFileKeyAndTypes) {
  GgufFile f(rich(3).build(), "rich.gguf");
  expect_error([&] { f.get_int("nope"); }, {"rich.gguf: metadata key 'nope' is missing"});
  expect_error([&] { f.get_int("str"); }, {"rich.gguf: metadata key 'str' is string, expected an integer"});
  expect_error([&] { f.get_uint("i8"); }, {"metadata key 'i8' is -128, expected >= 0"});
  expect_error([&] { f.get_int("u64"); },
               {"metadata key 'u64' is 18446744073709551615, more than int64 holds"});
  expect_error([&] { f.get_bool("u8"); }, {"metadata key 'u8' is u8, expected a bool"});
  expect_error([&] { f.get_string("a.str"); },
               {"metadata key 'a.str' is array of string, expected a string"});
  expect_error([&] { f.get_float("bool"); }, {"metadata key 'bool' is bool, expected a number"});
  expect_error([&] { f.get_string_array("a.u8"); }, {"'a.u8' is array of u8, expected an array of strings"});
  expect_error([&] { f.get_int_array("a.f32"); }, {"'a.f32' is array of f32, expected an array of integers"});
  expect_error([&] { f.get_int_array("a.u64"); }, {"'a.u64' element 0 is 9223372036854775808"});
  expect_error([&] { f.get_float_array("a.str"); }, {"expected an array of numbers"});
  EXPECT_EQ(f.get_uint("nope", 7), 7u);
  EXPECT_EQ(f.get_int("nope", -7), -7);
  EXPECT_EQ(f.get_float("nope", 0.5), 0.5);
  EXPECT_TRUE(f.get_bool("nope", true));
  EXPECT_EQ(f.get_string("nope", "x"), "x");
  EXPECT_EQ(f.get_string("general.name", "x"), "tiny");
  expect_error([&] { f.get_uint("str", 1); }, {"'str' is string"});  // present but wrong: still an error
  const GgufValue& v = *f.find("a.u32");
  expect_error([&] { v.as_int(); }, {"GGUF value is array of u32, expected an integer"});
  expect_error([&] { v.scalar_at(3); }, {"index 3 is out of range for 3 elements"});
  expect_error([&] { v.string_at(0); }, {"expected an array of strings"});
  expect_error([&] { f.find("u8")->size(); }, {"GGUF value is u8, expected an array"});
}

TEST(Gguf, TensorInfosShapesAndData) {
  ScratchDir dir;
  const std::string p = dir.file("t.gguf");
  spit(p, rich(3).build());
  GgufFile f(p);
  EXPECT_EQ(f.path(), p);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.data_offset() % 32, 0u);
  ASSERT_EQ(f.tensors().size(), 3u);
  const GgufFile::TensorInfo& w = f.tensor("w");
  EXPECT_EQ(w.shape, (Shape{2, 3}));  // the file's dims are innermost first
  EXPECT_EQ(w.ne[0], 3);
  EXPECT_EQ(w.ne[1], 2);
  EXPECT_EQ(w.ne[2], 1);
  EXPECT_EQ(w.nelements, 6);
  EXPECT_EQ(w.nbytes, 24u);
  EXPECT_EQ(w.type, QuantType::F32);
  EXPECT_EQ(f.tensor("q").offset, 32u);
  EXPECT_EQ(f.tensor("q").nbytes, 34u);
  EXPECT_EQ(f.tensor("h").offset, 96u);
  EXPECT_EQ(f.dequantize(w), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  std::vector<float> q = f.dequantize(f.tensor("q"));
  for (int i = 0; i < 32; ++i) EXPECT_EQ(q[size_t(i)], 0.5f * float(i - 16));
  std::vector<float> h = f.dequantize(f.tensor("h"));
  EXPECT_EQ(h, (std::vector<float>{1, -2, 0, std::numeric_limits<float>::infinity(), std::ldexp(1.f, -24)}));
  std::vector<uint16_t> hb(5), hh(5);
  f.dequantize(f.tensor("h"), DType::BF16, hb.data());
  f.dequantize(f.tensor("h"), DType::F16, hh.data());
  EXPECT_EQ(hb[1], f32_to_bf16(-2.f));
  EXPECT_EQ(hh, (std::vector<uint16_t>{0x3c00, 0xc000, 0x0000, 0x7c00, 0x0001}));  // copied bit for bit
  EXPECT_EQ(f.find_tensor("nope"), nullptr);
  expect_error([&] { f.tensor("nope"); }, {p, "no tensor named 'nope'"});
  GgufFile::TensorInfo foreign = w;
  foreign.offset = 1 << 20;
  expect_error([&] { f.tensor_bytes(foreign); },
               {p, "tensor 'w': its info does not describe data of this file"});
  foreign = w;
  foreign.nelements = 600;  // more elements than its bytes hold
  expect_error([&] { f.dequantize(foreign); }, {"does not describe"});
}

TEST(Gguf, OtherAlignments) {
  for (uint32_t align : {1u, 8u, 64u, 4096u}) {
    SCOPED_TRACE(align);
    G g;
    g.alignment = align;
    g.kv_u32("general.alignment", align);
    g.tensor("a", {3}, 0, f32_bytes({1, 2, 3})).tensor("b", {32}, 8, q8_0_block());
    g.tensor("c", {2}, 0, f32_bytes({7, 8}));
    GgufFile f(g.build(), "align.gguf");
    EXPECT_EQ(f.alignment(), align);
    EXPECT_EQ(f.data_offset() % align, 0u);
    EXPECT_EQ(f.tensor("b").offset % align, 0u);
    EXPECT_EQ(f.dequantize(f.tensor("c")), (std::vector<float>{7, 8}));
    EXPECT_EQ(f.dequantize(f.tensor("b"))[31], 7.5f);
  }
}

TEST(Gguf, UnsupportedTypesAreNamedWhenDequantized) {
  G g;
  g.tensor("q2", {256}, 10, Bytes(84, 0))
      .tensor("iq", {256}, 16, Bytes(66, 0))
      .tensor("i32", {2}, 26, Bytes(8));
  g.tensor("f", {2}, 0, Bytes(8));
  GgufFile f(g.build(), "types.gguf");
  EXPECT_EQ(f.tensor("q2").type, QuantType::Q2_K);
  EXPECT_EQ(f.tensor_bytes(f.tensor("iq")).size(), 66u);
  std::vector<float> out(256);
  expect_error([&] { f.dequantize(f.tensor("q2"), out.data()); },
               {"types.gguf: tensor 'q2' is Q2_K, which retort cannot dequantize", "Q4_K"});
  expect_error([&] { f.dequantize(f.tensor("iq"), out.data()); }, {"tensor 'iq' is IQ2_XXS"});
  expect_error([&] { f.dequantize(f.tensor("i32"), out.data()); }, {"tensor 'i32' is I32"});
  expect_error([&] { f.dequantize(f.tensor("f"), DType::I32, out.data()); }, {"output dtype must be f32"});
}

TEST(Gguf, EveryTruncationThrowsCleanly) {
  const Bytes full = rich(3).build();
  GgufFile ok(full, "full.gguf");  // the untruncated file is fine
  ScratchDir dir;
  const std::string p = dir.file("cut.gguf");
  int with_truncated = 0;
  for (size_t n = 0; n < full.size(); ++n) {
    const Bytes cut(full.begin(), full.begin() + long(n));
    std::string m = expect_error([&] { GgufFile f(cut, "mem"); }, {"mem: "});
    // Through a real map too, for a spread of lengths (file writes are the slow part).
    if (n % 7 == 0) {
      spit(p, cut);
      EXPECT_EQ(expect_error([&] { GgufFile f(p); }, {p}), p + m.substr(3));
    }
    with_truncated += m.find("truncated") != std::string::npos ||
                      m.find("past the end") != std::string::npos ||
                      m.find("cannot fit") != std::string::npos;
  }
  // Every cut says the file ends too early, except where a count or length read whole already overruns it.
  EXPECT_EQ(with_truncated, int(full.size()));
}

TEST(Gguf, BadHeaders) {
  Bytes b = rich(3).build();
  b[0] = 'X';
  expect_bad(b, {"wrong magic", "GGUF"});
  G g = rich(3);
  g.version = 1;
  expect_bad(g.build(), {"GGUF version 1 is not supported", "versions 2 and 3"});
  g.version = 99;
  expect_bad(g.build(), {"unsupported GGUF version 99"});
  g.version = 0x03000000;
  expect_bad(g.build(), {"big-endian"});
  g = rich(3);
  g.tensor_count = uint64_t(1) << 62;
  expect_bad(g.build(), {"tensor count 4611686018427387904 cannot fit"});
  g = rich(3);
  g.kv_count = uint64_t(1) << 62;
  expect_bad(g.build(), {"metadata key/value count 4611686018427387904 cannot fit"});
  g = rich(3);
  g.kv_count = 30;  // one more than there are: the tensor infos are read as a key/value and fail somewhere
  expect_bad(g.build(), {});
  expect_bad({'G', 'G', 'U', 'F', 3, 0, 0, 0}, {"truncated: tensor count needs 8 bytes at offset 8"});
  expect_bad({}, {"too short"});
}

TEST(Gguf, BadMetadata) {
  G g;
  g.kv_str("k", "v");
  Bytes b = g.build();
  b[24] = 0xff;  // the key's length: 255 + 2^56·... runs past the end
  b[31] = 0x01;
  expect_bad(b, {"key of metadata entry 0: string length", "runs past the end of the file"});
  b = g.build();
  b[24 + 8 + 1 + 4] = 0x40;  // the value's length
  expect_bad(b, {"metadata key 'k': string length 64", "runs past the end"});
  expect_bad(G().kv("k", 13, G::scalar<uint32_t>(0)).build(),
             {"metadata key 'k' type: unknown value type 13"});
  expect_bad(G().kv("k", G::ARRAY, G::array(77, 0, {})).build(),
             {"metadata key 'k' array element type", "77"});
  expect_bad(G().kv("k", G::ARRAY, G::array(G::U64, uint64_t(1) << 62, {})).build(),
             {"metadata key 'k': array of 4611686018427387904 u64 elements cannot fit"});
  expect_bad(G().kv("k", G::ARRAY, G::array(G::ARRAY, uint64_t(1) << 40, {})).build(), {"cannot fit"});
  expect_bad(G().kv_u32("k", 1).kv_u32("k", 2).build(), {"duplicate metadata key 'k'"});
  expect_bad(G().kv("k", G::BOOL, {2}).build(), {"metadata key 'k': bool value 2 is neither 0 nor 1"});
  expect_bad(G().kv("k", G::ARRAY, G::array_of<uint8_t>(G::BOOL, {0, 1, 5})).build(),
             {"bool element 2 is 5"});
  Bytes deep = G::array_of<uint8_t>(G::U8, {1});
  for (int i = 0; i < 8; ++i) deep = G::array(G::ARRAY, 1, deep);
  expect_bad(G().kv("k", G::ARRAY, deep).build(), {"metadata key 'k': arrays nested more than 8 deep"});
  Bytes ok = G::array_of<uint8_t>(G::U8, {1});
  for (int i = 0; i < 7; ++i) ok = G::array(G::ARRAY, 1, ok);
  GgufFile eight(G().kv("k", G::ARRAY, ok).build(), "eight.gguf");  // 8 deep is the limit, allowed
  EXPECT_EQ(eight.find("k")->array_at(0).size(), 1u);
  for (uint32_t a : {0u, 48u, 3u}) {
    SCOPED_TRACE(a);
    expect_bad(G().kv_u32("general.alignment", a).build(),
               {"metadata key 'general.alignment' is " + std::to_string(a) + ", expected a power of two"});
  }
  expect_bad(G().kv_str("general.alignment", "32").build(),
             {"metadata key 'general.alignment' is string, expected an unsigned integer"});
}

TEST(Gguf, BadTensorInfos) {
  const Bytes four = f32_bytes({1});
  expect_bad(G().tensor("t", {}, 0, four).build(), {"tensor 't': n_dims is 0, expected 1 to 4"});
  expect_bad(G().tensor("t", {1, 1, 1, 1, 1}, 0, four).build(), {"tensor 't': n_dims is 5, expected 1 to 4"});
  expect_bad(G().tensor("t", {uint64_t(1) << 32, uint64_t(1) << 32}, 0, four).build(),
             {"tensor 't': dims [4294967296, 4294967296] have more elements than int64 holds"});
  expect_bad(G().tensor("t", {1, uint64_t(1) << 63}, 0, four).build(), {"above int64's range"});
  expect_bad(G().tensor("t", {uint64_t(1) << 62}, 0, four).build(),
             {"tensor 't': 4611686018427387904 elements of F32 overflow a 64-bit byte count"});
  expect_bad(G().tensor("t", {1}, 31, four).build(), {"tensor 't' has unknown ggml type 31"});
  expect_bad(G().tensor("t", {1}, 1000, four).build(), {"unknown ggml type 1000"});
  expect_bad(G().tensor("t", {16}, 2, Bytes(18)).build(),
             {"tensor 't': dim 0 (16) is not a multiple of the Q4_0 block size 32"});
  expect_bad(G().tensor("t", {1}, 0, four).tensor("t", {1}, 0, four).build(), {"duplicate tensor name 't'"});
  expect_bad(G().tensor("t", {1}, 0, four, 8).build(),
             {"tensor 't': data offset 8 is not a multiple of the alignment 32"});
  G past;
  past.tensor("a", {2}, 0, Bytes(8)).tensor("t", {1}, 0, four, uint64_t(1) << 62);
  past.data_bytes = 8;
  expect_bad(past.build(),
             {"tensor 't': its 4 bytes at data offset 4611686018427387904", "run past the end"});
  past = G();
  past.tensor("a", {2}, 0, Bytes(8)).tensor("t", {3}, 0, Bytes(12));
  past.data_bytes = 40;  // t needs [32, 44)
  expect_bad(past.build(), {"tensor 't': its 12 bytes at data offset 32", "past the end of the"});
  expect_bad(G().tensor("a", {16}, 0, Bytes(64), 0).tensor("b", {4}, 0, Bytes(16), 32).build(),
             {"tensor 'b' (data bytes [32, 48)) overlaps tensor 'a' ([0, 64))"});
  expect_bad(G().tensor("a", {4}, 0, Bytes(16), 0).tensor("b", {4}, 0, Bytes(16), 0).build(), {"overlaps"});
  // A zero-element tensor owns no bytes, so it overlaps nothing and may sit at the end of the data.
  GgufFile empty(G().tensor("a", {4}, 0, Bytes(16), 0).tensor("z", {0, 7}, 0, {}, 0).build(), "z.gguf");
  EXPECT_EQ(empty.tensor("z").nelements, 0);
  EXPECT_EQ(empty.tensor("z").shape, (Shape{7, 0}));
  EXPECT_TRUE(empty.dequantize(empty.tensor("z")).empty());
}

TEST(Gguf, MissingFileNamesThePath) {
  expect_error([] { GgufFile f("/nonexistent/model.gguf"); }, {"/nonexistent/model.gguf", "cannot open"});
}

}  // namespace
}  // namespace retort::test
