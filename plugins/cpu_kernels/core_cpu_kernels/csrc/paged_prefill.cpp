// Prefill attention straight from the paged KV cache.
//
// The reference gathers a chunk's whole context into a dense copy and runs SDPA over it
// with a materialized [q_len, seq_len] mask. Here a task is a tile of one chunk's query
// tokens times the query heads of one KV head (its GQA group): it walks the keys its rows
// can see kKeys at a time and keeps a running softmax per row (flash attention), so neither
// the mask nor a gathered copy of the context exists. Float32 keys and values are read in
// place in the cache; 16-bit and FP8 ones (kv_cache_dtype.h) are converted to float once
// per tile for all its rows.
//
// The task's queries are held transposed, [D, rows], so both products are small GEMMs
// that broadcast a cache element against a vector of rows (scores) or a row's weight
// against a vector of value columns, and the softmax runs across rows, a vector at a time.
// They are plain loops over fixed sizes: in each CORE_MULTIVERSION clone GCC keeps the
// accumulator blocks in vector registers and emits broadcast FMAs of that clone's width
// (checked in the assembly for AVX2 and AVX-512).

#include <torch/types.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "cpu_utils.h"
#include "dtype_dispatch.h"
#include "fast_exp.h"
#include "head_sizes.h"
#include "kernels.h"
#include "kv_cache_dtype.h"

namespace {

using core_cpu::exp_nonpositive;
using core_cpu::from_float;
using core_cpu::to_float;

constexpr int64_t kKeys = 16;           // keys per tile
constexpr int64_t kTokensPerTask = 16;  // query tokens per task, each with the group's heads
// Accumulator blocks of 4 x 16 floats: 8 AVX2 registers (4 AVX-512 ones), with room for
// the operands; 6 x 16 spills on AVX2. A task's rows are padded to a multiple of kRowBlock.
constexpr int64_t kRowBlock = 16;  // rows per score block
constexpr int kScoreKeys = 4;      // keys per score block
constexpr int kValueRows = 4;      // rows per value block
constexpr int64_t kValueCols = 16;  // columns per value block

struct CacheLayout {
  int64_t block, kv, token, head;  // strides in elements; the head dimension is contiguous
  int64_t block_size;
};

struct RowLayout {
  int64_t token, head;  // strides in elements of a [T, H, D] query or output
};

struct Chunk {
  const int64_t* blocks;  // this chunk's block table row
  int64_t first_row;      // its first query row in the step
  int64_t num_tokens;     // its new tokens, at positions [seq_len - num_tokens, seq_len)
  int64_t seq_len;
};

// Query tokens [first, first + num_tokens) of one chunk (indices into the chunk) with
// the query heads of one KV head.
struct Task {
  int64_t chunk, kv_head, first, num_tokens;
  int64_t cost;  // query rows x keys they see: what sorts the tasks
};

// Everything a task reads and writes, shared by all tasks of one call: T is the query's and
// the output's dtype, C the cache's (T, or an FP8 format).
template <typename T, typename C>
struct Problem {
  const T* query;
  T* out;
  const C* cache;
  RowLayout query_rows, out_rows;
  CacheLayout cache_layout;
  std::vector<Chunk> chunks;
  int64_t group;           // query heads per KV head
  int64_t sliding_window;  // 0: none
  float scale;             // of q . k, times k_scale (kv_cache_dtype.h)
  float v_scale;
};

// The first key the query at position `pos` sees (its last is `pos` itself).
CORE_INLINE int64_t first_key(int64_t pos, int64_t sliding_window) {
  return sliding_window > 0 && pos >= sliding_window ? pos - sliding_window + 1 : 0;
}

CORE_INLINE int64_t padded_rows(int64_t rows) {
  return (rows + kRowBlock - 1) / kRowBlock * kRowBlock;
}

// A thread's scratch for one task: its rows' queries (transposed), outputs, softmax state
// and key range, one tile of scores, and float copies of a tile of 16-bit keys and values.
struct Workspace {
  std::vector<float> buffer;
  std::vector<int32_t> positions;
  int64_t rows;                 // padded rows: the leading dimension of qt and scores
  float *qt, *o, *scores;       // [D, rows], [rows, D], [kKeys, rows]
  float *max, *sum, *correction, *tile_max;  // [rows] each: the running softmax
  float *keys, *values, *zeros;  // [kKeys, D] twice, [D]
  int32_t *last_key, *first_key;  // [rows]: row r sees keys [first_key[r], last_key[r]]

  Workspace(int64_t max_rows, int64_t head_size)
      : buffer(max_rows * (2 * head_size + kKeys + 4) + (2 * kKeys + 1) * head_size),
        positions(2 * max_rows) {
    qt = buffer.data();
    o = qt + max_rows * head_size;
    scores = o + max_rows * head_size;
    max = scores + max_rows * kKeys;
    sum = max + max_rows;
    correction = sum + max_rows;
    tile_max = correction + max_rows;
    keys = tile_max + max_rows;
    values = keys + kKeys * head_size;
    zeros = values + kKeys * head_size;
    last_key = positions.data();
    first_key = last_key + max_rows;
  }
};

// Pointers to the tile's keys and values at positions [first, first + n) as float rows of D
// (j >= n: zeros, so the products stay finite whatever the cache holds there).
struct TileRows {
  const float* keys[kKeys];
  const float* values[kKeys];
};

// Float rows of a 16-bit or FP8 key and value, converted into the workspace's slot j.
template <int64_t D, typename C>
CORE_INLINE void convert_rows(const C* key, const C* value, int64_t j, Workspace& ws,
                              TileRows& tile) {
  float* k = ws.keys + j * D;
  float* v = ws.values + j * D;
  for (int64_t d = 0; d < D; ++d) k[d] = to_float(key[d]);
  for (int64_t d = 0; d < D; ++d) v[d] = to_float(value[d]);
  tile.keys[j] = k;
  tile.values[j] = v;
}

// Walks the positions block by block, so no key costs a division.
template <int64_t D, typename T, typename C>
CORE_INLINE void tile_rows(const Problem<T, C>& p, const int64_t* blocks, int64_t kv_head,
                           int64_t first, int64_t n, Workspace& ws, TileRows& tile) {
  const CacheLayout& layout = p.cache_layout;
  int64_t block = first / layout.block_size, offset = first % layout.block_size;
  for (int64_t j = 0; j < n; ++j) {
    const C* key = p.cache + blocks[block] * layout.block + offset * layout.token +
                   kv_head * layout.head;
    if constexpr (std::is_same_v<C, float>) {
      tile.keys[j] = key;
      tile.values[j] = key + layout.kv;
    } else {
      convert_rows<D>(key, key + layout.kv, j, ws, tile);
    }
    if (++offset == layout.block_size) {
      offset = 0;
      ++block;
    }
  }
  for (int64_t j = n; j < kKeys; ++j) tile.keys[j] = tile.values[j] = ws.zeros;
}

// s[j, r] = q[r] . keys[j] for kScoreKeys keys and kRowBlock rows; qt and s point at the
// block's first row, their rows `ld` apart.
template <int64_t D>
CORE_INLINE void score_block(const float* __restrict qt, int64_t ld,
                             const float* const* __restrict keys, float* __restrict s) {
  float acc[kScoreKeys][kRowBlock] = {};
  for (int64_t d = 0; d < D; ++d) {
    for (int j = 0; j < kScoreKeys; ++j) {
      const float k = keys[j][d];
#pragma omp simd
      for (int64_t r = 0; r < kRowBlock; ++r) acc[j][r] += k * qt[d * ld + r];
    }
  }
  for (int j = 0; j < kScoreKeys; ++j)
    for (int64_t r = 0; r < kRowBlock; ++r) s[j * ld + r] = acc[j][r];
}

// scores [kKeys, rows] = keys [kKeys, D] . qt [D, rows]
template <int64_t D>
CORE_INLINE void score_tile(Workspace& ws, const TileRows& tile) {
  for (int64_t r = 0; r < ws.rows; r += kRowBlock)
    for (int64_t j = 0; j < kKeys; j += kScoreKeys)
      score_block<D>(ws.qt + r, ws.rows, tile.keys + j, ws.scores + j * ws.rows + r);
}

// Sets the scores of keys a row does not see (at positions [first, first + n)) to -inf and
// returns each row's largest score in the tile in tile_max.
CORE_INLINE void mask_tile(int64_t first, int64_t n, Workspace& ws) {
  constexpr float kMasked = -std::numeric_limits<float>::infinity();
  const int64_t rows = ws.rows;
  const int32_t* __restrict first_keys = ws.first_key;
  const int32_t* __restrict last_keys = ws.last_key;
  float* __restrict tile_max = ws.tile_max;
  std::fill(tile_max, tile_max + rows, kMasked);
  for (int64_t j = 0; j < n; ++j) {
    float* __restrict s = ws.scores + j * rows;
    const int32_t key = static_cast<int32_t>(first + j);
#pragma omp simd
    for (int64_t r = 0; r < rows; ++r) {
      const float x = (key >= first_keys[r]) & (key <= last_keys[r]) ? s[r] : kMasked;
      s[r] = x;
      tile_max[r] = x > tile_max[r] ? x : tile_max[r];
    }
  }
  std::fill(ws.scores + n * rows, ws.scores + kKeys * rows, kMasked);  // keys that do not exist
}

// Turns the tile's scores into exp(score - new max) (masked ones into 0) and updates each
// row's running max and sum. The max starts at the lowest finite float, never -inf, so a
// row that has seen no key yet never computes -inf - -inf.
CORE_INLINE void softmax_tile(int64_t first, int64_t n, Workspace& ws) {
  mask_tile(first, n, ws);
  const int64_t rows = ws.rows;
  float* __restrict max = ws.max;
  float* __restrict sum = ws.sum;
  float* __restrict correction = ws.correction;
  const float* __restrict tile_max = ws.tile_max;
#pragma omp simd
  for (int64_t r = 0; r < rows; ++r) {
    const float new_max = tile_max[r] > max[r] ? tile_max[r] : max[r];
    correction[r] = exp_nonpositive(max[r] - new_max);
    sum[r] *= correction[r];
    max[r] = new_max;
  }
  for (int64_t j = 0; j < kKeys; ++j) {
    float* __restrict s = ws.scores + j * rows;
#pragma omp simd
    for (int64_t r = 0; r < rows; ++r) {
      s[r] = exp_nonpositive(s[r] - max[r]);
      sum[r] += s[r];
    }
  }
}

// o[r, :kValueCols] = o[r, :kValueCols] * correction[r] + sum_j p[j, r] values[j][:kValueCols]
// for kValueRows rows; p, correction and o point at the block's first row (p's rows `ld`
// apart, o's D), values at its first column.
template <int64_t D>
CORE_INLINE void value_block(const float* __restrict p, int64_t ld,
                             const float* __restrict correction,
                             const float* const* __restrict values, int64_t column,
                             float* __restrict o) {
  float acc[kValueRows][kValueCols];
  for (int r = 0; r < kValueRows; ++r)
    for (int64_t c = 0; c < kValueCols; ++c) acc[r][c] = o[r * D + c] * correction[r];
  for (int64_t j = 0; j < kKeys; ++j) {
    const float* v = values[j] + column;
    for (int r = 0; r < kValueRows; ++r) {
      const float w = p[j * ld + r];
#pragma omp simd
      for (int64_t c = 0; c < kValueCols; ++c) acc[r][c] += w * v[c];
    }
  }
  for (int r = 0; r < kValueRows; ++r)
    for (int64_t c = 0; c < kValueCols; ++c) o[r * D + c] = acc[r][c];
}

// o [rows, D] = o * correction + scores^T [rows, kKeys] . values [kKeys, D]
template <int64_t D>
CORE_INLINE void value_tile(Workspace& ws, const TileRows& tile) {
  static_assert(D % kValueCols == 0, "head size must be a multiple of kValueCols");
  for (int64_t c = 0; c < D; c += kValueCols)
    for (int64_t r = 0; r < ws.rows; r += kValueRows)
      value_block<D>(ws.scores + r, ws.rows, ws.correction + r, tile.values, c,
                     ws.o + r * D + c);
}

// Row r = i * group + h is token i's query head kv_head * group + h, scaled, stored as
// column r of qt; padding rows repeat the last row's key range and have zero queries.
template <int64_t D, typename T, typename C>
void start_task(const Problem<T, C>& p, const Task& t, Workspace& ws) {
  const Chunk& chunk = p.chunks[t.chunk];
  const int64_t rows = t.num_tokens * p.group;
  ws.rows = padded_rows(rows);
  std::fill(ws.qt, ws.qt + D * ws.rows, 0.f);
  for (int64_t r = 0; r < ws.rows; ++r) {
    const int64_t i = std::min(r, rows - 1) / p.group, h = r % p.group;
    const int64_t pos = chunk.seq_len - chunk.num_tokens + t.first + i;
    ws.last_key[r] = static_cast<int32_t>(pos);
    ws.first_key[r] = static_cast<int32_t>(first_key(pos, p.sliding_window));
    if (r >= rows) continue;
    const T* src = p.query + (chunk.first_row + t.first + i) * p.query_rows.token +
                   (t.kv_head * p.group + h) * p.query_rows.head;
    for (int64_t d = 0; d < D; ++d) ws.qt[d * ws.rows + r] = to_float(src[d]) * p.scale;
  }
  std::fill(ws.o, ws.o + ws.rows * D, 0.f);
  std::fill(ws.max, ws.max + ws.rows, std::numeric_limits<float>::lowest());
  std::fill(ws.sum, ws.sum + ws.rows, 0.f);
}

template <int64_t D, typename T, typename C>
void store_outputs(const Problem<T, C>& p, const Task& t, const Workspace& ws) {
  const Chunk& chunk = p.chunks[t.chunk];
  for (int64_t i = 0; i < t.num_tokens; ++i) {
    for (int64_t h = 0; h < p.group; ++h) {
      const int64_t r = i * p.group + h;
      T* dst = p.out + (chunk.first_row + t.first + i) * p.out_rows.token +
               (t.kv_head * p.group + h) * p.out_rows.head;
      const float inv = p.v_scale / ws.sum[r];  // sum > 0: every query sees its own key
      for (int64_t d = 0; d < D; ++d) dst[d] = from_float<T>(ws.o[r * D + d] * inv);
    }
  }
}

// One task: its rows against every key tile that any of them sees.
template <int64_t D, typename T, typename C>
CORE_MULTIVERSION void run_task(const Problem<T, C>& p, const Task& t, Workspace& ws) {
  const Chunk& chunk = p.chunks[t.chunk];
  const int64_t first_pos = chunk.seq_len - chunk.num_tokens + t.first;
  const int64_t last_pos = first_pos + t.num_tokens - 1;
  start_task<D>(p, t, ws);
  TileRows tile;
  for (int64_t first = first_key(first_pos, p.sliding_window); first <= last_pos;
       first += kKeys) {
    const int64_t n = std::min<int64_t>(kKeys, last_pos + 1 - first);
    tile_rows<D>(p, chunk.blocks, t.kv_head, first, n, ws, tile);
    score_tile<D>(ws, tile);
    softmax_tile(first, n, ws);
    value_tile<D>(ws, tile);
  }
  store_outputs<D>(p, t, ws);
}

// Every chunk's token tiles times the KV heads, most work first: causal tiles late in a
// chunk see more keys, and threads taking the largest remaining task finish together.
std::vector<Task> plan_tasks(const std::vector<Chunk>& chunks, int64_t num_kv_heads,
                             int64_t group, int64_t sliding_window) {
  std::vector<Task> tasks;
  for (int64_t c = 0; c < static_cast<int64_t>(chunks.size()); ++c) {
    const Chunk& chunk = chunks[c];
    for (int64_t first = 0; first < chunk.num_tokens; first += kTokensPerTask) {
      const int64_t num_tokens = std::min(kTokensPerTask, chunk.num_tokens - first);
      const int64_t first_pos = chunk.seq_len - chunk.num_tokens + first;
      const int64_t num_keys = first_pos + num_tokens - first_key(first_pos, sliding_window);
      for (int64_t kv_head = 0; kv_head < num_kv_heads; ++kv_head)
        tasks.push_back({c, kv_head, first, num_tokens, num_tokens * group * num_keys});
    }
  }
  std::stable_sort(tasks.begin(), tasks.end(),
                   [](const Task& a, const Task& b) { return a.cost > b.cost; });
  return tasks;
}

template <int64_t D, typename T, typename C>
void prefill(const Problem<T, C>& p, int64_t num_kv_heads) {
  const std::vector<Task> tasks = plan_tasks(p.chunks, num_kv_heads, p.group, p.sliding_window);
  const int64_t num_tasks = static_cast<int64_t>(tasks.size());
  std::atomic<int64_t> next{0};
  // One range item per thread; each thread takes the next task until none is left.
  at::parallel_for(0, std::min<int64_t>(at::get_num_threads(), num_tasks), 1,
                   [&](int64_t, int64_t) {
                     Workspace ws(padded_rows(kTokensPerTask * p.group), D);
                     for (int64_t i = next++; i < num_tasks; i = next++)
                       run_task<D>(p, tasks[i], ws);
                   });
}

template <typename T, typename C>
void prefill_any_head_size(const Problem<T, C>& p, int64_t num_kv_heads, int64_t head_size) {
  switch (head_size) {
#define CORE_HEAD_SIZE_CASE(D) \
  case D:                      \
    return prefill<D, T, C>(p, num_kv_heads);
    CORE_FOR_EACH_HEAD_SIZE(CORE_HEAD_SIZE_CASE)
#undef CORE_HEAD_SIZE_CASE
    default:
      TORCH_CHECK(false, "paged_prefill_attention: unsupported head size ", head_size);
  }
}

void check_tensors(const torch::Tensor& out, const torch::Tensor& query,
                   const torch::Tensor& kv_cache, const torch::Tensor& block_table) {
  TORCH_CHECK(query.dim() == 3 && query.stride(2) == 1,
              "query must be [T, Hq, D] with D contiguous");
  TORCH_CHECK(out.sizes() == query.sizes() && out.stride(2) == 1 &&
                  out.scalar_type() == query.scalar_type(),
              "out must be shaped and typed like query, with D contiguous");
  TORCH_CHECK(kv_cache.dim() == 5 && kv_cache.size(1) == 2 && kv_cache.stride(4) == 1,
              "kv_cache must be [num_blocks, 2, block_size, Hkv, D] with D contiguous");
  TORCH_CHECK(kv_cache.size(4) == query.size(2), "head sizes of query and kv_cache differ");
  TORCH_CHECK(query.size(1) % kv_cache.size(3) == 0, "query heads must be a multiple of KV heads");
  TORCH_CHECK(block_table.dim() == 2 && block_table.scalar_type() == torch::kInt64 &&
                  block_table.stride(1) == 1,
              "block_table must be int64 [C, max_blocks] with contiguous rows");
  TORCH_CHECK(query.device().is_cpu() && kv_cache.device().is_cpu() && out.device().is_cpu() &&
                  block_table.device().is_cpu(),
              "CPU tensors only");
}

// The chunks, checked against the tensors: rows inside query, context after the new
// tokens, enough blocks in each table row.
std::vector<Chunk> make_chunks(const torch::Tensor& query, const torch::Tensor& block_table,
                               const std::vector<int64_t>& query_start_loc,
                               const std::vector<int64_t>& seq_lens, int64_t block_size) {
  const int64_t num_chunks = static_cast<int64_t>(seq_lens.size());
  TORCH_CHECK(static_cast<int64_t>(query_start_loc.size()) == num_chunks + 1 &&
                  block_table.size(0) == num_chunks,
              "query_start_loc needs C + 1 entries and block_table C rows for C seq_lens");
  TORCH_CHECK(query_start_loc.front() >= 0 && query_start_loc.back() <= query.size(0),
              "query_start_loc must index rows of query");
  std::vector<Chunk> chunks;
  for (int64_t c = 0; c < num_chunks; ++c) {
    const int64_t num_tokens = query_start_loc[c + 1] - query_start_loc[c];
    TORCH_CHECK(num_tokens >= 0 && seq_lens[c] >= num_tokens,
                "each chunk needs query_start_loc ascending and seq_len >= its new tokens");
    TORCH_CHECK(seq_lens[c] <= std::numeric_limits<int32_t>::max(),
                "seq_len ", seq_lens[c], " exceeds the kernel's int32 positions");
    TORCH_CHECK(block_table.size(1) * block_size >= seq_lens[c],
                "block_table has too few blocks for seq_len ", seq_lens[c]);
    chunks.push_back({block_table.data_ptr<int64_t>() + c * block_table.stride(0),
                      query_start_loc[c], num_tokens, seq_lens[c]});
  }
  return chunks;
}

template <typename T, typename C>
Problem<T, C> make_problem(torch::Tensor& out, const torch::Tensor& query,
                           const torch::Tensor& kv_cache, std::vector<Chunk> chunks,
                           double scale, int64_t sliding_window, double k_scale,
                           double v_scale) {
  return Problem<T, C>{
      query.data_ptr<T>(),
      out.data_ptr<T>(),
      static_cast<const C*>(kv_cache.data_ptr()),
      {query.stride(0), query.stride(1)},
      {out.stride(0), out.stride(1)},
      {kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3),
       kv_cache.size(2)},
      std::move(chunks),
      query.size(1) / kv_cache.size(3),
      sliding_window,
      static_cast<float>(scale * k_scale),
      static_cast<float>(v_scale),
  };
}

}  // namespace

// For each chunk c, out[rows] = causal attention of query[rows] (rows
// [query_start_loc[c], query_start_loc[c + 1]), at positions ending at seq_lens[c]) over
// the keys and values of positions [0, seq_lens[c]) read through block_table[c], each query
// at position p seeing [max(0, p - sliding_window + 1), p] (all of [0, p] when
// sliding_window is 0). Keys and values are read as stored from a cache in the query's
// dtype, as stored * k_scale / v_scale from an FP8 one. Rows of out outside every chunk are
// left as they are.
void paged_prefill_attention(torch::Tensor out, torch::Tensor query, torch::Tensor kv_cache,
                             torch::Tensor block_table, std::vector<int64_t> query_start_loc,
                             std::vector<int64_t> seq_lens, double scale,
                             int64_t sliding_window, double k_scale, double v_scale) {
  check_tensors(out, query, kv_cache, block_table);
  TORCH_CHECK(sliding_window >= 0, "sliding_window must be >= 0 (0: none)");
  std::vector<Chunk> chunks =
      make_chunks(query, block_table, query_start_loc, seq_lens, kv_cache.size(2));
  const char* kernel = "paged_prefill_attention";
  core_cpu::dispatch_dtype(query, kernel, [&](auto query_zero) {
    using T = decltype(query_zero);
    core_cpu::dispatch_kv_cache<T>(kv_cache, query, k_scale, v_scale, kernel, [&](auto zero) {
      using C = decltype(zero);
      const Problem<T, C> problem = make_problem<T, C>(out, query, kv_cache, std::move(chunks),
                                                       scale, sliding_window, k_scale, v_scale);
      prefill_any_head_size<T, C>(problem, kv_cache.size(3), query.size(2));
    });
  });
}
