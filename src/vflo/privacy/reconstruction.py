"""Feature reconstruction by the receiver of a representation.

Threat model: an honest-but-curious receiver (the active party for APC-VFL's latents, SplitNN's activations
and FedSVD / VFedTrans' U Σ; VFL-ASP's first hop for the embeddings E = U Σ; RAP's server for projected rows)
that also knows the raw features of a few of the sender's rows (auxiliary knowledge: a share of the rows,
e.g. people it met elsewhere). It fits a decoder from message rows to feature rows on those and decodes the
rest; the decoder is ridge regression (the best linear guess) or a small MLP. This is the learning-based
model inversion of, e.g., He et al., "Model Inversion Attacks against Collaborative Inference" (ACSAC 2019),
with known input-output pairs; with none (``known = 0``) the best guess is the prior mean, and the report
says so rather than inventing an attack.

Success is per-feature R² on the rows the attacker did not know (1: recovered; 0: no better than the known
rows' mean; below 0: worse), and the relative error ||X̂ - X||_F / ||X - mean||_F.
"""

from __future__ import annotations

import numpy as np

from vflo.errors import ConfigError


def _r2(X_hat: np.ndarray, X: np.ndarray) -> np.ndarray:
    residual = ((X - X_hat) ** 2).sum(axis=0)
    total = ((X - X.mean(axis=0)) ** 2).sum(axis=0)
    return np.asarray(1.0 - residual / np.maximum(total, 1e-12))


def decode(messages: np.ndarray, features: np.ndarray, *, known: float, decoder: str,
           rng: np.random.Generator, seed: int = 0) -> dict[str, float | list[float]]:
    """Fit ``decoder`` ('ridge' or 'mlp') on a ``known`` share of (message row, feature row) pairs, decode the
    others; per-feature R², their mean, and the relative error, against the known rows' mean as a guess."""
    M = np.asarray(messages, dtype=np.float64)
    X = np.asarray(features, dtype=np.float64)
    if M.shape[0] != X.shape[0]:
        raise ConfigError(f"{M.shape[0]} message rows for {X.shape[0]} feature rows")
    order = rng.permutation(len(X))
    n_known = round(known * len(X))
    seen, rest = order[:n_known], order[n_known:]
    if n_known == 0:
        X_hat = np.zeros_like(X[rest]) + X.mean(axis=0)  # no knowledge: nothing better than the prior mean
    elif decoder == "ridge":
        from sklearn.linear_model import RidgeCV

        X_hat = RidgeCV(alphas=np.logspace(-6, 3, 10)).fit(M[seen], X[seen]).predict(M[rest])
    elif decoder == "mlp":
        from sklearn.neural_network import MLPRegressor

        mlp = MLPRegressor(hidden_layer_sizes=(64,), max_iter=2000, early_stopping=n_known >= 50,
                           random_state=seed, alpha=1e-3)
        X_hat = mlp.fit(M[seen], X[seen]).predict(M[rest]).reshape(len(rest), -1)
    else:
        raise ConfigError(f"decoder must be 'ridge' or 'mlp', got {decoder!r}")
    guess = X[seen].mean(axis=0) if n_known else X.mean(axis=0)
    target = X[rest]
    r2 = _r2(X_hat, target)
    spread = float(np.linalg.norm(target - guess))
    return {"r2_mean": float(np.mean(r2)), "r2": [float(v) for v in r2],
            "relative_error": float(np.linalg.norm(X_hat - target)) / max(spread, 1e-12),
            "known_rows": n_known, "decoded_rows": len(rest)}
