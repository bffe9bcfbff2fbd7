// The CPU scoring kernels' raw-pointer API: declarations only, included inside the namespace
// clid::cpu and inside each of its instruction-set namespaces (csrc/common/score_ops.h), so no
// include guard.

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
