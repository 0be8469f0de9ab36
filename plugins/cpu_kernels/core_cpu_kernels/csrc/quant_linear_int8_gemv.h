// core::quant_linear's int8 GEMV on AVX2 (quant_linear.h's Int8Activations): a run of 32
// weights against a run of 32 int8 inputs in a few integer instructions, where the float32
// GEMV widens, converts and multiplies each weight (about 18 instructions a run against
// 8). 4-bit values (0..15) are vpmaddubsw's unsigned bytes and xq its signed ones: a pair
// of products is at most 2 * 15 * 127, so no int16 saturates. 8-bit values are signed, so
// both widen to int16 for vpmaddwd (q = -128 would overflow vpmaddubsw's sign trick).
//
// Included by linear_avx2.cpp after its `#pragma GCC target`: everything here sits in an
// unnamed namespace, compiled for that target alone; linear_avx2.cpp defines
// int8_gemv_avx2 from it.

#pragma once

#include <immintrin.h>

#include <cstdint>

#include "quant_linear.h"
#include "quant_linear_isa.h"

namespace core_cpu::quant_linear {
namespace {

// A run's 32 weights against one token's run of xq: 8 int32 lanes of partial dot products.
template <int BITS>
struct Int8Run;

template <>
struct Int8Run<4> {
  // The token's xq as vpmaddubsw's signed operand, values in input order.
  using X = __m256i;
  static CORE_QL_INLINE X load_x(const int8_t* xq) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));
  }
  // A run's 16 bytes: low nibbles are values 0..15, high ones 16..31 (core's layout). The
  // bytes load into both halves, and the upper half shifts its nibbles down: two
  // instructions besides the load, where widening and inserting a half took three.
  using W = __m256i;
  static CORE_QL_INLINE W load_w(const uint8_t* row, int64_t run) {
    const __m256i both =
        _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + run * 16)));
    const __m256i shifted = _mm256_srlv_epi64(both, _mm256_set_epi64x(4, 4, 0, 0));
    return _mm256_and_si256(shifted, _mm256_set1_epi8(0x0F));
  }
  static CORE_QL_INLINE __m256i dot(W w, X x) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1));
  }
};

template <>
struct Int8Run<8> {
  struct X {
    __m256i lo, hi;  // inputs 0..15 and 16..31 as int16
  };
  static CORE_QL_INLINE X load_x(const int8_t* xq) {
    return {_mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xq))),
            _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xq + 16)))};
  }
  using W = X;
  static CORE_QL_INLINE W load_w(const uint8_t* row, int64_t run) {
    return load_x(reinterpret_cast<const int8_t*>(row + run * kInt8Run));
  }
  static CORE_QL_INLINE __m256i dot(W w, X x) {
    return _mm256_add_epi32(_mm256_madd_epi16(w.lo, x.lo), _mm256_madd_epi16(w.hi, x.hi));
  }
};

// A row's terms outside the dot products for one token: sum_g mins[g] * sums[g] (+ sum_g
// scales[g] * shares[g] where there are shares), eight groups a vector, added to `total`
// before its lanes are summed.
template <class Vec>
CORE_QL_INLINE float with_group_terms(__m256 total, const float* mins, const float* sums,
                                      const float* scales, const float* shares,
                                      int64_t groups) {
  int64_t g = 0;
  for (; g + 8 <= groups; g += 8) {
    total = _mm256_fmadd_ps(_mm256_loadu_ps(mins + g), _mm256_loadu_ps(sums + g), total);
    if (shares != nullptr)
      total = _mm256_fmadd_ps(_mm256_loadu_ps(scales + g), _mm256_loadu_ps(shares + g), total);
  }
  float rest = 0.f;
  for (; g < groups; ++g) {
    rest += mins[g] * sums[g];
    if (shares != nullptr) rest += scales[g] * shares[g];
  }
  return Vec::sum(total) + rest;
}

// out[t, n + r] for r < ROWS, t in [t0, t0 + TOKENS): per run the integer dot products,
// converted and multiplied by the group's scale times the run's dx; then the mins' and
// the centre's shares. One loop over the runs (a group is often one run: a loop per group
// spilled the totals at each group's end).
template <class Vec, int BITS, int ROWS, int TOKENS>
CORE_QL_INLINE void int8_gemv_block(const PackedWeight& w, int64_t n, const Int8Activations& a,
                                    int64_t t0, float* out, int64_t ldo) {
  using Run = Int8Run<BITS>;
  const int64_t groups = w.groups(), runs = w.k / kInt8Run;
  const int64_t runs_per_group = w.group_size / kInt8Run;
  const uint8_t* rows[ROWS];
  const float* row_scales[ROWS];
  for (int r = 0; r < ROWS; ++r) {
    rows[r] = w.data + (n + r) * w.row_bytes;
    row_scales[r] = w.scales + (n + r) * groups;
  }
  const int8_t* xq = a.xq + t0 * w.k;
  const float* dxs = a.dx + t0 * runs;
  __m256 total[ROWS][TOKENS];
  for (int r = 0; r < ROWS; ++r)
    for (int t = 0; t < TOKENS; ++t) total[r][t] = _mm256_setzero_ps();
  int64_t g = 0, left_in_group = runs_per_group;
  for (int64_t run = 0; run < runs; ++run) {
    typename Run::X x[TOKENS];
    __m256 dx[TOKENS];
    for (int t = 0; t < TOKENS; ++t) {
      x[t] = Run::load_x(xq + t * w.k + run * kInt8Run);
      dx[t] = _mm256_broadcast_ss(dxs + t * runs + run);
    }
    for (int r = 0; r < ROWS; ++r) {
      const typename Run::W q = Run::load_w(rows[r], run);
      const __m256 scale = _mm256_broadcast_ss(row_scales[r] + g);
      for (int t = 0; t < TOKENS; ++t) {
        const __m256 products = _mm256_cvtepi32_ps(Run::dot(q, x[t]));
        total[r][t] = _mm256_fmadd_ps(products, _mm256_mul_ps(scale, dx[t]), total[r][t]);
      }
    }
    if (--left_in_group == 0) {
      ++g;
      left_in_group = runs_per_group;
    }
  }
  for (int r = 0; r < ROWS; ++r) {
    const float* scales = w.scales + (n + r) * groups;
    const float* mins = w.mins + (n + r) * groups;
    for (int t = 0; t < TOKENS; ++t) {
      const float* shares = a.shares == nullptr ? nullptr : a.shares + (t0 + t) * groups;
      out[(t0 + t) * ldo + n + r] = with_group_terms<Vec>(
          total[r][t], mins, a.group_sums + (t0 + t) * groups, scales, shares, groups);
    }
  }
}

template <class Vec, int BITS, int TOKENS>
CORE_QL_INLINE void int8_gemv_rows(const PackedWeight& w, int64_t n, int64_t num_rows,
                                   const Int8Activations& a, int64_t t0, float* out,
                                   int64_t ldo) {
  constexpr int kRows = kRowsPerBlock<TOKENS>;
  int64_t r = 0;
  for (; r + kRows <= num_rows; r += kRows)
    int8_gemv_block<Vec, BITS, kRows, TOKENS>(w, n + r, a, t0, out, ldo);
  for (; r < num_rows; ++r) int8_gemv_block<Vec, BITS, 1, TOKENS>(w, n + r, a, t0, out, ldo);
}

template <class Vec, int BITS>
void int8_gemv_bits(const PackedWeight& w, int64_t n0, int64_t n1, const Int8Activations& a,
                    float* out, int64_t ldo) {
  gemv_passes(w.data, w.row_bytes, n0, n1, a.num_tokens,
              [&](auto tokens, int64_t n, int64_t num_rows, int64_t t0) {
                int8_gemv_rows<Vec, BITS, decltype(tokens)::value>(w, n, num_rows, a, t0, out,
                                                                   ldo);
              });
}

// quant_linear.h's Int8GemvFn, with linear_avx2.cpp's AVX2 `Vec` (its lanes' sum).
template <class Vec>
void int8_gemv(const PackedWeight& w, int64_t n0, int64_t n1, const Int8Activations& a,
               float* out, int64_t ldo) {
  if (w.bits == 4) return int8_gemv_bits<Vec, 4>(w, n0, n1, a, out, ldo);
  int8_gemv_bits<Vec, 8>(w, n0, n1, a, out, ldo);
}

}  // namespace
}  // namespace core_cpu::quant_linear
