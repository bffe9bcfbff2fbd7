// Raw-pointer entry points of the scoring kernels (CPU: csrc/cpu/score*.cpp, CUDA: csrc/cuda/score.cu).
// The tensor-level ops (csrc/ops.h) check shapes, dtypes and target ranges before calling them.
#pragma once

#include <stdint.h>

#include "common/score.h"

namespace clid {

namespace cpu {

// The raw-pointer API (csrc/cpu/score_api.h): the top-level functions (csrc/cpu/score.cpp) call
// the same functions of one of the namespaces base, avx2, avx512: the kernels
// (csrc/cpu/score_kernels.h) compiled for that instruction set.
#include "cpu/score_api.h"
namespace base {
#include "cpu/score_api.h"
}
namespace avx2 {
#include "cpu/score_api.h"
}
namespace avx512 {
#include "cpu/score_api.h"
}

// The fixed tiling of hidden_logprob (exposed for the memory accounting in the benchmark).
constexpr int64_t kHiddenRowBlock = 128;
constexpr int64_t kHiddenVocabTile = 512;
constexpr int64_t kHiddenSlabRows = 32 * kHiddenRowBlock;  // 4096 rows

}  // namespace cpu

#ifdef CLID_WITH_CUDA
namespace cuda {

// Pointers are device pointers, `stream` a cudaStream_t; nothing here synchronises with the host.
// rows_logprob and segment_mean: the CPU functions' contracts.
void rows_logprob(const void* logits, DType dtype, int64_t V, int64_t n_rows,
                  const int64_t* row_offsets, const int64_t* targets, float* out, void* stream);
void segment_mean(const float* values, const int64_t* offsets, int64_t n_segments, float* out,
                  void* stream);
// seq_logprob of logits [N, T, V] (strides stride_n, stride_t, 1), targets [N, T] contiguous int32 or
// int64, mask [N, T] contiguous bool; `values` holds N * T floats of scratch. A target outside
// [0, V) at a scored position stops the kernel with a device-side assertion naming it.
void seq_logprob(const void* logits, DType dtype, int64_t N, int64_t T, int64_t V, int64_t stride_n,
                 int64_t stride_t, const void* targets, bool targets_int32, const bool* mask, float* values,
                 float* out, void* stream);
// token_logprob_hidden's reduction over the logits tile [rows, width] (row-major, float32, no bias) of
// hidden rows p0 .. p0 + rows - 1 and vocabulary entries v0 .. v0 + width - 1. `state` (2 floats per
// row) and `target_logit` (1 per row) carry each row's progress from tile to tile, in vocabulary
// order: `first` for the tile at v0 = 0 (it also checks the targets, as seq_logprob does), `last` for
// the tile that ends at V, which writes out[p].
void hidden_tile(const float* tile, int64_t rows, int64_t width, int64_t p0, int64_t v0, int64_t V,
                 const float* bias, const int64_t* targets, float* state, float* target_logit, float* out,
                 bool first, bool last, void* stream);
// token_logprob_hidden_tc (csrc/cuda/fused_head.cu; schedule in common/fused_head.h): hidden [P, H] and
// weight [V, H] both bf16 or both f16 (`dtype`), rows of ldh and ldw elements, H, ldh and ldw multiples of
// tc_head::kHiddenAlign, both pointers 16-byte aligned; bias [V] float32 or null; targets [P]. `splits`
// in 1 .. vocabulary tiles; scratch: `partial` 2 * splits * P floats, `target_logit` P floats. Writes
// out[P]. An out-of-range target is a device-side assertion.
void hidden_logprob_tc(const void* hidden, const void* weight, DType dtype, int64_t P, int64_t H, int64_t V,
                       int64_t ldh, int64_t ldw, const float* bias, const int64_t* targets, int64_t splits,
                       float* partial, float* target_logit, float* out, void* stream);
// The CTAs of token_logprob_hidden_tc the current device runs at once (SMs times CTAs per SM).
int hidden_tc_slots(DType dtype);

}  // namespace cuda
#endif

}  // namespace clid
