"""The server's reconstruction attacks on RAP's projected features (Zhang et al., RAP, Section 3).

The server holds X̃ = X A (A secret) and tries X̂ = X̃ R. Each attack returns the relative
reconstruction error ||X̂ - X||_F / ||X - mean(X)||_F: about 0 is a full recovery, about 1 or more
means the server learnt nothing beyond the mean.

* :func:`no_knowledge` – the server guesses R at random (Case 1).
* :func:`known_means` – the server knows the column means μ of X and takes the least-norm R with
  mean(X̃) R = μ (Case 2). For a one-feature client without RAP's pseudo feature this is the
  scale estimate a = mean(x̃) / μ, and it recovers the feature exactly.
* :func:`known_rows` – the server knows n rows of X. Without collusion it cannot tell which
  projected rows they are and pairs them blindly (Case 3b, no collusion); with a colluding client
  that reveals the row IDs it solves least squares for R (Case 3b), exact once n >= F.
"""

from __future__ import annotations

import numpy as np

from vflo.errors import ConfigError


def relative_error(X_hat: np.ndarray, X: np.ndarray) -> float:
    X = np.asarray(X, dtype=np.float64)
    spread = float(np.linalg.norm(X - X.mean(axis=0)))
    return float(np.linalg.norm(np.asarray(X_hat, dtype=np.float64) - X)) / max(spread, 1e-12)


def no_knowledge(X_tilde: np.ndarray, X: np.ndarray, rng: np.random.Generator) -> float:
    """Case 1: a random Gaussian R of the right shape."""
    R = rng.normal(0.0, 1.0 / np.sqrt(X_tilde.shape[1]), size=(X_tilde.shape[1], X.shape[1]))
    return relative_error(np.asarray(X_tilde, dtype=np.float64) @ R, X)


def known_means(X_tilde: np.ndarray, X: np.ndarray) -> float:
    """Case 2: the least-norm R that maps the projected column means onto the true ones."""
    m = np.asarray(X_tilde, dtype=np.float64).mean(axis=0, keepdims=True)
    mu = np.asarray(X, dtype=np.float64).mean(axis=0, keepdims=True)
    R = np.linalg.pinv(m) @ mu
    return relative_error(np.asarray(X_tilde, dtype=np.float64) @ R, X)


def known_rows(X_tilde: np.ndarray, X: np.ndarray, known: np.ndarray, *, collusion: bool,
               rng: np.random.Generator) -> float:
    """Case 3: the server knows the rows ``known`` of X; with ``collusion`` it also knows which projected rows
    they are, without it pairs them with projected rows at random."""
    if len(known) == 0:
        raise ConfigError("the attack needs at least one known row")
    Xt = np.asarray(X_tilde, dtype=np.float64)
    rows = known if collusion else rng.choice(len(Xt), size=len(known), replace=False)
    R, *_ = np.linalg.lstsq(Xt[rows], np.asarray(X, dtype=np.float64)[known], rcond=None)
    return relative_error(Xt @ R, X)


def attack_report(X_tilde: np.ndarray, X: np.ndarray, *, n_known: int, seed: int = 0) -> dict[str, float]:
    """Every case on one client's projected block: relative reconstruction error per attack."""
    rng = np.random.default_rng(seed)
    known = rng.choice(len(X), size=min(n_known, len(X)), replace=False)
    return {
        "no_knowledge": no_knowledge(X_tilde, X, rng),
        "known_means": known_means(X_tilde, X),
        "known_rows_no_collusion": known_rows(X_tilde, X, known, collusion=False, rng=rng),
        "known_rows_with_collusion": known_rows(X_tilde, X, known, collusion=True, rng=rng),
    }
