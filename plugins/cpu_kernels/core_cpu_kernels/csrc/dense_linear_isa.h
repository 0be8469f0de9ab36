// The GEMV loops of core::linear, written once over a vector type (see quant_linear_isa.h
// for why each ISA translation unit compiles its own copy).
//
// Besides quant_linear's Vec members, a Vec here provides load_bf16(p) and load_f16(p):
// kLanes 16-bit values widened to float32 lanes.

#pragma once

#include <cstdint>

#include "dense_linear.h"

#define CORE_DL_INLINE inline __attribute__((always_inline))

namespace core_cpu::dense_linear {
namespace {

// A float32 from the 16-bit pattern of a bfloat16: its top half.
CORE_DL_INLINE float bf16_to_float(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float f;
  __builtin_memcpy(&f, &wide, sizeof f);
  return f;
}

// A float32 from an IEEE half's bits, subnormals, infinities and NaNs included.
CORE_DL_INLINE float f16_to_float(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1Fu, mantissa = bits & 0x3FFu;
  uint32_t wide;
  if (exponent == 0x1F) {
    wide = sign | 0x7F800000u | (mantissa << 13);
  } else if (exponent != 0) {
    wide = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    wide = sign;
  } else {  // subnormal: mantissa * 2^-24, exact in float32
    float f = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    __builtin_memcpy(&wide, &f, sizeof f);
    wide |= sign;
  }
  float f;
  __builtin_memcpy(&f, &wide, sizeof f);
  return f;
}

template <WeightType TYPE>
struct Element {
  using T = uint16_t;
  static CORE_DL_INLINE float value(T bits) {
    return TYPE == WeightType::kBFloat16 ? bf16_to_float(bits) : f16_to_float(bits);
  }
};
template <>
struct Element<WeightType::kFloat32> {
  using T = float;
  static CORE_DL_INLINE float value(float f) { return f; }
};

template <class Vec, WeightType TYPE>
CORE_DL_INLINE typename Vec::V load_weights(const typename Element<TYPE>::T* p) {
  if constexpr (TYPE == WeightType::kFloat32) {
    return Vec::load(p);
  } else if constexpr (TYPE == WeightType::kBFloat16) {
    return Vec::load_bf16(p);
  } else {
    return Vec::load_f16(p);
  }
}

// Weight rows per block by tokens per pass: one token keeps 4 independent FMA chains;
// four tokens x 2 rows is 8 accumulators + 4 activation vectors + 2 weight vectors, which
// fits AVX2's 16 registers (3 rows would spill).
template <int TOKENS>
constexpr int kRowsPerBlock = TOKENS == 1 ? 4 : 2;
constexpr int kTokensPerPass = 4;

// out[t, n + r] for r < ROWS, t in [t0, t0 + TOKENS).
template <class Vec, WeightType TYPE, int ROWS, int TOKENS>
CORE_DL_INLINE void gemv_block(const typename Element<TYPE>::T* w, int64_t k, int64_t n,
                               const float* x, int64_t t0, float* out, int64_t ldo) {
  using V = typename Vec::V;
  V acc[ROWS][TOKENS];
  for (int r = 0; r < ROWS; ++r)
    for (int t = 0; t < TOKENS; ++t) acc[r][t] = Vec::zero();
  const float* xt = x + t0 * k;
  int64_t i = 0;
  for (; i + Vec::kLanes <= k; i += Vec::kLanes) {
    V xv[TOKENS];
    for (int t = 0; t < TOKENS; ++t) xv[t] = Vec::load(xt + t * k + i);
    for (int r = 0; r < ROWS; ++r) {
      const V wv = load_weights<Vec, TYPE>(w + (n + r) * k + i);
      for (int t = 0; t < TOKENS; ++t) acc[r][t] = Vec::fma(wv, xv[t], acc[r][t]);
    }
  }
  for (int r = 0; r < ROWS; ++r) {
    for (int t = 0; t < TOKENS; ++t) {
      float sum = Vec::sum(acc[r][t]);
      for (int64_t j = i; j < k; ++j)  // the tail past the last whole vector
        sum += Element<TYPE>::value(w[(n + r) * k + j]) * xt[t * k + j];
      out[(t0 + t) * ldo + n + r] = sum;
    }
  }
}

template <class Vec, WeightType TYPE, int TOKENS>
CORE_DL_INLINE void gemv_rows(const typename Element<TYPE>::T* w, int64_t k, int64_t n,
                              int64_t num_rows, const float* x, int64_t t0, float* out,
                              int64_t ldo) {
  constexpr int kRows = kRowsPerBlock<TOKENS>;
  int64_t r = 0;
  for (; r + kRows <= num_rows; r += kRows)
    gemv_block<Vec, TYPE, kRows, TOKENS>(w, k, n + r, x, t0, out, ldo);
  for (; r < num_rows; ++r) gemv_block<Vec, TYPE, 1, TOKENS>(w, k, n + r, x, t0, out, ldo);
}

template <class Vec, WeightType TYPE>
void gemv_typed(const DenseWeight& weight, int64_t n0, int64_t n1, const float* x,
                int64_t num_tokens, float* out, int64_t ldo) {
  const auto* w = static_cast<const typename Element<TYPE>::T*>(weight.data);
  const int64_t k = weight.k;
  for (int64_t n = n0; n < n1; n += 4) {
    const int64_t num_rows = n1 - n < 4 ? n1 - n : 4;
    for (int64_t t0 = 0; t0 < num_tokens; t0 += kTokensPerPass) {
      switch (num_tokens - t0) {
        case 1:
          gemv_rows<Vec, TYPE, 1>(w, k, n, num_rows, x, t0, out, ldo);
          break;
        case 2:
          gemv_rows<Vec, TYPE, 2>(w, k, n, num_rows, x, t0, out, ldo);
          break;
        case 3:
          gemv_rows<Vec, TYPE, 3>(w, k, n, num_rows, x, t0, out, ldo);
          break;
        default:
          gemv_rows<Vec, TYPE, kTokensPerPass>(w, k, n, num_rows, x, t0, out, ldo);
      }
    }
  }
}

template <class Vec>
void gemv(const DenseWeight& w, int64_t n0, int64_t n1, const float* x, int64_t num_tokens,
          float* out, int64_t ldo) {
  switch (w.type) {
    case WeightType::kFloat32:
      return gemv_typed<Vec, WeightType::kFloat32>(w, n0, n1, x, num_tokens, out, ldo);
    case WeightType::kBFloat16:
      return gemv_typed<Vec, WeightType::kBFloat16>(w, n0, n1, x, num_tokens, out, ldo);
    case WeightType::kFloat16:
      return gemv_typed<Vec, WeightType::kFloat16>(w, n0, n1, x, num_tokens, out, ldo);
  }
}

}  // namespace
}  // namespace core_cpu::dense_linear
