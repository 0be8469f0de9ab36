// Whether this build compiles the x86 vector kernels (linear_avx2.cpp, linear_avx512.cpp):
// one guard for dense_linear's and quant_linear's, which are built and probed together. No
// torch header here, for the reason quant_linear.h gives.

#pragma once

// The x86 kernels need GCC's `#pragma GCC target` (clang spells it differently).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CORE_X86_KERNELS 1
#endif
