"""The method: the captioner and its checkpoints, decoding, Eq. 1 and Eq. 2 (quality), scoring, selection,
metrics, scene-graph walks, English surface rules, paraphrasing and saliency. It imports data and below."""
