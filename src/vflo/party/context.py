"""What a handler may touch: its own party's data and state, its seeded random streams and an outbox.

A :class:`NodeContext` is made by the party's :class:`~vflo.party.node.Node` for each run; every handler of a
method or a protocol receives it, and the coordinating party's methods reach it through the
:class:`~vflo.party.port.Federation`. The folders a party keeps (model parts, checkpoints, kept alignments) are
named here by what the context needs of them; the packages that write them own their types.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

import numpy as np

from vflo.comm.message import Message, Payload, Reply
from vflo.comm.transport import Transport
from vflo.data.partydata import PartyData
from vflo.dp import PrivacyAccount, RowNoise
from vflo.errors import PartyBoundaryError, ProtocolError
from vflo.party.policy import Policy
from vflo.party.rates import Tally
from vflo.roles import PartyInfo
from vflo.seeding import PartySecret, numpy_rng

if TYPE_CHECKING:
    import torch

P = TypeVar("P")


class SavedPart(Protocol):
    """A party's saved part as its store hands it back: the state, and the checksum of its manifest."""

    @property
    def state(self) -> dict[str, Any]: ...

    @property
    def manifest_sha256(self) -> str: ...

    @property
    def manifest(self) -> Mapping[str, Any]: ...


class CheckpointStoreLike(Protocol):
    """Where a party keeps its training checkpoints: a folder of its own (vflo.artifacts.CheckpointStore)."""

    def save(self, run: str, epoch: int, state: Mapping[str, Any]) -> None: ...

    def load(self, run: str, epoch: int) -> dict[str, Any]: ...

    def epochs(self, run: str) -> list[int]: ...


class PartStoreLike(Protocol):
    """Where a party keeps its model parts: a folder of its own, chosen by its own config (vflo.artifacts)."""

    def save(self, *, label: str, method: str, config: str, model_id: str, state: Mapping[str, Any]) -> str: ...

    def load(self, *, label: str, model_id: str | None) -> SavedPart: ...

    def serving_rows(self, part: Any) -> PartyData | None:
        """The party's rows to score, prepared as ``part`` was trained (None: keep the node's own)."""
        ...

    def drop_columns(self, columns: Sequence[str]) -> None:
        """Parts saved from now on read their rows without ``columns`` (the party's own selection)."""
        ...

class AlignmentFolder(Protocol):
    """Where a party keeps its private set intersections: :class:`vflo.align.kept.AlignmentStore`, whose type
    alignment owns (a context only carries it; :func:`vflo.align.kept.store_of` hands it back typed)."""

    @property
    def folder(self) -> Path: ...


def require_checkpoints(party: str, store: CheckpointStoreLike | None) -> CheckpointStoreLike:
    """``party``'s checkpoint folder, or the error that says how to give it one."""
    if store is None:
        raise ProtocolError(f"party {party!r} has no checkpoint folder: start it with --checkpoints DIR (or "
                            "checkpoints = 'DIR' in its config)")
    return store


class NodeContext:
    """What a handler may touch: its own party's data and state, and an outbox."""

    __slots__ = ("_current_round", "_parts", "_secret", "_transport", "alignments", "checkpoints", "data", "info",
                 "named", "parties", "policy", "privacy", "release_key", "run", "seed", "sender", "serving", "tally")

    def __init__(
        self, *, info: PartyInfo, data: PartyData | None, serving: PartyData | None,
        parties: tuple[PartyInfo, ...], seed: int, transport: Transport | None,
        checkpoints: CheckpointStoreLike | None = None, secret: PartySecret | None = None,
        privacy: PrivacyAccount | None = None, policy: Policy | None = None, run: str = "",
        alignments: AlignmentFolder | None = None, tally: Tally | None = None,
    ) -> None:
        self.info = info
        # Where this party keeps its private set intersections (its own folder), to reuse them: vflo.align.kept.
        self.alignments = alignments
        # The run this context serves (the coordinator's ID for it); onward messages carry it.
        self.run = run
        self.data = data
        self.serving = serving
        self.parties = parties
        # The run seed: public (every party gets it at setup), so it only salts this party's own streams.
        self.seed = seed
        self._secret = secret if secret is not None else PartySecret()
        # Keys the noise on every row this party releases in this model (see row_noise); saved with its part, so
        # scoring with the saved model later releases a row exactly as before.
        self.release_key = self._secret.key(seed, info.name, "release-key")
        # Every differentially private release this party makes, against its own budget (vflo.dp).
        self.privacy = privacy if privacy is not None else PrivacyAccount(info.name)
        # What this party agreed to (its own config): bounds handlers check, such as the masks it accepts.
        self.policy = policy if policy is not None else Policy()
        # How often it has answered each peer the kinds it answers only so often: the node's, across runs.
        self.tally = tally if tally is not None else Tally()
        # This party's own state, one typed object per kind (a method's part, its alignment): see part().
        self._parts: dict[type, Any] = {}
        # Who sent the message being handled (set by the node for each message).
        self.sender = ""
        # The people of this party the message being handled named by their places among rows the sender and this
        # party share (a kept intersection's reuse), as this party's own IDs: set by the handler that maps them,
        # read by the node for its record of who asked about whom (vflo.party.asked).
        self.named: np.ndarray | None = None
        self._transport = transport
        self._current_round = 0
        # This party's own checkpoint folder (from its own config), where training can pause and resume.
        self.checkpoints = checkpoints

    def handling(self, message: Message) -> None:
        """The message being handled: who sent it (``sender``), and the round onward messages are sent in."""
        self.sender = message.sender
        self._current_round = message.round
        self.named = None

    def part(self, kind: type[P]) -> P:
        """This party's own state of ``kind`` (a class whose attributes hold it), made empty on first use."""
        found = self._parts.get(kind)
        if found is None:
            found = self._parts[kind] = kind()
        return cast(P, found)

    def require_checkpoints(self) -> CheckpointStoreLike:
        return require_checkpoints(self.party, self.checkpoints)

    @property
    def party(self) -> str:
        return self.info.name

    def require_data(self) -> PartyData:
        if self.data is None:
            raise PartyBoundaryError(f"party {self.party!r} ({self.info.role}) holds no data for this step")
        return self.data

    def rows(self, purpose: str) -> PartyData:
        """This party's training rows (``"train"``) or the rows it holds for scoring (``"serve"``)."""
        if purpose == "train":
            return self.require_data()
        if purpose == "serve":
            if self.serving is None:
                raise PartyBoundaryError(f"party {self.party!r} holds no rows to score")
            return self.serving
        raise ProtocolError(f"unknown purpose of rows {purpose!r}; expected 'train' or 'serve'")

    def peer_host(self, party: str) -> str:
        """The host this party's own config gives for ``party`` (loopback in one process)."""
        return self._transport.peer_host(party) if self._transport is not None else "127.0.0.1"

    def link_tls(self) -> tuple[str, str, str] | None:
        """This party's certificate, key and CA as files, for a link it opens itself (None without TLS)."""
        return self._transport.link_files() if self._transport is not None else None

    def rng(self, *purpose: int | str) -> np.random.Generator:
        """A numpy generator for this party and purpose from the party's own secret (salted by the run seed):
        no other party can recompute it, whatever it was sent."""
        return self._secret.rng(self.seed, self.party, *purpose)

    def shared_rng(self, *purpose: int | str) -> np.random.Generator:
        """Randomness any party may recompute (from the public run seed): only for choices the messages reveal
        anyway, such as a batch order or a validation split whose rows are named to the other parties, so that a
        restarted party resumes with the same choices."""
        return numpy_rng(self.seed, self.party, *purpose)

    def torch_generator(self, *purpose: int | str) -> torch.Generator:
        """A torch generator from the party's own secret, as :meth:`rng` (e.g. its own model's initial weights)."""
        return self._secret.torch_generator(self.seed, self.party, *purpose)

    def row_noise(self, *purpose: int | str) -> RowNoise:
        """Noise for rows this party releases, keyed by its own secret key for this model: the same row released
        again, in this run or later with the saved model, is the same release (nothing to average)."""
        name = "\x1f".join(str(p) for p in purpose).encode("utf-8")
        return RowNoise(hashlib.blake2b(name, key=self.release_key, digest_size=32).digest())

    def send(self, receiver: str, kind: str, payload: Payload) -> Reply:
        """Send an onward request in the current round and return the reply's payload."""
        if self._transport is None:
            raise ProtocolError(f"party {self.party!r} has no transport to reach {receiver!r}")
        message = Message(sender=self.party, receiver=receiver, kind=kind, round=self._current_round, payload=payload,
                          run=self.run)
        return self._transport.request(message).unwrap()

    def exchange(self, kind: str, payloads: Mapping[str, Payload]) -> dict[str, Reply]:
        """Onward requests of one kind to several parties, in the current round; each reply's payload."""
        return {receiver: self.send(receiver, kind, payload) for receiver, payload in payloads.items()}
