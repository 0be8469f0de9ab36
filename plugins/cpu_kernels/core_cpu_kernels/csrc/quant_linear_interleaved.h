// core::quant_linear's interleaved GEMV: decode rows of bfloat16 x times a 4-bit W in the
// interleaved layout (quant_linear.h), on AVX512_BF16's vdpbf16ps.
//
// Each step widens 32 bytes to 32 words (16 rows x 2 inputs, twice: low and high nibbles),
// maps the nibbles to the bfloat16 of q - 8 with one vpermw each (exact: -8..7), and
// multiplies them with a broadcast pair of x's inputs into 16 lanes, one a row. A group's
// scales then multiply one vector of 16 rows' sums, and the mins' terms one more: about 3.5
// vector instructions per 32 weights, where the packed GEMV's row at a time takes 7 and a
// scale per row and group (hot in L2, one thread, AVX512_BF16 EPYC: 2.5 against 5.8 cycles
// per 32 weights, so a decode step's weights stream at the memory's pace).
//
// The products of bf16 values are exact in float32 and summed in float32, so the result is
// the packed GEMV's up to float32 summation order: sum_g scale * sum (q - 8) x +
// (min + 8 * scale) * sum x, the last sum x's exact float32 group sums.
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
constexpr int64_t kInterleavedStepInputs = 4;
// Tokens one pass over a block multiplies (each has 2 sums and 2 totals in registers).
constexpr int kInterleavedTokens = 4;
// How far ahead of its reads a thread asks for its stream: the hardware prefetchers stop
// at each 4 KB page.
constexpr int64_t kInterleavedAhead = 2048;

// Value q's nibble (packed layout: 16-byte units of 32 inputs, low nibbles first).
CORE_QL_INLINE uint8_t packed_nibble(const PackedWeight& w, int64_t n, int64_t i) {
  const uint8_t byte = w.data[n * w.row_bytes + i / 32 * 16 + i % 16];
  return i % 32 < 16 ? byte & 0x0F : byte >> 4;
}

void pack_interleaved(const PackedWeight& w, int64_t n0, int64_t n1, uint8_t* blocks) {
  const int64_t groups = w.groups(), record = interleaved_group_bytes(w.group_size);
  const int64_t n = n1;  // rows past n1 are W's padding (n1 is N in the last call)
  for (int64_t b = n0 / kInterleavedRows; b * kInterleavedRows < n1; ++b) {
    for (int64_t g = 0; g < groups; ++g) {
      uint8_t* out = blocks + (b * groups + g) * record;
      std::memset(out, 0, record);
      auto* scales = reinterpret_cast<float*>(out + w.group_size / 4 * kInterleavedStepBytes);
      float* mins = scales + kInterleavedRows;
      for (int64_t j = 0; j < kInterleavedRows; ++j) {
        const int64_t row = b * kInterleavedRows + j;
        if (row >= n) break;
        for (int64_t s = 0; s < w.group_size / kInterleavedStepInputs; ++s) {
          const int64_t i = g * w.group_size + s * kInterleavedStepInputs;
          for (int64_t p = 0; p < 2; ++p) {
            out[s * kInterleavedStepBytes + 2 * j + p] = static_cast<uint8_t>(
                packed_nibble(w, row, i + p) | packed_nibble(w, row, i + 2 + p) << 4);
          }
        }
        scales[j] = w.scales[row * groups + g];
        mins[j] = w.mins[row * groups + g] + 8.f * scales[j];
      }
    }
  }
}

// The bf16 of q - 8 for q = 0..15, in each half of the table vpermw indexes by q.
CORE_QL_INLINE __m512i centred_values() {
  alignas(64) uint16_t table[32];
  for (int i = 0; i < 32; ++i) {
    const float value = static_cast<float>(i % 16 - 8);
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    table[i] = static_cast<uint16_t>(bits >> 16);  // exact: a small integer
  }
  return _mm512_load_si512(table);
}

// The 16 rows of one block times TOKENS tokens: totals[t] lane j = row j's output.
template <int TOKENS>
CORE_QL_INLINE void interleaved_block(const uint8_t* block, int64_t k, int64_t group_size,
                                      const uint32_t* x_pairs, const float* sums,
                                      __m512i table, __m512* totals) {
  const int64_t groups = k / group_size, steps = group_size / kInterleavedStepInputs;
  const int64_t record = interleaved_group_bytes(group_size);
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
      const __m512i bytes = _mm512_cvtepu8_epi16(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(steps_at + s * kInterleavedStepBytes)));
      const auto lo = reinterpret_cast<__m512bh>(
          _mm512_permutexvar_epi16(_mm512_and_si512(bytes, low), table));
      const auto hi = reinterpret_cast<__m512bh>(
          _mm512_permutexvar_epi16(_mm512_srli_epi16(bytes, 4), table));
      for (int t = 0; t < TOKENS; ++t) {
        const uint32_t* xt = pairs + t * (k / 2) + 2 * s;
        low_sums[t] = _mm512_dpbf16_ps(
            low_sums[t], lo, reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(xt[0]))));
        high_sums[t] = _mm512_dpbf16_ps(
            high_sums[t], hi, reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(xt[1]))));
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

template <int TOKENS>
CORE_QL_INLINE void interleaved_rows(const uint8_t* blocks, int64_t k, int64_t group_size,
                                     int64_t n0, int64_t n1, const uint32_t* x_pairs,
                                     const float* sums, uint16_t* out, int64_t ldo) {
  const int64_t block_bytes = k / group_size * interleaved_group_bytes(group_size);
  const __m512i table = centred_values();
  for (int64_t n = n0; n < n1; n += kInterleavedRows) {
    __m512 totals[TOKENS];
    interleaved_block<TOKENS>(blocks + n / kInterleavedRows * block_bytes, k, group_size,
                              x_pairs, sums, table, totals);
    const int64_t rows = n1 - n < kInterleavedRows ? n1 - n : kInterleavedRows;
    const auto mask = static_cast<__mmask16>((1u << rows) - 1);
    for (int t = 0; t < TOKENS; ++t) {
      // Rounded to nearest even, as torch rounds to bfloat16.
      const auto bits = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(totals[t]));
      _mm256_mask_storeu_epi16(out + t * ldo + n, mask, bits);
    }
  }
}

void interleaved_gemv(const uint8_t* blocks, int64_t k, int64_t group_size, int64_t n0,
                      int64_t n1, const uint16_t* x, const float* group_sums,
                      int64_t num_tokens, uint16_t* out, int64_t ldo) {
  const int64_t groups = k / group_size;
  for (int64_t t0 = 0; t0 < num_tokens; t0 += kInterleavedTokens) {
    const auto* pairs = reinterpret_cast<const uint32_t*>(x + t0 * k);
    const float* sums = group_sums + t0 * groups;
    uint16_t* o = out + t0 * ldo;
    switch (num_tokens - t0) {
      case 1: interleaved_rows<1>(blocks, k, group_size, n0, n1, pairs, sums, o, ldo); break;
      case 2: interleaved_rows<2>(blocks, k, group_size, n0, n1, pairs, sums, o, ldo); break;
      case 3: interleaved_rows<3>(blocks, k, group_size, n0, n1, pairs, sums, o, ldo); break;
      default:
        interleaved_rows<kInterleavedTokens>(blocks, k, group_size, n0, n1, pairs, sums, o, ldo);
    }
  }
}

}  // namespace
}  // namespace core_cpu::quant_linear
