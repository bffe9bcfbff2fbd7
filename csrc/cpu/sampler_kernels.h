// CPU kernels of the smooth-step sampler and the k-th value (C++/OpenMP, raw pointers), compiled
// once per instruction set: csrc/cpu/sampler_{base,avx2,avx512}.cpp include this file, and
// csrc/cpu/sampler.cpp calls the copy this CPU runs best (csrc/cpu/isa.h).
//
// Selecting the k smallest of M keys that are computed on the fly (no key is stored; the window
// keeps one bit per item):
//   1. Window (usual path). The keys of a sample of S = M/64 items (4096 <= S <= 2^21, in runs
//      of 64 consecutive items spread evenly over the indices) give, by two order statistics, a
//      window (lo, hi] that holds the k-th key with overwhelming probability (k/M of the way,
//      +- 6 binomial standard deviations). One pass over all items counts, per fixed chunk of
//      indices, the keys below lo and equal to lo, records one bit per item (key <= lo) and
//      collects the candidates in (lo, hi] (about 1% of M); the exact k-th key K* is selected
//      among them, and the draw is written from the bits and the candidates without a second
//      pass over the keys (WindowRecord).
//   2. Radix (fallback when the window misses, or holds more than max(2^18, M/32) candidates):
//      four histogram passes over the 16-bit digits of the 64-bit keys give K* exactly, and one
//      more pass counts, per chunk, the keys below and equal to K*.
//   3. Write: one pass writes, chunk by chunk, the indices with key < K* and, in index order, the
//      first (k - #below) indices with key == K* (from the window's record, else from the keys
//      computed again); per-chunk counts give each chunk its offset, so
//      the output is sorted and the same for every thread count.
// Both paths find the same K* and counts: the output never depends on the path or thread count.
//
// The k-th value of stored data (kth_value_cpu) is a plain radix select over order-preserving
// 16-bit digits, finished by nth_element once the bucket of the k-th value is small.
#include <omp.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

// The shared math must run exactly the IEEE operations it spells out: GCC contracts a*b+c into an
// fma by default even in ISO C++ mode, so contraction is turned off for everything below.
// no-trapping-math (clang's default) changes no result: it lets GCC compute both sides of a
// select on doubles, which the loops over items need to vectorise without AVX-512's masks.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off", "no-trapping-math")
#endif

#include "common/sampler_ops.h"
#include "cpu/isa_begin.h"

namespace clid_sampler {
namespace CLID_ISA {
namespace {

constexpr int BLOCK = 512;      // keys computed per vectorised block
constexpr int SAMPLE_RUN = 64;  // consecutive items per run of the window's sample
using Candidate = std::pair<uint64_t, int64_t>;  // (key, index): a total order

// Threads worth waking for a pass over `items` items: each gets at least `per_thread` of them.
// (On a busy machine a woken thread may wait for a time slice; tiny passes are not worth it.)
constexpr int64_t KEY_ITEMS_PER_THREAD = 1 << 18;   // items whose keys are computed (~1 ms)
constexpr int64_t DATA_ITEMS_PER_THREAD = 1 << 21;  // items only read (~1 ms)
inline int threads_for(int threads, int64_t items, int64_t per_thread) {
    return (int)std::max<int64_t>(1, std::min<int64_t>(threads, items / per_thread));
}

// ---------------------------------------------------------------------------------------------
// Philox for consecutive pairs of items, explicitly vectorised: compilers turn the 32x32 -> 64-bit
// products of the portable version (common/philox.h) into full 64-bit multiplies (vpmullq), three
// times slower than the widening multiply (vpmuludq) used here. The tests check every key
// against the portable NumPy reference.

// The 52 random bits of items 2p and 2p+1 for p = first_pair .. first_pair + pairs - 1.
inline void philox_pairs(uint64_t first_pair, int pairs, const RngParams& r, uint64_t* __restrict even,
                         uint64_t* __restrict odd) {
    int p = 0;
#if CLID_HAVE_AVX512
    {
        // 64-bit lanes hold the 32-bit words; the bits above 32 are don't-care until the end.
        const __m512i m0 = _mm512_set1_epi64(PHILOX_M0), m1 = _mm512_set1_epi64(PHILOX_M1);
        const __m512i lane = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0);
        const __m512i low32 = _mm512_set1_epi64(0xFFFFFFFFll);
        __m512i k0[10], k1[10];
        uint32_t a = r.k0, b = r.k1;
        for (int i = 0; i < 10; ++i, a += PHILOX_W0, b += PHILOX_W1) {
            k0[i] = _mm512_set1_epi64(a);
            k1[i] = _mm512_set1_epi64(b);
        }
        const __m512i it0 = _mm512_set1_epi64(r.c2), it1 = _mm512_set1_epi64(r.c3);
        for (; p + 8 <= pairs; p += 8) {
            const __m512i counter = _mm512_add_epi64(_mm512_set1_epi64((long long)(first_pair + p)), lane);
            __m512i c0 = counter, c1 = _mm512_srli_epi64(counter, 32), c2 = it0, c3 = it1;
            for (int i = 0; i < 10; ++i) {
                const __m512i p0 = _mm512_mul_epu32(c0, m0), p1 = _mm512_mul_epu32(c2, m1);
                c0 = _mm512_ternarylogic_epi64(_mm512_srli_epi64(p1, 32), c1, k0[i], 0x96);  // xor of three
                c2 = _mm512_ternarylogic_epi64(_mm512_srli_epi64(p0, 32), c3, k1[i], 0x96);
                c1 = p1;
                c3 = p0;
            }
            const __m512i e = _mm512_srli_epi64(_mm512_or_si512(_mm512_slli_epi64(c0, 32), _mm512_and_si512(c1, low32)), 12);
            const __m512i o = _mm512_srli_epi64(_mm512_or_si512(_mm512_slli_epi64(c2, 32), _mm512_and_si512(c3, low32)), 12);
            _mm512_storeu_si512((void*)(even + p), e);
            _mm512_storeu_si512((void*)(odd + p), o);
        }
    }
#elif CLID_HAVE_AVX2
    {
        const __m256i m0 = _mm256_set1_epi64x(PHILOX_M0), m1 = _mm256_set1_epi64x(PHILOX_M1);
        const __m256i lane = _mm256_set_epi64x(3, 2, 1, 0);
        const __m256i low32 = _mm256_set1_epi64x(0xFFFFFFFFll);
        __m256i k0[10], k1[10];
        uint32_t a = r.k0, b = r.k1;
        for (int i = 0; i < 10; ++i, a += PHILOX_W0, b += PHILOX_W1) {
            k0[i] = _mm256_set1_epi64x(a);
            k1[i] = _mm256_set1_epi64x(b);
        }
        const __m256i it0 = _mm256_set1_epi64x(r.c2), it1 = _mm256_set1_epi64x(r.c3);
        for (; p + 4 <= pairs; p += 4) {
            const __m256i counter = _mm256_add_epi64(_mm256_set1_epi64x((long long)(first_pair + p)), lane);
            __m256i c0 = counter, c1 = _mm256_srli_epi64(counter, 32), c2 = it0, c3 = it1;
            for (int i = 0; i < 10; ++i) {
                const __m256i p0 = _mm256_mul_epu32(c0, m0), p1 = _mm256_mul_epu32(c2, m1);
                c0 = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p1, 32), c1), k0[i]);
                c2 = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p0, 32), c3), k1[i]);
                c1 = p1;
                c3 = p0;
            }
            const __m256i e = _mm256_srli_epi64(_mm256_or_si256(_mm256_slli_epi64(c0, 32), _mm256_and_si256(c1, low32)), 12);
            const __m256i o = _mm256_srli_epi64(_mm256_or_si256(_mm256_slli_epi64(c2, 32), _mm256_and_si256(c3, low32)), 12);
            _mm256_storeu_si256((__m256i*)(even + p), e);
            _mm256_storeu_si256((__m256i*)(odd + p), o);
        }
    }
#endif
    for (; p < pairs; ++p) {
        const Philox4x32 x = philox_pair_block(first_pair + (uint64_t)p, r);
        even[p] = top52(x.v[0], x.v[1]);
        odd[p] = top52(x.v[2], x.v[3]);
    }
}

// ---------------------------------------------------------------------------------------------
// Key functors: keys of a block of items, vectorised.

// (Members are copied to locals first: stores to keys[] could alias them, which would stop the
// compiler from vectorising.)
template <typename T>
struct SuccessiveKeys {
    const T* u;
    WeightParams w;
    RngParams r;
    // Keys of items start .. start+n-1 (start even): one Philox block per pair of items.
    void block(int64_t start, int n, uint64_t* __restrict keys) const {
        const T* __restrict v = u;
        const WeightParams wl = w;
        const RngParams rl = r;
        const int pairs = n / 2;
        uint64_t even[BLOCK / 2], odd[BLOCK / 2];
        philox_pairs((uint64_t)start >> 1, pairs, rl, even, odd);
#pragma omp simd
        for (int p = 0; p < pairs; ++p) {
            const int64_t i0 = start + 2 * p;
            keys[2 * p] = successive_key_from_bits((double)v[i0], even[p], wl);
            keys[2 * p + 1] = successive_key_from_bits((double)v[i0 + 1], odd[p], wl);
        }
        if (n & 1) keys[n - 1] = successive_key((double)v[start + n - 1], (uint64_t)(start + n - 1), wl, rl);
    }
};

template <typename T>
struct FillKeys {
    const T* u;
    WeightParams w;
    void block(int64_t start, int n, uint64_t* __restrict keys) const {
        const T* __restrict v = u;
        const WeightParams wl = w;
#pragma omp simd
        for (int t = 0; t < n; ++t) keys[t] = fill_key(v[start + t], wl);
    }
};

// Calls fn(first_index, n, keys) for consecutive blocks of chunk c, in index order.
template <class Keys, class Fn>
inline void for_chunk_blocks(const Keys& keys, int64_t m, int64_t c, Fn&& fn) {
    uint64_t buf[BLOCK];
    const int64_t begin = c * CHUNK, end = std::min(m, begin + CHUNK);
    for (int64_t s = begin; s < end; s += BLOCK) {
        const int n = (int)std::min<int64_t>(BLOCK, end - s);
        keys.block(s, n, buf);
        fn(s, n, (const uint64_t*)buf);
    }
}

// Number of keys below / equal to a value in a block (vectorised).
inline void count_block(const uint64_t* __restrict keys, int n, uint64_t value, int64_t& below, int64_t& equal) {
    int64_t b = 0, e = 0;
#pragma omp simd reduction(+ : b, e)
    for (int t = 0; t < n; ++t) {
        b += keys[t] < value;
        e += keys[t] == value;
    }
    below += b;
    equal += e;
}

// Number of keys equal to a value in a block (vectorised).
inline int64_t count_equal(const uint64_t* __restrict keys, int n, uint64_t value) {
    int64_t e = 0;
#pragma omp simd reduction(+ : e)
    for (int t = 0; t < n; ++t) e += keys[t] == value;
    return e;
}

// The bits of keys[t] <= bound, 64 to a word (bit t % 64 of word t / 64), for t < n: words
// 0 .. ceil(n / 64) - 1 are written, with 0 for the bits at and past n.
inline void bits_at_most(const uint64_t* __restrict keys, int n, uint64_t bound, uint64_t* __restrict words) {
    int t = 0;
#if CLID_HAVE_AVX512
    const __m512i vb = _mm512_set1_epi64((long long)bound);
    for (; t + 64 <= n; t += 64) {
        uint64_t w = 0;
        for (int j = 0; j < 8; ++j)
            w |= (uint64_t)_mm512_cmple_epu64_mask(_mm512_loadu_si512((const void*)(keys + t + 8 * j)), vb) << (8 * j);
        words[t / 64] = w;
    }
#elif CLID_HAVE_AVX2
    // AVX2 compares signed 64-bit lanes: flipping the sign bit of both sides orders them as unsigned.
    const __m256i flip = _mm256_set1_epi64x((long long)0x8000000000000000ull);
    const __m256i vb = _mm256_xor_si256(_mm256_set1_epi64x((long long)bound), flip);
    for (; t + 64 <= n; t += 64) {
        uint64_t w = 0;
        for (int j = 0; j < 16; ++j) {
            const __m256i k = _mm256_xor_si256(_mm256_loadu_si256((const __m256i*)(keys + t + 4 * j)), flip);
            const int above = _mm256_movemask_pd(_mm256_castsi256_pd(_mm256_cmpgt_epi64(k, vb)));
            w |= (uint64_t)(~above & 0xF) << (4 * j);
        }
        words[t / 64] = w;
    }
#endif
    for (; t < n; t += 64) {  // the last, partial word (every word without vectors)
        uint64_t w = 0;
        const int e = std::min(n - t, 64);
        for (int b = 0; b < e; ++b) w |= (uint64_t)(keys[t + b] <= bound) << b;
        words[t / 64] = w;
    }
}

#if CLID_HAVE_AVX2 && !CLID_HAVE_AVX512
// For each 4-bit mask, the 32-bit lanes that move the selected 64-bit lanes of a vector to its front.
struct PackTable {
    alignas(32) int32_t lanes[16][8];
    constexpr PackTable() : lanes() {
        for (int mask = 0; mask < 16; ++mask) {
            int to = 0;
            for (int from = 0; from < 4; ++from)
                if (mask >> from & 1) {
                    lanes[mask][2 * to] = 2 * from;
                    lanes[mask][2 * to + 1] = 2 * from + 1;
                    ++to;
                }
        }
    }
};
inline constexpr PackTable PACK_TABLE{};
#endif

// The indices base + t of the set bits t of words[0 .. nw), in increasing order, written to dst,
// which holds exactly `total` (the number of set bits): no write goes past dst[total - 1].
inline void indices_of_bits(const uint64_t* __restrict words, int nw, int64_t base, int64_t* __restrict dst,
                            int64_t total) {
    int64_t n = 0;
    int j = 0;
    // Whole vectors are stored (the lanes past the selected ones are overwritten next) while a
    // word's 64 indices fit before the end.
#if CLID_HAVE_AVX512
    const __m512i eight = _mm512_set1_epi64(8);
    for (; j < nw && n + 64 <= total; ++j) {
        const uint64_t w = words[j];
        __m512i at = _mm512_add_epi64(_mm512_set1_epi64(base + 64 * j), _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0));
        for (int b = 0; b < 8; ++b, at = _mm512_add_epi64(at, eight)) {
            const __mmask8 in = (__mmask8)(w >> (8 * b));
            _mm512_storeu_si512((void*)(dst + n), _mm512_maskz_compress_epi64(in, at));
            n += std::popcount((unsigned)in);
        }
    }
#elif CLID_HAVE_AVX2
    const __m256i four = _mm256_set1_epi64x(4);
    for (; j < nw && n + 64 <= total; ++j) {
        const uint64_t w = words[j];
        __m256i at = _mm256_add_epi64(_mm256_set1_epi64x(base + 64 * j), _mm256_set_epi64x(3, 2, 1, 0));
        for (int b = 0; b < 16; ++b, at = _mm256_add_epi64(at, four)) {
            const int in = (int)(w >> (4 * b)) & 0xF;
            const __m256i lanes = _mm256_load_si256((const __m256i*)PACK_TABLE.lanes[in]);
            _mm256_storeu_si256((__m256i*)(dst + n), _mm256_permutevar8x32_epi32(at, lanes));
            n += std::popcount((unsigned)in);
        }
    }
#endif
    for (; j < nw; ++j)
        for (uint64_t w = words[j]; w != 0; w &= w - 1) dst[n++] = base + 64 * j + std::countr_zero(w);
}

// The indices start + t with keys[t] < bound, in order, written to dst (room for n + 8); their number.
inline int indices_below(const uint64_t* __restrict keys, int n, uint64_t bound, int64_t start, int64_t* __restrict dst) {
    int found = 0, t = 0;
#if CLID_HAVE_AVX512
    const __m512i vb = _mm512_set1_epi64((long long)bound);
    __m512i at = _mm512_add_epi64(_mm512_set1_epi64(start), _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0));
    for (; t + 8 <= n; t += 8, at = _mm512_add_epi64(at, _mm512_set1_epi64(8))) {
        const __mmask8 in = _mm512_cmplt_epu64_mask(_mm512_loadu_si512((const void*)(keys + t)), vb);
        _mm512_storeu_si512((void*)(dst + found), _mm512_maskz_compress_epi64(in, at));
        found += __builtin_popcount(in);
    }
#endif
    for (; t < n; ++t) {
        dst[found] = start + t;
        found += keys[t] < bound;
    }
    return found;
}

// ---------------------------------------------------------------------------------------------
// The k-th key and the per-chunk counts below and equal to it.

// What the window's pass keeps so that the draw is written without computing any key again: one
// bit per item (key <= lo), and each chunk's candidates (lo < key <= hi) in index order.
constexpr int64_t WORDS_PER_CHUNK = CHUNK / 64;
struct WindowRecord {
    std::unique_ptr<uint64_t[]> low;                 // WORDS_PER_CHUNK words per chunk
    std::vector<std::vector<Candidate>> per_thread;  // the candidates, chunk after chunk
    std::vector<int> owner;                          // per chunk: the thread that holds its candidates,
    std::vector<int64_t> first, count;               // where they start there and how many
};

struct KthKey {
    uint64_t key = 0;
    std::vector<int64_t> lt, eq;           // per chunk: keys < K*, keys == K*
    std::unique_ptr<WindowRecord> record;  // the window's record when K* > lo, else null
};

// Path 1: sample-guided window. Returns false (and K* unset) if the window missed or overflowed.
template <class Keys>
bool kth_key_window(const Keys& keys, int64_t m, int64_t k, int threads, KthKey& out) {
    const int64_t nch = num_chunks(m);
    // Sample: s keys in runs of SAMPLE_RUN consecutive items spread evenly over the indices.
    int64_t runs = std::min<int64_t>(m, std::max<int64_t>(4096, m / 64)) / SAMPLE_RUN;
    runs = std::max<int64_t>(1, std::min<int64_t>(runs, (1 << 21) / SAMPLE_RUN));
    const int64_t run = std::min<int64_t>(SAMPLE_RUN, m);
    const int64_t s = runs * run;
    std::vector<uint64_t> sample(s);
#pragma omp parallel for num_threads(threads_for(threads, s, KEY_ITEMS_PER_THREAD)) schedule(dynamic, 64)
    for (int64_t j = 0; j < runs; ++j) {
        const int64_t start = std::min(m - run, (int64_t)((double)j * (double)m / (double)runs)) & ~(int64_t)1;
        keys.block(start, (int)run, sample.data() + j * run);
    }
    // Ranks in the sample bracketing the k-th key: k/M of the way, +- 6 sd of a binomial count.
    const double q = (double)k / (double)m;
    const double center = q * (double)s;
    const double delta = 6.0 * std::sqrt((double)s * q * (1.0 - q)) + 8.0;
    const int64_t lo_rank = (int64_t)std::floor(center - delta) - 1;
    const int64_t hi_rank = (int64_t)std::ceil(center + delta);
    uint64_t lo = 0, hi = std::numeric_limits<uint64_t>::max();
    if (lo_rank >= 0) {
        std::nth_element(sample.begin(), sample.begin() + lo_rank, sample.end());
        lo = sample[lo_rank];
    }
    if (hi_rank < s) {
        std::nth_element(sample.begin(), sample.begin() + hi_rank, sample.end());
        hi = sample[hi_rank];
    }
    std::vector<uint64_t>().swap(sample);

    // One pass: per chunk, the keys below lo and equal to lo (ties there are common: zero weights,
    // the fill's positive weights), the bits of the keys at or below lo, and the few candidates
    // in (lo, hi].
    const int64_t cap = std::max<int64_t>(1 << 18, m / 32);
    std::vector<int64_t> below(nch), at_lo(nch);
    auto rec = std::make_unique<WindowRecord>();
    rec->low.reset(new uint64_t[nch * WORDS_PER_CHUNK]);  // not zeroed: every word read is written first
    rec->per_thread.resize(threads);
    rec->owner.resize(nch);
    rec->first.resize(nch);
    rec->count.resize(nch);
    std::atomic<int64_t> n_candidates{0};
    std::atomic<bool> overflow{false};
#pragma omp parallel num_threads(threads_for(threads, m, KEY_ITEMS_PER_THREAD))
    {
        const int me = omp_get_thread_num();
        std::vector<Candidate>& mine = rec->per_thread[me];
#pragma omp for schedule(dynamic, 1)
        for (int64_t c = 0; c < nch; ++c) {
            if (overflow.load(std::memory_order_relaxed)) continue;
            int64_t n_at_most = 0, n_at = 0;
            const size_t before = mine.size();
            uint64_t* words = rec->low.get() + c * WORDS_PER_CHUNK;
            for_chunk_blocks(keys, m, c, [&](int64_t start, int n, const uint64_t* kb) {
                uint64_t* low = words + (start - c * CHUNK) / 64;
                uint64_t high[BLOCK / 64];
                bits_at_most(kb, n, lo, low);
                bits_at_most(kb, n, hi, high);
                n_at += count_equal(kb, n, lo);
                for (int j = 0; j < (n + 63) / 64; ++j) {
                    n_at_most += std::popcount(low[j]);
                    for (uint64_t in = high[j] & ~low[j]; in != 0; in &= in - 1) {
                        const int t = 64 * j + std::countr_zero(in);
                        mine.emplace_back(kb[t], start + t);
                    }
                }
            });
            below[c] = n_at_most - n_at;
            at_lo[c] = n_at;
            const int64_t added = (int64_t)(mine.size() - before);
            rec->owner[c] = me;
            rec->first[c] = (int64_t)before;
            rec->count[c] = added;
            if (n_candidates.fetch_add(added) + added > cap) overflow.store(true);
        }
    }
    if (overflow.load()) return false;
    int64_t total_below = 0, total_at = 0;
    for (int64_t c = 0; c < nch; ++c) {
        total_below += below[c];
        total_at += at_lo[c];
    }
    if (k <= total_below) return false;  // the window starts above the k-th key
    if (k <= total_below + total_at) {   // the k-th key is lo itself (the record is not needed)
        out.key = lo;
        out.lt = std::move(below);
        out.eq = std::move(at_lo);
        return true;
    }
    const int64_t need = k - total_below - total_at;  // rank of K* among the candidates (1-based)
    if (need > n_candidates.load()) return false;     // the window ends below the k-th key
    std::vector<uint64_t> cand;
    cand.reserve((size_t)n_candidates.load());
    for (const auto& v : rec->per_thread)
        for (const Candidate& x : v) cand.push_back(x.first);
    std::nth_element(cand.begin(), cand.begin() + (need - 1), cand.end());
    out.key = cand[need - 1];
    std::vector<uint64_t>().swap(cand);
    out.lt.resize(nch);
    for (int64_t c = 0; c < nch; ++c) out.lt[c] = below[c] + at_lo[c];
    out.eq.assign(nch, 0);
    for (const auto& v : rec->per_thread)
        for (const Candidate& x : v) {
            if (x.first < out.key) out.lt[x.second / CHUNK] += 1;
            else if (x.first == out.key) out.eq[x.second / CHUNK] += 1;
        }
    out.record = std::move(rec);
    return true;
}

// Path 2: radix select over 16-bit digits of the recomputed keys, then a counting pass.
template <class Keys>
void kth_key_radix(const Keys& keys, int64_t m, int64_t k, int threads, KthKey& out) {
    const int64_t nch = num_chunks(m);
    constexpr int DIGIT = 16, BINS = 1 << DIGIT;
    uint64_t prefix = 0;
    int64_t rank = k;  // 1-based rank of K* among the keys that share the prefix
    std::vector<std::vector<int64_t>> hist(threads, std::vector<int64_t>(BINS));
    for (int pass = 0; pass < 4; ++pass) {
        const int shift = 64 - DIGIT * (pass + 1);
        for (auto& h : hist) std::fill(h.begin(), h.end(), 0);
#pragma omp parallel num_threads(threads_for(threads, m, KEY_ITEMS_PER_THREAD))
        {
            int64_t* h = hist[omp_get_thread_num()].data();
#pragma omp for schedule(dynamic, 1)
            for (int64_t c = 0; c < nch; ++c) {
                for_chunk_blocks(keys, m, c, [&](int64_t, int n, const uint64_t* kb) {
                    for (int t = 0; t < n; ++t) {
                        const bool match = pass == 0 || (kb[t] >> (shift + DIGIT)) == prefix;
                        if (match) h[(kb[t] >> shift) & (BINS - 1)] += 1;
                    }
                });
            }
        }
        int64_t seen = 0;
        int digit = 0;
        for (; digit < BINS; ++digit) {
            int64_t count = 0;
            for (auto& h : hist) count += h[digit];
            if (seen + count >= rank) break;
            seen += count;
        }
        rank -= seen;
        prefix = (prefix << DIGIT) | (uint64_t)digit;
    }
    out.key = prefix;
    out.lt.assign(nch, 0);
    out.eq.assign(nch, 0);
#pragma omp parallel for num_threads(threads_for(threads, m, KEY_ITEMS_PER_THREAD)) schedule(dynamic, 1)
    for (int64_t c = 0; c < nch; ++c) {
        int64_t lt = 0, eq = 0;
        for_chunk_blocks(keys, m, c, [&](int64_t, int n, const uint64_t* kb) { count_block(kb, n, out.key, lt, eq); });
        out.lt[c] = lt;
        out.eq[c] = eq;
    }
}

// Writes the k selected indices in index order: keys < K*, then the first ties in index order.
template <class Keys>
void write_selected(const Keys& keys, int64_t m, int64_t k, KthKey& kth, int64_t* out, int threads) {
    const int64_t nch = num_chunks(m);
    int64_t total_lt = 0;
    for (int64_t c = 0; c < nch; ++c) total_lt += kth.lt[c];
    int64_t ties_left = k - total_lt;
    std::vector<int64_t> offset(nch), take_eq(nch);
    int64_t pos = 0;
    for (int64_t c = 0; c < nch; ++c) {
        take_eq[c] = std::min(kth.eq[c], std::max<int64_t>(ties_left, 0));
        ties_left -= take_eq[c];
        offset[c] = pos;
        pos += kth.lt[c] + take_eq[c];
    }
    if (kth.record) {
        // From the window's record: a chunk's candidates below K* and its first take_eq[c] ties
        // with K* join, in its bits, the items at or below lo (all below K*); the bits are then
        // read out in index order.
        WindowRecord& rec = *kth.record;
#pragma omp parallel for num_threads(threads_for(threads, m, DATA_ITEMS_PER_THREAD / 4)) schedule(dynamic, 1)
        for (int64_t c = 0; c < nch; ++c) {
            const int64_t share = kth.lt[c] + take_eq[c];
            if (share == 0) continue;
            const int64_t begin = c * CHUNK;
            uint64_t* words = rec.low.get() + c * WORDS_PER_CHUNK;
            const Candidate* x = rec.per_thread[rec.owner[c]].data() + rec.first[c];
            int64_t ties = 0;
            for (int64_t j = 0; j < rec.count[c]; ++j) {
                if (x[j].first < kth.key || (x[j].first == kth.key && ties++ < take_eq[c])) {
                    const int64_t t = x[j].second - begin;
                    words[t / 64] |= (uint64_t)1 << (t % 64);
                }
            }
            const int nw = (int)((std::min(m, begin + CHUNK) - begin + 63) / 64);
            indices_of_bits(words, nw, begin, out + offset[c], share);
        }
        return;
    }
    // Without a record, every key is computed again.
#pragma omp parallel for num_threads(threads_for(threads, m, KEY_ITEMS_PER_THREAD)) schedule(dynamic, 1)
    for (int64_t c = 0; c < nch; ++c) {
        if (kth.lt[c] + take_eq[c] == 0) continue;
        int64_t* dst = out + offset[c];
        int64_t n = 0, ties = 0;
        const uint64_t kk = kth.key;
        const int64_t limit = take_eq[c];
        const int64_t share = kth.lt[c] + limit;
        for_chunk_blocks(keys, m, c, [&](int64_t start, int nb, const uint64_t* kb) {
            int64_t picked[BLOCK + 8];
            int64_t n_lt = 0, n_eq = 0;
            count_block(kb, nb, kk, n_lt, n_eq);
            int found = 0;
            if (n_eq == 0 && n + nb + 8 <= share) {  // straight into the output: room for whole vectors
                n += indices_below(kb, nb, kk, start, dst + n);
                return;
            }
            if (n_eq == 0) {
                found = indices_below(kb, nb, kk, start, picked);
            } else {  // ties with K* (rare): the first `limit` of the chunk are taken
                for (int t = 0; t < nb; ++t) {
                    const bool tie = (kb[t] == kk) & (ties < limit);
                    ties += tie;
                    picked[found] = start + t;
                    found += (kb[t] < kk) | tie;
                }
            }
            std::copy(picked, picked + found, dst + n);
            n += found;
        });
    }
}

// Finds the k-th key (1 <= k < m) by the window, or by radix select if the window fails or
// force_path asks for it. Returns the SelectPath, or -1 if FORCE_WINDOW and the window failed.
template <class Keys>
int find_kth_key(const Keys& keys, int64_t m, int64_t k, int threads, int force_path, KthKey& kth) {
    if (force_path != FORCE_RADIX && kth_key_window(keys, m, k, threads, kth)) return PATH_WINDOW;
    if (force_path == FORCE_WINDOW) return -1;
    kth_key_radix(keys, m, k, threads, kth);
    return PATH_RADIX;
}

template <typename T>
SampleInfo successive_sample(const T* u, int64_t m, int64_t k, WeightParams w, RngParams r, int64_t* out,
                             int threads, int force_path) {
    SampleInfo info{PATH_TRIVIAL, 0, -1};
    if (k == m) {
#pragma omp parallel for num_threads(threads_for(threads, m, DATA_ITEMS_PER_THREAD)) schedule(static)
        for (int64_t i = 0; i < m; ++i) out[i] = i;
    }
    if (k == 0 || k == m) return info;
    SuccessiveKeys<T> keys{u, w, r};
    KthKey kth;
    info.path = find_kth_key(keys, m, k, threads, force_path, kth);
    if (info.path < 0) return info;
    if (kth.key != SM_ZERO_WEIGHT_KEY) {
        write_selected(keys, m, k, kth, out, threads);
        return info;
    }
    // Fewer than k positive weights (every key below K* is a positive weight): take them all,
    // then the largest u among the rest, ties by index.
    info.filled = 1;
    info.positive = 0;
    for (int64_t c : kth.lt) info.positive += c;
    FillKeys<T> fill{u, w};
    KthKey fill_kth;
    if (find_kth_key(fill, m, k, threads, force_path, fill_kth) < 0) {
        info.path = -1;
        return info;
    }
    write_selected(fill, m, k, fill_kth, out, threads);
    return info;
}

// ---------------------------------------------------------------------------------------------
// NaN checks

// 1 if the chunk [begin, end) holds a NaN (vectorised).
template <typename T>
inline int chunk_has_nan(const T* __restrict u, int64_t begin, int64_t end) {
    int any = 0;
#pragma omp simd reduction(| : any)
    for (int64_t i = begin; i < end; ++i) any |= (u[i] != u[i]);
    return any;
}

template <typename T>
int64_t first_nan_in_chunk(const T* u, int64_t m, int64_t c) {
    for (int64_t i = c * CHUNK, end = std::min(m, (c + 1) * CHUNK); i < end; ++i)
        if (u[i] != u[i]) return i;
    return -1;
}

template <typename T>
int64_t first_nan(const T* u, int64_t m, int threads) {
    const int64_t nch = num_chunks(m);
    int64_t first_chunk = nch;
#pragma omp parallel for num_threads(threads_for(threads, m, DATA_ITEMS_PER_THREAD)) schedule(dynamic, 1) reduction(min : first_chunk)
    for (int64_t c = 0; c < nch; ++c)
        if (chunk_has_nan(u, c * CHUNK, std::min(m, (c + 1) * CHUNK)) && c < first_chunk) first_chunk = c;
    return first_chunk == nch ? -1 : first_nan_in_chunk(u, m, first_chunk);
}

// ---------------------------------------------------------------------------------------------
// k-th value of stored data, over order-preserving integer keys.
//   Window (usual path): a sample guesses a key range (lo, hi) around the k-th key, one pass
//   counts the keys below lo and collects those in [lo, hi], nth_element finishes.
//   Radix (when the window misses or holds too many keys): histograms of 16-bit digits, top digit
//   first, each pass restricted to the keys sharing the digits found so far; the bucket's few
//   survivors are collected and finished by nth_element as soon as they fit in memory.
// Both are exact; a NaN anywhere sets *nan_index to the first one.

// The keys with lo <= key <= hi, in order, written to out (room for n + 16); their number.
template <typename K>
inline int keys_in_range(const K* __restrict keys, int n, K lo, K hi, K* __restrict out) {
    int found = 0, t = 0;
#if CLID_HAVE_AVX512
    if constexpr (sizeof(K) == 4) {
        const __m512i vlo = _mm512_set1_epi32((int)lo), vhi = _mm512_set1_epi32((int)hi);
        for (; t + 16 <= n; t += 16) {
            const __m512i k = _mm512_loadu_si512((const void*)(keys + t));
            const __mmask16 in = _mm512_cmpge_epu32_mask(k, vlo) & _mm512_cmple_epu32_mask(k, vhi);
            _mm512_storeu_si512((void*)(out + found), _mm512_maskz_compress_epi32(in, k));
            found += __builtin_popcount(in);
        }
    } else {
        const __m512i vlo = _mm512_set1_epi64((long long)lo), vhi = _mm512_set1_epi64((long long)hi);
        for (; t + 8 <= n; t += 8) {
            const __m512i k = _mm512_loadu_si512((const void*)(keys + t));
            const __mmask8 in = _mm512_cmpge_epu64_mask(k, vlo) & _mm512_cmple_epu64_mask(k, vhi);
            _mm512_storeu_si512((void*)(out + found), _mm512_maskz_compress_epi64(in, k));
            found += __builtin_popcount(in);
        }
    }
#endif
    for (; t < n; ++t) {
        out[found] = keys[t];
        found += (keys[t] >= lo) & (keys[t] <= hi);
    }
    return found;
}

template <typename T, typename K>
bool kth_value_window(const T* u, int64_t m, int64_t k, int threads, T* result, int64_t* nan_index) {
    const int64_t nch = num_chunks(m);
    int64_t runs = std::min<int64_t>(m, std::max<int64_t>(4096, m / 64)) / SAMPLE_RUN;
    runs = std::max<int64_t>(1, std::min<int64_t>(runs, (1 << 21) / SAMPLE_RUN));
    const int64_t run = std::min<int64_t>(SAMPLE_RUN, m), s = runs * run;
    std::vector<K> sample(s);
    for (int64_t j = 0; j < runs; ++j) {
        const int64_t start = std::min(m - run, (int64_t)((double)j * (double)m / (double)runs));
        for (int64_t t = 0; t < run; ++t) sample[j * run + t] = ord_key(u[start + t]);  // a NaN is caught below
    }
    const double q = (double)k / (double)m;
    const double delta = 6.0 * std::sqrt((double)s * q * (1.0 - q)) + 8.0;
    const int64_t lo_rank = (int64_t)std::floor(q * (double)s - delta) - 1;
    const int64_t hi_rank = (int64_t)std::ceil(q * (double)s + delta);
    K lo = 0, hi = std::numeric_limits<K>::max();
    if (lo_rank >= 0) {
        std::nth_element(sample.begin(), sample.begin() + lo_rank, sample.end());
        lo = sample[lo_rank];
    }
    if (hi_rank < s) {
        std::nth_element(sample.begin(), sample.begin() + hi_rank, sample.end());
        hi = sample[hi_rank];
    }
    std::vector<K>().swap(sample);

    const int64_t cap = std::max<int64_t>(1 << 16, m / 32);
    std::vector<std::vector<K>> per_thread(threads);
    std::atomic<int64_t> n_candidates{0};
    std::atomic<bool> overflow{false};
    int64_t total_below = 0, first_bad_chunk = nch;
#pragma omp parallel num_threads(threads_for(threads, m, DATA_ITEMS_PER_THREAD)) \
    reduction(+ : total_below) reduction(min : first_bad_chunk)
    {
        std::vector<K>& mine = per_thread[omp_get_thread_num()];
#pragma omp for schedule(dynamic, 1)
        for (int64_t c = 0; c < nch; ++c) {
            if (overflow.load(std::memory_order_relaxed)) continue;
            const int64_t begin = c * CHUNK, end = std::min(m, begin + CHUNK);
            if (chunk_has_nan(u, begin, end)) {
                first_bad_chunk = std::min(first_bad_chunk, c);
                continue;
            }
            const size_t before = mine.size();
            K keys[BLOCK], found_keys[BLOCK + 16];
            for (int64_t b = begin; b < end; b += BLOCK) {
                const int n = (int)std::min<int64_t>(BLOCK, end - b);
                int64_t below = 0;
#pragma omp simd reduction(+ : below)
                for (int t = 0; t < n; ++t) {
                    keys[t] = ord_key(u[b + t]);
                    below += keys[t] < lo;
                }
                total_below += below;
                const int found = keys_in_range(keys, n, lo, hi, found_keys);
                mine.insert(mine.end(), found_keys, found_keys + found);
            }
            const int64_t added = (int64_t)(mine.size() - before);
            if (n_candidates.fetch_add(added) + added > cap) overflow.store(true);
        }
    }
    if (overflow.load()) return false;  // (the radix pass finds any NaN)
    if (first_bad_chunk < nch) {
        *nan_index = first_nan_in_chunk(u, m, first_bad_chunk);
        return true;
    }
    const int64_t need = k - total_below;
    if (need < 1 || need > n_candidates.load()) return false;
    std::vector<K> cand;
    cand.reserve((size_t)n_candidates.load());
    for (auto& v : per_thread) cand.insert(cand.end(), v.begin(), v.end());
    std::nth_element(cand.begin(), cand.begin() + (need - 1), cand.end());
    *result = from_ord_key(cand[need - 1]);
    return true;
}

template <typename T, typename K, typename Count>
T kth_value_radix(const T* u, int64_t m, int64_t k, int threads, int64_t* nan_index) {
    constexpr int BITS = 8 * sizeof(K), DIGIT = 16, BINS = 1 << DIGIT;
    const int64_t nch = num_chunks(m);
    const int64_t cap = std::max<int64_t>(1 << 16, m / 16);
    K prefix = 0;
    int64_t rank = k, in_bucket = m;
    *nan_index = -1;
    std::vector<std::vector<Count>> hist(threads, std::vector<Count>(BINS));
    for (int pass = 0; pass < BITS / DIGIT; ++pass) {
        const int shift = BITS - DIGIT * (pass + 1);
        if (pass > 0 && in_bucket <= cap) {
            // Few keys share the prefix: collect them and select among them.
            std::vector<std::vector<K>> found(threads);
#pragma omp parallel num_threads(threads_for(threads, m, DATA_ITEMS_PER_THREAD))
            {
                std::vector<K>& mine = found[omp_get_thread_num()];
#pragma omp for schedule(dynamic, 1)
                for (int64_t c = 0; c < nch; ++c) {
                    const int64_t end = std::min(m, (c + 1) * CHUNK);
                    for (int64_t i = c * CHUNK; i < end; ++i) {
                        const K key = ord_key(u[i]);
                        if ((K)(key >> (shift + DIGIT)) == prefix) mine.push_back(key);
                    }
                }
            }
            std::vector<K> all;
            all.reserve(in_bucket);
            for (auto& v : found) all.insert(all.end(), v.begin(), v.end());
            std::nth_element(all.begin(), all.begin() + (rank - 1), all.end());
            return from_ord_key(all[rank - 1]);
        }
        for (auto& h : hist) std::fill(h.begin(), h.end(), 0);
        int64_t first_bad_chunk = nch;
#pragma omp parallel num_threads(threads_for(threads, m, DATA_ITEMS_PER_THREAD)) reduction(min : first_bad_chunk)
        {
            Count* h = hist[omp_get_thread_num()].data();
#pragma omp for schedule(dynamic, 1)
            for (int64_t c = 0; c < nch; ++c) {
                const int64_t begin = c * CHUNK, end = std::min(m, begin + CHUNK);
                if (pass == 0) {
                    if (chunk_has_nan(u, begin, end) && c < first_bad_chunk) first_bad_chunk = c;
                    for (int64_t i = begin; i < end; ++i) h[ord_key(u[i]) >> shift] += 1;
                } else {
                    for (int64_t i = begin; i < end; ++i) {
                        const K key = ord_key(u[i]);
                        if ((K)(key >> (shift + DIGIT)) == prefix) h[(key >> shift) & (BINS - 1)] += 1;
                    }
                }
            }
        }
        if (first_bad_chunk < nch) {
            *nan_index = first_nan_in_chunk(u, m, first_bad_chunk);
            return T(0);
        }
        int64_t seen = 0;
        int digit = 0;
        for (; digit < BINS; ++digit) {
            int64_t count = 0;
            for (auto& h : hist) count += (int64_t)h[digit];
            if (seen + count >= rank) {
                in_bucket = count;
                break;
            }
            seen += count;
        }
        rank -= seen;
        prefix = (K)((prefix << DIGIT) | (K)digit);
    }
    return from_ord_key(prefix);
}

// Keep flags of items start .. start+n-1 (start even), one Philox block per pair of items.
template <typename T>
inline void bernoulli_block(const T* __restrict u, int64_t start, int n, WeightParams w, RngParams r,
                            uint8_t* __restrict keep) {
    const int pairs = n / 2;
    uint64_t even[BLOCK / 2], odd[BLOCK / 2];
    philox_pairs((uint64_t)start >> 1, pairs, r, even, odd);
#pragma omp simd
    for (int p = 0; p < pairs; ++p) {
        const int64_t i0 = start + 2 * p;
        keep[2 * p] = bernoulli_keep_from_bits((double)u[i0], even[p], w);
        keep[2 * p + 1] = bernoulli_keep_from_bits((double)u[i0 + 1], odd[p], w);
    }
    if (n & 1) keep[n - 1] = bernoulli_keep((double)u[start + n - 1], (uint64_t)(start + n - 1), w, r);
}

template <typename T>
int64_t bernoulli_count(const T* u, int64_t m, WeightParams w, RngParams r, int64_t* counts, int threads) {
    const int64_t nch = num_chunks(m);
    int64_t total = 0;
#pragma omp parallel for num_threads(threads_for(threads, m, KEY_ITEMS_PER_THREAD)) schedule(dynamic, 1) reduction(+ : total)
    for (int64_t c = 0; c < nch; ++c) {
        const int64_t begin = c * CHUNK, end = std::min(m, begin + CHUNK);
        int64_t n = 0;
        uint8_t keep[BLOCK];
        for (int64_t s = begin; s < end; s += BLOCK) {
            const int nb = (int)std::min<int64_t>(BLOCK, end - s);
            bernoulli_block(u, s, nb, w, r, keep);
            for (int t = 0; t < nb; ++t) n += keep[t];
        }
        counts[c] = n;
        total += n;
    }
    return total;
}

template <typename T>
void bernoulli_write(const T* u, int64_t m, WeightParams w, RngParams r, const int64_t* counts, int64_t* out,
                     int threads) {
    const int64_t nch = num_chunks(m);
    std::vector<int64_t> offset(nch);
    int64_t pos = 0;
    for (int64_t c = 0; c < nch; ++c) {
        offset[c] = pos;
        pos += counts[c];
    }
#pragma omp parallel for num_threads(threads_for(threads, m, KEY_ITEMS_PER_THREAD)) schedule(dynamic, 1)
    for (int64_t c = 0; c < nch; ++c) {
        const int64_t begin = c * CHUNK, end = std::min(m, begin + CHUNK);
        int64_t* dst = out + offset[c];
        int64_t n = 0;
        uint8_t keep[BLOCK];
        for (int64_t s = begin; s < end; s += BLOCK) {
            const int nb = (int)std::min<int64_t>(BLOCK, end - s);
            bernoulli_block(u, s, nb, w, r, keep);
            for (int t = 0; t < nb; ++t) {
                if (n < counts[c]) dst[n] = s + t;  // never past this chunk's share
                n += keep[t];
            }
        }
    }
}

template <typename T>
void successive_keys(const T* u, int64_t m, WeightParams w, RngParams r, uint64_t* keys, int threads) {
    SuccessiveKeys<T> f{u, w, r};
#pragma omp parallel for num_threads(threads_for(threads, m, KEY_ITEMS_PER_THREAD)) schedule(dynamic, 64)
    for (int64_t b = 0; b < (m + BLOCK - 1) / BLOCK; ++b) {
        uint64_t buf[BLOCK];
        const int64_t s = b * BLOCK;
        const int n = (int)std::min<int64_t>(BLOCK, m - s);
        f.block(s, n, buf);
        std::copy(buf, buf + n, keys + s);
    }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The raw-pointer API (common/sampler_ops.h), in this instruction set's namespace.

int64_t first_nan_cpu(const float* u, int64_t m, int threads) { return first_nan(u, m, threads); }
int64_t first_nan_cpu(const double* u, int64_t m, int threads) { return first_nan(u, m, threads); }
// The radix select's per-thread histograms count at most m items: 32-bit counters unless m needs more.
float kth_value_cpu(const float* u, int64_t m, int64_t k, int threads, int64_t* nan_index, int force_radix) {
    float result = 0;
    *nan_index = -1;
    if (!force_radix && kth_value_window<float, uint32_t>(u, m, k, threads, &result, nan_index)) return result;
    if (m < (int64_t)UINT32_MAX) return kth_value_radix<float, uint32_t, uint32_t>(u, m, k, threads, nan_index);
    return kth_value_radix<float, uint32_t, uint64_t>(u, m, k, threads, nan_index);
}
double kth_value_cpu(const double* u, int64_t m, int64_t k, int threads, int64_t* nan_index, int force_radix) {
    double result = 0;
    *nan_index = -1;
    if (!force_radix && kth_value_window<double, uint64_t>(u, m, k, threads, &result, nan_index)) return result;
    if (m < (int64_t)UINT32_MAX) return kth_value_radix<double, uint64_t, uint32_t>(u, m, k, threads, nan_index);
    return kth_value_radix<double, uint64_t, uint64_t>(u, m, k, threads, nan_index);
}
SampleInfo successive_sample_cpu(const float* u, int64_t m, int64_t k, WeightParams w, RngParams r, int64_t* out,
                                 int threads, int force_path) {
    return successive_sample(u, m, k, w, r, out, threads, force_path);
}
SampleInfo successive_sample_cpu(const double* u, int64_t m, int64_t k, WeightParams w, RngParams r, int64_t* out,
                                 int threads, int force_path) {
    return successive_sample(u, m, k, w, r, out, threads, force_path);
}
int64_t bernoulli_count_cpu(const float* u, int64_t m, WeightParams w, RngParams r, int64_t* counts, int threads) {
    return bernoulli_count(u, m, w, r, counts, threads);
}
int64_t bernoulli_count_cpu(const double* u, int64_t m, WeightParams w, RngParams r, int64_t* counts, int threads) {
    return bernoulli_count(u, m, w, r, counts, threads);
}
void bernoulli_write_cpu(const float* u, int64_t m, WeightParams w, RngParams r, const int64_t* counts, int64_t* out,
                         int threads) {
    bernoulli_write(u, m, w, r, counts, out, threads);
}
void bernoulli_write_cpu(const double* u, int64_t m, WeightParams w, RngParams r, const int64_t* counts, int64_t* out,
                         int threads) {
    bernoulli_write(u, m, w, r, counts, out, threads);
}
void successive_keys_cpu(const float* u, int64_t m, WeightParams w, RngParams r, uint64_t* keys, int threads) {
    successive_keys(u, m, w, r, keys, threads);
}
void successive_keys_cpu(const double* u, int64_t m, WeightParams w, RngParams r, uint64_t* keys, int threads) {
    successive_keys(u, m, w, r, keys, threads);
}

}  // namespace CLID_ISA
}  // namespace clid_sampler

#include "cpu/isa_end.h"
