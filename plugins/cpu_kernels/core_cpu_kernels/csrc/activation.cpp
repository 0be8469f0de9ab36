// core::silu_and_mul: silu(gate) * up over rows [gate | up], in one pass.
//
// torch's composite (chunk, silu, mul) reads x twice, writes a temporary silu(gate) and
// reads it back, and pays two op dispatches; here each row is read once and each output
// written once, computed in float32 and rounded once to the input dtype.

#include <torch/types.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>

#include "cpu_utils.h"
#include "dtype_dispatch.h"
#include "fast_exp.h"
#include "kernels.h"

namespace {

using core_cpu::exp_nonpositive;
using core_cpu::from_float;
using core_cpu::to_float;

// silu(g) = g * sigmoid(g), the sigmoid from e = exp(-|g|) <= 1, which never overflows:
// 1 / (1 + e) for g >= 0, e / (1 + e) for g < 0.
CORE_INLINE float silu(float g) {
  const float e = exp_nonpositive(-std::fabs(g));
  return g * (g >= 0.f ? 1.f : e) / (1.f + e);
}

template <typename T>
CORE_MULTIVERSION void silu_and_mul_row(const T* gate, const T* up, T* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = from_float<T>(silu(to_float(gate[i])) * to_float(up[i]));
}

template <typename T>
void silu_and_mul_rows(const torch::Tensor& x, torch::Tensor& out) {
  const int64_t n = out.size(1), row_stride = x.stride(0);
  const T* x_data = x.data_ptr<T>();
  T* out_data = out.data_ptr<T>();
  // Tasks of at least GRAIN_SIZE outputs, so a decode row never pays for a thread wake-up.
  at::parallel_for(0, x.size(0), at::internal::GRAIN_SIZE / n + 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* row = x_data + r * row_stride;
      silu_and_mul_row(row, row + n, out_data + r * n, n);
    }
  });
}

}  // namespace

// x [T, 2I] (last dimension contiguous, rows may be strided) -> [T, I], contiguous.
torch::Tensor silu_and_mul(const torch::Tensor& x) {
  TORCH_CHECK(x.device().is_cpu(), "x must be a CPU tensor");
  TORCH_CHECK(x.dim() == 2 && x.size(1) % 2 == 0, "x must be [T, 2 * I]");
  TORCH_CHECK(x.size(1) == 0 || x.stride(1) == 1, "x must have a contiguous last dimension");
  torch::Tensor out = torch::empty({x.size(0), x.size(1) / 2}, x.options());
  if (out.numel() == 0) return out;
  core_cpu::dispatch_dtype(x, "silu_and_mul", [&](auto zero) {
    silu_and_mul_rows<decltype(zero)>(x, out);
  });
  return out;
}
