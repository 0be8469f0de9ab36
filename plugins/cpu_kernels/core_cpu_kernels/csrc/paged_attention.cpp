// Decode attention straight from the paged KV cache.
//
// The reference backend gathers every sequence's pages into a dense copy and then runs
// SDPA over it, so each decode step reads the whole context twice and writes it once.
// Here each (sequence, KV head) task walks its block table and reads every key and value
// exactly once, sharing each read between the query heads of its GQA group.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include "cpu_utils.h"
#include "fast_exp.h"
#include "head_sizes.h"
#include "kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

using core_cpu::exp_nonpositive;
using core_cpu::to_float;

struct CacheStrides {
  int64_t block, kv, token, head;  // in elements; the head dimension is contiguous
};

struct Task {
  const int64_t* blocks;  // this sequence's block table row
  int64_t seq_len;        // keys [start, seq_len) are visible
  int64_t start;
};

// Per-sequence shape: query head h uses KV head h / group (GQA groups are adjacent).
struct Heads {
  int64_t num_kv_heads, group;
};

// Calls fn(i, row) for the visible tokens i = 0..n-1 (position start + i), with `row`
// pointing at that token's K (kv = 0) or V (kv = 1) of KV head 0. Walking block by block
// keeps the division by block_size out of the per-token loop, and reading all heads of a
// token together makes the reads of a block one contiguous stream.
template <typename T, typename Fn>
CORE_INLINE void for_each_token(const T* cache, const CacheStrides& s, const Task& t,
                           int64_t block_size, int64_t kv, Fn&& fn) {
  for (int64_t pos = t.start; pos < t.seq_len;) {
    const int64_t offset = pos % block_size;
    const int64_t in_block = block_size - offset, left = t.seq_len - pos;
    const int64_t count = in_block < left ? in_block : left;
    const T* row = cache + t.blocks[pos / block_size] * s.block + kv * s.kv +
                   offset * s.token;
    for (int64_t j = 0; j < count; ++j, row += s.token) fn(pos - t.start + j, row);
    pos += count;
  }
}

// Calls fn(i, h, x) for every visible token i and query head h, with x the token's K
// (kv = 0) or V (kv = 1) row of h's KV head in float: the walk both passes share. Each
// row is converted once and used by the whole GQA group.
template <int64_t D, typename T, typename Fn>
CORE_INLINE void for_each_head_row(const T* cache, const CacheStrides& s, const Task& t,
                                   const Heads& heads, int64_t block_size, int64_t kv,
                                   Fn&& fn) {
  for_each_token(cache, s, t, block_size, kv, [&](int64_t i, const T* row)
                                                  __attribute__((always_inline)) {
    for (int64_t kv_head = 0; kv_head < heads.num_kv_heads; ++kv_head) {
      float x[D];
      const T* src = row + kv_head * s.head;
      for (int64_t d = 0; d < D; ++d) x[d] = to_float(src[d]);
      for (int64_t h = kv_head * heads.group; h < (kv_head + 1) * heads.group; ++h) fn(i, h, x);
    }
  });
}

// scores[h * n + i] = scale * q[h] . key(start + i) for every query head h; D is a
// template argument so the dot products unroll into a few vector FMAs.
template <int64_t D, typename T>
CORE_MULTIVERSION void key_scores(const float* q, const T* cache, const CacheStrides& s,
                                  const Task& t, const Heads& heads, int64_t block_size,
                                  float scale, float* scores) {
  const int64_t n = t.seq_len - t.start;
  for_each_head_row<D>(cache, s, t, heads, block_size, 0,
                       [&](int64_t i, int64_t h, const float* key)
                           __attribute__((always_inline)) {
                             const float* qh = q + h * D;
                             float dot = 0.f;
#pragma omp simd reduction(+ : dot)
                             for (int64_t d = 0; d < D; ++d) dot += qh[d] * key[d];
                             scores[h * n + i] = dot * scale;
                           });
}

// Each query head's scores become its softmax weights, in place.
CORE_MULTIVERSION void softmax_rows(float* scores, int64_t num_rows, int64_t n) {
  for (int64_t r = 0; r < num_rows; ++r) {
    float* row = scores + r * n;
    float max = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < n; ++i) max = row[i] > max ? row[i] : max;
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < n; ++i) {
      row[i] = exp_nonpositive(row[i] - max);
      sum += row[i];
    }
    const float inv = 1.f / sum;
    for (int64_t i = 0; i < n; ++i) row[i] *= inv;
  }
}

// acc[h] = sum_i weights[h * n + i] * value(start + i) for every query head h
template <int64_t D, typename T>
CORE_MULTIVERSION void weighted_values(const float* weights, const T* cache,
                                       const CacheStrides& s, const Task& t,
                                       const Heads& heads, int64_t block_size, float* acc) {
  const int64_t n = t.seq_len - t.start;
  std::fill(acc, acc + heads.num_kv_heads * heads.group * D, 0.f);
  for_each_head_row<D>(cache, s, t, heads, block_size, 1,
                       [&](int64_t i, int64_t h, const float* value)
                           __attribute__((always_inline)) {
                             const float w = weights[h * n + i];
                             float* ah = acc + h * D;
#pragma omp simd
                             for (int64_t d = 0; d < D; ++d) ah[d] += w * value[d];
                           });
}

template <int64_t D, typename T>
void decode(torch::Tensor& out, const torch::Tensor& query, const torch::Tensor& kv_cache,
            const torch::Tensor& block_table, const torch::Tensor& seq_lens, double scale,
            int64_t sliding_window) {
  const int64_t num_seqs = query.size(0), num_heads = query.size(1);
  const int64_t block_size = kv_cache.size(2);
  const Heads heads{kv_cache.size(3), num_heads / kv_cache.size(3)};
  const CacheStrides strides{kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2),
                             kv_cache.stride(3)};
  const T* cache = kv_cache.data_ptr<T>();
  const T* q_data = query.data_ptr<T>();
  T* out_data = out.data_ptr<T>();
  const int64_t* table = block_table.data_ptr<int64_t>();
  const int64_t* lens = seq_lens.data_ptr<int64_t>();
  const int64_t table_stride = block_table.stride(0);

  at::parallel_for(0, num_seqs, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> q(num_heads * D), acc(num_heads * D), scores;
    for (int64_t seq = begin; seq < end; ++seq) {
      const int64_t len = lens[seq];
      const int64_t start = sliding_window > 0 ? std::max<int64_t>(0, len - sliding_window) : 0;
      const Task task{table + seq * table_stride, len, start};
      const int64_t first = seq * num_heads * D;
      for (int64_t i = 0; i < num_heads * D; ++i) q[i] = to_float(q_data[first + i]);
      scores.resize(num_heads * (len - start));
      key_scores<D>(q.data(), cache, strides, task, heads, block_size,
                    static_cast<float>(scale), scores.data());
      softmax_rows(scores.data(), num_heads, len - start);
      weighted_values<D>(scores.data(), cache, strides, task, heads, block_size, acc.data());
      for (int64_t i = 0; i < num_heads * D; ++i) out_data[first + i] = static_cast<T>(acc[i]);
    }
  });
}

template <typename T>
void decode_any_head_size(torch::Tensor& out, const torch::Tensor& query,
                          const torch::Tensor& kv_cache, const torch::Tensor& block_table,
                          const torch::Tensor& seq_lens, double scale, int64_t sliding_window) {
  switch (query.size(2)) {
#define CORE_HEAD_SIZE_CASE(D) \
  case D:                      \
    return decode<D, T>(out, query, kv_cache, block_table, seq_lens, scale, sliding_window);
    CORE_FOR_EACH_HEAD_SIZE(CORE_HEAD_SIZE_CASE)
#undef CORE_HEAD_SIZE_CASE
    default:
      TORCH_CHECK(false, "unsupported head size ", query.size(2));
  }
}

void check_inputs(const torch::Tensor& out, const torch::Tensor& query,
                  const torch::Tensor& kv_cache, const torch::Tensor& block_table,
                  const torch::Tensor& seq_lens) {
  TORCH_CHECK(query.dim() == 3 && query.is_contiguous(), "query must be contiguous [B, Hq, D]");
  TORCH_CHECK(out.sizes() == query.sizes() && out.is_contiguous() &&
                  out.scalar_type() == query.scalar_type(),
              "out must be a contiguous tensor shaped and typed like query");
  TORCH_CHECK(kv_cache.dim() == 5 && kv_cache.size(1) == 2 && kv_cache.stride(4) == 1,
              "kv_cache must be [num_blocks, 2, block_size, Hkv, D] with D contiguous");
  TORCH_CHECK(kv_cache.scalar_type() == query.scalar_type(), "kv_cache dtype must match query");
  TORCH_CHECK(kv_cache.size(4) == query.size(2), "head sizes of query and kv_cache differ");
  TORCH_CHECK(query.size(1) % kv_cache.size(3) == 0, "query heads must be a multiple of KV heads");
  TORCH_CHECK(block_table.dim() == 2 && block_table.size(0) == query.size(0) &&
                  block_table.scalar_type() == torch::kInt64 && block_table.stride(1) == 1,
              "block_table must be int64 [B, max_blocks] with contiguous rows");
  TORCH_CHECK(seq_lens.dim() == 1 && seq_lens.size(0) == query.size(0) &&
                  seq_lens.scalar_type() == torch::kInt64 && seq_lens.is_contiguous(),
              "seq_lens must be contiguous int64 [B]");
  TORCH_CHECK(query.device().is_cpu() && kv_cache.device().is_cpu(), "CPU tensors only");
}

}  // namespace

// out[b, h] = softmax(scale * q[b, h] . K_b^T) V_b over sequence b's keys
// [max(0, seq_len - sliding_window), seq_len), K_b/V_b read through block_table[b].
void paged_decode_attention(torch::Tensor out, torch::Tensor query, torch::Tensor kv_cache,
                            torch::Tensor block_table, torch::Tensor seq_lens, double scale,
                            int64_t sliding_window) {
  check_inputs(out, query, kv_cache, block_table, seq_lens);
  switch (query.scalar_type()) {
    case torch::kFloat:
      return decode_any_head_size<float>(out, query, kv_cache, block_table, seq_lens, scale,
                                         sliding_window);
    case torch::kBFloat16:
      return decode_any_head_size<c10::BFloat16>(out, query, kv_cache, block_table, seq_lens,
                                                 scale, sliding_window);
    case torch::kHalf:
      return decode_any_head_size<c10::Half>(out, query, kv_cache, block_table, seq_lens,
                                             scale, sliding_window);
    default:
      TORCH_CHECK(false, "unsupported dtype ", query.scalar_type());
  }
}
