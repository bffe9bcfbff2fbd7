"""What a training step minimises, and at which learning rate."""
import math

import torch


def masked_lm_loss(logits, targets, eos: int, eos_weight: float = 0.5, smoothing: float = 0.1):
    """Weighted label-smoothed cross-entropy, summed: returns (sum of w * loss, sum of w).

    Smoothing puts ``smoothing / (V - 1)`` on every wrong class (as LaBERT); the weight of a target
    is ``eos_weight`` for "." and 1 otherwise.
    """
    logp = logits.float().log_softmax(-1)
    V = logp.shape[-1]
    logp_target = logp.gather(1, targets[:, None]).squeeze(1)
    other = logp.sum(-1) - logp_target
    loss = -((1.0 - smoothing) * logp_target + smoothing / (V - 1) * other)
    weight = torch.where(targets == eos, eos_weight, 1.0).to(loss.dtype)
    return (loss * weight).sum(), weight.sum()


def learning_rate(step: int, base_lr: float, warmup: int, total: int) -> float:
    """Linear warm-up to ``base_lr`` over ``warmup`` steps, then cosine decay to 0 at ``total``."""
    if step < warmup:
        return base_lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return base_lr * 0.5 * (1.0 + math.cos(math.pi * progress))
