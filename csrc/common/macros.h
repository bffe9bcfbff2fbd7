// Qualifiers shared by the CPU and CUDA builds of the header-only math in csrc/common/.
//
//   CLID_HD      __host__ __device__ under nvcc, nothing under the host compiler
//   CLID_INLINE  CLID_HD inline (use for every function defined in a common header)
//
// Headers in csrc/common/ must not include torch: nvcc compile-checks them on machines whose
// PyTorch is a CPU build (csrc/check_cuda.sh).
#pragma once

#if defined(__CUDACC__)
#define CLID_HD __host__ __device__
#else
#define CLID_HD
#endif

#define CLID_INLINE CLID_HD inline
