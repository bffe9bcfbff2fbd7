// The CPU sampler's raw-pointer API: declarations only, included inside the namespace
// clid_sampler and inside each of its instruction-set namespaces (csrc/common/sampler_ops.h), so
// no include guard. `threads` is the OpenMP thread count.

// Index of the first NaN, or -1.
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
