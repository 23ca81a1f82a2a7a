"""VFL-ASP: one-mask federated SVD, embedding approximation, teacher and student, and its topology checks."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from vflo.comm.message import Message
from vflo.data.datasets import load_dataset
from vflo.data.scenario import BlockSpec, FederatedData, PartySpec, SamplesSpec, ScenarioSpec
from vflo.errors import ConfigError, MethodError, RemoteError
from vflo.federation.simulation import build_federation, run_method
from vflo.methods.registry import get_method
from vflo.metrics import compute_metrics

FAST = {"lr": 0.01, "batch_size": 50, "max_epochs": 15, "patience": 5, "min_delta": 1e-4, "validation_fraction": 0.0}
SETTINGS = {"train": FAST, "student_train": FAST, "embedding_train": {**FAST, "lr": 1e-3}}


def _data(p1p2: int = 150, p1a: int = 150, a_only: int = 150, extra_overlap: int = 0, test_from: str = "aligned",
          seed: int = 0, p2_only: int = 0) -> FederatedData:
    ds = load_dataset("breast_cancer")
    blocks = [BlockSpec(parties=("p1", "p2"), rows=p1p2), BlockSpec(parties=("p1", "a"), rows=p1a),
              BlockSpec(parties=("a",), rows=a_only), BlockSpec(parties=("p2",), rows=p2_only)]
    if extra_overlap:
        blocks.append(BlockSpec(parties=("a", "p2"), rows=extra_overlap))
    spec = ScenarioSpec(parties=(PartySpec(name="p2", share=1.0), PartySpec(name="p1", share=1.0),
                                 PartySpec(name="a", role="active", share=1.0)),
                        samples=SamplesSpec(layout="blocks", blocks=tuple(b for b in blocks if b.rows)))
    layout = spec.build(ds, seed=seed)
    if test_from == "aligned" and p1a:
        pool = np.sort(layout.aligned_ids())
    else:
        pool = np.setdiff1d(layout.ids("a"), layout.ids("p1"))
    return layout.materialize(test_ids=np.sort(pool)[:30])


def test_embeddings_equal_the_svd_of_the_joined_shared_rows() -> None:
    data = _data()
    method = get_method("vfl_asp")(**SETTINGS, svd={"mask": "block", "block_size": 40})
    seen: list[Message] = []
    fed, nodes = build_federation(data, method, seed=0, observers=(seen.append,))
    fed.setup(method)
    method.fit(fed)
    shared, E = nodes["p1"].context.state["asp.embeddings"]
    joined = np.hstack([data.train["p1"].subset(shared).X, data.train["p2"].subset(shared).X]).astype(np.float64)
    U, S, _ = np.linalg.svd(joined, full_matrices=False)
    signs = np.sign(np.sum(E * (U * S), axis=0))
    assert np.allclose(E * signs, U * S, atol=1e-8)
    # the server saw only masked blocks, which are not the parties' rows
    blocks = [m for m in seen if m.receiver == "server" and "block" in m.payload]
    assert {m.sender for m in blocks} == {"p1", "p2"}
    for m in blocks:
        raw = data.train[m.sender].subset(shared).X
        assert not np.allclose(m.payload["block"], raw, atol=1e-3)


def test_the_second_hop_party_sends_one_message_and_receives_its_mask() -> None:
    data = _data()
    out = run_method(get_method("vfl_asp")(**SETTINGS), data, seed=0)
    method = [e for e in out.ledger.entries if e.is_method]
    assert [e.kind for e in method if e.sender == "p2" and e.direction == "request"] == ["svd.block"]
    assert [(e.sender, e.kind) for e in method if e.receiver == "p2" and e.direction == "request"] == [
        ("dealer", "svd.masks"), ("p1", "svd.upload")]


def test_teacher_and_student() -> None:
    data = _data()
    teacher = run_method(get_method("vfl_asp")(**SETTINGS), data, seed=0)
    acc = compute_metrics(data.task, data.test_y, teacher.scores)["accuracy"]
    majority = max(data.test_y.mean(), 1 - data.test_y.mean())
    assert acc > majority
    # the student scores rows of the active party that no other party holds
    unseen = _data(test_from="active")
    assert not unseen.train["p1"].contains(unseen.test_ids).any() and len(unseen.serve["p1"]) == 0
    student = run_method(get_method("vfl_asp_student")(**SETTINGS), unseen, seed=0)
    assert student.scores.shape == (30, 2)
    assert not [e for e in student.ledger.entries[student.fit_entries:] if e.is_method]


def test_vfl_std_baseline_uses_the_first_hop_only() -> None:
    data = _data()
    out = run_method(get_method("splitnn")(partners=("p1",), train=FAST), data, seed=0)
    assert {e.receiver for e in out.ledger.entries if e.is_method and e.direction == "request"} == {"p1"}
    with pytest.raises(ConfigError, match="partners \\['p3'\\] are not passive parties"):
        run_method(get_method("splitnn")(partners=("p3",), train=FAST), data, seed=0)


def test_bad_topologies() -> None:
    with pytest.raises(RemoteError, match="shares no sample with the second-hop party 'p2'"):
        run_method(get_method("vfl_asp")(**SETTINGS), _data(p1p2=0, p2_only=100), seed=0)
    with pytest.raises(MethodError, match="shares no sample with the first-hop party 'p1'"):
        run_method(get_method("vfl_asp")(**SETTINGS), _data(p1a=0, test_from="active"), seed=0)
    overlapping = _data(extra_overlap=20)
    with pytest.raises(MethodError, match="'p2' shares 20 samples with the active party 'a'"):
        run_method(get_method("vfl_asp")(**SETTINGS), overlapping, seed=0)


def test_an_overlap_can_be_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        run_method(get_method("vfl_asp")(**SETTINGS, on_overlap="warn"), _data(extra_overlap=20), seed=0)
    assert any("not second-hop" in r.message for r in caplog.records)


def test_more_components_than_columns() -> None:
    with pytest.raises(RemoteError, match="50 singular vectors asked for .* hold only 20 columns together"):
        run_method(get_method("vfl_asp")(**SETTINGS, components=50), _data(), seed=0)
    with pytest.raises(ConfigError, match="embedding_weight"):
        get_method("vfl_asp")(embedding_weight=1.5)


def test_importance_split_gives_the_second_hop_the_most_important_columns() -> None:
    from vflo.data.datasets import load_dataset
    from vflo.data.scenario import importance_ranking

    ds = load_dataset("wine")
    spec = ScenarioSpec(parties=(PartySpec(name="p2", n_columns=3), PartySpec(name="p1", share=1.0),
                                 PartySpec(name="a", role="active", share=1.0)), feature_split="importance")
    layout = spec.build(ds, seed=0)
    assert list(layout.columns["p2"]) == importance_ranking(ds)[:3]
