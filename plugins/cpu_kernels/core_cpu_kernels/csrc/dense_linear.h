// core::linear's weight as the compute kernels see it, and the table of kernels each
// vector ISA provides (linear_{scalar,avx2,avx512}.cpp, beside quant_linear's). No torch
// header here, for the reason quant_linear.h gives.

#pragma once

#include <cstdint>

#include "x86_kernels.h"

namespace core_cpu::dense_linear {

enum class WeightType { kFloat32, kBFloat16, kFloat16 };

struct DenseWeight {
  const void* data;  // W [N, k], row-major; float, or the 16-bit patterns of bf16 / fp16
  int64_t k;
  WeightType type;
};

struct IsaKernels {
  const char* name;
  // out[t * ldo + n] = sum_i W[n, i] x[t, i] in float32, for n in [n0, n1) and every
  // token t < num_tokens (x float32 [num_tokens, k], row-major); four weight rows at a
  // time, every token pass over them while they sit in L1, so W streams from memory once.
  void (*gemv)(const DenseWeight& w, int64_t n0, int64_t n1, const float* x,
               int64_t num_tokens, float* out, int64_t ldo);
};

extern const IsaKernels kScalarKernels;
#ifdef CORE_X86_KERNELS
extern const IsaKernels kAvx2Kernels;
extern const IsaKernels kAvx512Kernels;
#endif

}  // namespace core_cpu::dense_linear
