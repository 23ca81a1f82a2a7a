"""What each partner is worth to a model, after training: Shapley values over the partners.

A partner's Shapley value is its marginal contribution averaged over every order in which the partners could
join the active party:

    φ_i = Σ_{S ⊆ N∖{i}} |S|! (n − |S| − 1)! / n! · (v(S ∪ {i}) − v(S)),

with v(S) the model's score on held-out people when it scores with the partners S alone (the active party always
present). Two ways to get every v(S):

- **from one model** (:func:`worth_of` for a model already trained, :func:`any_subset_worth` to train it first): a
  model that scores with any subset of its partners (LASER-VFL, SecureBoost, SplitNN with party dropout) scores
  the held-out people 2^n times, the partners outside S absent as if they did not answer; intervals from the
  bootstrap of those people (the same scores, resampled, no model trained again). After training, this costs
  the scoring alone; its ``seconds`` are that, and the training's are ``training_seconds``;
- **by retraining** (:func:`retrained_worth`): the method trained once per subset, on the active party and S
  alone (exact, and 2^n trainings); with ``leave_one_out``, only the full set and each set less one partner
  (v(N) − v(N∖{i}), n + 1 trainings), labelled as such.

The value is the negative log loss for a classification task (a smooth score that ranks partners where accuracy on
a few held-out people ties) and the negative mean squared error for regression, unless a metric is named.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal

import numpy as np

from vflo.data.datasets import Task
from vflo.data.layout import FederatedData
from vflo.errors import ConfigError
from vflo.methods.base import Method
from vflo.metrics import compute_metrics, higher_is_better

if TYPE_CHECKING:
    from vflo.api import FittedModel

How = Literal["any subset", "retrained", "leave one out (retrained)"]
Subset = frozenset[str]


@dataclass
class Worth:
    """Each partner's Shapley value (or leave-one-out difference), with the values of the subsets behind it."""

    method: str
    how: How
    metric: str
    partners: tuple[str, ...]
    values: dict[Subset, float]
    worth: dict[str, float]
    #: What valuing the partners took: the 2^n scorings and the bootstrap (one model), or every training (retrained).
    seconds: float
    interval: dict[str, tuple[float, float]] = field(default_factory=dict)
    #: One model: the time its training took where :func:`any_subset_worth` trained it (0 for a model given).
    training_seconds: float = 0.0

    def ranking(self) -> list[str]:
        """The partners from the most worth to the least."""
        return sorted(self.partners, key=lambda p: -self.worth[p])


def value(task: Task, y: np.ndarray, scores: np.ndarray, metric: str | None = None) -> float:
    """How good ``scores`` are, higher better: the negative log loss (classification) or mean squared error
    (regression) by default; else ``metric`` (of :func:`vflo.metrics.compute_metrics`), negated where lower is
    better."""
    if metric is None:
        if task == "regression":
            return -float(np.mean((np.asarray(scores, dtype=np.float64).reshape(-1) - y) ** 2))
        proba = np.clip(np.asarray(scores, dtype=np.float64), 1e-12, 1.0)
        return float(np.mean(np.log(proba[np.arange(len(y)), np.asarray(y, dtype=np.int64)])))
    got = compute_metrics(task, y, scores)[metric]
    return got if higher_is_better(metric) else -got


def shapley(values: Mapping[Subset, float], partners: Sequence[str]) -> dict[str, float]:
    """Each partner's Shapley value from every subset's value."""
    n = len(partners)
    out = {}
    for p in partners:
        others = [q for q in partners if q != p]
        total = 0.0
        for k in range(n):
            weight = math.factorial(k) * math.factorial(n - k - 1) / math.factorial(n)
            for chosen in itertools.combinations(others, k):
                s = frozenset(chosen)
                total += weight * (values[s | {p}] - values[s])
        out[p] = total
    return out


def subsets(partners: Sequence[str]) -> list[Subset]:
    return [frozenset(c) for k in range(len(partners) + 1) for c in itertools.combinations(partners, k)]


def any_subset_worth(method: Method, data: FederatedData, *, seed: int = 0, metric: str | None = None,
                     bootstrap: int = 500, level: float = 0.95) -> Worth:
    """Train ``method`` once on ``data`` and value every partner from that one model (:func:`worth_of`); its
    training's time is ``training_seconds``."""
    from vflo.api import fit

    why = method.subset_refusal()
    if why:
        raise ConfigError(f"{method.name} cannot value its partners from one model: {why}; use retrained_worth")
    started = time.perf_counter()
    model = fit(method, data, seed=seed)
    trained = time.perf_counter() - started
    return replace(worth_of(model, metric=metric, bootstrap=bootstrap, level=level, seed=seed),
                   training_seconds=trained)


def worth_of(model: FittedModel, *, metric: str | None = None, bootstrap: int = 500, level: float = 0.95,
             seed: int = 0) -> Worth:
    """Every partner's Shapley value from a trained model scoring its split's held-out people with each subset of
    its partners; a ``level`` interval from ``bootstrap`` resamples of those people (scores kept, resampled; the
    resampling's own generator from ``seed``)."""
    why = model.method.subset_refusal()
    if why:
        raise ConfigError(f"{model.name} cannot value its partners from one model: {why}; use retrained_worth")
    data = model.data
    partners = tuple(p.name for p in data.parties if p.role == "passive")
    started = time.perf_counter()
    scores = {s: model.predict(partners=sorted(s)) for s in subsets(partners)}
    values = {s: value(data.task, data.test_y, v, metric) for s, v in scores.items()}
    worth = shapley(values, partners)
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(bootstrap):
        rows = rng.integers(0, len(data.test_y), len(data.test_y))
        drawn = {s: value(data.task, data.test_y[rows], v[rows], metric) for s, v in scores.items()}
        draws.append(shapley(drawn, partners))
    tail = (1 - level) / 2
    interval = {p: (float(np.quantile([d[p] for d in draws], tail)), float(np.quantile([d[p] for d in draws],
                                                                                      1 - tail)))
                for p in partners} if draws else {}
    return Worth(method=model.name, how="any subset", metric=metric or _default(data.task), partners=partners,
                 values=values, worth=worth, seconds=time.perf_counter() - started, interval=interval)


def retrained_worth(make: Callable[[], Method], data: FederatedData, *, seed: int = 0, metric: str | None = None,
                    leave_one_out: bool = False) -> Worth:
    """Every partner's Shapley value from the method trained once per subset of its partners (``make()`` gives
    a fresh one each time), or, with ``leave_one_out``, its leave-one-partner-out difference v(N) − v(N∖{i})."""
    from vflo.api import fit

    partners = tuple(p.name for p in data.parties if p.role == "passive")
    wanted = subsets(partners) if not leave_one_out else \
        [frozenset(partners), *(frozenset(partners) - {p} for p in partners)]
    started = time.perf_counter()
    values = {}
    for s in wanted:
        model = fit(make(), only(data, s), seed=seed)
        name = model.name
        values[s] = value(data.task, data.test_y, model.predict(), metric)
    seconds = time.perf_counter() - started
    if leave_one_out:
        full = values[frozenset(partners)]
        worth = {p: full - values[frozenset(partners) - {p}] for p in partners}
        how: How = "leave one out (retrained)"
    else:
        worth, how = shapley(values, partners), "retrained"
    return Worth(method=name, how=how, metric=metric or _default(data.task), partners=partners,
                 values=values, worth=worth, seconds=seconds)


def only(data: FederatedData, partners: Subset) -> FederatedData:
    """``data`` with the active party and ``partners`` alone (the others' columns and people gone)."""
    keep = {data.active, *partners}
    return replace(data, parties=tuple(p for p in data.parties if p.name in keep),
                   train={k: v for k, v in data.train.items() if k in keep},
                   serve={k: v for k, v in data.serve.items() if k in keep},
                   scalers={k: v for k, v in data.scalers.items() if k in keep},
                   encodings={k: v for k, v in data.encodings.items() if k in keep}, oracle=None)


def _default(task: str) -> str:
    return "negative mean squared error" if task == "regression" else "negative log loss"
