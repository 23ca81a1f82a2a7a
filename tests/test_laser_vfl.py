"""LASER-VFL: trains on every row any subset of parties holds, scores each person with the parties that hold
them, weights its sampled tasks as the authors do, and refuses bottoms that cannot be averaged."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import make_dataset
from vflo.comm.message import Message
from vflo.data.catalog import Dataset
from vflo.data.layout import FederatedData
from vflo.data.scenario import BlockSpec, PartySpec, SamplesSpec, ScenarioSpec
from vflo.errors import ConfigError
from vflo.federation.session import Session
from vflo.federation.simulation import build_federation, run_method
from vflo.methods.laser_vfl import LaserVFL, task_weight
from vflo.methods.registry import get_method
from vflo.metrics import compute_metrics

TRAIN = {"lr": 3e-3, "batch_size": 64, "max_epochs": 25, "validation_fraction": 0.0}


def _blocks(seed: int = 0, task: str | None = None, dataset: Dataset | None = None) -> tuple[FederatedData,
                                                                                          FederatedData]:
    """An active party with 2 of 8 columns; p1 and p2 hold the rest for different, overlapping people; test
    people of every holder set (held out), scored together and by the active party alone (``dataset``: 1400 rows
    of 8 columns in place of the seeded synthetic ones)."""
    ds = dataset if dataset is not None else make_dataset(n=1400, n_features=8, seed=seed, task=task)
    spec = ScenarioSpec(
        parties=(PartySpec(name="a", role="active", n_columns=2), PartySpec(name="p1", share=1.0),
                 PartySpec(name="p2", share=1.0)),
        samples=SamplesSpec(layout="blocks", test_seed=1, blocks=(
            BlockSpec(parties=("a", "p1", "p2"), rows=100, test=True), BlockSpec(parties=("a",), rows=100, test=True),
            BlockSpec(parties=("a", "p1", "p2"), rows=250), BlockSpec(parties=("a", "p1"), rows=250),
            BlockSpec(parties=("a", "p2"), rows=250), BlockSpec(parties=("a",), rows=300))))
    layout = spec.build(ds, seed=seed)
    return (layout.materialize(test_ids=layout.held_out("aligned")),
            layout.materialize(test_ids=layout.held_out("active_only")))


def test_task_weights_are_the_authors() -> None:
    # C(n-1, k-1) / k: with three observed blocks, a head's subsets of size 1, 2, 3 weigh 1, 1 and 1/3.
    assert [task_weight(3, k) for k in (1, 2, 3)] == [1.0, 1.0, 1 / 3]
    assert task_weight(1, 1) == 1.0


def test_it_trains_on_every_holder_set_and_beats_the_active_party_alone() -> None:
    together, alone = _blocks()
    seen: list[Message] = []
    method = get_method("laser_vfl")(train=TRAIN)
    out = run_method(method, together, seed=0, observers=(seen.append,))
    # Every training person, whoever else holds them, and how many of each holder set.
    assert method.n_train_ == together.train["a"].n_samples == 1050
    assert {k: v for k, v in out.stats.items() if k.startswith("observed_")} == {
        "observed_active+p1+p2": 250.0, "observed_active+p1": 250.0, "observed_active+p2": 250.0,
        "observed_active": 300.0}
    # A partner is asked only for people it holds, and only when it holds some of the batch.
    for m in seen:
        if m.kind == "splitnn.forward" and m.sender == "a":
            assert 0 < len(m.payload["rows"]) <= together.train[m.receiver].n_samples
    local = run_method(get_method("local")(), together, seed=0)
    accuracy = {name: compute_metrics("binary", together.test_y, o.scores)["accuracy"]
                for name, o in (("laser", out), ("local", local))}
    assert accuracy["laser"] > accuracy["local"] + 0.05, accuracy
    # People only the active party holds: scored by its own head alone, no partner asked for a row.
    seen.clear()
    solo = run_method(get_method("laser_vfl")(train=TRAIN), alone, seed=0, observers=(seen.append,))
    assert solo.scores.shape == (100, 2) and np.allclose(solo.scores.sum(axis=1), 1.0)
    asked = [m for m in seen if m.kind == "split.activations" and m.sender == "a"]
    assert asked and all(len(m.payload["ids"]) == 0 for m in asked)


def test_a_person_is_scored_by_the_heads_of_the_blocks_that_hold_them() -> None:
    together, _ = _blocks()
    method = get_method("laser_vfl")(train={**TRAIN, "max_epochs": 2})
    fed, _nodes = build_federation(together, method, seed=0)
    Session(fed).start(method)
    method.fit(fed)
    import torch

    z = [torch.randn(4, 10) for _ in range(3)]
    mask = np.array([[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=bool)
    out = method.combine(z, mask, regression=False)
    for row, seen in enumerate(mask):
        blocks = np.flatnonzero(seen).tolist()
        mean = torch.stack([z[j][row] for j in blocks]).mean(dim=0)
        expected = torch.stack([torch.softmax(method.heads_[i](mean), dim=0) for i in blocks]).mean(dim=0)
        assert torch.allclose(out[row], expected, atol=1e-6)
    Session(fed).teardown()


def test_regression_and_bad_widths() -> None:
    together, _ = _blocks(task="regression")
    out = run_method(get_method("laser_vfl")(train={**TRAIN, "max_epochs": 5}), together, seed=0)
    assert out.scores.shape == (100,) and np.isfinite(out.scores).all()
    with pytest.raises(ConfigError, match="same cut width"):
        get_method("laser_vfl")(passive_bottom=(8, 4))
    assert LaserVFL.any_subset and LaserVFL().scoring_parties(together.parties) == []


def test_a_saved_model_scores_with_the_rows_each_partner_brings(tmp_path: object) -> None:
    import vflo
    from tests.test_artifacts import raw_rows

    together, _ = _blocks()
    model = vflo.fit(get_method("laser_vfl")(train={**TRAIN, "max_epochs": 3}), together, seed=0)
    expected = model.predict()
    folder = model.save(tmp_path)  # type: ignore[arg-type]
    saved = vflo.load(folder.parent, "laser_vfl")
    rows = raw_rows(together)
    assert np.array_equal(saved.predict(rows), expected)
    # p1 brings only half of its people next time: those it lacks are scored by the others' heads.
    half = rows["p1"].subset(rows["p1"].ids[: len(rows["p1"].ids) // 2])
    frame = saved.score({**rows, "p1": half})
    assert len(frame) == 100 and np.isfinite(frame[saved.score_columns].to_numpy()).all()
    same = np.isclose(frame[saved.score_columns].to_numpy(), expected).all(axis=1)
    kept = np.isin(frame["id"], half.ids)
    dropped = np.isin(frame["id"], rows["p1"].ids) & ~kept
    assert same[kept].all() and dropped.any() and not same[dropped].any()


def test_splitnn_with_party_dropout_trains_on_every_person_and_scores_whoever_holds_them() -> None:
    """PlugVFL's party-wise dropout: it trains on every person the active party holds (as LASER-VFL's authors
    run it), a partner asked only for the batch's people it holds; a left-out partner is not asked for that
    batch (and gets no gradient); the model scores people a partner lacks with zeros in its place, and without
    dropout nothing changes."""
    together, alone = _blocks()
    seen: list[Message] = []
    train = {**TRAIN, "max_epochs": 6, "batch_size": 64}
    method = get_method("splitnn")(train=train, party_dropout=0.5)
    out = run_method(method, together, seed=0, observers=(seen.append,))
    assert method.n_train_ == together.train["a"].n_samples == 1050  # not only the 250 every partner holds
    forwards = [m for m in seen if m.kind == "splitnn.forward" and m.sender == "a" and m.payload["training"]]
    backwards = [m for m in seen if m.kind == "split.backward" and m.sender == "a"]
    per_party = {p: sum(1 for m in forwards if m.receiver == p) for p in ("p1", "p2")}
    steps = 6 * int(np.ceil(1050 / 64))
    assert all(0.3 * steps < n < 0.7 * steps for n in per_party.values()), per_party
    assert {p: sum(1 for m in backwards if m.receiver == p) for p in ("p1", "p2")} == per_party
    # Each partner's rows are positions among the 500 training people it holds, about half of each batch,
    # and the gradient it gets back has one row per row it sent.
    for m in forwards:
        assert 0 < len(m.payload["rows"]) < 64 and m.payload["rows"].max() < 500
    for p in ("p1", "p2"):
        sent = [len(m.payload["rows"]) for m in forwards if m.receiver == p]
        back = [len(m.payload["grad"]) for m in backwards if m.receiver == p]
        assert sent == back
    assert out.scores.shape == (100, 2)
    aligned = get_method("splitnn")(train=train)
    run_method(aligned, together, seed=0)
    assert aligned.n_train_ == 250
    # People only the active party holds: scored, every partner's place zeros.
    solo = run_method(get_method("splitnn")(train=train, party_dropout=0.5), alone, seed=0)
    assert solo.scores.shape == (100, 2) and np.allclose(solo.scores.sum(axis=1), 1.0)
    with pytest.raises(ConfigError, match="party_dropout"):
        get_method("splitnn")(party_dropout=1.0)
    plain = run_method(get_method("splitnn")(train=train), together, seed=0)
    again = run_method(get_method("splitnn")(train=train, party_dropout=0.0), together, seed=0)
    assert np.array_equal(plain.scores, again.scores)
