// RMSNorm over rows, with the rounding of core's reference (Hugging Face's LlamaRMSNorm):
// the mean of squares and the scaling in float32, the normalized row rounded to the
// input dtype, then multiplied by the weight and rounded again. One pass reads a row for
// its statistics and a second (from cache) writes it, where the reference makes six
// passes and three temporaries.

#include <torch/types.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <tuple>
#include <vector>

#include "cpu_utils.h"
#include "dtype_dispatch.h"
#include "kernels.h"

namespace {

using core_cpu::from_float;
using core_cpu::to_float;

// Where each row starts, in elements: rows are the last dimension (stride 1) of a tensor
// whose leading dimensions may have any strides (a head-split view of a fused QKV).
class RowOffsets {
 public:
  explicit RowOffsets(const torch::Tensor& t)
      : sizes_(t.sizes().begin(), t.sizes().end() - 1),
        strides_(t.strides().begin(), t.strides().end() - 1) {}

  int64_t operator()(int64_t row) const {
    int64_t offset = 0;
    for (int64_t d = static_cast<int64_t>(sizes_.size()) - 1; d >= 0; --d) {
      offset += row % sizes_[d] * strides_[d];
      row /= sizes_[d];
    }
    return offset;
  }

 private:
  std::vector<int64_t> sizes_, strides_;
};

template <typename T>
CORE_INLINE float sum_of_squares(const T* x, int64_t n) {
  float sum_sq = 0.f;
#pragma omp simd reduction(+ : sum_sq)
  for (int64_t i = 0; i < n; ++i) sum_sq += to_float(x[i]) * to_float(x[i]);
  return sum_sq;
}

// out = T(weight * T(x * inv_rms)), inv_rms from the row's float32 sum of squares.
template <typename T>
CORE_INLINE void scale_row(const T* x, const T* weight, T* out, int64_t n, float eps) {
  const float inv_rms = 1.f / std::sqrt(sum_of_squares(x, n) / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) {
    const float normed = to_float(from_float<T>(to_float(x[i]) * inv_rms));
    out[i] = from_float<T>(to_float(weight[i]) * normed);
  }
}

template <typename T>
CORE_MULTIVERSION void norm_row(const T* x, const T* weight, T* out, int64_t n, float eps) {
  scale_row(x, weight, out, n, eps);
}

// new_residual = T(x + residual), then out = its norm: the sum is rounded to T before its
// statistics are taken, as the unfused add followed by the norm does. Adding in a loop of
// its own and normalizing the stored sum (still in L1) measured faster in bfloat16 than
// one loop that adds, rounds, stores and reduces.
template <typename T>
CORE_MULTIVERSION void add_norm_row(const T* x, const T* residual, const T* weight, T* out,
                                    T* new_residual, int64_t n, float eps) {
  for (int64_t i = 0; i < n; ++i) {
    new_residual[i] = from_float<T>(to_float(x[i]) + to_float(residual[i]));
  }
  scale_row(new_residual, weight, out, n, eps);
}

// Calls fn(first_row, end_row) over x's rows in parallel, each task at least
// GRAIN_SIZE elements so that a single decode row never pays for a thread wake-up.
template <typename Fn>
void for_rows(const torch::Tensor& x, Fn&& fn) {
  const int64_t n = x.size(-1);
  if (x.numel() == 0) return;
  at::parallel_for(0, x.numel() / n, at::internal::GRAIN_SIZE / n + 1, fn);
}

void check_rows(const torch::Tensor& t, const char* name, const torch::Tensor& x) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor");
  TORCH_CHECK(t.scalar_type() == x.scalar_type(), name, " dtype must match x");
  TORCH_CHECK(t.dim() >= 1 && (t.size(-1) <= 1 || t.stride(-1) == 1), name,
              " must have a contiguous last dimension");
}

void check_weight(const torch::Tensor& weight, const torch::Tensor& x) {
  check_rows(weight, "weight", x);
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(-1),
              "weight must be [hidden] with hidden = x.size(-1)");
}

template <typename T>
void norm(const torch::Tensor& x, const torch::Tensor& weight, torch::Tensor& out,
          float eps) {
  const RowOffsets rows(x);
  const int64_t n = x.size(-1);
  const T* x_data = x.data_ptr<T>();
  const T* w = weight.data_ptr<T>();
  T* out_data = out.data_ptr<T>();
  for_rows(x, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) norm_row(x_data + rows(r), w, out_data + r * n, n, eps);
  });
}

template <typename T>
void add_norm(const torch::Tensor& x, const torch::Tensor& residual,
              const torch::Tensor& weight, torch::Tensor& out, torch::Tensor& new_residual,
              float eps) {
  const RowOffsets x_rows(x), residual_rows(residual);
  const int64_t n = x.size(-1);
  const T* x_data = x.data_ptr<T>();
  const T* r_data = residual.data_ptr<T>();
  const T* w = weight.data_ptr<T>();
  T* out_data = out.data_ptr<T>();
  T* sum_data = new_residual.data_ptr<T>();
  for_rows(x, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      add_norm_row(x_data + x_rows(r), r_data + residual_rows(r), w, out_data + r * n,
                   sum_data + r * n, n, eps);
    }
  });
}

}  // namespace

// weight * (x / sqrt(mean(x^2) + eps)) over the last dimension, rows in parallel.
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  check_rows(x, "x", x);
  check_weight(weight, x);
  torch::Tensor out = torch::empty(x.sizes(), x.options());
  core_cpu::dispatch_dtype(x, "rms_norm", [&](auto zero) {
    norm<decltype(zero)>(x, weight, out, static_cast<float>(eps));
  });
  return out;
}

// (rms_norm(x + residual), x + residual) in one pass over each row.
std::tuple<torch::Tensor, torch::Tensor> fused_add_rms_norm(const torch::Tensor& x,
                                                            const torch::Tensor& residual,
                                                            const torch::Tensor& weight,
                                                            double eps) {
  check_rows(x, "x", x);
  check_rows(residual, "residual", x);
  TORCH_CHECK(residual.sizes() == x.sizes(), "residual must be shaped like x");
  check_weight(weight, x);
  torch::Tensor out = torch::empty(x.sizes(), x.options());
  torch::Tensor new_residual = torch::empty(x.sizes(), x.options());
  core_cpu::dispatch_dtype(x, "rms_norm", [&](auto zero) {
    add_norm<decltype(zero)>(x, residual, weight, out, new_residual, static_cast<float>(eps));
  });
  return {out, new_residual};
}
