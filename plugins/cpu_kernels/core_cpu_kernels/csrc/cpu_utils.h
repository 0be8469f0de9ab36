// What every kernel of this package shares: per-ISA function clones and float loads
// (16-bit and FP8 values to float32, float32 to 16-bit).

#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>

#include "fp8.h"

// Build one copy per vector ISA and pick at load time, so a wheel built on one x86
// machine runs well on another; the loops are written for auto-vectorization. The
// x86-64 levels are chosen by CPU features; "arch=haswell" clones are chosen by CPU model
// and so never run on AMD processors (they fell back to the SSE2 copy there).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CORE_MULTIVERSION \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CORE_MULTIVERSION
#endif
// Helpers must inline into each clone, or they run with the baseline ISA; that is also why
// the hot loops avoid std::min / std::max (GCC will not inline them across targets).
#define CORE_INLINE inline __attribute__((always_inline))

namespace core_cpu {

CORE_INLINE float to_float(float x) { return x; }
CORE_INLINE float to_float(c10::Half x) { return static_cast<float>(x); }
// bf16 is the top half of a float32: a shift the compiler vectorizes.
CORE_INLINE float to_float(c10::BFloat16 x) {
  const uint32_t bits = static_cast<uint32_t>(x.x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
// An FP8 value as stored (an FP8 KV cache's scale is the caller's to apply).
template <int EXPONENT_BITS>
CORE_INLINE float to_float(Fp8<EXPONENT_BITS> x) {
  return fp8_to_float(x);
}

template <typename T>
CORE_INLINE T from_float(float x);
template <>
CORE_INLINE float from_float<float>(float x) {
  return x;
}
template <>
CORE_INLINE c10::Half from_float<c10::Half>(float x) {
  return static_cast<c10::Half>(x);
}
// Round to nearest even, as torch's conversion does (a NaN stays a quiet NaN), written
// with integer ops the compiler vectorizes.
template <>
CORE_INLINE c10::BFloat16 from_float<c10::BFloat16>(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const uint16_t out = x != x ? uint16_t{0x7fc0} : static_cast<uint16_t>(rounded);
  return c10::BFloat16(out, c10::BFloat16::from_bits());
}

}  // namespace core_cpu
