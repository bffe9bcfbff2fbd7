"""CLID: Controlled-Length Image Descriptions with Limited Data.

What the numbered stage scripts share, one home per idea:

- ``data/``: every dataset loader, returning the same record types: ``records`` (the types and the
  field checks), ``captions`` (Karpathy, COCO, paragraphs, JSONL), ``splits`` (test ids, the COCO
  converter, the guard that never trains on a test image), ``scenegraphs`` (Visual Genome and the
  Scene Graph Benchmark), ``ssa`` (structured semantic augmentation captions);
  ``python -m clid.data convert-coco|convert-ssa``.
- ``features/``: region features: ``store`` (the checked HDF5 reader, and the model's region inputs),
  ``encoder`` (features of any images with boxes), ``convert`` (the VLP, bottom-up and VinVL releases);
  ``python -m clid.features [convert]``.
- ``model/``: the captioner: ``captioner`` (model and presets), ``checkpoints``, ``inputs`` (captions
  as token ids and levels), ``token_cache`` (the tokens kept beside a captions file), ``decode``
  (mask-predict decoding), ``scoring`` (Eq. 2), ``train``.
- ``caption/``: captions for any features at the levels asked for (``CaptionWriter``; 07 uses it too),
  the gallery page (``gallery``); ``python -m clid.caption``.
- ``selection``: 06's ways to choose training captions (CLID's schedule and its peers).
- ``ops/``: the C++/CUDA kernels' wrappers, each beside its plain PyTorch reference.
- ``eval/``: ``metrics`` (control precision and the COCO metrics per level) and ``report`` (07's report).
- ``selfgen/``: scene graphs prepared for 02's walk (``graphs``), English surface rules (``english``),
  the offline paraphraser (``paraphrase``).
- ``saliency/``: EML-Net (``emlnet``) and stage 01's images (``images``).
- ``files`` (the files passed between stages, atomic writes, ``DataError``), ``runs`` (run records and
  resume checks), ``shard`` (SLURM-array sharding), ``text`` (tokenizer, length and levels), ``rng``
  (randomness keyed by item), ``cli`` (the help formatter, checked number flags, ``run_main``),
  ``progress`` (progress bars and plain log lines), ``stats`` (``python -m clid.stats``);
  ``demo/``: the demo world's simulator and its ground truth (``truth``).
"""
try:
    import torch  # noqa: F401,E402  (loads the libraries the compiled kernels, clid._C, link against)
except ModuleNotFoundError as _missing:  # an interpreter without the pinned requirements: one line, the fix
    import sys as _sys

    raise SystemExit(f"error: this Python ({_sys.executable}) has no module {_missing.name!r}: run "
                     "`source .venv/bin/activate` first (`make venv` creates .venv)") from None

__version__ = "0.1.0"
