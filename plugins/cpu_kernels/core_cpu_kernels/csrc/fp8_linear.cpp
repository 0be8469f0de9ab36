// core::fp8_linear on the CPU: x [T, K] times W [N, K] held in float8_e4m3fn with a float32
// scale per row and block of inputs (layout: core/ops/fp8_linear.py), each W the float32
// product of its FP8 value and its scale, float32 products and sums, rounded once to x's
// dtype. W stays at one byte per weight: a call converts a few rows at a time, never more.
//
// Decode rows (T <= kGemvMaxTokens) take the GEMV: each weight row's bytes are read once,
// converted and scaled in registers and multiplied with every token. More rows take
// quant_linear's blocked GEMM: each thread converts kGemmRows rows at a time into L1 and
// multiplies them with every token in register blocks, so a weight is converted once per
// call instead of once per pass of four tokens. Whether a layer takes this kernel at all,
// or a copy of W dequantized once, is the Python side's choice by timing (candidates.py).

#include <torch/types.h>
#include <ATen/Parallel.h>

#include <cstdint>
#include <string>
#include <vector>

#include "blocked_gemm.h"
#include "dtype_dispatch.h"
#include "float_rows.h"
#include "fp8_linear.h"
#include "isa_registry.h"
#include "kernels.h"

namespace {

namespace fl = core_cpu::fp8_linear;

// Up to this many tokens (one pass) the GEMV beats the blocked GEMM; past it the GEMV
// converts W once per pass of four tokens. AMD EPYC (Zen 3, AVX2), 2 threads, float32 x,
// GEMV vs GEMM in us at 4 / 5 tokens, W [N, K]: 576 x 576 64 vs 75 / 96 vs 75, 1536 x 576
// 166 vs 238 / 214 vs 250, 576 x 1536 129 vs 194 / 208 vs 196, 49152 x 576 4459 vs 7932 /
// 7516 vs 7918; at 8 tokens the GEMM won on every shape.
constexpr int64_t kGemvMaxTokens = 4;
constexpr int64_t kGemvRowsPerBlock = 4;  // tasks split W at the GEMV's 4-row blocks

// The kernels this CPU runs.
const core_cpu::IsaRegistry<fl::IsaKernels>& isas() {
  static const core_cpu::IsaRegistry<fl::IsaKernels> registry(
      "fp8_linear", CORE_ISA_TABLES(fl), /*avx2_needs_f16c=*/false);
  return registry;
}

fl::Fp8Weight fp8_weight(const torch::Tensor& weight, const torch::Tensor& scales,
                         int64_t block_k) {
  TORCH_CHECK(weight.device().is_cpu() && weight.dim() == 2 && weight.is_contiguous() &&
                  weight.scalar_type() == torch::kFloat8_e4m3fn,
              "fp8_linear: weight must be a contiguous 2-D float8_e4m3fn CPU tensor");
  TORCH_CHECK(block_k > 0, "fp8_linear: block_k must be positive, got ", block_k);
  const int64_t n = weight.size(0), k = weight.size(1), blocks = (k + block_k - 1) / block_k;
  TORCH_CHECK(scales.device().is_cpu() && scales.scalar_type() == torch::kFloat &&
                  scales.is_contiguous() && scales.dim() == 2 && scales.size(0) == n &&
                  scales.size(1) == blocks,
              "fp8_linear: scales must be a contiguous float32 CPU tensor [", n, ", ", blocks,
              "] (one per row and block of ", block_k, " inputs)");
  return {static_cast<const uint8_t*>(weight.data_ptr()), scales.data_ptr<float>(), k, block_k,
          blocks};
}

template <typename T>
void multiply(const fl::IsaKernels& isa, const fl::Fp8Weight& w, const torch::Tensor& x,
              torch::Tensor& out, bool gemv_only) {
  const int64_t num_tokens = x.size(0), n = out.size(1);
  std::vector<float> x_buffer, out_buffer;
  const float* xf = core_cpu::float_rows<T>(x, x_buffer);
  float* out_f = core_cpu::float_output<T>(out, out_buffer);
  if (num_tokens <= kGemvMaxTokens || gemv_only) {
    const int64_t num_blocks = (n + kGemvRowsPerBlock - 1) / kGemvRowsPerBlock;
    const int64_t grain = core_cpu::kMacsPerTask / (kGemvRowsPerBlock * w.k * num_tokens) + 1;
    at::parallel_for(0, num_blocks, grain, [&](int64_t begin, int64_t end) {
      const int64_t n1 = end * kGemvRowsPerBlock;
      isa.gemv(w, begin * kGemvRowsPerBlock, n1 < n ? n1 : n, xf, num_tokens, out_f, n);
    });
  } else {
    core_cpu::multiply_elements(w, xf, num_tokens, isa.token_block, isa.pack_tokens, isa.gemm,
                                out_f, n);
  }
  core_cpu::store_float_output<T>(out_f, out);
}

}  // namespace

torch::Tensor fp8_linear(const torch::Tensor& x, const torch::Tensor& weight,
                         const torch::Tensor& scales, int64_t block_k, const std::string& isa,
                         bool batch_invariant) {
  const fl::IsaKernels& kernels = isas().choose(isa);
  const fl::Fp8Weight w = fp8_weight(weight, scales, block_k);
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.is_contiguous() && x.size(1) == w.k,
              "fp8_linear: x must be a contiguous CPU tensor [T, ", w.k, "]");
  torch::Tensor out = torch::empty({x.size(0), weight.size(0)}, x.options());
  if (out.numel() == 0) return out;
  if (w.k == 0) return out.zero_();
  core_cpu::dispatch_dtype(x, "fp8_linear", [&](auto zero) {
    // Batch-invariant: the GEMV for every row count (its sums for a row read that row alone).
    multiply<decltype(zero)>(kernels, w, x, out, batch_invariant);
  });
  return out;
}

std::vector<std::string> fp8_linear_isas() { return isas().names(); }
