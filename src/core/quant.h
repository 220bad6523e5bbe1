// ggml's tensor types as GGUF files name them, and the block decoders that turn quantized blocks into floats.
// The decoders are inline functions over bytes that compile for the host and, under nvcc, for the device, so
// a CUDA dequantization kernel decodes exactly as the CPU reference does. Layouts follow the reference
// implementation gguf.quants (the `gguf` Python package); each decoder's comment states its block layout.
#pragma once
#include <cstddef>
#include <cstdint>

#include "dtype.h"

#if defined(__CUDACC__)
#define RT_HD __host__ __device__
#else
#define RT_HD
#endif

namespace retort {

// ggml type ids, as stored in a GGUF tensor info. Gaps (4, 5, 31-33, 36-38) are ids ggml retired.
enum class QuantType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
  MXFP4 = 39,
};

struct QuantTraits {
  const char* name;     // "Q4_K", as ggml spells it
  int64_t block_elems;  // elements per block (1 for the plain types)
  int64_t block_bytes;  // bytes per block
  bool dequantizable;   // retort can decode it (F32, F16, BF16, Q8_0, Q4_0/1, Q5_0/1, Q4_K, Q5_K, Q6_K)
};

// The traits of a type id read from a file, or nullptr when ggml defines no type with that id.
const QuantTraits* find_quant_traits(uint32_t id);
// The traits of a type (every enumerator has them).
const QuantTraits& quant_traits(QuantType t);
inline const char* quant_name(QuantType t) {
  return quant_traits(t).name;
}
// "F32, F16, BF16, Q8_0, ..." for messages.
const char* dequantizable_types();

// Decodes n elements of type t from src into dst. Throws retort::Error when t cannot be decoded or n is not
// a non-negative multiple of its block size. src holds n / block_elems blocks; nothing is read past them.
void dequantize(QuantType t, const uint8_t* src, float* dst, int64_t n);
// The same into a buffer of dtype out (F32, BF16 or F16; F16 and BF16 data are copied bit for bit when out
// matches). Throws retort::Error for an integer out dtype as well.
void dequantize(QuantType t, const uint8_t* src, DType out, void* dst, int64_t n);

namespace quant {

inline constexpr int kQK = 32;    // elements per block of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0
inline constexpr int kQKK = 256;  // elements per super-block of the K-quants

// Byte loads, so blocks decode at any alignment and on any host.
RT_HD inline uint32_t ld16(const uint8_t* p) {
  return uint32_t(p[0]) | (uint32_t(p[1]) << 8);
}
RT_HD inline uint32_t ld32(const uint8_t* p) {
  return ld16(p) | (ld16(p + 2) << 16);
}

RT_HD inline float bits_to_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
#endif
}
RT_HD inline uint32_t f32_to_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  return u;
#endif
}

// IEEE half to float, exact for every input (subnormals, infinities, NaN payloads).
RT_HD inline float half_to_f32(uint32_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  // A subnormal half is mant * 2^-24, which float represents exactly.
  if (exp == 0) return bits_to_f32(sign | f32_to_bits(float(mant) * 5.9604644775390625e-8f));
  if (exp == 31) return bits_to_f32(sign | 0x7f800000u | (mant << 13));
  return bits_to_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}
RT_HD inline float bf16_bits_to_f32(uint32_t h) {
  return bits_to_f32(h << 16);
}

// One rounding per operation, in the reference's order: nvcc would otherwise fuse a * b + c into an FMA and
// the device would differ from the CPU in the last bit.
RT_HD inline float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
RT_HD inline float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
RT_HD inline float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

// Q8_0 (34 bytes): f16 d, 32 int8 q. x = q * d.
RT_HD inline void dequant_q8_0(const uint8_t* b, float* y) {
  const float d = half_to_f32(ld16(b));
  for (int i = 0; i < kQK; ++i) y[i] = mul_rn(float(int8_t(b[2 + i])), d);
}

// Q4_0 (18 bytes): f16 d, 16 bytes whose low nibbles are elements 0..15 and high nibbles 16..31.
// x = (q - 8) * d.
RT_HD inline void dequant_q4_0(const uint8_t* b, float* y) {
  const float d = half_to_f32(ld16(b));
  const uint8_t* qs = b + 2;
  for (int j = 0; j < kQK / 2; ++j) {
    y[j] = mul_rn(d, float(int(qs[j] & 0xfu) - 8));
    y[j + kQK / 2] = mul_rn(d, float(int(qs[j] >> 4) - 8));
  }
}

// Q4_1 (20 bytes): f16 d, f16 m, nibbles as in Q4_0. x = q * d + m.
RT_HD inline void dequant_q4_1(const uint8_t* b, float* y) {
  const float d = half_to_f32(ld16(b)), m = half_to_f32(ld16(b + 2));
  const uint8_t* qs = b + 4;
  for (int j = 0; j < kQK / 2; ++j) {
    y[j] = add_rn(mul_rn(d, float(qs[j] & 0xfu)), m);
    y[j + kQK / 2] = add_rn(mul_rn(d, float(qs[j] >> 4)), m);
  }
}

// Q5_0 (22 bytes): f16 d, u32 qh (bit j is the fifth bit of element j), nibbles as in Q4_0.
// x = (q - 16) * d.
RT_HD inline void dequant_q5_0(const uint8_t* b, float* y) {
  const float d = half_to_f32(ld16(b));
  const uint32_t qh = ld32(b + 2);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < kQK / 2; ++j) {
    const int lo = int((qs[j] & 0xfu) | (((qh >> j) & 1u) << 4));
    const int hi = int((qs[j] >> 4) | (((qh >> (j + kQK / 2)) & 1u) << 4));
    y[j] = mul_rn(d, float(lo - 16));
    y[j + kQK / 2] = mul_rn(d, float(hi - 16));
  }
}

// Q5_1 (24 bytes): f16 d, f16 m, u32 qh, nibbles, as Q5_0. x = q * d + m.
RT_HD inline void dequant_q5_1(const uint8_t* b, float* y) {
  const float d = half_to_f32(ld16(b)), m = half_to_f32(ld16(b + 2));
  const uint32_t qh = ld32(b + 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < kQK / 2; ++j) {
    const uint32_t lo = (qs[j] & 0xfu) | (((qh >> j) & 1u) << 4);
    const uint32_t hi = (qs[j] >> 4) | (((qh >> (j + kQK / 2)) & 1u) << 4);
    y[j] = add_rn(mul_rn(d, float(lo)), m);
    y[j + kQK / 2] = add_rn(mul_rn(d, float(hi)), m);
  }
}

// The 6-bit scale and min of sub-block j (of 8) from the 12 packed bytes of Q4_K / Q5_K: for j < 4 they are
// the low 6 bits of bytes j and j + 4; for j >= 4 byte j + 4 holds their low 4 bits (scale low nibble, min
// high nibble) and the top 2 bits of bytes j - 4 (scale) and j (min) hold their high 2 bits.
RT_HD inline void k_scale_min(const uint8_t* s, int j, uint32_t& sc, uint32_t& mn) {
  if (j < 4) {
    sc = s[j] & 63u;
    mn = s[j + 4] & 63u;
  } else {
    sc = (s[j + 4] & 0xfu) | ((uint32_t(s[j - 4]) >> 6) << 4);
    mn = (uint32_t(s[j + 4]) >> 4) | ((uint32_t(s[j]) >> 6) << 4);
  }
}

// Q4_K (144 bytes): f16 d, f16 dmin, 12 bytes of scales and mins (k_scale_min), 128 bytes of nibbles: bytes
// 32c..32c+31 hold sub-block 2c in their low nibbles and 2c+1 in their high nibbles.
// x = (d * scale) * q - dmin * min.
RT_HD inline void dequant_q4_k(const uint8_t* b, float* y) {
  const float d = half_to_f32(ld16(b)), dmin = half_to_f32(ld16(b + 2));
  const uint8_t* scales = b + 4;
  const uint8_t* qs = b + 16;
  for (int j = 0; j < 8; ++j) {
    uint32_t sc, mn;
    k_scale_min(scales, j, sc, mn);
    const float dl = mul_rn(d, float(sc)), ml = mul_rn(dmin, float(mn));
    const uint8_t* q = qs + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    for (int i = 0; i < 32; ++i) y[32 * j + i] = sub_rn(mul_rn(dl, float((q[i] >> shift) & 0xfu)), ml);
  }
}

// Q5_K (176 bytes): f16 d, f16 dmin, 12 bytes of scales and mins, 32 bytes qh (bit j of byte i is the fifth
// bit of element i of sub-block j), 128 bytes of nibbles as in Q4_K. x = (d * scale) * q - dmin * min.
RT_HD inline void dequant_q5_k(const uint8_t* b, float* y) {
  const float d = half_to_f32(ld16(b)), dmin = half_to_f32(ld16(b + 2));
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + 48;
  for (int j = 0; j < 8; ++j) {
    uint32_t sc, mn;
    k_scale_min(scales, j, sc, mn);
    const float dl = mul_rn(d, float(sc)), ml = mul_rn(dmin, float(mn));
    const uint8_t* q = qs + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    for (int i = 0; i < 32; ++i) {
      const uint32_t v = ((q[i] >> shift) & 0xfu) | (((uint32_t(qh[i]) >> j) & 1u) << 4);
      y[32 * j + i] = sub_rn(mul_rn(dl, float(v)), ml);
    }
  }
}

// Q6_K (210 bytes): 128 bytes ql, 64 bytes qh, 16 int8 scales, f16 d. Each half h of 128 elements uses ql
// bytes 64h.. (element k < 64: low nibble of byte k, else high nibble of byte k - 64) and qh bytes 32h..
// (bits 2g..2g+1 of byte k % 32 for g = k / 32 are the top two bits). Element e has scale e / 16.
// x = (d * scale) * (q - 32).
RT_HD inline void dequant_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const uint8_t* scales = b + 192;
  const float d = half_to_f32(ld16(b + 208));
  for (int e = 0; e < kQKK; ++e) {
    const int h = e / 128, k = e % 128;
    const uint32_t lo = (uint32_t(ql[64 * h + k % 64]) >> (4 * (k / 64))) & 0xfu;
    const uint32_t hi = (uint32_t(qh[32 * h + k % 32]) >> (2 * (k / 32))) & 3u;
    const float dl = mul_rn(d, float(int8_t(scales[e / 16])));
    y[e] = mul_rn(dl, float(int(lo | (hi << 4)) - 32));
  }
}

// Decodes one block of type t (one element for F32, F16, BF16) into y. Returns false, writing nothing, for a
// type retort cannot decode.
RT_HD inline bool dequant_block(QuantType t, const uint8_t* b, float* y) {
  switch (t) {
    case QuantType::F32:
      *y = bits_to_f32(ld32(b));
      return true;
    case QuantType::F16:
      *y = half_to_f32(ld16(b));
      return true;
    case QuantType::BF16:
      *y = bf16_bits_to_f32(ld16(b));
      return true;
    case QuantType::Q8_0:
      dequant_q8_0(b, y);
      return true;
    case QuantType::Q4_0:
      dequant_q4_0(b, y);
      return true;
    case QuantType::Q4_1:
      dequant_q4_1(b, y);
      return true;
    case QuantType::Q5_0:
      dequant_q5_0(b, y);
      return true;
    case QuantType::Q5_1:
      dequant_q5_1(b, y);
      return true;
    case QuantType::Q4_K:
      dequant_q4_k(b, y);
      return true;
    case QuantType::Q5_K:
      dequant_q5_k(b, y);
      return true;
    case QuantType::Q6_K:
      dequant_q6_k(b, y);
      return true;
    default:
      return false;
  }
}

}  // namespace quant

}  // namespace retort
