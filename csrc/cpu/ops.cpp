// The CPU implementations of clid._C's ops: the tensor-level ops of csrc/ops.h over the CPU kernels
// (csrc/cpu/score*.cpp, csrc/cpu/sampler*.cpp, each compiled for several instruction sets and
// chosen at run time: csrc/cpu/isa.h).
#include <torch/library.h>

#include "ops.h"

namespace clid {
namespace {

using clid_sampler::RngParams;
using clid_sampler::SampleInfo;
using clid_sampler::WeightParams;
using ops::threads;

struct Cpu {
    static void rows_logprob(const void* logits, DType dtype, int64_t V, int64_t R, const int64_t* row_offsets,
                             const int64_t* targets, float* out) {
        cpu::rows_logprob(logits, dtype, V, R, row_offsets, targets, out, threads());
    }
    static void segment_mean(const float* values, const int64_t* offsets, int64_t N, float* out) {
        cpu::segment_mean(values, offsets, N, out);
    }
    static void hidden_logprob(const at::Tensor& hidden, DType, const at::Tensor& w, DType wdt, const at::Tensor& b,
                               const at::Tensor& y, at::Tensor& out) {
        const int64_t P = hidden.size(0), H = hidden.size(1), V = w.size(0);
        auto h = hidden.to(at::kFloat);  // half inputs: one float32 copy of [P, H]
        if (!(h.stride(1) == 1 && h.stride(0) >= H)) h = h.contiguous();
        cpu::hidden_logprob(h.data_ptr<float>(), P, H, h.stride(0), w.data_ptr(), wdt, V, w.stride(0),
                            b.defined() ? b.data_ptr<float>() : nullptr, y.data_ptr<int64_t>(), out.data_ptr<float>(),
                            threads());
    }

    static int64_t first_nan(const at::Tensor& u) {
        if (u.scalar_type() == at::kFloat) return clid_sampler::first_nan_cpu(u.data_ptr<float>(), u.numel(), threads());
        return clid_sampler::first_nan_cpu(u.data_ptr<double>(), u.numel(), threads());
    }
    static double kth_value(const at::Tensor& u, int64_t k, bool force_radix, int64_t* bad) {
        if (u.scalar_type() == at::kFloat)
            return clid_sampler::kth_value_cpu(u.data_ptr<float>(), u.numel(), k, threads(), bad, force_radix);
        return clid_sampler::kth_value_cpu(u.data_ptr<double>(), u.numel(), k, threads(), bad, force_radix);
    }
    static SampleInfo successive(const at::Tensor& u, int64_t k, WeightParams w, RngParams r, at::Tensor& out,
                                 int force_path) {
        if (u.scalar_type() == at::kFloat)
            return clid_sampler::successive_sample_cpu(u.data_ptr<float>(), u.numel(), k, w, r, out.data_ptr<int64_t>(),
                                                       threads(), force_path);
        return clid_sampler::successive_sample_cpu(u.data_ptr<double>(), u.numel(), k, w, r, out.data_ptr<int64_t>(),
                                                   threads(), force_path);
    }
    static at::Tensor bernoulli(const at::Tensor& u, WeightParams w, RngParams r) {
        const int64_t m = u.numel();
        at::Tensor counts = at::empty({clid_sampler::num_chunks(m)}, u.options().dtype(at::kLong));
        const bool single = u.scalar_type() == at::kFloat;
        const int64_t total =
            single ? clid_sampler::bernoulli_count_cpu(u.data_ptr<float>(), m, w, r, counts.data_ptr<int64_t>(), threads())
                   : clid_sampler::bernoulli_count_cpu(u.data_ptr<double>(), m, w, r, counts.data_ptr<int64_t>(), threads());
        at::Tensor out = at::empty({total}, u.options().dtype(at::kLong));
        if (single)
            clid_sampler::bernoulli_write_cpu(u.data_ptr<float>(), m, w, r, counts.data_ptr<int64_t>(),
                                              out.data_ptr<int64_t>(), threads());
        else
            clid_sampler::bernoulli_write_cpu(u.data_ptr<double>(), m, w, r, counts.data_ptr<int64_t>(),
                                              out.data_ptr<int64_t>(), threads());
        return out;
    }
    static void keys(const at::Tensor& u, WeightParams w, RngParams r, at::Tensor& keys) {
        auto* dst = reinterpret_cast<uint64_t*>(keys.data_ptr<int64_t>());
        if (u.scalar_type() == at::kFloat) clid_sampler::successive_keys_cpu(u.data_ptr<float>(), u.numel(), w, r, dst, threads());
        else clid_sampler::successive_keys_cpu(u.data_ptr<double>(), u.numel(), w, r, dst, threads());
    }
};

}  // namespace

TORCH_LIBRARY_IMPL(clid, CPU, m) {
    m.impl("seq_logprob", &ops::seq_logprob<Cpu>);
    m.impl("token_logprob", &ops::token_logprob<Cpu>);
    m.impl("segment_mean", &ops::segment_mean<Cpu>);
    m.impl("token_logprob_hidden", &ops::token_logprob_hidden<Cpu>);
    m.impl("kth_value", &ops::kth_value<Cpu>);
    m.impl("smoothstep_successive", &ops::smoothstep_successive<Cpu>);
    m.impl("smoothstep_bernoulli", &ops::smoothstep_bernoulli<Cpu>);
    m.impl("smoothstep_keys", &ops::smoothstep_keys<Cpu>);
}

}  // namespace clid
