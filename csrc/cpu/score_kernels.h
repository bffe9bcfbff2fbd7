// CPU kernels of the fused Eq. 2 scoring (contracts in csrc/common/score_ops.h), compiled once per
// instruction set: csrc/cpu/score_{base,avx2,avx512}.cpp include this file, and csrc/cpu/score.cpp
// calls the copy this CPU runs best (csrc/cpu/isa.h).
//
// The log-sum-exp of a row is taken in one read: the row streams through in chunks of
// kChunk vectors; each chunk's lane-wise maximum updates the running maximum M (rescaling the
// running sum S once per chunk), then exp(z - M) of the chunk, still in L1, is added to S.
// Vectors are GCC vector extensions (16 floats), which compile to AVX-512, AVX2 or NEON.
// The exponential is a degree-7 polynomial after range reduction (about 1 ulp for z - M <= 0).
#include <ATen/core/Tensor.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/mm.h>
#include <omp.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/score_ops.h"
#include "cpu/isa_begin.h"

namespace clid {
namespace cpu {
namespace CLID_ISA {
namespace {

constexpr int kW = 16;     // floats per vector
constexpr int kChunk = 8;  // vectors per chunk (512 bytes of fp32 logits); add() sums 8 pairwise
constexpr int kPrefetch = 1024;  // elements ahead

typedef float vf __attribute__((vector_size(kW * sizeof(float))));
typedef int32_t vi __attribute__((vector_size(kW * sizeof(int32_t))));
typedef uint32_t vu __attribute__((vector_size(kW * sizeof(uint32_t))));
typedef uint16_t vu16 __attribute__((vector_size(kW * sizeof(uint16_t))));
typedef _Float16 vh __attribute__((vector_size(kW * sizeof(_Float16))));

inline vf splat(float x) { return vf{} + x; }
inline vf vmax(vf a, vf b) { return a > b ? a : b; }

// 16 consecutive elements as float32.
inline vf load(const float* p) { vf x; std::memcpy(&x, p, sizeof x); return x; }
inline vf load(const at::Half* p) { vh x; std::memcpy(&x, p, sizeof x); return __builtin_convertvector(x, vf); }
inline vf load(const at::BFloat16* p) {
    vu16 x; std::memcpy(&x, p, sizeof x);
    vu wide = __builtin_convertvector(x, vu) << 16;  // bfloat16 is the high half of a float32
    vf out; std::memcpy(&out, &wide, sizeof out); return out;
}
inline float load1(const float* p) { return *p; }
inline float load1(const at::Half* p) { return static_cast<float>(*p); }
inline float load1(const at::BFloat16* p) { return static_cast<float>(*p); }

// The first n < kW elements, the rest filled with -inf (which adds exp(-inf) = 0).
template <typename T>
inline vf load_partial(const T* p, int n) {
    alignas(64) float tmp[kW];
    for (int i = 0; i < kW; ++i) tmp[i] = i < n ? load1(p + i) : -INFINITY;
    return load(tmp);
}

// exp(x) for x <= 0 (also -inf and NaN): x = n ln2 + r with n = round(x / ln2), |r| <= ln2/2
// (Cody-Waite split of ln2), exp(r) by its Taylor polynomial of degree 7 (truncation error
// r^8/8! < 3e-9 relative, below float32 resolution), times 2^n.
#if CLID_HAVE_AVX512
// AVX-512: round with vrndscaleps and scale with vscalefps, which underflows to 0 by itself.
inline vf vexp(vf xv) {
    __m512 x = _mm512_max_ps(_mm512_set1_ps(-104.0f), (__m512)xv);  // -inf -> -104; NaN kept (2nd operand)
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return (vf)_mm512_scalef_ps(p, n);  // p * 2^n; 0 below the denormal range
}
#else
// Portable vectors: round with the 1.5 * 2^23 trick, scale through the exponent bits; below
// -87.33 (2^-126) flush to 0, which next to the row maximum's exp(0) = 1 is below resolution.
inline vf vexp(vf x) {
    const vf lo = splat(-87.33654475f);
    vf xc = x < lo ? lo : x;                      // NaN stays NaN
    const vf magic = splat(12582912.0f);
    vf n = (xc * splat(1.44269504088896341f) + magic) - magic;
    vf r = xc - n * splat(0.693359375f);
    r = r - n * splat(-2.12194440e-4f);
    vf p = splat(1.0f / 5040);
    p = p * r + splat(1.0f / 720);
    p = p * r + splat(1.0f / 120);
    p = p * r + splat(1.0f / 24);
    p = p * r + splat(1.0f / 6);
    p = p * r + splat(0.5f);
    p = p * r + splat(1.0f);
    p = p * r + splat(1.0f);
    vi bits = (__builtin_convertvector(n, vi) + 127) << 23;
    vf scale; std::memcpy(&scale, &bits, sizeof scale);
    vf y = p * scale;
    return x < lo ? splat(0.0f) : y;
}
#endif

// True if a > b in some lane (false for NaN lanes: a NaN maximum makes the sum NaN anyway).
inline bool any_greater(vf a, vf b) {
#if CLID_HAVE_AVX512
    return _mm512_cmp_ps_mask((__m512)a, (__m512)b, _CMP_GT_OQ) != 0;
#else
    vi gt = a > b;
    int32_t lanes[kW];
    std::memcpy(lanes, &gt, sizeof lanes);
    int32_t any = 0;
    for (int i = 0; i < kW; ++i) any |= lanes[i];
    return any != 0;
#endif
}

// Lane-wise online state: M the maximum seen by each lane, S the sum of exp(z - M).
struct VecState {
    vf M = splat(-INFINITY);
    vf S = splat(0.0f);

    // Add n (1 or kChunk) vectors whose lane-wise maximum is cm. The running sum is rescaled
    // only when some lane's maximum grows, which after the first chunks of a row is rare.
    inline void add(const vf* x, int n, vf cm) {
        vf newM = vmax(M, cm);
        vf ref = newM == splat(-INFINITY) ? splat(0.0f) : newM;  // avoid -inf - -inf
        vf sum;
        if (n == kChunk) {  // pairwise: shallow rounding, short dependency chains
            vf e[kChunk];
            for (int k = 0; k < kChunk; ++k) e[k] = vexp(x[k] - ref);
            sum = ((e[0] + e[1]) + (e[2] + e[3])) + ((e[4] + e[5]) + (e[6] + e[7]));
        } else {
            sum = vexp(x[0] - ref);
            for (int k = 1; k < n; ++k) sum += vexp(x[k] - ref);
        }
        if (any_greater(newM, M)) S = S * vexp(M - ref);
        S += sum;
        M = newM;
    }

    // Fold the lanes, in lane order, into one state.
    inline LseState finish() const {
        alignas(64) float m[kW], s[kW];
        std::memcpy(m, &M, sizeof m);
        std::memcpy(s, &S, sizeof s);
        LseState st = lse_empty();
        for (int i = 0; i < kW; ++i) st = lse_merge(st, LseState{m[i], s[i]});
        return st;
    }
};

// The log-sum-exp state of one row of V logits, read once.
template <typename T>
LseState row_state(const T* z, int64_t V) {
    VecState st;
    int64_t i = 0;
    vf x[kChunk];
    for (; i + kChunk * kW <= V; i += kChunk * kW) {
        // Software prefetch 1024 elements ahead (every cache line of the chunk): the exps keep the
        // core busy long enough that the hardware prefetcher alone leaves the stream idle.
        for (int k = 0; k < kChunk; ++k) __builtin_prefetch(z + i + kPrefetch + k * kW);
        for (int k = 0; k < kChunk; ++k) x[k] = load(z + i + k * kW);
        // pairwise maximum (the sum is pairwise too, in add)
        vf cm = vmax(vmax(vmax(x[0], x[1]), vmax(x[2], x[3])), vmax(vmax(x[4], x[5]), vmax(x[6], x[7])));
        st.add(x, kChunk, cm);
    }
    for (; i + kW <= V; i += kW) {
        x[0] = load(z + i);
        st.add(x, 1, x[0]);
    }
    if (i < V) {
        x[0] = load_partial(z + i, static_cast<int>(V - i));
        st.add(x, 1, x[0]);
    }
    return st.finish();
}

template <typename T>
void rows_logprob_impl(const T* logits, int64_t V, int64_t n_rows, const int64_t* row_offsets,
                       const int64_t* targets, float* out, int num_threads) {
#pragma omp parallel for num_threads(num_threads) schedule(static)
    for (int64_t r = 0; r < n_rows; ++r) {
        const T* z = logits + row_offsets[r];
        out[r] = lse_logprob(row_state(z, V), load1(z + targets[r]));
    }
}

// A zero-filled float buffer aligned to 64 bytes.
struct Buffer {
    std::vector<float> data;
    float* ptr;
    explicit Buffer(int64_t n) : data(n + 16), ptr(data.data()) {
        auto addr = reinterpret_cast<uintptr_t>(ptr);
        ptr += ((64 - addr % 64) % 64) / sizeof(float);
    }
};

}  // namespace

void rows_logprob(const void* logits, DType dtype, int64_t V, int64_t n_rows,
                  const int64_t* row_offsets, const int64_t* targets, float* out, int num_threads) {
    switch (dtype) {
        case DType::f32:
            return rows_logprob_impl(static_cast<const float*>(logits), V, n_rows, row_offsets, targets, out, num_threads);
        case DType::f16:
            return rows_logprob_impl(static_cast<const at::Half*>(logits), V, n_rows, row_offsets, targets, out, num_threads);
        case DType::bf16:
            return rows_logprob_impl(static_cast<const at::BFloat16*>(logits), V, n_rows, row_offsets, targets, out, num_threads);
    }
}

void segment_mean(const float* values, const int64_t* offsets, int64_t n_segments, float* out) {
    for (int64_t i = 0; i < n_segments; ++i) {
        const int64_t begin = offsets[i], end = offsets[i + 1];
        double sum = 0.0;
        for (int64_t j = begin; j < end; ++j) sum += values[j];
        out[i] = end > begin ? static_cast<float>(sum / static_cast<double>(end - begin))
                             : std::numeric_limits<float>::quiet_NaN();
    }
}

void hidden_logprob(const float* hidden, int64_t P, int64_t H, int64_t ldh,
                    const void* weight, DType wdtype, int64_t V, int64_t ldw,
                    const float* bias, const int64_t* targets, float* out, int num_threads) {
    const int64_t PB = kHiddenRowBlock, VT = kHiddenVocabTile;
    const int64_t n_tiles = (V + VT - 1) / VT;
    const at::ScalarType wtype = wdtype == DType::f32 ? at::kFloat : wdtype == DType::f16 ? at::kHalf : at::kBFloat16;
    const int64_t welem = wdtype == DType::f32 ? 4 : 2;
    // Per (tile, row) partial states of one slab of rows and each row's target logit (written by
    // the one unit whose tile holds the target, so no two threads write the same float).
    const int64_t slab_rows = std::min(P, kHiddenSlabRows);
    std::vector<LseState> partial(n_tiles * slab_rows);
    std::vector<float> target_logit(slab_rows);

    // Slabs of kHiddenSlabRows rows bound the partial states' memory whatever P is; a slab is a
    // whole number of row blocks, so every row still belongs to the same fixed-size GEMM.
    for (int64_t s0 = 0; s0 < P; s0 += kHiddenSlabRows) {
        const int64_t sp = std::min(kHiddenSlabRows, P - s0);
        const int64_t n_blocks = (sp + PB - 1) / PB;
        std::fill(target_logit.begin(), target_logit.end(), std::numeric_limits<float>::quiet_NaN());
        // Work units (tile, block) in tile-major order: consecutive units share a weight tile in
        // cache. Which thread runs a unit does not change its result: each unit is one
        // single-threaded GEMM of a fixed shape (MKL/OpenBLAS run sequentially inside an OpenMP
        // parallel region) and an epilogue that touches only its own rows' partial states.
#pragma omp parallel num_threads(num_threads)
        {
            Buffer tile(PB * VT), wbuf(wdtype == DType::f32 ? 0 : VT * H);
            auto tile_t = at::from_blob(tile.ptr, {PB, VT}, at::kFloat);
            auto wconv_t = at::from_blob(wbuf.ptr, {wdtype == DType::f32 ? 0 : VT, H}, at::kFloat);
            int64_t converted_tile = -1;
#pragma omp for schedule(dynamic, 1)
            for (int64_t unit = 0; unit < n_blocks * n_tiles; ++unit) {
                const int64_t t = unit / n_blocks, b = unit % n_blocks;
                const int64_t r0 = b * PB, pb = std::min(PB, sp - r0);  // rows s0 + r0 ...
                const int64_t v0 = t * VT, vt = std::min(VT, V - v0);
                auto a = at::from_blob(const_cast<float*>(hidden + (s0 + r0) * ldh), {pb, H}, {ldh, 1}, at::kFloat);
                auto w = at::from_blob(const_cast<char*>(static_cast<const char*>(weight) + v0 * ldw * welem),
                                       {vt, H}, {ldw, 1}, wtype);
                if (wdtype != DType::f32) {  // half types: convert the tile once per thread and tile
                    if (converted_tile != t) { wconv_t.narrow(0, 0, vt).copy_(w); converted_tile = t; }
                    w = wconv_t.narrow(0, 0, vt);
                }
                auto c = tile_t.narrow(0, 0, pb).narrow(1, 0, vt);  // [pb, vt] with row stride VT
                at::mm_out(c, a, w.t());
                for (int64_t r = 0; r < pb; ++r) {
                    float* z = tile.ptr + r * VT;
                    if (bias != nullptr)
                        for (int64_t j = 0; j < vt; ++j) z[j] += bias[v0 + j];
                    partial[t * sp + r0 + r] = row_state(z, vt);
                    const int64_t y = targets[s0 + r0 + r];
                    if (y >= v0 && y < v0 + vt) target_logit[r0 + r] = z[y - v0];
                }
            }
        }
        // Merge the tiles of each row in tile order.
#pragma omp parallel for num_threads(num_threads) schedule(static)
        for (int64_t r = 0; r < sp; ++r) {
            LseState st = lse_empty();
            for (int64_t t = 0; t < n_tiles; ++t) st = lse_merge(st, partial[t * sp + r]);
            out[s0 + r] = lse_logprob(st, target_logit[r]);
        }
    }
}

}  // namespace CLID_ISA
}  // namespace cpu
}  // namespace clid

#include "cpu/isa_end.h"
