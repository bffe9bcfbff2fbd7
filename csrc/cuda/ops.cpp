// The CUDA implementations of clid._C's ops: the tensor-level ops of csrc/ops.h over the CUDA
// kernels (csrc/cuda/score.cu, csrc/cuda/fused_head.cu, csrc/cuda/sampler.cu), except seq_logprob,
// token_logprob_hidden and the CUDA-only token_logprob_hidden_tc, written here without the host
// synchronisations of the shared versions. Compiled only where PyTorch has CUDA and a
// toolkit is found (setup.py); csrc/check_cuda.sh compile-checks it everywhere nvcc is installed.
#include <c10/cuda/CUDAException.h>  // C10_CUDA_KERNEL_LAUNCH_CHECK
#include <c10/cuda/CUDAGuard.h>      // kernels run on the inputs' device
#include <c10/cuda/CUDAStream.h>     // the current stream, passed to the launchers as void*
#include <torch/library.h>

#include <algorithm>

#include "common/fused_head.h"
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

// seq_logprob without host synchronisation: two launches straight from the mask (the CPU op's list of
// scored rows and its target check would each wait for the GPU). Targets are checked on the device.
at::Tensor seq_logprob(const at::Tensor& logits, const at::Tensor& targets, const at::Tensor& mask) {
    const c10::cuda::CUDAGuard guard(logits.device());
    ops::check_seq_args(logits, targets, mask);
    const int64_t N = logits.size(0), T = logits.size(1), V = logits.size(2);
    const DType dtype = ops::float_dtype(logits, "seq_logprob", "logits");
    TORCH_CHECK(V > 0 || N * T == 0, "seq_logprob: empty vocabulary");
    const bool int32 = targets.scalar_type() == at::kInt;
    auto y = (int32 || targets.scalar_type() == at::kLong ? targets : targets.to(at::kLong)).contiguous();
    auto scored = (mask.scalar_type() == at::kBool ? mask : mask != 0).contiguous();
    auto values = at::empty({N * T}, logits.options().dtype(at::kFloat));
    auto out = at::empty({N}, logits.options().dtype(at::kFloat));
    cuda::seq_logprob(logits.data_ptr(), dtype, N, T, V, logits.stride(0), logits.stride(1), y.data_ptr(), int32,
                      scored.data_ptr<bool>(), values.data_ptr<float>(), out.data_ptr<float>(), stream());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}

// token_logprob_hidden: cuBLAS computes the logits of a block of rows and a tile of the vocabulary at a
// time (on the tensor cores for half inputs, accumulating and writing float32) into one buffer of at most
// kTileFloats floats (32 MiB), and a kernel folds each tile into the rows' log-sum-exp and picks up the
// target's logit. Nothing but the buffer and 3 floats per row is allocated; no host synchronisation.
constexpr int64_t kTileFloats = int64_t(1) << 23;
constexpr int64_t kMinTileWidth = 1024;  // a narrower product would not keep the tensor cores busy

at::Tensor token_logprob_hidden(const at::Tensor& hidden, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                const at::Tensor& targets) {
    const c10::cuda::CUDAGuard guard(hidden.device());
    ops::check_hidden_args(hidden, weight, bias, targets);
    const int64_t P = hidden.size(0), V = weight.size(0);
    auto out = at::empty({P}, hidden.options().dtype(at::kFloat));
    if (P == 0) return out;
    // The product's operands share one type: the inputs' own when they agree, else float32 (the weight
    // converted a tile at a time). float32 products follow torch's matmul precision setting.
    const bool same = hidden.scalar_type() == weight.scalar_type();
    const at::Tensor h = same ? hidden : hidden.to(at::kFloat);
    const bool half = h.scalar_type() != at::kFloat;
    auto y = targets.to(at::kLong).contiguous();
    at::Tensor b = bias ? bias->to(at::kFloat).contiguous() : at::Tensor();
    const int64_t width = std::min(V, std::max(kMinTileWidth, kTileFloats / P / 128 * 128));
    const int64_t block = std::min(P, std::max<int64_t>(1, kTileFloats / width));
    auto buffer = at::empty({block * width}, out.options());
    auto state = at::empty({2 * P}, out.options());
    auto target_logit = at::empty({P}, out.options());
    for (int64_t p0 = 0; p0 < P; p0 += block) {
        const int64_t rows = std::min(block, P - p0);
        const at::Tensor h_rows = h.narrow(0, p0, rows);
        for (int64_t v0 = 0; v0 < V; v0 += width) {
            const int64_t cols = std::min(width, V - v0);
            at::Tensor w_tile = weight.narrow(0, v0, cols);
            if (!same) w_tile = w_tile.to(at::kFloat);
            at::Tensor tile = buffer.narrow(0, 0, rows * cols).view({rows, cols});
            if (half) at::mm_out(tile, h_rows, w_tile.t(), at::kFloat);
            else at::mm_out(tile, h_rows, w_tile.t());
            cuda::hidden_tile(tile.data_ptr<float>(), rows, cols, p0, v0, V, b.defined() ? b.data_ptr<float>() : nullptr,
                              y.data_ptr<int64_t>(), state.data_ptr<float>(), target_logit.data_ptr<float>(),
                              out.data_ptr<float>(), v0 == 0, v0 + cols == V, stream());
            C10_CUDA_KERNEL_LAUNCH_CHECK();
        }
    }
    return out;
}

// token_logprob_hidden_tc: the tensor-core fused head (csrc/cuda/fused_head.cu), two launches, no host
// synchronisation. Extra memory: 2 floats per position and split, and 1 per position. The inputs are used in place when their
// rows are contiguous, 16-byte aligned and a multiple of 8 elements apart; otherwise copied, and an H that
// is not a multiple of 8 is padded with zero columns (which change no product).
at::Tensor tc_operand(const at::Tensor& x, int64_t H8) {
    const int64_t H = x.size(1);
    if (H8 != H) return at::constant_pad_nd(x, {0, H8 - H}, 0);
    const bool usable = x.stride(1) == 1 && x.stride(0) >= H && x.stride(0) % tc_head::kHiddenAlign == 0 &&
                        reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0;
    return usable ? x : x.clone(at::MemoryFormat::Contiguous);
}

at::Tensor token_logprob_hidden_tc(const at::Tensor& hidden, const at::Tensor& weight,
                                   const std::optional<at::Tensor>& bias, const at::Tensor& targets, int64_t splits) {
    const char* op = "token_logprob_hidden_tc";
    const c10::cuda::CUDAGuard guard(hidden.device());
    ops::check_hidden_args(hidden, weight, bias, targets, op);
    const auto type = hidden.scalar_type();
    TORCH_CHECK(type == weight.scalar_type() && (type == at::kHalf || type == at::kBFloat16), op,
                ": hidden and weight must both be float16 or both bfloat16 (the tensor cores' operands), got ",
                hidden.scalar_type(), " and ", weight.scalar_type());
    const int64_t P = hidden.size(0), H = hidden.size(1), V = weight.size(0);
    TORCH_CHECK(P < (int64_t(1) << 31) && V < (int64_t(1) << 31) && H < (int64_t(1) << 30), op,
                ": P, V and H must be below 2^31");
    TORCH_CHECK(splits >= 0, op, ": splits must be >= 0 (0: planned), got ", splits);
    auto out = at::empty({P}, hidden.options().dtype(at::kFloat));
    if (P == 0) return out;
    const DType dtype = type == at::kBFloat16 ? DType::bf16 : DType::f16;
    const int64_t align = tc_head::kHiddenAlign;
    const int64_t H8 = std::max<int64_t>(align, (H + align - 1) / align * align);
    const at::Tensor h = tc_operand(hidden, H8), w = tc_operand(weight, H8);
    auto y = targets.to(at::kLong).contiguous();
    at::Tensor b = bias ? bias->to(at::kFloat).contiguous() : at::Tensor();
    const int64_t tiles = tc_head::vocab_tiles(V);
    const int64_t n_splits = splits > 0 ? std::min(splits, tiles)
                                        : tc_head::plan_splits(P, V, cuda::hidden_tc_slots(dtype));
    auto partial = at::empty({n_splits, P, 2}, out.options());
    auto target_logit = at::empty({P}, out.options());
    cuda::hidden_logprob_tc(h.data_ptr(), w.data_ptr(), dtype, P, H8, V, h.stride(0), w.stride(0),
                            b.defined() ? b.data_ptr<float>() : nullptr, y.data_ptr<int64_t>(), n_splits,
                            partial.data_ptr<float>(), target_logit.data_ptr<float>(), out.data_ptr<float>(), stream());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}

at::Tensor token_logprob(const at::Tensor& logits, const at::Tensor& targets) {
    const c10::cuda::CUDAGuard guard(logits.device());
    return ops::token_logprob<Cuda>(logits, targets);
}
at::Tensor segment_mean(const at::Tensor& values, const at::Tensor& lengths) {
    const c10::cuda::CUDAGuard guard(values.device());
    return ops::segment_mean<Cuda>(values, lengths);
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
    m.impl("token_logprob_hidden_tc", &token_logprob_hidden_tc);
    m.impl("kth_value", &kth_value);
    m.impl("smoothstep_successive", &smoothstep_successive);
    m.impl("smoothstep_bernoulli", &smoothstep_bernoulli);
    m.impl("smoothstep_keys", &smoothstep_keys);
}

}  // namespace clid
