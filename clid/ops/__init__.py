"""Fused kernels of the csrc/ extension, each next to the plain PyTorch reference it is tested against.

The extension (``clid_ops``: ``csrc/binding.cpp``, every ``csrc/cpu/*.cpp``, and every
``csrc/cuda/*.cu`` when PyTorch has CUDA and a CUDA toolkit is found) is built once, at install time:

    python -m clid.ops build          # run by `make venv` and by slurm/submit_all.sh

with ``torch.utils.cpp_extension.load`` (ninja), into
``$XDG_CACHE_HOME/clid/torch_extensions/`` (``~/.cache`` by default; ``CLID_OPS_BUILD_DIR``
overrides it), in a folder named after a hash of the sources, the headers, the Python and torch
versions, the CPU, the compiler and the flags. At run time it is only imported; a run that finds
no build makes it once (see "Building and loading" below: killed builds never block later runs).
If the build fails, or ``CLID_OPS_DISABLE=1``, every wrapper warns once and runs its reference.

Scoring ops (Eq. 2 of the paper, ``log p(y|x) = (1/m) sum_t log P(w_t | ...)``):

    seq_logprob(logits[N,T,V], targets[N,T], mask[N,T]) -> [N]
    token_logprob(logits[..., V], targets[...]) -> [...]
    token_logprob_hidden(hidden[P,H], weight[V,H], bias[V] or None, targets[P]) -> [P]
    segment_mean(values[P], lengths=[N] | segment_ids=[P]) -> [N]

Inputs may be float32, float16 or bfloat16; arithmetic is float32 (sums over captions in float64)
and outputs are float32. Results are bitwise equal from run to run and do not depend on the number
of threads. A caption with no scored token (m = 0) gets NaN: the mean of nothing is undefined, and
0 (the best possible log-probability) would rank an empty caption first."""
from clid.ops.build import (CSRC, READY, ROOT, ExtensionSpec, build_directory, build_error, build_lock,  # noqa: F401
                            extension, extension_spec, load_or_build, parse_args)
from clid.ops.sampler import (_smoothstep_sample_path, kth_value, kth_value_reference,  # noqa: F401
                              percentile_threshold, smoothstep_sample)
from clid.ops.sampler_numpy import (_exponential_from_bits, _one_plus_exp, _philox4x32_10,  # noqa: F401
                                    smoothstep_keys_reference, smoothstep_sample_reference, smoothstep_weights)
from clid.ops.score import (segment_mean, segment_mean_reference, seq_logprob, seq_logprob_reference,  # noqa: F401
                            token_logprob, token_logprob_hidden, token_logprob_hidden_reference,
                            token_logprob_reference)
