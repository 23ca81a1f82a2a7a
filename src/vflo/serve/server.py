"""A serve config made into a running server: its models live, its partners reached, its API served."""

from __future__ import annotations

import asyncio
import gc
import logging
import ssl
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from vflo.artifacts import CARD, ModelCard
from vflo.errors import ConfigError, VfloError
from vflo.party.node import MAX_SCORING_SESSIONS
from vflo.scoring import SavedModel
from vflo.serve.app import Served
from vflo.serve.config import ServeConfig, access_of
from vflo.serve.live import LiveModel, ServePolicy
from vflo.serve.sessions import Opener, deployed, in_process, load_live

logger = logging.getLogger(__name__)

#: Collaborative models a deployment serves at once: a partner keeps MAX_SCORING_SESSIONS sessions open per
#: coordinator, and a model being swapped holds two (the version answering and the next).
COLLABORATIVE = MAX_SCORING_SESSIONS // 2


def saved_labels(folder: str | Path) -> list[str]:
    """The labels of the models saved under ``folder`` (a folder given to --save)."""
    labels = sorted(p.parent.name for p in Path(folder).glob(f"*/{CARD}"))
    if not labels:
        raise ConfigError(f"no model saved under {folder} (no */{CARD}): train with --save there first")
    return labels


def served_from(config: ServeConfig) -> Served:
    """Every model the config names (every saved one where it names none) made live, with its batcher."""
    folder = config.serve.models
    labels = saved_labels(folder)
    names = list(config.models) or labels
    policies = dict(config.models)
    for name in list(names):  # each challenger is served too, with its own [models.LABEL] or its model's policy
        champion = policies.get(name, ServePolicy())
        if champion.challenger is None:
            continue
        if champion.challenger == name:
            raise ConfigError(f"[models.{name}] names itself as its challenger: name another saved model")
        own = policies.setdefault(champion.challenger, replace(champion, challenger=None, challenger_share=0.0))
        if own.challenger is not None:
            raise ConfigError(f"{champion.challenger}, the challenger of {name}, has a challenger of its own: an A/B "
                              "test has two models")
        if champion.challenger not in names:
            names.append(champion.challenger)
    unknown = [n for n in names if n not in labels]
    if unknown:
        raise ConfigError(f"[models] names {unknown}, not saved under {folder}; saved: {labels}")

    def admit(name: str, served: list[str]) -> None:
        # From the cards alone: each model's parts are read (and checked) once, when it is loaded.
        together = [n for n in dict.fromkeys([*served, name])
                    if ModelCard.read(Path(folder) / n).inference != "active_only"]
        if config.serve.deploy and len(together) > COLLABORATIVE:
            raise ConfigError(f"the partners of a deployment keep {MAX_SCORING_SESSIONS} scoring sessions open at "
                              f"once, two for each model served with them (its version and the next while it is "
                              f"swapped): serve at most {COLLABORATIVE} of {together} with them (an A/B test; the "
                              "active-only models beside them need no partner)")

    admit(names[0], names)
    opener: Opener | None = deployed(config.serve.deploy) if config.serve.deploy else \
        in_process(config.partners) if config.partners else None

    def load(name: str) -> LiveModel:
        # Read again from the folder each time: a model saved again since is the new version (or a new one).
        policy = policies.get(name, ServePolicy())
        saved = {label: SavedModel.load(folder, label) for label in saved_labels(folder)
                 if label in (name, policy.fallback)}
        live = load_live(saved, name, rows=config.serve.rows, policy=policy, session=opener)
        for champion, other in policies.items():
            if other.challenger == name and champion in labels:
                theirs = SavedModel.load(folder, champion).score_columns
                if theirs != live.model.score_columns:
                    live.close()
                    raise ConfigError(f"{name} scores {live.model.score_columns}, {champion} {theirs}: a challenger "
                                      "answers the same question as the model it is tested against")
        return live

    def on_disk(name: str) -> str | None:
        try:
            return str(ModelCard.read(Path(folder) / name).model_id)
        except (OSError, VfloError):  # being written, or removed: the live version keeps answering
            return None

    return Served(load, names, max_people=config.serve.batch_people, max_wait=config.serve.batch_wait_ms / 1000,
                  on_disk=on_disk, admit=admit)


def serve_forever(config: ServeConfig) -> None:
    """Serve until interrupted (uvicorn's own signal handling)."""
    import uvicorn

    from vflo.serve.app import create_app

    settings = config.serve
    access = access_of(settings)  # before any model loads: a bad token file fails at once
    tls: dict[str, Any] = {}
    if settings.certificate is not None:
        tls = {"ssl_certfile": settings.certificate, "ssl_keyfile": settings.key}
    if settings.auth == "mtls":
        tls |= {"ssl_ca_certs": settings.client_ca, "ssl_cert_reqs": ssl.CERT_REQUIRED}
    served = served_from(config)
    # What was loaded (models, tables, sessions) stays for the server's life: out of the collector's sight, so that
    # its full collections, which would walk it all, do not stall a request now and then.
    gc.collect()
    gc.freeze()
    on_start = None
    if settings.grpc_listen:
        from vflo.serve.grpc_api import start_grpc

        def on_start(loop: asyncio.AbstractEventLoop) -> Callable[[], None]:
            return start_grpc(served, loop, settings, access)

    try:
        uvicorn.run(create_app(served, access=access, watch_seconds=settings.watch_seconds, on_start=on_start),
                    host=settings.host, port=settings.port, log_level="warning", workers=1,
                    limit_concurrency=settings.max_connections, **tls)
    finally:
        served.close()
