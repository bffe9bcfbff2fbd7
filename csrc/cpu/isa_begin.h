// Opens the instruction set of one compiled copy of the CPU kernels (csrc/cpu/isa.h). A copy's
// file defines CLID_ISA_AVX512 or CLID_ISA_AVX2 (or neither: the portable copy), includes every
// header it needs, then this file, its kernels inside `namespace CLID_ISA`, then isa_end.h.
// Headers come first so that only the kernels themselves, never a function the copies share (a
// library template, an inline helper), are compiled for the wider instruction set.
// The kernels test CLID_HAVE_AVX512 / CLID_HAVE_AVX2 for their intrinsics.
#if defined(CLID_ISA_AVX512)
#define CLID_ISA avx512
#elif defined(CLID_ISA_AVX2)
#define CLID_ISA avx2
#else
#define CLID_ISA base
#endif

#if defined(__x86_64__) && defined(CLID_ISA_AVX512)
#define CLID_HAVE_AVX512 1
#define CLID_HAVE_AVX2 1
#define CLID_ISA_TARGETED 1
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,avx512cd,avx2,fma,bmi,bmi2,popcnt,lzcnt"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512vl,avx512bw,avx512cd,avx2,fma,bmi,bmi2,popcnt,lzcnt")
#pragma GCC target("prefer-vector-width=512")
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12 on the intrinsics' own placeholders
#endif
#elif defined(__x86_64__) && defined(CLID_ISA_AVX2)
#define CLID_HAVE_AVX512 0
#define CLID_HAVE_AVX2 1
#define CLID_ISA_TARGETED 1
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,bmi,bmi2,popcnt,lzcnt"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,bmi,bmi2,popcnt,lzcnt")
#endif
#else  // the portable copy (and, outside x86-64, every copy)
#define CLID_HAVE_AVX512 0
#define CLID_HAVE_AVX2 0
#define CLID_ISA_TARGETED 0
#endif
