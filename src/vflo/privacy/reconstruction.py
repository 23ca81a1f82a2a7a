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
rows' mean; below 0: worse), and the relative error ||X̂ - X||_F / ||X - mean||_F. What a receiver could infer
with no message at all, from its own columns that correlate with the sender's, is the same decoder on the same
known rows reading the receiver's own features instead (:func:`decode_each` fits both in one call). Where the
receiver got several releases of the same person (activations every epoch, a person scored again), it averages
them per person before decoding, which takes independent noise down by the square root of their number.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import numpy as np

from vflo.errors import ConfigError


def _r2(X_hat: np.ndarray, X: np.ndarray) -> np.ndarray:
    residual = ((X - X_hat) ** 2).sum(axis=0)
    total = ((X - X.mean(axis=0)) ** 2).sum(axis=0)
    return np.asarray(1.0 - residual / np.maximum(total, 1e-12))


def known_rows(n: int, known: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Which of ``n`` rows the attacker knows (a ``known`` share, drawn with ``rng``) and which it decodes."""
    order = rng.permutation(n)
    n_known = round(known * n)
    return order[:n_known], order[n_known:]


def rows_digest(rows: np.ndarray) -> str:
    """A short fingerprint of a set of row positions: equal for two fits on the same known rows."""
    return hashlib.sha256(np.sort(np.asarray(rows, dtype=np.int64)).tobytes()).hexdigest()[:16]


def fit_decoder(messages: np.ndarray, features: np.ndarray, seen: np.ndarray, rest: np.ndarray, *, decoder: str,
                seed: int = 0) -> dict[str, float | int | str | list[float]]:
    """Fit ``decoder`` ('ridge' or 'mlp'; any with no ``seen`` rows: the known rows' mean, here the prior mean) on
    the ``seen`` (message row, feature row) pairs and decode the ``rest``: per-feature R², their mean, the relative
    error against the known rows' mean as a guess, and which rows were known (:func:`rows_digest`)."""
    M = np.asarray(messages, dtype=np.float64).reshape(len(messages), -1)
    X = np.asarray(features, dtype=np.float64)
    if M.shape[0] != X.shape[0]:
        raise ConfigError(f"{M.shape[0]} message rows for {X.shape[0]} feature rows")
    n_known = len(seen)
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
            "known_rows": n_known, "decoded_rows": len(rest), "known_digest": rows_digest(seen),
            "decoder": decoder if n_known else "mean"}


def decode(messages: np.ndarray, features: np.ndarray, *, known: float, decoder: str,
           rng: np.random.Generator, seed: int = 0) -> dict[str, float | int | str | list[float]]:
    """Fit ``decoder`` ('ridge' or 'mlp') on a ``known`` share of (message row, feature row) pairs, decode the
    others; per-feature R², their mean, and the relative error, against the known rows' mean as a guess."""
    seen, rest = known_rows(len(features), known, rng)
    return fit_decoder(messages, features, seen, rest, decoder=decoder, seed=seed)


def decode_each(inputs: Mapping[str, np.ndarray], features: np.ndarray, *, known: float, decoder: str,
                rng: np.random.Generator, seed: int = 0) -> dict[str, dict[str, float | int | str | list[float]]]:
    """The same attack on several inputs about the same people (rows in the same order): the message as it
    arrived, the releases averaged per person, the receiver's own features. One draw of known rows, one decoder
    family, so the results differ only in what the decoder reads (the baseline cannot drift from the attack)."""
    if any(len(v) != len(features) for v in inputs.values()):
        raise ConfigError("every input to compare needs one row per feature row, in the same order")
    seen, rest = known_rows(len(features), known, rng)
    return {name: fit_decoder(values, features, seen, rest, decoder=decoder, seed=seed)
            for name, values in inputs.items()}
