"""Weight of evidence and information value, from per-bin counts: what the label holder computes once it has
decrypted a partner's per-bin label sums (:mod:`vflo.party.explore`), and the same from raw columns, for the
reference test and the label holder's own columns.

For a column cut into bins b, with e_b the people of bin b whose target is 1 and n_b those whose target is 0,
E = Σ e_b and N = Σ n_b:

    WOE_b = ln((e_b / E) / (n_b / N)),    IV = Σ_b (e_b / E − n_b / N) · WOE_b

A bin with no event or no non-event would have an infinite WOE; as FATE does, 0.5 is added to both of its
counts (``SMOOTHING``). The target is the label for a binary task, each class against the rest for a multiclass
one (one IV per class), and "above the median" for regression (:func:`targets`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vflo.errors import ConfigError

#: Added to both counts of a bin with no event or no non-event (FATE's adjustment factor).
SMOOTHING = 0.5


@dataclass(frozen=True)
class Targets:
    """The 0/1 targets IV is computed against: one column per target (rows x targets), and their names."""

    values: np.ndarray
    names: tuple[str, ...]


def targets(y: np.ndarray, task: str, classes: tuple[str, ...] = ()) -> Targets:
    """The 0/1 targets of labels ``y``: binary, the label itself (class 1 the event); multiclass, one per class
    against the rest; regression, whether a value is above the median."""
    y = np.asarray(y)
    if task == "binary":
        name = classes[1] if len(classes) == 2 else "1"
        return Targets(np.asarray(y, dtype=np.int64).reshape(-1, 1) == 1, (f"label = {name}",))
    if task == "multiclass":
        labels = np.asarray(y, dtype=np.int64)
        k = int(labels.max()) + 1 if len(labels) else 0
        names = tuple(f"label = {classes[c] if c < len(classes) else c}" for c in range(k))
        return Targets(labels.reshape(-1, 1) == np.arange(k).reshape(1, -1), names)
    if task == "regression":
        values = np.asarray(y, dtype=np.float64)
        median = float(np.median(values)) if len(values) else 0.0
        return Targets((values > median).reshape(-1, 1), (f"label above its median ({median:g})",))
    raise ConfigError(f"explore: a task is binary, multiclass or regression, got {task!r}")


def woe_iv(events: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, float]:
    """Each bin's WOE and the column's IV from its bins' event counts and people counts (a bin of no one is
    left out: WOE NaN, no share of the IV)."""
    events = np.asarray(events, dtype=np.float64)
    counts = np.asarray(counts, dtype=np.float64)
    if events.shape != counts.shape or np.any(events < 0) or np.any(events > counts):
        raise ValueError("explore: per-bin events must lie between 0 and the bin's people")
    used = counts > 0
    e, n = events[used], counts[used] - events[used]
    total_e, total_n = e.sum(), n.sum()
    woe = np.full(len(counts), np.nan)
    if total_e == 0 or total_n == 0:
        woe[used] = 0.0
        return woe, 0.0  # a target with one value says nothing about any column
    zero = (e == 0) | (n == 0)
    e, n = np.where(zero, e + SMOOTHING, e), np.where(zero, n + SMOOTHING, n)
    share_e, share_n = e / total_e, n / total_n
    woe[used] = np.log(share_e / share_n)
    return woe, float(np.sum((share_e - share_n) * woe[used]))


def chi_merge(events: np.ndarray, counts: np.ndarray, max_bins: int) -> np.ndarray:
    """Adjacent bins merged, the pair with the smallest χ² statistic first, until at most ``max_bins`` remain;
    each original bin's merged bin (ordered, as the bins were). Bins are merged by their order alone: the
    thresholds stay with the party that cut them."""
    if max_bins < 1:
        raise ConfigError(f"explore: chi-merge keeps at least one bin, got max_bins = {max_bins}")
    groups = [[i] for i in range(len(counts))]
    e = [float(v) for v in events]
    c = [float(v) for v in counts]
    while len(groups) > max_bins:
        scores = [_chi2(e[i], c[i], e[i + 1], c[i + 1]) for i in range(len(groups) - 1)]
        i = int(np.argmin(scores))
        groups[i] += groups.pop(i + 1)
        e[i] += e.pop(i + 1)
        c[i] += c.pop(i + 1)
    out = np.empty(len(counts), dtype=np.int64)
    for g, members in enumerate(groups):
        out[members] = g
    return out


def _chi2(e1: float, c1: float, e2: float, c2: float) -> float:
    """Pearson's χ² of a 2 x 2 table (two bins by event / non-event)."""
    total = c1 + c2
    if total == 0:
        return 0.0
    events, non = e1 + e2, total - e1 - e2
    out = 0.0
    for observed, rows, column in ((e1, c1, events), (c1 - e1, c1, non), (e2, c2, events), (c2 - e2, c2, non)):
        expected = rows * column / total
        if expected > 0:
            out += (observed - expected) ** 2 / expected
    return out


def merged(values: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Per-bin ``values`` summed into the merged bins ``groups`` names."""
    out = np.zeros(int(groups.max()) + 1 if len(groups) else 0, dtype=np.asarray(values).dtype)
    np.add.at(out, groups, values)
    return out
