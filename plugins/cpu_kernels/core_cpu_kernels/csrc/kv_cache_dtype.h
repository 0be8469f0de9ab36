// What a paged KV cache holds for the attention kernels (paged_attention.cpp,
// paged_prefill.cpp): K/V in the query's dtype, or in FP8 (--kv-cache-dtype fp8_e4m3 /
// fp8_e5m2) divided by the layer's k_scale / v_scale (core.attention.kv_cache_dtype).
//
// The kernels convert an FP8 cache's bytes to float32 as they read them (fp8.h) and apply
// the scales outside their loops: they factor out of the sums, scale * q . (k * k_scale) =
// (scale * k_scale) * q . k and sum_i p_i (v_i * v_scale) = v_scale * sum_i p_i v_i, so the
// sums are the float path's on the stored values.

#pragma once

#include <torch/types.h>

#include "fp8.h"

namespace core_cpu {

// Calls fn(C{}) with C the element type of `kv_cache` read with a query of dtype T: T, or
// E4m3 / E5m2 for a float8_e4m3fn / float8_e5m2 cache. The scales must be positive, and 1
// for a cache in the query's dtype. `kernel` names the caller in errors.
template <typename T, typename Fn>
void dispatch_kv_cache(const torch::Tensor& kv_cache, const torch::Tensor& query,
                       double k_scale, double v_scale, const char* kernel, Fn&& fn) {
  TORCH_CHECK(k_scale > 0 && v_scale > 0, kernel, ": k_scale and v_scale must be positive");
  switch (kv_cache.scalar_type()) {
    case torch::kFloat8_e4m3fn:
      return fn(E4m3{});
    case torch::kFloat8_e5m2:
      return fn(E5m2{});
    default:
      TORCH_CHECK(kv_cache.scalar_type() == query.scalar_type(), kernel,
                  ": kv_cache dtype must match query (or be float8_e4m3fn / float8_e5m2)");
      TORCH_CHECK(k_scale == 1 && v_scale == 1, kernel,
                  ": k_scale and v_scale scale an FP8 cache only (1 for others)");
      return fn(T{});
  }
}

}  // namespace core_cpu
