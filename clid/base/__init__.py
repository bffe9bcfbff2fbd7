"""The ground floor: file formats and atomic writes (files), text and tokenizers (text), seeded randomness (rng),
progress lines (progress) and hub model loading (hub). It imports nothing else of clid but ``clid.ops``."""
