"""The fused ops of the compiled extension ``clid._C`` (``csrc/``), each beside the plain reference
the tests compare it against.

``clid._C`` is built when the package is installed (``pip install --no-build-isolation -e .``,
the Makefile's install step; ``setup.py``): C++ kernels for the CPU, and CUDA kernels where
PyTorch has CUDA and a CUDA toolkit is found. Importing it registers the ops as
``torch.ops.clid.*``; the functions below are their documented API. Without the extension,
importing ``clid.ops`` fails with a line that says how to build it: a pipeline run never falls
back silently to the slower references.

Scoring, Eq. 2 of the paper, ``log p(y|x) = (1/m) sum_t log P(w_t | ...)`` (``score``):

    seq_logprob(logits[N,T,V], targets[N,T], mask[N,T]) -> [N]
    token_logprob(logits[..., V], targets[...]) -> [...]
    token_logprob_hidden(hidden[P,H], weight[V,H], bias[V] or None, targets[P]) -> [P]
    token_logprob_hidden_tc(hidden[P,H], weight[V,H], bias[V] or None, targets[P]) -> [P]   (CUDA only)
    segment_mean(values[P], lengths=[N] | segment_ids=[P]) -> [N]

token_logprob_hidden_tc is the same head fused on the tensor cores (float16 or bfloat16 operands of one
type; csrc/cuda/fused_head.cu): on the CPU it raises, and no plan or stage uses it unless asked to.

Inputs may be float32, float16 or bfloat16; arithmetic is float32 (sums over captions in float64)
and outputs are float32. Results are bitwise equal from run to run and do not depend on the number
of threads. A caption with no scored token (m = 0) gets NaN: the mean of nothing is undefined, and
0 (the best possible log-probability) would rank an empty caption first.

Data selection, step 6 (``sampler``):

    kth_value(u, k) -> float                              k-th smallest, 1-based
    percentile_threshold(u, q, method="linear") -> float  numpy.percentile(u, q[, method])
    smoothstep_sample(u, threshold, s, k, seed, iteration, mode="successive") -> int64 indices
"""
import torch  # (first: it loads the libraries clid._C links against)

try:
    from clid import _C  # noqa: F401  (loads the library; its initialisers register torch.ops.clid)
except ImportError as err:
    raise ImportError(f"clid._C, the compiled kernels, is not built or does not load ({err}); build it with "
                      "`make venv` or `pip install --no-build-isolation -e .` from the repository") from None

from clid.ops.sampler import kth_value, kth_value_reference, percentile_threshold, smoothstep_sample  # noqa: E402
from clid.ops.score import (  # noqa: E402
    segment_mean,
    segment_mean_reference,
    seq_logprob,
    seq_logprob_reference,
    token_logprob,
    token_logprob_hidden,
    token_logprob_hidden_reference,
    token_logprob_hidden_tc,
    token_logprob_reference,
)

__all__ = ["build_info", "kth_value", "kth_value_reference", "percentile_threshold", "segment_mean",
           "segment_mean_reference", "seq_logprob", "seq_logprob_reference", "smoothstep_sample", "token_logprob",
           "token_logprob_hidden", "token_logprob_hidden_reference", "token_logprob_hidden_tc", "token_logprob_reference",
           "with_cuda"]


def build_info() -> str:
    """What the build holds and which CPU kernels this machine runs, e.g.
    ``clid._C: cpu, cpu kernels avx512, openmp 201511``."""
    return torch.ops.clid.build_info()


def with_cuda() -> bool:
    """Whether clid._C has CUDA kernels."""
    return torch.ops.clid.with_cuda()
