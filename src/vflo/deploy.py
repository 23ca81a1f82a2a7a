"""Running a federation for real: each party its own process (or host), talking gRPC with mutual TLS.

Two files describe a deployment.

``PARTY.toml``, one per party, read by ``vflo party serve``: the party's name and role, the address
it listens on, its data file (never sent anywhere), its TLS folder and its peers (the parties it
accepts messages from and may send to).

``DEPLOY.toml``, read by ``vflo run EXPERIMENT.toml --deploy DEPLOY.toml`` at the active party,
which coordinates: the active party's own settings (the same fields as a PARTY.toml, plus an
optional labelled test file) and the address of every other party.

The same files serve a federation over Flower (vflo.flower): there the addresses are not used, and the
coordinator reaches the others through a ``link`` instead of its own gRPC clients.
"""

from __future__ import annotations

import logging
import signal
import threading
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from vflo import schema
from vflo.artifacts import CheckpointStore, ModelCard, Part, PartStore, Preprocessing, new_model_id
from vflo.comm.codec import DEFAULT_MAX_BYTES
from vflo.comm.departures import DepartureLog
from vflo.comm.grpc_transport import DEFAULT_DEADLINE, GrpcTransport, PartyServer
from vflo.comm.ledger import Ledger
from vflo.comm.message import Message
from vflo.comm.tls import PartyCredentials
from vflo.comm.transport import Transport
from vflo.data.datasets import Dataset, infer_task
from vflo.data.files import TableEncoding, read_table
from vflo.data.partydata import PartyData
from vflo.data.preprocessing import Standardizer
from vflo.dp import PrivacyBudget
from vflo.errors import (
    AddressInUseError,
    AlignmentError,
    ConfigError,
    DataError,
    MethodError,
    RemoteError,
    TransportError,
)
from vflo.federation.coordinator import AlignmentConfig, Federation
from vflo.federation.node import READY, Node
from vflo.federation.policy import Policy
from vflo.federation.session import RunOutput, Session
from vflo.federation.simulation import party_node
from vflo.methods.base import Method
from vflo.nn.train import CheckpointPlan
from vflo.roles import PartyInfo, Role, check_party_name
from vflo.scoring import Missing, SavedModel, combine
from vflo.seeding import PartySecret

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """A party's table: training rows in ``file``; rows to score in ``serve_file``. A party that only scores
    with a saved model needs no ``file``: its ``serve_file`` is read with the saved part's encoding.

    ``feature_columns`` / ``drop_columns`` choose the features, ``categorical`` columns are one-hot encoded
    here, at the owner, with the categories of the training file; ``task`` (active party only) says what the
    labels are when the guess from their values is wrong. ``standardize``: per column, fitted on ``file``."""

    file: str | None = None
    id_column: str
    label_column: str | None = None
    serve_file: str | None = None
    feature_columns: tuple[str, ...] | None = None
    drop_columns: tuple[str, ...] = ()
    categorical: tuple[str, ...] = ()
    task: Literal["binary", "multiclass", "regression"] | None = None
    standardize: bool = True
    # Missing values, filled here at the owner from its training rows (and the same way in rows scored later):
    # "mean", "median", "most_frequent" or a number; left out, a file with gaps is refused, naming the column.
    impute: Literal["mean", "median", "most_frequent"] | float | None = None
    missing_indicator: bool = False

    def __post_init__(self) -> None:
        if self.file is None and self.serve_file is None:
            raise ConfigError("[data] needs file (training rows), serve_file (rows to score), or both")


@dataclass(frozen=True, kw_only=True)
class TLSConfig:
    """``dir`` holds ca.pem and NAME.pem / NAME.key (the party's own folder from ``vflo certs init --split``, or
    the folder of ``vflo certs init``); ``insecure`` turns TLS off."""

    dir: str | None = None
    insecure: bool = False


@dataclass(frozen=True, kw_only=True)
class PeerEntry:
    """A peer under ``[peers]``: where to reach it and the role this party knows it by."""

    # Where the peer listens for vflo's gRPC; not needed over Flower (the SuperLink routes every message).
    address: str = ""
    role: Role = "passive"


@dataclass(frozen=True, kw_only=True)
class PartyConfig:
    name: str
    role: Role = "passive"
    listen: str = "127.0.0.1:0"
    data: DataConfig | None = None
    tls: TLSConfig = field(default_factory=TLSConfig)
    # NAME = "HOST:PORT" (a passive party), or NAME = { address = "HOST:PORT", role = "active" | "server" | ... }:
    # the role decides what that peer may ask of this party.
    peers: dict[str, str | PeerEntry] = field(default_factory=dict)
    # What this party agrees to run (see vflo.federation.policy).
    policy: Policy = field(default_factory=Policy)
    deadline: float = DEFAULT_DEADLINE
    max_message_bytes: int = DEFAULT_MAX_BYTES
    # Where this party writes its parts of trained models (after `run --save`) and reads them (to score).
    models: str | None = None
    # Where this party keeps its own training checkpoints, so a run can resume after any party stopped.
    checkpoints: str | None = None
    # This party's own randomness: its masks, projections, noise and private weights. Left out, 128 bits of the
    # operating system's; a seed here (kept as secret as a key) makes the party's runs reproducible. Never sent.
    seed: int | None = field(default=None, repr=False)
    # What this party lets out of each person's privacy over all its noised releases ([privacy] epsilon, delta).
    privacy: PrivacyBudget | None = None
    # Its own record of every message that left it (JSON lines, appended; `vflo party audit FILE` sums it). A
    # PARTY.toml without the key keeps NAME_audit.jsonl beside the config; "" keeps none.
    audit_log: str | None = None
    # Its own side of each method ([methods.NAME]: its bottom network, encoder, learning rate, ...): whatever a
    # coordinator proposes, these (else the method's defaults) run here (vflo.methods.own_settings).
    methods: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in (self.name, *self.peers):
            check_party_name(name)
        if self.methods:
            from vflo.methods.own_settings import check_section
            from vflo.methods.registry import get_method

            for method, section in self.methods.items():
                check_section(get_method(method), self.role, section, where=f"methods.{method}")
        if self.role in ("active", "passive") and self.data is None:
            raise ConfigError(f"party {self.name!r} ({self.role}) needs a [data] table with its file and ID column")
        if self.name in self.peers:
            raise ConfigError(f"party {self.name!r} lists itself among its peers; two parties share that name")
        if self.role != "active" and self.peers and "active" not in self.peer_roles.values():
            raise ConfigError(f"party {self.name!r}: no peer has role 'active', so no one may set up a method here; "
                              "write the coordinating party as NAME = { address = \"HOST:PORT\", role = \"active\" } "
                              "under [peers]")

    def check_grpc(self) -> None:
        """What vflo's own gRPC needs beyond the party itself (Flower needs neither): TLS and peer addresses."""
        if not self.tls.insecure and not self.tls.dir:
            raise ConfigError(f"party {self.name!r}: give [tls] dir (from `vflo certs init`) or insecure = true")
        missing = [n for n, a in self.addresses.items() if not a]
        if missing:
            raise ConfigError(f"party {self.name!r}: give the address of {missing} (NAME = {{ address = \"HOST:PORT\", "
                              "role = ... }} under [peers], or address = ... under [[parties]]): vflo's gRPC dials it")

    @property
    def addresses(self) -> dict[str, str]:
        return {n: p if isinstance(p, str) else p.address for n, p in self.peers.items()}

    def departures(self) -> DepartureLog | None:
        """Its record of what left it, where its config keeps one."""
        return DepartureLog(Path(self.audit_log), self.name) if self.audit_log else None

    @property
    def peer_roles(self) -> dict[str, Role]:
        return {n: "passive" if isinstance(p, str) else p.role for n, p in self.peers.items()}


@dataclass(frozen=True, kw_only=True)
class PeerConfig:
    name: str
    address: str = ""  # not needed over Flower
    role: Role = "passive"  # as under a party's [peers]: a party named without a role is a passive one


@dataclass(frozen=True, kw_only=True)
class DeployConfig:
    """The active party (it coordinates) and where every other party listens."""

    active: PartyConfig
    parties: tuple[PeerConfig, ...]
    test_file: str | None = None
    task: Literal["binary", "multiclass", "regression"] | None = None
    n_classes: int | None = None

    def __post_init__(self) -> None:
        names = [self.active.name, *(p.name for p in self.parties)]
        if len(set(names)) != len(names):
            dupes = sorted({n for n in names if names.count(n) > 1})
            raise ConfigError(f"two parties share the name {dupes}; every party needs its own name")
        if self.active.role != "active":
            raise ConfigError(f"the coordinating party {self.active.name!r} must have role = 'active'")
        if any(p.role == "active" for p in self.parties):
            raise ConfigError("only [active] may have the role 'active'")

    @property
    def party_infos(self) -> tuple[PartyInfo, ...]:
        """Every party with its role, the active one first."""
        return (PartyInfo(self.active.name, "active"), *(PartyInfo(p.name, p.role) for p in self.parties))

    def coordinator_config(self) -> PartyConfig:
        """The active party's own config as it coordinates: its [active] settings (its own seed, privacy
        budget and audit file included), with every party of ``[[parties]]`` as a peer."""
        active = self.active
        peers = {p.name: PeerEntry(address=p.address, role=p.role) for p in self.parties}
        return PartyConfig(name=active.name, role="active", listen=active.listen, data=active.data, tls=active.tls,
                           peers={**active.peers, **peers}, deadline=active.deadline,
                           max_message_bytes=active.max_message_bytes, seed=active.seed, privacy=active.privacy,
                           audit_log=active.audit_log)

    def check_grpc(self) -> None:
        """What vflo's own gRPC needs (Flower needs neither): the active party's TLS and every party's address."""
        missing = [p.name for p in self.parties if not p.address]
        if missing:
            raise ConfigError(f"give the address of {missing} in the deploy config's [[parties]] (address = "
                              "\"HOST:PORT\"): vflo's gRPC dials it")
        self.active.check_grpc()


def _read_toml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from exc


def _relative(config: dict[str, Any], base: Path) -> dict[str, Any]:
    """Data and TLS paths in a config are relative to the config file."""
    out = dict(config)
    for table, keys in (("data", ("file", "serve_file")), ("tls", ("dir",))):
        if isinstance(out.get(table), dict):
            section = dict(out[table])
            for k in keys:
                if isinstance(section.get(k), str) and not Path(section[k]).is_absolute():
                    section[k] = str(base / section[k])
            out[table] = section
    for key in ("models", "checkpoints", "audit_log"):
        if isinstance(out.get(key), str) and out[key] and not Path(out[key]).is_absolute():
            out[key] = str(base / out[key])
    return out


def _audit_default(party: dict[str, Any]) -> dict[str, Any]:
    """A party table read from a file keeps its audit file beside the config unless it says otherwise."""
    if isinstance(party.get("name"), str):
        party.setdefault("audit_log", f"{party['name']}_audit.jsonl")
    return party


def load_party_config(path: str | Path) -> PartyConfig:
    return schema.build(PartyConfig, _relative(_audit_default(_read_toml(path)), Path(path).parent))


def load_deploy_config(path: str | Path) -> DeployConfig:
    raw = _read_toml(path)
    base = Path(path).parent
    if isinstance(raw.get("active"), dict):
        # The [active] table is the active party; saying so again is allowed, anything else is refused below.
        raw["active"] = _relative(_audit_default({"role": "active", **raw["active"]}), base)
    if isinstance(raw.get("test_file"), str) and not Path(raw["test_file"]).is_absolute():
        raw["test_file"] = str(base / raw["test_file"])
    return schema.build(DeployConfig, raw)


@dataclass(frozen=True)
class PartyTables:
    """What a party reads from its config's files: training rows, rows to score, a labelled test file (active
    party), all prepared the same way, and that way itself (for its model parts)."""

    train: PartyData | None
    serve: PartyData | None
    test: PartyData | None
    preprocessing: Preprocessing | None


def load_party_data(party: str, config: DataConfig, *, extra: str | None = None) -> PartyTables:
    """Training rows, rows to score and (``extra``) a labelled test file: read with the encoding fitted on the
    training file and standardised on the training rows. Without a training file, nothing is fitted: a saved
    model's part prepares the rows to score when it is loaded."""
    if config.file is None:
        return PartyTables(train=None, serve=None, test=None, preprocessing=None)
    encoding = TableEncoding.fit(read_table(config.file, party=party, id_column=config.id_column), party=party,
                                 id_column=config.id_column, label_column=config.label_column,
                                 feature_columns=config.feature_columns, drop_columns=config.drop_columns,
                                 categorical=config.categorical, task=config.task, impute=config.impute,
                                 missing_indicator=config.missing_indicator)
    def rows(path: str, *, labelled: bool = True) -> PartyData:
        try:
            data: PartyData = encoding.party_data(read_table(path, party=party, id_column=config.id_column),
                                                  labelled=labelled)
        except DataError as exc:  # which of the party's files it is, so the user knows which one to fix
            raise type(exc)(f"{path}: {exc}") from exc
        return data

    train = rows(config.file)
    serve = test = None
    if config.serve_file:
        serve = rows(config.serve_file, labelled=False)
    if extra:
        test = rows(extra)
    scaler = None
    if config.standardize and train.n_features:
        scaler = Standardizer.for_party(train)
        train = scaler.apply(train)
        serve = scaler.apply(serve) if serve is not None else None
        test = scaler.apply(test) if test is not None else None
    return PartyTables(train=train, serve=serve, test=test,
                       preprocessing=Preprocessing(columns=train.columns, encoding=encoding, scaler=scaler))


class DeployedStore(PartStore):
    """A deployed party's model folder; when it loads a part it also reads its rows to score (``serve_file``)
    with that part's saved encoding and standardisation, so scoring does not depend on today's training file."""

    def __init__(self, root: Path, *, party: str, role: str, preprocessing: Preprocessing | None,
                 serve_file: str | None) -> None:
        super().__init__(root, party=party, role=role, preprocessing=preprocessing)
        self.serve_file = serve_file

    def serving_rows(self, part: Part) -> PartyData | None:
        if self.serve_file is None or not part.manifest.get("preprocessing"):
            return None
        return part.preprocessing.rows(self.serve_file, party=self.party)


def credentials_for(party: str, tls: TLSConfig) -> PartyCredentials | None:
    if tls.insecure:
        return None
    assert tls.dir is not None
    return PartyCredentials.load(tls.dir, party)


@dataclass
class RunningParty:
    """A party's node and its client to the others, in this process; over vflo's gRPC also its server."""

    node: Node
    transport: Transport
    server: PartyServer | None = None

    def stop(self) -> None:
        self.transport.close()
        if self.server is not None:
            self.server.stop()


# Connects a party's node to the others some other way than vflo's own gRPC (Flower): the transport it uses.
Link = Callable[[Node], Transport]


def build_node(config: PartyConfig, *, data: PartyData | None = None, serve: PartyData | None = None,
               preprocessing: Preprocessing | None = None) -> Node:
    """The party's node with its rows (read as its config says, unless given), its peers' roles, its policy and
    its own model and checkpoint folders."""
    if data is None and serve is None and config.data is not None:
        tables = load_party_data(config.name, config.data)
        data, serve, preprocessing = tables.train, tables.serve, tables.preprocessing
    store = None
    if config.models is not None:
        store = DeployedStore(Path(config.models), party=config.name, role=config.role, preprocessing=preprocessing,
                              serve_file=None if config.data is None else config.data.serve_file)
    checkpoints = None
    if config.checkpoints is not None:
        checkpoints = CheckpointStore(Path(config.checkpoints), party=config.name, role=config.role)
    return party_node(PartyInfo(config.name, config.role), data, serve, peers=config.peer_roles, policy=config.policy,
                      store=store, checkpoints=checkpoints, secret=PartySecret(config.seed), budget=config.privacy,
                      settings=config.methods, idle_run_seconds=config.deadline)


def start_party(config: PartyConfig, *, data: PartyData | None = None, serve: PartyData | None = None,
                preprocessing: Preprocessing | None = None, link: Link | None = None) -> RunningParty:
    """Load the party's data (unless its rows are given), and start serving its node: over vflo's gRPC, or
    through ``link`` (then nothing listens here; the link's hub reaches the others)."""
    if link is None:
        config.check_grpc()
    node = build_node(config, data=data, serve=serve, preprocessing=preprocessing)
    departures = config.departures()
    if link is not None:
        transport = link(node)
        transport.departures = departures
        node.attach(transport)
        return RunningParty(node=node, transport=transport)
    credentials = credentials_for(config.name, config.tls)
    grpc_transport = GrpcTransport(config.name, config.addresses, credentials=credentials, deadline=config.deadline,
                                   max_message_bytes=config.max_message_bytes)
    grpc_transport.departures = departures
    node.attach(grpc_transport)
    server = PartyServer(node, address=config.listen, credentials=credentials, allowed=set(config.peers),
                         max_message_bytes=config.max_message_bytes, departures=departures).start()
    return RunningParty(node=node, transport=grpc_transport, server=server)


def stop_on_signal() -> threading.Event:
    """An event SIGINT and SIGTERM set: a serving party's loop waits on it."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def announce(config: PartyConfig, where: str) -> None:
    """What a serving party agrees to, its peers and where it listens, on the terminal it was started from."""
    if config.policy.open:
        logger.warning("party %s has no [policy]: it agrees to run any method its coordinator sets up; list the "
                       "ones it agrees to under [policy] methods = [...]", config.name)
    peers = ", ".join(f"{n} ({r})" for n, r in config.peer_roles.items())
    print(f"party {config.name} ({config.role}) agrees to run {config.policy.describe()}; peers: {peers}",
          flush=True)
    print(f"party {config.name} ({config.role}) {where}", flush=True)


def serve_forever(config: PartyConfig) -> int:
    """``vflo party serve``: serve until SIGINT or SIGTERM."""
    party = start_party(config)
    stop = stop_on_signal()
    assert party.server is not None
    announce(config, f"listening on {party.server.address}")
    while not stop.wait(0.5):
        pass
    party.stop()
    return 0


def _refuse_leaks(party: str, leaked: np.ndarray, where: str) -> None:
    if len(leaked):
        raise DataError(
            f"{len(leaked)} test IDs are also in party {party!r}'s {where} (e.g. {leaked[:5].tolist()}): a test row "
            "must be held out of every party's training data, or the scores measure rows it trained on; remove them "
            "from the training files (vflo split cuts train, test and serve files that never overlap)")


def _task_of(train: PartyData, test: PartyData | None, deploy: DeployConfig) -> tuple[str, int | None]:
    y = train.require_labels()
    task = deploy.task if deploy.task is not None else infer_task(y)
    if task == "regression":
        return task, None
    n = deploy.n_classes or int(max(y.max(), test.y.max() if test is not None and test.y is not None else 0)) + 1
    return task, max(n, 2)


class Deployment:
    """The active party's side of a deployed federation: its node, and its way to every other party (its own
    gRPC server and clients, or a ``link`` such as vflo.flower's transport through a Flower ServerApp)."""

    def __init__(self, deploy: DeployConfig, *, train: PartyData | None = None, test: PartyData | None = None,
                 link: Link | None = None) -> None:
        if link is None:
            deploy.check_grpc()
        active = deploy.active
        preprocessing = None
        if train is None:
            assert active.data is not None
            tables = load_party_data(active.name, active.data, extra=deploy.test_file)
            if tables.train is None:
                raise ConfigError(f"the active party {active.name!r} needs its training file ([active.data] file) to "
                                  "train; to score with a saved model use `vflo predict`")
            train, test, preprocessing = tables.train, tables.test, tables.preprocessing
        self.deploy = deploy
        self.preprocessing = preprocessing or Preprocessing(columns=train.columns)
        self.train = train
        self.test = test
        self.task, self.n_classes = _task_of(train, test, deploy)
        serving = None if test is None else PartyData(party=test.party, ids=test.ids, X=test.X, columns=test.columns)
        config = deploy.coordinator_config()
        self.party = start_party(config, data=train, serve=serving, preprocessing=self.preprocessing, link=link)
        self.parties = deploy.party_infos

    @property
    def data_parties(self) -> tuple[PartyInfo, ...]:
        return tuple(p for p in self.parties if p.holds_data)

    def missing_for(self, method: Method) -> str:
        """What ``method`` needs that the deploy config lacks (a server or dealer), as "NAME needs [...]"; or ""."""
        missing = [f"{p.name} ({p.role})" for p in method.extra_parties(self.data_parties) if p not in self.parties]
        return f"{method.name} needs {missing}" if missing else ""

    def parties_for(self, method: Method) -> tuple[PartyInfo, ...]:
        """The data parties and the data-less parties ``method`` needs: a server or dealer no method of the run
        uses need not be running."""
        needs = self.missing_for(method)
        if needs:
            raise MethodError(f"{needs} in the deploy config's [[parties]]")
        return (*self.data_parties, *method.extra_parties(self.data_parties))

    def preflight(self, methods: list[Method], *, alignment: AlignmentConfig | None = None, save: bool = False,
                  checkpoints: bool = False) -> None:
        """Before anything trains: every party the methods need has the folders ``save`` and ``checkpoints``
        will write to, no test row is in any party's training rows, the active party shares IDs with the
        others, and every party a collaborative method scores with holds the rows to score.

        Each check is an alignment exchange (plain, or PSI as configured), reported apart like any alignment.
        First of all, every method's server or dealer is in the deploy config: a method that needs one
        would otherwise fail only after the methods before it had trained.
        """
        needs = [text for text in map(self.missing_for, methods) if text]
        if needs:
            raise ConfigError("; ".join(needs) + " in the deploy config's [[parties]]: add each as "
                              "[[parties]] name = '...', role = '...' (over vflo's gRPC also address = 'HOST:PORT' "
                              "of its `vflo party serve`; over Flower its `vflo flower party` runs a SuperNode), or "
                              "leave the method out")
        own = self.train
        fed = Federation(node=self.party.node, transport=self.party.transport, parties=self.data_parties, seed=0,
                         task=self.task, n_classes=self.n_classes, alignment=alignment)  # type: ignore[arg-type]
        if save or checkpoints:
            self._check_folders(methods, save=save, checkpoints=checkpoints)
        test_ids = np.empty(0, dtype=own.ids.dtype) if self.test is None else self.test.ids
        _refuse_leaks(own.party, test_ids[own.contains(test_ids)], "training file")
        passives = [p.name for p in self.data_parties if p.role == "passive"]
        # One question per party about its training rows (a party answers one set of IDs a run): the test rows
        # and the active party's own, together.
        asked = np.unique(np.concatenate([test_ids.astype(own.ids.dtype), own.ids]))
        is_test, is_own = np.isin(asked, test_ids.astype(own.ids.dtype)), np.isin(asked, own.ids)
        shares = False
        for name in passives:
            answer = fed.align(asked, [name])
            held = answer.held.get(name)
            if held is None:  # PSI with mode = 'active': only the shared IDs come back
                held = np.isin(asked, answer.ids)
            _refuse_leaks(name, asked[held & is_test], "training rows")
            shares = shares or bool((held & is_own).any())
        if passives and not shares:
            raise AlignmentError(
                f"the active party {own.party!r} shares no ID with {passives}: its training IDs look like "
                f"{own.ids[:3].tolist()}; check that every party's id_column holds the same IDs in the same format")
        for method in methods:
            for name in method.scoring_parties(self.data_parties):
                if not len(test_ids):
                    continue
                try:
                    held = fed.align(test_ids, [name], split="serve").held[name]
                except RemoteError as exc:
                    raise AlignmentError(
                        f"{method.name} scores together with {name!r}, which has no rows to score "
                        f"({exc.remote_message}); give {name!r} a serve_file with the test rows, or leave "
                        f"{method.name} out") from exc
                if not held.all():
                    missing = np.sort(test_ids)[~held]
                    raise AlignmentError(
                        f"{method.name} scores together with {name!r}, which does not hold {len(missing)} of the "
                        f"{len(test_ids)} rows to score (e.g. {missing[:5].tolist()}); add them to its serve_file, or "
                        f"leave {method.name} out")

    def _check_folders(self, methods: list[Method], *, save: bool, checkpoints: bool) -> None:
        """Every party the methods need (servers and dealers included) has its model folder (``save``) and its
        checkpoint folder (``checkpoints``): asked once, before anything trains."""
        needed = {p.name: p for m in methods for p in self.parties_for(m) if p.name != self.train.party}
        lacking: list[str] = []
        for name in needed:
            request = Message(sender=self.train.party, receiver=name, kind=READY, round=0,
                              payload={"save": save, "checkpoints": checkpoints})
            reply = self.party.transport.request(request)
            if reply.error is not None:
                lacking.append(f"{name}: {reply.error.message}")
        if lacking:
            what = " and ".join(w for w, on in (("--save", save), ("--checkpoints", checkpoints)) if on)
            raise ConfigError(f"{what} needs a folder at every party the methods use; " + "; ".join(lacking))

    def run(self, method: Method, *, seed: int, alignment: AlignmentConfig | None = None,
            save: tuple[Path, str] | None = None, checkpoint: tuple[Path, CheckpointPlan] | None = None) -> RunOutput:
        """Fit ``method`` over the network and score the test rows; the ledger holds every party's messages.

        With ``save`` (a folder and a label) every party writes its own part in its own folder (the others in
        the folder their configs name) and this party writes its part and the model card here. With
        ``checkpoint`` (this party's folder and a plan), training keeps checkpoints here and every other
        party in the folder its own config names, and may resume from the last one they all hold."""
        if method.simulation_only:
            raise MethodError(f"{method.name} needs the pooled raw data of every party, so it exists only in "
                              "simulation; it cannot run over a deployment")
        parties = self.parties_for(method)
        transport = self.party.transport
        transport.ledger = Ledger()
        fed = Federation(node=self.party.node, transport=transport, parties=parties, seed=seed,
                         task=self.task, n_classes=self.n_classes, alignment=alignment)  # type: ignore[arg-type]
        if checkpoint is not None:
            self.party.node.checkpoints = CheckpointStore(checkpoint[0], party=self.train.party, role="active")
        ids = np.empty(0, dtype=np.int64) if self.test is None else self.test.ids
        return Session(fed).run(method, ids, checkpoint=None if checkpoint is None else checkpoint[1],
                                save=None if save is None else lambda fed: self.save(fed, method, *save))

    def save(self, fed: Federation, method: Method, folder: Path, label: str) -> ModelCard:
        """This party's part and the model card in ``folder``; every other party's part in its own folder."""
        model_id = new_model_id()
        own = PartStore(folder, party=self.train.party, role="active", preprocessing=self.preprocessing)
        manifests = {self.train.party: own.save(label=label, method=method.name, config=method.config_json(),
                                                model_id=model_id, state=fed.own_part(method))}
        manifests |= fed.save_parts(label, model_id)
        classes = () if self.preprocessing.encoding is None else self.preprocessing.encoding.classes
        card = ModelCard(label=label, method=method.name, config=method.config_json(), model_id=model_id,
                         seed=fed.seed, task=self.task, n_classes=self.n_classes, classes=classes,
                         active=self.train.party, parties=tuple((p.name, p.role) for p in fed.parties),
                         inference=method.inference, manifests=manifests)
        card.write(folder / label)
        return card

    def as_dataset(self) -> Dataset:
        """The active party's own data, shaped as a dataset for the report."""
        frame = pd.DataFrame(self.train.X, columns=list(self.train.columns))
        return Dataset(name=f"deployment:{self.train.party}", X=frame, y=self.train.require_labels(),
                       ids=self.train.ids, task=self.task, n_classes=self.n_classes,  # type: ignore[arg-type]
                       standin=False, source="the active party's own data (deployment)")

    def close(self) -> None:
        self.party.stop()



def score_deployed(deploy: DeployConfig, model: SavedModel, rows: str | Path, *, missing: Missing = "refuse",
                   fallback: SavedModel | None = None, deadline: float | None = None) -> pd.DataFrame:
    """Score the active party's ``rows`` with a saved model over a deployment: every party loads its own saved
    part (``vflo party serve ... --save DIR``) and scores the rows of its ``serve_file`` it holds.

    ``missing = "subset"``: each row is scored by the partners that hold it and answer; ``deadline`` (seconds,
    default the deploy config's) bounds each request, retries included, and a partner past it is absent for
    that batch (one that cannot load its part, for the session). The output's ``scored_by`` says who scored."""
    active = deploy.active
    if active.name != model.card.active:
        raise ConfigError(f"the model was saved with {model.card.active!r} as the active party, but deploy.toml's "
                          f"[active] is {active.name!r}")
    if deadline is not None and not deadline > 0:
        raise ConfigError(f"the deadline is a number of seconds > 0, got {deadline}")
    if deadline is not None and missing != "subset":
        raise ConfigError("a deadline applies to scoring with whoever answers: give --missing subset with it")
    serving = model.rows(active.name, rows)
    config = deploy.coordinator_config()
    if deadline is not None:
        config = replace(config, deadline=deadline)
    try:
        party = start_party(config, data=None, serve=serving)
    except AddressInUseError as exc:
        raise TransportError(f"{exc}. If `vflo run --deploy` is training at {active.name!r} now, it holds that "
                             "address, and the other parties serve one run at a time: they refuse a scoring session "
                             "while a training run goes on. Score when the run has ended") from exc
    try:
        # The rows to score are matched with each partner's by private set intersection: a partner learns which of
        # its own people are scored, never the IDs of people it does not hold (plain alignment sent them all).
        fed, method = model.restore(party.node, party.transport, alignment=AlignmentConfig(method="psi"),
                                    missing=missing)
        covered = np.ones(len(serving.ids), dtype=bool)
        for name in method.scoring_parties(fed.parties):
            covered &= held_rows(fed, serving.ids, name, method.name)
        frame = combine(model, serving.ids, covered, lambda keep: method.predict_by(fed, keep), missing=missing,
                        fallback=fallback, fallback_rows=rows)
        fed.teardown()
        return frame
    finally:
        party.stop()


def held_rows(fed: Federation, ids: np.ndarray, party: str, method: str) -> np.ndarray:
    """Which of ``ids`` (in their order) ``party`` holds among its rows to score: one alignment exchange."""
    try:
        alignment = fed.align(ids, [party], split="serve")
    except RemoteError as exc:
        raise AlignmentError(f"{method} scores together with {party!r}, which has no rows to score "
                             f"({exc.remote_message}); give it a serve_file with the people to score") from exc
    order = np.argsort(ids, kind="stable")
    held = np.zeros(len(ids), dtype=bool)
    held[order] = alignment.held[party]
    return held


def toml_value(value: object) -> str:
    """``value`` as TOML writes it (a string quoted and escaped, lists and tables inline)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{_toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + " }"
    return str(value)


def _toml_key(key: object) -> str:
    text = str(key)
    return text if text.replace("_", "").replace("-", "").isalnum() and text.isascii() else toml_value(text)


def own_settings_toml(proposals: Sequence[Any], role: Role) -> list[str]:
    """A party's ``[methods.NAME]`` sections for the experiment's ``proposals`` (methods with their configs): its
    own side of each, as the experiment sets it (the first entry of a method where several differ, noted)."""
    from vflo.methods.own_settings import party_section

    sections: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    for method in proposals:
        section = party_section(type(method), role, method.config_json())
        if method.name in sections:
            if sections[method.name] != section:
                notes.append(f"# another {method.name} entry of the experiment sets this party's side otherwise: "
                             f"{toml_value(section)}; a party runs one, the one below")
            continue
        sections[method.name] = section
    lines: list[str] = ["# This party's own side of each method: whatever a coordinator proposes, these run here.",
                        *notes] if any(sections.values()) else []
    for name, section in sections.items():
        if section:
            lines += [f"[methods.{name}]", *(f"{_toml_key(k)} = {toml_value(v)}" for k, v in section.items()), ""]
    return lines


def export_federation(
    data: Any, directory: Path, *, base_port: int = 50051, extra_roles: dict[str, Role] | None = None,
    tls: bool = True, host: str = "127.0.0.1", methods: Sequence[str] = (), proposals: Sequence[Any] = (),
) -> dict[str, Path]:
    """Write what each party of a simulated split would bring to a real deployment.

    For every data party: ``NAME_train.csv`` (and ``NAME_serve.csv`` with the rows to score); for the
    active party also ``NAME_test.csv`` with the test labels; ``NAME.toml`` for ``vflo party serve``
    (every party but the active one), each listing its peers with their roles and, under ``[policy]``, the
    ``methods`` it agrees to run and, under ``[methods.NAME]``, its own side of each of the experiment's
    ``proposals`` (methods with their configs) as the experiment sets it; ``deploy.toml`` for the active party;
    and, with ``tls``, the keys kept apart:
    ``certs/NAME/`` holds party NAME's ``ca.pem``, ``NAME.pem`` and ``NAME.key`` and nothing else (its config's
    ``[tls] dir``), ``certs/ca/`` the CA's certificate and key with a README (it belongs offline, never on a
    party's host). Data is written already standardised, so parties do not rescale it.
    """
    from vflo.comm.tls import init_certs
    from vflo.data.scenario import FederatedData

    assert isinstance(data, FederatedData)
    directory.mkdir(parents=True, exist_ok=True)
    # Private keys and party data: git must never pick them up, wherever the folder is.
    (directory / ".gitignore").write_text("# written by vflo scenario --export: keys and party data, never commit\n*\n")
    roles: dict[str, Role] = {p.name: p.role for p in data.parties} | (extra_roles or {})
    addresses = {name: f"{host}:{base_port + i}" for i, name in enumerate(roles)}
    if tls:
        certs = directory / "certs"
        # An export before keys were kept apart left them all in certs/: none may stay next to the party folders.
        for stale in ("ca.pem", "ca.key", *(f"{n}.{ext}" for n in roles for ext in ("pem", "key"))):
            (certs / stale).unlink(missing_ok=True)
        init_certs(certs, list(roles), overwrite=True, split=True)
    active = data.active
    written: dict[str, Path] = {}
    for name, role in roles.items():
        lines: list[str] = []
        if name in data.train:
            data.train[name].to_frame("id", "label").to_csv(directory / f"{name}_train.csv", index=False)
            data.serve[name].to_frame("id").to_csv(directory / f"{name}_serve.csv", index=False)
            label = '\nlabel_column = "label"' if name == active else ""
            lines = [f'file = "{name}_train.csv"', 'id_column = "id"' + label, f'serve_file = "{name}_serve.csv"',
                     "standardize = false"]
        tls_lines = ["[tls]", f"dir = {toml_value(f'certs/{name}')}" if tls else "insecure = true"]
        peers = [f"{n} = {{ address = {toml_value(a)}, role = {toml_value(roles[n])} }}" for n, a in addresses.items()
                 if n != name]
        listed = ", ".join(toml_value(m) for m in dict.fromkeys(methods))
        policy = ["[policy]", f"methods = [{listed}]", ""] if methods else []
        if name == active:
            test = PartyData(party=name, ids=data.test_ids, X=data.serve[name].subset(data.test_ids).X,
                             columns=data.serve[name].columns, y=data.test_y)
            test.to_frame("id", "label").to_csv(directory / f"{name}_test.csv", index=False)
            others = [f"[[parties]]\nname = {toml_value(n)}\nrole = {toml_value(r)}\n"
                      f"address = {toml_value(addresses[n])}" for n, r in roles.items() if n != name]
            text = "\n".join([
                "# The active party coordinates: vflo run EXPERIMENT.toml --deploy deploy.toml", "",
                f'test_file = "{name}_test.csv"', "", "[active]", f"name = {toml_value(name)}", 'role = "active"',
                f"listen = {toml_value(addresses[name])}", "", "[active.data]", *lines, "",
                *(["[active.tls]", *tls_lines[1:]]), "", *others, ""])
            path = directory / "deploy.toml"
        else:
            text = "\n".join([
                f"# vflo party serve {name}.toml", f"name = {toml_value(name)}", f"role = {toml_value(role)}",
                f"listen = {toml_value(addresses[name])}",
                "# Its own folders: the parts of models it trains (run --save) and its checkpoints (run --checkpoints)",
                f"models = {toml_value(f'{name}_models')}", f"checkpoints = {toml_value(f'{name}_checkpoints')}", "",
                *(["[data]", *lines, ""] if lines else []), *tls_lines, "", *policy,
                *own_settings_toml(proposals, role), "[peers]", *peers, ""])
            path = directory / f"{name}.toml"
        path.write_text(text)
        written[name] = path
    return written
