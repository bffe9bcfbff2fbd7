// Math shared by the CPU and CUDA scoring kernels: the online log-sum-exp state.
//
// A row's log-softmax at the target is   z_y - lse(z),   lse(z) = m + log(s),
// with m = max_v z_v and s = sum_v exp(z_v - m) in [1, V]. Partial states over disjoint parts of
// the row merge exactly like this (the larger maximum wins, the other sum is rescaled):
//     m = max(m1, m2),  s = s1 * exp(m1 - m) + s2 * exp(m2 - m).
// Entries equal to -inf contribute exp(-inf) = 0; a state that has seen only -inf is
// (m = -inf, s = 0) and must not produce -inf - (-inf) = NaN when merged, hence the guards.
// NaN anywhere propagates to the result.
#pragma once

#include <math.h>
#include <stdint.h>

#include "common/macros.h"

namespace clid {

// Element types of the raw-pointer kernels (the binding maps torch dtypes onto these).
enum class DType : int { f32 = 0, f16 = 1, bf16 = 2 };

struct LseState {
    float m;  // running maximum (-inf when empty)
    float s;  // sum of exp(z - m) (0 when empty)
};

CLID_INLINE LseState lse_empty() { return {-INFINITY, 0.0f}; }

// Merge two partial states; the result does not depend on which holds the larger maximum
// beyond the rounding of one multiply-add. Callers merge in a fixed order (determinism).
CLID_INLINE LseState lse_merge(LseState a, LseState b) {
    float m = a.m > b.m ? a.m : b.m;
    if (a.m != a.m || b.m != b.m) return {NAN, NAN};  // NaN propagates
    if (m == -INFINITY) return lse_empty();
    float sa = a.m == -INFINITY ? 0.0f : a.s * expf(a.m - m);
    float sb = b.m == -INFINITY ? 0.0f : b.s * expf(b.m - m);
    return {m, sa + sb};
}

// Add one logit to a state (the per-thread loop of the CUDA kernels): one exp per element, the
// rescale only when the maximum grows. -inf adds nothing; NaN (or +inf twice) makes s NaN.
CLID_INLINE LseState lse_add(LseState st, float x) {
    if (x > st.m) {
        st.s = st.s * expf(st.m - x) + 1.0f;  // st.m = -inf: 0 * 0 + 1
        st.m = x;
    } else if (x != -INFINITY) {
        st.s += expf(x - st.m);
    }
    return st;
}

// log_softmax(z)[y] from the row's state and its target logit z_y. Written as (z_y - m) - log(s):
// z_y - m is exact when both are close (Sterbenz) and log(s) is small, so the result keeps
// full relative precision even for logits of magnitude 1e4. An all -inf row gives NaN (as
// torch.log_softmax does); a -inf target in a finite row gives -inf.
CLID_INLINE float lse_logprob(LseState st, float z_target) {
    return (z_target - st.m) - logf(st.s);
}

}  // namespace clid
