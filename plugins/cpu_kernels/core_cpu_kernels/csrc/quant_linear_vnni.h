// core::quant_linear's GEMM for bfloat16 x on AVX512_VNNI's vpdpbusd, which multiplies 4
// unsigned bytes by 4 signed bytes in each of 16 int32 lanes and adds the 4 products: twice
// the multiply-adds of vdpbf16ps per instruction, on integers that need no conversion (a
// 4-bit weight's q is 0..15, a byte as it is; an 8-bit one's q + 128 is). Each run's dot
// product then loses its surplus (offset + c) * sum(xq), offset the bytes' 128 and c the
// centre below.
//
// x is quantized to int8 in runs of 32 inputs (quant_linear.h's Int8Kernels), so a run's
// dot product sum_i (q[n, i] - c) xq[t, i] is exact in int32, and
//   out[t, n] = sum_runs scales[n, g] * dx[t, run] * (that dot)
//             + sum_runs (mins[n, g] + c * scales[n, g]) * run_sum[t, run],
// g the run's group; the second term uses x's exact sums, as the float32 kernels do. The
// centre c is 0 for 8-bit values and 8 for 4-bit ones (0..15): x's rounding then errs
// along scale * (q - 8), W's distance from its group's middle, where counted from 0 it
// erred along all of W (SmolLM2's GGUF, held-out perplexity with x in bf16 35.14; int8
// from 0 35.59, from 8 35.22), at the cost of one subtraction a run, which only 8-bit
// weights paid before.
//
// Included by linear_avx512_bf16.cpp after its `#pragma GCC target` (which names
// avx512vnni): everything here sits in an unnamed namespace, compiled for that target
// alone.

#pragma once

#include <immintrin.h>

#include <bit>
#include <cstdint>
#include <cstring>

#include "avx512_vec.h"
#include "quant_linear.h"
#include "quant_linear_isa.h"

namespace core_cpu::quant_linear {
namespace {

constexpr int64_t kRun = kInt8Run;    // inputs of one int8 scale (and of one 4-bit run)
constexpr int64_t kInt8Step = 4;      // inputs of one vpdpbusd lane
constexpr int64_t kInt8Lanes = 16;    // tokens of one vector
constexpr int64_t kInt8Vecs = 2;      // token vectors of one register block
constexpr int64_t kInt8TokenBlock = kInt8Lanes * kInt8Vecs;
static_assert(kInt8TokenBlock == kInt8Block, "quant_linear.h's token block");

// One token's run of 32 bf16 inputs: its int8 values into the 8 steps' lanes for token j
// (packed[s][j][4], a step kInt8TokenBlock * 4 bytes on), its scale and its exact sum.
CORE_QL_INLINE void quantize_run(const uint16_t* x, int64_t j, int8_t* packed, float* scale,
                                 float* sum, int32_t* q_sum) {
  const __m512 lo = Avx512::load_bf16(x), hi = Avx512::load_bf16(x + 16);
  const float max = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
  // 127 / max then a multiply, as the reference does it (a division per input would round
  // differently); an all-zero run has scale 0 and values 0.
  const float inverse = max > 0.f ? 127.f / max : 0.f;
  *scale = max / 127.f;
  *sum = _mm512_reduce_add_ps(_mm512_add_ps(lo, hi));
  const __m512 inv = _mm512_set1_ps(inverse);
  // Round to nearest even (the default rounding mode), |values| <= 127: no saturation.
  const __m512i q_lo32 = _mm512_cvtps_epi32(_mm512_mul_ps(lo, inv));
  const __m512i q_hi32 = _mm512_cvtps_epi32(_mm512_mul_ps(hi, inv));
  *q_sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q_lo32, q_hi32));
  const __m128i q_lo = _mm512_cvtepi32_epi8(q_lo32), q_hi = _mm512_cvtepi32_epi8(q_hi32);
  int8_t values[kRun];
  _mm_storeu_si128(reinterpret_cast<__m128i*>(values), q_lo);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(values + 16), q_hi);
  for (int64_t s = 0; s < kRun / kInt8Step; ++s)
    std::memcpy(packed + (s * kInt8TokenBlock + j) * kInt8Step, values + s * kInt8Step,
                kInt8Step);
}

// Int8Kernels::quantize_tokens (quant_linear.h).
void quantize_tokens(const uint16_t* x, int64_t num_tokens, int64_t k, int64_t b0, int64_t b1,
                     int8_t* packed, float* scales, float* sums, int32_t* q_sums) {
  const int64_t runs = k / kRun;
  for (int64_t b = b0; b < b1; ++b) {
    int8_t* block = packed + b * kInt8TokenBlock * k;
    float* block_scales = scales + b * kInt8TokenBlock * runs;
    float* block_sums = sums + b * kInt8TokenBlock * runs;
    int32_t* block_q_sums = q_sums + b * kInt8TokenBlock * runs;
    for (int64_t r = 0; r < runs; ++r) {
      int8_t* run = block + r * kRun * kInt8TokenBlock;
      for (int64_t j = 0; j < kInt8TokenBlock; ++j) {
        const int64_t t = b * kInt8TokenBlock + j;
        float* scale = block_scales + r * kInt8TokenBlock + j;
        float* sum = block_sums + r * kInt8TokenBlock + j;
        int32_t* q_sum = block_q_sums + r * kInt8TokenBlock + j;
        if (t < num_tokens) {
          quantize_run(x + t * k + r * kRun, j, run, scale, sum, q_sum);
        } else {  // padding: no products, no sums
          for (int64_t s = 0; s < kRun / kInt8Step; ++s)
            std::memset(run + (s * kInt8TokenBlock + j) * kInt8Step, 0, kInt8Step);
          *scale = *sum = 0.f;
          *q_sum = 0;
        }
      }
    }
  }
}

// What the unpacked bytes add to q (8-bit values are stored as q + 128), and the centre c
// the dot products count q from: 8 for 4-bit values (0..15), whose scale's share
// 8 * scale * sum(x) goes to the min's term, which multiplies x's exact sum.
template <int BITS>
constexpr int kByteOffset = BITS == 8 ? 128 : 0;
template <int BITS>
constexpr int kCenter = BITS == 8 ? 0 : 8;
// The multiple of sum(xq) a run's dot product loses, a power of two: taken off by a shift.
template <int BITS>
constexpr unsigned kSurplus = kByteOffset<BITS> + kCenter<BITS>;
static_assert(std::has_single_bit(kSurplus<4>) && std::has_single_bit(kSurplus<8>),
              "the surplus is a shift of sum(xq)");

// Rows [n, n + num_rows) of W's values as unsigned bytes in input order (4-bit: q; 8-bit:
// q + 128), into `rows` (kGemmRows rows of k; those past num_rows are zeros).
template <int BITS>
void unpack_rows(const PackedWeight& w, int64_t n, int64_t num_rows, uint8_t* rows) {
  const __m128i low = _mm_set1_epi8(0x0F), sign = _mm_set1_epi8(static_cast<char>(0x80));
  for (int64_t r = 0; r < num_rows; ++r) {
    const uint8_t* packed = w.data + (n + r) * w.row_bytes;
    uint8_t* row = rows + r * w.k;
    for (int64_t run = 0; run < w.k / kRun; ++run) {
      if constexpr (BITS == 8) {
        for (int64_t half = 0; half < kRun; half += 16) {
          const auto* from = reinterpret_cast<const __m128i*>(packed + run * kRun + half);
          _mm_storeu_si128(reinterpret_cast<__m128i*>(row + run * kRun + half),
                           _mm_xor_si128(_mm_loadu_si128(from), sign));
        }
      } else {
        const auto* from = reinterpret_cast<const __m128i*>(packed + run * 16);
        const __m128i bytes = _mm_loadu_si128(from);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(row + run * kRun), _mm_and_si128(bytes, low));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(row + run * kRun + 16),
                         _mm_and_si128(_mm_srli_epi16(bytes, 4), low));
      }
    }
  }
  std::memset(rows + num_rows * w.k, 0, (kGemmRows - num_rows) * w.k);
}

// out[t * ldo + r] for r < num_rows and the block's first num_tokens tokens: kGemmRows x
// VECS accumulators in int32 over a run, folded into float32 ones with the run's scales.
template <int BITS, int VECS>
CORE_QL_INLINE void int8_block(const PackedWeight& w, int64_t n, const uint8_t* rows,
                               const int8_t* block, const float* block_scales,
                               const float* block_sums, const int32_t* block_q_sums,
                               int64_t num_rows, int64_t num_tokens, float* out, int64_t ldo) {
  const int64_t groups = w.groups(), runs_per_group = w.group_size / kRun;
  // Rows past num_rows (zeros in `rows`) take the last row's scales: their outputs are
  // dropped, and no branch sits in the loop.
  const float* row_scales[kGemmRows];
  const float* row_mins[kGemmRows];
  for (int r = 0; r < kGemmRows; ++r) {
    const int64_t row = n + (r < num_rows ? r : num_rows - 1);
    row_scales[r] = w.scales + row * groups;
    row_mins[r] = w.mins + row * groups;
  }
  __m512 acc[kGemmRows][VECS];
  for (int r = 0; r < kGemmRows; ++r)
    for (int v = 0; v < VECS; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t run = g * runs_per_group; run < (g + 1) * runs_per_group; ++run) {
      __m512i dot[kGemmRows][VECS];
      for (int r = 0; r < kGemmRows; ++r)
        for (int v = 0; v < VECS; ++v) dot[r][v] = _mm512_setzero_si512();
      const int8_t* steps = block + run * kRun * kInt8TokenBlock;
      const uint8_t* quads = rows + run * kRun;
#pragma GCC unroll 8
      for (int64_t s = 0; s < kRun / kInt8Step; ++s) {
        __m512i x[VECS];
        for (int v = 0; v < VECS; ++v)
          x[v] = _mm512_loadu_si512(steps + (s * kInt8TokenBlock + v * kInt8Lanes) * kInt8Step);
        for (int r = 0; r < kGemmRows; ++r) {
          int32_t quad;
          std::memcpy(&quad, quads + r * w.k + s * kInt8Step, sizeof quad);
          const __m512i q = _mm512_set1_epi32(quad);
          for (int v = 0; v < VECS; ++v) dot[r][v] = _mm512_dpbusd_epi32(dot[r][v], q, x[v]);
        }
      }
      const int64_t lane0 = run * kInt8TokenBlock;
      for (int v = 0; v < VECS; ++v) {
        const __m512i surplus = _mm512_slli_epi32(
            _mm512_loadu_si512(block_q_sums + lane0 + v * kInt8Lanes),
            std::countr_zero(kSurplus<BITS>));
        for (int r = 0; r < kGemmRows; ++r) dot[r][v] = _mm512_sub_epi32(dot[r][v], surplus);
      }
      for (int r = 0; r < kGemmRows; ++r) {
        const __m512 scale = _mm512_set1_ps(row_scales[r][g]);
        const __m512 min =
            _mm512_set1_ps(row_mins[r][g] + static_cast<float>(kCenter<BITS>) * row_scales[r][g]);
        for (int v = 0; v < VECS; ++v) {
          const int64_t lane = lane0 + v * kInt8Lanes;
          const __m512 x_scale = _mm512_mul_ps(scale, _mm512_loadu_ps(block_scales + lane));
          acc[r][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r][v]), x_scale, acc[r][v]);
          acc[r][v] = _mm512_fmadd_ps(min, _mm512_loadu_ps(block_sums + lane), acc[r][v]);
        }
      }
    }
  }
  float lanes[VECS * kInt8Lanes];
  for (int64_t r = 0; r < num_rows; ++r) {
    for (int v = 0; v < VECS; ++v) _mm512_storeu_ps(lanes + v * kInt8Lanes, acc[r][v]);
    for (int64_t t = 0; t < num_tokens; ++t) out[t * ldo + r] = lanes[t];
  }
}

// Int8Kernels::gemm (quant_linear.h): as quant_linear_isa.h's gemm, with the rows
// unpacked to bytes instead of dequantized.
template <int BITS>
void int8_gemm_bits(const PackedWeight& w, int64_t n0, int64_t n1, const int8_t* packed_x,
                    const float* x_scales, const float* x_sums, const int32_t* x_q_sums,
                    int64_t num_tokens, float* out, int64_t ldo, uint8_t* rows, float* panel) {
  const int64_t runs = w.k / kRun;
  for (int64_t p0 = n0; p0 < n1; p0 += kGemmPanelRows) {
    const int64_t p1 = n1 - p0 < kGemmPanelRows ? n1 : p0 + kGemmPanelRows;
    for (int64_t n = p0; n < p1; n += kGemmRows) {
      const int64_t num_rows = p1 - n < kGemmRows ? p1 - n : kGemmRows;
      unpack_rows<BITS>(w, n, num_rows, rows);
      for (int64_t t0 = 0; t0 < num_tokens; t0 += kInt8TokenBlock) {
        const int64_t block_tokens =
            num_tokens - t0 < kInt8TokenBlock ? num_tokens - t0 : kInt8TokenBlock;
        const int8_t* block = packed_x + t0 * w.k;
        const float* block_scales = x_scales + t0 * runs;
        const float* block_sums = x_sums + t0 * runs;
        const int32_t* block_q_sums = x_q_sums + t0 * runs;
        float* block_out = panel + t0 * kGemmPanelRows + (n - p0);
        if (block_tokens > kInt8Lanes * (kInt8Vecs - 1)) {
          int8_block<BITS, kInt8Vecs>(w, n, rows, block, block_scales, block_sums,
                                      block_q_sums, num_rows, block_tokens, block_out,
                                      kGemmPanelRows);
        } else {
          int8_block<BITS, 1>(w, n, rows, block, block_scales, block_sums, block_q_sums,
                              num_rows, block_tokens, block_out, kGemmPanelRows);
        }
      }
    }
    for (int64_t t = 0; t < num_tokens; ++t)
      std::memcpy(out + t * ldo + p0, panel + t * kGemmPanelRows, (p1 - p0) * sizeof(float));
  }
}

void int8_gemm(const PackedWeight& w, int64_t n0, int64_t n1, const int8_t* packed_x,
               const float* x_scales, const float* x_sums, const int32_t* x_q_sums,
               int64_t num_tokens, float* out, int64_t ldo, uint8_t* rows, float* panel) {
  if (w.bits == 4) {
    return int8_gemm_bits<4>(w, n0, n1, packed_x, x_scales, x_sums, x_q_sums, num_tokens, out,
                             ldo, rows, panel);
  }
  int8_gemm_bits<8>(w, n0, n1, packed_x, x_scales, x_sums, x_q_sums, num_tokens, out, ldo,
                    rows, panel);
}

}  // namespace
}  // namespace core_cpu::quant_linear
