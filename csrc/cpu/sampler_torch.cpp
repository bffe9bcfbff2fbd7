// Tensor-level entry points of the sampler ops: check the arguments, dispatch on the device to the
// raw-pointer kernels (csrc/cpu/sampler.cpp, csrc/cuda/sampler.cu), wrap the results.
// The documented Python API is in clid/ops.py; these functions are its private back end.
#include <torch/extension.h>

#include <cmath>
#include <string>
#include <tuple>

#ifdef CLID_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#endif

#include "common/sampler_ops.h"

namespace {

using namespace clid_sampler;

void check_scores(const at::Tensor& u, const char* op) {
    TORCH_CHECK(u.device().is_cpu() || u.is_cuda(), "clid.ops.", op, ": u must be on the CPU or a CUDA GPU");
#ifndef CLID_WITH_CUDA
    TORCH_CHECK(!u.is_cuda(), "clid.ops.", op, ": u is on the GPU but clid_ops was built without CUDA");
#endif
    TORCH_CHECK(u.dim() == 1, "clid.ops.", op, ": u must be 1-D, got shape ", u.sizes());
    TORCH_CHECK(u.scalar_type() == at::kFloat || u.scalar_type() == at::kDouble, "clid.ops.", op,
                ": u must be float32 or float64, got ", u.scalar_type());
}

void raise_nan(const char* op, int64_t index, int64_t m) {
    throw pybind11::value_error(std::string("clid.ops.") + op + ": u[" + std::to_string(index) +
                                "] is NaN (the first NaN of " + std::to_string(m) + " values)");
}

WeightParams weight_params(double threshold, double s) {
    TORCH_CHECK(!std::isnan(threshold), "clid.ops.smoothstep_sample: threshold is NaN");
    TORCH_CHECK(!std::isnan(s) && s >= 0, "clid.ops.smoothstep_sample: s must be >= 0 (0 = hard step, inf = constant), got ", s);
    WeightParams w;
    w.threshold = threshold;
    w.slope = -2.0 / s;  // -inf for s = 0 (IEEE), -0 for s = inf (unused: constant)
    w.constant = std::isinf(s) ? 1 : 0;
    return w;
}

int threads() { return std::max(1, at::get_num_threads()); }

#ifdef CLID_WITH_CUDA
// Every CUDA op runs under a guard for u's device (set in the ops below).
at::Tensor cuda_workspace(const at::Tensor& u) {
    return at::empty({cuda_workspace_bytes(u.numel())}, u.options().dtype(at::kByte));
}
void* cuda_stream() { return (void*)at::cuda::getCurrentCUDAStream().stream(); }
#endif

int64_t first_nan(const at::Tensor& u) {
    check_scores(u, "first_nan");
    if (u.is_cuda()) {
#ifdef CLID_WITH_CUDA
        const c10::cuda::OptionalCUDAGuard guard(u.device());
        at::Tensor ws = cuda_workspace(u);
        return first_nan_cuda(u.data_ptr(), u.scalar_type() == at::kDouble, u.numel(), ws.data_ptr(), cuda_stream());
#endif
    }
    if (u.scalar_type() == at::kFloat) return first_nan_cpu(u.data_ptr<float>(), u.numel(), threads());
    return first_nan_cpu(u.data_ptr<double>(), u.numel(), threads());
}

// k-th smallest (1-based) as a double (exact for float32 data too).
double kth_value_op(at::Tensor u, int64_t k, bool force_radix) {
    check_scores(u, "kth_value");
    u = u.contiguous();
    const int64_t m = u.numel();
    TORCH_CHECK(k >= 1 && k <= m, "clid.ops.kth_value: k must be in [1, ", m, "], got ", k);
    if (u.is_cuda()) {
#ifdef CLID_WITH_CUDA
        const c10::cuda::OptionalCUDAGuard guard(u.device());
        const int64_t bad = first_nan(u);
        if (bad >= 0) raise_nan("kth_value", bad, m);
        at::Tensor ws = cuda_workspace(u);
        if (u.scalar_type() == at::kFloat) {
            float result = 0;
            kth_value_cuda(u.data_ptr(), 0, m, k, &result, ws.data_ptr(), cuda_stream());
            return result;
        }
        double result = 0;
        kth_value_cuda(u.data_ptr(), 1, m, k, &result, ws.data_ptr(), cuda_stream());
        return result;
#endif
    }
    int64_t bad = -1;
    double result = 0;
    {
        pybind11::gil_scoped_release no_gil;
        if (u.scalar_type() == at::kFloat) result = kth_value_cpu(u.data_ptr<float>(), m, k, threads(), &bad, force_radix);
        else result = kth_value_cpu(u.data_ptr<double>(), m, k, threads(), &bad, force_radix);
    }
    if (bad >= 0) raise_nan("kth_value", bad, m);
    return result;
}

// Successive sampling: (sorted indices, path, filled, number of positive weights or -1).
std::tuple<at::Tensor, int64_t, int64_t, int64_t> successive_op(at::Tensor u, double threshold, double s, int64_t k,
                                                                uint64_t seed, uint64_t iteration, int64_t force_path) {
    check_scores(u, "smoothstep_sample");
    u = u.contiguous();
    const int64_t m = u.numel();
    TORCH_CHECK(k >= 0 && k <= m, "clid.ops.smoothstep_sample: k must be in [0, ", m, "], got ", k);
    const WeightParams w = weight_params(threshold, s);
    const RngParams r = make_rng_params(seed, iteration);
    const int64_t bad = first_nan(u);
    if (bad >= 0) raise_nan("smoothstep_sample", bad, m);
    at::Tensor out = at::empty({k}, u.options().dtype(at::kLong));
    SampleInfo info{};
    if (u.is_cuda()) {
#ifdef CLID_WITH_CUDA
        const c10::cuda::OptionalCUDAGuard guard(u.device());
        at::Tensor ws = cuda_workspace(u);
        info = successive_sample_cuda(u.data_ptr(), u.scalar_type() == at::kDouble, m, k, w, r,
                                      out.data_ptr<int64_t>(), ws.data_ptr(), cuda_stream());
#endif
    } else {
        pybind11::gil_scoped_release no_gil;
        if (u.scalar_type() == at::kFloat)
            info = successive_sample_cpu(u.data_ptr<float>(), m, k, w, r, out.data_ptr<int64_t>(), threads(), (int)force_path);
        else
            info = successive_sample_cpu(u.data_ptr<double>(), m, k, w, r, out.data_ptr<int64_t>(), threads(), (int)force_path);
    }
    TORCH_CHECK(info.path >= 0, "clid.ops.smoothstep_sample: the forced window path missed the k-th key");
    return {out, info.path, info.filled, info.positive};
}

at::Tensor bernoulli_op(at::Tensor u, double threshold, double s, uint64_t seed, uint64_t iteration) {
    check_scores(u, "smoothstep_sample");
    u = u.contiguous();
    const int64_t m = u.numel();
    const WeightParams w = weight_params(threshold, s);
    const RngParams r = make_rng_params(seed, iteration);
    const int64_t bad = first_nan(u);
    if (bad >= 0) raise_nan("smoothstep_sample", bad, m);
    if (u.is_cuda()) {
#ifdef CLID_WITH_CUDA
        const c10::cuda::OptionalCUDAGuard guard(u.device());
        at::Tensor ws = cuda_workspace(u);
        const bool dbl = u.scalar_type() == at::kDouble;
        const int64_t total = bernoulli_count_cuda(u.data_ptr(), dbl, m, w, r, ws.data_ptr(), cuda_stream());
        at::Tensor out = at::empty({total}, u.options().dtype(at::kLong));
        bernoulli_write_cuda(u.data_ptr(), dbl, m, w, r, out.data_ptr<int64_t>(), ws.data_ptr(), cuda_stream());
        return out;
#endif
    }
    at::Tensor counts = at::empty({num_chunks(m)}, u.options().dtype(at::kLong));
    int64_t total = 0;
    {
        pybind11::gil_scoped_release no_gil;
        if (u.scalar_type() == at::kFloat)
            total = bernoulli_count_cpu(u.data_ptr<float>(), m, w, r, counts.data_ptr<int64_t>(), threads());
        else
            total = bernoulli_count_cpu(u.data_ptr<double>(), m, w, r, counts.data_ptr<int64_t>(), threads());
    }
    at::Tensor out = at::empty({total}, u.options().dtype(at::kLong));
    pybind11::gil_scoped_release no_gil;
    if (u.scalar_type() == at::kFloat)
        bernoulli_write_cpu(u.data_ptr<float>(), m, w, r, counts.data_ptr<int64_t>(), out.data_ptr<int64_t>(), threads());
    else
        bernoulli_write_cpu(u.data_ptr<double>(), m, w, r, counts.data_ptr<int64_t>(), out.data_ptr<int64_t>(), threads());
    return out;
}

// Every item's exponential key, as the int64 view of its 64 bits (tests only).
at::Tensor keys_op(at::Tensor u, double threshold, double s, uint64_t seed, uint64_t iteration) {
    check_scores(u, "smoothstep_sample");
    u = u.contiguous();
    const WeightParams w = weight_params(threshold, s);
    const RngParams r = make_rng_params(seed, iteration);
    at::Tensor keys = at::empty({u.numel()}, u.options().dtype(at::kLong));
    auto* dst = reinterpret_cast<uint64_t*>(keys.data_ptr<int64_t>());
    if (u.is_cuda()) {
#ifdef CLID_WITH_CUDA
        const c10::cuda::OptionalCUDAGuard guard(u.device());
        successive_keys_cuda(u.data_ptr(), u.scalar_type() == at::kDouble, u.numel(), w, r, dst, cuda_stream());
        return keys;
#endif
    }
    if (u.scalar_type() == at::kFloat) successive_keys_cpu(u.data_ptr<float>(), u.numel(), w, r, dst, threads());
    else successive_keys_cpu(u.data_ptr<double>(), u.numel(), w, r, dst, threads());
    return keys;
}

}  // namespace

void register_sampler_ops(pybind11::module_& m) {
    m.def("sampler_first_nan", &first_nan, "index of the first NaN of a 1-D float tensor, or -1");
    m.def("sampler_kth_value", &kth_value_op, "k-th smallest (1-based)", pybind11::arg("u"), pybind11::arg("k"),
          pybind11::arg("force_radix") = false);
    m.def("sampler_successive", &successive_op, "smooth-step successive sampling (sorted indices, path, filled, positive)",
          pybind11::arg("u"), pybind11::arg("threshold"), pybind11::arg("s"), pybind11::arg("k"), pybind11::arg("seed"),
          pybind11::arg("iteration"), pybind11::arg("force_path") = 0);
    m.def("sampler_bernoulli", &bernoulli_op, "smooth-step Bernoulli sampling (sorted indices)", pybind11::arg("u"),
          pybind11::arg("threshold"), pybind11::arg("s"), pybind11::arg("seed"), pybind11::arg("iteration"));
    m.def("sampler_keys", &keys_op, "every item's exponential key bits (tests only)", pybind11::arg("u"),
          pybind11::arg("threshold"), pybind11::arg("s"), pybind11::arg("seed"), pybind11::arg("iteration"));
}
