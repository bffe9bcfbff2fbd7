// The per-item math of the smooth-step sampler, shared bit for bit by the CPU and CUDA kernels.
//
// Weight of item i (docs/method.md, step 6):   f(u) = 0.5 * (1 + tanh((u - T) / s))
// which is computed in the equivalent form f = 1 / (1 + exp(-2 (u - T) / s)): the denominator
// D = 1 / f = 1 + exp(y), y = (u - T) * c with c = -2 / s, is what the kernels use. Unlike
// 0.5 * (1 + tanh(.)) it does not round to 0 when tanh rounds to -1 (at (u - T) / s < -9.0 in
// float32, < -19.1 in float64): a weight is zero only when y > 700, i.e. u < T - 350 s.
//   s = 0   ("hard" schedule): c = -inf, f = 1 above T, 0 below, 1/2 at u == T.
//   s = inf ("constant" schedule): f = 1/2 for every item (also u = +-inf).
//   u == T gives f = 1/2 exactly whatever s (also u = T = +-inf).
//
// Successive sampling (numpy.random.choice(M, k, replace=False, p=f/sum f)) by exponential keys
// (Efraimidis & Spirakis 2006): key_i = E_i / f_i = E_i * D_i with E_i ~ Exp(1); the k smallest keys
// are a successive sample. E_i = -log(U_i), U_i = 1 - j_i 2^-52, with j_i the 52 random bits of
// item i from Philox4x32-10 (see item_bits52). Bernoulli mode keeps item i iff V_i < f_i,
// V_i = j_i 2^-52.
//
// Bitwise reproducibility: every function below uses only +, -, *, / (each correctly rounded by
// IEEE 754), comparisons and integer bit manipulation; no fma, no libm. The host compiler must not
// contract a*b+c into an fma: GCC does so by default (even with -std=c++20), so the CPU kernels'
// file turns contraction off (#pragma GCC optimize("fp-contract=off")); on the device every
// operation is an explicit round-to-nearest intrinsic (__dmul_rn, ...), which nvcc never
// contracts. The NumPy reference in clid/selection/reference.py runs the same operations in the same order, and
// tests/ops/test_ops_sampler.py checks the CPU keys against it bit for bit.
#pragma once

#include <stdint.h>
#if !defined(__CUDA_ARCH__)
#include <string.h>
#endif

#include "common/macros.h"
#include "common/philox.h"

namespace clid_sampler {

// ---------------------------------------------------------------------------------------------
// Correctly rounded IEEE double operations that no compiler fuses.

CLID_SAMPLER_FN double d_add(double a, double b) {
#if defined(__CUDA_ARCH__)
    return __dadd_rn(a, b);
#else
    return a + b;
#endif
}
CLID_SAMPLER_FN double d_sub(double a, double b) {
#if defined(__CUDA_ARCH__)
    return __dsub_rn(a, b);
#else
    return a - b;
#endif
}
CLID_SAMPLER_FN double d_mul(double a, double b) {
#if defined(__CUDA_ARCH__)
    return __dmul_rn(a, b);
#else
    return a * b;
#endif
}
CLID_SAMPLER_FN double d_div(double a, double b) {
#if defined(__CUDA_ARCH__)
    return __ddiv_rn(a, b);
#else
    return a / b;
#endif
}

CLID_SAMPLER_FN uint64_t bits_of(double x) {
#if defined(__CUDA_ARCH__)
    return (uint64_t)__double_as_longlong(x);
#else
    uint64_t b;
    memcpy(&b, &x, sizeof b);
    return b;
#endif
}
CLID_SAMPLER_FN double double_of(uint64_t b) {
#if defined(__CUDA_ARCH__)
    return __longlong_as_double((long long)b);
#else
    double x;
    memcpy(&x, &b, sizeof x);
    return x;
#endif
}
CLID_SAMPLER_FN uint32_t bits_of(float x) {
#if defined(__CUDA_ARCH__)
    return (uint32_t)__float_as_uint(x);
#else
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    return b;
#endif
}
CLID_SAMPLER_FN float float_of(uint32_t b) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(b);
#else
    float x;
    memcpy(&x, &b, sizeof x);
    return x;
#endif
}

// (double)e for an integer |e| < 2^40, exactly: 2^52 + 2^40 + e is a double whose low mantissa
// bits hold 2^40 + e, and subtracting 2^52 + 2^40 is exact. Unlike an int64 -> double conversion,
// which x86 has only with AVX-512, this vectorises on every CPU.
CLID_SAMPLER_FN double small_int_to_double(int64_t e) {
    return d_sub(double_of(0x4330000000000000ull + ((uint64_t)1 << 40) + (uint64_t)e), 0x1.001p52);
}

// ---------------------------------------------------------------------------------------------
// Order-preserving integer keys: a < b as floats (with -0.0 < +0.0) iff ord(a) < ord(b) as
// unsigned integers. Negative numbers have all bits flipped, non-negative ones the sign bit set.
// NaN has no place in the order; callers reject it first.

CLID_SAMPLER_FN uint32_t ord_key(float x) {
    const uint32_t b = bits_of(x);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
CLID_SAMPLER_FN uint64_t ord_key(double x) {
    const uint64_t b = bits_of(x);
    return (b & 0x8000000000000000ull) ? ~b : (b | 0x8000000000000000ull);
}
CLID_SAMPLER_FN float from_ord_key(uint32_t k) {
    return float_of((k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k);
}
CLID_SAMPLER_FN double from_ord_key(uint64_t k) {
    return double_of((k & 0x8000000000000000ull) ? (k & 0x7FFFFFFFFFFFFFFFull) : ~k);
}

// ---------------------------------------------------------------------------------------------
// Constants (hex literals, so every compiler reads the same doubles).

constexpr double SM_LN2_HI = 0x1.62e42fee00000p-1;   // ln 2 to 32 bits: n * LN2_HI is exact
constexpr double SM_LN2_LO = 0x1.a39ef35793c76p-33;  // ln 2 - LN2_HI
constexpr double SM_INV_LN2 = 0x1.71547652b82fep+0;
constexpr double SM_SHIFTER = 0x1.8p52;              // adding it rounds to an integer
constexpr double SM_SQRT2 = 0x1.6a09e667f3bcdp+0;
constexpr double SM_Y_MAX = 700.0;   // exp(y) beyond: the weight is zero
constexpr double SM_Y_MIN = -40.0;   // exp(y) below: 1 + exp(y) rounds to 1
constexpr uint64_t SM_ZERO_WEIGHT_KEY = 0x7FF0000000000000ull;  // bits of +inf

// 1 + exp(y) for y in [SM_Y_MIN, SM_Y_MAX]. y = n ln2 + r with |r| <= ln2 / 2 (Cody-Waite),
// exp(r) - 1 by its Taylor series to r^12 (truncation < 2^-52 relative), times 2^n built in the
// exponent bits. Relative error a few units in the last place.
CLID_SAMPLER_FN double one_plus_exp(double y) {
    const double t = d_add(d_mul(y, SM_INV_LN2), SM_SHIFTER);
    const double n = d_sub(t, SM_SHIFTER);
    const double r = d_sub(d_sub(y, d_mul(n, SM_LN2_HI)), d_mul(n, SM_LN2_LO));
    // q(r) = sum_{j=2..12} r^(j-2) / j!, by Estrin's scheme (short dependency chains).
    const double r2 = d_mul(r, r);
    const double r4 = d_mul(r2, r2);
    const double r8 = d_mul(r4, r4);
    const double p0 = d_add(0.5, d_mul(r, 0x1.5555555555555p-3));                 // 1/2!, 1/3!
    const double p1 = d_add(0x1.5555555555555p-5, d_mul(r, 0x1.1111111111111p-7));  // 1/4!, 1/5!
    const double p2 = d_add(0x1.6c16c16c16c17p-10, d_mul(r, 0x1.a01a01a01a01ap-13)); // 1/6!, 1/7!
    const double p3 = d_add(0x1.a01a01a01a01ap-16, d_mul(r, 0x1.71de3a556c734p-19)); // 1/8!, 1/9!
    const double p4 = d_add(0x1.27e4fb7789f5cp-22, d_mul(r, 0x1.ae64567f544e4p-26)); // 1/10!, 1/11!
    const double p5 = 0x1.1eed8eff8d898p-29;                                          // 1/12!
    const double q0 = d_add(p0, d_mul(r2, p1));
    const double q1 = d_add(p2, d_mul(r2, p3));
    const double q2 = d_add(p4, d_mul(r2, p5));
    const double q = d_add(d_add(q0, d_mul(r4, q1)), d_mul(r8, q2));
    const double expm1_r = d_add(r, d_mul(d_mul(r, r), q));
    // n lives in the low bits of t; 2^n = (n + 1023) << 52, n in [-58, 1010] here.
    const uint64_t n_bits = bits_of(t) - bits_of(SM_SHIFTER);
    const double scale = double_of((n_bits + 1023ull) << 52);
    return d_add(1.0, d_add(scale, d_mul(scale, expm1_r)));
}

// E = -log(U), U = 1 - j 2^-52 in (0, 1], for a 52-bit integer j: an Exp(1) variate in [0, 36.04].
// U = 2^e m with m in (sqrt(1/2), sqrt(2)]; log m = 2 atanh(s), s = (m-1)/(m+1), by its series
// to s^19 (truncation < 2^-55 relative).
CLID_SAMPLER_FN double exponential_from_bits(uint64_t j52) {
    const double d = double_of(0x3FF0000000000000ull | j52);  // 1 + j 2^-52, exact
    const double u = d_sub(2.0, d);                             // 1 - j 2^-52, exact
    const uint64_t ub = bits_of(u);
    int64_t e = (int64_t)(ub >> 52) - 1023;
    double m = double_of((ub & 0x000FFFFFFFFFFFFFull) | 0x3FF0000000000000ull);  // [1, 2)
    const bool high = m > SM_SQRT2;
    m = high ? d_mul(m, 0.5) : m;
    e = high ? e + 1 : e;
    const double f = d_sub(m, 1.0);  // exact
    const double s = d_div(f, d_add(2.0, f));
    const double z = d_mul(s, s);
    // p(z) = sum_{j=1..9} z^j / (2j+1), by Estrin's scheme.
    const double z2 = d_mul(z, z);
    const double z4 = d_mul(z2, z2);
    const double z8 = d_mul(z4, z4);
    const double a0 = d_add(0x1.5555555555555p-2, d_mul(z, 0x1.999999999999ap-3));  // 1/3, 1/5
    const double a1 = d_add(0x1.2492492492492p-3, d_mul(z, 0x1.c71c71c71c71cp-4));  // 1/7, 1/9
    const double a2 = d_add(0x1.745d1745d1746p-4, d_mul(z, 0x1.3b13b13b13b14p-4));  // 1/11, 1/13
    const double a3 = d_add(0x1.1111111111111p-4, d_mul(z, 0x1.e1e1e1e1e1e1ep-5));  // 1/15, 1/17
    const double a4 = 0x1.af286bca1af28p-5;                                           // 1/19
    const double b0 = d_add(a0, d_mul(z2, a1));
    const double b1 = d_add(a2, d_mul(z2, a3));
    const double p = d_mul(z, d_add(d_add(b0, d_mul(z4, b1)), d_mul(z8, a4)));
    const double two_s = d_add(s, s);
    const double log_m = d_add(two_s, d_mul(two_s, p));
    const double ed = small_int_to_double(e);  // exact, |e| <= 52
    const double log_u = d_add(d_mul(ed, SM_LN2_HI), d_add(d_mul(ed, SM_LN2_LO), log_m));
    return d_sub(0.0, log_u);
}

// ---------------------------------------------------------------------------------------------
// Weights and keys of one item.

struct WeightParams {
    double threshold;  // T
    double slope;      // c = -2 / s (computed once on the host): -inf for s = 0
    int constant;      // 1 for s = inf: every weight 1/2
};

struct RngParams {
    uint32_t k0, k1;  // seed, low and high word
    uint32_t c2, c3;  // iteration, low and high word
};

CLID_SAMPLER_FN RngParams make_rng_params(uint64_t seed, uint64_t iteration) {
    RngParams r;
    r.k0 = (uint32_t)seed;
    r.k1 = (uint32_t)(seed >> 32);
    r.c2 = (uint32_t)iteration;
    r.c3 = (uint32_t)(iteration >> 32);
    return r;
}

// D = 1 / f(u) = 1 + exp((u - T) * c), +inf for a zero weight. Branch-free for vectorisation.
CLID_SAMPLER_FN double weight_denominator(double u, const WeightParams& w) {
    const double y = d_mul(d_sub(u, w.threshold), w.slope);  // NaN only when u == T (handled)
    const double y_safe = (y >= SM_Y_MIN && y <= SM_Y_MAX) ? y : 0.0;
    const double smooth = one_plus_exp(y_safe);
    const double inf = double_of(SM_ZERO_WEIGHT_KEY);
    double den = y > SM_Y_MAX ? inf : (y < SM_Y_MIN ? 1.0 : smooth);
    den = (u == w.threshold || w.constant) ? 2.0 : den;
    return den;
}

// The 52 random bits of item i: one Philox block serves two items, counter (i >> 1, iteration)
// under key seed; words 0 and 1 go to the even item, words 2 and 3 to the odd one (their top 52
// of 64 bits).
CLID_SAMPLER_FN Philox4x32 philox_pair_block(uint64_t pair, const RngParams& r) {
    return philox4x32_10((uint32_t)pair, (uint32_t)(pair >> 32), r.c2, r.c3, r.k0, r.k1);
}
CLID_SAMPLER_FN uint64_t top52(uint32_t hi, uint32_t lo) {
    return ((((uint64_t)hi) << 32) | lo) >> 12;
}
CLID_SAMPLER_FN uint64_t item_bits52(const Philox4x32& x, bool odd) {
    return odd ? top52(x.v[2], x.v[3]) : top52(x.v[0], x.v[1]);
}
CLID_SAMPLER_FN uint64_t item_bits52(uint64_t index, const RngParams& r) {
    return item_bits52(philox_pair_block(index >> 1, r), (index & 1) != 0);
}

// Exponential key E / f as the bits of a non-negative double (so unsigned order = numeric order);
// SM_ZERO_WEIGHT_KEY (the bits of +inf) for a zero weight.
CLID_SAMPLER_FN uint64_t successive_key_from_bits(double u, uint64_t bits52, const WeightParams& w) {
    const double den = weight_denominator(u, w);
    const double e = exponential_from_bits(bits52);
    // E * D <= 36.04 * (1 + e^700) is finite for a positive weight; a zero weight gives +inf, or
    // NaN when E = 0, and the bits of either are >= SM_ZERO_WEIGHT_KEY as unsigned integers.
    const uint64_t key = bits_of(d_mul(e, den));
    return key < SM_ZERO_WEIGHT_KEY ? key : SM_ZERO_WEIGHT_KEY;
}
CLID_SAMPLER_FN uint64_t successive_key(double u, uint64_t index, const WeightParams& w, const RngParams& r) {
    return successive_key_from_bits(u, item_bits52(index, r), w);
}

// Bernoulli mode: keep the item iff V < f, V = j 2^-52 uniform on [0, 1) (the item's 52 bits).
CLID_SAMPLER_FN bool bernoulli_keep_from_bits(double u, uint64_t bits52, const WeightParams& w) {
    const double den = weight_denominator(u, w);
    const double v = d_sub(double_of(0x3FF0000000000000ull | bits52), 1.0);  // exact
    return v < d_div(1.0, den);
}
CLID_SAMPLER_FN bool bernoulli_keep(double u, uint64_t index, const WeightParams& w, const RngParams& r) {
    return bernoulli_keep_from_bits(u, item_bits52(index, r), w);
}

// Key of the fallback fill (fewer than k positive weights): every positive weight first (key 0),
// then by descending u (the bitwise complement of its order key, never 0), ties by index.
template <typename T>
CLID_SAMPLER_FN uint64_t fill_key(T u, const WeightParams& w) {
    const bool zero = weight_denominator((double)u, w) == double_of(SM_ZERO_WEIGHT_KEY);
    return zero ? (uint64_t)(~ord_key(u)) : 0ull;
}

}  // namespace clid_sampler
