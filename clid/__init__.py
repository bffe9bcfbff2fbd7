"""CLID: Controlled-Length Image Descriptions with Limited Data.

What the numbered stage scripts share, in layers that import only downward (``pyproject.toml``'s
import-linter contract; ``docs/method.md`` has the code map):

- the web page: ``app`` (``python -m clid.app``, an optional install);
- commands and applications: ``caption/`` (captions for any features or images, the gallery;
  ``python -m clid.caption``), ``features/``, ``captions``, ``stats``, ``shard``, ``emlnet`` (the ``python -m``
  commands of the same names), ``demo/`` (the demo world's simulator and its ground truth);
- ``training/``: the training loop of 04 and 06, its batches, loss, flags and resume;
- ``selection/`` (Eq. 1, CLID's schedule, its peers) | ``evaluation/`` (metrics, repetition, 07's report);
- ``model/`` (the captioner, checkpoints, decoding, Eq. 2) | ``selfgen/`` (steps 1 to 3: saliency, graph walks,
  paraphrasing);
- ``data/``: every reader and its checks, the feature store, converters and encoder, the model's caption
  inputs, the token cache;
- ``run/``: flags and one-line errors, the device plan, run records, shards and locks;
- ``base/``: files, text, English rules, randomness, progress lines, hub loading; ``ops/``: the C++/CUDA kernels.

``a | b``: two packages of one layer that never import each other.

Importing ``clid`` does not import torch: the commands parse their flags first, so ``--help`` and a bad
flag answer at once (``clid.ops`` imports torch before the compiled kernels it links against).
"""
import importlib.util as _util

if _util.find_spec("torch") is None:  # an interpreter without the pinned requirements: one line, the fix
    import sys as _sys

    raise SystemExit(f"error: this Python ({_sys.executable}) has no module 'torch': run "
                     "`source .venv/bin/activate` first (`make venv` creates .venv)")

__version__ = "0.1.0"
