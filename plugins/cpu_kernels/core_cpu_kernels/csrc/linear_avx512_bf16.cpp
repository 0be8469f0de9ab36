// core::quant_linear's kernels for CPUs with AVX512_BF16 (and so AVX512_VNNI): its AVX-512
// float32 kernels, and for bfloat16 activations a blocked GEMM on vdpbf16ps, which
// multiplies 16 lanes of bf16 pairs and adds both products to float32 lanes (twice the
// multiply-adds of a float32 FMA per instruction), and the int8 GEMM on vpdpbusd
// (quant_linear_vnni.h).

#include "quant_linear.h"

#ifdef CORE_X86_KERNELS

#include <cstring>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16,avx512vnni,avx2,fma")
// As in linear_avx512.cpp: GCC 12's false positive in its own widening intrinsics.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "avx512_vec.h"
#include "quant_linear_isa.h"
#include "quant_linear_vnni.h"

namespace core_cpu::quant_linear {
namespace {

// Two adjacent bf16 inputs a step, in one float32 lane (the lower input in the lower half,
// as they lie in memory), multiplied by vdpbf16ps.
struct Bf16Dot {
  using V = __m512;
  using Elem = uint16_t;  // a bfloat16's bits
  using In = __m512i;
  static constexpr int64_t kInputsPerStep = 2;

  static CORE_QL_INLINE In load(const uint16_t* p) { return _mm512_loadu_si512(p); }
  static CORE_QL_INLINE In broadcast(const uint16_t* p) {
    int32_t pair;
    std::memcpy(&pair, p, sizeof pair);
    return _mm512_set1_epi32(pair);
  }
  static CORE_QL_INLINE V madd(In w, In x, V acc) {
    return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(w), reinterpret_cast<__m512bh>(x));
  }
  // Rounded to nearest even, as torch rounds to bfloat16.
  static CORE_QL_INLINE void store(uint16_t* row, int64_t i, V v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(row + i),
                        reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
  }
};

static_assert(kTokenBlock<Avx512> == 2 * Avx512::kLanes, "a token block is 2 vectors");

const Bf16Kernels kBf16{&dequantize<Avx512, Bf16Dot>, &pack_tokens<Avx512, Bf16Dot>,
                        &gemm<Avx512, Bf16Dot>};

const Int8Kernels kInt8{&quantize_tokens, &int8_gemm};

}  // namespace

const IsaKernels kAvx512Bf16Kernels = isa_kernels<Avx512>("avx512_bf16", &kBf16, &kInt8);

}  // namespace core_cpu::quant_linear

#pragma GCC pop_options

#endif  // CORE_X86_KERNELS
