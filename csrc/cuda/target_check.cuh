// check_target: the device-side check of a target index, shared by the CUDA scoring kernels.
#pragma once

// __assert_fail: a device-side assertion even under NDEBUG (the extension's builds define it, and
// <assert.h> declares __assert_fail only without it)
#ifdef NDEBUG
#undef NDEBUG
#include <assert.h>
#define NDEBUG
#else
#include <assert.h>
#endif
#include <stdint.h>
#include <stdio.h>

namespace clid {
namespace cuda {

// Stops the kernel, naming the bad target and its position ([n, t], or [n] when t < 0), when `y` is
// outside [0, V): a device-side assertion, as torch's own index checks on the GPU make (the launch
// fails; the message goes to stderr). The check needs no host synchronisation, at the price of an
// error that ends the CUDA context.
__device__ __forceinline__ void check_target(int64_t y, int64_t V, const char* op, int64_t n, int64_t t) {
    if (y >= 0 && y < V) return;
    if (t >= 0)
        printf("%s: target %lld at position [%lld, %lld] is outside the vocabulary [0, %lld)\n", op, (long long)y,
               (long long)n, (long long)t, (long long)V);
    else
        printf("%s: target %lld at position [%lld] is outside the vocabulary [0, %lld)\n", op, (long long)y,
               (long long)n, (long long)V);
    __assert_fail("target inside the vocabulary", __FILE__, __LINE__, __func__);
}

}  // namespace cuda
}  // namespace clid
