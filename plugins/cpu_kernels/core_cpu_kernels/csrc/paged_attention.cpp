// Decode attention straight from the paged KV cache.
//
// The reference backend gathers every sequence's pages into a dense copy and then runs
// SDPA over it, so each decode step reads the whole context twice and writes it once.
// Here each sequence's task walks its block table once and reads every key and value from
// memory once, sharing each between the query heads of its GQA group (a value is re-read
// from cache per head, whose sums stay in registers).

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include "cpu_utils.h"
#include "fast_exp.h"
#include "head_sizes.h"
#include "isa_registry.h"
#include "kernels.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
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

// rows[i] = the K (kv = 0) or V (kv = 1) row of KV head 0 of visible token i (position
// start + i). Walking block by block keeps the division by block_size out of the
// per-token loop; the compute loops then index rows alone.
template <typename T>
void token_rows(const T* cache, const CacheStrides& s, const Task& t, int64_t block_size,
                int64_t kv, std::vector<const T*>& rows) {
  rows.clear();
  for (int64_t pos = t.start; pos < t.seq_len;) {
    const int64_t offset = pos % block_size;
    const int64_t in_block = block_size - offset, left = t.seq_len - pos;
    const int64_t count = in_block < left ? in_block : left;
    const T* row = cache + t.blocks[pos / block_size] * s.block + kv * s.kv +
                   offset * s.token;
    for (int64_t j = 0; j < count; ++j, row += s.token) rows.push_back(row);
    pos += count;
  }
}

// A row of D values as float32: the row itself, or its conversion in `buffer`.
template <int64_t D, typename T>
CORE_INLINE const float* as_floats(const T* row, float* buffer) {
  if constexpr (std::is_same_v<T, float>) {
    return row;
  } else {
    for (int64_t d = 0; d < D; ++d) buffer[d] = to_float(row[d]);
    return buffer;
  }
}

// Eight float32 lanes as a GCC vector: each clone of a kernel below compiles its
// arithmetic for its own ISA (one ymm register on x86-64-v3), where auto-vectorization
// left these loops scalar (GCC jams the loop over tokens into the one over d, then gives
// up on it). Every supported head size is a multiple of 8. The helpers always inline, so
// the baseline clone's ABI for passing a 32-byte vector (GCC's -Wpsabi note) never applies.
#pragma GCC diagnostic ignored "-Wpsabi"
using F8 = float __attribute__((vector_size(32)));
constexpr int64_t kLanes = 8;

CORE_INLINE F8 load8(const float* p) {
  F8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

CORE_INLINE float lane_sum(F8 v) {
  float sum = 0.f;
  for (int64_t l = 0; l < kLanes; ++l) sum += v[l];
  return sum;
}

// The passes over keys and values ask for the row this many tokens ahead: the rows of a
// sequence are scattered over its blocks, which the hardware's prefetchers do not follow.
// Measured (32 sequences of 150 tokens, SmolLM2's heads, cold cache, AVX2 EPYC): 4 and 8
// ahead gained 20%, 16 ahead 26%, 32 ahead 20%.
constexpr int64_t kPrefetchAhead = 16;

template <int64_t D, typename T>
CORE_INLINE void prefetch_row(const T* row) {
  const char* p = reinterpret_cast<const char*>(row);
  for (int64_t b = 0; b < D * static_cast<int64_t>(sizeof(T)); b += 64) __builtin_prefetch(p + b);
}

// Keys scored together: each query head's dot products with them are independent FMA
// chains (one chain, 8 FMAs deep for D = 64, stalls on the FMA's latency at every key).
constexpr int64_t kKeysPerPass = 4;

// scores[h * n + i] = scale * q[h] . key(start + i) for every query head h, with keys[i]
// the row of KV head 0 and head_stride the step to the next head. Each key is converted
// once and used by its whole GQA group.
template <int64_t D, typename T>
CORE_MULTIVERSION void key_scores(const float* q, const T* const* keys, int64_t n,
                                  const Heads& heads, int64_t head_stride, float scale,
                                  float* scores) {
  static_assert(D % kLanes == 0, "head sizes are whole vectors");
  float buffer[kKeysPerPass][D];
  for (int64_t kv_head = 0; kv_head < heads.num_kv_heads; ++kv_head) {
    for (int64_t i = 0; i < n; i += kKeysPerPass) {
      const int64_t count = n - i < kKeysPerPass ? n - i : kKeysPerPass;
      const float* k[kKeysPerPass];
      for (int64_t j = i + kPrefetchAhead; j < i + kPrefetchAhead + kKeysPerPass && j < n; ++j)
        prefetch_row<D>(keys[j] + kv_head * head_stride);
      for (int64_t j = 0; j < kKeysPerPass; ++j) {  // a short pass repeats its last key
        const int64_t key = j < count ? i + j : i + count - 1;
        k[j] = as_floats<D>(keys[key] + kv_head * head_stride, buffer[j]);
      }
      for (int64_t h = kv_head * heads.group; h < (kv_head + 1) * heads.group; ++h) {
        const float* qh = q + h * D;
        F8 dots[kKeysPerPass] = {};
        for (int64_t d = 0; d < D; d += kLanes) {
          const F8 qd = load8(qh + d);
          for (int64_t j = 0; j < kKeysPerPass; ++j) dots[j] += qd * load8(k[j] + d);
        }
        for (int64_t j = 0; j < count; ++j) scores[h * n + i + j] = lane_sum(dots[j]) * scale;
      }
    }
  }
}

#ifdef CORE_X86_KERNELS
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16")
#pragma GCC diagnostic push
// GCC 12's false positive in its own _mm512_reduce_add_ps (see linear_avx512.cpp).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// key_scores for a bfloat16 cache and query on CPUs with AVX512_BF16: each q . k is a
// vdpbf16ps chain over pairs of bf16 values, read as they lie in the cache (no conversion
// of the keys): the products exact in float32 and summed in float32, as key_scores sums
// them. A head's D values are chunks of 32, the last one masked where D is not a multiple.
template <int64_t D>
void key_scores_bf16(const c10::BFloat16* q, const c10::BFloat16* const* keys, int64_t n,
                     const Heads& heads, int64_t head_stride, float scale, float* scores) {
  constexpr int64_t kChunk = 32;
  constexpr int64_t kChunks = (D + kChunk - 1) / kChunk;
  constexpr __mmask32 kLastMask =
      D % kChunk == 0 ? ~__mmask32{0} : (__mmask32{1} << (D % kChunk)) - 1;
  const auto chunk = [](const c10::BFloat16* row, int64_t c) {
    const __mmask32 mask = c == kChunks - 1 ? kLastMask : ~__mmask32{0};
    return _mm512_maskz_loadu_epi16(mask, row + c * kChunk);
  };
  for (int64_t kv_head = 0; kv_head < heads.num_kv_heads; ++kv_head) {
    for (int64_t i = 0; i < n; i += kKeysPerPass) {
      const int64_t count = n - i < kKeysPerPass ? n - i : kKeysPerPass;
      for (int64_t j = i + kPrefetchAhead; j < i + kPrefetchAhead + kKeysPerPass && j < n; ++j)
        prefetch_row<D>(keys[j] + kv_head * head_stride);
      __m512i k[kKeysPerPass][kChunks];
      for (int64_t j = 0; j < kKeysPerPass; ++j) {  // a short pass repeats its last key
        const c10::BFloat16* row = keys[j < count ? i + j : i + count - 1] + kv_head * head_stride;
        for (int64_t c = 0; c < kChunks; ++c) k[j][c] = chunk(row, c);
      }
      for (int64_t h = kv_head * heads.group; h < (kv_head + 1) * heads.group; ++h) {
        __m512 dots[kKeysPerPass];
        for (int64_t j = 0; j < kKeysPerPass; ++j) dots[j] = _mm512_setzero_ps();
        for (int64_t c = 0; c < kChunks; ++c) {
          const __m512bh qc = reinterpret_cast<__m512bh>(chunk(q + h * D, c));
          for (int64_t j = 0; j < kKeysPerPass; ++j)
            dots[j] = _mm512_dpbf16_ps(dots[j], qc, reinterpret_cast<__m512bh>(k[j][c]));
        }
        for (int64_t j = 0; j < count; ++j)
          scores[h * n + i + j] = _mm512_reduce_add_ps(dots[j]) * scale;
      }
    }
  }
}
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif  // CORE_X86_KERNELS

// key_scores_bf16 where it applies (a bfloat16 cache, a CPU with AVX512_BF16): whether it
// computed the scores (from the query's own bf16 values).
template <int64_t D, typename T>
bool key_scores_bf16_dot(const T* q, const T* const* keys, int64_t n, const Heads& heads,
                         int64_t head_stride, float scale, float* scores) {
#ifdef CORE_X86_KERNELS
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    const core_cpu::CpuFeatures& cpu = core_cpu::cpu_features();
    if (cpu.avx512 && cpu.avx512_bf16) {
      key_scores_bf16<D>(q, keys, n, heads, head_stride, scale, scores);
      return true;
    }
  }
#endif
  return false;
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

// acc[h] = sum_i weights[h * n + i] * value(start + i) for every query head h. One head's
// sums stay in registers over all its values (summing into memory instead chains every
// value's add through a store and a reload).
template <int64_t D, typename T>
CORE_MULTIVERSION void weighted_values(const float* weights, const T* const* values, int64_t n,
                                       const Heads& heads, int64_t head_stride, float* acc) {
  float buffer[D];
  for (int64_t h = 0; h < heads.num_kv_heads * heads.group; ++h) {
    const int64_t offset = h / heads.group * head_stride;
    const float* w = weights + h * n;
    F8 sum[D / kLanes] = {};
    for (int64_t i = 0; i < n; ++i) {
      if (i + kPrefetchAhead < n) prefetch_row<D>(values[i + kPrefetchAhead] + offset);
      const float* v = as_floats<D>(values[i] + offset, buffer);
      const F8 wi = F8{} + w[i];
      for (int64_t d = 0; d < D / kLanes; ++d) sum[d] += wi * load8(v + d * kLanes);
    }
    std::memcpy(acc + h * D, sum, sizeof sum);
  }
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

  // Sequences are handed out one at a time as threads free up: contexts differ in length
  // (a batch mixes new and old requests), and an even split of the count left one thread
  // idle at the end while the other finished the longer half.
  std::atomic<int64_t> next_seq{0};
  const int64_t num_workers = std::min<int64_t>(at::get_num_threads(), num_seqs);
  at::parallel_for(0, num_workers, 1, [&](int64_t, int64_t) {
    std::vector<float> q(num_heads * D), acc(num_heads * D), scores;
    std::vector<const T*> keys, values;
    for (int64_t seq = next_seq++; seq < num_seqs; seq = next_seq++) {
      const int64_t len = lens[seq];
      const int64_t start = sliding_window > 0 ? std::max<int64_t>(0, len - sliding_window) : 0;
      const Task task{table + seq * table_stride, len, start};
      const int64_t first = seq * num_heads * D, n = len - start;
      for (int64_t i = 0; i < num_heads * D; ++i) q[i] = to_float(q_data[first + i]);
      token_rows(cache, strides, task, block_size, 0, keys);
      token_rows(cache, strides, task, block_size, 1, values);
      scores.resize(num_heads * n);
      if (!key_scores_bf16_dot<D>(q_data + first, keys.data(), n, heads, strides.head,
                                  static_cast<float>(scale), scores.data())) {
        key_scores<D>(q.data(), keys.data(), n, heads, strides.head, static_cast<float>(scale),
                      scores.data());
      }
      softmax_rows(scores.data(), num_heads, n);
      weighted_values<D>(scores.data(), values.data(), n, heads, strides.head, acc.data());
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
