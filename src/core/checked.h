// Size arithmetic that throws retort::Error instead of wrapping. Every shape rule, allocation, loader and
// cache computes element counts, byte sizes and offsets through these, so a crafted size is refused before
// it can drive an allocation or an index.
#pragma once
#include <cstddef>
#include <cstdint>

#include "error.h"

namespace retort {

// The largest byte size of one tensor or buffer: x86-64 and CUDA address 48 bits of virtual memory, so a
// larger size can never be allocated, and refusing it keeps every later product of sizes far from 2^63.
inline constexpr int64_t kMaxTensorBytes = int64_t(1) << 48;

namespace detail {
template <typename... Ctx>
[[noreturn, gnu::cold, gnu::noinline]] void throw_overflow(const char* sym, const auto& a, const auto& b,
                                                           const Ctx&... ctx) {
  throw_error(concat(ctx..., ": size ", a, " ", sym, " ", b, " overflows"));
}
}  // namespace detail

// a * b; throws retort::Error naming ctx (streamed, formatted only on failure) when it overflows.
template <typename T, typename... Ctx>
T checked_mul(T a, T b, const Ctx&... ctx) {
  T r;
  if (__builtin_mul_overflow(a, b, &r)) [[unlikely]]
    detail::throw_overflow("*", a, b, ctx...);
  return r;
}

// a + b; throws retort::Error naming ctx when it overflows.
template <typename T, typename... Ctx>
T checked_add(T a, T b, const Ctx&... ctx) {
  T r;
  if (__builtin_add_overflow(a, b, &r)) [[unlikely]]
    detail::throw_overflow("+", a, b, ctx...);
  return r;
}

// A count or size read from a file or given by a caller as a signed value that must fit in size_t and stay
// within kMaxTensorBytes; throws naming ctx otherwise.
template <typename... Ctx>
size_t checked_bytes(int64_t n, const Ctx&... ctx) {
  if (n < 0 || n > kMaxTensorBytes) [[unlikely]]
    detail::throw_error(detail::concat(ctx..., ": ", n, " bytes is outside [0, 2^48]"));
  return size_t(n);
}

}  // namespace retort
