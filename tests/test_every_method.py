"""The checks every registered method passes, parametrised over the registry (as scikit-learn's
``parametrize_with_checks``): a new method is held to them by its registry line alone.

Each reads only what the method says of itself (its tags: ``quick``, ``inference``, ``label_only_active``, its
claims and variants, its layouts) and the registry. The multi-process equivalence (in process = every party its
own process over gRPC with mutual TLS) is in ``tests/e2e/test_processes.py``, over the same registry.
"""

from __future__ import annotations

import dataclasses
import gc
import inspect
import json
import re
import types
from pathlib import Path
from typing import Generic, Protocol, get_args

import numpy as np
import pytest

import vflo
from tests.test_artifacts import raw_rows
from tests.test_audit import audit, observed
from tests.test_methods import data_for, quick
from vflo.align.engines import AlignmentConfig
from vflo.comm.message import ALIGN_PREFIX
from vflo.data.partydata import PartyData
from vflo.federation.session import Session
from vflo.federation.simulation import build_federation, run_method
from vflo.methods.base import Method
from vflo.methods.registry import active_only, get_method, method_names
from vflo.party.handlers import Reveals

PRIVACY = Path(__file__).resolve().parents[1] / "src" / "vflo" / "privacy"
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


@pytest.mark.parametrize("name", EVERY)
def test_its_layout_settings_build_it_or_say_why_not(name: str) -> None:
    """Each comparison layout gives settings the method is built with as given, naming the hops it is told of
    (whatever their names), or a sentence saying why it cannot run there; where it runs as it is, its tags say it
    can (a method that needs every partner for each person cannot score people one lacks unaided)."""
    cls = get_method(name)
    fields = {f.name for f in dataclasses.fields(cls.Config)}
    for layout in ("star", "second_hop", "missing"):
        settings = cls.layout_settings(layout, first_hop="p1", second_hop="p2")  # type: ignore[arg-type]
        if isinstance(settings, str):
            assert settings.strip(), f"{layout}: say why {name} cannot run there"
            continue
        assert isinstance(settings, dict), f"{layout}: settings or why not, not {settings!r}"
        # A comparison's run table: the method's own settings, and the method that scores the people it cannot.
        own = {k: v for k, v in settings.items() if k != "fallback"}
        assert set(own) <= fields, f"{layout}: {sorted(set(own) - fields)} are not settings of {name}"
        if "fallback" in settings:
            assert settings["fallback"] in active_only(), f"{layout}: the fallback scores alone, a registered name"
        built = json.loads(cls(**{**cls.quick, **own}).config_json())
        assert {k: built[k] for k in own} == own, f"{layout}: {own} are not taken as given"
        renamed = cls.layout_settings(layout, first_hop="hop one", second_hop="hop two")  # type: ignore[arg-type]
        assert json.dumps(renamed) == json.dumps(settings).replace('"p1"', '"hop one"').replace('"p2"', '"hop two"'), (
            f"{layout}: the settings name the hops they are given")
        if settings == {} and layout == "missing":
            assert cls.inference == "active_only" or cls.any_subset, "scores people a partner lacks: say how"
        if settings == {} and layout == "second_hop":
            assert cls.inference == "active_only", "would train with a party that shares no one with the active party"


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
    raw = {id(data.train[n.name].X) for n in others if n.name in data.train}  # what each node was given
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


#: What runs a method, never the method itself: the session's (vflo.federation.session) and the parties'.
LIFECYCLE = ("start", "setup", "train", "save", "save_parts", "load", "load_parts", "own_part", "finish", "teardown",
             "collect_ledgers")
#: The session's lifecycle, with the arguments each needs.
SESSION = {"start": ["method"], "train": ["fit"], "save_parts": ["label", "model_id"],
           "load": ["method", "label", "model_id", "own"], "finish": [], "teardown": []}


def protocol_members(protocol: type) -> set[str]:
    """The public names a protocol declares, its base protocols' included."""
    return {name for klass in protocol.__mro__ if klass not in (object, Protocol, Generic)
            for name in vars(klass) if not name.startswith("_")}


def test_a_method_sees_no_lifecycle() -> None:
    """Setup, saving, loading, the ledgers and teardown are the session's: neither the port a method's fit and
    predict are typed with (vflo.party.port.Federation) nor the object they are handed has them, nor does that
    object reach the session; the session has each, taking what its callers pass."""
    from vflo.comm.transport import Transport
    from vflo.party import port

    members = protocol_members(port.Federation)
    assert {"exchange", "align", "data", "party"} <= members  # the protocol's own members are what is read
    assert not members & set(LIFECYCLE), f"a method could call {sorted(members & set(LIFECYCLE))}"
    data, method = data_for("splitnn"), quick("splitnn")
    fed, _ = build_federation(data, method, seed=0)
    session = Session(fed)
    session.start(method)
    try:
        assert not [name for name in LIFECYCLE if callable(getattr(fed, name, None))]
        assert not [o for o in _reachable([fed], stop=(Transport,)) if isinstance(o, Session)]
    finally:
        session.teardown()
    for name, needs in SESSION.items():
        fn = getattr(Session, name, None)
        assert callable(fn), f"Session.{name}"
        required = [p.name for p in inspect.signature(fn).parameters.values()
                    if p.default is inspect.Parameter.empty and p.name != "self"]
        assert required == needs, f"Session.{name} takes {required}, its callers pass {needs}"


@pytest.mark.parametrize("name", EVERY)
def test_what_its_messages_reveal_is_declared_by_its_handlers(name: str) -> None:
    """The privacy views read the method's own declarations (``@reveals`` above each ``@handles``): every kind
    they read is one a method (or alignment) handles, and each kind it handles is read as it declares it."""
    from vflo.privacy import views

    cls = get_method(name)
    for kind, (info, _) in cls.handler_table().items():
        # A simulation-only method is never run against a party: its kinds are not among those a party serves.
        assert views.declared().get(kind) == (None if cls.simulation_only else info), kind
        assert views.view_of(kind) == (None if cls.simulation_only else info.reveals), kind
    handled = {k for m in EVERY for k in get_method(m).handler_table()} | \
        {k for k in views.declared() if k.startswith(ALIGN_PREFIX)}
    assert views.kinds_revealing(*get_args(Reveals)) <= handled


#: Kinds whose reply carries outputs that are no rows of the sender's data, with why.
NOT_A_RELEASE = {"rap.predict": "the server's model's scores of rows the label owner sent it, for the label owner"}


@pytest.mark.parametrize("name", DEPLOYABLE)
def test_the_privacy_views_read_every_release_its_run_makes(name: str) -> None:
    """In a run, every reply whose kind declares a release of rows is read by the views, row for row (with the IDs
    of the rows), every gradient row sent is read with its ID, and every tree asked about is read; a kind whose
    reply carries a party's outputs or masked features declares what it reveals."""
    from vflo.party.handlers import RELEASES
    from vflo.privacy import views
    from vflo.privacy.evaluate import aligned_at

    messages, data, _ = observed(name)
    sent: dict[tuple[str, str, str], int] = {}
    gradients: dict[str, int] = {}
    trees: set[str] = set()
    for request, reply in views.exchanges(messages):
        info = views.declared().get(request.kind)
        if info is None:
            continue
        if info.reply_fields("outputs", "masked features") and info.kind not in NOT_A_RELEASE:
            assert info.reveals is not None, f"{info.kind}: say what its reply reveals (@reveals above its @handles)"
        if info.reveals in RELEASES and reply is not None and reply.error is None:
            rows = len(reply.payload["u" if info.reveals == "factors" else info.rows_field()])
            key = (reply.sender, reply.receiver, reply.kind)
            sent[key] = sent.get(key, 0) + rows
        elif info.reveals == "gradients":
            grad = request.payload[info.request_fields("gradients")[0]]
            gradients[request.receiver] = gradients.get(request.receiver, 0) + len(grad)
        elif info.reveals == "tree nodes":
            trees.add(request.receiver)
    read: dict[tuple[str, str, str], int] = {}
    for party in {receiver for _, receiver, _ in sent}:
        for flow in views.releases_received(messages, party, aligned=aligned_at(messages, data, party)):
            read[flow.sender, flow.receiver, flow.kind] = len(flow.ids)
    assert read == sent
    assert {p: len(views.gradients_received(messages, p)[0]) for p in gradients} == gradients
    for party in trees:
        ids, groups = views.instance_spaces_received(messages, party)
        assert len(ids) == len(groups) and (groups >= 0).any()


def test_the_privacy_views_name_no_methods_kind() -> None:
    """What a method's messages reveal is its own declaration: vflo/privacy names none of its kinds, in code,
    docstrings or comments."""
    kinds = sorted({k for m in EVERY for k in get_method(m).handler_table()}, key=len, reverse=True)
    pattern = re.compile(r"(?<![\w.])(" + "|".join(map(re.escape, kinds)) + r")(?![\w])")
    assert pattern.search('x = "splitnn.forward"')  # the check can fail
    found = [f"{path.name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(1)}"
             for path in sorted(PRIVACY.glob("*.py")) for text in [path.read_text()] for m in pattern.finditer(text)]
    assert not found, "read what a kind reveals from its declaration (views.view_of), not its name:\n" + \
        "\n".join(found)
