"""``vflo serve``'s config: where it listens, which saved models it serves and how, the active party's own
feature table, and its partners (deployed, or their files in this process for a simulation).

    [serve]
    listen = "127.0.0.1:8080"             # beyond loopback only with TLS (certificate, key)
    models = "runs/quickstart/models"     # a folder given to --save
    rows = "data/bank_to_score.csv"       # the active party's own rows, read once into memory
    deploy = "deploy.toml"                # partners serving their saved parts (vflo party serve ... --save DIR)
    batch_people = 64                     # a micro-batch closes at this many people ...
    batch_wait_ms = 2.0                   # ... or this long after its first request
    auth = "token"                        # "token" (Authorization: Bearer), "mtls" (client certificates), "none"
    token_file = "serve.token"            # the clients' token (default: CONFIG.token beside it, written if absent)
    admin_token_file = "admin.token"      # a second token for model swaps over HTTP (none: swaps over HTTP off)
    certificate = "certs/serve.pem"       # TLS: the server's certificate and key ...
    key = "certs/serve.key"
    client_ca = "certs/ca.pem"            # ... and, for auth = "mtls", the CA that signs clients' certificates
    grpc_listen = "127.0.0.1:8081"        # the same API over gRPC (none by default)
    watch_seconds = 5.0                   # a model saved again under its name is swapped in (0: never)

    [partners]                            # instead of deploy: each partner's rows, all in this process
    lab = "data/lab_to_score.csv"

    [models.splitnn]                      # every model served, with how it answers (vflo.serve.live.ServePolicy)
    missing = "subset"
    deadline_ms = 50
"""

from __future__ import annotations

import logging
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from vflo import schema
from vflo.comm.hosts import is_loopback
from vflo.errors import ConfigError
from vflo.serve.guard import Access, read_token
from vflo.serve.live import ServePolicy

logger = logging.getLogger(__name__)

Auth = Literal["token", "mtls", "none"]


@dataclass(frozen=True, kw_only=True)
class ServeSettings:
    """``[serve]``."""

    models: str
    rows: str
    listen: str = "127.0.0.1:8080"
    deploy: str | None = None
    batch_people: int = 64
    batch_wait_ms: float = 2.0
    auth: Auth = "token"
    token_file: str = ""
    admin_token_file: str | None = None
    certificate: str | None = None
    key: str | None = None
    client_ca: str | None = None
    insecure_listen: bool = False
    max_request_bytes: int = 4 << 20
    max_connections: int = 512
    grpc_listen: str = ""
    watch_seconds: float = 5.0

    def __post_init__(self) -> None:
        for key, address in (("listen", self.listen), ("grpc_listen", self.grpc_listen or "x:1")):
            host, _, port = address.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ConfigError(f"serve.{key} is HOST:PORT (e.g. 127.0.0.1:8080), got {address!r}")
        if self.grpc_listen and self.grpc_listen == self.listen:
            raise ConfigError("serve.grpc_listen and serve.listen are the same address: give gRPC a port of its own")
        if self.watch_seconds < 0:
            raise ConfigError(f"serve.watch_seconds: how often the models folder is checked for models saved again, "
                              f"0 for never; got {self.watch_seconds}")
        if self.auth not in ("token", "mtls", "none"):
            raise ConfigError(f"serve.auth is 'token' (a bearer token), 'mtls' (client certificates) or 'none', got "
                              f"{self.auth!r}")
        if (self.certificate is None) != (self.key is None):
            raise ConfigError("serve.certificate and serve.key go together (the server's TLS certificate and its key)")
        if self.auth == "mtls" and (self.client_ca is None or self.certificate is None):
            raise ConfigError("auth = 'mtls' needs serve.certificate, serve.key and serve.client_ca (the CA that "
                              "signs the clients' certificates)")
        if self.client_ca is not None and self.auth != "mtls":
            raise ConfigError("serve.client_ca is read only with auth = 'mtls'")
        for key, address in self.in_the_clear.items():
            if not self.insecure_listen:
                raise ConfigError(f"serve.{key} {address!r} is reachable from other hosts, and without TLS anyone on "
                                  "the way reads the people asked about, their scores and the token: give "
                                  "serve.certificate and serve.key, or listen on 127.0.0.1 behind your own TLS proxy "
                                  "(insecure_listen = true serves it in the clear there anyway, logged)")
        if self.max_request_bytes < 1024:
            raise ConfigError(f"serve.max_request_bytes: at least 1024, got {self.max_request_bytes}")
        if self.max_connections < 1:
            raise ConfigError(f"serve.max_connections: at least 1, got {self.max_connections}")
        if self.batch_people < 1:
            raise ConfigError(f"serve.batch_people: at least 1 person a batch, got {self.batch_people}")
        if not 0 <= self.batch_wait_ms <= 1000:
            raise ConfigError(f"serve.batch_wait_ms: 0 to 1000 ms, got {self.batch_wait_ms}")

    @property
    def in_the_clear(self) -> dict[str, str]:
        """The addresses (by key) it would serve without TLS where other hosts can reach them."""
        if self.certificate is not None:
            return {}
        return {key: address for key, address in (("listen", self.listen), ("grpc_listen", self.grpc_listen))
                if address and not is_loopback(address.rpartition(":")[0])}

    @property
    def host(self) -> str:
        return self.listen.rpartition(":")[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.listen.rpartition(":")[2])


@dataclass(frozen=True, kw_only=True)
class ServeConfig:
    """The whole file: ``[serve]``, ``[partners]`` (a simulation's partner rows), ``[models.NAME]``; relative
    paths start at the file's folder."""

    serve: ServeSettings
    partners: dict[str, str] = field(default_factory=dict)
    models: dict[str, ServePolicy] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.partners and self.serve.deploy:
            raise ConfigError("give the partners either as a deployment (serve.deploy) or as files in this process "
                              "([partners], a simulation), not both")


def load_serve_config(path: str | Path) -> ServeConfig:
    """Read and check a serve config; relative paths are made absolute from its folder."""
    path = Path(path)
    try:
        raw: dict[str, Any] = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"no serve config at {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from None
    unknown = sorted(set(raw) - {"serve", "partners", "models"})
    if unknown:
        raise ConfigError(f"{path}: a serve config has [serve], [partners] and [models.NAME], not {unknown}")
    base = path.resolve().parent

    def here(value: str | None) -> str | None:
        return None if value is None else str((base / value).resolve())

    serve = schema.build(ServeSettings, raw.get("serve"), where="serve")
    serve = replace(serve, models=str(here(serve.models)), rows=str(here(serve.rows)), deploy=here(serve.deploy),
                    token_file=str(here(serve.token_file or f"{path.stem}.token")),
                    admin_token_file=here(serve.admin_token_file), certificate=here(serve.certificate),
                    key=here(serve.key), client_ca=here(serve.client_ca))
    partners = raw.get("partners") or {}
    if not isinstance(partners, dict) or not all(isinstance(v, str) for v in partners.values()):
        raise ConfigError("[partners]: each partner's name = the file of its rows to score")
    models = {str(name): schema.build(ServePolicy, table, where=f"models.{name}")
              for name, table in (raw.get("models") or {}).items()}
    return ServeConfig(serve=serve, partners={k: str(here(v)) for k, v in partners.items()}, models=models)


def access_of(settings: ServeSettings) -> Access:
    """Who may call the server its settings describe: the clients' token read (written first where none is), the
    admin token where one is named; the weaker choices logged."""
    token = None
    if settings.auth == "token":
        token = read_token(Path(settings.token_file), create=True, what="serve token")
    elif settings.auth == "none":
        logger.warning("vflo serve asks callers for nothing (auth = 'none'): whoever reaches %s can ask for any "
                       "person's scores", settings.listen)
    for address in settings.in_the_clear.values():  # only with insecure_listen: refused otherwise
        logger.warning("vflo serve listens on %s in the clear (insecure_listen = true): the people asked about, "
                       "their scores and the token cross the network unencrypted", address)
    admin = None if settings.admin_token_file is None else \
        read_token(Path(settings.admin_token_file), create=True, what="serve admin token")
    return Access(token=token, admin_token=admin, max_request_bytes=settings.max_request_bytes)
