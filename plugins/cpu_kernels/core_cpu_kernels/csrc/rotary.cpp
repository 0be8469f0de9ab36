// core::rotary_embedding: queries and keys rotated in place, straight in the fused QKV.
//
// The composite reference gathers cos/sin, concatenates them, builds rotate_half(x) with
// a negation and a concatenation, and makes three elementwise passes and a copy back, per
// tensor. Here each token converts its cos/sin row once, and every head of q and k is
// rotated where it lies (rows strided by the QKV width), with the reference's rounding:
// cos/sin rounded to the tensors' dtype, each product and the sum rounded to it (the
// products of two half-precision values are exact in float32, so half types match the
// reference bit for bit).

#include <torch/types.h>
#include <ATen/Parallel.h>

#include <cstdint>
#include <vector>

#include "cpu_utils.h"
#include "dtype_dispatch.h"
#include "kernels.h"

// No fused multiply-adds: in float32 the reference rounds each product before the sum,
// and so does this file (an FMA would skip the rounding of one product).
#pragma GCC optimize("fp-contract=off")

namespace {

using core_cpu::from_float;
using core_cpu::to_float;

template <typename T>
CORE_INLINE float round_to(float x) {
  return to_float(from_float<T>(x));
}

// The heads of one tensor of one token: head h starts at x + h * head_stride.
template <typename T>
struct Heads {
  T* x;
  int64_t num_heads, head_stride;
};

// (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin) for each pair (i, half + i) of every
// head; cos / sin are this token's, already rounded to T.
template <typename T>
CORE_MULTIVERSION void rotate_heads(Heads<T> heads, const float* cos, const float* sin,
                                    int64_t half) {
  for (int64_t h = 0; h < heads.num_heads; ++h) {
    T* x = heads.x + h * heads.head_stride;
    for (int64_t i = 0; i < half; ++i) {
      const float x1 = to_float(x[i]), x2 = to_float(x[half + i]);
      const float first = round_to<T>(x1 * cos[i]) + round_to<T>(-x2 * sin[i]);
      const float second = round_to<T>(x2 * cos[i]) + round_to<T>(x1 * sin[i]);
      x[i] = from_float<T>(first);
      x[half + i] = from_float<T>(second);
    }
  }
}

template <typename T>
void rotate(const torch::Tensor& positions, torch::Tensor& query, torch::Tensor& key,
            const torch::Tensor& cos_cache, const torch::Tensor& sin_cache) {
  const int64_t half = cos_cache.size(1);
  const int64_t* pos = positions.data_ptr<int64_t>();
  const float* cos_data = cos_cache.data_ptr<float>();
  const float* sin_data = sin_cache.data_ptr<float>();
  T* q = query.data_ptr<T>();
  T* k = key.data_ptr<T>();
  const int64_t per_token = (query.size(1) + key.size(1)) * 2 * half;
  at::parallel_for(0, query.size(0), at::internal::GRAIN_SIZE / (per_token + 1) + 1,
                   [&](int64_t begin, int64_t end) {
    std::vector<float> cos(half), sin(half);
    for (int64_t t = begin; t < end; ++t) {
      const float* cos_row = cos_data + pos[t] * half;
      const float* sin_row = sin_data + pos[t] * half;
      for (int64_t i = 0; i < half; ++i) {
        cos[i] = round_to<T>(cos_row[i]);
        sin[i] = round_to<T>(sin_row[i]);
      }
      rotate_heads(Heads<T>{q + t * query.stride(0), query.size(1), query.stride(1)},
                   cos.data(), sin.data(), half);
      rotate_heads(Heads<T>{k + t * key.stride(0), key.size(1), key.stride(1)}, cos.data(),
                   sin.data(), half);
    }
  });
}

void check_heads(const torch::Tensor& t, const char* name, const torch::Tensor& positions,
                 const torch::Tensor& cos_cache) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor");
  TORCH_CHECK(t.dim() == 3 && t.size(0) == positions.size(0), name,
              " must be [T, heads, head_size] with T = positions.size(0)");
  TORCH_CHECK(t.size(2) == 2 * cos_cache.size(1), name,
              " head size must be twice the tables' width");
  TORCH_CHECK(t.stride(2) == 1, name, " must have a contiguous last dimension");
}

void check_positions(const torch::Tensor& positions, const torch::Tensor& cos_cache) {
  const int64_t* pos = positions.data_ptr<int64_t>();
  for (int64_t t = 0; t < positions.size(0); ++t) {
    TORCH_CHECK(pos[t] >= 0 && pos[t] < cos_cache.size(0), "position ", pos[t],
                " is outside the rotary tables (", cos_cache.size(0), " positions)");
  }
}

}  // namespace

void rotary_embedding(const torch::Tensor& positions, torch::Tensor query, torch::Tensor key,
                      const torch::Tensor& cos_cache, const torch::Tensor& sin_cache) {
  TORCH_CHECK(positions.device().is_cpu() && positions.scalar_type() == torch::kLong &&
                  positions.dim() == 1 && positions.is_contiguous(),
              "positions must be a contiguous [T] int64 CPU tensor");
  TORCH_CHECK(cos_cache.scalar_type() == torch::kFloat && cos_cache.dim() == 2 &&
                  cos_cache.is_contiguous() && cos_cache.device().is_cpu(),
              "cos_cache must be a contiguous [positions, head_size / 2] float32 CPU tensor");
  TORCH_CHECK(sin_cache.sizes() == cos_cache.sizes() && sin_cache.is_contiguous() &&
                  sin_cache.scalar_type() == torch::kFloat && sin_cache.device().is_cpu(),
              "sin_cache must be shaped and laid out like cos_cache");
  check_heads(query, "query", positions, cos_cache);
  check_heads(key, "key", positions, cos_cache);
  TORCH_CHECK(key.scalar_type() == query.scalar_type(), "key dtype must match query");
  check_positions(positions, cos_cache);
  if (positions.size(0) == 0 || cos_cache.size(1) == 0) return;
  core_cpu::dispatch_dtype(query, "rotary_embedding", [&](auto zero) {
    rotate<decltype(zero)>(positions, query, key, cos_cache, sin_cache);
  });
}
