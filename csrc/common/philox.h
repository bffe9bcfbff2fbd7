// Philox4x32-10, the counter-based random number generator of Salmon et al. (SC'11, "Parallel
// random numbers: as easy as 1, 2, 3"), for the host and the device.
//
// A counter-based generator is a keyed bijection: its 128 random bits are a pure function of
// (key, counter), so any thread (CPU or GPU) computes them for any item in any order, and a
// sample never depends on the thread count or the device. The sampler uses
//     key     = the 64-bit seed                           (k0 = low word, k1 = high word)
//     counter = (i >> 1, iteration), 64 bits each         (c0, c1 = i >> 1; c2, c3 = iteration)
// and gives words 0-1 to item i when i is even, words 2-3 when it is odd (sampler_math.h).
// Checked against the Random123 known-answer vectors in tests/ops/test_ops_sampler.py.
#pragma once

#include <stdint.h>

#include "common/macros.h"

// Every function of the sampler headers is force-inlined: the CPU kernels vectorise loops over
// items only if the whole per-item computation is inlined into them.
#if defined(__CUDACC__)
#define CLID_SAMPLER_FN __host__ __device__ __forceinline__
#elif defined(__GNUC__)
#define CLID_SAMPLER_FN inline __attribute__((always_inline))
#else
#define CLID_SAMPLER_FN inline
#endif

namespace clid_sampler {

struct Philox4x32 {
    uint32_t v[4];
};

// Multipliers and Weyl key increments of Philox4x32 (from the paper).
constexpr uint32_t PHILOX_M0 = 0xD2511F53u;
constexpr uint32_t PHILOX_M1 = 0xCD9E8D57u;
constexpr uint32_t PHILOX_W0 = 0x9E3779B9u;
constexpr uint32_t PHILOX_W1 = 0xBB67AE85u;

// One round: two 32x32 -> 64-bit products, their halves mixed with the other words and the key.
CLID_SAMPLER_FN void philox_round(uint32_t& c0, uint32_t& c1, uint32_t& c2, uint32_t& c3,
                              uint32_t k0, uint32_t k1) {
    const uint64_t p0 = (uint64_t)PHILOX_M0 * c0;
    const uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
    const uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
    const uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    const uint32_t n0 = hi1 ^ c1 ^ k0;
    const uint32_t n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
}

// Ten rounds; the key is bumped by the Weyl constants between rounds. Written out (no loop) so
// that host compilers vectorise callers' loops over items.
CLID_SAMPLER_FN Philox4x32 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                                     uint32_t k0, uint32_t k1) {
    philox_round(c0, c1, c2, c3, k0, k1);
    philox_round(c0, c1, c2, c3, k0 += PHILOX_W0, k1 += PHILOX_W1);
    philox_round(c0, c1, c2, c3, k0 += PHILOX_W0, k1 += PHILOX_W1);
    philox_round(c0, c1, c2, c3, k0 += PHILOX_W0, k1 += PHILOX_W1);
    philox_round(c0, c1, c2, c3, k0 += PHILOX_W0, k1 += PHILOX_W1);
    philox_round(c0, c1, c2, c3, k0 += PHILOX_W0, k1 += PHILOX_W1);
    philox_round(c0, c1, c2, c3, k0 += PHILOX_W0, k1 += PHILOX_W1);
    philox_round(c0, c1, c2, c3, k0 += PHILOX_W0, k1 += PHILOX_W1);
    philox_round(c0, c1, c2, c3, k0 += PHILOX_W0, k1 += PHILOX_W1);
    philox_round(c0, c1, c2, c3, k0 += PHILOX_W0, k1 += PHILOX_W1);
    Philox4x32 out;
    out.v[0] = c0;
    out.v[1] = c1;
    out.v[2] = c2;
    out.v[3] = c3;
    return out;
}

}  // namespace clid_sampler
