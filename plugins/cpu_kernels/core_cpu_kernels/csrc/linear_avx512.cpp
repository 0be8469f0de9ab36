// core::quant_linear's, core::linear's and core::fp8_linear's AVX-512 kernels (the vector
// type: avx512_vec.h).

#include "dense_linear.h"
#include "fp8_linear.h"
#include "quant_linear.h"

#ifdef CORE_X86_KERNELS

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma")
// GCC 12's widening intrinsics start from _mm512_undefined_epi32() and warn that it "may be
// used uninitialized" (GCC bug 105593, fixed in 13): a false positive in its own header.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "avx512_vec.h"
#include "dense_linear_isa.h"
#include "fp8_linear_isa.h"
#include "quant_linear_isa.h"

namespace core_cpu {

namespace quant_linear {
const IsaKernels kAvx512Kernels =
    isa_kernels<Avx512>("avx512", nullptr, nullptr, &int8_gemv_avx2);
}  // namespace quant_linear

namespace dense_linear {
const IsaKernels kAvx512Kernels{"avx512", &gemv<Avx512>};
}  // namespace dense_linear

namespace fp8_linear {
const IsaKernels kAvx512Kernels = isa_kernels<Avx512>("avx512");
}  // namespace fp8_linear

}  // namespace core_cpu

#pragma GCC pop_options

#endif  // CORE_X86_KERNELS
