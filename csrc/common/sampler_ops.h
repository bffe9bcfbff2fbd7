// Raw-pointer API of the sampler kernels (CPU in csrc/cpu/sampler.cpp, CUDA in
// csrc/cuda/sampler.cu) and the hook that registers their Python bindings
// (csrc/cpu/sampler_torch.cpp). No torch types here: the CUDA side is compiled without torch.
#pragma once

#include <stdint.h>

#include "common/sampler_math.h"

namespace clid_sampler {

// Items are processed in fixed chunks of CHUNK indices, whatever the thread count; per-chunk
// counts give every chunk its place in the sorted output.
constexpr int64_t CHUNK = 1 << 16;

inline int64_t num_chunks(int64_t m) { return (m + CHUNK - 1) / CHUNK; }

// How smoothstep_sample found the k-th key (for tests and the log).
enum SelectPath : int {
    PATH_TRIVIAL = 0,  // k == 0 or k == M: no key needed
    PATH_WINDOW = 1,   // sample-guided window: one counting pass plus a small candidate select
    PATH_RADIX = 2,    // radix select over the 64-bit keys (16-bit digits), recomputed each pass
};
enum ForcePath : int { FORCE_NONE = 0, FORCE_WINDOW = 1, FORCE_RADIX = 2 };

struct SampleInfo {
    int path;           // SelectPath of the main draw
    int filled;         // 1 if fewer than k items had a positive weight
    int64_t positive;   // number of positive-weight items if filled, else -1
};

// ---- CPU (csrc/cpu/sampler.cpp); `threads` is the OpenMP thread count. --------------------
int64_t first_nan_cpu(const float* u, int64_t m, int threads);
int64_t first_nan_cpu(const double* u, int64_t m, int threads);

// k-th smallest (1 <= k <= m) over order-preserving keys: sample-guided window, else (or with
// force_radix) radix select. If the data hold a NaN, *nan_index is set to the first one (else -1)
// and the result is meaningless.
float kth_value_cpu(const float* u, int64_t m, int64_t k, int threads, int64_t* nan_index, int force_radix);
double kth_value_cpu(const double* u, int64_t m, int64_t k, int threads, int64_t* nan_index, int force_radix);

// The k smallest exponential keys (ties by index), as sorted indices in out[0..k).
SampleInfo successive_sample_cpu(const float* u, int64_t m, int64_t k, WeightParams w, RngParams r,
                                 int64_t* out, int threads, int force_path);
SampleInfo successive_sample_cpu(const double* u, int64_t m, int64_t k, WeightParams w, RngParams r,
                                 int64_t* out, int threads, int force_path);

// Bernoulli mode in two passes: count per chunk (chunk_counts has num_chunks(m) entries; returns
// the total), then write the kept indices in order.
int64_t bernoulli_count_cpu(const float* u, int64_t m, WeightParams w, RngParams r, int64_t* chunk_counts, int threads);
int64_t bernoulli_count_cpu(const double* u, int64_t m, WeightParams w, RngParams r, int64_t* chunk_counts, int threads);
void bernoulli_write_cpu(const float* u, int64_t m, WeightParams w, RngParams r, const int64_t* chunk_counts,
                         int64_t* out, int threads);
void bernoulli_write_cpu(const double* u, int64_t m, WeightParams w, RngParams r, const int64_t* chunk_counts,
                         int64_t* out, int threads);

// Every item's key (materialised: for tests only).
void successive_keys_cpu(const float* u, int64_t m, WeightParams w, RngParams r, uint64_t* keys, int threads);
void successive_keys_cpu(const double* u, int64_t m, WeightParams w, RngParams r, uint64_t* keys, int threads);

// ---- CUDA (csrc/cuda/sampler.cu, compiled only with CLID_WITH_CUDA); device pointers, `stream`
// is a cudaStream_t, `workspace` holds cuda_workspace_bytes(m) bytes of device memory. ---------
// Workspace sizes in bytes for the launchers below.
int64_t cuda_workspace_bytes(int64_t m);
// Index of the first NaN or -1; blocks on the stream.
int64_t first_nan_cuda(const void* u, int is_double, int64_t m, void* workspace, void* stream);
// The k-th smallest, written to *result_host (a float or a double); blocks on the stream.
void kth_value_cuda(const void* u, int is_double, int64_t m, int64_t k, void* result_host,
                    void* workspace, void* stream);
SampleInfo successive_sample_cuda(const void* u, int is_double, int64_t m, int64_t k, WeightParams w,
                                  RngParams r, int64_t* out, void* workspace, void* stream);
int64_t bernoulli_count_cuda(const void* u, int is_double, int64_t m, WeightParams w, RngParams r,
                             void* workspace, void* stream);
void bernoulli_write_cuda(const void* u, int is_double, int64_t m, WeightParams w, RngParams r,
                          int64_t* out, void* workspace, void* stream);
void successive_keys_cuda(const void* u, int is_double, int64_t m, WeightParams w, RngParams r,
                          uint64_t* keys, void* stream);

}  // namespace clid_sampler

// Registers the sampler ops on the extension module (called from csrc/binding.cpp).
#ifdef PYBIND11_VERSION_MAJOR
void register_sampler_ops(pybind11::module_& m);
#endif
