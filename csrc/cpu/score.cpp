// The CPU scoring kernels' raw-pointer API (csrc/cpu/score_api.h): each call runs the copy of the
// kernels compiled for the best instruction set of this CPU (csrc/cpu/isa.h).
#include "common/score_ops.h"
#include "cpu/isa.h"

namespace clid {
namespace cpu {

void rows_logprob(const void* logits, DType dtype, int64_t V, int64_t n_rows, const int64_t* row_offsets,
                  const int64_t* targets, float* out, int num_threads) {
    CLID_ISA_DISPATCH(rows_logprob(logits, dtype, V, n_rows, row_offsets, targets, out, num_threads))
}

void segment_mean(const float* values, const int64_t* offsets, int64_t n_segments, float* out) {
    CLID_ISA_DISPATCH(segment_mean(values, offsets, n_segments, out))
}

void hidden_logprob(const float* hidden, int64_t P, int64_t H, int64_t ldh, const void* weight, DType wdtype,
                    int64_t V, int64_t ldw, const float* bias, const int64_t* targets, float* out, int num_threads) {
    CLID_ISA_DISPATCH(hidden_logprob(hidden, P, H, ldh, weight, wdtype, V, ldw, bias, targets, out, num_threads))
}

}  // namespace cpu
}  // namespace clid
