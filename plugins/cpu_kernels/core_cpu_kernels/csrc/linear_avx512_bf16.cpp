// core::quant_linear's kernels for CPUs with AVX512_BF16 (and so AVX512_VNNI): its AVX-512
// float32 kernels, and for bfloat16 activations a blocked GEMM on vdpbf16ps, which
// multiplies 16 lanes of bf16 pairs and adds both products to float32 lanes (twice the
// multiply-adds of a float32 FMA per instruction), the interleaved GEMV for decode rows
// (quant_linear_interleaved.h), and the int8 GEMM on vpdpbusd (quant_linear_vnni.h).

#include "quant_linear.h"

#ifdef CORE_X86_KERNELS

#include <algorithm>
#include <cstring>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16,avx512vnni,avx2,fma")
// As in linear_avx512.cpp: GCC 12's false positive in its own widening intrinsics.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "avx512_vec.h"
#include "quant_linear_interleaved.h"
#include "quant_linear_isa.h"
#include "quant_linear_vnni.h"

namespace core_cpu::quant_linear {
namespace {

// Two adjacent bf16 inputs a step, in one float32 lane (the lower input in the lower half,
// as they lie in memory), multiplied by vdpbf16ps.
struct Bf16Dot {
  using V = __m512;
  using Elem = uint16_t;  // a bfloat16's bits
  using In = __m512i;
  static constexpr int64_t kInputsPerStep = 2;

  static CORE_QL_INLINE In load(const uint16_t* p) { return _mm512_loadu_si512(p); }
  static CORE_QL_INLINE In broadcast(const uint16_t* p) {
    int32_t pair;
    std::memcpy(&pair, p, sizeof pair);
    return _mm512_set1_epi32(pair);
  }
  static CORE_QL_INLINE V madd(In w, In x, V acc) {
    return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(w), reinterpret_cast<__m512bh>(x));
  }
  // Rounded to nearest even, as torch rounds to bfloat16.
  static CORE_QL_INLINE void store(uint16_t* row, int64_t i, V v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(row + i),
                        reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
  }
};

static_assert(kTokenBlock<Avx512> == 2 * Avx512::kLanes, "a token block is 2 vectors");

// ---- The strip GEMM -------------------------------------------------------------------------
//
// Its register block is 4 vectors of 16 weight rows (one strip) times 6 tokens: 24
// accumulators, 4 row loads and 6 broadcasts of a token's pair of inputs per 24 vdpbf16ps.
// Measured with W already in the strip's layout (hot, 2 threads, AVX512_BF16 EPYC): 406-442
// GF/s at 32-128 tokens on SmolLM2's shapes, of a measured vdpbf16ps peak of 416-460; the
// blocked GEMM (rows broadcast, tokens as vectors) and oneDNN's run at 220-290.

static_assert(kStripRows == 4 * Avx512::kLanes && kStripUnitRows == Avx512::kLanes);
constexpr int kStripVecs = kStripRows / Avx512::kLanes;
constexpr int kStripTokens = 6;
constexpr int64_t kStripRun = 32;  // the inputs one row's vector of pairs holds

// Row n's inputs [k0, k0 + 32) dequantized as the blocked GEMM's rows are (fma(q, scale,
// min), rounded to bf16 to nearest even): 32-bit lane j holds inputs k0 + 2j (low half) and
// k0 + 2j + 1, the pair vdpbf16ps multiplies together. Inputs past k are zeros (8-bit
// weights have k a multiple of 16 only).
template <int BITS>
CORE_QL_INLINE __m512i row_pairs(const PackedWeight& w, int64_t n, int64_t k0) {
  const uint8_t* row = w.data + n * w.row_bytes;
  const float* scales = w.scales + n * w.groups();
  const float* mins = w.mins + n * w.groups();
  __m512 half[2] = {Avx512::zero(), Avx512::zero()};
  if constexpr (BITS == 4) {
    const int64_t g = k0 / w.group_size;  // 4-bit groups are whole runs of 32
    Avx512::unpack<4>(row + k0 / 2, half);
    for (__m512& h : half) h = Avx512::fma(h, Avx512::set1(scales[g]), Avx512::set1(mins[g]));
  } else {
    for (int h = 0; h < 2 && k0 + h * Avx512::kLanes < w.k; ++h) {
      const int64_t i = k0 + h * Avx512::kLanes, g = i / w.group_size;
      Avx512::unpack<8>(row + i, &half[h]);
      half[h] = Avx512::fma(half[h], Avx512::set1(scales[g]), Avx512::set1(mins[g]));
    }
  }
  return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(half[1], half[0]));
}

// r[i] lane j becomes r[j] lane i (16 x 16 32-bit elements): interleaves of 32 and 64 bits
// inside 128-bit lanes, then two rounds of 128-bit lane shuffles.
CORE_QL_INLINE void transpose16(__m512i* r) {
  __m512i t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int b = 0; b < 4; ++b) {  // rows 4b .. 4b + 3: u[4b + e] holds column 4l + e in lane l
    u[4 * b] = _mm512_unpacklo_epi64(t[4 * b], t[4 * b + 2]);
    u[4 * b + 1] = _mm512_unpackhi_epi64(t[4 * b], t[4 * b + 2]);
    u[4 * b + 2] = _mm512_unpacklo_epi64(t[4 * b + 1], t[4 * b + 3]);
    u[4 * b + 3] = _mm512_unpackhi_epi64(t[4 * b + 1], t[4 * b + 3]);
  }
  for (int e = 0; e < 4; ++e) {
    const __m512i x0 = _mm512_shuffle_i32x4(u[e], u[4 + e], 0x88);
    const __m512i x1 = _mm512_shuffle_i32x4(u[e], u[4 + e], 0xDD);
    const __m512i y0 = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], 0x88);
    const __m512i y1 = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], 0xDD);
    r[e] = _mm512_shuffle_i32x4(x0, y0, 0x88);
    r[8 + e] = _mm512_shuffle_i32x4(x0, y0, 0xDD);
    r[4 + e] = _mm512_shuffle_i32x4(x1, y1, 0x88);
    r[12 + e] = _mm512_shuffle_i32x4(x1, y1, 0xDD);
  }
}

// strip[(s * kStripRows + r) * 2 + i] = W[n0 + r, 2s + i] in bf16, for the rows [n0, n1)
// (at most kStripRows) rounded up to whole vectors, the rows past n1 zeros.
template <int BITS>
void dequantize_strip(const PackedWeight& w, int64_t n0, int64_t n1, uint16_t* strip) {
  for (int64_t r0 = n0; r0 < n1; r0 += Avx512::kLanes) {
    for (int64_t k0 = 0; k0 < w.k; k0 += kStripRun) {
      __m512i rows[Avx512::kLanes];
      for (int r = 0; r < Avx512::kLanes; ++r)
        rows[r] = r0 + r < n1 ? row_pairs<BITS>(w, r0 + r, k0) : _mm512_setzero_si512();
      transpose16(rows);
      const int64_t pairs = std::min<int64_t>(Avx512::kLanes, (w.k - k0) / 2);
      for (int64_t j = 0; j < pairs; ++j)
        _mm512_storeu_si512(strip + ((k0 / 2 + j) * kStripRows + (r0 - n0)) * 2, rows[j]);
    }
  }
}

// out[t * ldo + r] for r < num_rows (at most VECS vectors' rows) and t < TOKENS, in bf16.
template <int VECS, int TOKENS>
CORE_QL_INLINE void strip_block(const uint16_t* strip, int64_t k, const uint16_t* x,
                                int64_t num_rows, uint16_t* out, int64_t ldo) {
  __m512 acc[TOKENS][VECS];
  for (int t = 0; t < TOKENS; ++t)
    for (int v = 0; v < VECS; ++v) acc[t][v] = Avx512::zero();
  for (int64_t s = 0; s < k / 2; ++s) {
    __m512i rows[VECS];
    for (int v = 0; v < VECS; ++v)
      rows[v] = _mm512_loadu_si512(strip + (s * kStripRows + v * Avx512::kLanes) * 2);
    for (int t = 0; t < TOKENS; ++t) {
      const __m512i pair = Bf16Dot::broadcast(x + t * k + 2 * s);
      for (int v = 0; v < VECS; ++v) acc[t][v] = Bf16Dot::madd(rows[v], pair, acc[t][v]);
    }
  }
  for (int t = 0; t < TOKENS; ++t) {
    for (int v = 0; v < VECS; ++v) {
      const int64_t rows = num_rows - v * Avx512::kLanes;
      const __m256i bits = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(acc[t][v]));
      uint16_t* dst = out + t * ldo + v * Avx512::kLanes;
      if (rows >= Avx512::kLanes) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), bits);
      } else {
        _mm256_mask_storeu_epi16(dst, static_cast<__mmask16>((1u << rows) - 1), bits);
      }
    }
  }
}

template <int VECS>
void strip_tokens(const uint16_t* strip, int64_t k, const uint16_t* x, int64_t num_tokens,
                  int64_t num_rows, uint16_t* out, int64_t ldo) {
  int64_t t = 0;
  for (; t + kStripTokens <= num_tokens; t += kStripTokens)
    strip_block<VECS, kStripTokens>(strip, k, x + t * k, num_rows, out + t * ldo, ldo);
  const uint16_t* xt = x + t * k;
  uint16_t* ot = out + t * ldo;
  switch (num_tokens - t) {
    case 1: return strip_block<VECS, 1>(strip, k, xt, num_rows, ot, ldo);
    case 2: return strip_block<VECS, 2>(strip, k, xt, num_rows, ot, ldo);
    case 3: return strip_block<VECS, 3>(strip, k, xt, num_rows, ot, ldo);
    case 4: return strip_block<VECS, 4>(strip, k, xt, num_rows, ot, ldo);
    case 5: return strip_block<VECS, 5>(strip, k, xt, num_rows, ot, ldo);
    default: return;
  }
}

// out[t * ldo + r] for r < num_rows and every token, from W's rows in strip layout at
// `strip` (pairs a kStripRows * 2 apart, so a strip entered a few vectors in serves).
void multiply_strip(const uint16_t* strip, int64_t k, int64_t num_rows, const uint16_t* x,
                    int64_t num_tokens, uint16_t* out, int64_t ldo) {
  switch ((num_rows + Avx512::kLanes - 1) / Avx512::kLanes) {
    case 1: return strip_tokens<1>(strip, k, x, num_tokens, num_rows, out, ldo);
    case 2: return strip_tokens<2>(strip, k, x, num_tokens, num_rows, out, ldo);
    case 3: return strip_tokens<3>(strip, k, x, num_tokens, num_rows, out, ldo);
    default: return strip_tokens<kStripVecs>(strip, k, x, num_tokens, num_rows, out, ldo);
  }
}

void dequantize_any_strip(const PackedWeight& w, int64_t n0, int64_t n1, uint16_t* strip) {
  if (w.bits == 4) {
    dequantize_strip<4>(w, n0, n1, strip);
  } else {
    dequantize_strip<8>(w, n0, n1, strip);
  }
}

void strip_gemm(const PackedWeight& w, int64_t n0, int64_t n1, const uint16_t* x,
                int64_t num_tokens, uint16_t* out, int64_t ldo, uint16_t* strip) {
  for (int64_t s0 = n0; s0 < n1; s0 += kStripRows) {
    const int64_t rows = std::min(kStripRows, n1 - s0);
    dequantize_any_strip(w, s0, s0 + rows, strip);
    multiply_strip(strip, w.k, rows, x, num_tokens, out + s0, ldo);
  }
}

void pack_strips(const PackedWeight& w, int64_t n0, int64_t n1, uint16_t* strips) {
  for (int64_t s0 = n0; s0 < n1; s0 += kStripRows)
    dequantize_any_strip(w, s0, std::min(kStripRows, n1 - s0) + s0, strips + s0 * w.k);
}

void packed_strip_gemm(const uint16_t* strips, int64_t k, int64_t n0, int64_t n1,
                       const uint16_t* x, int64_t num_tokens, uint16_t* out, int64_t ldo) {
  for (int64_t r0 = n0; r0 < n1;) {  // to the end of r0's strip, or n1
    const int64_t in_strip = r0 % kStripRows;
    const int64_t rows = std::min(kStripRows - in_strip, n1 - r0);
    const uint16_t* strip = strips + (r0 - in_strip) * k + in_strip * 2;
    multiply_strip(strip, k, rows, x, num_tokens, out + r0, ldo);
    r0 += rows;
  }
}

const Bf16Kernels kBf16{&pack_tokens<Avx512, Bf16Dot>, &gemm<Avx512, Bf16Dot>, &strip_gemm,
                        &pack_strips,  &packed_strip_gemm,        &pack_interleaved,
                        &interleaved_gemv};

const Int8Kernels kInt8{&quantize_tokens, &int8_gemm};

}  // namespace

const IsaKernels kAvx512Bf16Kernels =
    isa_kernels<Avx512>("avx512_bf16", &kBf16, &kInt8, &int8_gemv_avx2);

}  // namespace core_cpu::quant_linear

#pragma GCC pop_options

#endif  // CORE_X86_KERNELS
