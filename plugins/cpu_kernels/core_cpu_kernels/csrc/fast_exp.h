// exp for kernels that must vectorize (softmaxes, SiLU): std::exp does not (a libm call
// per element).

#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "cpu_utils.h"

namespace core_cpu {

// exp(x) for x <= 0 as 2^n * 2^f with a degree-6 fit of 2^f on [0, 1) (relative error
// ~1e-7, float32 rounding level). Unlike std::exp it vectorizes, and the softmax's
// exponentials were the decode kernel's largest compute cost. Below -87 (where exp is
// under 1.7e-38, nothing next to the row maximum's 1) it returns 0, so -inf, a masked
// score, weighs exactly nothing; so does a NaN.
CORE_INLINE float exp_nonpositive(float x) {
  const float t = (x > -87.f ? x : -87.f) * 1.44269504088896341f;  // no denormals
  const float n = std::floor(t), f = t - n;
  float p = 2.1877505e-4f;
  p = p * f + 1.2387822e-3f;
  p = p * f + 9.6845804e-3f;
  p = p * f + 5.5480428e-2f;
  p = p * f + 2.4023050e-1f;
  p = p * f + 6.9314694e-1f;
  p = p * f + 1.f;
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return x > -87.f ? p * scale : 0.f;
}

}  // namespace core_cpu
