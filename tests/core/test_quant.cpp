// The block decoders of src/core/quant.h against float64 decodings written here from the format's description
// (the exact bit-for-bit check against gguf.quants is bindings/tests/test_gguf.py).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "core/quant.h"
#include "harness.h"
#include "retort.h"

namespace retort::test {
namespace {

using Bytes = std::vector<uint8_t>;

void expect_throws_with(const std::function<void()>& fn, const std::string& needle) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    return;
  }
  ADD_FAILURE() << "expected retort::Error with \"" << needle << "\"";
}

double half(const uint8_t* p) {
  const int h = p[0] | (p[1] << 8);
  const int e = (h >> 10) & 31, m = h & 1023;
  const double mag = e == 0    ? std::ldexp(m, -24)
                     : e == 31 ? (m ? NAN : INFINITY)
                               : std::ldexp(1024 + m, e - 25);
  return (h & 0x8000) ? -mag : mag;
}

int bit(const uint8_t* p, int i) {
  return (p[i / 8] >> (i % 8)) & 1;
}

// A float64 value and the size of the terms it came from (the rounding scale of the f32 decoder).
struct RefValue {
  double v, scale;
};
using RefDecoder = std::function<RefValue(const uint8_t* block, int i)>;

// Random blocks whose f16 scale fields (at the given offsets) hold finite values in [2^-10, 2^-2).
Bytes random_blocks(int nblocks, int block_bytes, std::vector<int> half_offsets) {
  Bytes b(size_t(nblocks * block_bytes));
  for (uint8_t& x : b) x = uint8_t(rng()() & 0xff);
  for (int k = 0; k < nblocks; ++k)
    for (int off : half_offsets) {
      const int h = int(0x1400 + rng()() % 0x2000) | int(rng()() & 1) << 15;  // exponent 5..12, either sign
      b[size_t(k * block_bytes + off)] = uint8_t(h);
      b[size_t(k * block_bytes + off + 1)] = uint8_t(h >> 8);
    }
  return b;
}

void check_type(QuantType t, std::vector<int> half_offsets, const RefDecoder& ref) {
  SCOPED_TRACE(quant_name(t));
  reseed(quant_name(t));
  const QuantTraits& tr = quant_traits(t);
  const int nblocks = tr.block_elems == 1 ? 4096 : 3;  // plain types: enough to meet NaN, inf, subnormals
  Bytes src = random_blocks(nblocks, int(tr.block_bytes), std::move(half_offsets));
  std::vector<float> out(size_t(nblocks * tr.block_elems));
  dequantize(t, src.data(), out.data(), int64_t(out.size()));
  for (int k = 0; k < nblocks; ++k)
    for (int i = 0; i < int(tr.block_elems); ++i) {
      const RefValue r = ref(src.data() + k * tr.block_bytes, i);
      const double got = out[size_t(k * tr.block_elems + i)];
      if (std::isnan(r.v)) {
        ASSERT_TRUE(std::isnan(got)) << "block " << k << " elem " << i;
        continue;
      }
      // At most three f32 roundings, each within 2^-24 of the terms' magnitude.
      ASSERT_LE(std::fabs(got - r.v), 4 * std::ldexp(r.scale, -24) + 1e-30) << "block " << k << " elem " << i;
    }
  // The 16-bit outputs are the f32 results rounded once, or the source bits when the type is the output's.
  std::vector<uint16_t> bf(out.size()), hf(out.size());
  dequantize(t, src.data(), DType::BF16, bf.data(), int64_t(out.size()));
  dequantize(t, src.data(), DType::F16, hf.data(), int64_t(out.size()));
  const auto* src16 = reinterpret_cast<const uint16_t*>(src.data());
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_EQ(bf[i], t == QuantType::BF16 ? src16[i] : f32_to_bf16(out[i])) << i;
    ASSERT_EQ(hf[i], t == QuantType::F16 ? src16[i] : f32_to_f16(out[i])) << i;
  }
}

TEST(Quant, HalfToFloatIsExactForEveryBitPattern) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint8_t p[2] = {uint8_t(h), uint8_t(h >> 8)};
    const float got = quant::half_to_f32(h);
    const double want = half(p);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << h;
      ASSERT_EQ(quant::f32_to_bits(got) & 0x7fffffu, (h & 0x3ffu) << 13) << "payload kept, " << h;
    } else {
      ASSERT_EQ(double(got), want) << h;
      ASSERT_EQ(std::signbit(got), bool(h & 0x8000)) << h;
    }
    ASSERT_EQ(quant::f32_to_bits(quant::bf16_bits_to_f32(h)), h << 16) << h;
  }
}

TEST(Quant, TraitsMatchGgml) {
  EXPECT_STREQ(quant_name(QuantType::Q4_K), "Q4_K");
  EXPECT_EQ(quant_traits(QuantType::Q6_K).block_bytes, 210);
  EXPECT_EQ(quant_traits(QuantType::Q5_1).block_elems, 32);
  EXPECT_TRUE(quant_traits(QuantType::BF16).dequantizable);
  EXPECT_FALSE(quant_traits(QuantType::Q3_K).dequantizable);
  for (uint32_t retired : {4u, 5u, 31u, 32u, 33u, 36u, 37u, 38u, 40u, 1000u})
    EXPECT_EQ(find_quant_traits(retired), nullptr) << retired;
}

TEST(Quant, PlainTypes) {
  check_type(QuantType::F16, {}, [](const uint8_t* b, int) { return RefValue{half(b), 0}; });
  check_type(QuantType::BF16, {}, [](const uint8_t* b, int) {
    uint32_t u = uint32_t(b[0] | (b[1] << 8)) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return RefValue{f, 0};
  });
}

TEST(Quant, LegacyBlocks) {
  auto nib = [](const uint8_t* qs, int i) { return i < 16 ? qs[i] & 15 : qs[i - 16] >> 4; };
  check_type(QuantType::Q8_0, {0}, [](const uint8_t* b, int i) {
    const double d = half(b), q = int8_t(b[2 + i]);
    return RefValue{d * q, std::fabs(d * q)};
  });
  check_type(QuantType::Q4_0, {0}, [&](const uint8_t* b, int i) {
    const double d = half(b), q = nib(b + 2, i) - 8;
    return RefValue{d * q, std::fabs(d * q)};
  });
  check_type(QuantType::Q4_1, {0, 2}, [&](const uint8_t* b, int i) {
    const double d = half(b), m = half(b + 2), q = nib(b + 4, i);
    return RefValue{d * q + m, std::fabs(d * q) + std::fabs(m)};
  });
  check_type(QuantType::Q5_0, {0}, [&](const uint8_t* b, int i) {
    const double d = half(b), q = nib(b + 6, i) + 16 * bit(b + 2, i) - 16;
    return RefValue{d * q, std::fabs(d * q)};
  });
  check_type(QuantType::Q5_1, {0, 2}, [&](const uint8_t* b, int i) {
    const double d = half(b), m = half(b + 2), q = nib(b + 8, i) + 16 * bit(b + 4, i);
    return RefValue{d * q + m, std::fabs(d * q) + std::fabs(m)};
  });
}

// The 6-bit scale (which = 0) or min (which = 1) of sub-block j, straight from the bit diagram: the 12 bytes
// as 96 bits; scales 0-3 and mins 0-3 are bits 0-5 of bytes 0-3 / 4-7; scales and mins 4-7 take their low
// nibble from byte 8 + (j - 4) (scale: bits 0-3, min: bits 4-7) and bits 4-5 from bits 6-7 of bytes j - 4
// (scale) or j (min).
int k_scale(const uint8_t* s, int j, int which) {
  if (j < 4) return s[j + 4 * which] & 63;
  const int low = which == 0 ? s[j + 4] & 15 : s[j + 4] >> 4;
  const int high = (which == 0 ? s[j - 4] : s[j]) >> 6;
  return low + 16 * high;
}

TEST(Quant, KQuants) {
  check_type(QuantType::Q4_K, {0, 2}, [](const uint8_t* b, int e) {
    const int j = e / 32, i = e % 32;
    const double d = half(b) * k_scale(b + 4, j, 0), m = half(b + 2) * k_scale(b + 4, j, 1);
    const int q = (b[16 + 32 * (j / 2) + i] >> (4 * (j % 2))) & 15;
    return RefValue{d * q - m, std::fabs(d * q) + std::fabs(m)};
  });
  check_type(QuantType::Q5_K, {0, 2}, [](const uint8_t* b, int e) {
    const int j = e / 32, i = e % 32;
    const double d = half(b) * k_scale(b + 4, j, 0), m = half(b + 2) * k_scale(b + 4, j, 1);
    const int q = ((b[48 + 32 * (j / 2) + i] >> (4 * (j % 2))) & 15) + 16 * ((b[16 + i] >> j) & 1);
    return RefValue{d * q - m, std::fabs(d * q) + std::fabs(m)};
  });
  check_type(QuantType::Q6_K, {208}, [](const uint8_t* b, int e) {
    // Element e = 128 h + 32 g + i: low nibble from ql[64 h + 32 (g % 2) + i] (high nibble when g >= 2),
    // top bits from qh[32 h + i] bits 2g, 2g + 1.
    const int h = e / 128, g = (e % 128) / 32, i = e % 32;
    const int lo = (b[64 * h + 32 * (g % 2) + i] >> (g >= 2 ? 4 : 0)) & 15;
    const int hi = (b[128 + 32 * h + i] >> (2 * g)) & 3;
    const double d = half(b + 208) * int8_t(b[192 + e / 16]);
    const double q = lo + 16 * hi - 32;
    return RefValue{d * q, std::fabs(d * q)};
  });
}

TEST(Quant, RowErrors) {
  std::vector<uint8_t> src(2 * 34);
  std::vector<float> out(64);
  expect_throws_with([&] { dequantize(QuantType::Q8_0, src.data(), out.data(), 40); },
                     "40 elements of Q8_0 are not a whole number of its 32-element blocks");
  expect_throws_with([&] { dequantize(QuantType::Q8_0, src.data(), out.data(), -32); }, "-32 elements");
  expect_throws_with([&] { dequantize(QuantType::Q2_K, src.data(), out.data(), 256); },
                     "type Q2_K is not supported");
  expect_throws_with([&] { dequantize(QuantType::F32, src.data(), DType::I64, out.data(), 4); },
                     "output dtype must be f32, bf16 or f16");
  dequantize(QuantType::Q8_0, src.data(), out.data(), 0);  // nothing to do is fine
}

}  // namespace
}  // namespace retort::test
