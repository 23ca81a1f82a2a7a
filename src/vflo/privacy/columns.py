"""A run's attacks in a few columns of its results row: the best feature reconstruction any receiver achieves
against what it could infer from its own features, and the best label inference any passive party achieves
against chance and its own features; so a comparison's cell says at a glance whether anything leaked.

The attacks are :mod:`vflo.privacy.evaluate`'s, on the messages that crossed in the run (each attack reads only
what its attacking party holds). ``[attacks]`` in an experiment config turns them on; ``vflo compare`` does in
its privacy cells and in the base cell they are read against.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from vflo.comm.message import Message
from vflo.data.layout import FederatedData
from vflo.errors import ConfigError

#: The results columns an attacked run adds (NaN where an attack did not apply), in the order tables show them.
COLUMNS = ("attack_r2", "attack_own_r2", "attack_margin", "attack_leaks", "label_auc", "label_completion",
           "label_completion_own", "label_leaks")


@dataclass(frozen=True, kw_only=True)
class AttackSettings:
    """``[attacks]``: how much the attackers know. ``known``: the share of a sender's people whose raw features a
    receiver knows (it fits a ``decoder`` from message rows to feature rows on them); ``labels``: how many labels
    a passive party knows for model completion; ``margin``: how much R² (or completion accuracy) past the
    better of the receiver's own features and guessing (R² 0; the majority class) counts as a leak, and label AUC
    past 0.5 + margin; ``max_rows``: people per flow
    decoded at most (the decoder's time)."""

    known: float = 0.05
    labels: int = 40
    margin: float = 0.05
    decoder: str = "ridge"
    max_rows: int = 2000

    def __post_init__(self) -> None:
        if not 0 < self.known < 1:
            raise ConfigError(f"attacks.known: the share of a sender's rows an attacker knows, in (0, 1); got "
                              f"{self.known}")
        if self.labels < 2:
            raise ConfigError(f"attacks.labels: labels an attacker knows, at least 2; got {self.labels}")
        if not 0 <= self.margin < 1:
            raise ConfigError(f"attacks.margin must be in [0, 1), got {self.margin}")
        if self.decoder not in ("ridge", "mlp"):
            raise ConfigError(f"attacks.decoder: 'ridge' or 'mlp', got {self.decoder!r}")
        if self.max_rows < 50:
            raise ConfigError(f"attacks.max_rows: at least 50 people per flow, got {self.max_rows}")


def attack_columns(seen: list[Message], data: FederatedData, settings: AttackSettings, *,
                   seed: int) -> dict[str, float]:
    """The columns of :data:`COLUMNS` for one run whose messages are ``seen``."""
    from vflo.privacy.evaluate import feature_attacks, label_attacks

    rng = np.random.default_rng(seed)
    y = data.train[data.active].y
    labels_of = {} if y is None else dict(zip(data.train[data.active].ids.tolist(), y.tolist(), strict=True))
    features = feature_attacks(seen, data, (settings.known,), (settings.decoder,), rng, settings.max_rows)
    out = _features(features, settings)
    if data.task != "binary":  # the label attacks score two classes
        return out | {c: math.nan for c in COLUMNS if c.startswith("label_")}
    return out | _labels(label_attacks(seen, data, labels_of, (settings.labels,), rng), settings)


def _r2(result: Mapping[str, Any], key: str) -> float:
    fit = result.get(key)
    return float(fit["r2_mean"]) if isinstance(fit, Mapping) else math.nan


def _features(found: Mapping[str, Mapping[str, Any]], settings: AttackSettings) -> dict[str, float]:
    """The flow where the attack gains most over the receiver's own features (0 where it holds none of them)."""
    key = f"{settings.decoder}@{settings.known:g}"
    best: tuple[float, float, float] | None = None
    for result in found.values():
        attack = max(_r2(result, key), _r2(result, f"averaged {key}"))  # NaN where there was one release
        if math.isnan(attack):
            attack = _r2(result, key)
        if math.isnan(attack):
            continue
        own = _r2(result, f"own features {key}")
        # The receiver can always guess the known rows' mean (R² 0): an attack must beat that and its own features.
        margin = attack - max(0.0, -math.inf if math.isnan(own) else own)
        if best is None or margin > best[2]:
            best = (attack, own, margin)
    if best is None:
        return {"attack_r2": math.nan, "attack_own_r2": math.nan, "attack_margin": math.nan, "attack_leaks": 0.0}
    attack, own, margin = best
    return {"attack_r2": attack, "attack_own_r2": own, "attack_margin": margin,
            "attack_leaks": float(margin > settings.margin)}


def _labels(found: Mapping[str, Mapping[str, Any]], settings: AttackSettings) -> dict[str, float]:
    """The passive party whose label inference goes furthest: the better of norm and direction scoring (AUC of
    the better orientation), and model completion beside the same head on its own raw features."""
    k = settings.labels
    auc, completion, own = math.nan, math.nan, math.nan
    leaks = False
    for result in found.values():
        scores = [float(result[s]) for s in ("norm_auc", "direction_auc") if s in result]
        if scores:
            auc = max(scores) if math.isnan(auc) else max(auc, *scores)
            leaks |= max(scores) > 0.5 + settings.margin
        if f"completion_{k}" in result:
            # Its own features, or always guessing the majority class, whichever is better.
            mine = float(result[f"completion_{k}"])
            raw = max(float(result[f"completion_raw_{k}"]), float(result.get("majority", 0.0)))
            if math.isnan(completion) or mine - raw > completion - own:
                completion, own = mine, raw
            leaks |= mine > raw + settings.margin
    # Nothing to attack (no gradient and no activation reached or left a passive party): nothing leaked.
    return {"label_auc": auc, "label_completion": completion, "label_completion_own": own,
            "label_leaks": float(leaks)}
