"""The model: the LaBERT-style captioner, its keyed dropout, checkpoints, mask-predict decoding, and Eq. 2's
length-normalised caption log-likelihoods (``scoring``). It imports data and below."""

MODES = ("prefix", "pseudo", "onepass")  # how ``scoring`` computes Eq. 2 (05's --mode; here: 05 parses it without torch)
