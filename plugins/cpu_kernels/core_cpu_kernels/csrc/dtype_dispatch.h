// Calling a kernel template for the activation dtype of a tensor.

#pragma once

#include <torch/types.h>

namespace core_cpu {

// Calls fn(T{}) for x's dtype T (float32, bfloat16 or float16); any other dtype is an
// error naming `kernel`.
template <typename Fn>
void dispatch_dtype(const torch::Tensor& x, const char* kernel, Fn&& fn) {
  switch (x.scalar_type()) {
    case torch::kFloat:
      return fn(float{});
    case torch::kBFloat16:
      return fn(c10::BFloat16{});
    case torch::kHalf:
      return fn(c10::Half{});
    default:
      TORCH_CHECK(false, kernel, ": unsupported dtype ", x.scalar_type());
  }
}

}  // namespace core_cpu
