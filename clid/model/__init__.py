"""The captioner: model, checkpoints, model inputs, decoding, scoring and training."""
