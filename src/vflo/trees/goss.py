"""Gradient-based one-side sampling (GOSS; Ke et al., "LightGBM: A Highly Efficient Gradient Boosting Decision
Tree", NeurIPS 2017, Algorithm 2): which rows a boosting round's trees are grown on.

A round keeps the ``top_rate`` share of rows with the largest gradients, and draws ``other_rate`` of all rows at
random from the rest, their gradients and hessians weighed up by ``(1 - top_rate) / other_rate`` so that the sums
stay unbiased; the other rows weigh nothing in that round's trees (they are still routed through them, and
scored). Rows are ranked by |g| as the paper does (with one tree per class, by the sum of |g| over the classes,
one sample for the round's trees); LightGBM's code ranks by |g h| and starts sampling after 1 / learning_rate
rounds, which this does not. Under SecureBoost only the kept rows' statistics are encrypted and summed.
"""

from __future__ import annotations

import math

import numpy as np


def goss_weights(g: np.ndarray, *, top_rate: float, other_rate: float, rng: np.random.Generator) -> np.ndarray:
    """Each row's weight in one round, ``g`` its gradients (rows, or rows x classes): 1 for the
    ``ceil(top_rate * n)`` rows of largest gradient (ties by position), ``(1 - top_rate) / other_rate`` for
    ``ceil(other_rate * n)`` drawn from ``rng`` among the rest, 0 for the others (every row kept where the two
    shares cover them all)."""
    magnitude = np.abs(np.asarray(g, dtype=np.float64))
    if magnitude.ndim == 2:
        magnitude = magnitude.sum(axis=1)
    n = len(magnitude)
    top, other = math.ceil(top_rate * n), math.ceil(other_rate * n)
    if top + other >= n:
        return np.ones(n)
    order = np.argsort(-magnitude, kind="stable")
    weights = np.zeros(n)
    weights[order[:top]] = 1.0
    weights[rng.choice(order[top:], size=other, replace=False)] = (1.0 - top_rate) / other_rate
    return weights
