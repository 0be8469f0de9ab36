// Decode attention straight from the paged KV cache.
//
// The reference backend gathers every sequence's pages into a dense copy and then runs
// SDPA over it, so each decode step reads the whole context twice and writes it once.
// Here each sequence's task walks its block table once and reads every key and value from
// memory once, sharing each between the query heads of its GQA group. A bfloat16 cache on
// a CPU with AVX512_BF16 takes attend_bf16 (bf16 dot products for the scores, each value
// widened once a pass); the portable loops (key_scores, weighted_values) serve the rest,
// converting each key and value row once for its GQA group (a float32 one is read where it
// lies, once per query head, whose sums stay in registers). An FP8 cache
// (kv_cache_dtype.h) takes the portable loops too; converting its rows is most of their
// work (30 layers' caches of 32 sequences of 256 tokens, SmolLM2's heads, AVX2 EPYC, 2
// threads: a decode step took 22-26 ms on e4m3 caches, 15-17 on bf16 ones; 35-38 on e4m3
// when each value row was converted once per query head).

#include <torch/types.h>

#include "cpu_utils.h"
#include "dtype_dispatch.h"
#include "fast_exp.h"
#include "float8.h"
#include "head_sizes.h"
#include "isa_registry.h"
#include "kernels.h"
#include "kv_cache_dtype.h"
#include "paged_rows.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace {

using core_cpu::CacheStrides;
using core_cpu::exp_nonpositive;
using core_cpu::F8;
using core_cpu::kLanes;
using core_cpu::lane_sum;
using core_cpu::load8;
using core_cpu::Task;
using core_cpu::to_float;
using core_cpu::token_rows;

// Per-sequence shape: query head h uses KV head h / group (GQA groups are adjacent).
struct Heads {
  int64_t num_kv_heads, group;
};

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

// The passes over keys and values ask for the row this many tokens ahead: the rows of a
// sequence are scattered over its blocks, which the hardware's prefetchers do not follow.
// Measured (32 sequences of 150 tokens, SmolLM2's heads, cold cache, AVX2 EPYC): 4 and 8
// ahead gained 20%, 16 ahead 26%, 32 ahead 20%.
constexpr int64_t kPrefetchAhead = 16;

// A row's lines into cache: every level (LOCALITY 3, prefetcht0) or L2 down (2, prefetcht1).
template <int64_t D, int LOCALITY = 3, typename T>
CORE_INLINE void prefetch_row(const T* row) {
  const char* p = reinterpret_cast<const char*>(row);
  for (int64_t b = 0; b < D * static_cast<int64_t>(sizeof(T)); b += 64)
    __builtin_prefetch(p + b, /*rw=*/0, LOCALITY);
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

#ifdef CORE_X86_KERNELS
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16")
#pragma GCC diagnostic push
// GCC 12's false positive in its own widening intrinsics (see linear_avx512.cpp).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// One sequence's attention for a bfloat16 cache and query on CPUs with AVX512_BF16: a pass
// over its keys for every query head's scores, the softmax, then passes over its values.
//
// Scores: each q . k is a vdpbf16ps chain over pairs of bf16 values, read as they lie in
// the cache (no conversion of the keys): the products exact in float32 and summed in
// float32, as key_scores sums them. Keys go 16 at a time, and the 16 dot-product vectors
// are summed into one vector of 16 scores by a transposing tree (45 shuffles and adds,
// where a horizontal sum per key took ~8). A head's D values are chunks of 32, the last
// one masked where D is not a multiple.
//
// Values: each row is widened to float32 once a pass (bf16 is float32's top half) and
// multiplied into the sums of up to kPassHeads query heads, which stay in registers over
// the whole context; every row goes to each of its GQA group's heads (as the fallback's
// weighted_values does a chunk of rows at a time).
//
// 32 sequences of ~195 tokens, SmolLM2's heads, 30 layers' caches (so from memory), shuffled
// blocks, AVX512_BF16 EPYC, 2 threads, interleaved runs, the previous kernel (scores a
// KV head at a time, a horizontal sum per key, values converted once per head) vs this:
// 12.3-16.6 vs 9.4-11.1 ms a step; ~64 tokens 5.0-6.3 vs 4.4-4.7, ~384 tokens 25.7-30.3
// vs 20.8-23.6; one layer's cache (from cache) 0.21-0.35 vs 0.13-0.14 ms. Memory bounds it.
constexpr int64_t kChunk = 32;      // bf16 values per vdpbf16ps operand
constexpr int64_t kKeyTile = 16;    // keys scored together: one float32 vector of scores
constexpr int64_t kFloatLanes = 16;
template <int64_t D>
constexpr int64_t kChunks = (D + kChunk - 1) / kChunk;  // vdpbf16ps operands of one row

// Lane j of the result: the sum of v[j]'s 16 lanes.
CORE_INLINE __m512 sum_each(const __m512 (&v)[kKeyTile]) {
  __m512 pairs[8], quads[4], octs[2];
  for (int j = 0; j < 8; ++j)  // each 128-bit lane: partial sums of v[2j], v[2j+1] in turn
    pairs[j] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * j], v[2 * j + 1]),
                             _mm512_unpackhi_ps(v[2 * j], v[2 * j + 1]));
  for (int j = 0; j < 4; ++j) {  // each 128-bit lane: one partial sum of each of 4 vectors
    const __m512d a = _mm512_castps_pd(pairs[2 * j]), b = _mm512_castps_pd(pairs[2 * j + 1]);
    quads[j] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  for (int j = 0; j < 2; ++j)  // 128-bit lanes: halves of 4 vectors' sums, then of 4 more
    octs[j] = _mm512_add_ps(_mm512_shuffle_f32x4(quads[2 * j], quads[2 * j + 1], 0x88),
                            _mm512_shuffle_f32x4(quads[2 * j], quads[2 * j + 1], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(octs[0], octs[1], 0x88),
                       _mm512_shuffle_f32x4(octs[0], octs[1], 0xDD));
}

template <int64_t D>
CORE_INLINE __m512i bf16_chunk(const c10::BFloat16* row, int64_t c) {
  constexpr __mmask32 kLastMask =
      D % kChunk == 0 ? ~__mmask32{0} : (__mmask32{1} << (D % kChunk)) - 1;
  return _mm512_maskz_loadu_epi16(c == kChunks<D> - 1 ? kLastMask : ~__mmask32{0},
                                  row + c * kChunk);
}

// Tokens' rows for the KV heads [kv0, kv1) into cache: they lie side by side in a token's
// slot, so a pass that covers several heads reads each slot as one run of lines.
template <int64_t D, int LOCALITY = 3>
CORE_INLINE void prefetch_heads(const c10::BFloat16* row, int64_t head_stride, int64_t kv0,
                                int64_t kv1) {
  for (int64_t kv = kv0; kv < kv1; ++kv) prefetch_row<D, LOCALITY>(row + kv * head_stride);
}

// scores[h * n + i] = scale * q[h] . key(i) for every query head h, keys[i] the row of KV
// head 0. A tile of keys is scored for every head before the next, while the next tile's
// keys and this tile's values are fetched.
template <int64_t D>
void scores_bf16(const c10::BFloat16* q, const c10::BFloat16* const* keys,
                 const c10::BFloat16* const* values, int64_t n, const Heads& heads,
                 int64_t head_stride, float scale, float* scores) {
  const __m512 scale_v = _mm512_set1_ps(scale);
  for (int64_t j = 0; j < kKeyTile && j < n; ++j)
    prefetch_heads<D>(keys[j], head_stride, 0, heads.num_kv_heads);
  for (int64_t j = kKeyTile; j < 2 * kKeyTile && j < n; ++j)
    prefetch_heads<D, 2>(keys[j], head_stride, 0, heads.num_kv_heads);
  for (int64_t i = 0; i < n; i += kKeyTile) {
    const int64_t count = n - i < kKeyTile ? n - i : kKeyTile;
    const __mmask16 store_mask = static_cast<__mmask16>((1u << count) - 1);
    for (int64_t kv_head = 0; kv_head < heads.num_kv_heads; ++kv_head) {
      // A KV head's share of the fetches at a time: issued all at once, a tile's were more
      // than the core has fill buffers for, and it stalled on the prefetches.
      for (int64_t j = i + kKeyTile; j < i + 2 * kKeyTile && j < n; ++j)
        prefetch_heads<D>(keys[j], head_stride, kv_head, kv_head + 1);
      // And the tile after it into L2 only: L2 tracks more misses than L1 has fill
      // buffers, so twice the keys are in flight. 32 sequences, SmolLM2's heads, 30
      // layers' caches from memory, AVX512_BF16 EPYC, 2 threads, medians without vs with:
      // 64 tokens 4.5 vs 4.5 ms, 192 12.0-13.6 vs 8.5-9.1, 384 27.6 vs 17.0, 1024 68 vs 43.
      for (int64_t j = i + 2 * kKeyTile; j < i + 3 * kKeyTile && j < n; ++j)
        prefetch_heads<D, 2>(keys[j], head_stride, kv_head, kv_head + 1);
      // Values into L2, where they wait for the values pass, whose loads then never wait
      // on memory.
      for (int64_t j = i; j < i + count; ++j)
        prefetch_row<D, /*LOCALITY=*/2>(values[j] + kv_head * head_stride);
      const c10::BFloat16* rows[kKeyTile];
      for (int64_t j = 0; j < kKeyTile; ++j)  // a short tile repeats its last key
        rows[j] = keys[i + (j < count ? j : count - 1)] + kv_head * head_stride;
      for (int64_t h = kv_head * heads.group; h < (kv_head + 1) * heads.group; ++h) {
        __m512i qc[kChunks<D>];
        for (int64_t c = 0; c < kChunks<D>; ++c) qc[c] = bf16_chunk<D>(q + h * D, c);
        __m512 dots[kKeyTile];
        for (int64_t j = 0; j < kKeyTile; ++j) {
          dots[j] = _mm512_setzero_ps();
          for (int64_t c = 0; c < kChunks<D>; ++c)
            dots[j] = _mm512_dpbf16_ps(dots[j], reinterpret_cast<__m512bh>(qc[c]),
                                       reinterpret_cast<__m512bh>(bf16_chunk<D>(rows[j], c)));
        }
        _mm512_mask_storeu_ps(scores + h * n + i, store_mask,
                              _mm512_mul_ps(sum_each(dots), scale_v));
      }
    }
  }
}

// out[h] = sum_i weights[h * n + i] * value(i) for the HEADS query heads from h0, values[i]
// the row of KV head 0, rounded to bfloat16 once. Each value row is widened to float32
// once per pass (bf16 is float32's top half) and summed into its query heads, whose sums
// stay in registers over the whole context; the pass reads its KV heads' values token by
// token, side by side, as scores_bf16 reads the keys.
template <int64_t D, int HEADS>
void values_bf16(const float* weights, const c10::BFloat16* const* values, int64_t n,
                 const Heads& heads, int64_t head_stride, int64_t h0, c10::BFloat16* out) {
  constexpr int64_t kVecs = D / kFloatLanes;
  const int64_t kv0 = h0 / heads.group, kv1 = (h0 + HEADS - 1) / heads.group + 1;
  __m512 acc[HEADS][kVecs];
  for (int h = 0; h < HEADS; ++h)
    for (int64_t v = 0; v < kVecs; ++v) acc[h][v] = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; ++i) {
    if (i + kKeyTile < n) prefetch_heads<D>(values[i + kKeyTile], head_stride, kv0, kv1);
    __m512 value[kVecs];
    int64_t loaded = -1;  // the KV head whose row `value` holds
    for (int h = 0; h < HEADS; ++h) {
      const int64_t kv = (h0 + h) / heads.group;
      if (kv != loaded) {
        const auto* row = reinterpret_cast<const uint16_t*>(values[i] + kv * head_stride);
        for (int64_t v = 0; v < kVecs; ++v) {
          const __m256i half =
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + v * kFloatLanes));
          value[v] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
        }
        loaded = kv;
      }
      const __m512 w = _mm512_set1_ps(weights[(h0 + h) * n + i]);
      for (int64_t v = 0; v < kVecs; ++v) acc[h][v] = _mm512_fmadd_ps(w, value[v], acc[h][v]);
    }
  }
  for (int h = 0; h < HEADS; ++h)
    for (int64_t v = 0; v < kVecs; ++v)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + (h0 + h) * D + v * kFloatLanes),
                          reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(acc[h][v])));
}

// Query heads one value pass sums: their sums fill at most 24 of the 32 registers.
template <int64_t D>
constexpr int kPassHeads = std::clamp<int64_t>(24 / (D / kFloatLanes), 1, 6);

template <int64_t D, int HEADS>
CORE_INLINE void values_pass(const float* weights, const c10::BFloat16* const* values,
                             int64_t n, const Heads& heads, int64_t head_stride, int64_t h0,
                             int64_t pass_heads, c10::BFloat16* out) {
  if constexpr (HEADS > 1) {
    if (pass_heads < HEADS)
      return values_pass<D, HEADS - 1>(weights, values, n, heads, head_stride, h0, pass_heads, out);
  }
  values_bf16<D, HEADS>(weights, values, n, heads, head_stride, h0, out);
}

template <int64_t D>
void attend_bf16(const c10::BFloat16* q, const c10::BFloat16* const* keys,
                 const c10::BFloat16* const* values, int64_t n, const Heads& heads,
                 int64_t head_stride, float scale, float* scores, c10::BFloat16* out) {
  static_assert(D % kFloatLanes == 0, "head sizes are whole float32 vectors");
  const int64_t num_heads = heads.num_kv_heads * heads.group;
  scores_bf16<D>(q, keys, values, n, heads, head_stride, scale, scores);
  softmax_rows(scores, num_heads, n);
  for (int64_t h0 = 0; h0 < num_heads; h0 += kPassHeads<D>) {
    const int64_t pass_heads = num_heads - h0 < kPassHeads<D> ? num_heads - h0 : kPassHeads<D>;
    values_pass<D, kPassHeads<D>>(scores, values, n, heads, head_stride, h0, pass_heads, out);
  }
}
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif  // CORE_X86_KERNELS

// attend_bf16 where it applies (a bfloat16 cache, a CPU with AVX512_BF16): whether it
// wrote the sequence's output (from the query's own bf16 values).
template <int64_t D, typename T>
bool attend_bf16_dot(const T* q, const T* const* keys, const T* const* values, int64_t n,
                     const Heads& heads, int64_t head_stride, float scale, float* scores,
                     T* out) {
#ifdef CORE_X86_KERNELS
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    const core_cpu::CpuFeatures& cpu = core_cpu::cpu_features();
    if (cpu.avx512 && cpu.avx512_bf16) {
      attend_bf16<D>(q, keys, values, n, heads, head_stride, scale, scores, out);
      return true;
    }
  }
#endif
  return false;
}

// Value rows a converted cache's pass converts together, for all heads of their GQA group:
// 16 rows of D floats, in L1.
constexpr int64_t kValueChunk = 16;

// acc[h] = sum_i weights[h * n + i] * value(start + i) for every query head h. Float32
// values are read where they lie, one head at a time, its sums in registers over all of
// them (summing into memory instead chains every value's add through a store and a
// reload). Other caches' rows are converted kValueChunk at a time, once for their GQA
// group, whose heads then add the chunk to their sums, held in registers over it: an FP8
// row's conversion costs more than its multiply-adds. The sums are added in token order
// either way.
template <int64_t D, typename T>
CORE_MULTIVERSION void weighted_values(const float* weights, const T* const* values, int64_t n,
                                       const Heads& heads, int64_t head_stride, float* acc) {
  constexpr int64_t kVecs = D / kLanes;
  if constexpr (std::is_same_v<T, float>) {
    for (int64_t h = 0; h < heads.num_kv_heads * heads.group; ++h) {
      const int64_t offset = h / heads.group * head_stride;
      const float* w = weights + h * n;
      F8 sum[kVecs] = {};
      for (int64_t i = 0; i < n; ++i) {
        if (i + kPrefetchAhead < n) prefetch_row<D>(values[i + kPrefetchAhead] + offset);
        const F8 wi = F8{} + w[i];
        for (int64_t d = 0; d < kVecs; ++d) sum[d] += wi * load8(values[i] + offset + d * kLanes);
      }
      std::memcpy(acc + h * D, sum, sizeof sum);
    }
  } else {
    float rows[kValueChunk][D];
    std::fill(acc, acc + heads.num_kv_heads * heads.group * D, 0.f);
    for (int64_t kv_head = 0; kv_head < heads.num_kv_heads; ++kv_head) {
      const int64_t offset = kv_head * head_stride;
      for (int64_t i0 = 0; i0 < n; i0 += kValueChunk) {
        const int64_t count = n - i0 < kValueChunk ? n - i0 : kValueChunk;
        for (int64_t j = 0; j < count; ++j) {
          const int64_t ahead = i0 + j + kPrefetchAhead;
          if (ahead < n) prefetch_row<D>(values[ahead] + offset);
          as_floats<D>(values[i0 + j] + offset, rows[j]);
        }
        for (int64_t h = kv_head * heads.group; h < (kv_head + 1) * heads.group; ++h) {
          const float* w = weights + h * n + i0;
          F8 sum[kVecs];
          std::memcpy(sum, acc + h * D, sizeof sum);
          for (int64_t j = 0; j < count; ++j) {
            const F8 wj = F8{} + w[j];
            for (int64_t d = 0; d < kVecs; ++d) sum[d] += wj * load8(rows[j] + d * kLanes);
          }
          std::memcpy(acc + h * D, sum, sizeof sum);
        }
      }
    }
  }
}

// Every sequence's attention, T the query's and the output's dtype, C the cache's (T, or an
// FP8 format whose K / V are read as stored * k_scale / v_scale).
template <int64_t D, typename T, typename C>
void decode(torch::Tensor& out, const torch::Tensor& query, const torch::Tensor& kv_cache,
            const torch::Tensor& block_table, const torch::Tensor& seq_lens, double scale,
            int64_t sliding_window, double k_scale, double v_scale) {
  const int64_t num_seqs = query.size(0), num_heads = query.size(1);
  const int64_t block_size = kv_cache.size(2);
  const Heads heads{kv_cache.size(3), num_heads / kv_cache.size(3)};
  const CacheStrides strides{kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2),
                             kv_cache.stride(3)};
  const auto* cache = static_cast<const C*>(kv_cache.data_ptr());
  const T* q_data = query.data_ptr<T>();
  T* out_data = out.data_ptr<T>();
  const int64_t* table = block_table.data_ptr<int64_t>();
  const int64_t* lens = seq_lens.data_ptr<int64_t>();
  const int64_t table_stride = block_table.stride(0);
  const auto key_scale = static_cast<float>(scale * k_scale);
  const auto value_scale = static_cast<float>(v_scale);

  // Fewer sequences than threads (a single stream above all) leave threads idle with a
  // sequence a task: then each sequence's GQA groups are tasks of their own, every kernel
  // below run on one group's slice (its query heads, scores and output, and rows pointing
  // at its KV head). A query head's arithmetic is the same in either split, so a
  // sequence's output is the same bits alone as in any batch.
  const int64_t splits = num_seqs < at::get_num_threads() ? heads.num_kv_heads : 1;
  const Heads part_heads{heads.num_kv_heads / splits, heads.group};
  const int64_t part_query_heads = part_heads.num_kv_heads * part_heads.group;
  core_cpu::for_each_task(num_seqs * splits, [&](auto next_task) {
    std::vector<float> q(part_query_heads * D), acc(part_query_heads * D), scores;
    std::vector<const C*> keys, values;
    for (int64_t task_index = next_task(); task_index < num_seqs * splits;
         task_index = next_task()) {
      const int64_t seq = task_index / splits, part = task_index % splits;
      const int64_t len = lens[seq];
      const int64_t start = sliding_window > 0 ? std::max<int64_t>(0, len - sliding_window) : 0;
      const Task task{table + seq * table_stride, len, start};
      const int64_t first = (seq * num_heads + part * part_query_heads) * D, n = len - start;
      const C* part_cache = cache + part * part_heads.num_kv_heads * strides.head;
      token_rows(part_cache, strides, task, block_size, 0, keys);
      token_rows(part_cache, strides, task, block_size, 1, values);
      scores.resize(part_query_heads * n);
      if constexpr (std::is_same_v<C, T>) {  // a cache in the query's dtype: scales of 1
        if (attend_bf16_dot<D>(q_data + first, keys.data(), values.data(), n, part_heads,
                               strides.head, key_scale, scores.data(), out_data + first))
          continue;
      }
      for (int64_t i = 0; i < part_query_heads * D; ++i) q[i] = to_float(q_data[first + i]);
      key_scores<D>(q.data(), keys.data(), n, part_heads, strides.head, key_scale,
                    scores.data());
      softmax_rows(scores.data(), part_query_heads, n);
      weighted_values<D>(scores.data(), values.data(), n, part_heads, strides.head, acc.data());
      for (int64_t i = 0; i < part_query_heads * D; ++i)
        out_data[first + i] = static_cast<T>(acc[i] * value_scale);
    }
  });
}

template <typename T, typename C>
void decode_any_head_size(torch::Tensor& out, const torch::Tensor& query,
                          const torch::Tensor& kv_cache, const torch::Tensor& block_table,
                          const torch::Tensor& seq_lens, double scale, int64_t sliding_window,
                          double k_scale, double v_scale) {
  switch (query.size(2)) {
#define CORE_HEAD_SIZE_CASE(D)                                                             \
  case D:                                                                                  \
    return decode<D, T, C>(out, query, kv_cache, block_table, seq_lens, scale, sliding_window, \
                           k_scale, v_scale);
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
  TORCH_CHECK(kv_cache.size(4) == query.size(2), "head sizes of query and kv_cache differ");
  TORCH_CHECK(query.size(1) % kv_cache.size(3) == 0, "query heads must be a multiple of KV heads");
  core_cpu::check_block_table(block_table, seq_lens, query.size(0));
  TORCH_CHECK(query.device().is_cpu() && kv_cache.device().is_cpu(), "CPU tensors only");
}

}  // namespace

// out[b, h] = softmax(scale * q[b, h] . K_b^T) V_b over sequence b's keys
// [max(0, seq_len - sliding_window), seq_len), K_b/V_b read through block_table[b]: as
// stored for a cache in the query's dtype, stored * k_scale / v_scale for an FP8 one.
void paged_decode_attention(torch::Tensor out, torch::Tensor query, torch::Tensor kv_cache,
                            torch::Tensor block_table, torch::Tensor seq_lens, double scale,
                            int64_t sliding_window, double k_scale, double v_scale) {
  check_inputs(out, query, kv_cache, block_table, seq_lens);
  core_cpu::dispatch_dtype(query, "paged_decode_attention", [&](auto query_zero) {
    using T = decltype(query_zero);
    core_cpu::dispatch_kv_cache<T>(
        kv_cache, query, k_scale, v_scale, "paged_decode_attention", [&](auto cache_zero) {
          decode_any_head_size<T, decltype(cache_zero)>(out, query, kv_cache, block_table,
                                                        seq_lens, scale, sliding_window,
                                                        k_scale, v_scale);
        });
  });
}
