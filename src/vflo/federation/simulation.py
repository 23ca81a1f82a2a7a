"""Run one method on one scenario split, every party a separate node, in this process."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vflo.align.protocol import ALIGNMENT
from vflo.artifacts import CheckpointStore, ModelCard, PartStore, Preprocessing, new_model_id
from vflo.comm.faults import FaultPlan
from vflo.comm.ledger import Ledger, LedgerSummary
from vflo.comm.local import LocalTransport, Observer
from vflo.data.partydata import PartyData
from vflo.data.scenario import FederatedData
from vflo.dp import PrivacyBudget
from vflo.errors import MethodError
from vflo.federation.coordinator import AlignmentConfig, Federation
from vflo.federation.node import Node
from vflo.federation.policy import Policy
from vflo.methods.base import Method
from vflo.methods.own_settings import party_section
from vflo.methods.registry import method_for_party
from vflo.nn.train import CheckpointPlan
from vflo.roles import PartyInfo, Role
from vflo.seeding import PartySecret, derive_seed


@dataclass(frozen=True, eq=False)
class RunOutput:
    """Scores for the test IDs, the ledger of what crossed, and how long each phase took."""

    scores: np.ndarray
    ledger: Ledger
    fit_seconds: float
    predict_seconds: float
    rounds: int
    fit_entries: int
    stats: dict[str, float]
    # What each party ran of its own side where its config differs from the proposal (setting -> value).
    party_settings: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def fit_summary(self) -> LedgerSummary:
        """Traffic of training alone (setup and fit), without scoring."""
        return self.ledger.summary(0, self.fit_entries)

    @property
    def predict_summary(self) -> LedgerSummary:
        return self.ledger.summary(self.fit_entries)


def party_node(info: PartyInfo, data: PartyData | None = None, serving: PartyData | None = None, *,
               peers: Mapping[str, Role] | Sequence[PartyInfo], policy: Policy | None = None,
               store: PartStore | None = None, checkpoints: CheckpointStore | None = None,
               secret: PartySecret | None = None, budget: PrivacyBudget | None = None,
               settings: Mapping[str, Mapping[str, Any]] | None = None, idle_run_seconds: float = 600.0) -> Node:
    """A node that serves every registered method and alignment: what each party runs. ``peers``: the other
    parties and their roles as this party knows them (a mapping, or every party of the federation); ``secret``:
    its own randomness (the OS's unless given); ``budget``: its privacy budget; ``settings``: its own side of each
    method, by method name (its config's ``[methods.NAME]``)."""
    if not isinstance(peers, Mapping):
        peers = {p.name: p.role for p in peers if p.name != info.name}
    return Node(info, data, serving, peers=peers, policy=policy, methods=method_for_party, protocols=(ALIGNMENT,),
                store=store, checkpoints=checkpoints, secret=secret, budget=budget, settings=settings,
                idle_run_seconds=idle_run_seconds)


def own_sections(method: Method, role: str) -> dict[str, dict[str, Any]]:
    """A party's own config in simulation: its role's section of the one experiment config, as an export writes
    it into that party's PARTY.toml."""
    return {method.name: party_section(type(method), role, method.config_json())}


def party_secret(seed: int, party: str, party_seeds: Mapping[str, int] | None = None) -> PartySecret:
    """A party's own secret in simulation: its seed in ``party_seeds`` (as a deployed party's own config gives
    it, so both runs draw the same numbers), else one derived from the run seed and its name, here in the
    harness. The coordinator's setup message never carries it."""
    if party_seeds is not None and party in party_seeds:
        return PartySecret(party_seeds[party])
    return PartySecret(derive_seed(seed, "party-secret", party))


def preprocessing_of(data: FederatedData, party: str) -> Preprocessing | None:
    """What ``party`` did to its raw table before training (columns, file encoding, standardisation)."""
    if party not in data.train:
        return None
    return Preprocessing(columns=data.train[party].columns, encoding=data.encodings.get(party),
                         scaler=data.scalers.get(party))


def save_model(fed: Federation, nodes: Mapping[str, Node], method: Method, data: FederatedData, folder: Path,
               *, label: str | None = None) -> ModelCard:
    """Every party writes its own part of ``method`` (fitted over ``fed``) under ``folder/LABEL/PARTY``.

    In one process each node gets a store in that folder; the coordinator's part is its state, the others'
    arrive by ``control.save`` messages as in a deployment, and the model card records each manifest's
    checksum so a part swapped later is noticed when the model is loaded.
    """
    label = label or method.name
    model_id = new_model_id()
    for name, node in nodes.items():
        node.store = PartStore(folder, party=name, role=node.info.role, preprocessing=preprocessing_of(data, name))
    own = nodes[fed.party].store
    assert own is not None
    manifests = {fed.party: own.save(label=label, method=method.name, config=method.config_json(),
                                     model_id=model_id, state=fed.own_part(method))}
    manifests |= fed.save_parts(label, model_id)
    card = ModelCard(label=label, method=method.name, config=method.config_json(), model_id=model_id, seed=fed.seed,
                     task=fed.task, n_classes=fed.n_classes, classes=tuple(data.classes), active=fed.party,
                     parties=tuple((p.name, p.role) for p in fed.parties), inference=method.inference,
                     manifests=manifests)
    card.write(folder / label)
    return card


def build_federation(
    data: FederatedData, method: Method, *, seed: int, ledger: Ledger | None = None,
    max_message_bytes: int | None = None, observers: tuple[Observer, ...] = (), faults: FaultPlan | None = None,
    alignment: AlignmentConfig | None = None, checkpoints: Path | None = None,
    party_seeds: Mapping[str, int] | None = None, party_config: Method | None = None,
) -> tuple[Federation, dict[str, Node]]:
    """One node per party built from that party's data only, joined by a :class:`LocalTransport`; with
    ``checkpoints``, each party keeps its own checkpoints in its own subfolder of that folder. Each node draws
    its secrets from its own seed (``party_seeds``, else derived from ``seed`` and its name) and sets its own side
    of the method as ``method`` does (or as ``party_config`` does: parties whose configs say other than what the
    coordinator proposes)."""
    def stores(p: PartyInfo) -> CheckpointStore | None:
        return None if checkpoints is None else CheckpointStore(checkpoints, party=p.name, role=p.role)

    extras: tuple[PartyInfo, ...] = method.extra_parties(data.parties)
    parties = (*data.parties, *extras)
    nodes = {p.name: party_node(p, data.train.get(p.name), data.serve.get(p.name), peers=parties,
                                checkpoints=stores(p), secret=party_secret(seed, p.name, party_seeds),
                                settings=own_sections(party_config or method, p.role))
             for p in data.parties}
    for info in extras:
        if info.name in nodes:
            raise MethodError(f"{method.name} adds a party named {info.name!r}, but a data party has that name")
        nodes[info.name] = party_node(info, peers=parties, checkpoints=stores(info),
                                      secret=party_secret(seed, info.name, party_seeds))
    transport = LocalTransport(nodes, ledger=ledger, max_message_bytes=max_message_bytes, observers=observers,
                               faults=faults)
    oracle = data.oracle if method.simulation_only else None
    fed = Federation(
        node=nodes[data.active], transport=transport, parties=parties, seed=seed, task=data.task,
        n_classes=data.n_classes, oracle=oracle, alignment=alignment,
    )
    return fed, nodes


def run_method(
    method: Method, data: FederatedData, *, seed: int, max_message_bytes: int | None = None,
    observers: tuple[Observer, ...] = (), on_fitted: Callable[[Federation], None] | None = None,
    faults: FaultPlan | None = None, alignment: AlignmentConfig | None = None, save: tuple[Path, str] | None = None,
    checkpoint: tuple[Path, CheckpointPlan] | None = None, party_seeds: Mapping[str, int] | None = None,
    party_config: Method | None = None, fallback: np.ndarray | None = None,
) -> RunOutput:
    """Fit ``method`` and score the test IDs, all over a fresh in-process federation; with ``save`` (a folder
    and a label) every party also writes its part of the fitted model there; with ``checkpoint`` (a folder and
    a plan) training keeps checkpoints there and may resume from them. ``fallback``: another method's scores of
    every test ID, used for those a partner the method scores with does not hold (stat ``fallback_rows``)."""
    method.check_task(data.task)
    fed, nodes = build_federation(data, method, seed=seed, max_message_bytes=max_message_bytes, observers=observers,
                                  faults=faults, alignment=alignment,
                                  checkpoints=None if checkpoint is None else checkpoint[0], party_seeds=party_seeds,
                                  party_config=party_config)
    if checkpoint is not None:
        fed.checkpoint = checkpoint[1]
    fed.setup(method)
    t0 = time.perf_counter()
    method.fit(fed)
    fed.flush()
    t1 = time.perf_counter()
    fit_entries = len(fed.transport.ledger)
    if on_fitted is not None:
        on_fitted(fed)
    if save is not None:
        save_model(fed, nodes, method, data, save[0], label=save[1])
    stats = method.summary_stats()
    if fallback is None:
        scores = method.predict(fed, data.test_ids) if len(data.test_ids) else np.empty((0,))
    else:
        covered = held_by_all(data.serve, method.scoring_parties(data.parties), data.test_ids)
        scores = np.array(fallback, dtype=np.float64, copy=True)
        if covered.any():
            scores[covered] = method.predict(fed, data.test_ids[covered])
        stats["fallback_rows"] = float((~covered).sum())
    t2 = time.perf_counter()
    fed.teardown()
    return RunOutput(
        scores=scores, ledger=fed.transport.ledger, fit_seconds=t1 - t0, predict_seconds=t2 - t1, rounds=fed.rounds,
        fit_entries=fit_entries, stats=stats, party_settings=fed.party_settings,
    )


def held_by_all(rows: Mapping[str, PartyData], parties: Sequence[str], ids: np.ndarray) -> np.ndarray:
    """Which of ``ids`` every one of ``parties`` holds among its rows to score (``rows``: each party's; one
    without rows holds none)."""
    keep = np.ones(len(ids), dtype=bool)
    for party in parties:
        served = rows.get(party)
        keep &= served.contains(ids) if served is not None else False
    return keep
