// The one binding of the clid_ops extension: torch tensors in, raw-pointer kernels out.
//
// Every op checks its arguments, then dispatches on the device: CPU kernels live in csrc/cpu/,
// CUDA kernels in csrc/cuda/ (compiled, and CLID_WITH_CUDA defined, only when PyTorch has CUDA).
// The Python wrappers and the plain PyTorch references are in clid/ops.py.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/utils/pybind.h>  // pybind11 with the at::Tensor <-> torch.Tensor casters

#include <string>

#include "common/score_ops.h"

#ifdef CLID_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>   // c10::cuda::CUDAGuard (kernels run on the inputs' device)
#include <c10/cuda/CUDAStream.h>  // c10::cuda::getCurrentCUDAStream(), passed to launchers as void*
#include <c10/cuda/CUDAException.h>  // C10_CUDA_KERNEL_LAUNCH_CHECK
#endif

// Declarations of the sampler ops (owned by the sampler kernels' author), if present.
#if __has_include("common/sampler_ops.h")
#include "common/sampler_ops.h"
#endif

// ---------------------------------------------------------------------------------------------
// Scoring ops (Eq. 2)

namespace {

clid::DType float_dtype(const at::Tensor& t, const char* op, const char* name) {
    switch (t.scalar_type()) {
        case at::kFloat: return clid::DType::f32;
        case at::kHalf: return clid::DType::f16;
        case at::kBFloat16: return clid::DType::bf16;
        default:
            TORCH_CHECK(false, op, ": ", name, " must be float32, float16 or bfloat16, got ", t.scalar_type());
    }
}

// Every target at the scored rows must index the vocabulary; name the first bad one.
void check_targets(const at::Tensor& targets, int64_t V, const char* op, const at::Tensor& where) {
    auto bad = (targets < 0) | (targets >= V);
    if (!bad.any().item<bool>()) return;
    int64_t first = bad.nonzero().index({0, 0}).item<int64_t>();
    auto pos = where.index({first});
    std::string at_str;
    for (int64_t i = 0; i < pos.numel(); ++i) at_str += (i ? ", " : "") + std::to_string(pos[i].item<int64_t>());
    TORCH_CHECK(false, op, ": target ", targets[first].item<int64_t>(), " at position [", at_str,
                "] is outside the vocabulary [0, ", V, ")");
}

// log_softmax(row)[target] for the rows of `logits` starting at `row_offsets` (elements).
at::Tensor rows_logprob(const at::Tensor& logits, const at::Tensor& row_offsets, const at::Tensor& targets) {
    const int64_t V = logits.size(-1), R = row_offsets.numel();
    auto dtype = float_dtype(logits, "seq_logprob", "logits");
    auto out = at::empty({R}, logits.options().dtype(at::kFloat));
    if (R == 0) return out;
    if (logits.is_cuda()) {
#ifdef CLID_WITH_CUDA
        c10::cuda::CUDAGuard guard(logits.device());
        clid::cuda::rows_logprob(logits.data_ptr(), dtype, V, R, row_offsets.data_ptr<int64_t>(),
                                 targets.data_ptr<int64_t>(), out.data_ptr<float>(),
                                 c10::cuda::getCurrentCUDAStream().stream());
        C10_CUDA_KERNEL_LAUNCH_CHECK();
#else
        TORCH_CHECK(false, "clid_ops was built without CUDA");
#endif
    } else {
        clid::cpu::rows_logprob(logits.data_ptr(), dtype, V, R, row_offsets.data_ptr<int64_t>(),
                                targets.data_ptr<int64_t>(), out.data_ptr<float>(), at::get_num_threads());
    }
    return out;
}

at::Tensor segment_mean_offsets(const at::Tensor& values, const at::Tensor& offsets) {
    const int64_t N = offsets.numel() - 1;
    auto out = at::empty({N}, values.options().dtype(at::kFloat));
    if (N == 0) return out;
    if (values.is_cuda()) {
#ifdef CLID_WITH_CUDA
        c10::cuda::CUDAGuard guard(values.device());
        clid::cuda::segment_mean(values.data_ptr<float>(), offsets.data_ptr<int64_t>(), N,
                                 out.data_ptr<float>(), c10::cuda::getCurrentCUDAStream().stream());
        C10_CUDA_KERNEL_LAUNCH_CHECK();
#else
        TORCH_CHECK(false, "clid_ops was built without CUDA");
#endif
    } else {
        clid::cpu::segment_mean(values.data_ptr<float>(), offsets.data_ptr<int64_t>(), N, out.data_ptr<float>());
    }
    return out;
}

// The CSR offsets [N + 1] of consecutive segments of the given lengths.
at::Tensor offsets_from_lengths(const at::Tensor& lengths) {
    auto offsets = at::zeros({lengths.numel() + 1}, lengths.options().dtype(at::kLong));
    offsets.narrow(0, 1, lengths.numel()).copy_(lengths.to(at::kLong).cumsum(0));
    return offsets;
}

at::Tensor seq_logprob(const at::Tensor& logits, const at::Tensor& targets, const at::Tensor& mask) {
    TORCH_CHECK(logits.dim() == 3, "seq_logprob: logits must be [N, T, V], got ", logits.sizes());
    TORCH_CHECK(targets.sizes() == logits.sizes().slice(0, 2) && mask.sizes() == targets.sizes(),
                "seq_logprob: targets and mask must be [N, T] = ", logits.sizes().slice(0, 2),
                ", got ", targets.sizes(), " and ", mask.sizes());
    TORCH_CHECK(logits.stride(2) == 1 || logits.size(2) == 1, "seq_logprob: logits must be contiguous along V");
    TORCH_CHECK(targets.device() == logits.device() && mask.device() == logits.device(),
                "seq_logprob: logits, targets and mask must be on the same device");
    const int64_t V = logits.size(2);
    auto scored = mask != 0;                   // [N, T] bool
    auto where = scored.nonzero();             // [R, 2] rows (n, t), row-major: captions in order
    auto n = where.select(1, 0), t = where.select(1, 1);
    auto row_offsets = (n * logits.stride(0) + t * logits.stride(1)).contiguous();
    auto y = targets.to(at::kLong).index({n, t}).contiguous();
    check_targets(y, V, "seq_logprob", where);
    auto values = rows_logprob(logits, row_offsets, y);
    return segment_mean_offsets(values, offsets_from_lengths(scored.sum(1)));
}

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
    auto values = rows_logprob(rows, (index * rows.stride(0)).contiguous(), y);
    return values.reshape(targets.sizes());
}

at::Tensor segment_mean(const at::Tensor& values, const at::Tensor& lengths) {
    TORCH_CHECK(values.dim() == 1 && lengths.dim() == 1, "segment_mean: values and lengths must be 1-D");
    TORCH_CHECK(values.device() == lengths.device(), "segment_mean: values and lengths must be on the same device");
    TORCH_CHECK(!(lengths < 0).any().item<bool>(), "segment_mean: lengths must be >= 0");
    auto offsets = offsets_from_lengths(lengths);
    TORCH_CHECK(offsets[-1].item<int64_t>() == values.numel(), "segment_mean: lengths sum to ",
                offsets[-1].item<int64_t>(), " but there are ", values.numel(), " values");
    return segment_mean_offsets(values.to(at::kFloat).contiguous(), offsets);
}

at::Tensor token_logprob_hidden(const at::Tensor& hidden, const at::Tensor& weight,
                                const std::optional<at::Tensor>& bias, const at::Tensor& targets) {
    const char* op = "token_logprob_hidden";
    TORCH_CHECK(hidden.dim() == 2 && weight.dim() == 2 && hidden.size(1) == weight.size(1), op,
                ": hidden must be [P, H] and weight [V, H], got ", hidden.sizes(), " and ", weight.sizes());
    TORCH_CHECK(targets.dim() == 1 && targets.size(0) == hidden.size(0), op, ": targets must be [P], got ", targets.sizes());
    const int64_t P = hidden.size(0), H = hidden.size(1), V = weight.size(0);
    TORCH_CHECK(!bias || (bias->dim() == 1 && bias->size(0) == V), op, ": bias must be [V] = [", V, "]");
    TORCH_CHECK(weight.device() == hidden.device() && targets.device() == hidden.device() &&
                (!bias || bias->device() == hidden.device()), op, ": all inputs must be on the same device");
    auto hdt = float_dtype(hidden, op, "hidden");
    auto wdt = float_dtype(weight, op, "weight");
    auto out = at::empty({P}, hidden.options().dtype(at::kFloat));
    if (P == 0) return out;
    TORCH_CHECK(V > 0, op, ": empty vocabulary");
    auto y = targets.to(at::kLong).contiguous();
    check_targets(y, V, op, at::arange(P, y.options()).unsqueeze(1));
    auto w = weight.stride(1) == 1 && weight.stride(0) >= H ? weight : weight.contiguous();
    at::Tensor b = bias ? bias->to(at::kFloat).contiguous() : at::Tensor();
    if (hidden.is_cuda()) {
#ifdef CLID_WITH_CUDA
        c10::cuda::CUDAGuard guard(hidden.device());
        auto h = hidden.stride(1) == 1 && hidden.stride(0) >= H ? hidden : hidden.contiguous();
        auto scratch = at::empty({clid::cuda::hidden_scratch_floats(P, V)}, out.options());
        clid::cuda::hidden_logprob(h.data_ptr(), hdt, P, H, h.stride(0), w.data_ptr(), wdt, V, w.stride(0),
                                   b.defined() ? b.data_ptr<float>() : nullptr, y.data_ptr<int64_t>(),
                                   out.data_ptr<float>(), scratch.data_ptr<float>(),
                                   c10::cuda::getCurrentCUDAStream().stream());
        C10_CUDA_KERNEL_LAUNCH_CHECK();
#else
        TORCH_CHECK(false, "clid_ops was built without CUDA");
#endif
    } else {
        (void)hdt;
        auto h = hidden.to(at::kFloat);  // half inputs: one float32 copy of [P, H]
        if (!(h.stride(1) == 1 && h.stride(0) >= H)) h = h.contiguous();
        clid::cpu::hidden_logprob(h.data_ptr<float>(), P, H, h.stride(0), w.data_ptr(), wdt, V, w.stride(0),
                                  b.defined() ? b.data_ptr<float>() : nullptr, y.data_ptr<int64_t>(),
                                  out.data_ptr<float>(), at::get_num_threads());
    }
    return out;
}

}  // namespace

static std::string build_info() {
    std::string info = "clid_ops: cpu";
#ifdef CLID_WITH_CUDA
    info += "+cuda";
#endif
#ifdef _OPENMP
    info += ", openmp " + std::to_string(_OPENMP);
#endif
    return info;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "CLID fused kernels (see clid/ops.py for the documented Python API)";
    m.def("build_info", &build_info, "What this build contains");
    m.def("with_cuda", []() {
#ifdef CLID_WITH_CUDA
        return true;
#else
        return false;
#endif
    });

    // ---- score ops (C1) ----
    m.def("seq_logprob", &seq_logprob, "(1/m) sum_t log_softmax(logits[n,t])[targets[n,t]] over mask[n] -> [N]");
    m.def("token_logprob", &token_logprob, "log_softmax(logits)[targets] -> targets.shape");
    m.def("segment_mean", &segment_mean, "means of consecutive segments of the given lengths -> [N]");
    m.def("token_logprob_hidden", &token_logprob_hidden, "log_softmax(hidden W^T + b)[targets] -> [P]");
    m.def("hidden_row_block", []() { return clid::cpu::kHiddenRowBlock; });
    m.def("hidden_vocab_tile", []() { return clid::cpu::kHiddenVocabTile; });
    m.def("hidden_slab_rows", []() { return clid::cpu::kHiddenSlabRows; });

    // ---- sampler ops (C2) ----
    register_sampler_ops(m);  // csrc/cpu/sampler_torch.cpp
}
