// CUDA kernels of the smooth-step sampler and the k-th value (raw pointers, no torch headers).
//
// Same results as the CPU kernels (csrc/cpu/sampler.cpp), bit for bit: the per-item keys come
// from the same header (common/sampler_math.h, explicit round-to-nearest intrinsics on the
// device) and the selection is the same unique set, the k smallest (key, index) pairs. The GPU
// path finds the k-th key by radix select alone (11-bit digits, shared-memory histograms, keys
// recomputed in every pass), counts per tile the keys below and equal to it, and writes each
// tile's selected indices at its offset with a block-wide scan (order-preserving compaction).
// The host drives the passes and reads back the small histograms and per-tile counts.
#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <stdexcept>
#include <string>
#include <vector>

#include "common/sampler_ops.h"

namespace clid_sampler {
namespace {

constexpr int THREADS = 256;
constexpr int64_t TILE = 8192;  // items per block in the count and write passes
constexpr int DIGIT_BITS = 11;
constexpr int BINS = 1 << DIGIT_BITS;
constexpr int MAX_GRID = 4096;  // grid-stride kernels (histograms, NaN scan, keys)

inline void check(cudaError_t err, const char* what) {
    if (err != cudaSuccess) throw std::runtime_error(std::string("clid sampler (CUDA) ") + what + ": " + cudaGetErrorString(err));
}

inline int64_t num_tiles(int64_t m) { return (m + TILE - 1) / TILE; }
inline int grid_for(int64_t m) {
    const int64_t blocks = (m + THREADS - 1) / THREADS;
    return (int)(blocks < MAX_GRID ? (blocks > 0 ? blocks : 1) : MAX_GRID);
}

// ---------------------------------------------------------------------------------------------
// Key functors (device side).

template <typename T>
struct SuccessiveKeyFn {
    const T* u;
    WeightParams w;
    RngParams r;
    __device__ __forceinline__ uint64_t operator()(int64_t i) const {
        return successive_key((double)u[i], (uint64_t)i, w, r);
    }
};

template <typename T>
struct FillKeyFn {
    const T* u;
    WeightParams w;
    __device__ __forceinline__ uint64_t operator()(int64_t i) const { return fill_key(u[i], w); }
};

template <typename T>
struct OrderKeyFn {
    const T* u;
    __device__ __forceinline__ uint64_t operator()(int64_t i) const { return (uint64_t)ord_key(u[i]); }
};

// Workspace layout (bytes): histogram, scalars, then four per-tile int64 arrays.
struct Workspace {
    unsigned long long* hist;     // [BINS]
    unsigned long long* scalars;  // [8]
    long long* tile_lt;           // [tiles]
    long long* tile_eq;           // [tiles]
    long long* tile_offset;       // [tiles]
    long long* tile_take;         // [tiles]
};

Workspace carve(void* base, int64_t m) {
    char* p = (char*)base;
    Workspace w;
    w.hist = (unsigned long long*)p;
    p += sizeof(unsigned long long) * BINS;
    w.scalars = (unsigned long long*)p;
    p += sizeof(unsigned long long) * 8;
    const int64_t t = num_tiles(m);
    w.tile_lt = (long long*)p;
    w.tile_eq = w.tile_lt + t;
    w.tile_offset = w.tile_eq + t;
    w.tile_take = w.tile_offset + t;
    return w;
}

// ---------------------------------------------------------------------------------------------
// Kernels.

template <typename T>
__global__ void first_nan_kernel(const T* __restrict__ u, int64_t m, unsigned long long* first) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < m; i += (int64_t)gridDim.x * blockDim.x)
        if (u[i] != u[i]) atomicMin(first, (unsigned long long)i);
}

// Histogram of the digit (key >> shift) & (2^bits - 1) over the keys whose bits above the digit
// equal prefix (all keys when the digit is the top one).
template <class KeyFn>
__global__ void radix_histogram_kernel(KeyFn key_of, int64_t m, int key_bits, int shift, int bits, uint64_t prefix,
                                       unsigned long long* hist) {
    __shared__ unsigned int local[BINS];
    for (int b = threadIdx.x; b < (1 << bits); b += blockDim.x) local[b] = 0;
    __syncthreads();
    const int above = shift + bits;
    const uint64_t mask = (1ull << bits) - 1;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < m; i += (int64_t)gridDim.x * blockDim.x) {
        const uint64_t key = key_of(i);
        if (above >= key_bits || (key >> above) == prefix) atomicAdd(&local[(key >> shift) & mask], 1u);
    }
    __syncthreads();
    for (int b = threadIdx.x; b < (1 << bits); b += blockDim.x)
        if (local[b]) atomicAdd(&hist[b], (unsigned long long)local[b]);
}

// Per tile: keys below and equal to kth.
template <class KeyFn>
__global__ void tile_count_kernel(KeyFn key_of, int64_t m, uint64_t kth, long long* lt, long long* eq) {
    using Reduce = cub::BlockReduce<long long, THREADS>;
    __shared__ typename Reduce::TempStorage storage;
    const int64_t start = blockIdx.x * TILE;
    const int64_t end = start + TILE < m ? start + TILE : m;
    long long n_lt = 0, n_eq = 0;
    for (int64_t i = start + threadIdx.x; i < end; i += THREADS) {
        const uint64_t key = key_of(i);
        n_lt += key < kth;
        n_eq += key == kth;
    }
    const long long total_lt = Reduce(storage).Sum(n_lt);
    __syncthreads();
    const long long total_eq = Reduce(storage).Sum(n_eq);
    if (threadIdx.x == 0) {
        lt[blockIdx.x] = total_lt;
        eq[blockIdx.x] = total_eq;
    }
}

// Per tile, in index order: the indices with key < kth, and the first take[tile] with key == kth,
// written from offset[tile] on (block-wide exclusive scans keep the order).
template <class KeyFn>
__global__ void tile_write_kernel(KeyFn key_of, int64_t m, uint64_t kth, const long long* offset, const long long* take,
                                  int64_t* out) {
    using Scan = cub::BlockScan<int, THREADS>;
    __shared__ typename Scan::TempStorage storage;
    const int64_t start = blockIdx.x * TILE;
    const int64_t end = start + TILE < m ? start + TILE : m;
    long long pos = offset[blockIdx.x];
    const long long limit = take[blockIdx.x];
    long long ties = 0;
    for (int64_t base = start; base < end; base += THREADS) {
        const int64_t i = base + threadIdx.x;
        const bool valid = i < end;
        const uint64_t key = valid ? key_of(i) : ~0ull;
        const int is_tie = valid && key == kth;
        int tie_rank, tie_total;
        Scan(storage).ExclusiveSum(is_tie, tie_rank, tie_total);
        __syncthreads();
        const int selected = valid && (key < kth || (is_tie && ties + tie_rank < limit));
        int rank, total;
        Scan(storage).ExclusiveSum(selected, rank, total);
        __syncthreads();
        if (selected) out[pos + rank] = i;
        pos += total;
        ties += tie_total;
    }
}

template <typename T>
__global__ void bernoulli_count_kernel(const T* __restrict__ u, int64_t m, WeightParams w, RngParams r, long long* counts) {
    using Reduce = cub::BlockReduce<long long, THREADS>;
    __shared__ typename Reduce::TempStorage storage;
    const int64_t start = blockIdx.x * TILE;
    const int64_t end = start + TILE < m ? start + TILE : m;
    long long n = 0;
    for (int64_t i = start + threadIdx.x; i < end; i += THREADS) n += bernoulli_keep((double)u[i], (uint64_t)i, w, r);
    const long long total = Reduce(storage).Sum(n);
    if (threadIdx.x == 0) counts[blockIdx.x] = total;
}

template <typename T>
__global__ void bernoulli_write_kernel(const T* __restrict__ u, int64_t m, WeightParams w, RngParams r,
                                       const long long* offset, int64_t* out) {
    using Scan = cub::BlockScan<int, THREADS>;
    __shared__ typename Scan::TempStorage storage;
    const int64_t start = blockIdx.x * TILE;
    const int64_t end = start + TILE < m ? start + TILE : m;
    long long pos = offset[blockIdx.x];
    for (int64_t base = start; base < end; base += THREADS) {
        const int64_t i = base + threadIdx.x;
        const int keep = i < end && bernoulli_keep((double)u[i], (uint64_t)i, w, r);
        int rank, total;
        Scan(storage).ExclusiveSum(keep, rank, total);
        __syncthreads();
        if (keep) out[pos + rank] = i;
        pos += total;
    }
}

template <typename T>
__global__ void keys_kernel(const T* __restrict__ u, int64_t m, WeightParams w, RngParams r, uint64_t* keys) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < m; i += (int64_t)gridDim.x * blockDim.x)
        keys[i] = successive_key((double)u[i], (uint64_t)i, w, r);
}

__global__ void iota_kernel(int64_t m, int64_t* out) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < m; i += (int64_t)gridDim.x * blockDim.x) out[i] = i;
}

// ---------------------------------------------------------------------------------------------
// Host drivers.

struct KthResult {
    uint64_t key;
    int64_t below;  // keys < key
};

// k-th smallest key (1 <= k <= m) by radix select: one histogram pass per digit, top digit first.
template <class KeyFn>
KthResult radix_select(KeyFn key_of, int64_t m, int64_t k, int key_bits, const Workspace& ws, cudaStream_t stream) {
    uint64_t prefix = 0;
    int64_t rank = k, below = 0;
    std::vector<unsigned long long> hist(BINS);
    for (int remaining = key_bits; remaining > 0;) {
        const int bits = remaining < DIGIT_BITS ? remaining : DIGIT_BITS;
        const int shift = remaining - bits;
        check(cudaMemsetAsync(ws.hist, 0, sizeof(unsigned long long) * (1 << bits), stream), "memset");
        radix_histogram_kernel<<<grid_for(m), THREADS, 0, stream>>>(key_of, m, key_bits, shift, bits, prefix, ws.hist);
        check(cudaGetLastError(), "histogram kernel");
        check(cudaMemcpyAsync(hist.data(), ws.hist, sizeof(unsigned long long) * (1 << bits), cudaMemcpyDeviceToHost, stream),
              "copy histogram");
        check(cudaStreamSynchronize(stream), "histogram");
        int digit = 0;
        for (; digit < (1 << bits) - 1; ++digit) {
            if ((int64_t)hist[digit] >= rank) break;
            rank -= (int64_t)hist[digit];
            below += (int64_t)hist[digit];
        }
        prefix = (prefix << bits) | (uint64_t)digit;
        remaining = shift;
    }
    return {prefix, below};
}

// Counts per tile, then writes the k selected indices (keys < K*, then ties in index order).
template <class KeyFn>
void write_k_smallest(KeyFn key_of, int64_t m, int64_t k, uint64_t kth, const Workspace& ws, int64_t* out,
                      cudaStream_t stream, int64_t* count_below) {
    const int64_t tiles = num_tiles(m);
    tile_count_kernel<<<(unsigned)tiles, THREADS, 0, stream>>>(key_of, m, kth, ws.tile_lt, ws.tile_eq);
    check(cudaGetLastError(), "count kernel");
    std::vector<long long> lt(tiles), eq(tiles), offset(tiles), take(tiles);
    check(cudaMemcpyAsync(lt.data(), ws.tile_lt, sizeof(long long) * tiles, cudaMemcpyDeviceToHost, stream), "copy counts");
    check(cudaMemcpyAsync(eq.data(), ws.tile_eq, sizeof(long long) * tiles, cudaMemcpyDeviceToHost, stream), "copy counts");
    check(cudaStreamSynchronize(stream), "count");
    long long total_lt = 0;
    for (int64_t t = 0; t < tiles; ++t) total_lt += lt[t];
    *count_below = total_lt;
    long long ties_left = k - total_lt, pos = 0;
    for (int64_t t = 0; t < tiles; ++t) {
        take[t] = eq[t] < ties_left ? eq[t] : (ties_left > 0 ? ties_left : 0);
        ties_left -= take[t];
        offset[t] = pos;
        pos += lt[t] + take[t];
    }
    check(cudaMemcpyAsync(ws.tile_offset, offset.data(), sizeof(long long) * tiles, cudaMemcpyHostToDevice, stream), "copy offsets");
    check(cudaMemcpyAsync(ws.tile_take, take.data(), sizeof(long long) * tiles, cudaMemcpyHostToDevice, stream), "copy offsets");
    tile_write_kernel<<<(unsigned)tiles, THREADS, 0, stream>>>(key_of, m, kth, ws.tile_offset, ws.tile_take, out);
    check(cudaGetLastError(), "write kernel");
    check(cudaStreamSynchronize(stream), "write");  // the host vectors above must outlive the copies
}

template <typename T>
SampleInfo successive_typed(const T* u, int64_t m, int64_t k, WeightParams w, RngParams r, int64_t* out,
                            const Workspace& ws, cudaStream_t stream) {
    SampleInfo info{PATH_TRIVIAL, 0, -1};
    if (k == m && m > 0) {
        iota_kernel<<<grid_for(m), THREADS, 0, stream>>>(m, out);
        check(cudaGetLastError(), "iota kernel");
    }
    if (k == 0 || k == m) return info;
    info.path = PATH_RADIX;
    const SuccessiveKeyFn<T> keys{u, w, r};
    const KthResult kth = radix_select(keys, m, k, 64, ws, stream);
    if (kth.key != SM_ZERO_WEIGHT_KEY) {
        int64_t below = 0;
        write_k_smallest(keys, m, k, kth.key, ws, out, stream, &below);
        return info;
    }
    // Fewer than k positive weights: all of them, then the largest u among the rest.
    info.filled = 1;
    info.positive = kth.below;
    const FillKeyFn<T> fill{u, w};
    const KthResult fill_kth = radix_select(fill, m, k, 64, ws, stream);
    int64_t below = 0;
    write_k_smallest(fill, m, k, fill_kth.key, ws, out, stream, &below);
    return info;
}

template <typename T>
int64_t bernoulli_count_typed(const T* u, int64_t m, WeightParams w, RngParams r, const Workspace& ws, cudaStream_t stream) {
    const int64_t tiles = num_tiles(m);
    if (tiles == 0) return 0;
    bernoulli_count_kernel<<<(unsigned)tiles, THREADS, 0, stream>>>(u, m, w, r, ws.tile_lt);
    check(cudaGetLastError(), "bernoulli count kernel");
    std::vector<long long> counts(tiles), offset(tiles);
    check(cudaMemcpyAsync(counts.data(), ws.tile_lt, sizeof(long long) * tiles, cudaMemcpyDeviceToHost, stream), "copy counts");
    check(cudaStreamSynchronize(stream), "bernoulli count");
    long long pos = 0;
    for (int64_t t = 0; t < tiles; ++t) {
        offset[t] = pos;
        pos += counts[t];
    }
    check(cudaMemcpyAsync(ws.tile_offset, offset.data(), sizeof(long long) * tiles, cudaMemcpyHostToDevice, stream), "copy offsets");
    check(cudaStreamSynchronize(stream), "bernoulli offsets");
    return pos;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The launchers (common/sampler_ops.h). `u` is float (is_double = 0) or double (is_double = 1).

int64_t cuda_workspace_bytes(int64_t m) {
    return (int64_t)(sizeof(unsigned long long) * (BINS + 8) + sizeof(long long) * 4 * num_tiles(m));
}

int64_t first_nan_cuda(const void* u, int is_double, int64_t m, void* workspace, void* stream_ptr) {
    cudaStream_t stream = (cudaStream_t)stream_ptr;
    const Workspace ws = carve(workspace, m);
    if (m == 0) return -1;
    check(cudaMemsetAsync(ws.scalars, 0xFF, sizeof(unsigned long long), stream), "memset");
    if (is_double) first_nan_kernel<<<grid_for(m), THREADS, 0, stream>>>((const double*)u, m, ws.scalars);
    else first_nan_kernel<<<grid_for(m), THREADS, 0, stream>>>((const float*)u, m, ws.scalars);
    check(cudaGetLastError(), "NaN kernel");
    unsigned long long first = 0;
    check(cudaMemcpyAsync(&first, ws.scalars, sizeof first, cudaMemcpyDeviceToHost, stream), "copy");
    check(cudaStreamSynchronize(stream), "NaN scan");
    return first == ~0ull ? -1 : (int64_t)first;
}

void kth_value_cuda(const void* u, int is_double, int64_t m, int64_t k, void* result_host, void* workspace,
                    void* stream_ptr) {
    cudaStream_t stream = (cudaStream_t)stream_ptr;
    const Workspace ws = carve(workspace, m);
    if (is_double) {
        const KthResult kth = radix_select(OrderKeyFn<double>{(const double*)u}, m, k, 64, ws, stream);
        *(double*)result_host = from_ord_key((uint64_t)kth.key);
    } else {
        const KthResult kth = radix_select(OrderKeyFn<float>{(const float*)u}, m, k, 32, ws, stream);
        *(float*)result_host = from_ord_key((uint32_t)kth.key);
    }
}

SampleInfo successive_sample_cuda(const void* u, int is_double, int64_t m, int64_t k, WeightParams w, RngParams r,
                                  int64_t* out, void* workspace, void* stream_ptr) {
    const Workspace ws = carve(workspace, m);
    if (is_double) return successive_typed((const double*)u, m, k, w, r, out, ws, (cudaStream_t)stream_ptr);
    return successive_typed((const float*)u, m, k, w, r, out, ws, (cudaStream_t)stream_ptr);
}

int64_t bernoulli_count_cuda(const void* u, int is_double, int64_t m, WeightParams w, RngParams r, void* workspace,
                             void* stream_ptr) {
    const Workspace ws = carve(workspace, m);
    if (is_double) return bernoulli_count_typed((const double*)u, m, w, r, ws, (cudaStream_t)stream_ptr);
    return bernoulli_count_typed((const float*)u, m, w, r, ws, (cudaStream_t)stream_ptr);
}

void bernoulli_write_cuda(const void* u, int is_double, int64_t m, WeightParams w, RngParams r, int64_t* out,
                          void* workspace, void* stream_ptr) {
    cudaStream_t stream = (cudaStream_t)stream_ptr;
    const Workspace ws = carve(workspace, m);
    const int64_t tiles = num_tiles(m);
    if (tiles == 0) return;
    if (is_double) bernoulli_write_kernel<<<(unsigned)tiles, THREADS, 0, stream>>>((const double*)u, m, w, r, ws.tile_offset, out);
    else bernoulli_write_kernel<<<(unsigned)tiles, THREADS, 0, stream>>>((const float*)u, m, w, r, ws.tile_offset, out);
    check(cudaGetLastError(), "bernoulli write kernel");
}

void successive_keys_cuda(const void* u, int is_double, int64_t m, WeightParams w, RngParams r, uint64_t* keys,
                          void* stream_ptr) {
    cudaStream_t stream = (cudaStream_t)stream_ptr;
    if (m == 0) return;
    if (is_double) keys_kernel<<<grid_for(m), THREADS, 0, stream>>>((const double*)u, m, w, r, keys);
    else keys_kernel<<<grid_for(m), THREADS, 0, stream>>>((const float*)u, m, w, r, keys);
    check(cudaGetLastError(), "keys kernel");
}

}  // namespace clid_sampler
