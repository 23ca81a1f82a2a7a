"""Differential privacy for what a party sends: the Gaussian mechanism on rows, and its privacy accounting.

A party clips each row it releases to L2 norm ``clip`` (C) and adds N(0, σ²C²) to every value (σ: the noise
multiplier). Two data sets are neighbours when one person's row differs, so a release has sensitivity 2C
and each release is a Gaussian mechanism with μ = 2/σ in the sense of Gaussian differential privacy
(Dong, Roth & Su, "Gaussian Differential Privacy", JRSS-B 2022). A person whose row is released k times
(once per epoch, or at training and again at scoring) is protected by μ = √k · 2/σ: Gaussian mechanisms
compose exactly under GDP, and with no subsampling to amplify, nothing tighter applies. ε for a given δ is
the exact conversion of μ-GDP (their Corollary 2.13, equal to Balle & Wang's analytic Gaussian mechanism):

    δ(ε) = Φ(-ε/μ + μ/2) - e^ε Φ(-ε/μ - μ/2).

This is exact for Gaussian releases, where an RDP accountant (Opacus) would only bound it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from vflo.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class GaussianNoise:
    """Clip rows to L2 norm ``clip``, add N(0, (noise_multiplier · clip)²); ``delta`` for the ε reported."""

    clip: float = 1.0
    noise_multiplier: float = 1.0
    delta: float = 1e-5

    def __post_init__(self) -> None:
        if not self.clip > 0 or not self.noise_multiplier > 0:
            raise ConfigError(f"noise: clip and noise_multiplier must be positive, got {self.clip}, "
                              f"{self.noise_multiplier}")
        if not 0 < self.delta < 1:
            raise ConfigError(f"noise: delta must be in (0, 1), got {self.delta}")

    def release(self, rows: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The rows as a party sends them: each clipped to norm ``clip``, then noised; same shape and dtype."""
        X = np.asarray(rows)
        flat = X.reshape(len(X), -1).astype(np.float64)
        norms = np.linalg.norm(flat, axis=1, keepdims=True)
        clipped = flat * np.minimum(1.0, self.clip / np.maximum(norms, 1e-12))
        noisy = clipped + rng.normal(0.0, self.noise_multiplier * self.clip, size=flat.shape)
        out: np.ndarray = noisy.reshape(X.shape).astype(X.dtype)
        return out

    def epsilon(self, releases: int = 1) -> float:
        """ε at ``delta`` for a person whose row this mechanism released ``releases`` times."""
        return gdp_epsilon(math.sqrt(releases) * 2.0 / self.noise_multiplier, self.delta)


def _phi(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def gdp_delta(mu: float, epsilon: float) -> float:
    """δ of a μ-GDP mechanism at ``epsilon``."""
    from scipy.special import log_ndtr

    # e^ε Φ(x) in log space: with little noise (large μ) ε reaches hundreds, where e^ε alone overflows.
    return _phi(-epsilon / mu + mu / 2) - math.exp(epsilon + float(log_ndtr(-epsilon / mu - mu / 2)))


def gdp_epsilon(mu: float, delta: float) -> float:
    """The smallest ε at which a μ-GDP mechanism is (ε, δ)-DP (bisection on the exact conversion)."""
    if mu <= 0:
        return 0.0
    if gdp_delta(mu, 0.0) <= delta:
        return 0.0
    lo, hi = 0.0, 1.0
    while gdp_delta(mu, hi) > delta:
        hi *= 2
        if hi > 1e6:
            return math.inf
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if gdp_delta(mu, mid) > delta else (lo, mid)
    return hi


def laplace_epsilon(per_value: float, values: int) -> float:
    """ε of a row whose ``values`` entries each went through a Laplace mechanism at ``per_value`` (basic
    composition, tight for Laplace)."""
    return per_value * values
