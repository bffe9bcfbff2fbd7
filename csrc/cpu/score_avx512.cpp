// The scoring kernels compiled for CPUs with AVX-512 (chosen at run time: csrc/cpu/isa.h).
#define CLID_ISA_AVX512
#include "cpu/score_kernels.h"
