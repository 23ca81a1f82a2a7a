"""A party's endpoint: its own data, its private state, and a handler per message kind.

A :class:`Node` is built from one party's :class:`~vflo.data.partydata.PartyData`
only. When a ``control.setup`` message names a method, the node asks the method factory
it was handed for an instance built from the config in the message and serves that
method's handlers, beside the protocols it always serves (alignment). Each handler
receives a :class:`NodeContext`: this party's data, state, seeded random streams and a
way to send onward messages, and nothing of any other party.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

import numpy as np

from vflo.comm.ledger import COLUMNS, Ledger
from vflo.comm.message import (
    BOOL,
    INT,
    NAMES,
    SETTINGS,
    STR,
    Fields,
    FieldSpec,
    Message,
    Payload,
    Table,
    check_payload,
)
from vflo.comm.transport import Transport
from vflo.data.partydata import PartyData
from vflo.dp import PrivacyAccount, PrivacyBudget, calibrate
from vflo.errors import PartyBoundaryError, PrivacyBudgetError, ProtocolError, RefusedError, VfloError
from vflo.executor import Executor
from vflo.executor import using as using_executor
from vflo.party.asked import AskedLog, NamedBy
from vflo.party.context import (
    AlignmentFolder,
    CheckpointStoreLike,
    NodeContext,
    PartStoreLike,
    require_checkpoints,
)
from vflo.party.explore import SELECT_KIND
from vflo.party.handlers import HandlerInfo, HandlerSet
from vflo.party.policy import Policy
from vflo.party.rates import PeerRates, Tally
from vflo.roles import ROLES, PartyInfo, Role
from vflo.seeding import PartySecret
from vflo.spill import SpillConfig
from vflo.spill import using as using_spill

logger = logging.getLogger(__name__)

SETUP = "control.setup"
TEARDOWN = "control.teardown"
LEDGER = "control.ledger"
SAVE = "control.save"
LOAD = "control.load"
READY = "control.ready"
CONTROL_KINDS = frozenset({SETUP, TEARDOWN, LEDGER, SAVE, LOAD, READY})
# The key of a party's noised releases, kept in its saved part (its own folder) beside the method's state.
RELEASE_KEY = "node.release_key"


def with_release_key(state: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
    """A party's saved state: the method's, and the key of its noised releases (so scoring later releases a row
    as before)."""
    return {**state, RELEASE_KEY: np.frombuffer(ctx.release_key, np.uint8)}


def take_release_key(state: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
    """The method's part of a saved ``state``; its release key goes back into ``ctx`` (parts saved before release
    keys existed have none: the context keeps the fresh one it drew)."""
    rest = dict(state)
    key = rest.pop(RELEASE_KEY, None)
    if isinstance(key, np.ndarray):
        ctx.release_key = key.astype(np.uint8).tobytes()
    return rest
SETUP_SPEC: dict[str, FieldSpec] = {"method": STR, "config": SETTINGS, "seed": INT, "parties": NAMES, "roles": NAMES,
                                    "save": BOOL}
SAVE_SPEC: dict[str, FieldSpec] = {"label": STR, "model_id": STR}
READY_SPEC: dict[str, FieldSpec] = {"save": BOOL, "checkpoints": BOOL}
LOAD_SPEC: dict[str, FieldSpec] = {"method": STR, "config": SETTINGS, "seed": INT, "parties": NAMES, "roles": NAMES,
                                   "label": STR,
                                   "model_id": STR}
#: What control messages carry and who may send them (the node checks senders itself; this is for the audit).
CONTROL_INFO: dict[str, HandlerInfo] = {
    SETUP: HandlerInfo(SETUP, SETUP_SPEC, senders=("active",), replies={"own": "control"},
                       served="no run going on, or the same coordinator starting again; a new run"),
    LOAD: HandlerInfo(LOAD, LOAD_SPEC, senders=("active",), replies={"manifest": "control"},
                      served="as control.setup, from a saved part of this party's own"),
    SAVE: HandlerInfo(SAVE, SAVE_SPEC, replies={"manifest": "control"},
                      served="after the coordinator's setup, once the method is fitted"),
    TEARDOWN: HandlerInfo(TEARDOWN, {}, replies={"epsilon": "control", "scope": "control"},
                          served="during a run: ends it; where the party released anything under noise, its "
                                 "account's ε (every person, every run it holds) and what that covers"),
    LEDGER: HandlerInfo(LEDGER, {}, replies={f"ledger.{name}": "control" for name in COLUMNS},
                        served="during a run, handed over once"),
    READY: HandlerInfo(READY, READY_SPEC, senders=("active",),
                       served="any time, from an active peer: whether the folders a run will write to exist"),
}


# Builds the method a setup message names from its name and config (a table): the method registry.
class MethodFactory(Protocol):
    """Builds the method a setup names for this party: the coordinator's proposal (its config) with the settings
    this party decides taken from ``own`` (its config's section for that method; vflo.methods.own_settings); and
    those of its settings that differ from the proposal."""

    def __call__(self, name: str, proposal: Mapping[str, Any], *, own: Mapping[str, Any] | None, role: str,
                 party: str) -> tuple[HandlerSet, dict[str, Any]]: ...


def _no_methods(name: str, proposal: Mapping[str, Any], *, own: Mapping[str, Any] | None, role: str,
                party: str) -> tuple[HandlerSet, dict[str, Any]]:
    raise ProtocolError(f"this node serves no methods; it cannot set up {name!r}")



#: The most scoring sessions a party keeps open at once for one coordinator (the current one included).
MAX_SCORING_SESSIONS = 4


@dataclass
class _Session:
    """A scoring session kept aside while another of the same coordinator's is current."""

    method: HandlerSet | None
    handlers: dict[str, tuple[HandlerInfo, str]]
    context: NodeContext | None
    rounds: dict[str, int]
    coordinator: str | None
    last_heard: float
    model: tuple[str, str]

class Node:
    """Serves one party's handlers; knows nothing of other parties but their names and roles.

    ``methods`` builds the method a ``control.setup`` message names (the method registry);
    ``protocols`` are served whatever the method (alignment). Both are handed in by whoever
    builds the node, so this module depends on neither.
    """

    def __init__(
        self, info: PartyInfo, data: PartyData | None = None, serving: PartyData | None = None, *,
        peers: Mapping[str, Role] | None = None, policy: Policy | None = None,
        methods: MethodFactory = _no_methods, protocols: Sequence[HandlerSet] = (), store: PartStoreLike | None = None,
        checkpoints: CheckpointStoreLike | None = None, secret: PartySecret | None = None,
        budget: PrivacyBudget | None = None, settings: Mapping[str, Mapping[str, Any]] | None = None,
        idle_run_seconds: float = 600.0, alignments: AlignmentFolder | None = None,
        privacy_journal: Path | None = None, executor: Executor | None = None, spill: SpillConfig | None = None,
        asked: AskedLog | None = None,
    ) -> None:
        if data is not None and data.party != info.name:
            raise PartyBoundaryError(f"node {info.name!r} was handed data of party {data.party!r}")
        if serving is not None and serving.party != info.name:
            raise PartyBoundaryError(f"node {info.name!r} was handed serving rows of party {serving.party!r}")
        self.info = info
        self._data = data
        self._serving = serving
        self._transport: Transport | None = None
        self.context: NodeContext | None = None
        self.method: HandlerSet | None = None
        self._methods = methods
        self._protocols: dict[str, tuple[HandlerSet, HandlerInfo, str]] = {
            kind: (handler_set, info, attr)
            for handler_set in protocols for kind, (info, attr) in handler_set.handler_table().items()
        }
        self._handlers: dict[str, tuple[HandlerInfo, str]] = {}
        self._handling: str | None = None
        # Where this party saves and loads its model parts and checkpoints: its own folders, never one a peer names.
        self.store = store
        self.checkpoints = checkpoints
        self.alignments = alignments
        # Who its peers are and what they may ask: from this party's own config, never from a message.
        self.peers: dict[str, Role] = dict(peers or {})
        if self.name in self.peers:
            raise PartyBoundaryError(f"party {self.name!r} lists itself among its peers")
        self.policy = policy or Policy()
        # How fast each peer may ask it to score (its policy's max_peer_requests_per_second), and its own record of
        # who asked about which of its people with which model (its config's asked_log; none: not recorded).
        self._rates = PeerRates(self.policy.max_peer_requests_per_second)
        # How often it answered each peer the kinds it answers only so often (vflo explore), for as long as it runs.
        self._tally = Tally()
        self.asked = asked
        # The saved model of the scoring session going on (its label and model ID), for that record.
        self._model = ("", "")
        # The settings of its own side of each method (its config's [methods.NAME]): a proposal cannot change them.
        self.settings: dict[str, Mapping[str, Any]] = dict(settings or {})
        self._coordinator: str | None = None
        # This party's own randomness (its config's seed, or the OS's): masks, projections, noise and the initial
        # weights of models only it holds come from here, never from the run seed every party receives.
        self.secret = secret if secret is not None else PartySecret()
        # What it has released under differential privacy against its own budget: for as long as it runs, or, with
        # a journal in its own folder, across restarts.
        self.privacy = PrivacyAccount(info.name, budget, journal=privacy_journal)
        # The run this party serves (its coordinator's ID for it) and the last round each sender used in it: one
        # run at a time, messages of other runs and rounds that go backwards refused.
        self._run = ""
        self._rounds: dict[str, int] = {}
        # Other scoring sessions of the same coordinator kept open beside the current one (an A/B test of two saved
        # models), by run ID, least recently used first.
        self._parked: dict[str, _Session] = {}
        # Whether the run is a training (setup) or a scoring session (load), and when its coordinator last spoke:
        # a training run silent for longer than ``idle_run_seconds`` counts as abandoned.
        self._run_kind = ""
        self._last_heard = 0.0
        self.idle_run_seconds = idle_run_seconds
        # Where this party's bulk work runs and when its matrices spill to its own files: its own settings, in
        # force while it handles a message (and while it coordinates), whichever other parties share the process.
        self.executor = executor
        self.spill = spill

    @contextlib.contextmanager
    def in_force(self) -> Iterator[None]:
        """This party's executor and spill setting in force for what runs inside (the process's default where it
        has none of its own)."""
        with using_executor(self.executor), using_spill(self.spill):
            yield

    @property
    def name(self) -> str:
        return self.info.name

    def attach(self, transport: Transport) -> None:
        """The transport this node uses for onward messages."""
        self._transport = transport

    def install(self, method: HandlerSet, *, seed: int, parties: tuple[PartyInfo, ...], run: str = "") -> NodeContext:
        """Serve ``method``'s handlers with a fresh private state and, where this party keeps a ledger of its
        own, an empty one: entries an earlier run left (one that failed, or a scoring) are not this run's."""
        if self._transport is not None and not self._transport.shared_ledger:
            stale = self._transport.ledger.drain()
            if stale:
                logger.info("party %s dropped %d ledger entries of an earlier run", self.name, len(stale))
        self.method = method
        self._handlers = method.handler_table()
        self.context = self._new_context(parties, seed=seed, run=run)
        return self.context

    def _new_context(self, parties: tuple[PartyInfo, ...], *, seed: int, run: str = "") -> NodeContext:
        """A fresh context over this party's own data, secret, privacy account and policy."""
        return NodeContext(info=self.info, data=self._data, serving=self._serving, parties=parties, seed=seed,
                           transport=self._transport, checkpoints=self.checkpoints, secret=self.secret,
                           privacy=self.privacy, policy=self.policy, run=run, alignments=self.alignments,
                           tally=self._tally)

    def handle(self, message: Message) -> Message:
        """Run the handler for ``message`` and return the reply; failures become error replies."""
        try:
            if message.receiver != self.name:
                raise ProtocolError(f"message for {message.receiver!r} delivered to {self.name!r}")
            if self._handling is not None:
                # A deployed party serves one message at a time, so a call that comes back to a party
                # still inside a handler would deadlock there; refuse it here, in simulation too.
                raise ProtocolError(
                    f"party {self.name!r} got {message.kind!r} from {message.sender!r} while still handling "
                    f"{self._handling!r}; a handler must not cause a call back to its own party: return the "
                    "data in the reply instead")
            self._handling = message.kind
            try:
                with self.in_force():
                    return message.reply(self._dispatch(message))
            finally:
                self._handling = None
        except VfloError as exc:
            logger.info("party %s: %s failed: %s", self.name, message.kind, exc)
            return message.error_reply(exc)
        except Exception as exc:
            logger.exception("party %s: unexpected error in %s", self.name, message.kind)
            return message.error_reply(exc)

    def _dispatch(self, message: Message) -> Payload:
        kind = message.kind
        if kind == READY:  # before any run: whether this party can do what the coming runs will ask
            self._authorize_control(message)
            check_payload(READY, message.payload, READY_SPEC)
            if message.payload["save"]:
                self._require_store()
            if message.payload["checkpoints"]:
                require_checkpoints(self.name, self.checkpoints)
            return {}
        if kind in (SETUP, LOAD):
            self._authorize_control(message)
            self._start_run(message)
            parked = self._park_for(message)
            try:
                reply = (self._setup if kind == SETUP else self._load)(Fields(kind, message.payload), message.run,
                                                                        message.sender)
            except BaseException:
                if parked:  # the new session did not open: the one it would have sat beside is current again
                    self._resume(parked)
                raise
            self._run, self._rounds, self._run_kind = message.run, {}, kind
            self._coordinator, self._last_heard = message.sender, time.monotonic()
            self._model = (str(message.payload["label"]), str(message.payload["model_id"])) if kind == LOAD \
                else ("", "")
            return reply
        if message.run and message.run != self._run and message.run in self._parked:
            self._resume(message.run)  # a message of another scoring session this party keeps open
        self._check_run(message)
        if kind in CONTROL_KINDS:
            self._authorize_control(message)
            if kind == SAVE:
                return self._save(Fields(kind, message.payload))
            if kind == TEARDOWN:
                if self._run:  # a teardown with no run going on ends nothing
                    logger.info("party %s: run %s of %s ended (teardown)", self.name, self._run,
                                getattr(self.method, "name", "?"))
                account = self._account(self.method)
                self.context, self.method, self._handlers, self._coordinator = None, None, {}, None
                self._run, self._rounds, self._run_kind, self._model = "", {}, "", ("", "")
                return account
            return self._ledger_columns()
        if kind in self._protocols:
            # Protocols every node serves (alignment) work before any method is set up: a deployment checks
            # the rows to score before anything trains.
            handler_set, info, attr = self._protocols[kind]
            self._authorize(message, info)
            if kind == SELECT_KIND and self._run:
                raise ProtocolError(f"party {self.name!r} drops columns only between runs, not during run "
                                    f"{self._run} of {getattr(self.method, 'name', '?')}")
            if self.context is None:
                self.context = self._new_context((self.info,), seed=0)
        elif self.context is None or self.method is None:
            raise ProtocolError(f"party {self.name!r} got {kind!r} before any method was set up")
        elif kind in self._handlers:
            handler_set = self.method
            info, attr = self._handlers[kind]
            self._authorize(message, info)
        else:
            name = getattr(self.method, "name", type(self.method).__name__)
            raise ProtocolError(f"party {self.name!r} running {name} has no handler for {kind!r}")
        check_payload(kind, message.payload, info.accepts)
        self._check_sizes(message)
        scoring = self._run_kind == LOAD
        if scoring:
            self._scoring_request(message, info, by_id=handler_set is self.method)
        self.context.handling(message)
        result: Payload = getattr(handler_set, attr)(self.context, Fields(kind, message.payload))
        if scoring and self.context.named is not None:
            self._record_asked(message, "positions", self.context.named)
        if kind == SELECT_KIND:
            # Its own selection changes its own rows, which outlive the handler's context: the node drops them.
            self._drop_columns([str(c) for c in np.asarray(result["dropped"])], message.sender)
        return result

    def _drop_columns(self, dropped: list[str], asker: str) -> None:
        """The columns this party's own policy selected out (vflo explore --select), gone from its training and
        serving rows and from the parts it saves from now on; the next message builds a context over the rest."""
        if not dropped:
            return
        if self._data is not None:
            self._data = self._data.without(dropped)
        if self._serving is not None:
            self._serving = self._serving.without([c for c in dropped if c in self._serving.columns])
        if self.store is not None:
            self.store.drop_columns(dropped)
        self.context = None
        logger.warning("party %s dropped its columns %s by its own policy (select_iv_below %g, select_missing_above "
                       "%g) from what %s's explore found; to keep them out after a restart, add them to drop_columns "
                       "under [data] in its config", self.name, dropped, self.policy.select_iv_below,
                       self.policy.select_missing_above, asker)

    # -- scoring: how fast a peer asks, and about whom ------------------------------------------------

    def _scoring_request(self, message: Message, info: HandlerInfo, *, by_id: bool) -> None:
        """A message of a scoring session: one of the method's that names people by ID (a scoring request) takes
        a token of its sender's rate and is recorded with those people, or is refused (and recorded so) over the
        rate; a protocol's that names people (a kept intersection's reuse, which comes first in a batch) is refused
        while a scoring request would be, so that the batch leaves this party out rather than failing on it."""
        fields = info.request_fields("ids") if by_id else []
        if not fields:
            if info.request_fields("ids", "membership") and not self._rates.ready(message.sender):
                raise self._refuse(message, self._over_rate())
            return
        ids = np.concatenate([np.asarray(message.payload[f]).ravel() for f in fields])
        if not self._rates.take(message.sender):
            self._record_asked(message, "ids", ids, refused="policy.max_peer_requests_per_second")
            raise self._refuse(message, self._over_rate())
        self._record_asked(message, "ids", ids)

    def _over_rate(self) -> str:
        rate = self.policy.max_peer_requests_per_second
        return (f"it comes over the rate of scoring requests this party answers a peer, {rate:g} a second ([policy] "
                f"max_peer_requests_per_second = {rate:g} in its config); ask again later, or raise it there")

    def _record_asked(self, message: Message, named_by: NamedBy, ids: np.ndarray, refused: str = "") -> None:
        """Who asked about which of this party's people, written before the answer leaves (where it keeps the
        record)."""
        if self.asked is None or not len(ids):
            return
        label, model_id = self._model
        self.asked.asked(peer=message.sender, run=message.run, model=label, model_id=model_id, kind=message.kind,
                         named_by=named_by, ids=ids, refused=refused)

    def _check_sizes(self, message: Message) -> None:
        """No request may hold more rows than this party's policy allows (IDs, positions, rows of a block)."""
        bound = self.policy.max_rows
        for field, value in message.payload.items():
            if isinstance(value, np.ndarray) and value.ndim:
                rows = int(value.shape[0]) * (int(value.shape[1]) if value.ndim == 3 else 1)
                if rows > bound:
                    raise self._refuse(message, f"its {field!r} holds {rows} rows, more than this party's policy "
                                                f"allows in one request ([policy] max_rows = {bound}); raise it "
                                                "there for larger data")

    # -- scoring sessions side by side ----------------------------------------------------------------

    def _park_for(self, message: Message) -> str:
        """Before a scoring session opens beside another of the same coordinator's (an A/B test of two saved
        models), the current one is kept aside (its run ID returned), at most ``MAX_SCORING_SESSIONS`` in all, the
        least recently used going first. A training setup ends every scoring session kept aside."""
        if message.kind == SETUP:
            if self._parked:
                logger.info("party %s: a training run ends the scoring sessions it kept open (%s)", self.name,
                            ", ".join(self._parked))
            self._parked.clear()
            return ""
        if self._run_kind != LOAD or not self._run or self._run == message.run:
            return ""
        parked = self._run
        self._keep_aside()
        while len(self._parked) >= MAX_SCORING_SESSIONS:
            gone = next(iter(self._parked))
            del self._parked[gone]
            logger.info("party %s: scoring session %s closed: %d sessions are open beside the new one, the most it "
                        "keeps", self.name, gone, MAX_SCORING_SESSIONS - 1)
        self.context, self.method, self._handlers, self._run, self._run_kind = None, None, {}, "", ""
        return parked

    def _resume(self, run: str) -> None:
        """Make the scoring session ``run`` kept aside current, keeping the current one aside in its place."""
        session = self._parked.pop(run)
        if self._run_kind == LOAD and self._run:
            self._keep_aside()
        self.method, self._handlers, self.context = session.method, session.handlers, session.context
        self._rounds, self._coordinator, self._last_heard = session.rounds, session.coordinator, session.last_heard
        self._model, self._run, self._run_kind = session.model, run, LOAD

    def _keep_aside(self) -> None:
        """The current scoring session among those kept aside, as the most recently used."""
        self._parked[self._run] = _Session(
            method=self.method, handlers=self._handlers, context=self.context, rounds=self._rounds,
            coordinator=self._coordinator, last_heard=self._last_heard, model=self._model)

    # -- one run at a time --------------------------------------------------------------------------

    def _start_run(self, message: Message) -> None:
        """A setup (or load) starts a run: refused while another coordinator's run is going on."""
        if not message.run:
            raise self._refuse(message, "a setup must carry the ID of the run it starts")
        others = {s.coordinator for s in self._parked.values()} - {message.sender}
        if others:
            raise self._refuse(message, f"this party keeps scoring sessions of {sorted(map(str, others))} open; it "
                                        "takes another coordinator's setup only after they end")
        if self._run and self._coordinator is not None and message.sender != self._coordinator:
            raise self._refuse(message, f"this party is serving a run of {self._coordinator!r}; it takes another "
                                        "coordinator's setup only after that run ends")
        idle = time.monotonic() - self._last_heard
        if message.kind == LOAD and self._run_kind == SETUP and idle < self.idle_run_seconds:
            # A scoring session would replace the training run in the middle (one run at a time): say so.
            raise self._refuse(message, f"this party is training with {self._coordinator!r} (run {self._run}, last "
                                        f"message {idle:.0f} s ago); it scores after that run ends: wait for `vflo "
                                        "run` to finish, then score (a run silent for "
                                        f"{self.idle_run_seconds:.0f} s counts as abandoned)")

    def _check_run(self, message: Message) -> None:
        """Messages of the run being served, in rounds that never go backwards; with no run going on, only what
        comes before one (alignment checks, which carry no run)."""
        if not self._run:
            if message.run:
                raise self._refuse(message, f"it belongs to run {message.run!r}, and this party serves no run now")
            return
        if message.run != self._run:
            if not message.run and message.sender == self._coordinator and message.kind in self._protocols:
                return  # the same coordinator checking rows before its next run (which will replace this one)
            raise self._refuse(message, f"it belongs to run {message.run or '(none)'!r}, not to the run this party "
                                        "serves")
        if message.sender == self._coordinator:
            self._last_heard = time.monotonic()
        last = self._rounds.get(message.sender, 0)
        if message.round < last:
            raise self._refuse(message, f"its round {message.round} comes after round {last} from the same sender")
        self._rounds[message.sender] = message.round

    # -- who may ask what ---------------------------------------------------------------------------

    def _refuse(self, message: Message, why: str) -> RefusedError:
        role = self.peers.get(message.sender)
        text = (f"party {self.name!r} refuses {message.kind!r} from {message.sender!r} "
                f"({'not a peer' if role is None else 'role ' + role}): {why}")
        logger.warning("%s", text)
        return RefusedError(text)

    def _is_coordinator(self, sender: str) -> bool:
        """The party that set up the running method; before any setup, a peer this party knows as active."""
        if self._coordinator is not None:
            return sender == self._coordinator
        return self.peers.get(sender) == "active"

    def _authorize_control(self, message: Message) -> None:
        role = self.peers.get(message.sender)
        if role is None:
            raise self._refuse(message, "it is not one of this party's peers")
        if message.kind in (SETUP, LOAD, READY):
            if role != "active":
                raise self._refuse(message, "only the active party may set up a method; if it coordinates, give it "
                                            "role = 'active' under [peers] in this party's config")
        elif not self._is_coordinator(message.sender):
            raise self._refuse(message, f"only {self._coordinator or 'the active party'}, which set up the running "
                                        "method, may do that")

    def _authorize(self, message: Message, info: HandlerInfo) -> None:
        sender = message.sender
        role = self.peers.get(sender)
        if role is None:
            raise self._refuse(message, "it is not one of this party's peers")
        allowed = info.senders
        if "coordinator" in allowed and self._is_coordinator(sender):
            return
        # A delegate must be a data party in this party's own config: a setup that names the server or the dealer
        # as VFL-ASP's first hop cannot make it one.
        if ("delegate" in allowed and self.method is not None and sender in self.method.delegates()
                and role == "passive"):
            return
        if role in allowed:
            return
        raise self._refuse(message, f"only {' or '.join(allowed)} may send it")

    def _ledger_columns(self) -> Payload:
        """This party's own record of the messages it sent, handed over once (multi-process runs only)."""
        if self._transport is None or self._transport.shared_ledger:
            return Ledger.to_columns([])
        return Ledger.to_columns(self._transport.ledger.drain())

    def _require_store(self) -> PartStoreLike:
        if self.store is None:
            raise ProtocolError(f"party {self.name!r} has no folder for model parts: start it with --save DIR (or "
                                "models = 'DIR' in its config)")
        return self.store

    def _save(self, payload: Fields) -> Payload:
        """Write this party's own part of the fitted method into its own folder."""
        check_payload(SAVE, payload, SAVE_SPEC)
        if self.context is None or self.method is None:
            raise ProtocolError(f"party {self.name!r} was asked to save a model before any method was set up")
        method: Any = self.method
        state = with_release_key(method.party_state(self.context), self.context)
        sha = self._require_store().save(label=payload.text("label"), method=method.name, config=method.config_json(),
                                         model_id=payload.text("model_id"), state=state)
        logger.info("party %s saved its part of %s (model %s) beside its other trainings", self.name,
                    payload["label"], payload["model_id"])
        return {"manifest": sha}

    def _load(self, payload: Fields, run: str, sender: str) -> Payload:
        """Set the method up from this party's saved part, ready to score (its training data is not needed)."""
        check_payload(LOAD, payload, LOAD_SPEC)
        self.policy.check_serving(self.name, payload.text("label"), payload.text("model_id"))
        part = self._require_store().load(label=payload.text("label"), model_id=payload.text("model_id"))
        name = payload.text("method")
        if part.manifest.get("method") != name:
            raise ProtocolError(f"party {self.name!r}'s saved part is {part.manifest.get('method')}, not the "
                                f"coordinator's {name}: the two come from different models")
        # Its own side as it trained it (the saved part's settings), the rest as the coordinator's model card says.
        saved_config = part.manifest.get("config")
        method: Any
        method, _ = self._methods(name, payload.table("config"), own=saved_config if isinstance(saved_config, dict)
                                  else None, role=self.info.role, party=self.name)
        if json.loads(method.config_json()) != saved_config:
            raise ProtocolError(f"party {self.name!r}'s saved part is {name} with another configuration than the "
                                f"coordinator's: the two come from different models")
        self.policy.check(self.name, name, method.config_json())
        serving = self._require_store().serving_rows(part)
        if serving is not None:
            self._serving = serving
        self.install(method, seed=payload.integer("seed"), parties=self._checked_parties(payload), run=run)
        assert self.context is not None
        method.load_party_state(self.context, take_release_key(part.state, self.context))
        logger.info("party %s: %s opened a scoring session (run %s) with its part of %s (model %s)", self.name,
                    sender, run, payload["label"], payload["model_id"])
        return {"manifest": part.manifest_sha256}

    def _setup(self, payload: Fields, run: str, sender: str) -> Payload:
        """Install the method the coordinator proposes, with this party's own settings for its own side; reply
        with those that differ from the proposal (a table), so the coordinator records what ran."""
        check_payload(SETUP, payload, SETUP_SPEC)
        parties = self._checked_parties(payload)
        name = payload.text("method")
        method: Any
        method, differs = self._methods(name, payload.table("config"), own=self.settings.get(name),
                                        role=self.info.role, party=self.name)
        self.policy.check(self.name, name, method.config_json())
        if payload.flag("save"):
            self._require_store()
        method, calibrated = self._protected(name, method)
        differs |= calibrated
        plan = method.planned_privacy(self.info.role, party=self.name)
        if plan is not None and self._data is not None:  # the whole run's spending: refused before it is installed
            self.privacy.check_plan(self._data.ids, plan, what=name)
        self.install(method, seed=payload.integer("seed"), parties=parties, run=run)
        own = (f"; its own settings where they differ from the proposal: {json.dumps(differs, sort_keys=True)}"
               if differs else "")
        logger.info("party %s: %s set up %s (run %s%s)%s; within its policy (%s)", self.name, sender, name, run,
                    ", saving its part" if payload.flag("save") else "", own, self.policy.describe())
        logger.debug("party %s runs %s as %s", self.name, name, method.config_json())
        return {"own": Table(differs)}

    def _protected(self, name: str, method: Any) -> tuple[Any, dict[str, Any]]:
        """``method`` as this party runs it when its budget protects everything it sends: as its settings give it
        where they noise what it sends (the plan is checked against the budget next), else with noise calibrated to
        the budget (and the settings that gives, for the setup's reply); refused where its side cannot be protected
        or even the most noise would pass the budget."""
        budget, data, role = self.privacy.budget, self._data, self.info.role
        if budget is None or not budget.protect or data is None or \
                method.planned_privacy(role, party=self.name) is not None:
            return method, {}
        if not method.handler_table():  # it serves no message here: nothing derived from its rows leaves
            return method, {}
        ids, rows = data.ids, data.n_samples
        first = method.protected(role, 1.0, rows=rows, party=self.name)
        if first is None:
            raise PrivacyBudgetError(
                f"party {self.name!r} covers everything it sends with its budget ([privacy] epsilon = "
                f"{budget.epsilon:g}, protect = true), and {name}'s {role} side {method.unprotectable(role)}; it "
                "refuses the run. Run a method that can protect this side, or set [privacy] protect = false in its "
                "config to bound only what a method noises anyway")
        if not first[1].spends:
            return first[0], {}  # this side sends nothing derived from its rows

        def fits(scale: float) -> bool:
            option = method.protected(role, scale, rows=rows, party=self.name)
            return option is not None and self.privacy.plan(ids, option[1]) <= budget.epsilon

        scale = calibrate(fits)
        if scale is None:
            raise PrivacyBudgetError(
                f"party {self.name!r} refuses {name} at setup: even with the most noise it calibrates to, the run "
                f"would pass its budget ε = {budget.epsilon:g} at δ = {budget.delta:g} ({self.privacy.epsilon():.3g} "
                "spent before it, [privacy] in its own config); raise the budget or train fewer epochs")
        chosen, plan = method.protected(role, scale, rows=rows, party=self.name)
        before, after = json.loads(method.config_json()), json.loads(chosen.config_json())
        calibrated = {k: v for k, v in after.items() if before.get(k) != v}
        logger.info("party %s calibrated %s to its budget ε = %g: %s (%s)", self.name, name, budget.epsilon,
                    plan.what, json.dumps(calibrated, sort_keys=True))
        return chosen, calibrated

    def _account(self, method: HandlerSet | None) -> Payload:
        """What the run's end tells the coordinator of this party's privacy account, where it released anything
        under noise: the largest ε of any of its people (all runs its account holds) and what it covers."""
        if not self.privacy.releases:
            return {}
        scope = method.account_scope(self.info.role) if method is not None else ""
        return {"epsilon": float(self.privacy.epsilon()), "scope": scope}

    def _checked_parties(self, payload: Fields) -> tuple[PartyInfo, ...]:
        """The coordinator's list of parties, where it agrees with what this party's own config says of them."""
        parties = _parties(payload)
        for p in parties:
            known = self.info.role if p.name == self.name else self.peers.get(p.name)
            if known is not None and known != p.role:
                raise ProtocolError(f"party {self.name!r} knows {p.name!r} as {known}, but the coordinator lists it "
                                    f"as {p.role}: refused; the configs disagree about who plays which role")
        return parties


def parties_payload(parties: Sequence[PartyInfo]) -> Payload:
    """The run's parties as a control message carries them: their names and their roles, in order."""
    return {"parties": np.asarray([p.name for p in parties], dtype=np.str_),
            "roles": np.asarray([p.role for p in parties], dtype=np.str_)}


def _parties(payload: Fields) -> tuple[PartyInfo, ...]:
    names, roles = payload.names("parties"), payload.names("roles")
    if len(names) != len(roles) or len(set(names)) != len(names) or not set(roles) <= set(ROLES):
        raise ProtocolError(f"a control message lists parties {names} with roles {roles}: each party once, with one "
                            f"of the roles {list(ROLES)}; refused")
    return tuple(PartyInfo(n, cast(Role, r)) for n, r in zip(names, roles, strict=True))
