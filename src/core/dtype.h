// Element types and the f32 <-> bf16 / f16 conversions every kernel uses on load and store.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace retort {

enum class DType : uint8_t { F32, BF16, F16, I32, I64 };
inline constexpr int kDTypeCount = 5;

// Bytes per element.
size_t dtype_size(DType t);
// "f32", "bf16", ...
const char* dtype_name(DType t);
// True for f32, bf16, f16.
inline bool is_float(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }
inline bool is_int(DType t) { return t == DType::I32 || t == DType::I64; }

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Round to nearest even; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// Reads element i of a buffer of type t as float / int64 (no bounds check).
inline float load_f32(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::F32: return static_cast<const float*>(p)[i];
    case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::F16: return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::I32: return float(static_cast<const int32_t*>(p)[i]);
    case DType::I64: return float(static_cast<const int64_t*>(p)[i]);
  }
  return 0.f;
}
inline void store_f32(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::F32: static_cast<float*>(p)[i] = v; break;
    case DType::BF16: static_cast<uint16_t*>(p)[i] = f32_to_bf16(v); break;
    case DType::F16: static_cast<uint16_t*>(p)[i] = f32_to_f16(v); break;
    case DType::I32: static_cast<int32_t*>(p)[i] = int32_t(v); break;
    case DType::I64: static_cast<int64_t*>(p)[i] = int64_t(v); break;
  }
}
inline int64_t load_i64(const void* p, DType t, int64_t i) {
  return t == DType::I32 ? int64_t(static_cast<const int32_t*>(p)[i]) : static_cast<const int64_t*>(p)[i];
}

}  // namespace retort
