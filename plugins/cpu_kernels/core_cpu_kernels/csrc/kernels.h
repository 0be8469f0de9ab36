// The kernels the Python module exposes (bound in bindings.cpp).

#pragma once

// Tensors only: torch/extension.h (the C++ frontend and the Python bindings) costs ~30 s
// of parsing per file, ~10 s for this one, so only bindings.cpp includes it.
#include <torch/types.h>

#include <string>
#include <tuple>
#include <utility>
#include <vector>

// Decode attention over a paged KV cache, in the query's dtype or FP8 with its scales
// (contract in paged_attention.cpp); writes into out.
void paged_decode_attention(torch::Tensor out, torch::Tensor query, torch::Tensor kv_cache,
                            torch::Tensor block_table, torch::Tensor seq_lens, double scale,
                            int64_t sliding_window, double k_scale, double v_scale);

// Multi-head latent attention decode over a paged latent cache (contract in
// mla_decode.cpp); writes into out.
void mla_decode_attention(torch::Tensor out, torch::Tensor query, torch::Tensor kv_cache,
                          torch::Tensor block_table, torch::Tensor seq_lens, double scale);

// Causal prefill attention of one or more chunks straight from the paged KV cache, in the
// query's dtype or FP8 with its scales (contract in paged_prefill.cpp); writes into out.
void paged_prefill_attention(torch::Tensor out, torch::Tensor query, torch::Tensor kv_cache,
                             torch::Tensor block_table, std::vector<int64_t> query_start_loc,
                             std::vector<int64_t> seq_lens, double scale,
                             int64_t sliding_window, double k_scale, double v_scale);

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);

std::tuple<torch::Tensor, torch::Tensor> fused_add_rms_norm(const torch::Tensor& x,
                                                            const torch::Tensor& residual,
                                                            const torch::Tensor& weight,
                                                            double eps);

// core::silu_and_mul: x [T, 2I] (contiguous last dimension) -> silu(gate) * up [T, I].
torch::Tensor silu_and_mul(const torch::Tensor& x);

// core::fused_moe (core/ops/fused_moe.py): hidden [T, H] float32 or bfloat16 through its
// routed experts' gated MLPs (w13 [E, 2 * I, H], w2 [E, H, I], contiguous, hidden's dtype),
// weighted by topk_weights [T, K] (any float dtype) and summed; topk_ids [T, K] (any integer
// dtype) outside 0..E-1 add nothing. Returns [T, H] in hidden's dtype.
torch::Tensor fused_moe(const torch::Tensor& hidden, const torch::Tensor& w13,
                        const torch::Tensor& w2, const torch::Tensor& topk_weights,
                        const torch::Tensor& topk_ids);

// core::rotary_embedding in place on query [T, Hq, D] and key [T, Hkv, D] (strided views
// allowed, contiguous last dimension) from float32 [positions, D / 2] cos / sin tables.
void rotary_embedding(const torch::Tensor& positions, torch::Tensor query, torch::Tensor key,
                      const torch::Tensor& cos_cache, const torch::Tensor& sin_cache);

// core::quant_linear (layout: core/ops/quant_linear.py) with the kernels of vector ISA `isa`
// ("" for the widest this CPU runs); x is a contiguous [T, K] float32, bfloat16 or float16.
// With `int8_x`, an ISA with int8 kernels multiplies bf16 x's GEMMs on them (x quantized
// per run of 32: quant_linear.h's Int8Kernels); `prefill` then picks how prefill-sized x
// is multiplied: "int8", "bf16" (the strip GEMM), or "" for quant_linear_prefill's choice.
// With `batch_invariant`, every row count takes the GEMV, whose sums for a row read that
// row alone in one order (core.batch_invariant); int8_x, strips and interleaved are then
// refused.
torch::Tensor quant_linear(const torch::Tensor& x, const torch::Tensor& qweight,
                           const torch::Tensor& scales, const torch::Tensor& mins, int64_t bits,
                           const std::string& isa, bool int8_x, const std::string& prefill,
                           const c10::optional<torch::Tensor>& strips,
                           const c10::optional<torch::Tensor>& interleaved,
                           bool batch_invariant);

// W dequantized once to bfloat16 in the strip GEMM's layout (quant_linear.h's pack_strips)
// for quant_linear's `strips`: where given, bf16 x is multiplied from them by the strip
// GEMM (unless int8_x takes it), which skips the dequantization. ISA `isa` must have the
// bf16 dot products (RuntimeError otherwise).
torch::Tensor quant_linear_strips(const torch::Tensor& qweight, const torch::Tensor& scales,
                                  const torch::Tensor& mins, int64_t bits, const std::string& isa);

// W in the interleaved layout (quant_linear.h) for quant_linear's `interleaved`:
// where given, bf16 decode rows (up to the GEMV's tokens) are multiplied from it by the
// interleaved GEMV (unless int8_x takes them); other calls multiply W as it is. ISA `isa`
// must have the bf16 dot products (RuntimeError otherwise).
torch::Tensor quant_linear_interleaved(const torch::Tensor& qweight, const torch::Tensor& scales,
                                       const torch::Tensor& mins, int64_t bits,
                                       const std::string& isa);

// Whether ISA `isa` multiplies strips (has the bf16 dot products).

bool quant_linear_has_strips(const std::string& isa);

// The vector ISAs quant_linear can use on this CPU, widest (the default) first.
std::vector<std::string> quant_linear_isas();

// How ISA `isa` multiplies prefill-sized bf16 x: "int8" where it has int8 kernels and they
// measured faster on this CPU than "bf16" (the strip GEMM on the bf16 dot products).
std::string quant_linear_prefill(const std::string& isa);

// core::linear, x [T, K] @ weight [N, K]^T + bias, with the GEMV of vector ISA `isa` ("" for
// the widest this CPU runs); x contiguous and of weight's dtype (float32, bfloat16, float16).
torch::Tensor dense_linear(const torch::Tensor& x, const torch::Tensor& weight,
                           const c10::optional<torch::Tensor>& bias, const std::string& isa);

// The vector ISAs dense_linear can use on this CPU, widest (the default) first.
std::vector<std::string> dense_linear_isas();

// core::fp8_linear (layout: core/ops/fp8_linear.py), x [T, K] @ W^T with W float8_e4m3fn
// [N, K] times float32 scales [N, ceil(K / block_k)], with the kernels of vector ISA `isa`
// ("" for the widest this CPU runs); x contiguous, float32, bfloat16 or float16. With
// `batch_invariant`, every row count takes the GEMV (core.batch_invariant).
torch::Tensor fp8_linear(const torch::Tensor& x, const torch::Tensor& weight,
                         const torch::Tensor& scales, int64_t block_k, const std::string& isa,
                         bool batch_invariant);

// The vector ISAs fp8_linear can use on this CPU, widest (the default) first.
std::vector<std::string> fp8_linear_isas();

// Plain decoder layers (core.models.layer_stack's PlainLayer), gathered once, for steps of
// decode rows: a step passes only its own tensors, where a call per step with every
// layer's tensors spent ~0.2 ms converting them (SmolLM2's 630). Per layer, in order: the
// tensors of decode_layers.cpp's LayerTensor (norm weights, packed weights each with its
// bf16 strips, its interleaved layout or an empty tensor, rotary tables, a contiguous KV
// cache in the model's dtype), 4 bits (qkv, o, gate_up, down), 2 eps (input, post), an
// attention scale and a sliding window (0: none); heads is (query heads, KV heads, head
// size). `watched` are the tensors the copies were made from: `stale` says whether one was
// written in place since (the copies are then the caller's to make again).
class DecodeLayers {
 public:
  DecodeLayers(std::vector<torch::Tensor> tensors, std::vector<int64_t> bits,
               std::vector<double> eps, std::vector<double> scales,
               std::vector<int64_t> windows, std::vector<int64_t> heads, int64_t block_size,
               const std::vector<torch::Tensor>& watched);

  bool stale() const;

  // hidden [T, H] with no residual yet through every layer: the kernels above in the
  // Python layers' order, on their inputs, so (hidden, residual) are theirs to the bit.
  // key_rows [T] are the new tokens' K rows in each cache seen as [rows, KV heads, head
  // size] (V rows block_size further); isa and int8_x as quant_linear takes them.
  std::tuple<torch::Tensor, torch::Tensor> operator()(
      torch::Tensor hidden, const torch::Tensor& positions, const torch::Tensor& block_table,
      const torch::Tensor& seq_lens, const torch::Tensor& key_rows, const std::string& isa,
      bool int8_x) const;

 private:
  std::vector<torch::Tensor> tensors_;
  std::vector<int64_t> bits_;
  std::vector<double> eps_;
  std::vector<double> scales_;
  std::vector<int64_t> windows_;
  std::vector<int64_t> heads_;
  int64_t block_size_;
  std::vector<std::pair<torch::Tensor, int64_t>> watched_;
};
