"""The ServerApp that coordinates a vflo experiment over Flower, and the ClientApp every party's SuperNode runs.

``flwr run examples/flower FEDERATION --run-config "experiment='...' deploy='...' out='...'"`` starts
:data:`server_app` where the SuperLink runs: the active party's host, since the coordinator is the active
party and reads its own data there. It finds which SuperNode serves which party, runs the experiment's
methods as ``vflo run --deploy`` does (the same checks before training, the same results and report), and
writes them to ``out``. With ``model='...' data='...'`` instead of ``experiment``, it scores the rows with a
saved model as ``vflo predict --deploy`` does (``missing``, ``deadline``, ``fallback``, ``method``: its
options), by the same code (:func:`vflo.deploy.score_deployed`), and writes the scores to ``out``.
:data:`client_app` is the stateless adapter of :mod:`vflo.flower.adapter`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from vflo import schema
from vflo.comm.seal import Keyring
from vflo.comm.transport import Transport
from vflo.data.partydata import PartyData
from vflo.deploy import DeployConfig, Deployment, Link, load_deploy_config, score_deployed
from vflo.errors import ConfigError
from vflo.experiments.config import load_deployment_experiment
from vflo.experiments.deployed import run_and_write
from vflo.experiments.output import check_out_dir
from vflo.flower.adapter import client_app
from vflo.flower.transport import FlowerGrid, FlowerTransport, discover
from vflo.flower.worker import keyring_for
from vflo.methods.base import Method
from vflo.party.node import Node
from vflo.scoring import Missing, SavedModel

logger = logging.getLogger(__name__)

__all__ = ["FlowerRun", "client_app", "connect", "flower_link", "grid_link", "run_on_grid", "score_on_grid",
           "scoring_link", "server_app"]


@dataclass(frozen=True, kw_only=True)
class FlowerRun:
    """The run config ``flwr run`` hands the ServerApp (paths on the SuperLink's host, absolute or relative to
    the folder the SuperLink was started in)."""

    deploy: str
    out: str
    experiment: str = ""
    save: str = ""
    overwrite: bool = False
    connect_timeout: float = 120.0
    # Scoring with a saved model instead of training (``vflo predict --deploy``'s options; deadline 0: the deploy
    # config's).
    model: str = ""
    method: str = ""
    data: str = ""
    missing: Missing = "refuse"
    deadline: float = 0.0
    fallback: str = ""

    @classmethod
    def from_run_config(cls, run_config: dict[str, Any]) -> FlowerRun:
        settings = {k.replace("-", "_"): v for k, v in run_config.items()}
        scoring = bool(settings.get("model"))
        for key in ("model", "data", "deploy", "out") if scoring else ("experiment", "deploy", "out"):
            if not settings.get(key):
                example = ("model='runs/models' data='rows.csv' deploy='deploy.toml' out='scores.csv'" if scoring
                           else "experiment='EXPERIMENT.toml' deploy='deploy.toml' out='runs/NAME'")
                raise ConfigError(f"the Flower run config needs {key!r}: flwr run APP FEDERATION --run-config "
                                  f"\"{example}\"")
        if scoring and settings.get("experiment"):
            raise ConfigError("the Flower run config names both an experiment (to train) and a model (to score): "
                              "give one of them")
        return schema.build(cls, settings, "the Flower run config")


def flower_link(grid: Grid | FlowerGrid, nodes: dict[str, int], *, deadline: float,
                keyring: Keyring | None = None) -> Link:
    """How the coordinator's node reaches the others: a :class:`FlowerTransport` over ``grid``, sealing what it
    sends with ``keyring`` (this party's TLS keys) so that every party checks its certificate on every frame."""

    def link(node: Node) -> FlowerTransport:
        return FlowerTransport(grid, party=node.name, nodes=nodes, local=node, allowed=set(node.peers),
                               deadline=deadline, keyring=keyring)

    return link


def needed_parties(deploy: DeployConfig, methods: Sequence[Method]) -> list[str]:
    """The parties ``methods`` need besides the active one: every passive party, and their servers and dealers."""
    data = tuple(p for p in deploy.party_infos if p.holds_data)
    names = {p.name for p in data if p.role != "active"}
    for method in methods:
        names |= {p.name for p in method.extra_parties(data)}
    return [p.name for p in deploy.parties if p.name in names]


def grid_link(grid: Grid | FlowerGrid, deploy: DeployConfig, *, needed: Sequence[str] | None = None,
              optional: Sequence[str] = (), wait_optional: bool = False, timeout: float = 120.0,
              deadline: float | None = None) -> Link:
    """The active party's link over ``grid``: when its node starts, the parties are found on SuperNodes (at most
    ``timeout`` s): every one of ``needed`` (None: every party of the deploy config), and those of ``optional``
    that have connected (with ``wait_optional``: waited for too, up to ``timeout``, then left out).
    ``deadline`` bounds every request (default the deploy config's)."""
    keyring = keyring_for(deploy.active)
    deadline = deploy.active.deadline if deadline is None else deadline
    required = [p.name for p in deploy.parties] if needed is None else list(needed)
    others = [p for p in optional if p not in required]

    def link(node: Node) -> Transport:
        flower = grid if isinstance(grid, FlowerGrid) else FlowerGrid(grid, deadline=deadline)
        nodes = discover(flower, required, keyring=keyring, timeout=timeout, optional=others,
                         wait_optional=wait_optional)
        logger.info("parties on SuperNodes: %s", ", ".join(f"{p} = {n}" for p, n in nodes.items()) or "none")
        return flower_link(flower, nodes, deadline=deadline, keyring=keyring)(node)

    return link


def connect(grid: Grid, deploy: DeployConfig, *, timeout: float = 120.0, train: PartyData | None = None,
            test: PartyData | None = None, methods: Sequence[Method] | None = None) -> Deployment:
    """The active party's deployment over Flower: the other parties found on SuperNodes, then the node (with
    ``train`` / ``test``: these rows instead of the deploy config's files). With ``methods``, only the parties
    they need are waited for, as over vflo's gRPC a party no method uses is never contacted."""
    needed = None if methods is None else needed_parties(deploy, methods)
    rest = [p.name for p in deploy.parties if needed is not None and p.name not in needed]  # join if they are there
    return Deployment(deploy, train=train, test=test,
                      link=grid_link(grid, deploy, needed=needed, optional=rest, timeout=timeout))


def scoring_link(grid: Grid, deploy: DeployConfig, model: SavedModel, *, missing: Missing, deadline: float,
                 timeout: float) -> Link:
    """The active party's link for a scoring session over Flower: the model's partners found on SuperNodes when
    the session starts (``timeout``: how long to wait for them). With ``missing = "subset"`` none is required:
    whoever has connected by then takes part, and a partner that did not is absent, as one that does not answer
    over gRPC; ``deadline`` bounds every request."""
    partners = [] if model.active_only else model.card_partners()
    optional = missing == "subset"
    return grid_link(grid, deploy, needed=[] if optional else partners, optional=partners if optional else [],
                     wait_optional=optional, timeout=timeout, deadline=deadline)


def score_on_grid(grid: Grid, run: FlowerRun) -> pd.DataFrame:
    """What ``vflo predict MODEL --data ROWS --deploy DEPLOY`` does, over Flower: the scores in ``run.out`` (CSV:
    id, one column per class, prediction, model, scored_by), returned too."""
    out = Path(run.out)
    if out.exists() and not run.overwrite:
        raise ConfigError(f"{out} exists; give another out in the run config, or overwrite = true")
    deploy = load_deploy_config(run.deploy)
    model = SavedModel.load(run.model, run.method or None)
    fallback = SavedModel.load(run.model, run.fallback) if run.fallback else None
    deadline = run.deadline if run.deadline else None
    link = scoring_link(grid, deploy, model, missing=run.missing, timeout=run.connect_timeout,
                        deadline=deadline if deadline is not None else deploy.active.deadline)
    frame = score_deployed(deploy, model, run.data, missing=run.missing, fallback=fallback, deadline=deadline,
                           link=link)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    frame.to_csv(tmp, index=False)
    tmp.replace(out)
    by = frame["scored_by"].value_counts().to_dict()
    logger.info("scored %d rows with %s; scored by %s; written to %s", len(frame), model.label,
                ", ".join(f"{b} ({n})" for b, n in by.items()), out)
    return frame


def run_on_grid(grid: Grid, run: FlowerRun) -> list[dict[str, Any]]:
    """What ``vflo run EXPERIMENT --deploy DEPLOY`` does, over Flower: results and report in ``run.out``."""
    experiment = load_deployment_experiment(run.experiment)
    deploy = load_deploy_config(run.deploy)
    out, save = Path(run.out), Path(run.save) if run.save else None
    check_out_dir(out, overwrite=run.overwrite)
    if save is not None:
        check_out_dir(save, overwrite=run.overwrite)
    methods = [e.instantiate() for e in experiment.methods if not e.method_cls.simulation_only]
    deployment = connect(grid, deploy, timeout=run.connect_timeout, methods=methods)
    rows = run_and_write(experiment, deployment, out, overwrite=run.overwrite, save=save)
    for r in rows:
        if r["status"] == "failed":
            logger.error("%s failed: %s: %s", r["method"], r["error_type"], r["error"])
        else:
            logger.info("%s: %s; %.3f MB in %d training rounds", r["method"],
                        ", ".join(f"{k} = {r[k]:.4f}" for k in ("accuracy", "rmse") if k in r),
                        r["fit_bytes"] / 1e6, r["fit_rounds"])
    logger.info("results written to %s", out)
    return rows


server_app = ServerApp()


@server_app.main()
def _main(grid: Grid, context: Context) -> None:
    run = FlowerRun.from_run_config(dict(context.run_config))
    if run.model:
        score_on_grid(grid, run)
    else:
        run_on_grid(grid, run)
