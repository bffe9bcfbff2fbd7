// The CUDA implementations of clid._C's ops: the tensor-level ops of csrc/ops.h over the CUDA
// kernels (csrc/cuda/score.cu, csrc/cuda/sampler.cu). Compiled only where PyTorch has CUDA and a
// toolkit is found (setup.py); csrc/check_cuda.sh compile-checks it everywhere nvcc is installed.
#include <c10/cuda/CUDAException.h>  // C10_CUDA_KERNEL_LAUNCH_CHECK
#include <c10/cuda/CUDAGuard.h>      // kernels run on the inputs' device
#include <c10/cuda/CUDAStream.h>     // the current stream, passed to the launchers as void*
#include <torch/library.h>

#include "ops.h"

namespace clid {
namespace {

using clid_sampler::RngParams;
using clid_sampler::SampleInfo;
using clid_sampler::WeightParams;

void* stream() { return (void*)c10::cuda::getCurrentCUDAStream().stream(); }

// Device memory for the sampler's launchers.
at::Tensor workspace(const at::Tensor& u) {
    return at::empty({clid_sampler::cuda_workspace_bytes(u.numel())}, u.options().dtype(at::kByte));
}

struct Cuda {
    static void rows_logprob(const void* logits, DType dtype, int64_t V, int64_t R, const int64_t* row_offsets,
                             const int64_t* targets, float* out) {
        cuda::rows_logprob(logits, dtype, V, R, row_offsets, targets, out, stream());
        C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    static void segment_mean(const float* values, const int64_t* offsets, int64_t N, float* out) {
        cuda::segment_mean(values, offsets, N, out, stream());
        C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    static void hidden_logprob(const at::Tensor& hidden, DType hdt, const at::Tensor& w, DType wdt, const at::Tensor& b,
                               const at::Tensor& y, at::Tensor& out) {
        const int64_t P = hidden.size(0), H = hidden.size(1), V = w.size(0);
        auto h = hidden.stride(1) == 1 && hidden.stride(0) >= H ? hidden : hidden.contiguous();
        auto scratch = at::empty({cuda::hidden_scratch_floats(P, V)}, out.options());
        cuda::hidden_logprob(h.data_ptr(), hdt, P, H, h.stride(0), w.data_ptr(), wdt, V, w.stride(0),
                             b.defined() ? b.data_ptr<float>() : nullptr, y.data_ptr<int64_t>(), out.data_ptr<float>(),
                             scratch.data_ptr<float>(), stream());
        C10_CUDA_KERNEL_LAUNCH_CHECK();
    }

    static int64_t first_nan(const at::Tensor& u) {
        at::Tensor ws = workspace(u);
        return clid_sampler::first_nan_cuda(u.data_ptr(), u.scalar_type() == at::kDouble, u.numel(), ws.data_ptr(),
                                            stream());
    }
    static double kth_value(const at::Tensor& u, int64_t k, bool, int64_t* bad) {
        *bad = first_nan(u);
        if (*bad >= 0) return 0.0;
        at::Tensor ws = workspace(u);
        if (u.scalar_type() == at::kFloat) {
            float result = 0;
            clid_sampler::kth_value_cuda(u.data_ptr(), 0, u.numel(), k, &result, ws.data_ptr(), stream());
            return result;
        }
        double result = 0;
        clid_sampler::kth_value_cuda(u.data_ptr(), 1, u.numel(), k, &result, ws.data_ptr(), stream());
        return result;
    }
    static SampleInfo successive(const at::Tensor& u, int64_t k, WeightParams w, RngParams r, at::Tensor& out, int) {
        at::Tensor ws = workspace(u);
        return clid_sampler::successive_sample_cuda(u.data_ptr(), u.scalar_type() == at::kDouble, u.numel(), k, w, r,
                                                    out.data_ptr<int64_t>(), ws.data_ptr(), stream());
    }
    static at::Tensor bernoulli(const at::Tensor& u, WeightParams w, RngParams r) {
        at::Tensor ws = workspace(u);
        const bool dbl = u.scalar_type() == at::kDouble;
        const int64_t total = clid_sampler::bernoulli_count_cuda(u.data_ptr(), dbl, u.numel(), w, r, ws.data_ptr(), stream());
        at::Tensor out = at::empty({total}, u.options().dtype(at::kLong));
        clid_sampler::bernoulli_write_cuda(u.data_ptr(), dbl, u.numel(), w, r, out.data_ptr<int64_t>(), ws.data_ptr(),
                                           stream());
        return out;
    }
    static void keys(const at::Tensor& u, WeightParams w, RngParams r, at::Tensor& keys) {
        clid_sampler::successive_keys_cuda(u.data_ptr(), u.scalar_type() == at::kDouble, u.numel(), w, r,
                                           reinterpret_cast<uint64_t*>(keys.data_ptr<int64_t>()), stream());
    }
};

// Each op runs under a guard for the device of its first tensor.
at::Tensor seq_logprob(const at::Tensor& logits, const at::Tensor& targets, const at::Tensor& mask) {
    const c10::cuda::CUDAGuard guard(logits.device());
    return ops::seq_logprob<Cuda>(logits, targets, mask);
}
at::Tensor token_logprob(const at::Tensor& logits, const at::Tensor& targets) {
    const c10::cuda::CUDAGuard guard(logits.device());
    return ops::token_logprob<Cuda>(logits, targets);
}
at::Tensor segment_mean(const at::Tensor& values, const at::Tensor& lengths) {
    const c10::cuda::CUDAGuard guard(values.device());
    return ops::segment_mean<Cuda>(values, lengths);
}
at::Tensor token_logprob_hidden(const at::Tensor& hidden, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                const at::Tensor& targets) {
    const c10::cuda::CUDAGuard guard(hidden.device());
    return ops::token_logprob_hidden<Cuda>(hidden, weight, bias, targets);
}
at::Tensor kth_value(const at::Tensor& u, int64_t k, bool force_radix) {
    const c10::cuda::CUDAGuard guard(u.device());
    return ops::kth_value<Cuda>(u, k, force_radix);
}
std::tuple<at::Tensor, at::Tensor> smoothstep_successive(const at::Tensor& u, double threshold, double s, int64_t k,
                                                         int64_t seed, int64_t iteration, int64_t force_path) {
    const c10::cuda::CUDAGuard guard(u.device());
    return ops::smoothstep_successive<Cuda>(u, threshold, s, k, seed, iteration, force_path);
}
at::Tensor smoothstep_bernoulli(const at::Tensor& u, double threshold, double s, int64_t seed, int64_t iteration) {
    const c10::cuda::CUDAGuard guard(u.device());
    return ops::smoothstep_bernoulli<Cuda>(u, threshold, s, seed, iteration);
}
at::Tensor smoothstep_keys(const at::Tensor& u, double threshold, double s, int64_t seed, int64_t iteration) {
    const c10::cuda::CUDAGuard guard(u.device());
    return ops::smoothstep_keys<Cuda>(u, threshold, s, seed, iteration);
}

}  // namespace

TORCH_LIBRARY_IMPL(clid, CUDA, m) {
    m.impl("seq_logprob", &seq_logprob);
    m.impl("token_logprob", &token_logprob);
    m.impl("segment_mean", &segment_mean);
    m.impl("token_logprob_hidden", &token_logprob_hidden);
    m.impl("kth_value", &kth_value);
    m.impl("smoothstep_successive", &smoothstep_successive);
    m.impl("smoothstep_bernoulli", &smoothstep_bernoulli);
    m.impl("smoothstep_keys", &smoothstep_keys);
}

}  // namespace clid
