"""Quantile bins of one party's own columns: codes for histograms, cut points for its lookup table."""

from __future__ import annotations

import numpy as np

from vflo.errors import ConfigError

#: The most bins a column may have: codes are int8, and one more code marks a missing value.
MAX_BINS = 126


def quantile_cuts(column: np.ndarray, n_bins: int) -> np.ndarray:
    """At most ``n_bins - 1`` increasing cut points from the quantiles of the column's present values (NaN is
    missing); bin k holds the values in (cut[k-1], cut[k]]."""
    if not 2 <= n_bins <= MAX_BINS:
        raise ConfigError(f"n_bins must be in 2..{MAX_BINS}, got {n_bins}")
    present = column[~np.isnan(column)]
    if len(present) == 0:
        return np.empty(0)
    cuts = np.unique(np.quantile(present, np.linspace(0.0, 1.0, n_bins + 1)[1:-1], method="lower"))
    # A cut at the largest value would leave the last bin empty: every present value is at or below it.
    out: np.ndarray = cuts[cuts < present.max()]
    return out


def fit_cuts(X: np.ndarray, n_bins: int) -> list[np.ndarray]:
    """Each column's cut points."""
    return [quantile_cuts(X[:, j], n_bins) for j in range(X.shape[1])]


def bin_codes(X: np.ndarray, cuts: list[np.ndarray], n_bins: int) -> np.ndarray:
    """Each value's bin (int8, C order, rows x columns); a missing value gets code ``n_bins``, the bucket that
    histograms count but splits never read (a node's missing sums are its totals less the present ones)."""
    codes = np.empty(X.shape, dtype=np.int8)
    for j, c in enumerate(cuts):
        column = X[:, j]
        codes[:, j] = np.where(np.isnan(column), n_bins, np.searchsorted(c, column, side="left"))
    return np.ascontiguousarray(codes)


def threshold(cuts: np.ndarray, bin_index: int) -> float:
    """The value a split after ``bin_index`` compares with (x <= threshold goes left); past the last cut, every
    present value goes left (a split of present against missing)."""
    return float(cuts[bin_index]) if bin_index < len(cuts) else float("inf")
