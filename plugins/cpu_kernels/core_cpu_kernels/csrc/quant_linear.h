// core::quant_linear's packed weight as the compute kernels see it, and the table of
// kernels each vector ISA provides (linear_{scalar,avx2,avx512,avx512_bf16}.cpp). The
// layout is core's (core/ops/quant_linear.py):
// W[n, k] = scales[n, k / G] * q[n, k] + mins[n, k / G].
//
// This header and quant_linear_isa.h include no torch header: the ISA translation units
// compile everything they define for their own instruction set, and an inline function
// shared with the rest of the module would let the linker keep an AVX-512 copy of it.

#pragma once

#include <cstdint>

#include "x86_kernels.h"

namespace core_cpu::quant_linear {

// Weight rows the GEMM's register block multiplies together (quant_linear_isa.h), whatever
// the ISA: threads split W at multiples of it.
constexpr int64_t kGemmRows = 6;
// Rows the GEMM finishes before it writes them out (quant_linear_isa.h's gemm): each
// token's outputs leave in runs of this many floats, 192 bytes, an odd number of cache
// lines, so 16 tokens' runs fall in 16 different L1 sets.
constexpr int64_t kGemmPanelRows = 8 * kGemmRows;

struct PackedWeight {
  const uint8_t* data;  // qweight [N, row_bytes]: 4-bit nibbles in runs of 32, or int8
  const float* scales;  // [N, groups]
  const float* mins;    // [N, groups]
  int64_t k;            // inputs per row
  int64_t group_size;   // G: a multiple of 32 (4-bit) or 16 (8-bit) dividing k
  int64_t row_bytes;    // k / 2 (4-bit) or k (8-bit)
  int bits;             // 4 or 8

  int64_t groups() const { return k / group_size; }
};

// Float32 activations x [num_tokens, k] (row-major) with their sums over each group of G
// inputs, group_sums [num_tokens, groups]: the mins' share of a dot product is then
// sum_g mins[n, g] * group_sums[t, g], one multiply per group instead of one per input.
struct Activations {
  const float* x;
  const float* group_sums;
  int64_t num_tokens;
};

// The kernels for bfloat16 activations on CPUs with a native bf16 dot product
// (AVX512_BF16's vdpbf16ps): the weights are rounded to bfloat16 as they are dequantized,
// and each product of a bf16 weight and a bf16 input is summed in float32. x and the
// dequantized rows are bfloat16 bit patterns.
struct Bf16Kernels {
  // IsaKernels' pack_tokens and gemm for bfloat16 x, in IsaKernels' token blocks; each
  // block's step over k takes two inputs (a pair of bf16 per float32 lane). `rows` holds
  // kGemmRows * k bfloat16 values, `panel` kGemmPanelRows * num_tokens floats.
  void (*pack_tokens)(const uint16_t* x, int64_t num_tokens, int64_t k, int64_t b0,
                      int64_t b1, uint16_t* packed);
  void (*gemm)(const PackedWeight& w, int64_t n0, int64_t n1, const uint16_t* packed_x,
               int64_t num_tokens, float* out, int64_t ldo, uint16_t* rows, float* panel);
  // The strip GEMM: out[t * ldo + n] rounded to bfloat16 (bits), for n in [n0, n1) and
  // every token of x [num_tokens, k] (bf16 bits, row-major, read where it lies). W is
  // dequantized kStripRows rows at a time into `strip` (kStripRows * k bf16 values), each
  // step over k holding the strip's rows' pairs of inputs side by side, so the register
  // block loads rows as vectors and broadcasts each token's pair of inputs.
  void (*strip_gemm)(const PackedWeight& w, int64_t n0, int64_t n1, const uint16_t* x,
                     int64_t num_tokens, uint16_t* out, int64_t ldo, uint16_t* strip);
  // W's rows [n0, n1) (n0 a multiple of kStripRows) dequantized once into `strips`, the
  // strip GEMM's layout: the strip of rows [s0, s0 + kStripRows) at strips + s0 * k, its
  // rows past N (zeros) included. Whole, it holds N rounded up to kStripRows times k values.
  void (*pack_strips)(const PackedWeight& w, int64_t n0, int64_t n1, uint16_t* strips);
  // strip_gemm on W already in pack_strips' layout, for any rows [n0, n1).
  void (*packed_strip_gemm)(const uint16_t* strips, int64_t k, int64_t n0, int64_t n1,
                            const uint16_t* x, int64_t num_tokens, uint16_t* out, int64_t ldo);
  // W's rows [n0, n1) (n0 a multiple of kInterleavedRows) in the interleaved layout below,
  // their blocks from `blocks` on, which the caller zeroed: rows past N (W's last block)
  // keep those zeros (zero scales and mins).
  void (*pack_interleaved)(const PackedWeight& w, int64_t n0, int64_t n1, uint8_t* blocks);
  // The interleaved GEMV: out[t * ldo + n] rounded to bfloat16 (bits), for n in [n0, n1)
  // (n0 a multiple of kInterleavedRows) and each of num_tokens tokens of x (bf16 bits,
  // [num_tokens, k]) with their float32 sums per group, group_sums [num_tokens, groups].
  void (*interleaved_gemv)(const uint8_t* blocks, int64_t k, int64_t group_size, int bits,
                           int64_t n0, int64_t n1, const uint16_t* x, const float* group_sums,
                           int64_t num_tokens, uint16_t* out, int64_t ldo);
};

// The interleaved layout of W, for decode rows on the bf16 dot products
// (quant_linear_interleaved.h). One 16-byte unit of the packed layout holds inputs of one
// row, so a GEMV over it widens and converts each row's values on their own and pays a
// group's scale per row; here a vector holds one input pair of 16 rows, so each step
// widens 16 rows at once and a group's scales are one vector. W's rows in blocks of
// kInterleavedRows; block b's group g takes interleaved_group_bytes(G, bits) bytes at
// (b * groups + g) * interleaved_group_bytes(G, bits):
//   steps of 32 bytes, byte 2j + p of step s (row j of the block, p < 2) holding
//     4-bit (G / 4 steps): q[j, g * G + 4s + p] in its low nibble and q[j, g * G + 4s + 2 +
//       p] in its high one;
//     8-bit (G / 2 steps): q[j, g * G + 2s + p] + 128;
//   the block's 16 scales[j, g] (float32);
//   the block's 16 mins: 4-bit mins[j, g] + 8 * scales[j, g] (float32, rounded once: the
//     kernel multiplies q - 8, exact in bfloat16, and x's sums carry the rest); 8-bit
//     mins[j, g] (the kernel multiplies q exactly, as 16 (u / 16 - 8) + u % 16, u = q + 128).
// It holds as many bytes as the packed weight (N rounded up to whole blocks).
constexpr int64_t kInterleavedRows = 16;
constexpr int64_t interleaved_group_bytes(int64_t group_size, int bits) {
  return group_size * bits * kInterleavedRows / 8 +
         2 * kInterleavedRows * static_cast<int64_t>(sizeof(float));
}

// The most weight rows gemv_unpacked holds unpacked at once.
constexpr int64_t kUnpackedRowsMax = 3;

// Weight rows one strip of the strip GEMM holds (4 vectors of 16), and the rows a thread's
// share of W is cut at (one vector).
constexpr int64_t kStripRows = 64;
constexpr int64_t kStripUnitRows = 16;

// Tokens per block of the int8 GEMM's packed x (quant_linear_vnni.h), and the inputs that
// share one int8 scale (a run: W's groups must be whole runs for the int8 kernels).
constexpr int64_t kInt8Block = 32;
constexpr int64_t kInt8Run = 32;

// The kernels for bfloat16 activations on CPUs with an int8 dot product (AVX512_VNNI's
// vpdpbusd), for weights whose groups are whole runs of 32 inputs: x is quantized to int8
// in runs of 32 inputs, per token,
//   dx = max |x[run]| / 127,  xq[i] = round_to_nearest_even(x[i] * (127 / max |x[run]|))
// (all zeros where the run is), so each x errs by at most dx / 2; the products of xq and
// the weights' q (4-bit ones counted from 8) are exact int32 sums, scaled in float32.
struct Int8Kernels {
  // x (bf16 bits) [T, k] for the gemm, token blocks [b0, b1) of kInt8Block tokens (the last
  // padded with zeros): packed [block][k / 4][kInt8Block][4] int8 (each step of 4 inputs
  // holds the block's tokens' 4 values in turn), and per run of 32 inputs dx, x's exact
  // float32 sum and the sum of xq, each [block][k / 32][kInt8Block].
  void (*quantize_tokens)(const uint16_t* x, int64_t num_tokens, int64_t k, int64_t b0,
                          int64_t b1, int8_t* packed, float* scales, float* sums,
                          int32_t* q_sums);
  // out[t * ldo + n] for n in [n0, n1) and every token, from quantize_tokens' x; `rows`
  // holds kGemmRows * k bytes, `panel` kGemmPanelRows * num_tokens floats.
  void (*gemm)(const PackedWeight& w, int64_t n0, int64_t n1, const int8_t* packed_x,
               const float* x_scales, const float* x_sums, const int32_t* x_q_sums,
               int64_t num_tokens, float* out, int64_t ldo, uint8_t* rows, float* panel);
};

// The int8 GEMV's x (decode rows, any dtype; W's groups whole runs of 32): each token's
// float32 values quantized per run of 32 inputs as Int8Kernels' are,
//   dx = max |x[run]| / 127,  xq[i] = round_to_nearest_even(x[i] * (127 / max |x[run]|)),
// so that a run's products with W's q are one exact integer dot product, and
//   out[t, n] = sum_g scales[n, g] * sum_{run in g} dx[t, run] * dot(q[n, run], xq[t, run])
//             + sum_g mins[n, g] * group_sums[t, g] + sum_g scales[n, g] * shares[t, g],
// shares the part of W's centre c (8 for 4-bit values, 0 for 8-bit ones) that the dot
// products of q rather than q - c leave out: c * sum_{run in g} (run_sum - dx * sum(xq)).
// That is Int8Kernels' product, summed in another order: x's rounding errs along
// scale * (q - c), and the centre's share multiplies x's exact sums.
struct Int8Activations {
  const int8_t* xq;          // [num_tokens, k]
  const float* dx;           // [num_tokens, k / kInt8Run]
  const float* group_sums;   // [num_tokens, groups]: x's exact sums
  const float* shares;       // [num_tokens, groups]: null for 8-bit values (c = 0)
  int64_t num_tokens;
};

// Int8Activations' GEMV: out[t * ldo + n] for n in [n0, n1) and every token.
using Int8GemvFn = void (*)(const PackedWeight& w, int64_t n0, int64_t n1,
                            const Int8Activations& a, float* out, int64_t ldo);

// The AVX2 int8 GEMV (linear_avx2.cpp): vpmaddubsw on 4-bit values, vpmaddwd on 8-bit
// ones. The wider x86 tables take it too: every CPU with AVX-512 has AVX2.
#ifdef CORE_X86_KERNELS
void int8_gemv_avx2(const PackedWeight& w, int64_t n0, int64_t n1, const Int8Activations& a,
                    float* out, int64_t ldo);
#endif

struct IsaKernels {
  const char* name;
  // out[t * ldo + n] = sum_k W[n, k] x[t, k] in float32, for n in [n0, n1) and every token;
  // the weight rows are read once, whatever the token count.
  void (*gemv)(const PackedWeight& w, int64_t n0, int64_t n1, const Activations& a,
               float* out, int64_t ldo);
  // gemv with each output's share of the mins added in one fixed order (quant_linear_isa.h's
  // mins_share), for batch-invariant mode.
  void (*gemv_invariant)(const PackedWeight& w, int64_t n0, int64_t n1, const Activations& a,
                         float* out, int64_t ldo);
  // gemv_invariant's outputs, to the bit, for many tokens: W's rows unpacked once each into
  // `q_rows` (kUnpackedRowsMax * k floats) for every token (quant_linear_isa.h);
  // `sums_by_group` holds a's group sums transposed, [groups, num_tokens].
  void (*gemv_unpacked)(const PackedWeight& w, int64_t n0, int64_t n1, const Activations& a,
                        const float* sums_by_group, float* out, int64_t ldo, float* q_rows);
  // out[(n - n0) * k + i] = W[n, i] in float32, for n in [n0, n1).
  void (*dequantize)(const PackedWeight& w, int64_t n0, int64_t n1, float* out);
  // The GEMM's tokens per block, and x [T, k] repacked for it into
  // ceil(T / token_block) * token_block * k floats, token blocks [b0, b1) a call.
  int64_t token_block;
  void (*pack_tokens)(const float* x, int64_t num_tokens, int64_t k, int64_t b0, int64_t b1,
                      float* packed);
  // out[t * ldo + n] = sum_k W[n, k] x[t, k] in float32, for n in [n0, n1) and every token
  // from the packed x; `rows` holds kGemmRows * k floats, `panel` kGemmPanelRows *
  // num_tokens.
  void (*gemm)(const PackedWeight& w, int64_t n0, int64_t n1, const float* packed_x,
               int64_t num_tokens, float* out, int64_t ldo, float* rows, float* panel);
  // The bf16 dot-product kernels, or null where this ISA has none.
  const Bf16Kernels* bf16;
  // The int8 dot-product kernels, or null where this ISA has none.
  const Int8Kernels* int8;
  // The int8 GEMV, or null where this ISA has none.
  Int8GemvFn int8_gemv;
};

extern const IsaKernels kScalarKernels;
#ifdef CORE_X86_KERNELS
extern const IsaKernels kAvx2Kernels;
extern const IsaKernels kAvx512Kernels;
extern const IsaKernels kAvx512Bf16Kernels;
#endif

}  // namespace core_cpu::quant_linear
