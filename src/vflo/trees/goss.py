"""Gradient-based one-side sampling (GOSS; Ke et al., "LightGBM", NeurIPS 2017): which rows a tree is grown on.

A tree keeps the ``top_rate`` share of rows with the largest gradients, and draws ``other_rate`` of all rows at
random from the rest, their gradients and hessians weighed up by ``(1 - top_rate) / other_rate`` so that the sums
stay unbiased; the other rows weigh nothing in that tree (they are still routed through it, and scored). Under
SecureBoost only the kept rows' statistics are encrypted and summed, so a tree costs the partners about
``top_rate + other_rate`` of its additions and the label holder as much of its encryptions.
"""

from __future__ import annotations

import math

import numpy as np


def goss_weights(g: np.ndarray, *, top_rate: float, other_rate: float, rng: np.random.Generator) -> np.ndarray:
    """Each row's weight in one tree: 1 for the ``ceil(top_rate * n)`` rows of largest ``|g|`` (ties by position),
    ``(1 - top_rate) / other_rate`` for ``ceil(other_rate * n)`` drawn from ``rng`` among the rest, 0 for the others
    (all rows are kept where the two shares cover them)."""
    n = len(g)
    top, other = math.ceil(top_rate * n), math.ceil(other_rate * n)
    if top + other >= n:
        return np.ones(n)
    order = np.argsort(-np.abs(np.asarray(g, dtype=np.float64)), kind="stable")
    weights = np.zeros(n)
    weights[order[:top]] = 1.0
    weights[rng.choice(order[top:], size=other, replace=False)] = (1.0 - top_rate) / other_rate
    return weights
