// Raw-pointer entry points of the scoring kernels (CPU: csrc/cpu/score.cpp, CUDA: csrc/cuda/score.cu).
// The binding (csrc/binding.cpp) checks shapes, dtypes and target ranges before calling them.
#pragma once

#include <stdint.h>

#include "common/score.h"

namespace clid {

namespace cpu {

// out[r] = log_softmax(row r)[targets[r]] for n_rows rows of V logits of type dtype; row r starts
// at element row_offsets[r] of `logits`. Rows are spread over `num_threads` OpenMP threads; each
// row is reduced by one thread in a fixed order, so the result does not depend on the count.
void rows_logprob(const void* logits, DType dtype, int64_t V, int64_t n_rows,
                  const int64_t* row_offsets, const int64_t* targets, float* out, int num_threads);

// out[i] = mean of values[offsets[i] : offsets[i+1]], summed in order in float64; NaN if empty.
void segment_mean(const float* values, const int64_t* offsets, int64_t n_segments, float* out);

// out[p] = log_softmax(hidden[p] . weight^T + bias)[targets[p]] without a [P, V] logits buffer:
// vocabulary tiles of a fixed size, row blocks of a fixed size, one single-threaded GEMM per
// (row block, tile) unit, per-unit log-sum-exp states merged in tile order. `hidden` is float32
// [P, H] with row stride ldh; `weight` [V, H] of type wdtype with row stride ldw; `bias` float32
// [V] or null. Rows are processed in slabs of kHiddenSlabRows. Extra memory: per thread one
// row-block x tile buffer (+ a converted weight tile for half types), plus 2 floats per
// (tile, row of a slab) and 1 per row of a slab.
void hidden_logprob(const float* hidden, int64_t P, int64_t H, int64_t ldh,
                    const void* weight, DType wdtype, int64_t V, int64_t ldw,
                    const float* bias, const int64_t* targets, float* out, int num_threads);

// The fixed tiling of hidden_logprob (exposed for the memory accounting in the benchmark).
constexpr int64_t kHiddenRowBlock = 128;
constexpr int64_t kHiddenVocabTile = 512;
constexpr int64_t kHiddenSlabRows = 32 * kHiddenRowBlock;  // 4096 rows

}  // namespace cpu

#ifdef CLID_WITH_CUDA
namespace cuda {

// Same contracts as the CPU functions; pointers are device pointers, `stream` a cudaStream_t.
// `scratch` must hold rows_logprob: nothing; hidden_logprob: hidden_scratch_floats(P, V) floats.
void rows_logprob(const void* logits, DType dtype, int64_t V, int64_t n_rows,
                  const int64_t* row_offsets, const int64_t* targets, float* out, void* stream);
void segment_mean(const float* values, const int64_t* offsets, int64_t n_segments, float* out,
                  void* stream);
int64_t hidden_scratch_floats(int64_t P, int64_t V);
void hidden_logprob(const void* hidden, DType hdtype, int64_t P, int64_t H, int64_t ldh,
                    const void* weight, DType wdtype, int64_t V, int64_t ldw,
                    const float* bias, const int64_t* targets, float* out, float* scratch,
                    void* stream);

}  // namespace cuda
#endif

}  // namespace clid
