// core::fused_moe on the CPU: each token through its routed experts' gated MLPs, the
// outputs weighted and summed (the contract: core/ops/fused_moe.py).
//
// The routed (token, slot) pairs are grouped by expert with a counting sort, so each
// expert's weights stream from memory once per call for all of its tokens: their rows
// gathered into one float32 block, multiplied by w13[e] and, after silu(gate) * up, by
// w2[e], with dense_linear's GEMVs (which read bf16 weights as they lie and sum in
// float32). The 4-row weight blocks of every expert are the tasks of one parallel loop, so
// a step wakes the threads once per projection, not once per expert. Each slot's output
// has a row of its own, and each token sums its slots in slot order in float32 — the
// result does not depend on the thread count — rounded once to hidden's dtype.

#include <torch/types.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "cpu_utils.h"
#include "dense_linear.h"
#include "isa_registry.h"
#include "kernels.h"

namespace {

namespace dl = core_cpu::dense_linear;

// The multiply-adds one task does at least (dense_linear.cpp's grain).
constexpr int64_t kMacsPerTask = 1 << 15;
constexpr int64_t kRowsPerBlock = 4;  // tasks split W at the GEMV's 4-row blocks
// Tokens are taken in chunks whose float32 rows (gathered x, gate_up, activation, output)
// stay under this size: a long prompt's top-8 would otherwise hold gigabytes at once.
constexpr int64_t kChunkBytes = int64_t{64} << 20;
constexpr int64_t kUnrouted = -1;  // row_of_slot of a slot whose id names no expert

const core_cpu::IsaRegistry<dl::IsaKernels>& isas() {
  static const core_cpu::IsaRegistry<dl::IsaKernels> registry(
      "fused_moe", CORE_ISA_TABLES(dl), /*avx2_needs_f16c=*/true);
  return registry;
}

// The routed slots of one chunk of tokens, grouped by expert (ascending, each expert's
// slots in slot order): rows [starts[e], starts[e + 1]) of the chunk's buffers serve
// expert e.
struct Routing {
  std::vector<int64_t> starts;       // [E + 1]
  std::vector<int64_t> experts;      // the experts with rows, ascending
  std::vector<int64_t> token_of_row;  // the token (of the whole call) each row serves
  std::vector<int64_t> row_of_slot;   // by slot of the chunk: its row, or kUnrouted
};

// Counting sort of slots [first_slot, first_slot + num_slots) of ids [T * K] by expert.
Routing group_by_expert(const int64_t* ids, int64_t first_slot, int64_t num_slots,
                        int64_t top_k, int64_t num_experts) {
  Routing r;
  r.starts.assign(num_experts + 1, 0);
  for (int64_t s = 0; s < num_slots; ++s) {
    const int64_t e = ids[first_slot + s];
    if (e >= 0 && e < num_experts) ++r.starts[e + 1];
  }
  for (int64_t e = 0; e < num_experts; ++e) {
    if (r.starts[e + 1] > 0) r.experts.push_back(e);
    r.starts[e + 1] += r.starts[e];
  }
  std::vector<int64_t> next(r.starts.begin(), r.starts.end() - 1);
  r.token_of_row.resize(r.starts[num_experts]);
  r.row_of_slot.assign(num_slots, kUnrouted);
  for (int64_t s = 0; s < num_slots; ++s) {
    const int64_t e = ids[first_slot + s];
    if (e < 0 || e >= num_experts) continue;
    const int64_t row = next[e]++;
    r.token_of_row[row] = (first_slot + s) / top_k;
    r.row_of_slot[s] = row;
  }
  return r;
}

dl::WeightType weight_type(const torch::Tensor& w) {
  return w.scalar_type() == torch::kFloat ? dl::WeightType::kFloat32
                                          : dl::WeightType::kBFloat16;
}

// out [rows, n] = x [rows, k] @ w[e]^T for each expert e's rows (w [E, n, k] contiguous),
// the 4-row weight blocks of all experts split among the threads.
void expert_gemvs(const dl::IsaKernels& isa, const Routing& r, const torch::Tensor& w,
                  const float* x, float* out) {
  const int64_t n = w.size(1), k = w.size(2);
  const char* data = static_cast<const char*>(w.data_ptr());
  const int64_t expert_bytes = n * k * static_cast<int64_t>(w.element_size());
  const int64_t blocks = (n + kRowsPerBlock - 1) / kRowsPerBlock;
  const int64_t num_experts = static_cast<int64_t>(r.experts.size());
  const int64_t rows_per_expert = r.starts.back() / num_experts + 1;
  const int64_t grain = kMacsPerTask / (kRowsPerBlock * k * rows_per_expert) + 1;
  at::parallel_for(0, blocks * num_experts, grain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end;) {
      const int64_t e = r.experts[i / blocks], b0 = i % blocks;
      const int64_t b1 = std::min(blocks, b0 + end - i);
      const int64_t row0 = r.starts[e], rows = r.starts[e + 1] - row0;
      const dl::DenseWeight we{data + e * expert_bytes, k, weight_type(w)};
      isa.gemv(we, b0 * kRowsPerBlock, std::min(n, b1 * kRowsPerBlock), x + row0 * k, rows,
               out + row0 * n, n);
      i += b1 - b0;
    }
  });
}

CORE_MULTIVERSION void add_scaled(const float* y, float weight, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] += weight * y[i];
}

// out [T, H] rows of tokens [t0, t1) += each routed slot's weight * its output row, in slot
// order.
void add_weighted(const Routing& r, const torch::Tensor& y, const float* weights,
                  int64_t t0, int64_t t1, int64_t top_k, torch::Tensor& out) {
  const int64_t size = out.size(1);
  const float* y_data = y.data_ptr<float>();
  float* out_data = out.data_ptr<float>();
  const int64_t grain = at::internal::GRAIN_SIZE / (size * top_k) + 1;
  at::parallel_for(t0, t1, grain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      for (int64_t j = 0; j < top_k; ++j) {
        const int64_t row = r.row_of_slot[(t - t0) * top_k + j];
        if (row == kUnrouted) continue;
        add_scaled(y_data + row * size, weights[t * top_k + j], out_data + t * size, size);
      }
    }
  });
}

// The call's inputs as its chunks read them.
struct MoeArgs {
  const torch::Tensor& hidden;  // [T, H]
  const torch::Tensor& w13;     // [E, 2 * I, H], contiguous
  const torch::Tensor& w2;      // [E, H, I], contiguous
  const float* weights;         // [T, K]
  const int64_t* ids;           // [T, K]
  int64_t top_k;
};

// Tokens [t0, t1) through their experts, added into out (float32 [T, H]).
void run_chunk(const dl::IsaKernels& isa, const MoeArgs& a, int64_t t0, int64_t t1,
               torch::Tensor& out) {
  const Routing r =
      group_by_expert(a.ids, t0 * a.top_k, (t1 - t0) * a.top_k, a.top_k, a.w13.size(0));
  if (r.experts.empty()) return;
  const int64_t rows = r.starts.back();
  const torch::Tensor tokens =
      torch::from_blob(const_cast<int64_t*>(r.token_of_row.data()), {rows}, torch::kLong);
  const torch::Tensor x = a.hidden.index_select(0, tokens).to(torch::kFloat).contiguous();
  torch::Tensor gate_up = torch::empty({rows, a.w13.size(1)}, x.options());  // [rows, 2 * I]
  expert_gemvs(isa, r, a.w13, x.data_ptr<float>(), gate_up.data_ptr<float>());
  const torch::Tensor act = silu_and_mul(gate_up);                      // [rows, I]
  torch::Tensor y = torch::empty({rows, a.w2.size(1)}, x.options());  // [rows, H]
  expert_gemvs(isa, r, a.w2, act.data_ptr<float>(), y.data_ptr<float>());
  add_weighted(r, y, a.weights, t0, t1, a.top_k, out);
}

// RuntimeError naming the argument whose shape does not fit the others (the reference's
// ValueErrors, core/ops/fused_moe.py's _check).
void check_shapes(const torch::Tensor& hidden, const torch::Tensor& w13, const torch::Tensor& w2,
                  const torch::Tensor& topk_weights, const torch::Tensor& topk_ids) {
  TORCH_CHECK(hidden.dim() == 2, "hidden of fused_moe must be [T, H], got ", hidden.sizes());
  const int64_t num_tokens = hidden.size(0), size = hidden.size(1);
  TORCH_CHECK(w13.dim() == 3 && w13.size(2) == size && w13.size(1) % 2 == 0,
              "w13 of fused_moe must be [E, 2 * I, ", size, "], got ", w13.sizes());
  const int64_t experts = w13.size(0), inter = w13.size(1) / 2;
  TORCH_CHECK(w2.dim() == 3 && w2.size(0) == experts && w2.size(1) == size && w2.size(2) == inter,
              "w2 of fused_moe must be [", experts, ", ", size, ", ", inter, "], got ",
              w2.sizes());
  TORCH_CHECK(topk_ids.dim() == 2 && topk_ids.size(0) == num_tokens,
              "topk_ids of fused_moe must be [", num_tokens, ", K], got ", topk_ids.sizes());
  TORCH_CHECK(c10::isIntegralType(topk_ids.scalar_type(), /*includeBool=*/false),
              "topk_ids of fused_moe must be integers, got ", topk_ids.scalar_type());
  TORCH_CHECK(topk_weights.sizes() == topk_ids.sizes(), "topk_weights of fused_moe must be ",
              topk_ids.sizes(), " like topk_ids, got ", topk_weights.sizes());
}

// RuntimeError naming the argument of a dtype, device or layout the kernel does not take.
void check_types(const torch::Tensor& hidden, const torch::Tensor& w13, const torch::Tensor& w2,
                 const torch::Tensor& topk_weights, const torch::Tensor& topk_ids) {
  const std::pair<const char*, const torch::Tensor*> args[] = {
      {"hidden", &hidden}, {"w13", &w13}, {"w2", &w2},
      {"topk_weights", &topk_weights}, {"topk_ids", &topk_ids}};
  for (const auto& [name, t] : args)
    TORCH_CHECK(t->device().is_cpu(), name, " of fused_moe must be a CPU tensor");
  const auto dtype = hidden.scalar_type();
  TORCH_CHECK(dtype == torch::kFloat || dtype == torch::kBFloat16,
              "hidden of fused_moe must be float32 or bfloat16, got ", dtype);
  for (const auto& [name, w] : {std::pair{"w13", &w13}, std::pair{"w2", &w2}}) {
    TORCH_CHECK(w->scalar_type() == dtype && w->is_contiguous(), name,
                " of fused_moe must be contiguous and of hidden's dtype (", dtype, "), got ",
                w->is_contiguous() ? "" : "a strided ", w->scalar_type());
  }
  TORCH_CHECK(topk_weights.is_floating_point(),
              "topk_weights of fused_moe must be floating point, got ",
              topk_weights.scalar_type());
}

}  // namespace

torch::Tensor fused_moe(const torch::Tensor& hidden, const torch::Tensor& w13,
                        const torch::Tensor& w2, const torch::Tensor& topk_weights,
                        const torch::Tensor& topk_ids) {
  check_shapes(hidden, w13, w2, topk_weights, topk_ids);
  check_types(hidden, w13, w2, topk_weights, topk_ids);
  const int64_t num_tokens = hidden.size(0), size = hidden.size(1);
  const int64_t inter = w13.size(1) / 2, top_k = topk_ids.size(1);
  torch::Tensor out = torch::zeros({num_tokens, size}, hidden.options().dtype(torch::kFloat));
  if (out.numel() == 0 || inter == 0 || top_k == 0) return out.to(hidden.scalar_type());
  const torch::Tensor weights = topk_weights.to(torch::kFloat).contiguous();
  const torch::Tensor ids = topk_ids.to(torch::kLong).contiguous();
  const MoeArgs args{hidden, w13, w2, weights.data_ptr<float>(), ids.data_ptr<int64_t>(), top_k};
  const dl::IsaKernels& isa = isas().choose("");
  const int64_t row_bytes = (2 * size + 3 * inter) * static_cast<int64_t>(sizeof(float));
  const int64_t chunk = std::max<int64_t>(1, kChunkBytes / (top_k * row_bytes));
  for (int64_t t0 = 0; t0 < num_tokens; t0 += chunk)
    run_chunk(isa, args, t0, std::min(num_tokens, t0 + chunk), out);
  return out.to(hidden.scalar_type());
}
