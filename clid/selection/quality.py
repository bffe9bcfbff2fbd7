"""Eq. 1: the quality of a self-generated caption, from the two base models' Eq. 2 scores.

    u_j = log p(y_j | x_j; theta) - log p(y_j | x_j; theta~)                     (Eq. 1)

theta is the model trained on trusted captions, theta~ the one trained on the extended set (trusted and
self-generated); log p(y | x) is Eq. 2's length-normalised log-likelihood (:mod:`clid.model.scoring`). A
caption the trusted model finds likelier than the extended one (u > 0) is one the self-generated data did
not teach: the selection of stage 06 prefers it.
"""
from __future__ import annotations

import numpy as np


def eq1_quality(logp_trusted, logp_extended) -> np.ndarray:
    """Eq. 1 for every caption: ``u = logp_trusted - logp_extended``, float64 [N]."""
    return np.asarray(logp_trusted, np.float64) - np.asarray(logp_extended, np.float64)
