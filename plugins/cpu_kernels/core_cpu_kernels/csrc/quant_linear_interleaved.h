// core::quant_linear's interleaved GEMV: decode rows of bfloat16 x times a 4- or 8-bit W in
// the interleaved layout (quant_linear.h), on AVX512_BF16's vdpbf16ps.
//
// Each step widens 32 bytes to 32 words (16 rows x 2 values) and maps each word's two
// nibbles with one vpermw each to exact bfloat16 values: a 4-bit weight's nibbles are two
// values, q - 8 (-8..7); an 8-bit weight's are one value's parts, q = 16 (u / 16 - 8) +
// u % 16 (u = q + 128). Each part multiplies a broadcast pair of x's inputs into 16 lanes,
// one a row. A group's scales then multiply one vector of 16 rows' sums, and the mins' terms
// one more: about 3.5 vector instructions per 32 bytes, where the packed GEMV's row at a
// time takes 7 and a scale per row and group (4-bit, hot in L2, one thread, AVX512_BF16
// EPYC: 2.5 against 5.8 cycles per 32 weights), so a decode step's weights stream at the
// memory's pace.
//
// The products of bf16 values are exact in float32 and summed in float32, so the result is
// the packed GEMV's up to float32 summation order: sum_g scale * sum q' x + min' * sum x,
// q' and min' as the layout holds them, the last sum x's exact float32 group sums.
//
// Included by linear_avx512_bf16.cpp after its `#pragma GCC target`: everything here sits
// in an unnamed namespace, compiled for that target alone.

#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "quant_linear.h"
#include "quant_linear_isa.h"

namespace core_cpu::quant_linear {
namespace {

static_assert(kInterleavedRows == 16, "a block's rows are one vector's float32 lanes");
constexpr int64_t kInterleavedStepBytes = 32;
// Inputs of one step: two pairs of 4-bit values, or one pair of 8-bit ones.
template <int BITS>
constexpr int64_t kStepInputs = BITS == 4 ? 4 : 2;
// Tokens one pass over a block multiplies (each has 2 sums and 2 totals in registers).
constexpr int kInterleavedTokens = 4;
// How far ahead of its reads a thread asks for its stream: the hardware prefetchers stop
// at each 4 KB page.
constexpr int64_t kInterleavedAhead = 2048;

// The byte of step s, row j, pair member p (the layout in quant_linear.h).
template <int BITS>
CORE_QL_INLINE uint8_t interleaved_byte(const PackedWeight& w, int64_t row, int64_t i) {
  if constexpr (BITS == 8) {
    return static_cast<uint8_t>(w.data[row * w.row_bytes + i] ^ 0x80);  // q + 128
  } else {
    // Packed 4-bit units: 32 inputs in 16 bytes, low nibbles first.
    const uint8_t* unit = w.data + row * w.row_bytes + i / 32 * 16;
    const auto nibble = [&](int64_t v) { return v < 16 ? unit[v] & 0x0F : unit[v - 16] >> 4; };
    return static_cast<uint8_t>(nibble(i % 32) | nibble(i % 32 + 2) << 4);
  }
}

template <int BITS>
void pack_blocks(const PackedWeight& w, int64_t n0, int64_t n1, uint8_t* blocks) {
  const int64_t groups = w.groups(), record = interleaved_group_bytes(w.group_size, BITS);
  const int64_t steps = w.group_size / kStepInputs<BITS>;
  for (int64_t b = n0 / kInterleavedRows; b * kInterleavedRows < n1; ++b) {
    for (int64_t g = 0; g < groups; ++g) {
      uint8_t* out = blocks + (b * groups + g) * record;
      auto* scales = reinterpret_cast<float*>(out + steps * kInterleavedStepBytes);
      float* mins = scales + kInterleavedRows;
      for (int64_t j = 0; j < kInterleavedRows && b * kInterleavedRows + j < n1; ++j) {
        const int64_t row = b * kInterleavedRows + j;
        for (int64_t s = 0; s < steps; ++s)
          for (int64_t p = 0; p < 2; ++p)
            out[s * kInterleavedStepBytes + 2 * j + p] =
                interleaved_byte<BITS>(w, row, g * w.group_size + s * kStepInputs<BITS> + p);
        scales[j] = w.scales[row * groups + g];
        mins[j] = w.mins[row * groups + g] + (BITS == 4 ? 8.f * scales[j] : 0.f);
      }
    }
  }
}

void pack_interleaved(const PackedWeight& w, int64_t n0, int64_t n1, uint8_t* blocks) {
  if (w.bits == 4) return pack_blocks<4>(w, n0, n1, blocks);
  pack_blocks<8>(w, n0, n1, blocks);
}

// The bf16 of f(i) for i = 0..15, in each half of the table vpermw indexes by i.
template <class F>
CORE_QL_INLINE __m512i bf16_table(F f) {
  alignas(64) uint16_t table[32];
  for (int i = 0; i < 32; ++i) {
    const float value = f(i % 16);
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    table[i] = static_cast<uint16_t>(bits >> 16);  // exact: small integers
  }
  return _mm512_load_si512(table);
}

// What a word's low and high nibbles stand for (see the top of this file).
template <int BITS>
struct NibbleTables {
  __m512i low, high;
  NibbleTables()
      : low(bf16_table([](int i) { return static_cast<float>(BITS == 4 ? i - 8 : i); })),
        high(bf16_table([](int i) { return static_cast<float>(BITS == 4 ? i - 8 : 16 * (i - 8)); })) {}
};

// The 16 rows of one block times TOKENS tokens: totals[t] lane j = row j's output.
template <int BITS, int TOKENS>
CORE_QL_INLINE void interleaved_block(const uint8_t* block, int64_t k, int64_t group_size,
                                      const uint32_t* x_pairs, const float* sums,
                                      const NibbleTables<BITS>& tables, __m512* totals) {
  const int64_t groups = k / group_size, steps = group_size / kStepInputs<BITS>;
  const int64_t record = interleaved_group_bytes(group_size, BITS);
  const __m512i low = _mm512_set1_epi16(0x0F);
  __m512 scaled[TOKENS], shifted[TOKENS];
  for (int t = 0; t < TOKENS; ++t) scaled[t] = shifted[t] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* steps_at = block + g * record;
    for (int64_t line = 0; line < record; line += 64)
      __builtin_prefetch(steps_at + kInterleavedAhead + line, /*rw=*/0, /*locality=*/3);
    // Two chains a token (low and high nibbles): one would wait on vdpbf16ps' latency.
    __m512 low_sums[TOKENS], high_sums[TOKENS];
    for (int t = 0; t < TOKENS; ++t) low_sums[t] = high_sums[t] = _mm512_setzero_ps();
    const uint32_t* pairs = x_pairs + g * group_size / 2;
    for (int64_t s = 0; s < steps; ++s) {
      const __m512i bytes = _mm512_cvtepu8_epi16(_mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(steps_at + s * kInterleavedStepBytes)));
      const auto lo = reinterpret_cast<__m512bh>(
          _mm512_permutexvar_epi16(_mm512_and_si512(bytes, low), tables.low));
      const auto hi = reinterpret_cast<__m512bh>(
          _mm512_permutexvar_epi16(_mm512_srli_epi16(bytes, 4), tables.high));
      for (int t = 0; t < TOKENS; ++t) {
        // 4-bit: the step's two pairs; 8-bit: its one pair, for both parts.
        const uint32_t* xt = pairs + t * (k / 2) + s * kStepInputs<BITS> / 2;
        const auto pair = [](uint32_t bits) {
          return reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(bits)));
        };
        low_sums[t] = _mm512_dpbf16_ps(low_sums[t], lo, pair(xt[0]));
        high_sums[t] = _mm512_dpbf16_ps(high_sums[t], hi, pair(xt[BITS == 4 ? 1 : 0]));
      }
    }
    const auto* scales = reinterpret_cast<const float*>(steps_at + steps * kInterleavedStepBytes);
    const __m512 scale = _mm512_loadu_ps(scales);
    const __m512 min = _mm512_loadu_ps(scales + kInterleavedRows);
    for (int t = 0; t < TOKENS; ++t) {
      scaled[t] = _mm512_fmadd_ps(_mm512_add_ps(low_sums[t], high_sums[t]), scale, scaled[t]);
      shifted[t] = _mm512_fmadd_ps(min, _mm512_set1_ps(sums[t * groups + g]), shifted[t]);
    }
  }
  for (int t = 0; t < TOKENS; ++t) totals[t] = _mm512_add_ps(scaled[t], shifted[t]);
}

template <int BITS, int TOKENS>
CORE_QL_INLINE void interleaved_rows(const uint8_t* blocks, int64_t k, int64_t group_size,
                                     int64_t n0, int64_t n1, const uint32_t* x_pairs,
                                     const float* sums, uint16_t* out, int64_t ldo) {
  const int64_t block_bytes = k / group_size * interleaved_group_bytes(group_size, BITS);
  const NibbleTables<BITS> tables;
  for (int64_t n = n0; n < n1; n += kInterleavedRows) {
    __m512 totals[TOKENS];
    interleaved_block<BITS, TOKENS>(blocks + n / kInterleavedRows * block_bytes, k, group_size,
                                    x_pairs, sums, tables, totals);
    const int64_t rows = n1 - n < kInterleavedRows ? n1 - n : kInterleavedRows;
    const auto mask = static_cast<__mmask16>((1u << rows) - 1);
    for (int t = 0; t < TOKENS; ++t) {
      // Rounded to nearest even, as torch rounds to bfloat16.
      const auto bits = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(totals[t]));
      _mm256_mask_storeu_epi16(out + t * ldo + n, mask, bits);
    }
  }
}

template <int BITS>
void interleaved_passes(const uint8_t* blocks, int64_t k, int64_t group_size, int64_t n0,
                        int64_t n1, const uint16_t* x, const float* group_sums,
                        int64_t num_tokens, uint16_t* out, int64_t ldo) {
  const int64_t groups = k / group_size;
  for (int64_t t0 = 0; t0 < num_tokens; t0 += kInterleavedTokens) {
    const auto* pairs = reinterpret_cast<const uint32_t*>(x + t0 * k);
    const float* sums = group_sums + t0 * groups;
    uint16_t* o = out + t0 * ldo;
    switch (num_tokens - t0) {
      case 1: interleaved_rows<BITS, 1>(blocks, k, group_size, n0, n1, pairs, sums, o, ldo); break;
      case 2: interleaved_rows<BITS, 2>(blocks, k, group_size, n0, n1, pairs, sums, o, ldo); break;
      case 3: interleaved_rows<BITS, 3>(blocks, k, group_size, n0, n1, pairs, sums, o, ldo); break;
      default:
        interleaved_rows<BITS, kInterleavedTokens>(blocks, k, group_size, n0, n1, pairs, sums, o,
                                                   ldo);
    }
  }
}

void interleaved_gemv(const uint8_t* blocks, int64_t k, int64_t group_size, int bits,
                      int64_t n0, int64_t n1, const uint16_t* x, const float* group_sums,
                      int64_t num_tokens, uint16_t* out, int64_t ldo) {
  if (bits == 4) {
    return interleaved_passes<4>(blocks, k, group_size, n0, n1, x, group_sums, num_tokens, out,
                                 ldo);
  }
  interleaved_passes<8>(blocks, k, group_size, n0, n1, x, group_sums, num_tokens, out, ldo);
}

}  // namespace
}  // namespace core_cpu::quant_linear
