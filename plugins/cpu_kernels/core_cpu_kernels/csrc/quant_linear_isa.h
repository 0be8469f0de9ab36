// The GEMV and dequantization loops of core::quant_linear, written once over a vector type.
//
// Each ISA translation unit defines a `Vec` (below) and includes this file after its
// `#pragma GCC target`, so every function here is compiled for that ISA alone; a function
// cannot inline intrinsics of a wider ISA than its own, so one copy per ISA is the only
// way to write the loops once. Everything sits in an unnamed namespace: each translation
// unit keeps its own copy, and the linker can never substitute one ISA's for another's.
//
// A Vec provides: `V` (kLanes float32 lanes), zero(), set1(f), load(p), store(p, v),
// fma(a, b, c) = a * b + c, fmas(a, b, c) the same on floats, rounded as one lane of fma
// rounds, sum(v) (the lanes' total), and unpack<BITS>(unit, q), which
// turns one 16-byte unit of a packed row (4-bit: a run of 32 values; 8-bit: 16 values)
// into its values as floats, in input order, in kUnitValues<BITS> / kLanes vectors.

#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "quant_linear.h"

#define CORE_QL_INLINE inline __attribute__((always_inline))

namespace core_cpu::quant_linear {
namespace {

template <int BITS>
constexpr int kUnitValues = BITS == 4 ? 32 : 16;  // the values of one 16-byte unit

// Weight rows the GEMV multiplies together, by the number of tokens it multiplies them
// with. Each unpacked unit is used TOKENS times and each x load ROWS times; the ROWS x
// TOKENS group sums are independent FMA chains (one would stall on the FMA's latency),
// and their totals (touched once a group) are what spills first. Measured with AVX2 on
// SmolLM2's shapes: 2 rows beat 4 for 2 tokens (4 spill) and beat 1 for 3; tie for 4.
template <int TOKENS>
constexpr int kRowsPerBlock = TOKENS == 1 ? 4 : 2;

constexpr int kTokensPerPass = 4;  // the most tokens one pass over a row multiplies

CORE_QL_INLINE float dot(const float* a, const float* b, int64_t n) {
  float sum = 0.f;
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// One output's share of the mins, sum_g mins[g] * sums[g], added in g order by Vec::fmas:
// batch-invariant mode's GEMV (gemv_invariant), and lane by lane gemv_unpacked's
// (add_mins_shares), to the same bits. `dot` may be summed in any order the compiler
// likes (the build's -fassociative-math), so the default GEMV keeps it: the mode's kernels
// cannot follow it lane by lane.
template <class Vec>
CORE_QL_INLINE float mins_share(const float* mins, const float* sums, int64_t groups) {
  float share = 0.f;
  for (int64_t g = 0; g < groups; ++g) share = Vec::fmas(mins[g], sums[g], share);
  return share;
}

// out[t, n + r] for r < ROWS, t in [t0, t0 + TOKENS): per group, the dot product of the
// integer values q with x in float32, times the group's scale; then the mins' share.
template <class Vec, int BITS, int ROWS, int TOKENS, bool INVARIANT>
CORE_QL_INLINE void gemv_block(const PackedWeight& w, int64_t n, const Activations& a,
                               int64_t t0, float* out, int64_t ldo) {
  using V = typename Vec::V;
  constexpr int kValues = kUnitValues<BITS>;
  constexpr int kVecs = kValues / Vec::kLanes;
  const int64_t groups = w.groups(), units_per_group = w.group_size / kValues;
  const float* x = a.x + t0 * w.k;
  V total[ROWS][TOKENS];
  for (int r = 0; r < ROWS; ++r)
    for (int t = 0; t < TOKENS; ++t) total[r][t] = Vec::zero();
  for (int64_t g = 0; g < groups; ++g) {
    V acc[ROWS][TOKENS];
    for (int r = 0; r < ROWS; ++r)
      for (int t = 0; t < TOKENS; ++t) acc[r][t] = Vec::zero();
    for (int64_t u = 0; u < units_per_group; ++u) {
      const int64_t k0 = (g * units_per_group + u) * kValues;
      for (int r = 0; r < ROWS; ++r) {
        V q[kVecs];
        Vec::template unpack<BITS>(w.data + (n + r) * w.row_bytes + k0 * BITS / 8, q);
        for (int t = 0; t < TOKENS; ++t)
          for (int i = 0; i < kVecs; ++i)
            acc[r][t] = Vec::fma(q[i], Vec::load(x + t * w.k + k0 + i * Vec::kLanes), acc[r][t]);
      }
    }
    for (int r = 0; r < ROWS; ++r) {
      const V scale = Vec::set1(w.scales[(n + r) * groups + g]);
      for (int t = 0; t < TOKENS; ++t) total[r][t] = Vec::fma(scale, acc[r][t], total[r][t]);
    }
  }
  for (int r = 0; r < ROWS; ++r) {
    for (int t = 0; t < TOKENS; ++t) {
      const float* sums = a.group_sums + (t0 + t) * groups;
      out[(t0 + t) * ldo + n + r] =
          Vec::sum(total[r][t]) + (INVARIANT ? mins_share<Vec>(w.mins + (n + r) * groups, sums, groups)
                                             : dot(w.mins + (n + r) * groups, sums, groups));
    }
  }
}

// Rows [n, n + num_rows) with num_rows <= 4, times tokens [t0, t0 + TOKENS).
template <class Vec, int BITS, int TOKENS, bool INVARIANT>
CORE_QL_INLINE void gemv_rows(const PackedWeight& w, int64_t n, int64_t num_rows,
                              const Activations& a, int64_t t0, float* out, int64_t ldo) {
  constexpr int kRows = kRowsPerBlock<TOKENS>;
  int64_t r = 0;
  for (; r + kRows <= num_rows; r += kRows)
    gemv_block<Vec, BITS, kRows, TOKENS, INVARIANT>(w, n + r, a, t0, out, ldo);
  for (; r < num_rows; ++r) gemv_block<Vec, BITS, 1, TOKENS, INVARIANT>(w, n + r, a, t0, out, ldo);
}

// Four rows at a time, every token pass over them while they sit in L1: the weights
// stream from memory once however many tokens there are. The next four rows are
// prefetched meanwhile: the hardware prefetchers stop at each 4 KB page, and a decode
// step's weights are all cold (30 layers of SmolLM2 and its head, one token, AVX512_BF16
// EPYC, 2 threads: 12.1 -> 9.3 ms; the distance mattered little from 256 B to 2 KB).
// `rows(tokens, n, num_rows, t0)` multiplies rows [n, n + num_rows) with tokens [t0, t0 +
// tokens) (tokens a std::integral_constant: 1, 2, 3 or kTokensPerPass); W's rows lie
// `row_bytes` apart from `data`. Every GEMV (4- and 8-bit, int8, FP8) passes this way.
template <class Rows>
CORE_QL_INLINE void gemv_passes(const uint8_t* data, int64_t row_bytes, int64_t n0, int64_t n1,
                                int64_t num_tokens, Rows&& rows) {
  constexpr int64_t kCacheLine = 64;
  const uint8_t* rows_end = data + n1 * row_bytes;
  for (int64_t n = n0; n < n1; n += 4) {
    const int64_t num_rows = n1 - n < 4 ? n1 - n : 4;
    const uint8_t* next = data + (n + 4) * row_bytes;
    for (const uint8_t* p = next; p < next + 4 * row_bytes && p < rows_end; p += kCacheLine)
      __builtin_prefetch(p, /*rw=*/0, /*locality=*/3);
    for (int64_t t0 = 0; t0 < num_tokens; t0 += kTokensPerPass) {
      switch (num_tokens - t0) {
        case 1:
          rows(std::integral_constant<int, 1>{}, n, num_rows, t0);
          break;
        case 2:
          rows(std::integral_constant<int, 2>{}, n, num_rows, t0);
          break;
        case 3:
          rows(std::integral_constant<int, 3>{}, n, num_rows, t0);
          break;
        default:
          rows(std::integral_constant<int, kTokensPerPass>{}, n, num_rows, t0);
      }
    }
  }
}

template <class Vec, int BITS, bool INVARIANT>
void gemv_bits(const PackedWeight& w, int64_t n0, int64_t n1, const Activations& a,
               float* out, int64_t ldo) {
  gemv_passes(w.data, w.row_bytes, n0, n1, a.num_tokens,
              [&](auto tokens, int64_t n, int64_t num_rows, int64_t t0) {
                gemv_rows<Vec, BITS, decltype(tokens)::value, INVARIANT>(w, n, num_rows, a, t0,
                                                                         out, ldo);
              });
}

template <class Vec, bool INVARIANT>
void gemv(const PackedWeight& w, int64_t n0, int64_t n1, const Activations& a, float* out,
          int64_t ldo) {
  if (w.bits == 4) return gemv_bits<Vec, 4, INVARIANT>(w, n0, n1, a, out, ldo);
  gemv_bits<Vec, 8, INVARIANT>(w, n0, n1, a, out, ldo);
}

// The GEMV's arithmetic for many tokens (batch-invariant mode: quant_linear.h's
// gemv_unpacked): every (row, token) takes the very fma chains of gemv_block, in the same
// order (a group's products into a vector of partial sums, that vector times the group's
// scale into the total, the lanes' sum plus the mins' share), so its outputs equal the
// GEMV's to the bit, whatever the token count. What changes is the work around them: W's
// rows are unpacked once into floats in L1 (`q_rows`) for every token, where the GEMV
// unpacks them again for each pass of 4 tokens, and the block of kUnpackedRows rows x
// kUnpackedTokens tokens keeps its partial sums and totals in 12 registers, loading each
// row's and each token's vector once per step.
constexpr int kUnpackedRows = static_cast<int>(kUnpackedRowsMax);
constexpr int kUnpackedTokens = 4;

template <class Vec, int ROWS, int TOKENS>
CORE_QL_INLINE void unpacked_block(const PackedWeight& w, int64_t n, const float* q_rows,
                                   const Activations& a, int64_t t0, float* out, int64_t ldo) {
  using V = typename Vec::V;
  const int64_t groups = w.groups(), k = w.k;
  const float* x = a.x + t0 * k;
  // The totals, touched once a group, stay in memory: the registers hold the partial sums.
  alignas(64) float total[ROWS][TOKENS][Vec::kLanes] = {};
  for (int64_t g = 0; g < groups; ++g) {
    V acc[ROWS][TOKENS];
    for (int r = 0; r < ROWS; ++r)
      for (int t = 0; t < TOKENS; ++t) acc[r][t] = Vec::zero();
    for (int64_t i = g * w.group_size; i < (g + 1) * w.group_size; i += Vec::kLanes) {
      V xv[TOKENS];
      for (int t = 0; t < TOKENS; ++t) xv[t] = Vec::load(x + t * k + i);
      for (int r = 0; r < ROWS; ++r) {
        const V q = Vec::load(q_rows + r * k + i);
        for (int t = 0; t < TOKENS; ++t) acc[r][t] = Vec::fma(q, xv[t], acc[r][t]);
      }
    }
    for (int r = 0; r < ROWS; ++r) {
      const V scale = Vec::set1(w.scales[(n + r) * groups + g]);
      for (int t = 0; t < TOKENS; ++t)
        Vec::store(total[r][t], Vec::fma(scale, acc[r][t], Vec::load(total[r][t])));
    }
  }
  for (int r = 0; r < ROWS; ++r)
    for (int t = 0; t < TOKENS; ++t) out[(t0 + t) * ldo + n + r] = Vec::sum(Vec::load(total[r][t]));
}

// out[t * ldo + n] += row n's mins_share with token t, for every token: kLanes tokens at a
// time, a lane each (the sums by group, `sums_by_group` [groups, num_tokens]), the tail one
// by one; each lane's chain is mins_share's.
template <class Vec>
CORE_QL_INLINE void add_mins_shares(const PackedWeight& w, int64_t n, const Activations& a,
                                    const float* sums_by_group, float* out, int64_t ldo) {
  using V = typename Vec::V;
  const int64_t groups = w.groups(), tokens = a.num_tokens;
  const float* mins = w.mins + n * groups;
  int64_t t0 = 0;
  for (; t0 + Vec::kLanes <= tokens; t0 += Vec::kLanes) {
    V share = Vec::zero();
    for (int64_t g = 0; g < groups; ++g)
      share = Vec::fma(Vec::set1(mins[g]), Vec::load(sums_by_group + g * tokens + t0), share);
    alignas(64) float lanes[Vec::kLanes];
    Vec::store(lanes, share);
    for (int64_t t = 0; t < Vec::kLanes; ++t) out[(t0 + t) * ldo + n] += lanes[t];
  }
  for (; t0 < tokens; ++t0)
    out[t0 * ldo + n] += mins_share<Vec>(mins, a.group_sums + t0 * groups, groups);
}

template <class Vec, int ROWS>
CORE_QL_INLINE void unpacked_rows(const PackedWeight& w, int64_t n, const float* q_rows,
                                  const Activations& a, float* out, int64_t ldo) {
  int64_t t0 = 0;
  for (; t0 + kUnpackedTokens <= a.num_tokens; t0 += kUnpackedTokens)
    unpacked_block<Vec, ROWS, kUnpackedTokens>(w, n, q_rows, a, t0, out, ldo);
  for (; t0 < a.num_tokens; ++t0) unpacked_block<Vec, ROWS, 1>(w, n, q_rows, a, t0, out, ldo);
}

template <class Vec, int BITS>
void gemv_unpacked_bits(const PackedWeight& w, int64_t n0, int64_t n1, const Activations& a,
                        const float* sums_by_group, float* out, int64_t ldo, float* q_rows) {
  using V = typename Vec::V;
  constexpr int kValues = kUnitValues<BITS>;
  constexpr int kVecs = kValues / Vec::kLanes;
  for (int64_t n = n0; n < n1; n += kUnpackedRows) {
    const int64_t num_rows = n1 - n < kUnpackedRows ? n1 - n : kUnpackedRows;
    for (int64_t r = 0; r < num_rows; ++r) {
      for (int64_t k0 = 0; k0 < w.k; k0 += kValues) {
        V q[kVecs];
        Vec::template unpack<BITS>(w.data + (n + r) * w.row_bytes + k0 * BITS / 8, q);
        for (int i = 0; i < kVecs; ++i) Vec::store(q_rows + r * w.k + k0 + i * Vec::kLanes, q[i]);
      }
    }
    if (num_rows == kUnpackedRows) {
      unpacked_rows<Vec, kUnpackedRows>(w, n, q_rows, a, out, ldo);
    } else {
      for (int64_t r = 0; r < num_rows; ++r)
        unpacked_rows<Vec, 1>(w, n + r, q_rows + r * w.k, a, out, ldo);  // W's last rows
    }
    for (int64_t r = 0; r < num_rows; ++r) add_mins_shares<Vec>(w, n + r, a, sums_by_group, out, ldo);
  }
}

template <class Vec>
void gemv_unpacked(const PackedWeight& w, int64_t n0, int64_t n1, const Activations& a,
                   const float* sums_by_group, float* out, int64_t ldo, float* q_rows) {
  if (w.bits == 4) return gemv_unpacked_bits<Vec, 4>(w, n0, n1, a, sums_by_group, out, ldo, q_rows);
  gemv_unpacked_bits<Vec, 8>(w, n0, n1, a, sums_by_group, out, ldo, q_rows);
}

// How the GEMM multiplies and what it multiplies: a Dot provides `Elem`, the type of the
// dequantized weights and packed x (one input each); kInputsPerStep, the adjacent inputs one
// step over k takes; `In`, a vector of one step's Elems for kLanes tokens (or one row's,
// broadcast); load(p) and broadcast(p) of those; madd(w, x, acc), acc's float32 lanes plus
// the step's products; and store(row, i, v), kLanes float32 weights into row's inputs
// [i, i + kLanes) as Elems.
//
// Float32Dot: one float32 input a step, multiplied by FMA.
template <class Vec>
struct Float32Dot {
  using V = typename Vec::V;
  using Elem = float;
  using In = V;
  static constexpr int64_t kInputsPerStep = 1;

  static CORE_QL_INLINE In load(const float* p) { return Vec::load(p); }
  static CORE_QL_INLINE In broadcast(const float* p) { return Vec::set1(*p); }
  static CORE_QL_INLINE V madd(In w, In x, V acc) { return Vec::fma(w, x, acc); }
  static CORE_QL_INLINE void store(float* row, int64_t i, V v) { Vec::store(row + i, v); }
};

// W = fma(q, scale, min) rounds once where the reference rounds the product and then the
// sum: each W may differ from the reference's by an ulp, inside the op's float32 tolerance.
template <class Vec, class Dot, int BITS>
void dequantize_bits(const PackedWeight& w, int64_t n0, int64_t n1, typename Dot::Elem* out) {
  using V = typename Vec::V;
  constexpr int kValues = kUnitValues<BITS>;
  constexpr int kVecs = kValues / Vec::kLanes;
  const int64_t groups = w.groups(), units_per_group = w.group_size / kValues;
  for (int64_t n = n0; n < n1; ++n) {
    typename Dot::Elem* row = out + (n - n0) * w.k;
    for (int64_t g = 0; g < groups; ++g) {
      const V scale = Vec::set1(w.scales[n * groups + g]);
      const V min = Vec::set1(w.mins[n * groups + g]);
      for (int64_t u = 0; u < units_per_group; ++u) {
        const int64_t k0 = (g * units_per_group + u) * kValues;
        V q[kVecs];
        Vec::template unpack<BITS>(w.data + n * w.row_bytes + k0 * BITS / 8, q);
        for (int i = 0; i < kVecs; ++i)
          Dot::store(row, k0 + i * Vec::kLanes, Vec::fma(q[i], scale, min));
      }
    }
  }
}

// out[(n - n0) * k + i] = W[n, i] as Dot's Elem, for n in [n0, n1).
template <class Vec, class Dot>
void dequantize(const PackedWeight& w, int64_t n0, int64_t n1, typename Dot::Elem* out) {
  if (w.bits == 4) return dequantize_bits<Vec, Dot, 4>(w, n0, n1, out);
  dequantize_bits<Vec, Dot, 8>(w, n0, n1, out);
}

// The GEMM's register block: kGemmRows (6, quant_linear.h) weight rows times kGemmTokenVecs
// vectors of tokens. Each step over k broadcasts one value of each row and loads the
// tokens' vectors once: 6 x 2 accumulators, 2 token vectors and a broadcast fill 15 of
// AVX2's 16 registers, and the 12 FMAs per step outnumber its 8 loads, so the FMA ports
// set the pace.
constexpr int kGemmTokenVecs = 2;

template <class Vec>
constexpr int64_t kTokenBlock = kGemmTokenVecs * Vec::kLanes;

// packed[b][s][j][i] = x[b * NR + j, s * S + i] (NR = kTokenBlock, S = kInputsPerStep) for
// the token blocks [b0, b1): the tokens in blocks of NR, each step-major so the block's
// step over k reads NR * S contiguous Elems; the last block is padded with zeros. Written
// in output order: each step fills one cache line from NR rows of x whose lines stay in
// L1 for NR steps (token-major order wrote each line NR times and, past L1's size,
// evicted it between the writes).
template <class Vec, class Dot>
void pack_tokens(const typename Dot::Elem* x, int64_t num_tokens, int64_t k, int64_t b0,
                 int64_t b1, typename Dot::Elem* packed) {
  constexpr int64_t nr = kTokenBlock<Vec>, step = Dot::kInputsPerStep;
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t t0 = b * nr;
    const typename Dot::Elem* rows = x + t0 * k;
    typename Dot::Elem* block = packed + t0 * k;
    const int64_t real = num_tokens - t0;  // the block's tokens; past them, zeros
    for (int64_t s = 0; s < k; s += step)
      for (int64_t j = 0; j < nr; ++j)
        for (int64_t i = 0; i < step; ++i)
          block[s * nr + j * step + i] = j < real ? rows[j * k + s + i] : 0;
  }
}

// out[t * ldo + r] = sum_i rows[r * k + i] * token t's x[i], for r < num_rows and the
// block's first num_tokens tokens; rows holds kGemmRows rows (any beyond num_rows are
// computed and dropped).
template <class Vec, class Dot, int VECS>
CORE_QL_INLINE void gemm_block(const typename Dot::Elem* rows, int64_t k,
                               const typename Dot::Elem* block, int64_t num_rows,
                               int64_t num_tokens, float* out, int64_t ldo) {
  using V = typename Vec::V;
  constexpr int64_t nr = kTokenBlock<Vec>, step = Dot::kInputsPerStep;
  V acc[kGemmRows][VECS];
  for (int r = 0; r < kGemmRows; ++r)
    for (int v = 0; v < VECS; ++v) acc[r][v] = Vec::zero();
  // Four steps a pass: the loop's own counter and branch otherwise take issue slots from
  // the FMAs (AVX2, one SmolLM2 layer at 32 tokens: 1.61 -> 1.55 ms).
#pragma GCC unroll 4
  for (int64_t s = 0; s < k; s += step) {
    typename Dot::In x[VECS];
    for (int v = 0; v < VECS; ++v) x[v] = Dot::load(block + (s * nr + v * Vec::kLanes * step));
    for (int r = 0; r < kGemmRows; ++r) {
      const typename Dot::In w = Dot::broadcast(rows + (r * k + s));
      for (int v = 0; v < VECS; ++v) acc[r][v] = Dot::madd(w, x[v], acc[r][v]);
    }
  }
  float lanes[VECS * Vec::kLanes];
  for (int64_t r = 0; r < num_rows; ++r) {
    for (int v = 0; v < VECS; ++v) Vec::store(lanes + v * Vec::kLanes, acc[r][v]);
    for (int64_t t = 0; t < num_tokens; ++t) out[t * ldo + r] = lanes[t];
  }
}

// Which weight the GEMM multiplies: a Rows provides `Weight` (with its inputs per row, k)
// and dequantize(w, n0, n1, out), W's rows [n0, n1) as Dot's Elems, k apart. PackedRows:
// core::quant_linear's packed weight (fp8_linear_isa.h has core::fp8_linear's).
template <class Vec, class Dot>
struct PackedRows {
  using Weight = PackedWeight;
  static CORE_QL_INLINE void dequantize(const PackedWeight& w, int64_t n0, int64_t n1,
                                        typename Dot::Elem* out) {
    quant_linear::dequantize<Vec, Dot>(w, n0, n1, out);
  }
};

// out[t * ldo + n] = sum_i W[n, i] x[t, i] for n in [n0, n1) and every token, x packed by
// pack_tokens. Each kGemmRows rows are dequantized once into `rows` (kGemmRows * k Elems,
// in L1 or L2) and multiplied there with every token block. The register blocks write a
// panel of kGemmPanelRows rows (kGemmPanelRows * num_tokens floats), which then goes to
// out a token's row segment at a time: out's token rows lie ldo apart, a multiple of 4 KB
// for many layers (3072 outputs, a 49152 vocabulary), where the 16 rows a register block
// wrote into compete for one L1 set.
template <class Vec, class Dot, class Rows = PackedRows<Vec, Dot>>
void gemm(const typename Rows::Weight& w, int64_t n0, int64_t n1,
          const typename Dot::Elem* packed_x, int64_t num_tokens, float* out, int64_t ldo,
          typename Dot::Elem* rows, float* panel) {
  constexpr int64_t nr = kTokenBlock<Vec>;
  for (int64_t p0 = n0; p0 < n1; p0 += kGemmPanelRows) {
    const int64_t p1 = n1 - p0 < kGemmPanelRows ? n1 : p0 + kGemmPanelRows;
    for (int64_t n = p0; n < p1; n += kGemmRows) {
      const int64_t num_rows = p1 - n < kGemmRows ? p1 - n : kGemmRows;
      Rows::dequantize(w, n, n + num_rows, rows);
      // Rows past the end are computed and dropped: zeros keep denormals and NaNs out.
      for (int64_t i = num_rows * w.k; i < kGemmRows * w.k; ++i) rows[i] = 0;
      for (int64_t t0 = 0; t0 < num_tokens; t0 += nr) {
        const int64_t block_tokens = num_tokens - t0 < nr ? num_tokens - t0 : nr;
        const typename Dot::Elem* block = packed_x + t0 * w.k;
        float* block_out = panel + t0 * kGemmPanelRows + (n - p0);
        if (block_tokens > Vec::kLanes * (kGemmTokenVecs - 1)) {
          gemm_block<Vec, Dot, kGemmTokenVecs>(rows, w.k, block, num_rows, block_tokens,
                                               block_out, kGemmPanelRows);
        } else {
          gemm_block<Vec, Dot, 1>(rows, w.k, block, num_rows, block_tokens, block_out,
                                  kGemmPanelRows);
        }
      }
    }
    for (int64_t t = 0; t < num_tokens; ++t)
      std::memcpy(out + t * ldo + p0, panel + t * kGemmPanelRows, (p1 - p0) * sizeof(float));
  }
}

// The table of an ISA's kernels for float32 arithmetic; `bf16`, `int8` and `int8_gemv`, its
// bf16 and int8 dot-product kernels where it has them.
template <class Vec>
constexpr IsaKernels isa_kernels(const char* name, const Bf16Kernels* bf16 = nullptr,
                                 const Int8Kernels* int8 = nullptr,
                                 Int8GemvFn int8_gemv = nullptr) {
  using Dot = Float32Dot<Vec>;
  return {name,
          &gemv<Vec, false>,
          &gemv<Vec, true>,
          &gemv_unpacked<Vec>,
          &dequantize<Vec, Dot>,
          kTokenBlock<Vec>,
          &pack_tokens<Vec, Dot>,
          &gemm<Vec, Dot>,
          bf16,
          int8,
          int8_gemv};
}

}  // namespace
}  // namespace core_cpu::quant_linear
