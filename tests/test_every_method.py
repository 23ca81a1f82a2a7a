"""The checks every registered method passes, parametrised over the registry (as scikit-learn's
``parametrize_with_checks``): a new method is held to them by its registry line alone.

Each reads only what the method says of itself (its tags: ``quick``, ``inference``, ``label_only_active``, its
claims and variants, its layouts) and the registry. The multi-process equivalence (in process = every party its
own process over gRPC with mutual TLS) is in ``tests/e2e/test_processes.py``, over the same registry.
"""

from __future__ import annotations

import dataclasses
import gc
import types
from pathlib import Path

import numpy as np
import pytest

import vflo
from tests.test_artifacts import raw_rows
from tests.test_audit import audit, observed
from tests.test_methods import data_for, quick
from vflo.data.partydata import PartyData
from vflo.federation.coordinator import AlignmentConfig
from vflo.federation.session import Session
from vflo.federation.simulation import build_federation, run_method
from vflo.methods.base import Method
from vflo.methods.registry import get_method, method_names

EVERY = method_names()
DEPLOYABLE = [m for m in EVERY if not get_method(m).simulation_only]


@pytest.mark.parametrize("name", EVERY)
def test_it_describes_itself(name: str) -> None:
    """Its paper, its settings (a frozen keyword-only dataclass its quick settings build), and tags that agree
    with each other: what the comparison, scoring, the CLI and the audit read of it."""
    cls = get_method(name)
    assert cls.name == name and cls.__doc__ and cls.summary and cls.paper
    assert dataclasses.is_dataclass(cls.Config) and cls.Config.__dataclass_params__.frozen  # type: ignore[attr-defined]
    assert all(f.kw_only for f in dataclasses.fields(cls.Config))
    method = cls(**cls.quick)
    assert isinstance(method, Method) and type(cls.from_config_json(method.config_json())) is cls
    if cls.any_subset or cls.subset_when:
        assert cls.inference == "collaborative", "only a collaborative method scores with a subset of partners"
    labels = {*EVERY, *(label for m in EVERY for label in get_method(m).variants)}
    for claim in cls.claims:
        assert {claim.method or name, claim.against} <= labels, f"{claim.text}: names no registered method"
    for settings in cls.variants.values():
        cls(**settings)  # a variant's settings are the method's own
    for info, _ in cls.handler_table().values():
        assert info.served.strip(), f"{info.kind}: say when a party serves it (@handles(served=...))"
    for layout in ("star", "second_hop", "missing"):
        assert isinstance(cls.layout_settings(layout, first_hop="p1", second_hop="p2"), (dict, str))  # type: ignore[arg-type]


@pytest.mark.parametrize("name", EVERY)
def test_a_quick_fit_scores_every_test_row_and_same_seeds_give_the_same_numbers(name: str) -> None:
    data = data_for(name)
    first = run_method(quick(name), data, seed=3)
    again = run_method(quick(name), data, seed=3)
    assert len(first.scores) == len(data.test_ids) and np.isfinite(first.scores).all()
    assert np.array_equal(first.scores, again.scores)
    assert [e.nbytes for e in first.ledger.entries] == [e.nbytes for e in again.ledger.entries]


@pytest.mark.parametrize("name", DEPLOYABLE)
def test_the_coordinator_cannot_reach_another_party_data(name: str) -> None:
    """From the fitted method and the coordinator, only the active party's data is reachable.

    The transport is the one object that links the in-process nodes (as a network would);
    everything a method keeps must be reachable without passing through it.
    """
    from vflo.comm.transport import Transport
    from vflo.party.node import Node

    data = data_for(name)
    method = quick(name)
    fed, nodes = build_federation(data, method, seed=0)
    Session(fed).start(method)
    method.fit(fed)
    others = [n for n in nodes.values() if n.name != data.active]
    reachable = _reachable([method, fed], stop=(Transport,))
    found = {o.party for o in reachable if isinstance(o, PartyData)}
    assert found <= {data.active}
    # and no array of another party's raw features is held anywhere the coordinator can reach
    raw = {id(n._data.X) for n in others if n._data is not None}
    assert not any(id(o) in raw for o in reachable)
    assert not any(o is n for o in reachable for n in others if isinstance(o, Node))


def _reachable(roots: list[object], stop: tuple[type, ...]) -> list[object]:
    """What ``roots`` hold, through attributes, containers and closures: not through a function's module globals
    (nor modules and classes), which lead to the whole process, the test runner's fixtures of other tests
    included, and say nothing about what a method keeps."""
    seen: dict[int, object] = {}
    todo = list(roots)
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, (*stop, type, types.ModuleType)):
            continue
        seen[id(obj)] = obj
        if isinstance(obj, types.FunctionType):
            todo.extend([*(obj.__closure__ or ()), *(obj.__defaults__ or ()), *(obj.__kwdefaults__ or {}).values()])
            continue
        todo.extend(gc.get_referents(obj))
    return list(seen.values())


@pytest.mark.parametrize("name", DEPLOYABLE)
def test_every_message_keeps_to_its_declaration_and_leaks_nothing_raw(name: str) -> None:
    for alignment in (None, AlignmentConfig(method="psi")):
        messages, data, roles = observed(name, alignment)
        assert messages
        assert audit(name, messages, data, roles) == []


@pytest.mark.parametrize("name", DEPLOYABLE)
def test_save_load_predict_gives_the_same_scores(name: str, tmp_path: Path) -> None:
    data = data_for(name)
    model = vflo.fit(quick(name), data, seed=0)
    expected = model.predict()
    folder = model.save(tmp_path)
    saved = vflo.load(tmp_path)
    assert saved.label == name and folder == tmp_path / name
    rows = raw_rows(data)
    scores = saved.predict(rows if not saved.active_only else rows[data.active])
    assert np.array_equal(scores, expected)  # bit for bit
    frame = saved.score(rows)
    assert list(frame["id"]) == list(data.test_ids) and (frame["model"] == name).all()


def test_a_method_sees_no_lifecycle() -> None:
    """Setup, saving, loading, the ledgers and teardown are the session's (vflo.federation.session), not on the
    federation a method's fit and predict receive."""
    from vflo.federation.coordinator import Federation
    from vflo.federation.session import Session

    lifecycle = ("setup", "teardown", "save_parts", "load_parts", "own_part", "collect_ledgers")
    assert not [name for name in lifecycle if hasattr(Federation, name)]
    assert all(hasattr(Session, name) for name in ("start", "train", "save_parts", "load", "finish", "teardown"))

