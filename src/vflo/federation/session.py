"""One run of a method, whatever carries its messages: setup -> fit -> flush -> save -> score -> ledgers -> teardown.

Every entry point builds its nodes and a transport, then a :class:`~vflo.federation.coordinator.Coordinator` at
the active party, and hands it to a :class:`Session`: a simulation (:func:`vflo.federation.simulation.run_method`,
``vflo.fit``, the transductive protocol, the attack runs), a deployment over vflo's gRPC
(:meth:`vflo.deploy.Deployment.run`) and one over Flower (which runs a deployment over the Grid). What differs
between them is passed in: how the model's parts are saved, and nothing else. The other parties' own ledgers
come back at the end where each process keeps its own (the gRPC and Flower transports), and training's
entries are put first, as one process records them.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vflo.comm.ledger import Ledger, LedgerSummary
from vflo.comm.message import Payload, Table, Value
from vflo.errors import ProtocolError
from vflo.federation.coordinator import Coordinator
from vflo.methods.base import Method
from vflo.nn.train import CheckpointPlan
from vflo.party.node import LEDGER, LOAD, SAVE, SETUP, TEARDOWN, parties_payload, take_release_key, with_release_key

logger = logging.getLogger(__name__)


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
    # Which PSI ran ("vflo": its own ECDH; "rr22", "kkrt", "ecdh": the PSI library's); "" without PSI.
    psi_engine: str = ""
    # What the alignment revealed, to whom (vflo.align.disclosure); "" without one.
    alignment_revealed: str = ""
    # What each party's account ε (stats' epsilon_account_PARTY) covers, in its own words.
    account_scopes: dict[str, str] = field(default_factory=dict)

    @property
    def fit_summary(self) -> LedgerSummary:
        """Traffic of training alone (setup and fit), without scoring."""
        return self.ledger.summary(0, self.fit_entries)

    @property
    def predict_summary(self) -> LedgerSummary:
        return self.ledger.summary(self.fit_entries)


class Session:
    """The lifecycle of one run (or one scoring session) over ``fed``: what the runner does, and a method never
    does. A method sees only the port, :class:`vflo.party.port.Federation` (its data, exchanges, alignment,
    randomness), which has no lifecycle."""

    def __init__(self, fed: Coordinator) -> None:
        self.fed = fed
        # What each party ran of its own side where it differs from the proposal (its setup reply): path -> value.
        self.party_settings: dict[str, dict[str, Any]] = {}
        # What each party said of its privacy account at the end (where it released anything under noise): its
        # largest ε per person, and what that covers.
        self.accounts: dict[str, tuple[float, str]] = {}
        self.method: Method | None = None
        self.fit_seconds = 0.0
        self._fit_round = 0
        self._own_fit = 0

    # -- a run ----------------------------------------------------------------------------------------------

    def start(self, method: Method, *, save: bool = False, checkpoint: CheckpointPlan | None = None) -> None:
        """Check the task, then install ``method`` at every party (a control message each, and a new run ID) and
        at the coordinator. With ``save``, a party that has no folder for model parts refuses now, before
        anything trains."""
        fed = self.fed
        method.check_task(fed.task)
        fed.abandon()  # a round a failed run started early: let it end, keep its outcome out
        # A transport kept between runs (a deployment) may hold messages a failed run posted; they belong
        # to that run, not to this one.
        if dropped := fed.transport.drop_posted():
            logger.warning("dropped %d undelivered message(s) left by an earlier run", dropped)
        fed.start_run(method, checkpoint=checkpoint)
        self.method = method
        # The coordinating party's own side is planned as every other party's is at its setup: refused before
        # anything runs where it would pass its own budget.
        plan = method.planned_privacy(fed.ctx.info.role, party=fed.party)
        if plan is not None and plan.spends:
            fed.privacy.check_plan(fed.data.ids, plan, what=method.name)
        payload: Payload = {**self._method_payload(method), "save": save}
        others = fed.names()
        self.party_settings = {}
        if not others:
            return
        replies = fed.control(SETUP, {n: payload for n in others}, first=True)
        for name, reply in replies.items():
            own = reply.table("own")
            if own:
                self.party_settings[name] = own
                logger.warning("party %s runs %s with its own %s (not the experiment's)", name, method.name,
                               ", ".join(f"{k} = {json.dumps(v)}" for k, v in sorted(own.items())))

    def _method_payload(self, method: Method) -> Payload:
        fed = self.fed
        return {"method": method.name, "config": Table(method.config_table()), "seed": fed.seed,
                **parties_payload(fed.parties)}

    def train(self, fit: Callable[[Coordinator], Any]) -> Any:
        """Run the coordinator's side of training (``method.fit``, or a representation step), deliver what it
        posted, and mark where training's traffic ends."""
        started = time.perf_counter()
        with self.fed.in_force():
            out = fit(self.fed)
        self.fed.flush()
        self.fit_seconds = time.perf_counter() - started
        self._fit_round, self._own_fit = self.fed.rounds, len(self.fed.transport.ledger)
        return out

    # -- the fitted model's parts -------------------------------------------------------------------------

    def save_parts(self, label: str, model_id: str) -> dict[str, str]:
        """Each other party writes its own part into its own folder; the checksum of each one's manifest."""
        fed = self.fed
        others = fed.names()
        if not others:
            return {}
        request: Payload = {"label": label, "model_id": model_id}
        replies = fed.control(SAVE, {name: request for name in others})
        return {name: reply.text("manifest") for name, reply in replies.items()}

    def own_part(self, method: Method) -> dict[str, Value]:
        """What the coordinating party saves of the fitted ``method``: its state, and the key of its noised
        releases (so scoring later releases a row as before)."""
        return with_release_key(method.coordinator_state(self.fed), self.fed.ctx)

    def load(self, method: Method, label: str, model_id: str, own: Mapping[str, Value]) -> dict[str, str]:
        """A scoring session: install ``method`` here from this party's saved state ``own`` and have every other
        party restore its saved part; each one's manifest checksum (a partner whose part does not load is absent
        for the session where the federation takes whoever answers)."""
        self.fed.start_run(method)
        manifests = self._load_others(method, label, model_id)
        method.load_coordinator_state(self.fed, take_release_key(own, self.fed.ctx))
        return manifests

    def _load_others(self, method: Method, label: str, model_id: str) -> dict[str, str]:
        fed = self.fed
        others = fed.names()
        if not others:
            return {}
        payload: Payload = {**self._method_payload(method), "label": label, "model_id": model_id}
        if not fed.whoever_answers:
            replies = fed.control(LOAD, {name: payload for name in others}, first=True)
            return {name: reply.text("manifest") for name, reply in replies.items()}
        # A partner that left after training (not running, or its part gone) is absent for the whole session.
        manifests: dict[str, str] = {}
        for name, answer in fed.control_each(LOAD, {name: payload for name in others}, first=True).items():
            if isinstance(answer, Exception):
                fed.mark_absent(name, answer, session=True)
            else:
                manifests[name] = answer.text("manifest")
        return manifests

    # -- the end --------------------------------------------------------------------------------------------

    def collect_ledgers(self) -> int:
        """Merge the other parties' own ledgers into this one (when each process keeps its own); where their
        entries start in it."""
        fed = self.fed
        if fed.transport.shared_ledger:
            return len(fed.transport.ledger)
        others = fed.names()
        if not others:
            return len(fed.transport.ledger)
        replies = fed.control(LEDGER, {n: {} for n in others})
        start = len(fed.transport.ledger)
        for name, reply in replies.items():
            try:
                fed.transport.ledger.extend(Ledger.from_columns(reply))
            except (KeyError, ValueError, TypeError) as exc:
                raise ProtocolError(f"party {name!r} sent a malformed ledger: {exc}") from exc
        return start

    def teardown(self) -> None:
        """End the run (or scoring session) at every party still there; keep what each says of its privacy account
        (:attr:`accounts`)."""
        fed = self.fed
        self._own_account()
        others = fed.present(fed.names())
        if not others:
            return
        if not fed.whoever_answers:
            replies: Mapping[str, Any] = fed.control(TEARDOWN, {n: {} for n in others})
        else:
            # Whoever is still there ends the session; one that went away meanwhile has nothing to end.
            replies = {n: r for n, r in fed.control_each(TEARDOWN, {n: {} for n in others}).items()
                       if not isinstance(r, Exception)}
        for name, reply in replies.items():
            if "epsilon" in reply:
                self.accounts[name] = (reply.number("epsilon"), reply.text("scope"))

    def account_stats(self) -> dict[str, float]:
        """Each party's account as results stats (``epsilon_account_PARTY``: the largest ε of its people)."""
        return {f"epsilon_account_{name}": eps for name, (eps, _) in self.accounts.items()}

    def account_scopes(self) -> dict[str, str]:
        """What each party's account covers, in its own words."""
        return {name: scope for name, (_, scope) in self.accounts.items()}

    def _own_account(self) -> None:
        """The coordinating party's own account beside the others', where it released anything under privacy."""
        fed = self.fed
        if fed.privacy.releases and self.method is not None:
            self.accounts[fed.party] = (float(fed.privacy.epsilon()),
                                        self.method.account_scope(fed.ctx.info.role))

    def finish(self) -> tuple[Ledger, int]:
        """Gather the other parties' own records (where they keep their own), end the run at every party, and
        return the ledger with training's entries first, and how many they are."""
        remote = self.collect_ledgers()
        self.teardown()
        return training_first(self.fed.transport.ledger, self._own_fit, remote, self._fit_round)

    def run(self, method: Method, ids: np.ndarray, *, save: Callable[[Session], object] | None = None,
            checkpoint: CheckpointPlan | None = None, on_fitted: Callable[[Coordinator], None] | None = None,
            score: Callable[[Coordinator], tuple[np.ndarray, dict[str, float]]] | None = None) -> RunOutput:
        """The whole run: start, fit, ``save`` (every party its part), score ``ids`` (or as ``score`` does,
        which returns the scores and stats of its own), finish."""
        self.start(method, save=save is not None, checkpoint=checkpoint)
        self.train(method.fit)
        if on_fitted is not None:
            on_fitted(self.fed)
        if save is not None:
            save(self)
        started = time.perf_counter()
        stats = method.summary_stats()
        with self.fed.in_force():
            if score is not None:
                scores, more = score(self.fed)
                stats |= more
            else:
                scores = method.predict(self.fed, ids) if len(ids) else np.empty((0,))
        predict_seconds = time.perf_counter() - started
        ledger, fit_entries = self.finish()
        # Each party's own account, end to end where it says so: the ε it reports, not one computed from the proposal.
        stats |= self.account_stats()
        return RunOutput(scores=scores, ledger=ledger, fit_seconds=self.fit_seconds, predict_seconds=predict_seconds,
                         rounds=self.fed.rounds, fit_entries=fit_entries, stats=stats,
                         party_settings=self.party_settings, psi_engine=self.fed.alignment_engine,
                         alignment_revealed=self.fed.revealed(),
                         account_scopes=self.account_scopes())


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
