// The CPU sampler's raw-pointer API (csrc/cpu/sampler_api.h): each call runs the copy of the
// kernels compiled for the best instruction set of this CPU (csrc/cpu/isa.h).
#include "common/sampler_ops.h"
#include "cpu/isa.h"

namespace clid_sampler {

int64_t first_nan_cpu(const float* u, int64_t m, int threads) { CLID_ISA_DISPATCH(first_nan_cpu(u, m, threads)) }
int64_t first_nan_cpu(const double* u, int64_t m, int threads) { CLID_ISA_DISPATCH(first_nan_cpu(u, m, threads)) }
float kth_value_cpu(const float* u, int64_t m, int64_t k, int threads, int64_t* nan_index, int force_radix) {
    CLID_ISA_DISPATCH(kth_value_cpu(u, m, k, threads, nan_index, force_radix))
}
double kth_value_cpu(const double* u, int64_t m, int64_t k, int threads, int64_t* nan_index, int force_radix) {
    CLID_ISA_DISPATCH(kth_value_cpu(u, m, k, threads, nan_index, force_radix))
}
SampleInfo successive_sample_cpu(const float* u, int64_t m, int64_t k, WeightParams w, RngParams r, int64_t* out,
                                 int threads, int force_path) {
    CLID_ISA_DISPATCH(successive_sample_cpu(u, m, k, w, r, out, threads, force_path))
}
SampleInfo successive_sample_cpu(const double* u, int64_t m, int64_t k, WeightParams w, RngParams r, int64_t* out,
                                 int threads, int force_path) {
    CLID_ISA_DISPATCH(successive_sample_cpu(u, m, k, w, r, out, threads, force_path))
}
int64_t bernoulli_count_cpu(const float* u, int64_t m, WeightParams w, RngParams r, int64_t* counts, int threads) {
    CLID_ISA_DISPATCH(bernoulli_count_cpu(u, m, w, r, counts, threads))
}
int64_t bernoulli_count_cpu(const double* u, int64_t m, WeightParams w, RngParams r, int64_t* counts, int threads) {
    CLID_ISA_DISPATCH(bernoulli_count_cpu(u, m, w, r, counts, threads))
}
void bernoulli_write_cpu(const float* u, int64_t m, WeightParams w, RngParams r, const int64_t* counts, int64_t* out,
                         int threads) {
    CLID_ISA_DISPATCH(bernoulli_write_cpu(u, m, w, r, counts, out, threads))
}
void bernoulli_write_cpu(const double* u, int64_t m, WeightParams w, RngParams r, const int64_t* counts, int64_t* out,
                         int threads) {
    CLID_ISA_DISPATCH(bernoulli_write_cpu(u, m, w, r, counts, out, threads))
}
void successive_keys_cpu(const float* u, int64_t m, WeightParams w, RngParams r, uint64_t* keys, int threads) {
    CLID_ISA_DISPATCH(successive_keys_cpu(u, m, w, r, keys, threads))
}
void successive_keys_cpu(const double* u, int64_t m, WeightParams w, RngParams r, uint64_t* keys, int threads) {
    CLID_ISA_DISPATCH(successive_keys_cpu(u, m, w, r, keys, threads))
}

}  // namespace clid_sampler
