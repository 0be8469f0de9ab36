// core::linear on the CPU for activations of few rows: x [T, K] times W [N, K] (float32,
// bfloat16 or float16, x in W's dtype), float32 products and sums, rounded once to x's
// dtype, plus an optional bias [N].
//
// Each weight row is read from memory once and multiplied with every row of x while it
// sits in L1, threads splitting W's rows: a memory-bound GEMV that torch's BLAS runs on
// one core and at under 14 GB/s on big layers (SmolLM2's 49,152-row head). Which row
// counts take this kernel is the Python side's choice (core_cpu_kernels/ops.py).

#include <torch/types.h>
#include <ATen/Parallel.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dense_linear.h"
#include "float_rows.h"
#include "isa_registry.h"
#include "kernels.h"

namespace {

namespace dl = core_cpu::dense_linear;

// The multiply-adds one task does at least: a smaller layer runs on the calling thread
// rather than pay for waking the others (quant_linear.cpp measured the same grain).
constexpr int64_t kMacsPerTask = 1 << 15;
constexpr int64_t kRowsPerBlock = 4;  // tasks split W at the GEMV's 4-row blocks

// The kernels this CPU runs; the AVX2 and AVX-512 GEMVs widen float16 weights with F16C.
const core_cpu::IsaRegistry<dl::IsaKernels>& isas() {
  static const core_cpu::IsaRegistry<dl::IsaKernels> registry(
      "dense_linear", CORE_ISA_TABLES(dl), /*avx2_needs_f16c=*/true);
  return registry;
}

dl::WeightType weight_type(const torch::Tensor& weight) {
  switch (weight.scalar_type()) {
    case torch::kFloat:
      return dl::WeightType::kFloat32;
    case torch::kBFloat16:
      return dl::WeightType::kBFloat16;
    case torch::kHalf:
      return dl::WeightType::kFloat16;
    default:
      TORCH_CHECK(false, "dense_linear: weight must be float32, bfloat16 or float16, got ",
                  weight.scalar_type());
  }
}

template <typename T>
void run(const dl::IsaKernels& isa, const torch::Tensor& x, const torch::Tensor& weight,
         const c10::optional<torch::Tensor>& bias, torch::Tensor& out) {
  const int64_t num_tokens = x.size(0), n = weight.size(0), k = weight.size(1);
  std::vector<float> x_buffer, out_buffer;
  const float* xf = core_cpu::float_rows<T>(x, x_buffer);
  float* out_f = core_cpu::float_output<T>(out, out_buffer);
  const dl::DenseWeight w{weight.data_ptr(), k, weight_type(weight)};
  const int64_t num_blocks = (n + kRowsPerBlock - 1) / kRowsPerBlock;
  const int64_t grain = kMacsPerTask / (kRowsPerBlock * k * num_tokens) + 1;
  at::parallel_for(0, num_blocks, grain, [&](int64_t begin, int64_t end) {
    const int64_t n1 = end * kRowsPerBlock;
    isa.gemv(w, begin * kRowsPerBlock, n1 < n ? n1 : n, xf, num_tokens, out_f, n);
  });
  if (bias.has_value()) {  // in float32, before the one rounding to x's dtype
    const torch::Tensor b = bias->to(torch::kFloat).contiguous();
    const float* bp = b.data_ptr<float>();
    for (int64_t t = 0; t < num_tokens; ++t)
      for (int64_t j = 0; j < n; ++j) out_f[t * n + j] += bp[j];
  }
  core_cpu::store_float_output<T>(out_f, out);
}

}  // namespace

torch::Tensor dense_linear(const torch::Tensor& x, const torch::Tensor& weight,
                           const c10::optional<torch::Tensor>& bias, const std::string& isa) {
  const dl::IsaKernels& kernels = isas().choose(isa);
  TORCH_CHECK(weight.device().is_cpu() && weight.dim() == 2 && weight.is_contiguous(),
              "dense_linear: weight must be a contiguous 2-D CPU tensor");
  const int64_t n = weight.size(0), k = weight.size(1);
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.is_contiguous() && x.size(1) == k,
              "dense_linear: x must be a contiguous CPU tensor [T, ", k, "]");
  TORCH_CHECK(x.scalar_type() == weight.scalar_type(), "dense_linear: x (", x.scalar_type(),
              ") and weight (", weight.scalar_type(), ") must have one dtype");
  if (bias.has_value()) {
    TORCH_CHECK(bias->device().is_cpu() && bias->dim() == 1 && bias->size(0) == n,
                "dense_linear: bias must be a CPU tensor [", n, "]");
  }
  torch::Tensor out = torch::empty({x.size(0), n}, x.options());
  if (out.numel() == 0) return out;
  if (k == 0) return bias.has_value() ? out.copy_(bias->expand_as(out)) : out.zero_();
  core_cpu::dispatch_dtype(x, "dense_linear",
                           [&](auto zero) { run<decltype(zero)>(kernels, x, weight, bias, out); });
  return out;
}

std::vector<std::string> dense_linear_isas() { return isas().names(); }
