// Raw-pointer API of the sampler kernels (CPU in csrc/cpu/sampler*.cpp, CUDA in
// csrc/cuda/sampler.cu). No torch types here: the CUDA side is compiled without torch.
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

// ---- CPU (csrc/cpu/sampler_api.h) ------------------------------------------------------------
// The top-level functions (csrc/cpu/sampler.cpp) call the same functions of one of the namespaces
// base, avx2, avx512: the kernels (csrc/cpu/sampler_kernels.h) compiled for that instruction set.
#include "cpu/sampler_api.h"
namespace base {
#include "cpu/sampler_api.h"
}
namespace avx2 {
#include "cpu/sampler_api.h"
}
namespace avx512 {
#include "cpu/sampler_api.h"
}

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

