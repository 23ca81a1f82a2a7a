"""``vflo serve``'s config: where it listens, which saved models it serves and how, the active party's own
feature table, and its partners (deployed, or their files in this process for a simulation).

    [serve]
    listen = "127.0.0.1:8080"
    models = "runs/quickstart/models"     # a folder given to --save
    rows = "data/bank_to_score.csv"       # the active party's own rows, read once into memory
    deploy = "deploy.toml"                # partners serving their saved parts (vflo party serve ... --save DIR)
    batch_people = 64                     # a micro-batch closes at this many people ...
    batch_wait_ms = 2.0                   # ... or this long after its first request

    [partners]                            # instead of deploy: each partner's rows, all in this process
    lab = "data/lab_to_score.csv"

    [models.splitnn]                      # every model served, with how it answers (vflo.serve.live.ServePolicy)
    missing = "subset"
    deadline_ms = 50
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vflo import schema
from vflo.errors import ConfigError
from vflo.serve.live import ServePolicy


@dataclass(frozen=True, kw_only=True)
class ServeSettings:
    """``[serve]``."""

    models: str
    rows: str
    listen: str = "127.0.0.1:8080"
    deploy: str | None = None
    batch_people: int = 64
    batch_wait_ms: float = 2.0

    def __post_init__(self) -> None:
        host, _, port = self.listen.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"serve.listen is HOST:PORT (e.g. 127.0.0.1:8080), got {self.listen!r}")
        if self.batch_people < 1:
            raise ConfigError(f"serve.batch_people: at least 1 person a batch, got {self.batch_people}")
        if not 0 <= self.batch_wait_ms <= 1000:
            raise ConfigError(f"serve.batch_wait_ms: 0 to 1000 ms, got {self.batch_wait_ms}")

    @property
    def host(self) -> str:
        return self.listen.rpartition(":")[0]

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
    serve = ServeSettings(models=str(here(serve.models)), rows=str(here(serve.rows)), listen=serve.listen,
                          deploy=here(serve.deploy), batch_people=serve.batch_people,
                          batch_wait_ms=serve.batch_wait_ms)
    partners = raw.get("partners") or {}
    if not isinstance(partners, dict) or not all(isinstance(v, str) for v in partners.values()):
        raise ConfigError("[partners]: each partner's name = the file of its rows to score")
    models = {str(name): schema.build(ServePolicy, table, where=f"models.{name}")
              for name, table in (raw.get("models") or {}).items()}
    return ServeConfig(serve=serve, partners={k: str(here(v)) for k, v in partners.items()}, models=models)
