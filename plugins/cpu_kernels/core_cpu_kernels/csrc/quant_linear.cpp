// core::quant_linear on the CPU: x [T, K] times a group-quantized W [N, K] (layout in
// core/ops/quant_linear.py), float32 products and sums, rounded once to x's dtype; on an
// ISA with bf16 dot products (AVX512_BF16), bfloat16 x's GEMMs multiply W rounded to
// bfloat16, still summing in float32; asked to (int8_x), on an ISA with int8 dot products
// (AVX512_VNNI) they quantize x to int8 per run of 32 inputs instead where W's groups are
// whole runs (quant_linear.h's Int8Kernels). Asked to, decode rows of any dtype take the
// int8 GEMV instead of the float32 one on every x86 ISA (AVX2's integer multiply-adds).
//
// Decode rows (T <= kGemvMaxTokens) take the GEMV: each weight row is read once, its
// values unpacked in registers and multiplied with every token, so the packed bytes are
// all the memory traffic. Batched decode takes the blocked GEMM: each thread dequantizes a
// few rows at a time into L1 and multiplies them with every token in register blocks (the
// int8 GEMM unpacks them to bytes instead). Prefill takes, for bfloat16 x on the bf16 dot
// products, the strip GEMM (64 rows dequantized at a time, multiplied with every token);
// otherwise the tiled GEMM: each thread dequantizes a tile of rows (at most kTileBytes) and
// multiplies it with torch's GEMM; or the int8 GEMM's blocks where they measure faster on
// this CPU (int8_prefills). A call never dequantizes all of W; the caller may keep W
// dequantized once in the strip GEMM's layout (quant_linear_strips), and bfloat16 x given
// those strips takes the strip GEMM from them, whatever its token count; or W in the
// interleaved layout (quant_linear_interleaved), which bfloat16 decode rows take the
// interleaved GEMV from. The vector ISA is probed once (quant_linear_isas lists the ones
// this CPU runs).

#include <torch/types.h>
#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "blocked_gemm.h"
#include "float_rows.h"
#include "isa_registry.h"
#include "kernels.h"
#include "quant_linear.h"

namespace {

namespace ql = core_cpu::quant_linear;
using core_cpu::kMacsPerTask;
using core_cpu::multiply_blocked;
using core_cpu::multiply_elements;

// Up to this many tokens the GEMV's single pass over W beats dequantizing it for a GEMM
// (measured on SmolLM2's shapes: the GEMV wins at 8 tokens, tie at 9, the GEMM at 12).
constexpr int64_t kGemvMaxTokens = 8;
// Up to this many tokens the blocked GEMM (quant_linear_isa.h's register blocks) beats
// torch's GEMM on dequantized tiles, whose repacking of x for every tile costs most where
// there are few tokens. One layer of SmolLM2 (its 4 linears, 4-bit), AVX2 EPYC, 2
// threads, blocked vs tiled: 16 tokens 0.79 vs 1.20 ms, 32 tokens 1.40 vs 1.84, 80 tokens
// 3.24 vs 3.66, 96 tokens 4.21 vs 4.30 (within noise), 128 tokens 5.52 vs 5.41.
constexpr int64_t kBlockedGemmMaxTokens = 80;
// Up to this many bf16 tokens the blocked GEMM on the bf16 dot products beats the strip
// GEMM, whose dequantization (and transposition into pairs of inputs) is a larger share of
// a strip's work the fewer tokens there are. SmolLM2's 30 layers in turn, AVX512_BF16 EPYC,
// 2 threads, strip vs blocked: 16 tokens 19.1 vs 17.2 ms, 24 24.7 vs 24.1, 32 27.7 vs
// 25.7, 40 33.3 vs 35.1, 48 34.2 vs 36.2, 56 38.3 vs 53.6, 64 42.1 vs 53.1; and vs oneDNN's
// bf16 GEMM on dequantized tiles: 80 49.7 vs 50.7, 128 72.2 vs 72.6, 256 134 vs 139.
constexpr int64_t kBlockedBf16GemmMaxTokens = 32;
// The int8 GEMM's blocks beat both bf16 GEMMs up to here (on SmolLM2's layers, 30 of them
// in turn so that their weights come from memory, as in a model, interleaved runs on an
// AVX512_BF16 EPYC: 16 tokens 13.0 vs 17.6 ms, 32 tokens 20.1 vs 25.4, 64 tokens 35.3 vs
// 48.9); past it `int8_prefills` chooses between it and the strip GEMM.
constexpr int64_t kBlockedInt8GemmMaxTokens = 64;
// Batch-invariant mode: past this many tokens gemv_unpacked beats the GEMV, which unpacks
// W's rows again for each pass of 4 tokens.
constexpr int64_t kUnpackedMinTokens = 4;
// Tasks split W at multiples of the GEMV's 4-row blocks (quant_linear_isa.h).
constexpr int64_t kGemvRowsPerBlock = 4;
// A GEMM tile's dequantized rows (float32) fit in this. The GEMM repacks x for
// every tile, so larger tiles amortize that: 256 KB to 4 MB measured (float32), 1 MB was
// best or within noise.
constexpr int64_t kTileBytes = 1024 * 1024;
constexpr int64_t kTileRowMultiple = 16;  // whole register blocks of the GEMM's columns

// The kernels this CPU runs.
const core_cpu::IsaRegistry<ql::IsaKernels>& isas() {
  static const core_cpu::IsaRegistry<ql::IsaKernels> registry(
      "quant_linear", CORE_ISA_TABLES_WITH_BF16(ql), /*avx2_needs_f16c=*/false);
  return registry;
}

ql::PackedWeight packed_weight(const torch::Tensor& qweight, const torch::Tensor& scales,
                               const torch::Tensor& mins, int64_t bits) {
  TORCH_CHECK(bits == 4 || bits == 8, "quant_linear: bits must be 4 or 8, got ", bits);
  const auto q_dtype = bits == 4 ? torch::kByte : torch::kChar;
  TORCH_CHECK(qweight.device().is_cpu() && qweight.dim() == 2 && qweight.is_contiguous() &&
                  qweight.scalar_type() == q_dtype,
              "quant_linear: qweight must be a contiguous 2-D ", q_dtype, " CPU tensor");
  for (const torch::Tensor* t : {&scales, &mins}) {
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == torch::kFloat && t->is_contiguous(),
                "quant_linear: scales and mins must be contiguous float32 CPU tensors");
  }
  const int64_t n = qweight.size(0), k = qweight.size(1) * 8 / bits;
  TORCH_CHECK(scales.dim() == 2 && scales.size(0) == n && scales.sizes() == mins.sizes(),
              "quant_linear: scales and mins must both be [", n, ", groups]");
  const int64_t groups = scales.size(1), unit = bits == 4 ? 32 : 16;
  TORCH_CHECK(groups > 0 && k % groups == 0 && (k / groups) % unit == 0, "quant_linear: ",
              groups, " groups do not cut ", k, " inputs into groups of a multiple of ", unit);
  return {static_cast<const uint8_t*>(qweight.data_ptr()),  // int8 values read as bytes
          scales.data_ptr<float>(),
          mins.data_ptr<float>(),
          k,
          k / groups,
          qweight.size(1),
          static_cast<int>(bits)};
}

// sums[r, g] = the sum of x[r, g * G .. (g + 1) * G) over the rows of x [rows, k].
CORE_MULTIVERSION void group_sums(const float* x, int64_t rows, int64_t k, int64_t group_size,
                                  float* sums) {
  for (int64_t g = 0; g < rows * k / group_size; ++g) {
    float sum = 0.f;
    for (int64_t i = 0; i < group_size; ++i) sum += x[g * group_size + i];
    sums[g] = sum;
  }
}

// x's rows [rows, k] quantized for the int8 GEMV (quant_linear.h's Int8Activations): xq
// [rows, k], dx [rows, runs] and, where `center` is not 0, shares [rows, groups]. The
// products with 127 / max round to nearest even, as Int8Kernels' do.
CORE_MULTIVERSION void quantize_rows(const float* x, int64_t rows, int64_t k, int64_t group_size,
                                     float center, int8_t* xq, float* dx, float* shares) {
  const int64_t runs = k / ql::kInt8Run, runs_per_group = group_size / ql::kInt8Run;
  for (int64_t run = 0; run < rows * runs; ++run) {
    const float* values = x + run * ql::kInt8Run;
    float max = 0.f, run_sum = 0.f;
    for (int64_t i = 0; i < ql::kInt8Run; ++i) {
      max = std::max(max, std::abs(values[i]));
      run_sum += values[i];
    }
    const float inverse = max > 0.f ? 127.f / max : 0.f;
    int32_t q_sum = 0;
    for (int64_t i = 0; i < ql::kInt8Run; ++i) {
      const auto q = static_cast<int32_t>(std::nearbyint(values[i] * inverse));
      xq[run * ql::kInt8Run + i] = static_cast<int8_t>(q);
      q_sum += q;
    }
    dx[run] = max / 127.f;
    if (center == 0.f) continue;
    float& share = shares[run / runs_per_group];  // runs of one group are adjacent
    if (run % runs_per_group == 0) share = 0.f;
    share += center * (run_sum - dx[run] * static_cast<float>(q_sum));
  }
}

// The GEMV; for batch-invariant mode (`invariant`) its variant that adds the mins' shares
// in a fixed order, and past a few tokens (`unpacked`) that variant's arithmetic with W's
// rows unpacked once for every token (IsaKernels::gemv_unpacked: the same bits); with
// `int8`, the int8 GEMV on x quantized per run.
template <typename T>
void gemv(const ql::IsaKernels& isa, const ql::PackedWeight& w, const torch::Tensor& x,
          torch::Tensor& out, bool invariant = false, bool unpacked = false, bool int8 = false) {
  const int64_t num_tokens = x.size(0), n = out.size(1);
  std::vector<float> x_buffer, sums(num_tokens * w.groups()), out_buffer;
  const float* xf = core_cpu::float_rows<T>(x, x_buffer);
  group_sums(xf, num_tokens, w.k, w.group_size, sums.data());
  float* out_f = core_cpu::float_output<T>(out, out_buffer);
  const ql::Activations a{xf, sums.data(), num_tokens};
  std::vector<int8_t> xq;
  std::vector<float> dx, shares;
  ql::Int8Activations a8{};
  if (int8) {
    const float center = w.bits == 4 ? 8.f : 0.f;  // 4-bit values 0..15 counted from 8
    xq.resize(num_tokens * w.k);
    dx.resize(num_tokens * w.k / ql::kInt8Run);
    shares.resize(center == 0.f ? 0 : num_tokens * w.groups());
    quantize_rows(xf, num_tokens, w.k, w.group_size, center, xq.data(), dx.data(), shares.data());
    a8 = {xq.data(), dx.data(), sums.data(), center == 0.f ? nullptr : shares.data(), num_tokens};
  }
  std::vector<float> sums_by_group;
  if (unpacked) {
    const int64_t groups = w.groups();
    sums_by_group.resize(groups * num_tokens);
    for (int64_t t = 0; t < num_tokens; ++t)
      for (int64_t g = 0; g < groups; ++g) sums_by_group[g * num_tokens + t] = sums[t * groups + g];
  }
  const int64_t num_blocks = (n + kGemvRowsPerBlock - 1) / kGemvRowsPerBlock;
  const int64_t grain = kMacsPerTask / (kGemvRowsPerBlock * w.k * num_tokens) + 1;
  at::parallel_for(0, num_blocks, grain, [&](int64_t begin, int64_t end) {
    const int64_t n0 = begin * kGemvRowsPerBlock, n1 = std::min(end * kGemvRowsPerBlock, n);
    if (unpacked) {
      std::vector<float> q_rows(ql::kUnpackedRowsMax * w.k);
      isa.gemv_unpacked(w, n0, n1, a, sums_by_group.data(), out_f, n, q_rows.data());
    } else if (invariant) {
      isa.gemv_invariant(w, n0, n1, a, out_f, n);
    } else if (int8) {
      isa.int8_gemv(w, n0, n1, a8, out_f, n);
    } else {
      isa.gemv(w, n0, n1, a, out_f, n);
    }
  });
  core_cpu::store_float_output<T>(out_f, out);
}

// The blocked GEMM on the int8 dot products: x (bf16 bits) quantized once, in token blocks.
void multiply_int8(const ql::Int8Kernels& int8, const ql::PackedWeight& w, const uint16_t* x,
                   int64_t num_tokens, float* out, int64_t n) {
  const int64_t num_blocks = (num_tokens + ql::kInt8Block - 1) / ql::kInt8Block;
  const int64_t padded = num_blocks * ql::kInt8Block;
  std::vector<int8_t> packed(padded * w.k);
  const int64_t runs = padded * w.k / ql::kInt8Run;
  std::vector<float> scales(runs), sums(runs);
  std::vector<int32_t> q_sums(runs);
  multiply_blocked<uint8_t>(
      w, num_tokens, ql::kInt8Block,
      [&](int64_t b0, int64_t b1) {
        int8.quantize_tokens(x, num_tokens, w.k, b0, b1, packed.data(), scales.data(),
                             sums.data(), q_sums.data());
      },
      [&](int64_t n0, int64_t n1, uint8_t* rows, float* panel) {
        int8.gemm(w, n0, n1, packed.data(), scales.data(), sums.data(), q_sums.data(),
                  num_tokens, out, n, rows, panel);
      },
      n);
}

// On `int8`'s dot products where given (bfloat16 x, W's groups whole runs of 32), else on
// `bf16`'s where given (bfloat16 x), else in float32.
template <typename T>
void blocked_gemm(const ql::IsaKernels& isa, const ql::Bf16Kernels* bf16,
                  const ql::Int8Kernels* int8, const ql::PackedWeight& w,
                  const torch::Tensor& x, torch::Tensor& out) {
  const int64_t num_tokens = x.size(0), n = out.size(1);
  std::vector<float> x_buffer, out_buffer;
  float* out_f = core_cpu::float_output<T>(out, out_buffer);
  const auto* bits = static_cast<const uint16_t*>(x.data_ptr());
  if (int8 != nullptr) {
    multiply_int8(*int8, w, bits, num_tokens, out_f, n);
  } else if (bf16 != nullptr) {
    multiply_elements(w, bits, num_tokens, isa.token_block, bf16->pack_tokens, bf16->gemm,
                      out_f, n);
  } else {
    const float* xf = core_cpu::float_rows<T>(x, x_buffer);
    multiply_elements(w, xf, num_tokens, isa.token_block, isa.pack_tokens, isa.gemm, out_f, n);
  }
  core_cpu::store_float_output<T>(out_f, out);
}

// The strip GEMM (bfloat16 x on `bf16`'s dot products): each thread takes whole vectors of
// weight rows, evenly split, and multiplies them a strip at a time with every token; from
// W's strips where given (`strips`, pack_strips' layout), else dequantizing each in turn.
void strip_gemm(const ql::Bf16Kernels& bf16, const ql::PackedWeight& w, const torch::Tensor& x,
                torch::Tensor& out, const uint16_t* strips = nullptr) {
  const int64_t num_tokens = x.size(0), n = out.size(1);
  const int64_t units = (n + ql::kStripUnitRows - 1) / ql::kStripUnitRows;
  const int64_t grain = kMacsPerTask / (ql::kStripUnitRows * w.k * num_tokens) + 1;
  const auto* xb = static_cast<const uint16_t*>(x.data_ptr());
  auto* ob = static_cast<uint16_t*>(out.data_ptr());
  at::parallel_for(0, units, grain, [&](int64_t begin, int64_t end) {
    const int64_t n0 = begin * ql::kStripUnitRows, n1 = std::min(end * ql::kStripUnitRows, n);
    if (strips != nullptr) {
      bf16.packed_strip_gemm(strips, w.k, n0, n1, xb, num_tokens, ob, n);
    } else {
      const std::unique_ptr<uint16_t[]> strip(new uint16_t[ql::kStripRows * w.k]);
      bf16.strip_gemm(w, n0, n1, xb, num_tokens, ob, n, strip.get());
    }
  });
}

// The interleaved GEMV (bfloat16 decode rows, W in the interleaved layout at `blocks`):
// threads split W at whole blocks of rows.
void interleaved_gemv(const ql::Bf16Kernels& bf16, const ql::PackedWeight& w,
                      const torch::Tensor& x, torch::Tensor& out, const uint8_t* blocks) {
  const int64_t num_tokens = x.size(0), n = out.size(1);
  std::vector<float> x_buffer, sums(num_tokens * w.groups());
  group_sums(core_cpu::float_rows<at::BFloat16>(x, x_buffer), num_tokens, w.k, w.group_size,
             sums.data());
  const int64_t num_blocks = (n + ql::kInterleavedRows - 1) / ql::kInterleavedRows;
  const int64_t grain = kMacsPerTask / (ql::kInterleavedRows * w.k * num_tokens) + 1;
  const auto* xb = static_cast<const uint16_t*>(x.data_ptr());
  auto* ob = static_cast<uint16_t*>(out.data_ptr());
  at::parallel_for(0, num_blocks, grain, [&](int64_t begin, int64_t end) {
    bf16.interleaved_gemv(blocks, w.k, w.group_size, w.bits, begin * ql::kInterleavedRows,
                          std::min(end * ql::kInterleavedRows, n), xb, sums.data(), num_tokens,
                          ob, n);
  });
}

// Rows per GEMM tile: a tile fits kTileBytes, and the tiles split evenly between the
// threads (at 4 tiles for 2 threads where 3.3 would fit, one thread did half more work).
int64_t tile_rows(int64_t n, int64_t k, int64_t element_size) {
  const int64_t threads = at::get_num_threads();
  const int64_t fit_rows = kTileBytes / (k * element_size);
  const int64_t fit = fit_rows > 0 ? fit_rows : 1;
  const int64_t fitting_tiles = (n + fit - 1) / fit;
  const int64_t num_tiles = (fitting_tiles + threads - 1) / threads * threads;
  const int64_t rows = (n + num_tiles - 1) / num_tiles;
  return (rows + kTileRowMultiple - 1) / kTileRowMultiple * kTileRowMultiple;
}

// In float32: tiles of W multiplied by torch's GEMM.
void tiled_gemm(const ql::IsaKernels& isa, const ql::PackedWeight& w, const torch::Tensor& x,
                torch::Tensor& out) {
  const torch::Tensor xc = x.to(torch::kFloat);  // x itself when float32
  torch::Tensor out_c =
      out.scalar_type() == torch::kFloat ? out : torch::empty_like(out, xc.options());
  const int64_t n = out.size(1);
  const int64_t rows_per_tile = tile_rows(n, w.k, static_cast<int64_t>(xc.element_size()));
  const int64_t num_tiles = (n + rows_per_tile - 1) / rows_per_tile;
  // The worker threads take the caller's thread-local state (inference mode above all:
  // writing into an inference tensor is refused outside it). Inside the parallel region
  // torch's GEMM runs on the calling thread alone.
  const at::ThreadLocalState caller_state;
  at::parallel_for(0, num_tiles, 1, [&](int64_t begin, int64_t end) {
    const at::ThreadLocalStateGuard state_guard(caller_state);
    torch::Tensor tile = torch::empty({rows_per_tile, w.k}, xc.options());
    for (int64_t i = begin; i < end; ++i) {
      const int64_t n0 = i * rows_per_tile;
      const int64_t rows = n - n0 < rows_per_tile ? n - n0 : rows_per_tile;
      isa.dequantize(w, n0, n0 + rows, tile.data_ptr<float>());
      torch::Tensor out_tile = out_c.narrow(1, n0, rows);  // [T, rows], row stride n
      at::mm_out(out_tile, xc, tile.narrow(0, 0, rows).t());
    }
  });
  if (!out_c.is_same(out)) out.copy_(out_c);
}

const std::string kInt8 = "int8";
const std::string kBf16 = "bf16";

// Seconds one run of f takes.
template <typename F>
double seconds(F f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Whether the int8 GEMM multiplies a prefill-sized layer (128 bf16 tokens, 576 -> 1536 in
// 4-bit, SmolLM2's MLP) faster than the strip GEMM on this CPU: best of 3 runs each, the
// two interleaved, ~10 ms once. The data is fixed, not drawn: the caller's random streams
// stay.
bool int8_measures_faster(const ql::IsaKernels& kernels) {
  constexpr int64_t kTokens = 128, kK = 576, kN = 1536, kGroups = kK / 32;
  torch::Tensor qweight = torch::empty({kN, kK / 2}, torch::kByte);
  auto* q = qweight.data_ptr<uint8_t>();
  for (int64_t i = 0; i < qweight.numel(); ++i) q[i] = static_cast<uint8_t>(i * 37 + 11);
  const torch::Tensor scales = torch::full({kN, kGroups}, 0.01f);
  const torch::Tensor mins = torch::full({kN, kGroups}, -0.08f);
  const torch::Tensor x =
      torch::arange(kTokens * kK, torch::kFloat).remainder(7.f).sub(3.f).view({kTokens, kK});
  const torch::Tensor xb = x.to(torch::kBFloat16);
  const ql::PackedWeight w = packed_weight(qweight, scales, mins, 4);
  torch::Tensor out = torch::empty({kTokens, kN}, xb.options());
  double int8_s = 1e30, bf16_s = 1e30;
  for (int round = 0; round < 3; ++round) {
    int8_s = std::min(int8_s, seconds([&] {
      blocked_gemm<at::BFloat16>(kernels, kernels.bf16, kernels.int8, w, xb, out);
    }));
    bf16_s = std::min(bf16_s, seconds([&] { strip_gemm(*kernels.bf16, w, xb, out); }));
  }
  return int8_s < bf16_s;
}

// Whether the int8 GEMM multiplies more than kBlockedInt8GemmMaxTokens bf16 tokens where
// `kernels` has int8 kernels: as `prefill` says ("int8" or "bf16"), or for "" where it
// measured faster (once).
bool int8_prefills(const ql::IsaKernels& kernels, const std::string& prefill) {
  if (!prefill.empty()) return prefill == kInt8;
  // Only the AVX512_BF16 table has int8 kernels: one measurement serves.
  static const bool int8_faster = int8_measures_faster(kernels);
  return int8_faster;
}

// Values W's strips hold: N rounded up to whole strips, times k.
int64_t strips_numel(const ql::PackedWeight& w, int64_t n) {
  return (n + ql::kStripRows - 1) / ql::kStripRows * ql::kStripRows * w.k;
}

// Bytes of W's interleaved layout: N rounded up to whole blocks, each group's record.
int64_t interleaved_bytes(const ql::PackedWeight& w, int64_t n) {
  const int64_t blocks = (n + ql::kInterleavedRows - 1) / ql::kInterleavedRows;
  return blocks * w.groups() * ql::interleaved_group_bytes(w.group_size, w.bits);
}

// The data of `copy`, quant_linear's argument `name`: W in the layout `made_by` makes, of
// `numel` contiguous `dtype` (T) elements.
template <typename T>
const T* checked_copy(const torch::Tensor& copy, const char* name, torch::ScalarType dtype,
                      int64_t numel, const char* made_by) {
  TORCH_CHECK(copy.device().is_cpu() && copy.scalar_type() == dtype && copy.is_contiguous() &&
                  copy.numel() == numel,
              "quant_linear: ", name, " must be a contiguous ", dtype, " CPU tensor of ", numel,
              " elements (", made_by, " of this weight)");
  return static_cast<const T*>(copy.data_ptr());
}

// W in one of the bf16 kernels' layouts (made for `what`): `numel(w, N)` zeroed elements
// of `dtype` (T), filled by `pack(kernels, w, n0, n1, data)` for whole blocks of `block_rows`
// rows in parallel.
template <typename T, typename Numel, typename Pack>
torch::Tensor bf16_layout(const char* what, const torch::Tensor& qweight,
                          const torch::Tensor& scales, const torch::Tensor& mins, int64_t bits,
                          const std::string& isa, torch::ScalarType dtype, int64_t block_rows,
                          Numel numel, Pack pack) {
  const ql::IsaKernels& kernels = isas().choose(isa);
  TORCH_CHECK(kernels.bf16 != nullptr, what, ": ISA ", kernels.name,
              " has no bf16 dot products to multiply its layout with");
  const ql::PackedWeight w = packed_weight(qweight, scales, mins, bits);
  const int64_t n = qweight.size(0);
  torch::Tensor copy = torch::zeros({numel(w, n)}, dtype);
  auto* out = static_cast<T*>(copy.data_ptr());
  const int64_t num_blocks = (n + block_rows - 1) / block_rows;
  at::parallel_for(0, num_blocks, 1, [&](int64_t begin, int64_t end) {
    pack(*kernels.bf16, w, begin * block_rows, std::min(end * block_rows, n), out);
  });
  return copy;
}

}  // namespace

torch::Tensor quant_linear_interleaved(const torch::Tensor& qweight, const torch::Tensor& scales,
                                       const torch::Tensor& mins, int64_t bits,
                                       const std::string& isa) {
  return bf16_layout<uint8_t>(
      "quant_linear_interleaved", qweight, scales, mins, bits, isa, torch::kByte,
      ql::kInterleavedRows, interleaved_bytes,
      [](const ql::Bf16Kernels& bf16, const ql::PackedWeight& w, int64_t n0, int64_t n1,
         uint8_t* out) { bf16.pack_interleaved(w, n0, n1, out); });
}

torch::Tensor quant_linear_strips(const torch::Tensor& qweight, const torch::Tensor& scales,
                                  const torch::Tensor& mins, int64_t bits,
                                  const std::string& isa) {
  return bf16_layout<uint16_t>(
      "quant_linear_strips", qweight, scales, mins, bits, isa, torch::kBFloat16, ql::kStripRows,
      strips_numel,
      [](const ql::Bf16Kernels& bf16, const ql::PackedWeight& w, int64_t n0, int64_t n1,
         uint16_t* out) { bf16.pack_strips(w, n0, n1, out); });
}

torch::Tensor quant_linear(const torch::Tensor& x, const torch::Tensor& qweight,
                           const torch::Tensor& scales, const torch::Tensor& mins, int64_t bits,
                           const std::string& isa, bool int8_x, const std::string& prefill,
                           const c10::optional<torch::Tensor>& strips,
                           const c10::optional<torch::Tensor>& interleaved,
                           bool batch_invariant) {
  const ql::IsaKernels& kernels = isas().choose(isa);
  TORCH_CHECK(!batch_invariant || (!int8_x && !strips.has_value() && !interleaved.has_value()),
              "quant_linear: batch_invariant takes the GEMV alone: not with int8_x, strips or "
              "interleaved");
  TORCH_CHECK(!strips.has_value() || !interleaved.has_value(),
              "quant_linear: one copy of W at a time: strips or interleaved");
  TORCH_CHECK(prefill.empty() || prefill == kInt8 || prefill == kBf16,
              "quant_linear: prefill must be \"int8\", \"bf16\" or \"\", got '", prefill, "'");
  const ql::PackedWeight w = packed_weight(qweight, scales, mins, bits);
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.is_contiguous() && x.size(1) == w.k,
              "quant_linear: x must be a contiguous CPU tensor [T, ", w.k, "]");
  const auto dtype = x.scalar_type();
  TORCH_CHECK(dtype == torch::kFloat || dtype == torch::kBFloat16 || dtype == torch::kHalf,
              "quant_linear: x must be float32, bfloat16 or float16, got ", dtype);
  torch::Tensor out = torch::empty({x.size(0), qweight.size(0)}, x.options());
  if (out.numel() == 0) return out;
  const int64_t num_tokens = x.size(0);
  // bfloat16 x's GEMMs multiply on the ISA's int8 dot products where asked (`int8_x`), it
  // has them and W's groups are whole runs, else on its bf16 dot products where it has them
  // (null: in float32, as the GEMV always does).
  const ql::Bf16Kernels* bf16 = dtype == torch::kBFloat16 ? kernels.bf16 : nullptr;
  const bool whole_runs = w.group_size % ql::kInt8Run == 0;
  const ql::Int8Kernels* int8 = int8_x && bf16 != nullptr && whole_runs ? kernels.int8 : nullptr;
  const int64_t blocked_max = int8 != nullptr   ? kBlockedInt8GemmMaxTokens
                              : bf16 != nullptr ? kBlockedBf16GemmMaxTokens
                                                : kBlockedGemmMaxTokens;
  if (batch_invariant) {
    // The GEMV sums each token's products group by group in one order, whatever the
    // other tokens (quant_linear_isa.h's gemv_block); threads split W's rows only. Past
    // one pass of its tokens, the same sums with each row unpacked once.
    const bool unpacked = num_tokens > kUnpackedMinTokens;
    core_cpu::dispatch_dtype(x, "quant_linear", [&](auto zero) {
      gemv<decltype(zero)>(kernels, w, x, out, /*invariant=*/true, unpacked);
    });
  } else if (interleaved.has_value() && bf16 != nullptr && int8 == nullptr &&
             num_tokens <= kGemvMaxTokens) {
    const uint8_t* blocks = checked_copy<uint8_t>(*interleaved, "interleaved", torch::kByte,
                                                  interleaved_bytes(w, out.size(1)),
                                                  "quant_linear_interleaved");
    interleaved_gemv(*bf16, w, x, out, blocks);
  } else if (strips.has_value() && bf16 != nullptr && int8 == nullptr) {
    strip_gemm(*bf16, w, x, out,
               checked_copy<uint16_t>(*strips, "strips", torch::kBFloat16,
                                      strips_numel(w, out.size(1)), "quant_linear_strips"));
  } else if (num_tokens > blocked_max && (int8 == nullptr || !int8_prefills(kernels, prefill))) {
    if (bf16 != nullptr) {
      strip_gemm(*bf16, w, x, out);
    } else {
      tiled_gemm(kernels, w, x, out);
    }
  } else if (num_tokens > kGemvMaxTokens) {
    core_cpu::dispatch_dtype(x, "quant_linear", [&](auto zero) {
      blocked_gemm<decltype(zero)>(kernels, bf16, int8, w, x, out);
    });
  } else {
    // Decode rows of any dtype take the int8 GEMV where asked and this ISA has one.
    const bool int8_gemv = int8_x && whole_runs && kernels.int8_gemv != nullptr;
    core_cpu::dispatch_dtype(x, "quant_linear", [&](auto zero) {
      gemv<decltype(zero)>(kernels, w, x, out, false, false, int8_gemv);
    });
  }
  return out;
}

std::vector<std::string> quant_linear_isas() { return isas().names(); }

std::string quant_linear_prefill(const std::string& isa) {
  const ql::IsaKernels& kernels = isas().choose(isa);
  return kernels.int8 != nullptr && int8_prefills(kernels, "") ? kInt8 : kBf16;
}

bool quant_linear_has_strips(const std::string& isa) { return isas().choose(isa).bf16 != nullptr; }
