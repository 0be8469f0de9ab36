// Multi-head latent attention (MLA, DeepSeek-V2) decode straight from the paged latent
// cache.
//
// With the weights absorbed (core/attention/backends/mla_ref.py), a decode row's heads
// attend over its cached latents as one KV head: a token's latent [kv_lora_rank | rope]
// is every head's key, and its first kv_lora_rank values every head's value. The reference
// gathers each context into a dense copy, which SDPA then reads twice (keys, values). Here
// each sequence's task walks its block table once, kTile tokens at a time: a tile's latents
// are read (and widened to float32) once, scored against every head's query and summed
// into every head's output under an online softmax (a running max and sum per head, as in
// flash attention), so no scores the size of the context are kept.

#include <torch/types.h>

#include "cpu_utils.h"
#include "dtype_dispatch.h"
#include "fast_exp.h"
#include "float8.h"
#include "kernels.h"
#include "paged_rows.h"

#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

namespace {

using core_cpu::exp_nonpositive;
using core_cpu::F8;
using core_cpu::from_float;
using core_cpu::kLanes;
using core_cpu::lane_sum;
using core_cpu::load8;
using core_cpu::store8;
using core_cpu::to_float;

// Tokens scored and summed together: their scores are kTile independent FMA chains, and
// 8 of DeepSeek-V2's latents (576 float32 values each, 18 KiB) stay in L1 from the scores
// to the sums.
constexpr int64_t kTile = 8;

struct Sizes {
  int64_t heads, latent, rank;  // the value is a latent's first `rank` entries
};

// One worker's buffers, reused for each of its sequences.
struct Workspace {
  std::vector<float> q;         // [heads, latent]: the sequence's queries in float32
  std::vector<float> acc;       // [heads, rank]: each head's running weighted values
  std::vector<float> max, sum;  // [heads]: each head's running score max and weight sum
  std::vector<float> tile;      // [kTile, latent]: a 16-bit tile's latents in float32

  explicit Workspace(const Sizes& s)
      : q(s.heads * s.latent), acc(s.heads * s.rank), max(s.heads), sum(s.heads),
        tile(kTile * s.latent) {}
};

// rows[j] = the latent of the tile's token j as float32: the cache's own row, or its
// conversion in `buffer`. A short tile (count < kTile) repeats its last token, whose
// repeats then get weight 0.
template <typename T>
CORE_INLINE void tile_rows(const T* const* latents, int64_t count, int64_t latent,
                           float* buffer, const float** rows) {
  for (int64_t j = 0; j < kTile; ++j) {
    if (j >= count) {
      rows[j] = rows[count - 1];
    } else if constexpr (std::is_same_v<T, float>) {
      rows[j] = latents[j];
    } else {
      float* row = buffer + j * latent;
      for (int64_t d = 0; d < latent; ++d) row[d] = to_float(latents[j][d]);
      rows[j] = row;
    }
  }
}

// scores[j] = scale * q . rows[j] over n values, for the tile's kTile rows.
CORE_INLINE void tile_scores(const float* q, const float* const* rows, int64_t n, float scale,
                             float* scores) {
  F8 dots[kTile] = {};
  int64_t d = 0;
  for (; d + kLanes <= n; d += kLanes) {
    const F8 qd = load8(q + d);
    for (int64_t j = 0; j < kTile; ++j) dots[j] += qd * load8(rows[j] + d);
  }
  for (int64_t j = 0; j < kTile; ++j) {
    float dot = lane_sum(dots[j]);
    for (int64_t e = d; e < n; ++e) dot += q[e] * rows[j][e];
    scores[j] = dot * scale;
  }
}

// Folds a tile's first `count` scores into one head's running max and sum, turning them
// into their weights exp(score - max) (the repeats after them into 0); returns the factor
// by which the head's earlier sums shrink under the new max. The max starts at the lowest
// finite float, never -inf, so a head's first tile never computes -inf - -inf.
CORE_INLINE float fold_scores(float* scores, int64_t count, float& max, float& sum) {
  float tile_max = max;
  for (int64_t j = 0; j < count; ++j) tile_max = scores[j] > tile_max ? scores[j] : tile_max;
  const float correction = exp_nonpositive(max - tile_max);
  sum *= correction;
  for (int64_t j = 0; j < kTile; ++j) {
    scores[j] = j < count ? exp_nonpositive(scores[j] - tile_max) : 0.f;
    sum += scores[j];
  }
  max = tile_max;
  return correction;
}

// acc[:n] = acc[:n] * correction + sum_j weights[j] * rows[j][:n].
CORE_INLINE void fold_values(const float* weights, const float* const* rows, int64_t n,
                             float correction, float* acc) {
  int64_t d = 0;
  for (; d + kLanes <= n; d += kLanes) {
    F8 sum = load8(acc + d) * correction;
    for (int64_t j = 0; j < kTile; ++j) sum += weights[j] * load8(rows[j] + d);
    store8(acc + d, sum);
  }
  for (; d < n; ++d) {
    float sum = acc[d] * correction;
    for (int64_t j = 0; j < kTile; ++j) sum += weights[j] * rows[j][d];
    acc[d] = sum;
  }
}

// out [heads, rank] = each head's attention over the n latents, a tile at a time.
template <typename T>
CORE_MULTIVERSION void attend_sequence(const T* query, const T* const* latents, int64_t n,
                                       const Sizes& s, float scale, Workspace& ws, T* out) {
  for (int64_t i = 0; i < s.heads * s.latent; ++i) ws.q[i] = to_float(query[i]);
  for (int64_t i = 0; i < s.heads * s.rank; ++i) ws.acc[i] = 0.f;
  for (int64_t h = 0; h < s.heads; ++h) {
    ws.max[h] = std::numeric_limits<float>::lowest();
    ws.sum[h] = 0.f;
  }
  const float* rows[kTile];
  float weights[kTile];
  for (int64_t i = 0; i < n; i += kTile) {
    const int64_t count = n - i < kTile ? n - i : kTile;
    tile_rows(latents + i, count, s.latent, ws.tile.data(), rows);
    for (int64_t h = 0; h < s.heads; ++h) {
      tile_scores(ws.q.data() + h * s.latent, rows, s.latent, scale, weights);
      const float correction = fold_scores(weights, count, ws.max[h], ws.sum[h]);
      fold_values(weights, rows, s.rank, correction, ws.acc.data() + h * s.rank);
    }
  }
  for (int64_t h = 0; h < s.heads; ++h) {
    const float inv = 1.f / ws.sum[h];
    for (int64_t d = 0; d < s.rank; ++d)
      out[h * s.rank + d] = from_float<T>(ws.acc[h * s.rank + d] * inv);
  }
}

template <typename T>
void decode(torch::Tensor& out, const torch::Tensor& query, const torch::Tensor& kv_cache,
            const torch::Tensor& block_table, const torch::Tensor& seq_lens, double scale) {
  const int64_t num_seqs = query.size(0), block_size = kv_cache.size(1);
  const Sizes sizes{query.size(1), query.size(2), out.size(2)};
  // One latent per token: no K/V index and no head index.
  const core_cpu::CacheStrides strides{kv_cache.stride(0), 0, kv_cache.stride(1), 0};
  const T* cache = kv_cache.data_ptr<T>();
  const T* q_data = query.data_ptr<T>();
  T* out_data = out.data_ptr<T>();
  const int64_t* table = block_table.data_ptr<int64_t>();
  const int64_t* lens = seq_lens.data_ptr<int64_t>();
  core_cpu::for_each_task(num_seqs, [&](auto next_seq) {
    Workspace ws(sizes);
    std::vector<const T*> latents;
    for (int64_t seq = next_seq(); seq < num_seqs; seq = next_seq()) {
      const core_cpu::Task task{table + seq * block_table.stride(0), lens[seq], 0};
      core_cpu::token_rows(cache, strides, task, block_size, 0, latents);
      attend_sequence(q_data + seq * sizes.heads * sizes.latent, latents.data(), lens[seq],
                      sizes, static_cast<float>(scale), ws,
                      out_data + seq * sizes.heads * sizes.rank);
    }
  });
}

void check_inputs(const torch::Tensor& out, const torch::Tensor& query,
                  const torch::Tensor& kv_cache, const torch::Tensor& block_table,
                  const torch::Tensor& seq_lens) {
  TORCH_CHECK(query.dim() == 3 && query.is_contiguous(), "query must be contiguous [B, H, L]");
  TORCH_CHECK(out.dim() == 3 && out.size(0) == query.size(0) && out.size(1) == query.size(1) &&
                  out.size(2) <= query.size(2) && out.is_contiguous() &&
                  out.scalar_type() == query.scalar_type(),
              "out must be contiguous [B, H, R] in query's dtype, R at most the latent size L");
  TORCH_CHECK(kv_cache.dim() == 3 && kv_cache.stride(2) == 1,
              "kv_cache must be [num_blocks, block_size, L] with L contiguous");
  TORCH_CHECK(kv_cache.scalar_type() == query.scalar_type(), "kv_cache dtype must match query");
  TORCH_CHECK(kv_cache.size(2) == query.size(2), "latent sizes of query and kv_cache differ");
  core_cpu::check_block_table(block_table, seq_lens, query.size(0));
  TORCH_CHECK(query.device().is_cpu() && kv_cache.device().is_cpu(), "CPU tensors only");
}

}  // namespace

// out[b, h] = softmax(scale * q[b, h] . C_b^T) C_b[:, :R] over sequence b's latents C_b
// (positions [0, seq_len)), read through block_table[b]; R = out.size(2).
void mla_decode_attention(torch::Tensor out, torch::Tensor query, torch::Tensor kv_cache,
                          torch::Tensor block_table, torch::Tensor seq_lens, double scale) {
  check_inputs(out, query, kv_cache, block_table, seq_lens);
  core_cpu::dispatch_dtype(query, "mla_decode_attention", [&](auto zero) {
    decode<decltype(zero)>(out, query, kv_cache, block_table, seq_lens, scale);
  });
}
