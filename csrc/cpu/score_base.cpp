// The scoring kernels compiled for any CPU (the portable copy; csrc/cpu/isa.h).
#include "cpu/score_kernels.h"
