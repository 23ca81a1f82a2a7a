"""What a deployment is written in: a party's PARTY.toml and the active party's DEPLOY.toml, read and checked."""

from __future__ import annotations

import logging
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from vflo import schema
from vflo.align.engines import check_policy
from vflo.comm.codec import DEFAULT_MAX_BYTES
from vflo.comm.departures import DepartureLog
from vflo.comm.grpc_transport import DEFAULT_DEADLINE
from vflo.data.files import Source
from vflo.data.sql import SqlSource, absolute_url
from vflo.dp import PrivacyBudget
from vflo.errors import (
    ConfigError,
)
from vflo.executor import ExecutorConfig
from vflo.party.asked import AskedLog
from vflo.party.policy import Policy
from vflo.roles import PartyInfo, Role, check_party_name
from vflo.spill import SpillConfig

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """A party's table: training rows in ``file``; rows to score in ``serve_file``. A party that only scores
    with a saved model needs no ``file``: its ``serve_file`` is read with the saved part's encoding.

    Instead of files, a SQL database of the party's own (:mod:`vflo.data.sql`, docs/feature-store.md): ``sql``
    names it (``sqlite:///PATH`` or ``duckdb:///PATH``), ``table`` or ``query`` the training rows (instead of
    ``file``), ``serve_table`` or ``serve_query`` the rows to score (instead of ``serve_file``); read-only.

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
    # Numerical columns that already hold whole-number category codes (0/1 one-hot columns, as an export writes a
    # party's categories): kept as they are and treated as categories by the methods that treat them apart.
    category_codes: tuple[str, ...] = ()
    sql: str | None = None
    table: str | None = None
    query: str | None = None
    serve_table: str | None = None
    serve_query: str | None = None

    def __post_init__(self) -> None:
        named = [k for k in ("table", "query", "serve_table", "serve_query") if getattr(self, k) is not None]
        if self.sql is None and named:
            raise ConfigError(f"[data] {named[0]} reads rows from a database: name it with sql = "
                              "\"sqlite:///PATH\" or \"duckdb:///PATH\"")
        if self.sql is not None and not named:
            raise ConfigError("[data] sql names a database: say which rows with table = \"NAME\" (or query = "
                              "\"SELECT ...\") for training and serve_table (or serve_query) for the rows to score")
        for file, keys in (("file", ("table", "query")), ("serve_file", ("serve_table", "serve_query"))):
            given = [k for k in keys if getattr(self, k) is not None]
            if getattr(self, file) is not None and given:
                raise ConfigError(f"[data] reads these rows from {file} or from the database ({given[0]}), not both")
        sources = (self.train_source, self.serve_source)  # made here, so a bad URL is refused with the config
        if all(source is None for source in sources):
            raise ConfigError("[data] needs file (training rows), serve_file (rows to score), or both (or, from a "
                              "database, sql with table or query, serve_table or serve_query)")

    @property
    def train_source(self) -> Source | None:
        """Where the training rows are: ``file``, or the database's ``table`` or ``query``."""
        return self._source(self.file, self.table, self.query)

    @property
    def serve_source(self) -> Source | None:
        """Where the rows to score are: ``serve_file``, or the database's ``serve_table`` or ``serve_query``."""
        return self._source(self.serve_file, self.serve_table, self.serve_query)

    def _source(self, file: str | None, table: str | None, query: str | None) -> Source | None:
        if self.sql is None or (table is None and query is None):
            return file
        return SqlSource(url=self.sql, table=table, query=query)


@dataclass(frozen=True, kw_only=True)
class TLSConfig:
    """``dir`` holds ca.pem and NAME.pem / NAME.key (and the CA's crl.pem): the party's own folder, where
    ``vflo certs request`` made its key and ``vflo certs sign`` at the CA its certificate (for a demo on one
    machine, its folder from ``vflo certs init --split``); ``insecure`` turns TLS off."""

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
    # What this party agrees to run (see vflo.party.policy).
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
    # What this party lets out of each person's privacy over all its noised releases ([privacy] epsilon, delta);
    # left out, vflo.dp.DEFAULT_BUDGET.
    privacy: PrivacyBudget | None = None
    # Where it keeps its privacy account (JSON lines, appended before each noised release), so a restart continues
    # it. A PARTY.toml without the key keeps NAME_privacy.jsonl beside the config; "" keeps none (the account
    # then starts at zero each time the party starts: logged as a warning).
    privacy_account: str | None = None
    # Its own record of every message that left it (JSON lines, appended; `vflo party audit FILE` sums it). A
    # PARTY.toml without the key keeps NAME_audit.jsonl beside the config; "" keeps none.
    audit_log: str | None = None
    # Its own record of who asked about which of its people (a line per scoring request: the peer, the saved model,
    # the time, the people's IDs; vflo.party.asked), apart from audit_log, which holds no content. A PARTY.toml
    # without the key keeps NAME_asked.jsonl beside the config; "" keeps none.
    asked_log: str | None = None
    # Where it keeps each private set intersection it takes part in, to reuse while its people and the other
    # party's are unchanged (vflo.align.kept; `vflo align`). A PARTY.toml without the key keeps NAME_alignments/
    # beside the config; "" keeps none (every run intersects afresh).
    alignments: str | None = None
    # Where its bulk work runs (PSI blinding, SecureBoost's bin sums and decryption, scoring's blocks of rows):
    # this host's cores, or a Ray cluster of its own ([executor] kind = "ray", address = ...; vflo.executor). The
    # party's own: its node's, not its process's.
    executor: ExecutorConfig | None = None
    # Matrices larger than it wants to hold in memory (ten million rows' latents), kept in files of its own and
    # read a batch at a time ([spill] limit_mb = 1024, folder = ...; vflo.spill). The party's own: its node's,
    # not its process's.
    spill: SpillConfig | None = None
    # Its own side of each method ([methods.NAME]: its bottom network, encoder, learning rate, ...): whatever a
    # coordinator proposes, these (else the method's defaults) run here (vflo.methods.own_settings).
    methods: dict[str, dict[str, Any]] = field(default_factory=dict)
    # How it is reached ([transport] kind = "grpc" | "flower" | ..., and that transport's own keys: vflo.transports);
    # left out, vflo's own gRPC with mutual TLS.
    transport: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in (self.name, *self.peers):
            check_party_name(name)
        check_policy(self.policy)
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
            from vflo.comm.tls import how_to_certify

            raise ConfigError(f"party {self.name!r}: give [tls] dir, the folder with its ca.pem, {self.name}.pem and "
                              f"{self.name}.key ({how_to_certify(self.name)}), or insecure = true for a loopback "
                              "experiment")
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

    def asked(self) -> AskedLog | None:
        """Its record of who asked about which of its people, where its config keeps one."""
        return AskedLog(Path(self.asked_log), self.name) if self.asked_log else None

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
                           audit_log=active.audit_log, alignments=active.alignments, executor=active.executor,
                           spill=active.spill, privacy_account=active.privacy_account, transport=active.transport)

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
    """Data, TLS and spill paths in a config are relative to the config file."""
    out = dict(config)
    for table, keys in (("data", ("file", "serve_file")), ("tls", ("dir",)), ("spill", ("folder",))):
        if isinstance(out.get(table), dict):
            section = dict(out[table])
            for k in keys:
                if isinstance(section.get(k), str) and not Path(section[k]).is_absolute():
                    section[k] = str(base / section[k])
            if table == "data" and isinstance(section.get("sql"), str):
                section["sql"] = absolute_url(section["sql"], base)
            out[table] = section
    for key in ("models", "checkpoints", "audit_log", "asked_log", "alignments", "privacy_account"):
        if isinstance(out.get(key), str) and out[key] and not Path(out[key]).is_absolute():
            out[key] = str(base / out[key])
    return out


def _audit_default(party: dict[str, Any]) -> dict[str, Any]:
    """A party table read from a file keeps its audit file, its record of who asked about its people, its kept
    alignments and its privacy account beside the config unless it says otherwise."""
    if isinstance(party.get("name"), str):
        party.setdefault("audit_log", f"{party['name']}_audit.jsonl")
        party.setdefault("asked_log", f"{party['name']}_asked.jsonl")
        party.setdefault("alignments", f"{party['name']}_alignments")
        party.setdefault("privacy_account", f"{party['name']}_privacy.jsonl")
    return party


#: Keys of a deploy config that a party's own config never has: given to `party serve`, the file is the wrong one.
DEPLOY_ONLY_KEYS = ("active", "parties", "test_file", "n_classes")


def load_party_config(path: str | Path) -> PartyConfig:
    raw = _read_toml(path)
    if any(k in raw for k in DEPLOY_ONLY_KEYS) and "name" not in raw:
        keys = ", ".join(k for k in DEPLOY_ONLY_KEYS if k in raw)
        raise ConfigError(
            f"{path} is the active party's deploy config ({keys}): it is for `vflo run CONFIG --deploy {path}`, "
            "which the active party runs to coordinate. `vflo party serve` (and `vflo flower party`) takes a "
            "passive party's own config, NAME.toml, or a server's or dealer's (name = ..., role, listen, [data], "
            "[tls], [peers]; an export writes one per party beside deploy.toml): give each other party its own")
    return schema.build(PartyConfig, _relative(_audit_default(raw), Path(path).parent))


def load_deploy_config(path: str | Path) -> DeployConfig:
    raw = _read_toml(path)
    base = Path(path).parent
    if "name" in raw and "active" not in raw:
        raise ConfigError(
            f"{path} is a party's own config (name = {raw['name']!r}): it is for `vflo party serve {path}`. "
            "`--deploy` takes the active party's deploy config, DEPLOY.toml ([active] with its own settings and "
            "[[parties]] with every other party's name and address; an export writes it as deploy.toml)")
    if isinstance(raw.get("active"), dict):
        # The [active] table is the active party; saying so again is allowed, anything else is refused below.
        raw["active"] = _relative(_audit_default({"role": "active", **raw["active"]}), base)
    if isinstance(raw.get("test_file"), str) and not Path(raw["test_file"]).is_absolute():
        raw["test_file"] = str(base / raw["test_file"])
    return schema.build(DeployConfig, raw)
