#include <gtest/gtest.h>

#include <cstring>

#include "harness.h"
#include "io/file.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "io_test_util.h"
#include "retort.h"

namespace retort::test {
namespace {

// Writes a safetensors file by hand: header JSON (unpadded) and raw data.
void write_raw(const std::string& path, const std::string& header, const std::vector<uint8_t>& data,
               uint64_t claimed_len = UINT64_MAX) {
  std::vector<uint8_t> b(8 + header.size() + data.size());
  io::store_le64(b.data(), claimed_len == UINT64_MAX ? header.size() : claimed_len);
  std::copy(header.begin(), header.end(), b.begin() + 8);
  std::copy(data.begin(), data.end(), b.begin() + 8 + long(header.size()));
  spit(path, b);
}

TEST(Safetensors, RoundTripsEveryDtypeAndMetadata) {
  Context ctx(default_cpu_backend());
  reseed("safetensors");
  Tensor* f32 = ctx.tensor(DType::F32, {3, 5}, "w");
  Tensor* bf16 = ctx.tensor(DType::BF16, {2, 3, 4});
  Tensor* f16 = ctx.tensor(DType::F16, {7});
  Tensor* i32 = ctx.tensor(DType::I32, {2, 2});
  Tensor* i64 = ctx.tensor(DType::I64, {1, 1, 2, 3});
  std::vector<float> vf = [] {
    std::vector<float> v;
    for (double x : random_vec(15)) v.push_back(float(x));
    return v;
  }();
  set_data(f32, vf);
  set_data(bf16, std::vector<float>(24, 0.f));
  std::vector<float> vb;
  for (double x : random_vec(24, -100, 100)) vb.push_back(float(x));
  set_data(bf16, vb);
  std::vector<float> vh;
  for (double x : random_vec(7, -3, 3)) vh.push_back(float(x));
  set_data(f16, vh);
  set_data_int(i32, {1, -2, 2147483647, -2147483647 - 1});
  set_data_int(i64, {int64_t(1) << 40, -1, 0, 5, -(int64_t(1) << 50), 7});
  ScratchDir dir;
  std::string p = dir.file("model.safetensors");
  std::map<std::string, std::string> meta = {{"config", "{\"dim\": 64, \"name\": \"tiny\"}"},
                                             {"step", "1200"}};
  save_safetensors(
      p, {{"embed.weight", f32}, {"layers.0.bf16", bf16}, {"h", f16}, {"ids", i32}, {"big", i64}}, meta);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"model.safetensors"});

  SafeTensors st = load_safetensors(p);
  EXPECT_EQ(st.metadata(), meta);
  EXPECT_EQ(st.names(), (std::vector<std::string>{"embed.weight", "layers.0.bf16", "h", "ids", "big"}));
  EXPECT_EQ(st.shape("embed.weight"), (Shape{3, 5}));
  EXPECT_EQ(st.shape("big"), (Shape{2, 3})) << "outer 1s are not part of a retort tensor's shape";
  EXPECT_EQ(st.dtype("layers.0.bf16"), DType::BF16);
  EXPECT_EQ(st.bytes("h").size(), 14u);
  EXPECT_TRUE(st.has("ids"));
  EXPECT_FALSE(st.has("nope"));
  expect_error([&] { st.entry("nope"); }, {p, "no tensor named \"nope\""});

  Context ctx2(default_cpu_backend());
  Tensor* f32b = ctx2.tensor(DType::F32, {3, 5});
  Tensor* bf16b = ctx2.tensor(DType::BF16, {2, 3, 4});
  Tensor* f16b = ctx2.tensor(DType::F16, {7});
  Tensor* i32b = ctx2.tensor(DType::I32, {2, 2});
  Tensor* i64b = ctx2.tensor(DType::I64, {2, 3});  // [1, 1, 2, 3] == [2, 3]
  st.load_into(f32b, "embed.weight");
  st.load_into(bf16b, "layers.0.bf16");
  st.load_into(f16b, "h");
  st.load_into(i32b, "ids");
  st.load_into(i64b, "big");
  EXPECT_EQ(get_bytes(f32b), get_bytes(f32));  // bit-exact
  EXPECT_EQ(get_bytes(bf16b), get_bytes(bf16));
  EXPECT_EQ(get_bytes(f16b), get_bytes(f16));
  EXPECT_EQ(get_data_int(i32b), get_data_int(i32));
  EXPECT_EQ(get_data_int(i64b), get_data_int(i64));
  EXPECT_EQ(get_data(f32b), vf);

  // The header is plain safetensors: 8-byte length, JSON, data 8-byte aligned.
  std::vector<uint8_t> raw = slurp(p);
  uint64_t n = io::load_le64(raw.data());
  EXPECT_EQ((8 + n) % 8, 0u);
  io::Json h = io::parse_json(std::string(raw.begin() + 8, raw.begin() + 8 + long(n)), p);
  EXPECT_EQ(h.find("embed.weight")->find("dtype")->string, "F32");
  EXPECT_EQ(h.find("h")->find("data_offsets")->items[1].integer -
                h.find("h")->find("data_offsets")->items[0].integer,
            14);
}

TEST(Safetensors, StridedTensorsAreSavedContiguously) {
  Context ctx(default_cpu_backend());
  Tensor* a = ctx.tensor(DType::F32, {4, 6});
  std::vector<float> v(24);
  for (int i = 0; i < 24; ++i) v[size_t(i)] = float(i);
  set_data(a, v);
  Tensor* at = transpose(ctx, a);  // a strided view [6, 4]
  ScratchDir dir;
  save_safetensors(dir.file("t.safetensors"), {{"at", at}});
  SafeTensors st(dir.file("t.safetensors"));
  EXPECT_EQ(st.shape("at"), (Shape{6, 4}));
  Tensor* back = ctx.tensor(DType::F32, {6, 4});
  st.load_into(back, "at");
  EXPECT_EQ(get_data(back), get_data(at));
}

TEST(Safetensors, LoadIntoChecksShapeAndDtype) {
  Context ctx(default_cpu_backend());
  Tensor* w = ctx.tensor(DType::F32, {3, 5}, "w");
  ScratchDir dir;
  std::string p = dir.file("m.safetensors");
  save_safetensors(p, {{"w", w}});
  SafeTensors st(p);
  expect_error(
      [&] {
        st.load_into(ctx.tensor(DType::BF16, {3, 5}, "wb"), "w");
      },
      {p, "\"w\"", "f32", "bf16"});
  expect_error(
      [&] {
        st.load_into(ctx.tensor(DType::F32, {5, 3}, "wt"), "w");
      },
      {p, "\"w\"", "[3, 5]", "[5, 3]"});
  expect_error([&] { st.load_into(ctx.tensor(DType::F32, {15}, "flat"), "w"); }, {p, "[3, 5]", "[15]"});
  st.load_into(ctx.tensor(DType::F32, {1, 3, 5}), "w");  // a leading 1 is fine
}

TEST(Safetensors, SaveRejectsBadNames) {
  Context ctx(default_cpu_backend());
  Tensor* w = ctx.tensor(DType::F32, {2});
  ScratchDir dir;
  std::string p = dir.file("m.safetensors");
  expect_error([&] { save_safetensors(p, {{"a", w}, {"a", w}}); }, {p, "\"a\" is given twice"});
  expect_error([&] { save_safetensors(p, {{"", w}}); }, {p, "empty name"});
  expect_error([&] { save_safetensors(p, {{"__metadata__", w}}); }, {p, "reserved"});
  expect_error([&] { save_safetensors(p, {{"x", nullptr}}); }, {p, "null"});
  EXPECT_TRUE(dir.entries().empty());
}

TEST(Safetensors, AtomicSaveKeepsTheOldCheckpointOnFailure) {
  Context ctx(default_cpu_backend());
  Tensor* w = ctx.tensor(DType::F32, {2});
  set_data(w, {1.f, 2.f});
  ScratchDir dir;
  std::string p = dir.file("m.safetensors");
  save_safetensors(p, {{"w", w}});
  std::vector<uint8_t> before = slurp(p);
  expect_error([&] { save_safetensors(p, {{"w", w}, {"w", w}}); }, {"given twice"});
  EXPECT_EQ(slurp(p), before);
  expect_error(
      [&] {
        save_safetensors("/nonexistent-dir/m.safetensors", {{"w", w}});
      },
      {"/nonexistent-dir/m.safetensors", "cannot create"});
}

TEST(Safetensors, ReadsHandWrittenFilesWithEmptyAndScalarTensors) {
  ScratchDir dir;
  std::string p = dir.file("h.safetensors");
  std::vector<uint8_t> data(12);
  float one = 1.5f;
  std::memcpy(data.data(), &one, 4);
  int64_t seven = 7;
  std::memcpy(data.data() + 4, &seven, 8);
  write_raw(p,
            R"({"s":{"dtype":"F32","shape":[],"data_offsets":[0,4]},"e":{"dtype":"BF16","shape":[0,3],)"
            R"("data_offsets":[4,4]},"i":{"dtype":"I64","shape":[1],"data_offsets":[4,12]}})",
            data);
  SafeTensors st(p);
  EXPECT_EQ(st.shape("s"), Shape{});
  EXPECT_EQ(st.shape("e"), (Shape{0, 3}));
  EXPECT_EQ(st.bytes("e").size(), 0u);
  EXPECT_TRUE(st.metadata().empty());
  Context ctx(default_cpu_backend());
  Tensor* s = ctx.tensor(DType::F32, {1});
  st.load_into(s, "s");  // a scalar loads into a one-element tensor
  EXPECT_EQ(get_data(s), std::vector<float>{1.5f});
  Tensor* i = ctx.tensor(DType::I64, {1});
  st.load_into(i, "i");
  EXPECT_EQ(get_data_int(i), std::vector<int64_t>{7});
}

TEST(Safetensors, CorruptFilesAreRejected) {
  ScratchDir dir;
  std::string p = dir.file("bad.safetensors");
  const std::vector<uint8_t> d8(8);
  struct Bad {
    std::string header;
    std::vector<uint8_t> data;
    std::vector<std::string> needles;
  };
  const std::string ok = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const Bad cases[] = {
      {R"({"a":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})",
       d8,
       {"\"a\"", "dtype \"F64\" is not supported"}},
      {R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",
       d8,
       {"\"a\"", "needs 12 bytes", "span 8"}},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", d8, {"\"a\"", "run past the 8 bytes"}},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", d8, {"\"a\"", "data_offsets must be"}},
      {R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", d8, {"\"a\"", "shape"}},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", d8, {"unknown field \"x\""}},
      {R"({"a":{"dtype":"F32","shape":[2]}})", d8, {"needs dtype, shape and data_offsets"}},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})",
       d8,
       {"overlaps"}},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", d8, {"bytes [0, 4)", "hole"}},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", d8, {"size mismatch", "end at byte 4"}},
      {R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,8]}})",
       d8,
       {"absurdly many elements"}},
      {R"({"__metadata__":{"k":1}})", {}, {"__metadata__ value of \"k\"", "expected a string"}},
      {R"([1,2])", {}, {"JSON array, expected an object"}},
      {R"({"a":{"dtype":"F32")", d8, {"malformed JSON"}},
  };
  for (const Bad& c : cases) {
    SCOPED_TRACE(c.header);
    write_raw(p, c.header, c.data);
    std::vector<std::string> needles = c.needles;
    needles.push_back(p);
    expect_error([&] { SafeTensors st(p); }, needles);
  }
  // Absurd or lying header lengths, and files too short for one.
  write_raw(p, ok, d8, uint64_t(1) << 60);
  expect_error([&] { SafeTensors st(p); }, {p, "header length 1152921504606846976 exceeds"});
  write_raw(p, ok, d8, 1000);
  expect_error([&] { SafeTensors st(p); }, {p, "header length 1000 exceeds"});
  write_raw(p, ok, d8);
  SafeTensors fine(p);
  EXPECT_EQ(fine.shape("a"), Shape{2});
  truncate_to(p, 8 + ok.size() + 4);
  expect_error([&] { SafeTensors st(p); }, {p, "run past"});
  truncate_to(p, 5);
  expect_error([&] { SafeTensors st(p); }, {p, "truncated", "header length"});
  std::vector<uint8_t> huge_header(8 + (size_t(100) << 20) + 1, ' ');
  io::store_le64(huge_header.data(), (uint64_t(100) << 20) + 1);
  spit(p, huge_header);
  expect_error([&] { SafeTensors st(p); }, {p, "absurd"});
}

}  // namespace
}  // namespace retort::test
