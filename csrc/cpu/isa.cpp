// Run-time choice of the CPU kernels' instruction set (csrc/cpu/isa.h).
#include "cpu/isa.h"

#include <cstdlib>
#include <cstring>

namespace clid {
namespace {

Isa detect() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();  // (the checks include the operating system's support of the registers)
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512cd"))
        return Isa::avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi2"))
        return Isa::avx2;
#endif
    return Isa::base;
}

}  // namespace

Isa cpu_isa() {
    static const Isa best = detect();
    const char* wanted = std::getenv("CLID_CPU_ISA");
    if (wanted == nullptr || *wanted == '\0') return best;
    Isa asked = best;
    if (std::strcmp(wanted, "base") == 0) asked = Isa::base;
    else if (std::strcmp(wanted, "avx2") == 0) asked = Isa::avx2;
    return asked < best ? asked : best;
}

const char* isa_name(Isa isa) {
    switch (isa) {
        case Isa::avx512: return "avx512";
        case Isa::avx2: return "avx2";
        default: return "base";
    }
}

}  // namespace clid
