// CUDA kernels of the fused Eq. 2 scoring (contracts in csrc/common/score_ops.h).
// Raw pointers only (no torch headers): nvcc compile-checks this file on CPU-only machines.
//
// rows_logprob:   one block per row; each thread runs an online log-sum-exp over a strided
//                 slice of the row, then the block merges the states in a fixed tree.
// hidden_logprob: a block computes 64 rows x 64 vocabulary entries of h.W^T + b at a time (fp32
//                 accumulation in registers, 4 x 4 per thread), keeps each row's running state
//                 over a chunk of kChunkTiles tiles, and writes one partial state per (chunk,
//                 row); a second kernel merges the chunks of each row in order. No [P, V] buffer.
// All reductions have a fixed order, so results are bitwise reproducible run to run.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdint.h>

#include "common/score.h"
#include "common/score_ops.h"

namespace clid {
namespace cuda {
namespace {

constexpr int kRowThreads = 256;   // threads per row in rows_logprob
constexpr int kBM = 64;            // rows of hidden per block
constexpr int kBN = 64;            // vocabulary entries per tile
constexpr int kBK = 16;            // hidden features per shared-memory stage
constexpr int kChunkTiles = 16;    // tiles per block (a vocabulary chunk of 1024 entries)
constexpr int kHiddenThreads = 256;
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

// Grid: (row blocks, vocabulary chunks). Thread t computes rows (t / 16) + 16 i and columns
// (t % 16) + 16 j of each 64 x 64 tile (i, j < 4): strided so shared-memory reads do not conflict.
// (No __launch_bounds__: with it nvcc 13 caps the kernel at 64 registers for sm_90 and spills;
// without it the kernel takes about 72 registers, so three 256-thread blocks fit on an SM.)
template <typename TH, typename TW>
__global__ void hidden_tiles_kernel(const TH* __restrict__ hidden, int64_t P, int64_t H, int64_t ldh,
                    const TW* __restrict__ weight, int64_t V, int64_t ldw,
                    const float* __restrict__ bias, const int64_t* __restrict__ targets,
                    float* __restrict__ chunk_m, float* __restrict__ chunk_s,
                    float* __restrict__ target_logit) {
    __shared__ float As[kBK][kBM + 4];      // hidden stage, transposed: As[k][row] (+4: fewer bank conflicts)
    __shared__ float Ws[kBK][kBN + 4];      // weight stage, transposed: Ws[k][vocab]
    __shared__ float Cs[kBM][kBN + 1];      // the finished logits tile (+1 avoids bank conflicts)

    const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
    const int64_t p0 = (int64_t)blockIdx.x * kBM;
    const int64_t chunk = blockIdx.y;
    // Row statistics: 4 threads per row, thread q scans columns q*16 .. q*16+15.
    const int stat_row = tid / 4, stat_q = tid % 4;
    const int64_t stat_p = p0 + stat_row;
    const int64_t stat_y = stat_p < P ? targets[stat_p] : -1;
    LseState running = lse_empty();

    for (int tile = 0; tile < kChunkTiles; ++tile) {
        const int64_t v0 = (chunk * kChunkTiles + tile) * kBN;
        if (v0 >= V) break;
        float acc[4][4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

        for (int64_t k0 = 0; k0 < H; k0 += kBK) {
            // Stage 64 x 16 of hidden and 64 x 16 of weight: each thread loads 4 of each.
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int idx = tid + e * kHiddenThreads;   // 0 .. 1023
                const int row = idx / kBK, k = idx % kBK;
                const int64_t p = p0 + row, v = v0 + row, kk = k0 + k;
                As[k][row] = (p < P && kk < H) ? to_float(hidden[p * ldh + kk]) : 0.0f;
                Ws[k][row] = (v < V && kk < H) ? to_float(weight[v * ldw + kk]) : 0.0f;
            }
            __syncthreads();
#pragma unroll
            for (int k = 0; k < kBK; ++k) {
                float a[4], b[4];
#pragma unroll
                for (int i = 0; i < 4; ++i) a[i] = As[k][ty + 16 * i];
#pragma unroll
                for (int j = 0; j < 4; ++j) b[j] = Ws[k][tx + 16 * j];
#pragma unroll
                for (int i = 0; i < 4; ++i)
#pragma unroll
                    for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
            }
            __syncthreads();
        }
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int64_t v = v0 + tx + 16 * j;
                Cs[ty + 16 * i][tx + 16 * j] = acc[i][j] + ((bias != nullptr && v < V) ? bias[v] : 0.0f);
            }
        __syncthreads();

        // This tile's state of each row, merged into the running state in column order.
        LseState st = lse_empty();
        for (int c = stat_q * 16; c < stat_q * 16 + 16; ++c)
            if (v0 + c < V) st = lse_add(st, Cs[stat_row][c]);
        // The 4 threads of a row are consecutive lanes of one warp: merge q = 0..3 as ((0,1),(2,3)).
        st = lse_merge(st, LseState{__shfl_down_sync(0xffffffffu, st.m, 1), __shfl_down_sync(0xffffffffu, st.s, 1)});
        st = lse_merge(st, LseState{__shfl_down_sync(0xffffffffu, st.m, 2), __shfl_down_sync(0xffffffffu, st.s, 2)});
        if (stat_q == 0 && stat_p < P) {
            running = lse_merge(running, st);
            if (stat_y >= v0 && stat_y < v0 + kBN) target_logit[stat_p] = Cs[stat_row][stat_y - v0];
        }
        __syncthreads();  // Cs is rewritten by the next tile
    }
    if (stat_q == 0 && stat_p < P) {
        chunk_m[chunk * P + stat_p] = running.m;
        chunk_s[chunk * P + stat_p] = running.s;
    }
}

__global__ void hidden_merge_kernel(int64_t P, int64_t n_chunks, const float* __restrict__ chunk_m,
                                    const float* __restrict__ chunk_s, const float* __restrict__ target_logit,
                                    float* __restrict__ out) {
    for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < P; p += (int64_t)gridDim.x * blockDim.x) {
        LseState st = lse_empty();
        for (int64_t c = 0; c < n_chunks; ++c) st = lse_merge(st, LseState{chunk_m[c * P + p], chunk_s[c * P + p]});
        out[p] = lse_logprob(st, target_logit[p]);
    }
}

int64_t n_chunks_of(int64_t V) {
    const int64_t chunk = (int64_t)kBN * kChunkTiles;
    return (V + chunk - 1) / chunk;
}

template <typename TH, typename TW>
void launch_hidden(const void* hidden, int64_t P, int64_t H, int64_t ldh, const void* weight, int64_t V,
                   int64_t ldw, const float* bias, const int64_t* targets, float* out, float* scratch,
                   cudaStream_t stream) {
    const int64_t n_chunks = n_chunks_of(V);
    float* chunk_m = scratch;
    float* chunk_s = scratch + n_chunks * P;
    float* target_logit = scratch + 2 * n_chunks * P;
    dim3 grid((unsigned)((P + kBM - 1) / kBM), (unsigned)n_chunks);
    hidden_tiles_kernel<TH, TW><<<grid, kHiddenThreads, 0, stream>>>(
        static_cast<const TH*>(hidden), P, H, ldh, static_cast<const TW*>(weight), V, ldw, bias, targets,
        chunk_m, chunk_s, target_logit);
    const int threads = 256;
    const int64_t blocks = (P + threads - 1) / threads;
    hidden_merge_kernel<<<(unsigned)(blocks < kMaxGrid ? blocks : kMaxGrid), threads, 0, stream>>>(
        P, n_chunks, chunk_m, chunk_s, target_logit, out);
}

template <typename TH>
void launch_hidden_w(DType wdtype, const void* hidden, int64_t P, int64_t H, int64_t ldh, const void* weight,
                     int64_t V, int64_t ldw, const float* bias, const int64_t* targets, float* out,
                     float* scratch, cudaStream_t stream) {
    switch (wdtype) {
        case DType::f32: return launch_hidden<TH, float>(hidden, P, H, ldh, weight, V, ldw, bias, targets, out, scratch, stream);
        case DType::f16: return launch_hidden<TH, __half>(hidden, P, H, ldh, weight, V, ldw, bias, targets, out, scratch, stream);
        case DType::bf16: return launch_hidden<TH, __nv_bfloat16>(hidden, P, H, ldh, weight, V, ldw, bias, targets, out, scratch, stream);
    }
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

int64_t hidden_scratch_floats(int64_t P, int64_t V) { return 2 * n_chunks_of(V) * P + P; }

void hidden_logprob(const void* hidden, DType hdtype, int64_t P, int64_t H, int64_t ldh,
                    const void* weight, DType wdtype, int64_t V, int64_t ldw,
                    const float* bias, const int64_t* targets, float* out, float* scratch, void* stream) {
    if (P == 0) return;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    switch (hdtype) {
        case DType::f32: return launch_hidden_w<float>(wdtype, hidden, P, H, ldh, weight, V, ldw, bias, targets, out, scratch, s);
        case DType::f16: return launch_hidden_w<__half>(wdtype, hidden, P, H, ldh, weight, V, ldw, bias, targets, out, scratch, s);
        case DType::bf16: return launch_hidden_w<__nv_bfloat16>(wdtype, hidden, P, H, ldh, weight, V, ldw, bias, targets, out, scratch, s);
    }
}

}  // namespace cuda
}  // namespace clid
