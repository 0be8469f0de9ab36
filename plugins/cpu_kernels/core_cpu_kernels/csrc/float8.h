// Eight float32 lanes as a GCC vector, for the attention kernels' CORE_MULTIVERSION loops:
// each clone of a kernel compiles its arithmetic for its own ISA (one ymm register on
// x86-64-v3), where auto-vectorization left these loops scalar (GCC jams the loop over
// tokens into the one over d, then gives up on it). The helpers always inline, so the
// baseline clone's ABI for passing a 32-byte vector (GCC's -Wpsabi note) never applies.

#pragma once

#include <cstdint>
#include <cstring>

#include "cpu_utils.h"

#pragma GCC diagnostic ignored "-Wpsabi"

namespace core_cpu {

using F8 = float __attribute__((vector_size(32)));
constexpr int64_t kLanes = 8;

CORE_INLINE F8 load8(const float* p) {
  F8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

CORE_INLINE void store8(float* p, F8 v) { std::memcpy(p, &v, sizeof v); }

CORE_INLINE float lane_sum(F8 v) {
  float sum = 0.f;
  for (int64_t l = 0; l < kLanes; ++l) sum += v[l];
  return sum;
}

}  // namespace core_cpu
