"""One party's process: its data read from its own files, its node, its gRPC server, until it is stopped."""

from __future__ import annotations

import gc
import logging
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from vflo.align.ids import IdFile
from vflo.align.kept import AlignmentStore
from vflo.artifacts import CheckpointStore, Part, Preprocessing
from vflo.comm.grpc_transport import GrpcTransport, PartyServer
from vflo.comm.tls import PartyCredentials
from vflo.comm.transport import Transport
from vflo.data.files import Source, TableEncoding, open_table
from vflo.data.partydata import PartyData
from vflo.data.preprocessing import Standardizer
from vflo.deploy.configs import DataConfig, PartyConfig, TLSConfig
from vflo.dp import DEFAULT_BUDGET, PrivacyBudget
from vflo.errors import (
    DataError,
)
from vflo.executor import make as make_executor
from vflo.federation.simulation import party_node
from vflo.party.node import Node
from vflo.roles import PartyInfo
from vflo.seeding import PartySecret
from vflo.shelf import ModelShelf

logger = logging.getLogger(__name__)


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
    model's part prepares the rows to score when it is loaded. Either may be a database's rows instead
    (``[data] sql``: :mod:`vflo.data.sql`), read the same way."""
    train_source, serve_source = config.train_source, config.serve_source
    if train_source is None:
        return PartyTables(train=None, serve=None, test=None, preprocessing=None)
    encoding = TableEncoding.fit(open_table(train_source, party=party, id_column=config.id_column), party=party,
                                 id_column=config.id_column, label_column=config.label_column,
                                 feature_columns=config.feature_columns, drop_columns=config.drop_columns,
                                 categorical=config.categorical, task=config.task, impute=config.impute,
                                 missing_indicator=config.missing_indicator, category_codes=config.category_codes)
    def rows(path: Source, *, labelled: bool = True) -> PartyData:
        try:
            data = PartyData.encoded(open_table(path, party=party, id_column=config.id_column), encoding,
                                     labelled=labelled)
        except DataError as exc:  # which of the party's files it is, so the user knows which one to fix
            raise type(exc)(f"{path}: {exc}") from exc
        return data

    train = rows(train_source)
    serve = test = None
    if serve_source:
        serve = rows(serve_source, labelled=False)
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


class DeployedStore(ModelShelf):
    """A deployed party's model folder, where every training keeps its own part (:class:`~vflo.shelf.ModelShelf`);
    when it loads a part it also reads its rows to score (``serve_file``, or the database's ``serve_table`` or
    ``serve_query``) with that part's saved encoding and standardisation, so scoring does not depend on today's
    training file, and a scoring session opened later reads the rows as they are then."""

    def __init__(self, root: Path, *, party: str, role: str, preprocessing: Preprocessing | None,
                 serve_source: Source | None) -> None:
        super().__init__(root, party=party, role=role, preprocessing=preprocessing)
        self.serve_source = serve_source

    def serving_rows(self, part: Part) -> PartyData | None:
        if self.serve_source is None or not part.manifest.get("preprocessing"):
            return None
        return part.preprocessing.rows(self.serve_source, party=self.party)


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

    @property
    def contact(self) -> str:
        """Where the others reach it: its gRPC server's address ("" over a link, where nothing listens here)."""
        return "" if self.server is None else self.server.address

    def stop(self) -> None:
        self.transport.close()
        if self.server is not None:
            self.server.stop()
        if self.node.executor is not None:  # the party's own (a Ray instance it started ends with it)
            self.node.executor.close()


# Connects a party's node to the others some other way than vflo's own gRPC (Flower): the transport it uses.
Link = Callable[[Node], Transport]


def build_node(config: PartyConfig, *, data: PartyData | None = None, serve: PartyData | None = None,
               preprocessing: Preprocessing | None = None) -> Node:
    """The party's node with its rows (read as its config says, unless given), its peers' roles, its policy, its
    own model and checkpoint folders, and its own executor and spill setting (``[executor]``, ``[spill]``: the
    node's, not the process's, so parties that share a process keep their own)."""
    if data is None and serve is None and config.data is not None:
        tables = load_party_data(config.name, config.data)
        data, serve, preprocessing = tables.train, tables.serve, tables.preprocessing
    if config.seed is not None:
        logger.warning("party %s draws its secrets from the seed in its config (seed = ...), not from the operating "
                       "system: its runs repeat exactly, and whoever reads that config, or derives the seed (an export "
                       "writes the one the in-process run derived from the experiment's seed), can recompute its "
                       "masks and noise. Delete the line before a deployment on real data", config.name)
    store = None
    if config.models is not None:
        store = DeployedStore(Path(config.models), party=config.name, role=config.role, preprocessing=preprocessing,
                              serve_source=None if config.data is None else config.data.serve_source)
    checkpoints = None
    if config.checkpoints is not None:
        checkpoints = CheckpointStore(Path(config.checkpoints), party=config.name, role=config.role)
    alignments = AlignmentStore(Path(config.alignments), config.name, files=id_files(config)) \
        if config.alignments else None
    return party_node(PartyInfo(config.name, config.role), data, serve, peers=config.peer_roles, policy=config.policy,
                      store=store, checkpoints=checkpoints, secret=PartySecret(config.seed), budget=budget(config),
                      settings=config.methods, idle_run_seconds=config.deadline, alignments=alignments,
                      privacy_journal=Path(config.privacy_account) if config.privacy_account else None,
                      executor=None if config.executor is None else make_executor(config.executor),
                      spill=config.spill, asked=config.asked())


def budget(config: PartyConfig) -> PrivacyBudget:
    """The party's privacy budget: its config's ``[privacy]``, else :data:`vflo.dp.DEFAULT_BUDGET` (logged, so the
    operator sees which bound holds)."""
    if config.privacy is not None:
        chosen = config.privacy
        logger.info("party %s: privacy budget ε = %g at δ = %g per person ([privacy] in its config)%s", config.name,
                    chosen.epsilon, chosen.delta, "; everything it sends is covered, end to end" if chosen.protect
                    else "")
    else:
        chosen = DEFAULT_BUDGET
        logger.info("party %s: privacy budget ε = %g at δ = %g per person, the default (no [privacy] in its "
                    "config; set [privacy] epsilon to change it)", config.name, chosen.epsilon, chosen.delta)
    if not chosen.protect:
        logger.warning("party %s does not protect what it sends ([privacy] protect = false, or no [privacy]): its "
                       "budget bounds only the releases a method noises anyway; write [privacy] epsilon = ... to "
                       "cover everything it sends", config.name)
    if not config.privacy_account:
        logger.warning("party %s keeps no privacy account (privacy_account = \"\"): every start counts its "
                       "people's privacy from zero again", config.name)
    return chosen


def id_files(config: PartyConfig) -> dict[str, IdFile]:
    """The party's own files by purpose, for an intersection streamed from disk (vflo.align.stream); a database's
    rows are not streamed (its rows are in memory, where an intersection in memory reads them)."""
    data = config.data
    if data is None:
        return {}
    return {purpose: IdFile(Path(file), data.id_column)
            for purpose, file in (("train", data.train_source), ("serve", data.serve_source))
            if isinstance(file, str | Path)}


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
    policy = config.policy
    served = "every model it saved" if policy.serve_models is None else (
        ", ".join(policy.serve_models) if policy.serve_models else "no saved model")
    rate = policy.max_peer_requests_per_second
    logger.info("party %s scores with %s, %s; %s", config.name, served,
                "at any rate" if rate is None else f"at most {rate:g} requests a second per peer",
                f"who asked about which of its people goes to {config.asked_log}" if config.asked_log else
                "it keeps no record of who asked about its people (asked_log = \"\")")
    peers = ", ".join(f"{n} ({r})" for n, r in config.peer_roles.items())
    print(f"party {config.name} ({config.role}) agrees to run {config.policy.describe()}; peers: {peers}",
          flush=True)
    print(f"party {config.name} ({config.role}) {where}", flush=True)


def serve_forever(config: PartyConfig) -> int:
    """``vflo party serve``: serve until SIGINT or SIGTERM."""
    party = start_party(config)
    stop = stop_on_signal()
    assert party.server is not None
    # Its rows stay for the process's life: out of the collector's sight, so that full collections, which would
    # walk them all, do not stall an answer now and then (a scoring session's deadline is milliseconds).
    gc.collect()
    gc.freeze()
    announce(config, f"listening on {party.server.address}")
    while not stop.wait(0.5):
        pass
    party.stop()
    return 0
