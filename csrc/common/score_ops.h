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
