// token_logprob_hidden_tc: log_softmax(hidden @ weight.T + bias)[target] per position, fused on the tensor
// cores (schedule and constants: csrc/common/fused_head.h). Raw pointers only (no torch headers): nvcc
// compile-checks this file on CPU-only machines.
//
// tc_head_kernel: grid (position tiles, vocabulary splits). Each CTA streams its position tile and the
//   weight rows of its vocabulary tiles through shared memory (cp.async, kStages deep, one flat pipeline
//   over all (tile, k-step) pairs so that the next tile's loads run during a tile's epilogue), multiplies
//   them with mma.sync m16n8k16 (bf16 or fp16 operands read with ldmatrix, float32 accumulators), and
//   after each tile folds the logits (plus the bias; the entries past V masked to -inf) into per-thread
//   running (max, sum of exp) states, keeping the target's logit when the tile holds it. The CTA then
//   merges the states of each row and writes the split's partial state.
// tc_head_merge_kernel: a thread per position merges the splits' states in order, checks the target
//   (a device-side assertion) and writes (z_y - m) - log(s).
// Every reduction has a fixed order: results are bitwise reproducible run to run.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <type_traits>

#include "common/fused_head.h"
#include "common/score.h"
#include "common/score_ops.h"
#include "cuda/target_check.cuh"

namespace clid {
namespace cuda {
namespace {

using namespace tc_head;

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kRowBytes = kBlockK * 2;            // 64: one row of a stage, 4 pieces of 16 bytes
constexpr int kPieces = kRowBytes / 16;
constexpr int kTileBytesA = kBlockRows * kRowBytes;
constexpr int kMmaM = kWarpRows / 16;             // 4 MMA tiles along the rows of a warp
constexpr int kMmaN = kWarpCols / 8;              // 8 along its columns
constexpr int kLoadsA = kBlockRows * kPieces / kThreads;
constexpr int kLoadsB = kBlockCols * kPieces / kThreads;
static_assert(kRowBytes == 64 && kPieces == 4, "the swizzle below is written for rows of 64 bytes");
static_assert(kBlockRows * kPieces % kThreads == 0 && kBlockCols * kPieces % kThreads == 0, "whole loads per thread");
static_assert(kWarpRows % 16 == 0 && kWarpCols % 16 == 0 && kBlockK % 16 == 0, "MMA tiles");
static_assert(kStageBytes == kTileBytesA + kBlockCols * kRowBytes, "stage layout");
static_assert(kStages >= 2, "a pipeline");

// The byte offset of 16-byte piece `piece` of row `row` in a stage's tile. Pieces are swizzled (piece xor
// bits 1-2 of the row) so that the 8 row addresses of each ldmatrix phase fall in 8 different 16-byte
// bank groups: rows r and r + 2 are 128 bytes apart and would otherwise share banks.
__device__ __forceinline__ uint32_t tile_offset(int row, int piece) {
    return (uint32_t)(row * kRowBytes + ((piece ^ ((row >> 1) & 3)) << 4));
}

__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
    // src-size 0 fills the 16 bytes with zeros and reads nothing (rows past P or V, pieces past H)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// 2^x with flush to zero: a result below 2^-126 (an entry more than 87 below the running maximum)
// counts as 0 in a sum that is at least 1; relative error about 2^-22 (PTX ex2.approx).
__device__ __forceinline__ float exp2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// d += a (16 x 16, row-major) * b (16 x 8, column-major), float32 accumulators.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}

struct Shape {
    int P, H, V;      // positions, hidden size (a multiple of kHiddenAlign), vocabulary
    int64_t ldh, ldw; // row strides of hidden and weight in elements (multiples of kHiddenAlign)
    int splits;
};

// The loads of one thread. Thread t copies piece t % kPieces of the rows t / kPieces + kRowStep i of both
// tiles of a stage (i < kLoadsA, kLoadsB); everything but the step's k0 and the B tile's first row is
// fixed, so the pointers, the row counts and the shared-memory offset are computed once.
constexpr int kRowStep = kThreads / kPieces;  // 32 rows between a thread's loads
static_assert(kRowStep % 8 == 0, "a thread's rows share their swizzle");

template <typename T>
struct Loader {
    const T* a;         // hidden row row0 + t / kPieces, at its piece
    const T* b;         // weight row of the current tile's first row + t / kPieces, at its piece
    int64_t a_step, b_step;  // kRowStep rows of hidden, of weight
    int a_rows, b_rows;      // how many of this thread's rows exist (the rest are zero-filled)
    int k_piece;             // the piece's first hidden dimension
    uint32_t offset;         // tile_offset of the thread's first row and piece (the others: + kRowStep rows)

    __device__ __forceinline__ void start(const T* hidden, const T* weight, const Shape& sh, int row0, int tile) {
        const int row = threadIdx.x / kPieces, piece = threadIdx.x % kPieces;
        k_piece = piece * 8;
        offset = tile_offset(row, piece);
        a_step = (int64_t)kRowStep * sh.ldh;
        b_step = (int64_t)kRowStep * sh.ldw;
        a = hidden + (int64_t)(row0 + row) * sh.ldh + k_piece;
        a_rows = rows_left(sh.P - row0 - row);
        set_tile(weight, sh, tile);
    }
    __device__ __forceinline__ void set_tile(const T* weight, const Shape& sh, int tile) {
        const int row = threadIdx.x / kPieces, v = tile * kBlockCols + row;
        b = weight + (int64_t)v * sh.ldw + k_piece;
        b_rows = rows_left(sh.V - v);
    }
    // the rows i with i * kRowStep < left
    __device__ __forceinline__ static int rows_left(int left) { return left <= 0 ? 0 : (left + kRowStep - 1) / kRowStep; }

    // cp.async of hidden dimensions k0 .. k0 + kBlockK - 1 into the stage at `stage_addr`; pieces past H and
    // rows past P or V are zero-filled, with the tensor's start as their (unread) source address: a and b
    // are only dereferenced for rows that exist.
    __device__ __forceinline__ void load(const T* hidden, const T* weight, int H, int k0, uint32_t stage_addr) const {
        const bool k_ok = k0 + k_piece < H;
#pragma unroll
        for (int i = 0; i < kLoadsA; ++i) {
            const bool valid = k_ok && i < a_rows;
            cp_async_16(stage_addr + offset + i * kRowStep * kRowBytes, valid ? a + i * a_step + k0 : hidden, valid);
        }
#pragma unroll
        for (int i = 0; i < kLoadsB; ++i) {
            const bool valid = k_ok && i < b_rows;
            cp_async_16(stage_addr + kTileBytesA + offset + i * kRowStep * kRowBytes, valid ? b + i * b_step + k0 : weight,
                        valid);
        }
    }
};

template <typename T>
__global__ void __launch_bounds__(kThreads, 2)
tc_head_kernel(const T* __restrict__ hidden, const T* __restrict__ weight, const float* __restrict__ bias,
               const int64_t* __restrict__ targets, Shape sh, float2* __restrict__ partial,
               float* __restrict__ target_logit) {
    extern __shared__ __align__(128) unsigned char smem[];
    const uint32_t smem_addr = (uint32_t)__cvta_generic_to_shared(smem);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int wm = warp / kWarpsN, wn = warp % kWarpsN;
    const int group = lane / 4, quad = lane % 4;  // an MMA fragment's row in 8, its column pair
    const int row0 = blockIdx.x * kBlockRows, split = blockIdx.y;
    const int tiles = (int)vocab_tiles(sh.V);
    const int t_begin = (int)split_begin(split, sh.splits, tiles), t_end = (int)split_begin(split + 1, sh.splits, tiles);
    const int nk = (sh.H + kBlockK - 1) / kBlockK;
    const int steps = (t_end - t_begin) * nk;

    // This thread's rows: row0 + wm * kWarpRows + 16 i + 8 h + group; their targets (-1 past P: no column).
    int y[kMmaM][2];
    float run_m[kMmaM][2], run_s[kMmaM][2];
#pragma unroll
    for (int i = 0; i < kMmaM; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int p = row0 + wm * kWarpRows + 16 * i + 8 * h + group;
            y[i][h] = p < sh.P ? (int)targets[p] : -1;
            run_m[i][h] = -INFINITY;
            run_s[i][h] = 0.0f;
        }
    float acc[kMmaM][kMmaN][4];
#pragma unroll
    for (int i = 0; i < kMmaM; ++i)
#pragma unroll
        for (int j = 0; j < kMmaN; ++j)
#pragma unroll
            for (int c = 0; c < 4; ++c) acc[i][j][c] = 0.0f;

    // The flat sequence of steps (tile, k0): the producer's position in it (load_tile, load_k), and the
    // consumer's (tile, k-step kk); the producer runs kStages - 1 steps ahead.
    Loader<T> loader;
    loader.start(hidden, weight, sh, row0, t_begin);
    int load_tile = t_begin, load_k = 0;
    int tile = t_begin, kk = 0;
    const auto load_next = [&](int stage) {
        loader.load(hidden, weight, sh.H, load_k, smem_addr + stage * kStageBytes);
        load_k += kBlockK;
        if (load_k >= sh.H) {
            load_k = 0;
            loader.set_tile(weight, sh, ++load_tile);
        }
    };
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
        if (s < steps) load_next(s);
        cp_async_commit();
    }

    // ldmatrix addresses: A, the rows wm * kWarpRows + 16 i + (lane % 16), piece 2 ks + lane / 16; B, the
    // vocabulary rows wn * kWarpCols + 16 jj + 8 (lane / 16) + lane % 8, piece 2 ks + (lane / 8) % 2.
    // The swizzle of a row depends on its bits 1-2 only, the same for rows 16 apart: per ks, one offset for
    // i = 0 (jj = 0), the others 16 rows (1 KiB) further each.
    const int a_row = wm * kWarpRows + lane % 16, a_piece = lane / 16;
    const int b_row = wn * kWarpCols + 8 * (lane / 16) + lane % 8, b_piece = (lane / 8) % 2;
    uint32_t a_off[kBlockK / 16], b_off[kBlockK / 16];
#pragma unroll
    for (int ks = 0; ks < kBlockK / 16; ++ks) {
        a_off[ks] = tile_offset(a_row, 2 * ks + a_piece);
        b_off[ks] = kTileBytesA + tile_offset(b_row, 2 * ks + b_piece);
    }

    for (int g = 0; g < steps; ++g) {
        cp_async_wait<kStages - 2>();  // step g's stage has landed (this thread's loads) ...
        __syncthreads();               // ... everyone's, and the stage of step g - 1 is free again
        const int next = g + kStages - 1;
        if (next < steps) load_next(next % kStages);
        cp_async_commit();

        const uint32_t stage_addr = smem_addr + (g % kStages) * kStageBytes;
#pragma unroll
        for (int ks = 0; ks < kBlockK / 16; ++ks) {
            uint32_t a[kMmaM][4], b[kMmaN][2];
#pragma unroll
            for (int i = 0; i < kMmaM; ++i) ldmatrix_x4(a[i], stage_addr + a_off[ks] + 16 * i * kRowBytes);
#pragma unroll
            for (int jj = 0; jj < kMmaN / 2; ++jj) {
                uint32_t r[4];
                ldmatrix_x4(r, stage_addr + b_off[ks] + 16 * jj * kRowBytes);
                b[2 * jj][0] = r[0];
                b[2 * jj][1] = r[1];
                b[2 * jj + 1][0] = r[2];
                b[2 * jj + 1][1] = r[3];
            }
#pragma unroll
            for (int i = 0; i < kMmaM; ++i)
#pragma unroll
                for (int j = 0; j < kMmaN; ++j) mma_16816<T>(acc[i][j], a[i], b[j][0], b[j][1]);
        }

        if (++kk < nk) continue;
        // The tile is complete: fold it into the rows' states. This thread's columns are
        // c0 + 8 j + e (j < kMmaN, e < 2); off = the bias, or -inf past V.
        const int c0 = tile * kBlockCols + wn * kWarpCols + 2 * quad;
        kk = 0;
        ++tile;
        float off[kMmaN][2];
#pragma unroll
        for (int j = 0; j < kMmaN; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int c = c0 + 8 * j + e;
                off[j][e] = c < sh.V ? (bias != nullptr ? __ldg(bias + c) : 0.0f) : -INFINITY;
            }
#pragma unroll
        for (int i = 0; i < kMmaM; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float mx = -INFINITY;
#pragma unroll
                for (int j = 0; j < kMmaN; ++j)
#pragma unroll
                    for (int e = 0; e < 2; ++e) mx = fmaxf(mx, acc[i][j][2 * h + e] + off[j][e]);
                // the target is one of this thread's columns c0 + 8 j + e: then (rarely) find which
                const int dy = y[i][h] - c0;
                if ((unsigned)dy < (unsigned)kWarpCols && (dy & 6) == 0) {
#pragma unroll
                    for (int j = 0; j < kMmaN; ++j)
#pragma unroll
                        for (int e = 0; e < 2; ++e)
                            if (dy == 8 * j + e)
                                target_logit[row0 + wm * kWarpRows + 16 * i + 8 * h + group] = acc[i][j][2 * h + e] + off[j][e];
                }
                const float m = fmaxf(run_m[i][h], mx);
                // an all -inf state and chunk add exp(-inf) = 0 around 0 (NaN logits still give NaN)
                const float base = m == -INFINITY ? 0.0f : m;
                float sum = 0.0f;
#pragma unroll
                for (int j = 0; j < kMmaN; ++j)
#pragma unroll
                    for (int e = 0; e < 2; ++e) sum += exp2_ftz((acc[i][j][2 * h + e] + off[j][e] - base) * kLog2e);
                run_s[i][h] = run_s[i][h] * exp2_ftz((run_m[i][h] - base) * kLog2e) + sum;
                run_m[i][h] = m;
            }
#pragma unroll
        for (int i = 0; i < kMmaM; ++i)
#pragma unroll
            for (int j = 0; j < kMmaN; ++j)
#pragma unroll
                for (int c = 0; c < 4; ++c) acc[i][j][c] = 0.0f;
    }
    cp_async_wait<0>();

    // Merge each row's states: the 4 threads of its quad (xor 1, then xor 2: every lane ends with the same
    // state, lse_merge being symmetric), then the kWarpsN warps in order, through shared memory.
#pragma unroll
    for (int i = 0; i < kMmaM; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            LseState st{run_m[i][h], run_s[i][h]};
#pragma unroll
            for (int x = 1; x <= 2; x *= 2) {
                const LseState other{__shfl_xor_sync(0xffffffffu, st.m, x), __shfl_xor_sync(0xffffffffu, st.s, x)};
                st = lse_merge(st, other);
            }
            run_m[i][h] = st.m;
            run_s[i][h] = st.s;
        }
    __syncthreads();  // the pipeline's shared memory is free
    float2* states = reinterpret_cast<float2*>(smem);  // [kWarpsN][kBlockRows]
    if (quad == 0) {
#pragma unroll
        for (int i = 0; i < kMmaM; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                states[wn * kBlockRows + wm * kWarpRows + 16 * i + 8 * h + group] = make_float2(run_m[i][h], run_s[i][h]);
    }
    __syncthreads();
    for (int r = threadIdx.x; r < kBlockRows; r += kThreads) {
        if (row0 + r >= sh.P) break;
        LseState st = lse_empty();
#pragma unroll
        for (int w = 0; w < kWarpsN; ++w) {
            const float2 v = states[w * kBlockRows + r];
            st = lse_merge(st, LseState{v.x, v.y});
        }
        partial[(int64_t)split * sh.P + row0 + r] = make_float2(st.m, st.s);
    }
}

__global__ void tc_head_merge_kernel(const float2* __restrict__ partial, const float* __restrict__ target_logit,
                                     const int64_t* __restrict__ targets, int64_t P, int64_t V, int splits,
                                     float* __restrict__ out) {
    for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < P; p += (int64_t)gridDim.x * blockDim.x) {
        check_target(targets[p], V, "token_logprob_hidden_tc", p, -1);
        LseState st = lse_empty();
        for (int k = 0; k < splits; ++k) {
            const float2 v = partial[k * P + p];
            st = lse_merge(st, LseState{v.x, v.y});
        }
        out[p] = lse_logprob(st, target_logit[p]);
    }
}

template <typename T>
int slots_of() {
    int device = 0, sms = 0, per_sm = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    cudaFuncSetAttribute(tc_head_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, tc_head_kernel<T>, kThreads, kSmemBytes);
    return sms * (per_sm > 0 ? per_sm : 1);
}

template <typename T>
void launch(const void* hidden, const void* weight, const Shape& sh, const float* bias, const int64_t* targets,
            float* partial, float* target_logit, float* out, cudaStream_t s) {
    cudaFuncSetAttribute(tc_head_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
    const dim3 grid((unsigned)((sh.P + kBlockRows - 1) / kBlockRows), (unsigned)sh.splits);
    tc_head_kernel<T><<<grid, kThreads, kSmemBytes, s>>>(static_cast<const T*>(hidden), static_cast<const T*>(weight),
                                                          bias, targets, sh, reinterpret_cast<float2*>(partial),
                                                          target_logit);
    const int threads = 256;
    const int64_t blocks = (sh.P + threads - 1) / threads;
    tc_head_merge_kernel<<<(unsigned)(blocks < (1 << 30) ? blocks : (1 << 30)), threads, 0, s>>>(
        reinterpret_cast<const float2*>(partial), target_logit, targets, sh.P, sh.V, sh.splits, out);
}

}  // namespace

int hidden_tc_slots(DType dtype) {
    return dtype == DType::bf16 ? slots_of<__nv_bfloat16>() : slots_of<__half>();
}

void hidden_logprob_tc(const void* hidden, const void* weight, DType dtype, int64_t P, int64_t H, int64_t V,
                       int64_t ldh, int64_t ldw, const float* bias, const int64_t* targets, int64_t splits,
                       float* partial, float* target_logit, float* out, void* stream) {
    if (P == 0) return;
    const Shape sh{(int)P, (int)H, (int)V, ldh, ldw, (int)splits};
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    if (dtype == DType::bf16)
        launch<__nv_bfloat16>(hidden, weight, sh, bias, targets, partial, target_logit, out, s);
    else
        launch<__half>(hidden, weight, sh, bias, targets, partial, target_logit, out, s);
}

}  // namespace cuda
}  // namespace clid
