// exp for kernels that must vectorize: std::exp does not (it is a libm call per element).

#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "cpu_utils.h"

namespace core_cpu {

// exp(x) for x <= 0 as 2^n * 2^f with a degree-6 fit of 2^f on [0, 1) (relative error
// ~1e-7, float32 rounding level). Below -87 it returns exp(-87) (~1.6e-38) rather than a
// denormal or zero: every caller multiplies it into something far larger.
CORE_INLINE float exp_nonpositive(float x) {
  const float t = (x > -87.f ? x : -87.f) * 1.44269504088896341f;
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
  return p * scale;
}

}  // namespace core_cpu
