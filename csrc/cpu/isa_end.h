// Closes the instruction set opened by csrc/cpu/isa_begin.h.
#if CLID_ISA_TARGETED
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#if CLID_HAVE_AVX512
#pragma GCC diagnostic pop
#endif
#endif
#endif
#undef CLID_ISA
#undef CLID_HAVE_AVX512
#undef CLID_HAVE_AVX2
#undef CLID_ISA_TARGETED
