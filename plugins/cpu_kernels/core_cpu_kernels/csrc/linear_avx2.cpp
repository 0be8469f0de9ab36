// core::quant_linear's, core::linear's and core::fp8_linear's AVX2 + FMA kernels: 8 float32
// lanes. A run's 16 bytes are widened 8 at a time into 32-bit lanes (vpmovzxbd), and the
// nibbles masked and shifted out there; so are FP8 bytes, then converted by fp8.h. The
// int8 GEMV (quant_linear_int8_gemv.h) serves this table and the wider ones.

#include "dense_linear.h"
#include "fp8_linear.h"
#include "quant_linear.h"

#ifdef CORE_X86_KERNELS

#include <immintrin.h>

#include <cstdint>

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

#include "dense_linear_isa.h"
#include "fp8.h"
#include "fp8_linear_isa.h"
#include "quant_linear_isa.h"
#include "quant_linear_int8_gemv.h"

namespace core_cpu {
namespace {

struct Avx2 {
  using V = __m256;
  static constexpr int kLanes = 8;

  static CORE_QL_INLINE V zero() { return _mm256_setzero_ps(); }
  static CORE_QL_INLINE V set1(float f) { return _mm256_set1_ps(f); }
  static CORE_QL_INLINE V load(const float* p) { return _mm256_loadu_ps(p); }
  static CORE_QL_INLINE void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static CORE_QL_INLINE V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static CORE_QL_INLINE float fmas(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
  static CORE_QL_INLINE V mul(V a, V b) { return _mm256_mul_ps(a, b); }

  using Bits = uint32_t __attribute__((vector_size(32)));
  static CORE_QL_INLINE V load_e4m3(const uint8_t* p) {
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return fp8_value<E4m3, V>(reinterpret_cast<Bits>(_mm256_cvtepu8_epi32(bytes)));
  }

  // 16-bit weights widened to 32-bit lanes: bf16 is a float32's top half; fp16 by F16C.
  static CORE_QL_INLINE V load_bf16(const uint16_t* p) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
  static CORE_QL_INLINE V load_f16(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }

  static CORE_QL_INLINE float sum(V v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
  }

  // Widening first and masking after lets the widening load straight from memory: no
  // shuffle to bring the upper 8 bytes down, and 2 widenings per run instead of 4.
  template <int BITS>
  static CORE_QL_INLINE void unpack(const uint8_t* unit, V* q) {
    const __m128i first = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(unit));
    const __m128i second = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(unit + 8));
    if constexpr (BITS == 4) {
      const __m256i bytes_0_7 = _mm256_cvtepu8_epi32(first);
      const __m256i bytes_8_15 = _mm256_cvtepu8_epi32(second);
      const __m256i mask = _mm256_set1_epi32(0x0F);
      q[0] = _mm256_cvtepi32_ps(_mm256_and_si256(bytes_0_7, mask));   // values 0..7
      q[1] = _mm256_cvtepi32_ps(_mm256_and_si256(bytes_8_15, mask));  // values 8..15
      q[2] = _mm256_cvtepi32_ps(_mm256_srli_epi32(bytes_0_7, 4));     // values 16..23
      q[3] = _mm256_cvtepi32_ps(_mm256_srli_epi32(bytes_8_15, 4));    // values 24..31
    } else {
      q[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(first));
      q[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(second));
    }
  }
};

}  // namespace

namespace quant_linear {
void int8_gemv_avx2(const PackedWeight& w, int64_t n0, int64_t n1, const Int8Activations& a,
                    float* out, int64_t ldo) {
  int8_gemv<Avx2>(w, n0, n1, a, out, ldo);
}

const IsaKernels kAvx2Kernels = isa_kernels<Avx2>("avx2", nullptr, nullptr, &int8_gemv_avx2);
}  // namespace quant_linear

namespace dense_linear {
const IsaKernels kAvx2Kernels{"avx2", &gemv<Avx2>};
}  // namespace dense_linear

namespace fp8_linear {
const IsaKernels kAvx2Kernels = isa_kernels<Avx2>("avx2");
}  // namespace fp8_linear

}  // namespace core_cpu

#pragma GCC pop_options

#endif  // CORE_X86_KERNELS
