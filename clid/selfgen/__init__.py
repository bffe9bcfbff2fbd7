"""Steps 1 to 3, the self-generated captions: saliency (the spectral residual, EML-Net), scene-graph reading,
the saliency-guided walks, and paraphrasing (offline rules, Pegasus through transformers or CTranslate2).
It imports data and below."""
