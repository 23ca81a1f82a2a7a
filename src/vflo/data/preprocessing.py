"""Per-party preprocessing, fitted on that party's own training rows only."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vflo.data.partydata import PartyData
from vflo.errors import DataError

#: Rows whose moments are taken in one float64 pass; a party with more combines passes of this many.
MOMENT_ROWS = 1 << 20


def _moments(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each column's mean and standard deviation, in float64, :data:`MOMENT_ROWS` rows at a time (so a party with
    ten million rows holds one float64 block, not a float64 copy of everything), the blocks combined exactly as in
    Chan, Golub and LeVeque's pairwise update; one block gives NumPy's mean and std of all rows."""
    if X.shape[0] <= MOMENT_ROWS:
        X64 = np.asarray(X, dtype=np.float64)
        return X64.mean(axis=0), X64.std(axis=0)
    n = 0
    mean = np.zeros(X.shape[1])
    m2 = np.zeros(X.shape[1])
    for start in range(0, X.shape[0], MOMENT_ROWS):
        block = np.asarray(X[start:start + MOMENT_ROWS], dtype=np.float64)
        k = len(block)
        block_mean = block.mean(axis=0)
        block_m2 = block.var(axis=0) * k
        if n == 0:
            mean, m2 = block_mean, block_m2
        else:
            delta = block_mean - mean
            mean = mean + delta * (k / (n + k))
            m2 = m2 + block_m2 + delta ** 2 * (n * k / (n + k))
        n += k
    return mean, np.sqrt(m2 / n)


@dataclass(frozen=True)
class Standardizer:
    """Zero mean, unit variance per column; constant columns are centred but not scaled."""

    mean_: np.ndarray
    scale_: np.ndarray

    @classmethod
    def fit(cls, X: np.ndarray, keep: np.ndarray | None = None) -> Standardizer:
        """Statistics of ``X``'s columns; columns flagged in ``keep`` (category codes) pass through unchanged."""
        if X.shape[0] == 0:
            raise DataError("cannot standardise a party with no training rows")
        mean, std = _moments(X)
        scale = np.where(std > 1e-12, std, 1.0)
        if keep is not None:
            mean = np.where(keep, 0.0, mean)
            scale = np.where(keep, 1.0, scale)
        return cls(mean_=mean, scale_=scale)

    @classmethod
    def for_party(cls, data: PartyData) -> Standardizer:
        return cls.fit(data.X, np.isin(np.asarray(data.columns), np.asarray(data.categorical, dtype=object)))

    def transform(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X)
        out = np.empty(X.shape, dtype=np.float32)
        # In blocks of rows that stay in cache, in place: the same float64 arithmetic as one expression.
        for start in range(0, len(X), 65_536):
            block = X[start:start + 65_536].astype(np.float64)
            block -= self.mean_
            block /= self.scale_
            out[start:start + 65_536] = block
        return out

    def apply(self, data: PartyData) -> PartyData:
        return data.with_features(self.transform(data.X))
