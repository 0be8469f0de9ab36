// The vector ISAs an op with per-ISA kernel tables (dense_linear, quant_linear) can run on
// this CPU, and the choice among them. The CPU is probed once for all such ops; each op
// lists the tables its CPU runs, widest first, and a caller picks one by name ("" for the
// widest), so tests can run every ISA the machine has against the same reference.
//
// Only the ops' torch-side translation units include this header; the ISA translation
// units see x86_kernels.h alone.

#pragma once

#include <c10/util/Exception.h>

#include <string>
#include <vector>

#include "x86_kernels.h"

namespace core_cpu {

// What the x86 tiers need of the CPU (all false in a build without the x86 kernels).
struct CpuFeatures {
  bool avx2_fma = false;  // avx2 and fma
  bool f16c = false;
  bool avx512 = false;  // avx512f, avx512bw and avx512vl
  bool avx512_bf16 = false;
  bool avx512_vnni = false;
};

// The CPU's features, probed at the first call.
inline const CpuFeatures& cpu_features() {
  static const CpuFeatures features = [] {
    CpuFeatures f;
#ifdef CORE_X86_KERNELS
    __builtin_cpu_init();
    f.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    f.f16c = __builtin_cpu_supports("f16c");
    f.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl");
    f.avx512_bf16 = __builtin_cpu_supports("avx512bf16");
    f.avx512_vnni = __builtin_cpu_supports("avx512vnni");
#endif
    return f;
  }();
  return features;
}

// One op's kernel tables: one per x86 vector ISA where this build has them, and the
// portable ones every CPU runs. An op with bf16 dot-product kernels also has an AVX-512
// table for CPUs with AVX512_BF16 (null for the others).
template <typename Kernels>
struct IsaTables {
#ifdef CORE_X86_KERNELS
  const Kernels* avx512;
  const Kernels* avx2;
#endif
  const Kernels* portable;
#ifdef CORE_X86_KERNELS
  const Kernels* avx512_bf16 = nullptr;
#endif
};

// The IsaTables of namespace `ns`, whose tables are named as in dense_linear.h and
// quant_linear.h (kAvx512Kernels, kAvx2Kernels, kScalarKernels; with BF16, also
// kAvx512Bf16Kernels).
#ifdef CORE_X86_KERNELS
#define CORE_ISA_TABLES(ns) {&ns::kAvx512Kernels, &ns::kAvx2Kernels, &ns::kScalarKernels}
#define CORE_ISA_TABLES_WITH_BF16(ns) \
  {&ns::kAvx512Kernels, &ns::kAvx2Kernels, &ns::kScalarKernels, &ns::kAvx512Bf16Kernels}
#else
#define CORE_ISA_TABLES(ns) {&ns::kScalarKernels}
#define CORE_ISA_TABLES_WITH_BF16(ns) {&ns::kScalarKernels}
#endif

// The tables of one op that this CPU runs, widest vector ISA first (the default).
template <typename Kernels>
class IsaRegistry {
 public:
  // `op` names the op in errors. The AVX2 tier needs avx2 and fma, and F16C too where
  // `avx2_needs_f16c`; the AVX-512 tier needs the AVX2 tier's features and AVX-512 F/BW/VL;
  // the AVX512_BF16 tier, the AVX-512 tier's, AVX512_BF16 and AVX512_VNNI (every CPU with
  // the first has the second).
  IsaRegistry(const char* op, const IsaTables<Kernels>& tables, bool avx2_needs_f16c)
      : op_(op) {
#ifdef CORE_X86_KERNELS
    const CpuFeatures& cpu = cpu_features();
    const bool avx2 = cpu.avx2_fma && (cpu.f16c || !avx2_needs_f16c);
    if (avx2 && cpu.avx512 && cpu.avx512_bf16 && cpu.avx512_vnni && tables.avx512_bf16)
      isas_.push_back(tables.avx512_bf16);
    if (avx2 && cpu.avx512) isas_.push_back(tables.avx512);
    if (avx2) isas_.push_back(tables.avx2);
#else
    (void)avx2_needs_f16c;
#endif
    isas_.push_back(tables.portable);
  }

  // The tables named `isa`, or the widest available for "".
  const Kernels& choose(const std::string& isa) const {
    if (isa.empty()) return *isas_.front();
    for (const Kernels* kernels : isas_) {
      if (isa == kernels->name) return *kernels;
    }
    TORCH_CHECK(false, op_, ": isa '", isa, "' is not available on this CPU (see ", op_,
                "_isas())");
  }

  // The names of the tables this CPU runs, widest first.
  std::vector<std::string> names() const {
    std::vector<std::string> names;
    for (const Kernels* kernels : isas_) names.emplace_back(kernels->name);
    return names;
  }

 private:
  const char* op_;
  std::vector<const Kernels*> isas_;
};

}  // namespace core_cpu
