// What the paged decode kernels share (paged_attention.cpp, mla_decode.cpp): a sequence's
// token rows found through its block table, and the sequences handed out to threads.

#pragma once

#include <ATen/Parallel.h>
#include <torch/types.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

namespace core_cpu {

struct CacheStrides {
  int64_t block, kv, token, head;  // in elements; the head dimension is contiguous
};

struct Task {
  const int64_t* blocks;  // this sequence's block table row
  int64_t seq_len;        // keys [start, seq_len) are visible
  int64_t start;
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

// Runs worker(next) on up to one thread per task, where next() returns the next task not
// yet taken (num_tasks once none is left): a sequence, or in paged decode a (sequence, GQA
// group) pair. Tasks are handed out one at a time as threads free up. Contexts differ in
// length (a batch mixes new and old requests), and an even split of the count left one
// thread idle at the end while the other finished the longer half.
template <typename Worker>
void for_each_task(int64_t num_tasks, Worker&& worker) {
  std::atomic<int64_t> next_task{0};
  const int64_t num_workers = std::min<int64_t>(at::get_num_threads(), num_tasks);
  at::parallel_for(0, num_workers, 1, [&](int64_t, int64_t) {
    worker([&next_task] { return next_task++; });
  });
}

// The block table [num_seqs, max_blocks] and seq_lens [num_seqs] both kernels take.
inline void check_block_table(const torch::Tensor& block_table, const torch::Tensor& seq_lens,
                              int64_t num_seqs) {
  TORCH_CHECK(block_table.dim() == 2 && block_table.size(0) == num_seqs &&
                  block_table.scalar_type() == torch::kInt64 && block_table.stride(1) == 1,
              "block_table must be int64 [B, max_blocks] with contiguous rows");
  TORCH_CHECK(seq_lens.dim() == 1 && seq_lens.size(0) == num_seqs &&
                  seq_lens.scalar_type() == torch::kInt64 && seq_lens.is_contiguous(),
              "seq_lens must be contiguous int64 [B]");
}

}  // namespace core_cpu
