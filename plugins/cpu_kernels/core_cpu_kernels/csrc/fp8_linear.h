// core::fp8_linear's weight as the compute kernels see it, and the table of kernels each
// vector ISA provides (linear_{scalar,avx2,avx512}.cpp, beside quant_linear's). The layout
// is core's (core/ops/fp8_linear.py): W[n, k] = e4m3fn(weight[n, k]) * scales[n, k / block_k],
// one float32 product. No torch header here, for the reason quant_linear.h gives.

#pragma once

#include <cstdint>

#include "x86_kernels.h"

namespace core_cpu::fp8_linear {

struct Fp8Weight {
  const uint8_t* data;  // W [N, k]: float8_e4m3fn bytes, row-major
  const float* scales;  // [N, blocks]
  int64_t k;            // inputs per row
  int64_t block_k;      // inputs per scale; a row's last block may be partial
  int64_t blocks;       // ceil(k / block_k)
};

struct IsaKernels {
  const char* name;
  // out[t * ldo + n] = sum_i W[n, i] x[t, i] in float32, for n in [n0, n1) and every token
  // t < num_tokens (x float32 [num_tokens, k], row-major): four weight rows at a time, each
  // vector of their bytes converted and scaled in registers and multiplied with a pass of
  // up to four tokens while the rows sit in L1, so W's bytes stream from memory once.
  void (*gemv)(const Fp8Weight& w, int64_t n0, int64_t n1, const float* x, int64_t num_tokens,
               float* out, int64_t ldo);
  // The blocked GEMM (quant_linear_isa.h's): x repacked by pack_tokens into blocks of
  // token_block tokens (quant_linear.h's IsaKernels says how), then W's rows converted
  // kGemmRows at a time into `rows` (kGemmRows * k floats) and multiplied with every block;
  // `panel` holds kGemmPanelRows * num_tokens floats.
  int64_t token_block;
  void (*pack_tokens)(const float* x, int64_t num_tokens, int64_t k, int64_t b0, int64_t b1,
                      float* packed);
  void (*gemm)(const Fp8Weight& w, int64_t n0, int64_t n1, const float* packed_x,
               int64_t num_tokens, float* out, int64_t ldo, float* rows, float* panel);
};

extern const IsaKernels kScalarKernels;
#ifdef CORE_X86_KERNELS
extern const IsaKernels kAvx2Kernels;
extern const IsaKernels kAvx512Kernels;
#endif

}  // namespace core_cpu::fp8_linear
