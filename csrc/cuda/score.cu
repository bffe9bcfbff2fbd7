// CUDA kernels of the fused Eq. 2 scoring (contracts in csrc/common/score_ops.h).
// Raw pointers only (no torch headers): nvcc compile-checks this file on CPU-only machines.
//
// rows_logprob: one block per row; each thread runs an online log-sum-exp over a strided slice of
//               the row, then the block merges the states in a fixed tree.
// seq_logprob:  the same per scored row of [N, T, V] logits, read with 16-byte loads, straight from
//               the mask (no list of scored rows, no host synchronisation), then a mean per caption.
// hidden_tile:  token_logprob_hidden's reduction over one tile of logits that cuBLAS computed into a
//               bounded buffer (csrc/cuda/ops.cpp): the bias, the running log-sum-exp of each row
//               across the tiles, the target's logit, and on the last tile the result.
// All reductions have a fixed order, so results are bitwise reproducible run to run.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdint.h>
#include <string.h>

#include "common/score.h"
#include "common/score_ops.h"
#include "cuda/target_check.cuh"

namespace clid {
namespace cuda {
namespace {

constexpr int kRowThreads = 256;   // threads per row in rows_logprob
constexpr int64_t kMaxGrid = 1 << 30;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

__device__ __forceinline__ LseState shfl_down(LseState st, int offset) {
    return {__shfl_down_sync(0xffffffffu, st.m, offset), __shfl_down_sync(0xffffffffu, st.s, offset)};
}

// Merge the states of a whole block (blockDim.x a multiple of 32, at most 1024); the result is
// valid in thread 0. Fixed tree: shuffles within each warp, then warp 0 over the warps in order.
__device__ LseState block_merge(LseState st) {
    __shared__ float sm_m[32], sm_s[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
    for (int offset = 16; offset > 0; offset /= 2) st = lse_merge(st, shfl_down(st, offset));
    if (lane == 0) { sm_m[warp] = st.m; sm_s[warp] = st.s; }
    __syncthreads();
    if (warp == 0) {
        st = lane < n_warps ? LseState{sm_m[lane], sm_s[lane]} : lse_empty();
        for (int offset = 16; offset > 0; offset /= 2) st = lse_merge(st, shfl_down(st, offset));
    }
    __syncthreads();  // the shared arrays may be reused by the next row
    return st;
}

template <typename T>
__global__ void __launch_bounds__(kRowThreads)
rows_logprob_kernel(const T* __restrict__ logits, int64_t V, int64_t n_rows,
                    const int64_t* __restrict__ row_offsets, const int64_t* __restrict__ targets,
                    float* __restrict__ out) {
    for (int64_t r = blockIdx.x; r < n_rows; r += gridDim.x) {
        const T* z = logits + row_offsets[r];
        LseState st = lse_empty();
        for (int64_t j = threadIdx.x; j < V; j += blockDim.x) st = lse_add(st, to_float(z[j]));
        st = block_merge(st);
        if (threadIdx.x == 0) out[r] = lse_logprob(st, to_float(z[targets[r]]));
    }
}

__global__ void segment_mean_kernel(const float* __restrict__ values, const int64_t* __restrict__ offsets,
                                    int64_t n_segments, float* __restrict__ out) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n_segments;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t begin = offsets[i], end = offsets[i + 1];
        double sum = 0.0;
        for (int64_t j = begin; j < end; ++j) sum += values[j];
        out[i] = end > begin ? (float)(sum / (double)(end - begin)) : __int_as_float(0x7fc00000);
    }
}

// The online log-sum-exp state of a row of V logits, read with 16-byte loads (the elements before the
// first 16-byte boundary and after the last one one by one). The result is valid in thread 0.
template <typename T>
__device__ LseState row_state(const T* __restrict__ z, int64_t V) {
    constexpr int kVec = 16 / sizeof(T);
    LseState st = lse_empty();
    int64_t head = (int64_t)((16 - reinterpret_cast<uintptr_t>(z) % 16) % 16) / (int64_t)sizeof(T);
    if (head > V) head = V;
    for (int64_t j = threadIdx.x; j < head; j += blockDim.x) st = lse_add(st, to_float(z[j]));
    const int64_t n_vec = (V - head) / kVec;
    const uint4* zv = reinterpret_cast<const uint4*>(z + head);
    for (int64_t i = threadIdx.x; i < n_vec; i += blockDim.x) {
        const uint4 raw = __ldg(zv + i);
        T e[kVec];
        memcpy(e, &raw, sizeof(raw));
#pragma unroll
        for (int k = 0; k < kVec; ++k) st = lse_add(st, to_float(e[k]));
    }
    for (int64_t j = head + n_vec * kVec + threadIdx.x; j < V; j += blockDim.x) st = lse_add(st, to_float(z[j]));
    return block_merge(st);
}

// seq_logprob, step 1: log_softmax(logits[n, t])[targets[n, t]] into values[n * T + t] for every scored
// (n, t); a block per row, unscored rows skipped.
template <typename T, typename TY>
__global__ void __launch_bounds__(kRowThreads)
seq_rows_kernel(const T* __restrict__ logits, int64_t T_, int64_t V, int64_t stride_n, int64_t stride_t,
                int64_t n_rows, const TY* __restrict__ targets, const bool* __restrict__ mask,
                float* __restrict__ values) {
    for (int64_t r = blockIdx.x; r < n_rows; r += gridDim.x) {
        if (!mask[r]) continue;
        const int64_t n = r / T_, t = r % T_;
        const int64_t y = (int64_t)targets[r];
        if (threadIdx.x == 0) check_target(y, V, "seq_logprob", n, t);
        const T* z = logits + n * stride_n + t * stride_t;
        const LseState st = row_state(z, V);
        if (threadIdx.x == 0) values[r] = lse_logprob(st, to_float(z[y]));
    }
}

// seq_logprob, step 2: each caption's mean over its scored rows, in row order, in float64 (NaN if none).
__global__ void seq_mean_kernel(const float* __restrict__ values, const bool* __restrict__ mask, int64_t N,
                                int64_t T_, float* __restrict__ out) {
    for (int64_t n = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; n < N; n += (int64_t)gridDim.x * blockDim.x) {
        double sum = 0.0;
        int64_t m = 0;
        for (int64_t t = 0; t < T_; ++t)
            if (mask[n * T_ + t]) { sum += values[n * T_ + t]; ++m; }
        out[n] = m ? (float)(sum / (double)m) : __int_as_float(0x7fc00000);
    }
}

// token_logprob_hidden over one tile of logits without bias, tile[r, j] = h[p0 + r] . W[v0 + j] (rows x
// width, row-major): a block per row adds the bias, merges the tile's state into the row's state (tiles
// in vocabulary order), keeps the target's logit when the tile holds it; the last tile writes the result.
__global__ void __launch_bounds__(kRowThreads)
hidden_tile_kernel(const float* __restrict__ tile, int64_t rows, int64_t width, int64_t p0, int64_t v0, int64_t V,
                   const float* __restrict__ bias, const int64_t* __restrict__ targets, float* __restrict__ state,
                   float* __restrict__ target_logit, float* __restrict__ out, bool first, bool last) {
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* z = tile + r * width;
        LseState st = lse_empty();
        for (int64_t j = threadIdx.x; j < width; j += blockDim.x)
            st = lse_add(st, z[j] + (bias != nullptr ? bias[v0 + j] : 0.0f));
        st = block_merge(st);
        if (threadIdx.x != 0) continue;
        const int64_t p = p0 + r, y = targets[p];
        if (first) check_target(y, V, "token_logprob_hidden", p, -1);
        if (!first) st = lse_merge(LseState{state[2 * p], state[2 * p + 1]}, st);
        if (y >= v0 && y < v0 + width) target_logit[p] = z[y - v0] + (bias != nullptr ? bias[y] : 0.0f);
        if (last) {
            out[p] = lse_logprob(st, target_logit[p]);
        } else {
            state[2 * p] = st.m;
            state[2 * p + 1] = st.s;
        }
    }
}

unsigned row_grid(int64_t rows) { return (unsigned)(rows < kMaxGrid ? rows : kMaxGrid); }

template <typename T>
void launch_seq(const void* logits, int64_t N, int64_t T_, int64_t V, int64_t stride_n, int64_t stride_t,
                const void* targets, bool targets_int32, const bool* mask, float* values, cudaStream_t s) {
    const T* z = static_cast<const T*>(logits);
    const int64_t rows = N * T_;
    if (targets_int32)
        seq_rows_kernel<<<row_grid(rows), kRowThreads, 0, s>>>(z, T_, V, stride_n, stride_t, rows,
                                                                static_cast<const int32_t*>(targets), mask, values);
    else
        seq_rows_kernel<<<row_grid(rows), kRowThreads, 0, s>>>(z, T_, V, stride_n, stride_t, rows,
                                                                static_cast<const int64_t*>(targets), mask, values);
}

}  // namespace

void rows_logprob(const void* logits, DType dtype, int64_t V, int64_t n_rows, const int64_t* row_offsets,
                  const int64_t* targets, float* out, void* stream) {
    if (n_rows == 0) return;
    const unsigned grid = (unsigned)(n_rows < kMaxGrid ? n_rows : kMaxGrid);
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    switch (dtype) {
        case DType::f32:
            rows_logprob_kernel<<<grid, kRowThreads, 0, s>>>(static_cast<const float*>(logits), V, n_rows, row_offsets, targets, out);
            break;
        case DType::f16:
            rows_logprob_kernel<<<grid, kRowThreads, 0, s>>>(static_cast<const __half*>(logits), V, n_rows, row_offsets, targets, out);
            break;
        case DType::bf16:
            rows_logprob_kernel<<<grid, kRowThreads, 0, s>>>(static_cast<const __nv_bfloat16*>(logits), V, n_rows, row_offsets, targets, out);
            break;
    }
}

void segment_mean(const float* values, const int64_t* offsets, int64_t n_segments, float* out, void* stream) {
    if (n_segments == 0) return;
    const int threads = 256;
    const int64_t blocks = (n_segments + threads - 1) / threads;
    segment_mean_kernel<<<(unsigned)(blocks < kMaxGrid ? blocks : kMaxGrid), threads, 0,
                          static_cast<cudaStream_t>(stream)>>>(values, offsets, n_segments, out);
}

void seq_logprob(const void* logits, DType dtype, int64_t N, int64_t T, int64_t V, int64_t stride_n, int64_t stride_t,
                 const void* targets, bool targets_int32, const bool* mask, float* values, float* out, void* stream) {
    if (N == 0) return;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    if (T > 0) {
        switch (dtype) {
            case DType::f32: launch_seq<float>(logits, N, T, V, stride_n, stride_t, targets, targets_int32, mask, values, s); break;
            case DType::f16: launch_seq<__half>(logits, N, T, V, stride_n, stride_t, targets, targets_int32, mask, values, s); break;
            case DType::bf16: launch_seq<__nv_bfloat16>(logits, N, T, V, stride_n, stride_t, targets, targets_int32, mask, values, s); break;
        }
    }
    const int threads = 128;
    const int64_t blocks = (N + threads - 1) / threads;
    seq_mean_kernel<<<(unsigned)(blocks < kMaxGrid ? blocks : kMaxGrid), threads, 0, s>>>(values, mask, N, T, out);
}

void hidden_tile(const float* tile, int64_t rows, int64_t width, int64_t p0, int64_t v0, int64_t V, const float* bias,
                 const int64_t* targets, float* state, float* target_logit, float* out, bool first, bool last,
                 void* stream) {
    if (rows == 0) return;
    hidden_tile_kernel<<<row_grid(rows), kRowThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        tile, rows, width, p0, v0, V, bias, targets, state, target_logit, out, first, last);
}

}  // namespace cuda
}  // namespace clid
