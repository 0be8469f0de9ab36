// core::quant_linear's, core::linear's and core::fp8_linear's portable kernels: plain C++
// the compiler vectorizes for the baseline ISA, for CPUs (or builds) without the x86 paths.
//
// Summed in the source's order: the build's -fassociative-math lets the compiler split a
// sum into partial sums differently in each instantiation (one row or token per pass, or
// four), so a row's result would depend on how many rows came with it (fp8_linear's GEMV
// did, on x86-64's baseline), which batch-invariant mode (core.batch_invariant) forbids.
// The vector ISAs' kernels sum through intrinsics, which the compiler keeps in order.
#pragma GCC optimize("no-associative-math")

#include <cstdint>

#include "dense_linear.h"
#include "dense_linear_isa.h"
#include "fp8.h"
#include "fp8_linear.h"
#include "fp8_linear_isa.h"
#include "quant_linear.h"
#include "quant_linear_isa.h"

namespace core_cpu {
namespace {

struct Scalar {
  using V = float;
  static constexpr int kLanes = 1;

  static CORE_QL_INLINE V zero() { return 0.f; }
  static CORE_QL_INLINE V set1(float f) { return f; }
  static CORE_QL_INLINE V load(const float* p) { return *p; }
  static CORE_QL_INLINE void store(float* p, V v) { *p = v; }
  static CORE_QL_INLINE V fma(V a, V b, V c) { return a * b + c; }
  static CORE_QL_INLINE float fmas(float a, float b, float c) { return fma(a, b, c); }
  static CORE_QL_INLINE V mul(V a, V b) { return a * b; }
  static CORE_QL_INLINE float sum(V v) { return v; }
  static CORE_QL_INLINE V load_bf16(const uint16_t* p) { return dense_linear::bf16_to_float(*p); }
  static CORE_QL_INLINE V load_f16(const uint16_t* p) { return dense_linear::f16_to_float(*p); }
  static CORE_QL_INLINE V load_e4m3(const uint8_t* p) {
    return fp8_value<E4m3, V>(static_cast<uint32_t>(*p));
  }

  template <int BITS>
  static CORE_QL_INLINE void unpack(const uint8_t* unit, V* q) {
    for (int j = 0; j < 16; ++j) {
      if constexpr (BITS == 4) {
        q[j] = static_cast<float>(unit[j] & 0x0F);
        q[j + 16] = static_cast<float>(unit[j] >> 4);
      } else {
        q[j] = static_cast<float>(static_cast<int8_t>(unit[j]));
      }
    }
  }
};

}  // namespace

namespace quant_linear {
const IsaKernels kScalarKernels = isa_kernels<Scalar>("scalar");
}  // namespace quant_linear

namespace dense_linear {
const IsaKernels kScalarKernels{"scalar", &gemv<Scalar>};
}  // namespace dense_linear

namespace fp8_linear {
const IsaKernels kScalarKernels = isa_kernels<Scalar>("scalar");
}  // namespace fp8_linear

}  // namespace core_cpu
