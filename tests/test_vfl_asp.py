"""VFL-ASP: one-mask federated SVD, embedding approximation, teacher and student, and its topology checks."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from vflo.comm.message import Message
from vflo.data.datasets import load_dataset
from vflo.data.layout import FederatedData
from vflo.data.scenario import BlockSpec, PartySpec, SamplesSpec, ScenarioSpec
from vflo.errors import ConfigError, MethodError, RemoteError
from vflo.federation.session import Session
from vflo.federation.simulation import build_federation, run_method
from vflo.methods.registry import get_method
from vflo.methods.vfl_asp import ASPPart
from vflo.metrics import compute_metrics
from vflo.party.policy import Policy

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
    for node in nodes.values():  # blocks of 40 rows: below the default policy's 64, so the parties allow them
        node.policy = Policy(min_mask_block=40, alignment="plain")
    Session(fed).start(method)
    method.fit(fed)
    part = nodes["p1"].context.part(ASPPart)
    shared, E = part.shared, part.embeddings
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


def _chain(n: int = 900, seed: int = 0) -> FederatedData:
    """A chain with a known answer: the label is a function of the second hop's columns, the first hop holds
    a noisy copy of them, and the active party holds pure noise. Only what crosses the chain can predict."""
    import pandas as pd

    from vflo.data.datasets import Dataset

    rng = np.random.default_rng(seed)
    p2 = rng.normal(size=(n, 4))
    p1 = p2 @ rng.normal(size=(4, 4)) + 0.3 * rng.normal(size=(n, 4))
    a = rng.normal(size=(n, 4))
    y = (p2 @ np.array([1.0, -1.0, 0.5, 0.0]) > 0).astype(np.int64)
    columns = [f"p2_{i}" for i in range(4)] + [f"p1_{i}" for i in range(4)] + [f"a_{i}" for i in range(4)]
    ds = Dataset(name="chain", X=pd.DataFrame(np.hstack([p2, p1, a]), columns=columns), y=y,
                 ids=np.arange(n, dtype=np.int64), task="binary", n_classes=2, standin=False, source="test")
    spec = ScenarioSpec(
        parties=(PartySpec(name="p2", columns=tuple(columns[:4])), PartySpec(name="p1", columns=tuple(columns[4:8])),
                 PartySpec(name="a", role="active", columns=tuple(columns[8:]))),
        samples=SamplesSpec(layout="blocks", blocks=(BlockSpec(parties=("p1", "p2"), rows=n // 3),
                                                     BlockSpec(parties=("p1", "a"), rows=2 * n // 3))))
    layout = spec.build(ds, seed=seed)
    return layout.materialize(test_ids=np.sort(layout.aligned_ids())[:120])


def test_the_teacher_learns_what_only_the_chain_carries() -> None:
    data = _chain()
    teacher = compute_metrics(data.task, data.test_y, run_method(get_method("vfl_asp")(**SETTINGS), data,
                                                                 seed=0).scores)["accuracy"]
    local = compute_metrics(data.task, data.test_y, run_method(get_method("local")(), data, seed=0).scores)["accuracy"]
    assert local < 0.65  # the active party's columns are noise
    assert teacher > local + 0.2


def test_the_student_learns_from_the_teacher_not_from_any_soft_labels() -> None:
    import torch
    from torch.nn import functional as F

    from vflo.nn.models import mlp
    from vflo.nn.train import TrainConfig, as_tensor, fit_module
    from vflo.seeding import numpy_rng, torch_generator

    unseen = _data(test_from="active")  # the student scores rows of the active party no other party holds
    assert not unseen.train["p1"].contains(unseen.test_ids).any() and len(unseen.serve["p1"]) == 0
    method = get_method("vfl_asp_student")(**SETTINGS)
    student = run_method(method, unseen, seed=0)
    assert student.scores.shape == (30, 2)
    assert not [e for e in student.ledger.entries[student.fit_entries:] if e.is_method]
    # the same network, trained on the same rows with random soft labels instead of the teacher's
    a = unseen.train["a"]
    rows = a.subset(a.ids[unseen.train["p1"].contains(a.ids)])
    assert method.student_rows_ == rows.n_samples
    soft = torch.as_tensor(numpy_rng(0, "random-soft").dirichlet([1.0, 1.0], size=rows.n_samples), dtype=torch.float32)
    control = mlp(a.n_features, method.config.student_hidden, 2, activation=method.config.activation,
                  generator=torch_generator(0, "control"))
    fit_module(control, lambda m, b: F.kl_div(F.log_softmax(m(b["x"]), dim=1), b["soft"], reduction="batchmean"),
               {"x": as_tensor(rows.X), "soft": soft}, config=TrainConfig(**FAST), rng=numpy_rng(0, "control"))
    with torch.no_grad():
        control_scores = torch.softmax(control(as_tensor(unseen.serve["a"].subset(unseen.test_ids).X)), 1).numpy()
    acc = compute_metrics(unseen.task, unseen.test_y, student.scores)["accuracy"]
    acc_control = compute_metrics(unseen.task, unseen.test_y, control_scores)["accuracy"]
    assert acc > acc_control + 0.2 and acc > 0.85


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


def test_the_student_refuses_regression_with_the_reason() -> None:
    """It learns the teacher's class probabilities: a regression teacher has none (it once returned 1.0 for
    every row)."""
    from vflo.errors import MethodError
    from vflo.methods.registry import get_method

    with pytest.raises(MethodError, match=r"vfl_asp_student supports \['binary', 'multiclass'\] tasks, not "
                                          r"'regression'"):
        get_method("vfl_asp_student")().check_task("regression")
    get_method("vfl_asp")().check_task("regression")  # the teacher is split learning: it regresses


def _experiment(parties: list[dict[str, object]], samples: dict[str, object]) -> dict[str, object]:
    return {"name": "asp", "seed": 0, "dataset": {"name": "breast_cancer"},
            "scenario": {"parties": parties, "samples": samples},
            "protocol": {"name": "repeated_runs", "runs": 1, "test_fraction": 0.2, "test_from": "aligned"},
            "methods": [{"name": "vfl_asp", "train": FAST}]}


def test_a_run_without_its_hops_is_refused_naming_the_real_parties() -> None:
    """Before anything trains, and not as a scoring-rows problem: the defaults first_hop = 'p1' and second_hop =
    'p2' named no party of the config, and the refusal suggested test_from = 'aligned', already set."""
    from vflo.experiments.config import parse_config
    from vflo.experiments.runner import run_experiment
    from vflo.roles import PartyInfo

    two = _experiment([{"name": "hospital", "role": "active", "n_columns": 15}, {"name": "lab", "columns": "rest"}],
                      {"aligned": 0.6})
    with pytest.raises(ConfigError) as refused:
        run_experiment(parse_config(two))
    text = str(refused.value)
    assert "this run has one partner, 'lab': there is no second hop" in text
    assert "Leave vfl_asp out; splitnn trains with 'lab' on the people it shares with 'hospital'" in text
    assert "test_from" not in text and "scores together with 'p1'" not in text

    blocks = [{"parties": ["near", "far"], "rows": 142}, {"parties": ["near", "bank"], "rows": 284},
              {"parties": ["bank"], "rows": 143}]
    three = _experiment([{"name": "far", "share": 1.0}, {"name": "near", "share": 1.0},
                         {"name": "bank", "role": "active", "share": 1.0}], {"layout": "blocks", "blocks": blocks})
    with pytest.raises(ConfigError) as refused:
        run_experiment(parse_config(three))
    text = str(refused.value)
    assert "first_hop = 'p1' and second_hop = 'p2' name no partner of this run (its partners: 'far', 'near')" in text
    assert "set first_hop = '...' to the partner that shares people with 'bank'" in text
    assert "second_hop = '...' to the one that shares people with the first hop but none with 'bank'" in text
    assert "test_from" not in text
    parties = (PartyInfo("bank", "active"), PartyInfo("near", "passive"), PartyInfo("far", "passive"))
    get_method("vfl_asp")(first_hop="near", second_hop="far").check_parties(parties)  # named: nothing to refuse
