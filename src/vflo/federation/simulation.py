"""Run one method on one scenario split, every party a separate node, in this process (the lifecycle is a
:class:`~vflo.federation.session.Session`'s, as in a deployment)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vflo.align.blind_join import EXPLORE
from vflo.align.engines import AlignmentConfig
from vflo.align.kept import AlignmentStore
from vflo.align.protocol import ALIGNMENT
from vflo.artifacts import CheckpointStore, ModelCard, PartStore, Preprocessing, new_model_id
from vflo.comm.faults import FaultPlan
from vflo.comm.ledger import Ledger
from vflo.comm.local import LocalTransport, Observer
from vflo.data.layout import FederatedData
from vflo.data.partydata import PartyData
from vflo.dp import PrivacyBudget
from vflo.errors import MethodError
from vflo.executor import Executor
from vflo.federation.coordinator import Coordinator
from vflo.federation.session import RunOutput, Session
from vflo.methods.base import Method
from vflo.methods.own_settings import party_section
from vflo.methods.registry import method_for_party
from vflo.nn.train import CheckpointPlan
from vflo.party.asked import AskedLog
from vflo.party.context import PartStoreLike
from vflo.party.node import Node
from vflo.party.policy import Policy
from vflo.roles import PartyInfo, Role
from vflo.seeding import PartySecret, derive_seed
from vflo.spill import SpillConfig

#: A simulated party's policy where none is given: as a deployed party's default, but answering plain alignment,
#: which in one process shows the coordinator's IDs to no one outside it. A deployed party always has its own
#: config's policy, whose default refuses plain alignment.
IN_PROCESS = Policy(alignment="plain")


def party_node(info: PartyInfo, data: PartyData | None = None, serving: PartyData | None = None, *,
               peers: Mapping[str, Role] | Sequence[PartyInfo], policy: Policy | None = None,
               store: PartStore | None = None, checkpoints: CheckpointStore | None = None,
               secret: PartySecret | None = None, budget: PrivacyBudget | None = None,
               settings: Mapping[str, Mapping[str, Any]] | None = None, idle_run_seconds: float = 600.0,
               alignments: AlignmentStore | None = None, privacy_journal: Path | None = None,
               executor: Executor | None = None, spill: SpillConfig | None = None,
               asked: AskedLog | None = None) -> Node:
    """A node that serves every registered method and alignment: what each party runs. ``peers``: the other
    parties and their roles as this party knows them (a mapping, or every party of the federation); ``secret``:
    its own randomness (the OS's unless given); ``budget``: its privacy budget; ``settings``: its own side of each
    method, by method name (its config's ``[methods.NAME]``); ``alignments``: where it keeps its private set
    intersections to reuse them (none in simulation unless given); ``policy``: its own (:data:`IN_PROCESS` unless
    given); ``privacy_journal``: the file its privacy account is kept in across restarts (none unless given);
    ``executor`` and ``spill``: where its bulk work runs and when it spills (the process's defaults unless given);
    ``asked``: its record of who asked about which of its people (none unless given)."""
    if not isinstance(peers, Mapping):
        peers = {p.name: p.role for p in peers if p.name != info.name}
    return Node(info, data, serving, peers=peers, policy=policy if policy is not None else IN_PROCESS,
                methods=method_for_party, protocols=(*ALIGNMENT, *EXPLORE),
                store=store, checkpoints=checkpoints, secret=secret, budget=budget, settings=settings,
                idle_run_seconds=idle_run_seconds, alignments=alignments, privacy_journal=privacy_journal,
                executor=executor, spill=spill, asked=asked)


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
    return PartySecret(simulated_seed(seed, party))


def simulated_seed(seed: int, party: str) -> int:
    """The seed a party's secrets come from in simulation, where none is given: derived from the run seed and its
    name. An export writes it into the party's config (``seed = ...``), so the deployment draws the same numbers;
    anyone who knows the run seed can derive it, so it is for rehearsals, not real data."""
    return derive_seed(seed, "party-secret", party)


def preprocessing_of(data: FederatedData, party: str) -> Preprocessing | None:
    """What ``party`` did to its raw table before training (columns, file encoding, standardisation)."""
    if party not in data.train:
        return None
    return Preprocessing(columns=data.train[party].columns, encoding=data.encodings.get(party),
                         scaler=data.scalers.get(party), dropped=tuple(data.dropped.get(party, ())))


def give_stores(nodes: Mapping[str, Node], data: FederatedData, folder: Path) -> None:
    """Each node a folder for its own model parts under ``folder`` (as ``vflo party serve --save`` gives one)."""
    for name, node in nodes.items():
        node.store = PartStore(folder, party=name, role=node.info.role, preprocessing=preprocessing_of(data, name))


def save_model(session: Session, nodes: Mapping[str, Node], method: Method, data: FederatedData, folder: Path,
               *, label: str | None = None) -> ModelCard:
    """Every party writes its own part of ``method`` (fitted over the session's federation) under
    ``folder/LABEL/PARTY``, each node into the store :func:`give_stores` gave it.

    In one process each node gets a store in that folder; the coordinator's part is its state, the others'
    arrive by ``control.save`` messages as in a deployment, and the model card records each manifest's
    checksum so a part swapped later is noticed when the model is loaded.
    """
    own = nodes[session.fed.party].store
    assert own is not None, "give the nodes their stores first (give_stores)"
    return write_model(session, own, method, folder, label=label or method.name, classes=tuple(data.classes))


def write_model(session: Session, own: PartStoreLike, method: Method, folder: Path, *, label: str,
                classes: tuple[str, ...]) -> ModelCard:
    """The coordinating party's part (into ``own``) and every other party's (each into its own folder, by
    ``control.save``), then the model card in ``folder/LABEL`` with each part's manifest checksum: how a model
    is saved in one process and over a deployment alike."""
    fed = session.fed
    model_id = new_model_id()
    manifests = {fed.party: own.save(label=label, method=method.name, config=method.config_json(),
                                     model_id=model_id, state=session.own_part(method))}
    manifests |= session.save_parts(label, model_id)
    card = ModelCard(label=label, method=method.name, config=method.config_json(), model_id=model_id, seed=fed.seed,
                     task=fed.task, n_classes=fed.n_classes, classes=classes, active=fed.party,
                     parties=tuple((p.name, p.role) for p in fed.parties), inference=method.inference,
                     manifests=manifests)
    card.write(folder / label)
    return card


def build_federation(
    data: FederatedData, method: Method, *, seed: int, ledger: Ledger | None = None,
    max_message_bytes: int | None = None, observers: tuple[Observer, ...] = (), faults: FaultPlan | None = None,
    alignment: AlignmentConfig | None = None, checkpoints: Path | None = None,
    party_seeds: Mapping[str, int] | None = None, party_config: Method | None = None,
    alignments: Mapping[str, AlignmentStore] | None = None, policies: Mapping[str, Policy] | None = None,
    budgets: Mapping[str, PrivacyBudget] | None = None,
) -> tuple[Coordinator, dict[str, Node]]:
    """One node per party built from that party's data only, joined by a :class:`LocalTransport`; with
    ``checkpoints``, each party keeps its own checkpoints in its own subfolder of that folder. Each node draws
    its secrets from its own seed (``party_seeds``, else derived from ``seed`` and its name) and sets its own side
    of the method as ``method`` does (or as ``party_config`` does: parties whose configs say other than what the
    coordinator proposes). ``alignments``: the parties that keep their private set intersections, and where;
    ``policies``: parties' own policies (:class:`~vflo.party.policy.Policy`; the default elsewhere); ``budgets``:
    parties' own privacy budgets (none elsewhere: nothing leaves the process)."""
    def stores(p: PartyInfo) -> CheckpointStore | None:
        return None if checkpoints is None else CheckpointStore(checkpoints, party=p.name, role=p.role)

    extras: tuple[PartyInfo, ...] = method.extra_parties(data.parties)
    parties = (*data.parties, *extras)
    nodes = {p.name: party_node(p, data.train.get(p.name), data.serve.get(p.name), peers=parties,
                                checkpoints=stores(p), secret=party_secret(seed, p.name, party_seeds),
                                settings=own_sections(party_config or method, p.role),
                                alignments=(alignments or {}).get(p.name), policy=(policies or {}).get(p.name),
                                budget=(budgets or {}).get(p.name))
             for p in data.parties}
    for info in extras:
        if info.name in nodes:
            raise MethodError(f"{method.name} adds a party named {info.name!r}, but a data party has that name")
        nodes[info.name] = party_node(info, peers=parties, checkpoints=stores(info),
                                      secret=party_secret(seed, info.name, party_seeds),
                                      policy=(policies or {}).get(info.name))
    transport = LocalTransport(nodes, ledger=ledger, max_message_bytes=max_message_bytes, observers=observers,
                               faults=faults)
    oracle = data.oracle if method.simulation_only else None
    fed = Coordinator(
        node=nodes[data.active], transport=transport, parties=parties, seed=seed, task=data.task,
        n_classes=data.n_classes, oracle=oracle, alignment=alignment,
    )
    return fed, nodes


def run_method(
    method: Method, data: FederatedData, *, seed: int, max_message_bytes: int | None = None,
    observers: tuple[Observer, ...] = (), on_fitted: Callable[[Coordinator], None] | None = None,
    faults: FaultPlan | None = None, alignment: AlignmentConfig | None = None, save: tuple[Path, str] | None = None,
    checkpoint: tuple[Path, CheckpointPlan] | None = None, party_seeds: Mapping[str, int] | None = None,
    party_config: Method | None = None, fallback: np.ndarray | None = None,
    alignments: Mapping[str, AlignmentStore] | None = None, policies: Mapping[str, Policy] | None = None,
    budgets: Mapping[str, PrivacyBudget] | None = None,
) -> RunOutput:
    """Fit ``method`` and score the test IDs, all over a fresh in-process federation; with ``save`` (a folder
    and a label) every party also writes its part of the fitted model there; with ``checkpoint`` (a folder and
    a plan) training keeps checkpoints there and may resume from them. ``fallback``: another method's scores of
    every test ID, used for those a partner the method scores with does not hold (stat ``fallback_rows``).
    ``budgets``: parties' own privacy budgets (a protecting one calibrates its side or refuses the run at setup)."""
    fed, nodes = build_federation(data, method, seed=seed, max_message_bytes=max_message_bytes, observers=observers,
                                  faults=faults, alignment=alignment,
                                  checkpoints=None if checkpoint is None else checkpoint[0], party_seeds=party_seeds,
                                  party_config=party_config, alignments=alignments, policies=policies,
                                  budgets=budgets)

    def scored(fed: Coordinator) -> tuple[np.ndarray, dict[str, float]]:
        assert fallback is not None
        covered = held_by_all(data.serve, method.scoring_parties(data.parties), data.test_ids)
        scores = np.array(fallback, dtype=np.float64, copy=True)
        if covered.any():
            scores[covered] = method.predict(fed, data.test_ids[covered])
        return scores, {"fallback_rows": float((~covered).sum())}

    if save is not None:  # before setup, as deployed parties have theirs: each checks it can save before training
        give_stores(nodes, data, save[0])
    return Session(fed).run(
        method, data.test_ids, checkpoint=None if checkpoint is None else checkpoint[1], on_fitted=on_fitted,
        save=None if save is None else lambda session: save_model(session, nodes, method, data, save[0],
                                                                 label=save[1]),
        score=None if fallback is None else scored)


def held_by_all(rows: Mapping[str, PartyData], parties: Sequence[str], ids: np.ndarray) -> np.ndarray:
    """Which of ``ids`` every one of ``parties`` holds among its rows to score (``rows``: each party's; one
    without rows holds none)."""
    keep = np.ones(len(ids), dtype=bool)
    for party in parties:
        served = rows.get(party)
        keep &= served.contains(ids) if served is not None else False
    return keep
