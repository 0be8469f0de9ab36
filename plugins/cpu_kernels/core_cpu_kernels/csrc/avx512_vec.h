// The AVX-512 vector type of the quant_linear and dense_linear loops (quant_linear_isa.h's
// `Vec`): 16 float32 lanes, so one widening (vpmovzxbd zmm, straight from memory) brings a
// run's 16 bytes into 32-bit lanes, where a mask gives its values 0..15 and a shift its
// values 16..31: one shuffle per run, the port Intel has one of.
//
// Included by the AVX-512 translation units (linear_avx512.cpp, linear_avx512_bf16.cpp)
// after their `#pragma GCC target`, inside an unnamed namespace: each keeps its own copy,
// compiled for its own target.

#pragma once

#include <immintrin.h>

#include <cstdint>

#include "fp8.h"
#include "quant_linear_isa.h"

namespace core_cpu {
namespace {

struct Avx512 {
  using V = __m512;
  static constexpr int kLanes = 16;

  static CORE_QL_INLINE V zero() { return _mm512_setzero_ps(); }
  static CORE_QL_INLINE V set1(float f) { return _mm512_set1_ps(f); }
  static CORE_QL_INLINE V load(const float* p) { return _mm512_loadu_ps(p); }
  static CORE_QL_INLINE void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static CORE_QL_INLINE V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static CORE_QL_INLINE float fmas(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
  static CORE_QL_INLINE V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static CORE_QL_INLINE float sum(V v) { return _mm512_reduce_add_ps(v); }

  static CORE_QL_INLINE V load_bf16(const uint16_t* p) {
    const __m512i wide =
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
  }
  static CORE_QL_INLINE V load_f16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }

  using Bits = uint32_t __attribute__((vector_size(64)));
  static CORE_QL_INLINE V load_e4m3(const uint8_t* p) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return fp8_value<E4m3, V>(reinterpret_cast<Bits>(_mm512_cvtepu8_epi32(bytes)));
  }

  template <int BITS>
  static CORE_QL_INLINE void unpack(const uint8_t* unit, V* q) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(unit));
    if constexpr (BITS == 4) {
      const __m512i lanes = _mm512_cvtepu8_epi32(bytes);
      q[0] = _mm512_cvtepi32_ps(_mm512_and_si512(lanes, _mm512_set1_epi32(0x0F)));
      q[1] = _mm512_cvtepi32_ps(_mm512_srli_epi32(lanes, 4));
    } else {
      q[0] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes));
    }
  }
};

}  // namespace
}  // namespace core_cpu
