// CRC-32 (IEEE 802.3, reflected, polynomial 0xEDB88320), the checksum of every file retort writes. Teacher
// caches are checksummed as they are written, gigabytes per run, so the bulk of the bytes goes through
// carry-less multiplication (PCLMULQDQ) where the CPU has it; the table code takes the rest.
#include <array>
#include <cstdint>
#include <cstring>

#include "file.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace retort::io {

namespace {

// Slice-by-8: table[k][b] is the CRC of byte b followed by k zero bytes, so eight input bytes are folded per
// step with eight independent lookups instead of eight dependent ones.
using CrcTables = std::array<std::array<uint32_t, 256>, 8>;

constexpr CrcTables make_crc_tables() {
  CrcTables t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t c = b;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (0xEDB88320u ^ (c >> 1)) : (c >> 1);
    t[0][b] = c;
  }
  for (int k = 1; k < 8; ++k)
    for (uint32_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xffu];
  return t;
}
constexpr CrcTables kCrc = make_crc_tables();

// The register c (already inverted) advanced over n bytes.
uint32_t crc_tables(uint32_t c, const uint8_t* p, size_t n) {
  while (n >= 8) {
    uint32_t lo = load_le32(p) ^ c;
    uint32_t hi = load_le32(p + 4);
    c = kCrc[7][lo & 0xff] ^ kCrc[6][(lo >> 8) & 0xff] ^ kCrc[5][(lo >> 16) & 0xff] ^ kCrc[4][lo >> 24] ^
        kCrc[3][hi & 0xff] ^ kCrc[2][(hi >> 8) & 0xff] ^ kCrc[1][(hi >> 16) & 0xff] ^ kCrc[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n--) c = (c >> 8) ^ kCrc[0][(c ^ *p++) & 0xffu];
  return c;
}

#if defined(__x86_64__)
// Folding. In the reflected bit order a 128-bit block's bit k is the coefficient of x^(127-k) (its low 64-bit
// half holds the high-degree half H, the other half L), and a carry-less product of two 64-bit halves comes
// out multiplied by an extra x. A block X followed by n more bits is X·x^n: H·x^(n+64) + L·x^n, and each
// term reduces mod P to a 64-bit half times (x^(m-1) mod P), the -1 paying for the product's extra x. The
// register is then the CRC of the last 16 folded bytes (the table code), then of the tail.
constexpr uint64_t xpow_mod(int n) {  // x^n mod P, P = x^32 + 0x04C11DB7, as a normal 32-bit polynomial
  uint64_t r = 1;
  for (int i = 0; i < n; ++i) {
    r <<= 1;
    if (r & (uint64_t(1) << 32)) r ^= 0x104C11DB7ull;
  }
  return r;
}
constexpr uint64_t reflect64(uint64_t q) {  // degree j -> bit 63 - j
  uint64_t r = 0;
  for (int j = 0; j < 32; ++j)
    if (q >> j & 1) r |= uint64_t(1) << (63 - j);
  return r;
}
// {multiplier of H, multiplier of L} for a fold over n bits.
constexpr uint64_t kFold512[2] = {reflect64(xpow_mod(512 + 64 - 1)), reflect64(xpow_mod(512 - 1))};
constexpr uint64_t kFold128[2] = {reflect64(xpow_mod(128 + 64 - 1)), reflect64(xpow_mod(128 - 1))};

__attribute__((target("pclmul,sse4.1"))) inline __m128i fold(__m128i x, __m128i k, __m128i next) {
  const __m128i h = _mm_clmulepi64_si128(x, k, 0x00);  // H · k[0]
  const __m128i l = _mm_clmulepi64_si128(x, k, 0x11);  // L · k[1]
  return _mm_xor_si128(_mm_xor_si128(h, l), next);
}

// The register c advanced over n >= 64 bytes.
__attribute__((target("pclmul,sse4.1"))) uint32_t crc_clmul(uint32_t c, const uint8_t* p, size_t n) {
  auto load = [](const uint8_t* q) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(q)); };
  __m128i x0 = _mm_xor_si128(load(p), _mm_cvtsi32_si128(int(c)));  // the register joins the first bytes
  __m128i x1 = load(p + 16), x2 = load(p + 32), x3 = load(p + 48);
  p += 64;
  n -= 64;
  const __m128i k512 = _mm_set_epi64x(int64_t(kFold512[1]), int64_t(kFold512[0]));
  const __m128i k128 = _mm_set_epi64x(int64_t(kFold128[1]), int64_t(kFold128[0]));
  for (; n >= 64; p += 64, n -= 64) {
    x0 = fold(x0, k512, load(p));
    x1 = fold(x1, k512, load(p + 16));
    x2 = fold(x2, k512, load(p + 32));
    x3 = fold(x3, k512, load(p + 48));
  }
  __m128i x = fold(fold(fold(x0, k128, x1), k128, x2), k128, x3);
  for (; n >= 16; p += 16, n -= 16) x = fold(x, k128, load(p));
  alignas(16) uint8_t last[16];
  _mm_store_si128(reinterpret_cast<__m128i*>(last), x);
  return crc_tables(crc_tables(0, last, 16), p, n);
}

bool has_clmul() {
  static const bool yes = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
  return yes;
}
#endif

}  // namespace

uint32_t crc32_update(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
#if defined(__x86_64__)
  if (n >= 64 && has_clmul()) return ~crc_clmul(~crc, p, n);
#endif
  return ~crc_tables(~crc, p, n);
}

}  // namespace retort::io
