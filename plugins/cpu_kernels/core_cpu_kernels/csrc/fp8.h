// 8-bit floats (torch.float8_e4m3fn, torch.float8_e5m2) read as float32: an FP8 KV cache
// (paged_attention.cpp, paged_prefill.cpp) and FP8 weights (fp8_linear.cpp). Not to be
// confused with float8.h, whose F8 is a vector of eight float32 lanes.
//
// The conversion is integer arithmetic on the byte's bits, written once for a scalar
// (uint32_t / float: loops over it auto-vectorize) and for GCC vectors of 32-bit lanes
// (an ISA's vector type, its bytes widened by that ISA's instructions). A table lookup
// would not vectorize (a gather per value).
//
// Special values: e4m3fn has no infinities, and its NaN bytes (0x7F, 0xFF) read as
// +-480, the next step past its largest value 448; e5m2's infinities and NaNs (exponent
// 31) read as finite values 65536..114688 in magnitude. Neither is ever stored: the KV
// cache saturates at the format's largest value (core.attention.kv_cache_dtype), and FP8
// weights are finite.
//
// No torch header here (the ISA translation units include it: see quant_linear.h), and
// every function always inlines, so each caller compiles it for its own instruction set.

#pragma once

#include <cstdint>
#include <cstring>

#define CORE_FP8_INLINE inline __attribute__((always_inline))

namespace core_cpu {

// One value of an 8-bit float format: a sign bit, EXPONENT_BITS exponent bits (bias
// 2^(EXPONENT_BITS - 1) - 1) and the other 7 - EXPONENT_BITS bits of mantissa; exponent 0
// holds the subnormals, mantissa * 2^(1 - bias - mantissa bits).
template <int EXPONENT_BITS>
struct Fp8 {
  static constexpr int kMantissaBits = 7 - EXPONENT_BITS;
  static constexpr int kBias = (1 << (EXPONENT_BITS - 1)) - 1;
  uint8_t bits;
};
using E4m3 = Fp8<4>;  // torch.float8_e4m3fn: bias 7, largest 448, smallest 2^-9
using E5m2 = Fp8<5>;  // torch.float8_e5m2: bias 15, largest 57344, smallest 2^-16
static_assert(sizeof(E4m3) == 1 && sizeof(E5m2) == 1, "an FP8 value is its byte");

template <typename To, typename From>
CORE_FP8_INLINE To bits_as(const From& from) {
  static_assert(sizeof(To) == sizeof(From), "a reinterpretation keeps the size");
  To to;
  std::memcpy(&to, &from, sizeof to);
  return to;
}

// The float32 value of FP8 bytes `byte` (one per 32-bit lane, 0..255): Bits is uint32_t
// or a GCC vector of them, Float float or the float vector of as many lanes.
//
// A normal value moves its exponent and mantissa bits into float32's places and rebiases
// the exponent: one shift and one add. A subnormal (exponent 0) takes the same bits with
// the exponent one higher, 2^(1 - bias) * (1 + m / 2^M), less 2^(1 - bias): exactly
// m * 2^(1 - bias - M), with no integer-to-float conversion. A compare picks one of the
// two per lane; the sign bit goes to float32's.
template <class Format, class Float, class Bits>
CORE_FP8_INLINE Float fp8_value(Bits byte) {
  constexpr int kMantissa = Format::kMantissaBits;
  constexpr uint32_t kRebias = static_cast<uint32_t>(127 - Format::kBias) << 23;
  constexpr uint32_t kOne = 1u << 23;  // 1 in float32's exponent field
  const float smallest_normal = bits_as<float>(kRebias + kOne);  // 2^(1 - bias)
  const Bits magnitude = byte & 0x7Fu;
  const Bits normal = (magnitude << (23 - kMantissa)) + kRebias;
  const Float subnormal = bits_as<Float>(normal + kOne) - smallest_normal;
  const Float value = magnitude < (1u << kMantissa) ? subnormal : bits_as<Float>(normal);
  return bits_as<Float>(bits_as<Bits>(value) | (byte & 0x80u) << 24);
}

// The value of one FP8 value.
template <int EXPONENT_BITS>
CORE_FP8_INLINE float fp8_to_float(Fp8<EXPONENT_BITS> x) {
  return fp8_value<Fp8<EXPONENT_BITS>, float>(static_cast<uint32_t>(x.bits));
}

}  // namespace core_cpu
