// The kernels the Python module exposes (bound in bindings.cpp).

#pragma once

#include <torch/extension.h>

#include <tuple>

void paged_decode_attention(torch::Tensor out, torch::Tensor query, torch::Tensor kv_cache,
                            torch::Tensor block_table, torch::Tensor seq_lens, double scale,
                            int64_t sliding_window);

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);

std::tuple<torch::Tensor, torch::Tensor> fused_add_rms_norm(const torch::Tensor& x,
                                                            const torch::Tensor& residual,
                                                            const torch::Tensor& weight,
                                                            double eps);
