"""The coordinating party's side of a federation: its own party, the others' names, and the transport.

:class:`Coordinator` implements the port methods, alignment and trees drive (:class:`vflo.party.port.Federation`):
it exposes the coordinating (active) party's data and nothing else; everything about other parties arrives in
replies to requests, and each :meth:`Coordinator.exchange` is one communication round. :class:`Aligner` is the part
of it that finds shared IDs, built alone where a deployment aligns without a method (``vflo align``, the checks
before a run). :class:`~vflo.federation.session.Session` drives a run's lifecycle through the small public interface
below (:meth:`Coordinator.start_run`, :meth:`Aligner.control`, :meth:`Aligner.control_each`); nothing outside this
module touches their private members.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING

import numpy as np

from vflo.align import disclosure, engines, kept, plain
from vflo.align.engines import AlignmentConfig
from vflo.comm.message import Message, Payload, Reply
from vflo.comm.transport import Transport
from vflo.data.partydata import PartyData
from vflo.dp import PrivacyAccount, RowNoise
from vflo.errors import MethodError, PartyBoundaryError, ProtocolError, RemoteError, TransportError
from vflo.party.context import AlignmentFolder, NodeContext
from vflo.party.node import Node
from vflo.party.policy import Policy
from vflo.party.port import Alignment
from vflo.roles import PartyInfo, active_party

if TYPE_CHECKING:
    import torch

    from vflo.data.datasets import Task
    from vflo.data.layout import Oracle
    from vflo.methods.base import Method
    from vflo.nn.train import CheckpointPlan

logger = logging.getLogger(__name__)


class Aligner:
    """Finds the IDs the coordinating party shares with others, by the configured protocol, and sends the rounds
    (and control messages) of whatever runs over it: :class:`vflo.party.port.Aligning`."""

    def __init__(self, *, node: Node, transport: Transport, parties: tuple[PartyInfo, ...],
                 alignment: AlignmentConfig | None = None, reuse_kept: bool = True) -> None:
        self._node = node
        self.alignment = alignment or AlignmentConfig()
        self.transport = transport
        self.parties = parties
        # Which PSI ran last ("vflo", or the library's protocol): for the results and the log.
        self.alignment_engine = ""
        # The partners of the last alignment: those its disclosure concerns (revealed()).
        self.aligned_with: tuple[str, ...] = ()
        # The kept intersection behind each partner's alignment for each purpose, and whether it was reused (True)
        # or kept just now: vflo.align.kept.
        self.kept: dict[tuple[str, str], tuple[kept.Kept, bool]] = {}
        # False: intersect afresh even where a kept intersection covers the IDs (and keep the new one).
        self._reuse_kept = reuse_kept
        self._round = 0
        self._in_flight: PendingExchange | None = None
        # The current run's ID, chosen at setup: every message of the run carries it, and a party serves one run.
        self.run_id = ""
        if node.info not in parties:
            raise PartyBoundaryError(f"coordinator {node.name!r} is not one of the parties")

    # -- who is who ----------------------------------------------------------------------------

    @property
    def party(self) -> str:
        return self._node.name

    @property
    def active(self) -> str:
        return active_party(self.parties).name

    def names(self, *roles: str) -> list[str]:
        """Names of the parties with any of ``roles`` (all if none given), the coordinator excluded."""
        return [p.name for p in self.parties if p.name != self.party and (not roles or p.role in roles)]

    @property
    def policy(self) -> Policy:
        """What this party agreed to (its own config): where its side of a PSI library's link listens, say."""
        return self._node.policy

    def link_tls(self) -> tuple[str, str, str] | None:
        """This party's certificate, key and CA as files, for a link it opens itself (None without TLS): before
        a method is set up too (a deployment's checks, ``vflo align``)."""
        return self.transport.link_files()

    @property
    def alignments(self) -> AlignmentFolder | None:
        """Where this party keeps its private set intersections (its own folder), if it keeps them."""
        return self._node.alignments

    @property
    def rounds(self) -> int:
        return self._round

    # -- alignment ---------------------------------------------------------------------------------

    def align(self, ids: np.ndarray, parties: Sequence[str], *, purpose: str = "train") -> Alignment:
        """The subset of ``ids`` (sorted) that every party in ``parties`` holds, by the configured protocol; with
        PSI, from the intersections this party and each partner kept where they cover ``ids``
        (:mod:`vflo.align.kept`), and afresh with the others (then kept)."""
        ids = np.sort(ids)
        self.aligned_with = tuple(parties)
        store = kept.store_of(self) if self.alignment.method == "psi" and self.alignment.reuse else None
        if store is None or not parties:
            return self._intersect(ids, parties, purpose=purpose)
        mode = self.alignment.mode
        held: dict[str, np.ndarray] = {}
        widths: dict[str, int] = {}
        used: dict[str, kept.Kept] = {}
        if self._reuse_kept:
            held, widths, used = kept.reuse(self, store, ids, parties, purpose=purpose, mode=mode)
        self.kept.update({(p, purpose): (r, True) for p, r in used.items()})
        rest = [p for p in parties if p not in held]
        if rest:
            fresh = self._intersect(ids, rest, purpose=purpose)
            written = kept.keep(self, store, fresh, rest, purpose=purpose, mode=mode, engine=self.alignment_engine)
            self.kept.update({(p, purpose): (r, False) for p, r in written.items()})
            held.update(fresh.held)
            widths.update(fresh.widths)
        else:
            self.alignment_engine = "reused"
        keep = np.logical_and.reduce([held[p] for p in parties])
        return Alignment(ids=ids[keep], asked=ids, held=held, widths=widths)

    def _intersect(self, ids: np.ndarray, parties: Sequence[str], *, purpose: str) -> Alignment:
        if self.alignment.method == "psi":
            found, self.alignment_engine = engines.intersect(self, self.alignment, ids, parties, purpose=purpose)
            return found
        if parties and not self.transport.shared_ledger:
            # The default of a deployment is PSI (vflo.align.engines.DEPLOYED_ALIGNMENT): this one was chosen.
            logger.warning("plain alignment: %d IDs of %s go in the clear to %s ([alignment] method = 'plain' in the "
                           "experiment config; leave it out for private set intersection)", len(ids), self.party,
                           ", ".join(parties))
        return plain.intersect(self, ids, parties, purpose=purpose)

    def revealed(self) -> str:
        """What the last alignment revealed, to whom (one sentence; empty before any)."""
        if not self.aligned_with:
            return ""
        return disclosure.revealed(method=self.alignment.method, mode=self.alignment.mode, engine=self.alignment_engine,
                                   coordinator=self.party, partners=self.aligned_with)

    # -- rounds ------------------------------------------------------------------------------------

    def exchange(self, kind: str, payloads: Mapping[str, Payload]) -> dict[str, Reply]:
        """One communication round: send each party its payload, return each reply's payload."""
        self._round += 1
        return self._send_all(kind, payloads, round_no=self._round)

    def control(self, kind: str, payloads: Mapping[str, Payload], *, first: bool = False) -> dict[str, Reply]:
        """A control message to each party (a run's setup, save, ledger or end): no round of its own, sent in the
        current round, or round 0 with ``first`` (a new run's setup or a scoring session's load)."""
        return self._send_all(kind, payloads, round_no=0 if first else self._round)

    def control_each(self, kind: str, payloads: Mapping[str, Payload], *,
                     first: bool = False) -> dict[str, Reply | TransportError | RemoteError]:
        """:meth:`control` where a party may fail: each party's reply, or the error its message met (undelivered,
        unanswered, or refused by the party)."""
        messages = self._messages(kind, payloads, round_no=0 if first else self._round)
        self.settle()
        out: dict[str, Reply | TransportError | RemoteError] = {}
        for m, r in zip(messages, self.transport.request_each(messages), strict=True):
            if isinstance(r, TransportError):
                out[m.receiver] = r
                continue
            try:
                out[m.receiver] = r.unwrap()
            except RemoteError as exc:
                out[m.receiver] = exc
        return out

    def settle(self) -> None:
        """Wait for a round started by :meth:`Coordinator.exchange_async` whose replies nobody read yet; an error
        one of them carries is raised here rather than lost."""
        pending, self._in_flight = self._in_flight, None
        if pending is not None and not pending.read:
            pending.result()

    def abandon(self) -> None:
        """Let a round a failed run started early end, its outcome kept out of what comes next."""
        stale, self._in_flight = self._in_flight, None
        if stale is not None:
            with contextlib.suppress(Exception):
                stale.result()

    def _messages(self, kind: str, payloads: Mapping[str, Payload], *, round_no: int) -> list[Message]:
        if self.party in payloads:
            raise PartyBoundaryError(f"the coordinator {self.party!r} cannot send {kind!r} to itself")
        return [
            Message(sender=self.party, receiver=name, kind=kind, round=round_no, payload=payload, run=self.run_id)
            for name, payload in payloads.items()
        ]

    def _send_all(self, kind: str, payloads: Mapping[str, Payload], *, round_no: int) -> dict[str, Reply]:
        messages = self._messages(kind, payloads, round_no=round_no)
        self.settle()
        replies = self.transport.request_many(messages)
        return {m.receiver: r.unwrap() for m, r in zip(messages, replies, strict=True)}


class Coordinator(Aligner):
    """Drives a method's exchanges from the coordinating party: :class:`vflo.party.port.Federation`."""

    def __init__(
        self, *, node: Node, transport: Transport, parties: tuple[PartyInfo, ...], seed: int,
        task: Task, n_classes: int | None, oracle: Oracle | None = None,
        alignment: AlignmentConfig | None = None, whoever_answers: bool = False,
    ) -> None:
        if task != "regression" and (n_classes is None or n_classes < 2):
            raise MethodError(f"a {task} task needs n_classes >= 2, got {n_classes}")
        super().__init__(node=node, transport=transport, parties=parties, alignment=alignment)
        self.task: Task = task
        self.n_classes = n_classes
        self.seed = seed
        self._oracle = oracle
        self._method: Method | None = None
        # Where a method's training keeps checkpoints and whether it resumes (the runner's plan): see nn.train.
        self._checkpoint: CheckpointPlan | None = None
        # Scoring with whoever answers (``missing = "subset"``): a partner that fails to answer is absent, not an
        # error. ``absent``: partners out for the whole session (their part did not load), with why.
        self._whoever_answers = whoever_answers
        self.absent: dict[str, str] = {}
        # Told of every absence, for a batch or the session (a server that rests a partner that missed its deadline).
        self.on_absent: Callable[[str, Exception | str], None] | None = None

    # -- a run (Session's interface) -------------------------------------------------------------------

    def start_run(self, method: Method, *, checkpoint: CheckpointPlan | None = None) -> str:
        """A new run (or scoring session) of ``method``: a fresh run ID, the method installed at the coordinating
        party; the run ID. A round a failed earlier run started early is the caller's to end first (:meth:`abandon`).
        """
        if checkpoint is not None:
            self._checkpoint = checkpoint
        self._method = method
        self.run_id = secrets.token_hex(16)
        self._node.install(method, seed=self.seed, parties=self.parties, run=self.run_id)
        return self.run_id

    @property
    def checkpoint(self) -> CheckpointPlan | None:
        return self._checkpoint

    @property
    def whoever_answers(self) -> bool:
        return self._whoever_answers

    # -- the coordinating party's own --------------------------------------------------------------

    def in_force(self) -> contextlib.AbstractContextManager[None]:
        """The coordinating party's own executor and spill setting, in force for its side of fit and scoring."""
        return self._node.in_force()

    @property
    def ctx(self) -> NodeContext:
        if self._node.context is None:
            raise MethodError("the federation has not been set up with a method yet")
        return self._node.context

    @property
    def data(self) -> PartyData:
        """The coordinating party's own training data."""
        return self.ctx.require_data()

    @property
    def serving(self) -> PartyData:
        return self.ctx.rows("serve")

    @property
    def oracle(self) -> Oracle:
        """Pooled features: simulation-only, and only for methods marked ``simulation_only``."""
        if self._oracle is None or self._method is None or not self._method.simulation_only:
            raise PartyBoundaryError(
                "the pooled-data oracle exists only in simulation and only for simulation-only baselines"
            )
        return self._oracle

    @property
    def n_outputs(self) -> int:
        """Width of a model's output layer: one per class, or one for regression."""
        return 1 if self.task == "regression" or self.n_classes is None else self.n_classes

    def rng(self, *purpose: int | str) -> np.random.Generator:
        return self.ctx.rng(*purpose)

    def torch_generator(self, *purpose: int | str) -> torch.Generator:
        return self.ctx.torch_generator(*purpose)

    def shared_rng(self, *purpose: int | str) -> np.random.Generator:
        """Randomness from the public run seed, for choices the messages reveal anyway (see NodeContext)."""
        return self.ctx.shared_rng(*purpose)

    def row_noise(self, *purpose: int | str) -> RowNoise:
        return self.ctx.row_noise(*purpose)

    @property
    def privacy(self) -> PrivacyAccount:
        """What the coordinating party has released under differential privacy (its own account)."""
        return self.ctx.privacy

    # -- who answers ------------------------------------------------------------------------------

    def mark_absent(self, party: str, why: Exception | str, *, session: bool = False) -> None:
        """Note that ``party`` did not answer (for this batch, or with ``session`` for the whole session)."""
        text = str(why)
        if self.on_absent is not None:
            self.on_absent(party, why)
        if session:
            self.absent[party] = text
        logger.warning("party %s is absent%s: %s", party, "" if session else " for this batch", text)

    @contextlib.contextmanager
    def scoring_with(self, partners: Sequence[str]) -> Iterator[None]:
        """What runs inside scores with ``partners`` alone: every other partner absent, as one that does not answer
        (for a method that scores with any subset of its partners); as before afterwards."""
        saved = self._whoever_answers, dict(self.absent)
        self._whoever_answers = True
        self.absent.update({p: "left out of this scoring" for p in self.names() if p not in partners})
        try:
            yield
        finally:
            self._whoever_answers, self.absent = saved

    def present(self, parties: Sequence[str]) -> list[str]:
        """Those of ``parties`` not absent for the whole session."""
        return [p for p in parties if p not in self.absent]

    # -- exchanges ---------------------------------------------------------------------------------

    def exchange_async(self, kind: str, payloads: Mapping[str, Payload]) -> PendingExchange:
        """:meth:`exchange`, started now: the coordinator may compute while the round is under way.

        Call :meth:`PendingExchange.result` for the replies. Any other exchange first waits for this
        one, so rounds still happen in order; in process the round is done before this returns.
        """
        messages = self._messages(kind, payloads, round_no=self._round + 1)
        self.settle()
        self._round += 1
        self._in_flight = PendingExchange(messages, self.transport.request_many_async(messages))
        return self._in_flight

    def post(self, kind: str, payloads: Mapping[str, Payload]) -> None:
        """One round whose replies the coordinator does not wait for (they carry nothing).

        Each message goes out with the next request to its party, or at :meth:`flush`, so over a
        network it costs no round trip of its own; an error it causes is raised there.
        """
        messages = self._messages(kind, payloads, round_no=self._round + 1)
        self.settle()
        self._round += 1
        for message in messages:
            self.transport.post(message)

    def flush(self) -> None:
        """Deliver every posted message now (the runner calls this when a method's fit returns)."""
        self.settle()
        self.transport.flush()

    def exchange_tolerant(
        self, kind: str, payloads: Mapping[str, Payload], *, refusals: frozenset[str] = frozenset()
    ) -> tuple[dict[str, Reply], dict[str, ProtocolError]]:
        """One round in which a party may fail to answer: (replies, failures by party).

        Errors a party reports (a :class:`RemoteError`) still raise, unless their type is among ``refusals`` (a
        party's policy refusing this request, as over its rate: the party is left out as if it had not answered);
        otherwise only undelivered or unanswered messages are tolerated.
        """
        messages = self._messages(kind, payloads, round_no=self._round + 1)
        self.settle()
        self._round += 1
        replies: dict[str, Reply] = {}
        failures: dict[str, ProtocolError] = {}
        for m, r in zip(messages, self.transport.request_each(messages), strict=True):
            if isinstance(r, TransportError):
                failures[m.receiver] = r
                continue
            try:
                replies[m.receiver] = r.unwrap()
            except RemoteError as exc:
                if exc.error_type not in refusals:
                    raise
                failures[m.receiver] = exc
        return replies, failures

    def request(self, receiver: str, kind: str, payload: Payload) -> Reply:
        return self.exchange(kind, {receiver: payload})[receiver]

    def broadcast(self, kind: str, payload: Payload, to: Sequence[str]) -> dict[str, Reply]:
        return self.exchange(kind, {name: payload for name in to})

    def score_together(self, kind: str, ids: np.ndarray, parties: Sequence[str], *,
                       extra: Payload | None = None) -> dict[str, Reply]:
        """Ask every party in ``parties`` for its share of scoring ``ids`` (collaborative inference);
        ``extra`` fields ride along with the IDs.

        A party that does not hold some of the rows turns into a :class:`MethodError` that says
        why: methods whose inference is collaborative can only score rows every party holds.
        """
        if not parties:
            return {}
        try:
            return self.broadcast(kind, {"ids": ids, **(extra or {})}, parties)
        except RemoteError as exc:
            name = self._method.name if self._method is not None else "this method"
            raise MethodError(
                f"{name} predicts collaboratively, so every party must hold the rows to score: {exc}. Score "
                "aligned rows only (protocol aligned_holdout, or test_from = 'aligned')"
            ) from exc


class PendingExchange:
    """A round started by :meth:`Coordinator.exchange_async`; :meth:`result` waits for its replies."""

    def __init__(self, messages: Sequence[Message], future: Future[list[Message]]) -> None:
        self._messages = list(messages)
        self._future = future
        self._replies: dict[str, Reply] | None = None
        self.read = False  # whether its sender asked for the replies (and so saw any error)

    def result(self) -> dict[str, Reply]:
        """Each party's reply payload; raises what :meth:`Coordinator.exchange` would have raised."""
        self.read = True
        if self._replies is None:
            replies = self._future.result()
            self._replies = {m.receiver: r.unwrap() for m, r in zip(self._messages, replies, strict=True)}
        return self._replies
