"""Distance-preserving uses of RAP's projections (Johnson-Lindenstrauss): clustering and neighbour search.

Projected rows keep pairwise distances up to a small distortion, so k-means and nearest-neighbour
search on the server's X̃ should agree with the same on the original X. These functions measure
how well: adjusted Rand index between the two clusterings, and recall of the true k nearest
neighbours among those found in the projected space.
"""

from __future__ import annotations

import numpy as np


def kmeans_agreement(X: np.ndarray, X_tilde: np.ndarray, *, k: int, seed: int = 0) -> float:
    """Adjusted Rand index between k-means on X and k-means on X̃ (1 = identical partitions)."""
    from sklearn.cluster import KMeans
    from sklearn.metrics import adjusted_rand_score

    a = KMeans(k, n_init=5, random_state=seed).fit_predict(X)
    b = KMeans(k, n_init=5, random_state=seed).fit_predict(X_tilde)
    return float(adjusted_rand_score(a, b))


def neighbour_recall(X: np.ndarray, X_tilde: np.ndarray, *, k: int = 10, queries: int = 200, seed: int = 0) -> float:
    """Mean share of each query's true k nearest neighbours that are among its k nearest in X̃."""
    from sklearn.neighbors import NearestNeighbors

    rng = np.random.default_rng(seed)
    q = rng.choice(len(X), size=min(queries, len(X)), replace=False)
    true = NearestNeighbors(n_neighbors=k + 1).fit(X).kneighbors(X[q], return_distance=False)[:, 1:]
    found = NearestNeighbors(n_neighbors=k + 1).fit(X_tilde).kneighbors(X_tilde[q], return_distance=False)[:, 1:]
    return float(np.mean([len(set(t) & set(f)) / k for t, f in zip(true, found, strict=True)]))


def distortion(X: np.ndarray, X_tilde: np.ndarray, *, pairs: int = 2000, seed: int = 0) -> tuple[float, float]:
    """5th and 95th percentiles of ||x̃_i - x̃_j|| / ||x_i - x_j|| over random pairs."""
    rng = np.random.default_rng(seed)
    i, j = rng.integers(0, len(X), size=(2, pairs))
    keep = i != j
    d = np.linalg.norm(X[i[keep]] - X[j[keep]], axis=1)
    dt = np.linalg.norm(X_tilde[i[keep]] - X_tilde[j[keep]], axis=1)
    ratio = dt[d > 0] / d[d > 0]
    return float(np.percentile(ratio, 5)), float(np.percentile(ratio, 95))
