"""The coordinator's port: what a method, alignment and trees may ask of the coordinating side.

A method's ``fit`` and ``predict`` (and the alignment protocols the coordinator drives) receive a
:class:`Federation`: the coordinating party's own data and randomness, the others' names and roles, and rounds of
messages to them. Nothing else: everything about another party arrives in a reply. The one implementation is
:class:`vflo.federation.coordinator.Coordinator`, which sits above the methods; this protocol sits below them,
beside :class:`~vflo.party.context.NodeContext` (what a party's handlers may touch), so that the methods and
alignment depend on what they use and not on the class that drives them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from vflo.comm.message import Payload, Reply
from vflo.comm.transport import Transport
from vflo.data.partydata import PartyData
from vflo.dp import PrivacyAccount, RowNoise
from vflo.errors import ProtocolError
from vflo.party.context import AlignmentFolder, NodeContext
from vflo.party.policy import Policy
from vflo.roles import PartyInfo

if TYPE_CHECKING:
    import torch

    from vflo.data.datasets import Task
    from vflo.data.layout import Oracle
    from vflo.nn.train import CheckpointPlan


@dataclass(frozen=True)
class Alignment:
    """The IDs every addressed party holds (in the coordinator's order) and what each party said."""

    ids: np.ndarray
    asked: np.ndarray
    held: dict[str, np.ndarray]
    widths: dict[str, int]

    def holding(self, party: str, ids: np.ndarray) -> np.ndarray:
        """Which of ``ids``, in the caller's order (the alignment asked them sorted), ``party`` holds."""
        return np.isin(ids, self.asked[self.held[party]])

    def selector(self, party: str) -> np.ndarray:
        """A mask over ``party``'s held list that picks the shared IDs, in order."""
        held = self.held[party]
        shared = np.isin(self.asked, self.ids)
        return np.asarray(shared[held], dtype=bool)


class AlignmentSettings(Protocol):
    """How shared IDs are found (:class:`vflo.align.engines.AlignmentConfig`), as a method may read it."""

    @property
    def method(self) -> str: ...

    @property
    def mode(self) -> str: ...

    @property
    def engine(self) -> str: ...


class Pending(Protocol):
    """A round started early (:meth:`Federation.exchange_async`)."""

    def result(self) -> dict[str, Reply]:
        """Each party's reply payload; raises what :meth:`Federation.exchange` would have raised."""
        ...


class Rounds(Protocol):
    """What vflo's own PSI and plain alignment ask of whoever drives them: a name, and rounds of messages. The
    coordinator is one; a party's :class:`~vflo.party.context.NodeContext` asking a peer onward is another (VFL-ASP's
    first hop aligns with the second hop this way)."""

    @property
    def party(self) -> str:
        """The asking party's name."""
        ...

    def exchange(self, kind: str, payloads: Mapping[str, Payload]) -> dict[str, Reply]:
        """One round: send each party its payload, return each reply's payload."""
        ...


class Aligning(Rounds, Protocol):
    """What every alignment engine asks of the coordinating side (:mod:`vflo.align.engines`): who the parties are,
    what carries the messages, what the coordinating party agreed to and keeps, and a link of its own."""

    @property
    def parties(self) -> tuple[PartyInfo, ...]: ...

    @property
    def policy(self) -> Policy:
        """What the coordinating party agreed to (its own config)."""
        ...

    @property
    def transport(self) -> Transport:
        """What carries the messages: its ledger, whether parties reach each other directly, a peer's host."""
        ...

    @property
    def rounds(self) -> int:
        """Rounds run so far."""
        ...

    @property
    def alignments(self) -> AlignmentFolder | None:
        """Where the coordinating party keeps its private set intersections (its own folder), if it does."""
        ...

    def link_tls(self) -> tuple[str, str, str] | None:
        """This party's certificate, key and CA as files, for a link it opens itself (None without TLS)."""
        ...


class Federation(Aligning, Protocol):
    """The coordinating party's side of a run, as methods, alignment and trees see it. Each exchange is one
    communication round; a method never reaches another party's object."""

    # -- who is who ------------------------------------------------------------------------------------------

    @property
    def active(self) -> str:
        """The label holder's name."""
        ...

    def names(self, *roles: str) -> list[str]:
        """Names of the parties with any of ``roles`` (all if none given), the coordinator excluded."""
        ...

    @property
    def task(self) -> Task: ...

    @property
    def n_classes(self) -> int | None: ...

    @property
    def n_outputs(self) -> int:
        """Width of a model's output layer: one per class, or one for regression."""
        ...

    # -- the coordinating party's own ----------------------------------------------------------------------

    @property
    def ctx(self) -> NodeContext:
        """The coordinating party's context for this run (its state, checkpoints)."""
        ...

    @property
    def data(self) -> PartyData:
        """The coordinating party's own training data."""
        ...

    @property
    def serving(self) -> PartyData:
        """The rows the coordinating party holds for scoring."""
        ...

    @property
    def oracle(self) -> Oracle:
        """Pooled features: simulation-only, and only for methods marked ``simulation_only``."""
        ...

    @property
    def privacy(self) -> PrivacyAccount:
        """What the coordinating party has released under differential privacy (its own account)."""
        ...

    @property
    def checkpoint(self) -> CheckpointPlan | None:
        """Where training keeps checkpoints and whether it resumes (the runner's plan), if anywhere."""
        ...

    def rng(self, *purpose: int | str) -> np.random.Generator: ...

    def torch_generator(self, *purpose: int | str) -> torch.Generator: ...

    def shared_rng(self, *purpose: int | str) -> np.random.Generator:
        """Randomness from the public run seed, for choices the messages reveal anyway."""
        ...

    def row_noise(self, *purpose: int | str) -> RowNoise: ...

    # -- alignment -------------------------------------------------------------------------------------------

    @property
    def alignment(self) -> AlignmentSettings: ...

    def align(self, ids: np.ndarray, parties: Sequence[str], *, purpose: str = "train") -> Alignment:
        """The subset of ``ids`` (sorted) that every party in ``parties`` holds, by the configured protocol."""
        ...

    # -- who answers -----------------------------------------------------------------------------------------

    @property
    def whoever_answers(self) -> bool:
        """Scoring with whoever answers: a partner that fails to answer is absent, not an error."""
        ...

    def mark_absent(self, party: str, why: Exception | str, *, session: bool = False) -> None: ...

    def present(self, parties: Sequence[str]) -> list[str]:
        """Those of ``parties`` not absent for the whole session."""
        ...

    # -- rounds ----------------------------------------------------------------------------------------------

    def exchange_async(self, kind: str, payloads: Mapping[str, Payload]) -> Pending:
        """:meth:`exchange`, started now; the replies come from the result's ``result()``."""
        ...

    def exchange_tolerant(
        self, kind: str, payloads: Mapping[str, Payload], *, refusals: frozenset[str] = frozenset()
    ) -> tuple[dict[str, Reply], dict[str, ProtocolError]]:
        """One round in which a party may fail to answer: (replies, failures by party); a party's error whose
        type is among ``refusals`` counts as a failure too."""
        ...

    def post(self, kind: str, payloads: Mapping[str, Payload]) -> None:
        """One round whose replies the coordinator does not wait for."""
        ...

    def flush(self) -> None:
        """Deliver every posted message now."""
        ...

    def request(self, receiver: str, kind: str, payload: Payload) -> Reply: ...

    def broadcast(self, kind: str, payload: Payload, to: Sequence[str]) -> dict[str, Reply]: ...

    def score_together(self, kind: str, ids: np.ndarray, parties: Sequence[str], *,
                       extra: Payload | None = None) -> dict[str, Reply]:
        """Ask every party in ``parties`` for its share of scoring ``ids`` (collaborative inference)."""
        ...
