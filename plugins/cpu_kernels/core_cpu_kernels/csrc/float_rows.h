// Float32 views of 16-bit activations and outputs, for kernels that compute in float32.

#pragma once

#include <torch/types.h>

#include <cstdint>
#include <type_traits>
#include <vector>

#include "cpu_utils.h"
#include "dtype_dispatch.h"

namespace core_cpu {

template <typename T>
CORE_MULTIVERSION void to_floats(const T* x, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = to_float(x[i]);
}

template <typename T>
CORE_MULTIVERSION void from_floats(const float* x, T* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = from_float<T>(x[i]);
}

// x (contiguous, dtype T) as float32: x's own data, or its conversion held in `buffer`.
template <typename T>
const float* float_rows(const torch::Tensor& x, std::vector<float>& buffer) {
  if constexpr (std::is_same_v<T, float>) {
    return x.data_ptr<float>();
  } else {
    buffer.resize(x.numel());
    to_floats(x.data_ptr<T>(), buffer.data(), x.numel());
    return buffer.data();
  }
}

// Where a kernel writes its float32 results for `out` (dtype T): out itself, or `buffer`,
// which store_float_output then rounds into out.
template <typename T>
float* float_output(torch::Tensor& out, std::vector<float>& buffer) {
  if constexpr (std::is_same_v<T, float>) {
    return out.data_ptr<float>();
  } else {
    buffer.resize(out.numel());
    return buffer.data();
  }
}

template <typename T>
void store_float_output(const float* results, torch::Tensor& out) {
  if constexpr (!std::is_same_v<T, float>) from_floats(results, out.data_ptr<T>(), out.numel());
}

}  // namespace core_cpu
