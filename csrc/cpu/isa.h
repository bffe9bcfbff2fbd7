// The instruction sets of the CPU kernels, chosen at run time.
//
// The extension is compiled for any CPU of its architecture (no -march=native). The hot loops
// (csrc/cpu/score_kernels.h, csrc/cpu/sampler_kernels.h) are compiled once per instruction set,
// each copy in a namespace of its own (base, avx2, avx512) and a file of its own
// (score_avx512.cpp, ...; see csrc/cpu/isa_begin.h), and each call runs the best copy this CPU
// supports. CLID_CPU_ISA=base|avx2|avx512 asks for a lower one (the tests run every copy).
// Outside x86-64 every copy is the portable one.
#pragma once

namespace clid {

enum class Isa : int { base = 0, avx2 = 1, avx512 = 2 };

// The best instruction set of this CPU, lowered by CLID_CPU_ISA when set.
Isa cpu_isa();
const char* isa_name(Isa isa);

}  // namespace clid

// `return NS::CALL` for the namespace NS (base, avx2 or avx512) of the chosen instruction set.
#define CLID_ISA_DISPATCH(CALL)                           \
    switch (::clid::cpu_isa()) {                          \
        case ::clid::Isa::avx512: return avx512::CALL;    \
        case ::clid::Isa::avx2: return avx2::CALL;        \
        default: return base::CALL;                       \
    }
