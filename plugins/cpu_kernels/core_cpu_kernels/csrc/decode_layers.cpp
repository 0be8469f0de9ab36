// A stack of plain decoder layers (core.models.layer_stack's PlainLayer) for a step of
// decode rows, in one call: the kernels the Python layers call, in their order, on the same
// inputs, so the outputs are theirs to the bit. What it saves is the Python between them,
// about eleven op calls a layer through core's dispatch (layer_stack.py measures it).

#include <torch/types.h>

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels.h"

namespace {

// A layer's tensors in DecodeLayers' list, kLayerTensors a layer. Each linear layer's
// packed weight is followed by the copy its op multiplies by: its bf16 strips
// (quant_linear_strips) or its interleaved layout (quant_linear_interleaved, uint8), else
// an empty tensor.
enum LayerTensor : int64_t {
  kInputNorm,
  kQkvWeight, kQkvScales, kQkvMins, kQkvCopy,
  kCos, kSin,
  kKvCache,
  kOWeight, kOScales, kOMins, kOCopy,
  kPostNorm,
  kGateUpWeight, kGateUpScales, kGateUpMins, kGateUpCopy,
  kDownWeight, kDownScales, kDownMins, kDownCopy,
  kLayerTensors,
};

// The per-layer numbers of DecodeLayers' lists.
constexpr int64_t kLayerBits = 4;  // qkv, o, gate_up, down

struct Step {
  const torch::Tensor& positions;
  const torch::Tensor& block_table;
  const torch::Tensor& seq_lens;
  const torch::Tensor& key_rows;
  const torch::Tensor& value_rows;
  const std::string& isa;
  bool int8_x;
};

// w: the weight's qweight, scales, mins and copy (empty: none), as the op takes them.
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor* w, int64_t bits,
                     const Step& step) {
  c10::optional<torch::Tensor> strips, interleaved;
  if (w[3].numel() > 0) (w[3].scalar_type() == torch::kByte ? interleaved : strips) = w[3];
  return quant_linear(x, w[0], w[1], w[2], bits, step.isa, step.int8_x, "", strips, interleaved,
                      /*batch_invariant=*/false);
}

// Attention of one layer: q, k (rotated in place) and v as views of qkv; the step's K/V
// written at their rows of the contiguous cache, then each row attends its sequence.
torch::Tensor attention(const torch::Tensor& qkv, const torch::Tensor* t,
                        const std::vector<int64_t>& heads, double scale, int64_t window,
                        const Step& step) {
  const int64_t tokens = qkv.size(0), num_heads = heads[0], kv_heads = heads[1], dim = heads[2];
  torch::Tensor q = qkv.narrow(1, 0, num_heads * dim).view({tokens, num_heads, dim});
  torch::Tensor k = qkv.narrow(1, num_heads * dim, kv_heads * dim).view({tokens, kv_heads, dim});
  torch::Tensor v =
      qkv.narrow(1, (num_heads + kv_heads) * dim, kv_heads * dim).view({tokens, kv_heads, dim});
  rotary_embedding(step.positions, q, k, t[kCos], t[kSin]);
  const torch::Tensor& cache = t[kKvCache];
  torch::Tensor rows = cache.view({-1, kv_heads, dim});
  rows.index_copy_(0, step.key_rows, k);
  rows.index_copy_(0, step.value_rows, v);
  torch::Tensor query = q.contiguous();
  torch::Tensor out = torch::empty_like(query);
  paged_decode_attention(out, query, cache, step.block_table, step.seq_lens, scale, window, 1.0,
                         1.0);
  return out.view({tokens, num_heads * dim});
}

}  // namespace

DecodeLayers::DecodeLayers(std::vector<torch::Tensor> tensors, std::vector<int64_t> bits,
                           std::vector<double> eps, std::vector<double> scales,
                           std::vector<int64_t> windows, std::vector<int64_t> heads,
                           int64_t block_size, const std::vector<torch::Tensor>& watched)
    : tensors_(std::move(tensors)),
      bits_(std::move(bits)),
      eps_(std::move(eps)),
      scales_(std::move(scales)),
      windows_(std::move(windows)),
      heads_(std::move(heads)),
      block_size_(block_size) {
  const int64_t layers = static_cast<int64_t>(scales_.size());
  TORCH_CHECK(layers > 0, "DecodeLayers: no layers");
  TORCH_CHECK(static_cast<int64_t>(tensors_.size()) == layers * kLayerTensors &&
                  static_cast<int64_t>(bits_.size()) == layers * kLayerBits &&
                  static_cast<int64_t>(eps_.size()) == layers * 2 &&
                  static_cast<int64_t>(windows_.size()) == layers && heads_.size() == 3,
              "DecodeLayers: ", kLayerTensors, " tensors, ", kLayerBits,
              " bits, 2 eps, a scale and a window per layer, and 3 head sizes");
  for (const torch::Tensor& tensor : watched) watched_.emplace_back(tensor, tensor._version());
}

bool DecodeLayers::stale() const {
  for (const auto& [tensor, version] : watched_)
    if (tensor._version() != version) return true;
  return false;
}

std::tuple<torch::Tensor, torch::Tensor> DecodeLayers::operator()(
    torch::Tensor hidden, const torch::Tensor& positions, const torch::Tensor& block_table,
    const torch::Tensor& seq_lens, const torch::Tensor& key_rows, const std::string& isa,
    bool int8_x) const {
  const torch::Tensor value_rows = key_rows + block_size_;
  const Step step{positions, block_table, seq_lens, key_rows, value_rows, isa, int8_x};
  torch::Tensor residual;
  for (int64_t l = 0; l < static_cast<int64_t>(scales_.size()); ++l) {
    const torch::Tensor* t = tensors_.data() + l * kLayerTensors;
    const int64_t* b = bits_.data() + l * kLayerBits;
    if (l == 0) {
      residual = hidden;
      hidden = rms_norm(hidden, t[kInputNorm], eps_[0]);
    } else {
      std::tie(hidden, residual) = fused_add_rms_norm(hidden, residual, t[kInputNorm], eps_[2 * l]);
    }
    const torch::Tensor qkv = linear(hidden, t + kQkvWeight, b[0], step);
    const torch::Tensor attended = attention(qkv, t, heads_, scales_[l], windows_[l], step);
    std::tie(hidden, residual) = fused_add_rms_norm(linear(attended, t + kOWeight, b[1], step),
                                                    residual, t[kPostNorm], eps_[2 * l + 1]);
    const torch::Tensor gate_up = linear(hidden, t + kGateUpWeight, b[2], step);
    hidden = linear(silu_and_mul(gate_up), t + kDownWeight, b[3], step);
  }
  return {hidden, residual};
}
