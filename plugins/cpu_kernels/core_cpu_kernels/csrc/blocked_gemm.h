// How the ops that multiply on quant_linear_isa.h's blocked GEMM (quant_linear.cpp,
// fp8_linear.cpp) split it between threads, whatever their weight's format.

#pragma once

#include <ATen/Parallel.h>

#include <cstdint>
#include <vector>

#include "quant_linear.h"

namespace core_cpu {

// The multiply-adds one GEMV or blocked-GEMM task does at least (~2.5 us on one core): a
// smaller layer runs on the calling thread rather than pay for waking the others. (At 4x
// this, SmolLM2's 192 x 576 decode row ran on one thread in 12 us; split in two it takes 10.)
constexpr int64_t kMacsPerTask = 1 << 15;
// Token blocks one task of the blocked GEMM's repacking of x takes at least: x's blocks
// are few (5 at 80 tokens), and each costs about as much as waking a thread.
constexpr int64_t kPackBlocksPerTask = 2;

// The blocked GEMM of w (any weight with its inputs per row, w.k): x repacked once for the
// register blocks by pack(b0, b1) over its token blocks, then each thread takes whole
// strips of kGemmRows weight rows, which gemm(n0, n1, rows, panel) turns into Row elements
// a register block at a time (`rows` holds kGemmRows * k of them) and multiplies with
// every token block.
template <typename Row, typename Weight, typename Pack, typename Gemm>
void multiply_blocked(const Weight& w, int64_t num_tokens, int64_t token_block, Pack pack,
                      Gemm gemm, int64_t n) {
  using quant_linear::kGemmPanelRows, quant_linear::kGemmRows;
  const int64_t num_blocks = (num_tokens + token_block - 1) / token_block;
  at::parallel_for(0, num_blocks, kPackBlocksPerTask, pack);
  const int64_t num_strips = (n + kGemmRows - 1) / kGemmRows;
  const int64_t grain = kMacsPerTask / (kGemmRows * w.k * num_tokens) + 1;
  at::parallel_for(0, num_strips, grain, [&](int64_t begin, int64_t end) {
    std::vector<Row> rows(kGemmRows * w.k);
    std::vector<float> panel(kGemmPanelRows * num_tokens);
    const int64_t n1 = end * kGemmRows;
    gemm(begin * kGemmRows, n1 < n ? n1 : n, rows.data(), panel.data());
  });
}

// The blocked GEMM on x's elements (float32, or bf16 bits for the bf16 kernels).
template <typename Elem, typename Weight, typename PackTokens, typename Gemm>
void multiply_elements(const Weight& w, const Elem* x, int64_t num_tokens, int64_t token_block,
                       PackTokens pack_tokens, Gemm gemm, float* out, int64_t n) {
  const int64_t num_blocks = (num_tokens + token_block - 1) / token_block;
  std::vector<Elem> packed(num_blocks * token_block * w.k);
  multiply_blocked<Elem>(
      w, num_tokens, token_block,
      [&](int64_t b0, int64_t b1) { pack_tokens(x, num_tokens, w.k, b0, b1, packed.data()); },
      [&](int64_t n0, int64_t n1, Elem* rows, float* panel) {
        gemm(w, n0, n1, packed.data(), num_tokens, out, n, rows, panel);
      },
      n);
}

}  // namespace core_cpu
