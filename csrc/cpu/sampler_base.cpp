// The sampler kernels compiled for any CPU (the portable copy; csrc/cpu/isa.h).
#include "cpu/sampler_kernels.h"
