"""CLID: Controlled-Length Image Descriptions with Limited Data.

The shared pieces of the numbered stage scripts: tokenizer and length levels (``text``), file
formats (``files``), dataset loaders (``data``), sharding (``shard``), keyed randomness (``rng``)
and dataset statistics (``python -m clid.stats``); region features of any images with boxes
(``features``, ``python -m clid.features``) and the demo world's simulator (``demo``).
"""
__version__ = "0.1.0"
