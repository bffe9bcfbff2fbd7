// The sampler kernels compiled for CPUs with AVX2 (chosen at run time: csrc/cpu/isa.h).
#define CLID_ISA_AVX2
#include "cpu/sampler_kernels.h"
