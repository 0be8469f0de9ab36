// The GEMV of core::fp8_linear and its rows for quant_linear_isa.h's blocked GEMM, written
// once over a vector type (see quant_linear_isa.h for why each ISA translation unit
// compiles its own copy).
//
// Besides quant_linear's Vec members, a Vec here provides mul(a, b) and load_e4m3(p):
// kLanes float8_e4m3fn values from p as float32 lanes (their bytes widened by the ISA,
// then fp8.h's arithmetic).

#pragma once

#include <cstdint>

#include "fp8.h"
#include "fp8_linear.h"
#include "quant_linear_isa.h"

#define CORE_FP8L_INLINE inline __attribute__((always_inline))

namespace core_cpu::fp8_linear {
namespace {

// Weights [i, i + kLanes) of the row at `row`: each e4m3 value times its block's scale
// (broadcast in `scale`), the layout's one float32 product, so W is exactly the reference's.
template <class Vec>
CORE_FP8L_INLINE typename Vec::V weights(const uint8_t* row, int64_t i,
                                        typename Vec::V scale) {
  return Vec::mul(Vec::load_e4m3(row + i), scale);
}

CORE_FP8L_INLINE float weight(const uint8_t* row, int64_t i, float scale) {
  return fp8_value<E4m3, float>(static_cast<uint32_t>(row[i])) * scale;
}

// The end of block b's inputs: block_k past its start, or k for a row's last, partial block.
CORE_FP8L_INLINE int64_t block_end(const Fp8Weight& w, int64_t b) {
  const int64_t end = (b + 1) * w.block_k;
  return end < w.k ? end : w.k;
}

// out[t, n + r] for r < ROWS, t in [t0, t0 + TOKENS). A block's inputs go a vector at a
// time, its scale broadcast once; inputs past its last whole vector (block_k or k not a
// multiple of kLanes) one at a time.
template <class Vec, int ROWS, int TOKENS>
CORE_FP8L_INLINE void gemv_block(const Fp8Weight& w, int64_t n, const float* x, int64_t t0,
                                 float* out, int64_t ldo) {
  using V = typename Vec::V;
  const uint8_t* rows = w.data + n * w.k;
  const float* scales = w.scales + n * w.blocks;
  const float* xt = x + t0 * w.k;
  V acc[ROWS][TOKENS];
  float tail[ROWS][TOKENS] = {};
  for (int r = 0; r < ROWS; ++r)
    for (int t = 0; t < TOKENS; ++t) acc[r][t] = Vec::zero();
  for (int64_t b = 0; b < w.blocks; ++b) {
    const int64_t end = block_end(w, b);
    V scale[ROWS];
    for (int r = 0; r < ROWS; ++r) scale[r] = Vec::set1(scales[r * w.blocks + b]);
    int64_t i = b * w.block_k;
    for (; i + Vec::kLanes <= end; i += Vec::kLanes) {
      V xv[TOKENS];
      for (int t = 0; t < TOKENS; ++t) xv[t] = Vec::load(xt + t * w.k + i);
      for (int r = 0; r < ROWS; ++r) {
        const V wv = weights<Vec>(rows + r * w.k, i, scale[r]);
        for (int t = 0; t < TOKENS; ++t) acc[r][t] = Vec::fma(wv, xv[t], acc[r][t]);
      }
    }
    for (; i < end; ++i) {
      for (int r = 0; r < ROWS; ++r) {
        const float wi = weight(rows + r * w.k, i, scales[r * w.blocks + b]);
        for (int t = 0; t < TOKENS; ++t) tail[r][t] += wi * xt[t * w.k + i];
      }
    }
  }
  for (int r = 0; r < ROWS; ++r)
    for (int t = 0; t < TOKENS; ++t)
      out[(t0 + t) * ldo + n + r] = Vec::sum(acc[r][t]) + tail[r][t];
}

// Rows [n, n + num_rows) with num_rows <= 4, times tokens [t0, t0 + TOKENS), in
// quant_linear's register blocks.
template <class Vec, int TOKENS>
CORE_FP8L_INLINE void gemv_rows(const Fp8Weight& w, int64_t n, int64_t num_rows,
                                const float* x, int64_t t0, float* out, int64_t ldo) {
  constexpr int kRows = quant_linear::kRowsPerBlock<TOKENS>;
  int64_t r = 0;
  for (; r + kRows <= num_rows; r += kRows)
    gemv_block<Vec, kRows, TOKENS>(w, n + r, x, t0, out, ldo);
  for (; r < num_rows; ++r) gemv_block<Vec, 1, TOKENS>(w, n + r, x, t0, out, ldo);
}

// quant_linear_isa.h's passes over W's rows (the FP8 bytes lie k apart).
template <class Vec>
void gemv(const Fp8Weight& w, int64_t n0, int64_t n1, const float* x, int64_t num_tokens,
          float* out, int64_t ldo) {
  quant_linear::gemv_passes(w.data, w.k, n0, n1, num_tokens,
                            [&](auto tokens, int64_t n, int64_t num_rows, int64_t t0) {
                              gemv_rows<Vec, decltype(tokens)::value>(w, n, num_rows, x, t0,
                                                                      out, ldo);
                            });
}

// The blocked GEMM's rows: W's rows [n0, n1) in float32, k apart.
template <class Vec>
struct Fp8Rows {
  using Weight = Fp8Weight;
  static void dequantize(const Fp8Weight& w, int64_t n0, int64_t n1, float* out) {
    for (int64_t n = n0; n < n1; ++n) {
      const uint8_t* row = w.data + n * w.k;
      float* dense = out + (n - n0) * w.k;
      for (int64_t b = 0; b < w.blocks; ++b) {
        const int64_t end = block_end(w, b);
        const float scale_f = w.scales[n * w.blocks + b];
        const typename Vec::V scale = Vec::set1(scale_f);
        int64_t i = b * w.block_k;
        for (; i + Vec::kLanes <= end; i += Vec::kLanes)
          Vec::store(dense + i, weights<Vec>(row, i, scale));
        for (; i < end; ++i) dense[i] = weight(row, i, scale_f);
      }
    }
  }
};

template <class Vec>
constexpr IsaKernels isa_kernels(const char* name) {
  using Dot = quant_linear::Float32Dot<Vec>;
  return {name, &gemv<Vec>, quant_linear::kTokenBlock<Vec>,
          &quant_linear::pack_tokens<Vec, Dot>, &quant_linear::gemm<Vec, Dot, Fp8Rows<Vec>>};
}

}  // namespace
}  // namespace core_cpu::fp8_linear
