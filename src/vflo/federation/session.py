"""One run of a method, whatever carries its messages: setup -> fit -> flush -> save -> score -> ledgers -> teardown.

Every entry point builds its nodes and a transport, then a :class:`~vflo.federation.coordinator.Federation` at
the active party, and hands it to a :class:`Session`: a simulation (:func:`vflo.federation.simulation.run_method`,
``vflo.fit``, the transductive protocol, the attack runs), a deployment over vflo's gRPC
(:meth:`vflo.deploy.Deployment.run`) and one over Flower (which runs a deployment over the Grid). What differs
between them is passed in: how the model's parts are saved, and nothing else. The other parties' own ledgers
come back at the end where each process keeps its own (the gRPC and Flower transports), and training's
entries are put first, as one process records them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vflo.comm.ledger import Ledger, LedgerSummary
from vflo.federation.coordinator import Federation
from vflo.methods.base import Method
from vflo.nn.train import CheckpointPlan


@dataclass(frozen=True, eq=False)
class RunOutput:
    """Scores for the test IDs, the ledger of what crossed, and how long each phase took."""

    scores: np.ndarray
    ledger: Ledger
    fit_seconds: float
    predict_seconds: float
    rounds: int
    fit_entries: int
    stats: dict[str, float]
    # What each party ran of its own side where its config differs from the proposal (setting -> value).
    party_settings: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def fit_summary(self) -> LedgerSummary:
        """Traffic of training alone (setup and fit), without scoring."""
        return self.ledger.summary(0, self.fit_entries)

    @property
    def predict_summary(self) -> LedgerSummary:
        return self.ledger.summary(self.fit_entries)


class Session:
    """The lifecycle of one run over ``fed``; each step in order, each once."""

    def __init__(self, fed: Federation) -> None:
        self.fed = fed
        self.fit_seconds = 0.0
        self._fit_round = 0
        self._own_fit = 0

    def start(self, method: Method, *, save: bool = False, checkpoint: CheckpointPlan | None = None) -> None:
        """Check the task and install ``method`` at every party (with ``save``, a party without a folder for its
        part refuses now, before anything trains)."""
        method.check_task(self.fed.task)
        if checkpoint is not None:
            self.fed.checkpoint = checkpoint
        self.fed.setup(method, save=save)

    def train(self, fit: Callable[[Federation], Any]) -> Any:
        """Run the coordinator's side of training (``method.fit``, or a representation step), deliver what it
        posted, and mark where training's traffic ends."""
        started = time.perf_counter()
        out = fit(self.fed)
        self.fed.flush()
        self.fit_seconds = time.perf_counter() - started
        self._fit_round, self._own_fit = self.fed.rounds, len(self.fed.transport.ledger)
        return out

    def finish(self) -> tuple[Ledger, int]:
        """Gather the other parties' own records (where they keep their own), end the run at every party, and
        return the ledger with training's entries first, and how many they are."""
        remote = self.fed.collect_ledgers()
        self.fed.teardown()
        return training_first(self.fed.transport.ledger, self._own_fit, remote, self._fit_round)

    def run(self, method: Method, ids: np.ndarray, *, save: Callable[[Federation], object] | None = None,
            checkpoint: CheckpointPlan | None = None, on_fitted: Callable[[Federation], None] | None = None,
            score: Callable[[Federation], tuple[np.ndarray, dict[str, float]]] | None = None) -> RunOutput:
        """The whole run: start, fit, ``save`` (every party its part), score ``ids`` (or as ``score`` does,
        which returns the scores and stats of its own), finish."""
        self.start(method, save=save is not None, checkpoint=checkpoint)
        self.train(method.fit)
        if on_fitted is not None:
            on_fitted(self.fed)
        if save is not None:
            save(self.fed)
        started = time.perf_counter()
        stats = method.summary_stats()
        if score is not None:
            scores, more = score(self.fed)
            stats |= more
        else:
            scores = method.predict(self.fed, ids) if len(ids) else np.empty((0,))
        predict_seconds = time.perf_counter() - started
        ledger, fit_entries = self.finish()
        return RunOutput(scores=scores, ledger=ledger, fit_seconds=self.fit_seconds, predict_seconds=predict_seconds,
                         rounds=self.fed.rounds, fit_entries=fit_entries, stats=stats,
                         party_settings=self.fed.party_settings)


def training_first(ledger: Ledger, own_fit: int, remote: int, fit_round: int) -> tuple[Ledger, int]:
    """The coordinator's ledger with training first, as in one process, and how many entries training holds.

    Its own entries ``[0, own_fit)`` are training's; the other parties' own records (from ``remote`` on: their
    onward messages, RAP's uploads to its server, FedSVD's masked blocks) belong to training when sent in one
    of its rounds (up to ``fit_round``). Gathered once at the end, they cost no extra exchange.
    """
    entries = ledger.entries
    theirs = range(remote, len(entries))
    fit = [*range(own_fit), *(i for i in theirs if entries[i].round <= fit_round)]
    rest = [*range(own_fit, remote), *(i for i in theirs if entries[i].round > fit_round)]
    return ledger.reordered([*fit, *rest]), len(fit)
