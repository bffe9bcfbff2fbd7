// The tensor-level ops of clid._C, written once for every device: each checks its arguments and
// prepares the kernels' inputs, then calls the device's raw-pointer kernels through `Dev`
// (struct Cpu in csrc/cpu/ops.cpp, struct Cuda in csrc/cuda/ops.cpp), which register them with
// TORCH_LIBRARY_IMPL. The schemas are declared in csrc/ops.cpp; the documented Python API, with
// the plain PyTorch references, is clid/ops/.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <string>
#include <tuple>

#include "common/sampler_ops.h"
#include "common/score_ops.h"

namespace clid {
namespace ops {

// ---------------------------------------------------------------------------------------------
// Scoring (Eq. 2)

inline DType float_dtype(const at::Tensor& t, const char* op, const char* name) {
    switch (t.scalar_type()) {
        case at::kFloat: return DType::f32;
        case at::kHalf: return DType::f16;
        case at::kBFloat16: return DType::bf16;
        default:
            TORCH_CHECK(false, op, ": ", name, " must be float32, float16 or bfloat16, got ", t.scalar_type());
    }
}

// Every target at the scored rows must index the vocabulary; name the first bad one.
inline void check_targets(const at::Tensor& targets, int64_t V, const char* op, const at::Tensor& where) {
    auto bad = (targets < 0) | (targets >= V);
    if (!bad.any().item<bool>()) return;
    int64_t first = bad.nonzero().index({0, 0}).item<int64_t>();
    auto pos = where.index({first}).cpu();
    std::string at_str;
    for (int64_t i = 0; i < pos.numel(); ++i) at_str += (i ? ", " : "") + std::to_string(pos[i].item<int64_t>());
    TORCH_CHECK(false, op, ": target ", targets[first].item<int64_t>(), " at position [", at_str,
                "] is outside the vocabulary [0, ", V, ")");
}

// The CSR offsets [N + 1] of consecutive segments of the given lengths.
inline at::Tensor offsets_from_lengths(const at::Tensor& lengths) {
    auto offsets = at::zeros({lengths.numel() + 1}, lengths.options().dtype(at::kLong));
    offsets.narrow(0, 1, lengths.numel()).copy_(lengths.to(at::kLong).cumsum(0));
    return offsets;
}

// log_softmax(row)[target] for the rows of `logits` starting at `row_offsets` (elements).
template <class Dev>
at::Tensor rows_logprob(const at::Tensor& logits, const at::Tensor& row_offsets, const at::Tensor& targets) {
    const int64_t V = logits.size(-1), R = row_offsets.numel();
    auto dtype = float_dtype(logits, "seq_logprob", "logits");
    auto out = at::empty({R}, logits.options().dtype(at::kFloat));
    if (R == 0) return out;
    Dev::rows_logprob(logits.data_ptr(), dtype, V, R, row_offsets.data_ptr<int64_t>(), targets.data_ptr<int64_t>(),
                      out.data_ptr<float>());
    return out;
}

template <class Dev>
at::Tensor segment_mean_offsets(const at::Tensor& values, const at::Tensor& offsets) {
    const int64_t N = offsets.numel() - 1;
    auto out = at::empty({N}, values.options().dtype(at::kFloat));
    if (N == 0) return out;
    Dev::segment_mean(values.data_ptr<float>(), offsets.data_ptr<int64_t>(), N, out.data_ptr<float>());
    return out;
}

// The shapes, strides and devices of seq_logprob's arguments (no look at their values).
inline void check_seq_args(const at::Tensor& logits, const at::Tensor& targets, const at::Tensor& mask) {
    TORCH_CHECK(logits.dim() == 3, "seq_logprob: logits must be [N, T, V], got ", logits.sizes());
    TORCH_CHECK(targets.sizes() == logits.sizes().slice(0, 2) && mask.sizes() == targets.sizes(),
                "seq_logprob: targets and mask must be [N, T] = ", logits.sizes().slice(0, 2),
                ", got ", targets.sizes(), " and ", mask.sizes());
    TORCH_CHECK(logits.stride(2) == 1 || logits.size(2) == 1, "seq_logprob: logits must be contiguous along V");
    TORCH_CHECK(targets.device() == logits.device() && mask.device() == logits.device(),
                "seq_logprob: logits, targets and mask must be on the same device");
}

template <class Dev>
at::Tensor seq_logprob(const at::Tensor& logits, const at::Tensor& targets, const at::Tensor& mask) {
    check_seq_args(logits, targets, mask);
    const int64_t V = logits.size(2);
    auto scored = mask != 0;                   // [N, T] bool
    auto where = scored.nonzero();             // [R, 2] rows (n, t), row-major: captions in order
    auto n = where.select(1, 0), t = where.select(1, 1);
    auto row_offsets = (n * logits.stride(0) + t * logits.stride(1)).contiguous();
    auto y = targets.to(at::kLong).index({n, t}).contiguous();
    check_targets(y, V, "seq_logprob", where);
    auto values = rows_logprob<Dev>(logits, row_offsets, y);
    return segment_mean_offsets<Dev>(values, offsets_from_lengths(scored.sum(1)));
}

template <class Dev>
at::Tensor token_logprob(const at::Tensor& logits, const at::Tensor& targets) {
    TORCH_CHECK(logits.dim() >= 1 && targets.sizes() == logits.sizes().slice(0, logits.dim() - 1),
                "token_logprob: targets must be logits.shape[:-1], got logits ", logits.sizes(),
                " and targets ", targets.sizes());
    TORCH_CHECK(targets.device() == logits.device(), "token_logprob: logits and targets must be on the same device");
    const int64_t V = logits.size(-1);
    auto rows = logits.reshape({-1, V});
    if (rows.stride(1) != 1) rows = rows.contiguous();
    auto y = targets.reshape({-1}).to(at::kLong).contiguous();
    auto index = at::arange(y.numel(), y.options());
    check_targets(y, V, "token_logprob", index.unsqueeze(1));
    auto values = rows_logprob<Dev>(rows, (index * rows.stride(0)).contiguous(), y);
    return values.reshape(targets.sizes());
}

template <class Dev>
at::Tensor segment_mean(const at::Tensor& values, const at::Tensor& lengths) {
    TORCH_CHECK(values.dim() == 1 && lengths.dim() == 1, "segment_mean: values and lengths must be 1-D");
    TORCH_CHECK(values.device() == lengths.device(), "segment_mean: values and lengths must be on the same device");
    TORCH_CHECK(!(lengths < 0).any().item<bool>(), "segment_mean: lengths must be >= 0");
    auto offsets = offsets_from_lengths(lengths);
    TORCH_CHECK(offsets[-1].item<int64_t>() == values.numel(), "segment_mean: lengths sum to ",
                offsets[-1].item<int64_t>(), " but there are ", values.numel(), " values");
    return segment_mean_offsets<Dev>(values.to(at::kFloat).contiguous(), offsets);
}

// The shapes, dtypes and devices of token_logprob_hidden's arguments (no look at their values).
inline void check_hidden_args(const at::Tensor& hidden, const at::Tensor& weight,
                              const std::optional<at::Tensor>& bias, const at::Tensor& targets,
                              const char* op = "token_logprob_hidden") {
    TORCH_CHECK(hidden.dim() == 2 && weight.dim() == 2 && hidden.size(1) == weight.size(1), op,
                ": hidden must be [P, H] and weight [V, H], got ", hidden.sizes(), " and ", weight.sizes());
    TORCH_CHECK(targets.dim() == 1 && targets.size(0) == hidden.size(0), op, ": targets must be [P], got ",
                targets.sizes());
    const int64_t V = weight.size(0);
    TORCH_CHECK(!bias || (bias->dim() == 1 && bias->size(0) == V), op, ": bias must be [V] = [", V, "]");
    TORCH_CHECK(weight.device() == hidden.device() && targets.device() == hidden.device() &&
                (!bias || bias->device() == hidden.device()), op, ": all inputs must be on the same device");
    float_dtype(hidden, op, "hidden");
    float_dtype(weight, op, "weight");
    TORCH_CHECK(V > 0 || hidden.size(0) == 0, op, ": empty vocabulary");
}

template <class Dev>
at::Tensor token_logprob_hidden(const at::Tensor& hidden, const at::Tensor& weight,
                                const std::optional<at::Tensor>& bias, const at::Tensor& targets) {
    const char* op = "token_logprob_hidden";
    check_hidden_args(hidden, weight, bias, targets);
    const int64_t P = hidden.size(0), H = hidden.size(1), V = weight.size(0);
    const DType hdt = float_dtype(hidden, op, "hidden");
    const DType wdt = float_dtype(weight, op, "weight");
    auto out = at::empty({P}, hidden.options().dtype(at::kFloat));
    if (P == 0) return out;
    auto y = targets.to(at::kLong).contiguous();
    check_targets(y, V, op, at::arange(P, y.options()).unsqueeze(1));
    auto w = weight.stride(1) == 1 && weight.stride(0) >= H ? weight : weight.contiguous();
    at::Tensor b = bias ? bias->to(at::kFloat).contiguous() : at::Tensor();
    Dev::hidden_logprob(hidden, hdt, w, wdt, b, y, out);
    return out;
}

// ---------------------------------------------------------------------------------------------
// The smooth-step sampler and the k-th value (step 6)

using clid_sampler::RngParams;
using clid_sampler::SampleInfo;
using clid_sampler::WeightParams;

inline void check_scores(const at::Tensor& u, const char* op) {
    TORCH_CHECK(u.dim() == 1, "clid.ops.", op, ": u must be 1-D, got shape ", u.sizes());
    TORCH_CHECK(u.scalar_type() == at::kFloat || u.scalar_type() == at::kDouble, "clid.ops.", op,
                ": u must be float32 or float64, got ", u.scalar_type());
}

inline void raise_nan(const char* op, int64_t index, int64_t m) {
    TORCH_CHECK_VALUE(false, "clid.ops.", op, ": u[", index, "] is NaN (the first NaN of ", m, " values)");
}

inline WeightParams weight_params(double threshold, double s) {
    TORCH_CHECK(!std::isnan(threshold), "clid.ops.smoothstep_sample: threshold is NaN");
    TORCH_CHECK(!std::isnan(s) && s >= 0, "clid.ops.smoothstep_sample: s must be >= 0 (0 = hard step, inf = constant), got ", s);
    WeightParams w;
    w.threshold = threshold;
    w.slope = -2.0 / s;  // -inf for s = 0 (IEEE), -0 for s = inf (unused: constant)
    w.constant = std::isinf(s) ? 1 : 0;
    return w;
}

// Seed and iteration cross the schema as int64: their two's complement bits are the uint64 value.
inline RngParams rng_params(int64_t seed, int64_t iteration) {
    return clid_sampler::make_rng_params((uint64_t)seed, (uint64_t)iteration);
}

inline int threads() { return std::max(1, at::get_num_threads()); }

// The k-th smallest (1-based) as a 0-dim tensor of u's dtype.
template <class Dev>
at::Tensor kth_value(const at::Tensor& u_in, int64_t k, bool force_radix) {
    check_scores(u_in, "kth_value");
    const at::Tensor u = u_in.contiguous();
    const int64_t m = u.numel();
    TORCH_CHECK(k >= 1 && k <= m, "clid.ops.kth_value: k must be in [1, ", m, "], got ", k);
    int64_t bad = -1;
    const double value = Dev::kth_value(u, k, force_radix, &bad);
    if (bad >= 0) raise_nan("kth_value", bad, m);
    return at::scalar_tensor(value, u.options());
}

// Successive sampling: (sorted indices [k], info [3] = (path, filled, number of positive weights or -1)).
template <class Dev>
std::tuple<at::Tensor, at::Tensor> smoothstep_successive(const at::Tensor& u_in, double threshold, double s, int64_t k,
                                                         int64_t seed, int64_t iteration, int64_t force_path) {
    check_scores(u_in, "smoothstep_sample");
    const at::Tensor u = u_in.contiguous();
    const int64_t m = u.numel();
    TORCH_CHECK(k >= 0 && k <= m, "clid.ops.smoothstep_sample: k must be in [0, ", m, "], got ", k);
    const WeightParams w = weight_params(threshold, s);
    const int64_t bad = Dev::first_nan(u);
    if (bad >= 0) raise_nan("smoothstep_sample", bad, m);
    at::Tensor out = at::empty({k}, u.options().dtype(at::kLong));
    const SampleInfo info = Dev::successive(u, k, w, rng_params(seed, iteration), out, (int)force_path);
    TORCH_CHECK(info.path >= 0, "clid.ops.smoothstep_sample: the forced window path missed the k-th key");
    at::Tensor summary = at::tensor({(int64_t)info.path, (int64_t)info.filled, info.positive}, at::kLong);
    return {out, summary};
}

template <class Dev>
at::Tensor smoothstep_bernoulli(const at::Tensor& u_in, double threshold, double s, int64_t seed, int64_t iteration) {
    check_scores(u_in, "smoothstep_sample");
    const at::Tensor u = u_in.contiguous();
    const WeightParams w = weight_params(threshold, s);
    const int64_t bad = Dev::first_nan(u);
    if (bad >= 0) raise_nan("smoothstep_sample", bad, u.numel());
    return Dev::bernoulli(u, w, rng_params(seed, iteration));
}

// Every item's exponential key, as the int64 view of its 64 bits (tests only).
template <class Dev>
at::Tensor smoothstep_keys(const at::Tensor& u_in, double threshold, double s, int64_t seed, int64_t iteration) {
    check_scores(u_in, "smoothstep_sample");
    const at::Tensor u = u_in.contiguous();
    at::Tensor keys = at::empty({u.numel()}, u.options().dtype(at::kLong));
    Dev::keys(u, weight_params(threshold, s), rng_params(seed, iteration), keys);
    return keys;
}

}  // namespace ops
}  // namespace clid
