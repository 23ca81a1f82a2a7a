"""Scenarios: exact counts, disjoint columns, held-out tests, every layout the methods need."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import make_dataset, two_party_spec
from vflo.data.scenario import BlockSpec, PartySpec, SamplesSpec, ScenarioSpec
from vflo.errors import ConfigError, ScenarioError

DATA = make_dataset(n=200, n_features=10)


@settings(max_examples=60, deadline=None)
@given(
    n_parties=st.integers(2, 4), active=st.integers(20, 150), aligned_frac=st.floats(0.0, 1.0),
    passive_only=st.integers(0, 10), n_test=st.integers(1, 10), seed=st.integers(0, 2**31 - 1),
    split=st.sampled_from(["random", "sequential"]),
)
def test_scenario_properties(n_parties: int, active: int, aligned_frac: float, passive_only: int, n_test: int,
                             seed: int, split: str) -> None:
    aligned = round(aligned_frac * active)
    parties = (PartySpec(name="a", role="active"), *(PartySpec(name=f"p{i}") for i in range(n_parties - 1)))
    spec = ScenarioSpec(parties=parties, samples=SamplesSpec(active=active, aligned=aligned,
                                                             passive_only=passive_only), feature_split=split)
    if aligned + passive_only == 0:
        with pytest.raises(ScenarioError, match="would hold no rows"):
            spec.build(DATA, seed=seed)
        return
    layout = spec.build(DATA, seed=seed)
    # exact aligned and per-party counts
    assert len(layout.aligned_ids()) == aligned
    assert len(layout.rows["a"]) == active
    for i in range(n_parties - 1):
        assert len(layout.rows[f"p{i}"]) == aligned + passive_only
    # columns disjoint and together complete
    cols = [c for p in parties for c in layout.columns[p.name]]
    assert sorted(cols) == sorted(DATA.columns) and len(set(cols)) == len(cols)
    # no ID twice in a party; test rows disjoint from training rows everywhere
    test_ids = np.sort(layout.ids("a"))[:n_test]
    fed = layout.materialize(test_ids=test_ids)
    for name, part in fed.train.items():
        assert len(np.unique(part.ids)) == len(part.ids)
        assert not set(part.ids.tolist()) & set(test_ids.tolist()), name
        assert set(fed.serve[name].ids.tolist()) <= set(test_ids.tolist())
    assert fed.train["a"].n_samples == active - n_test
    assert fed.serve["a"].y is None and fed.train["a"].y is not None
    assert all(fed.train[f"p{i}"].y is None for i in range(n_parties - 1))


def test_same_seed_same_layout_and_different_seed_differs() -> None:
    spec = two_party_spec(active=100, aligned=40)
    a, b, c = spec.build(DATA, seed=3), spec.build(DATA, seed=3), spec.build(DATA, seed=4)
    assert all(np.array_equal(a.rows[n], b.rows[n]) for n in a.rows)
    assert not np.array_equal(a.rows["act"], c.rows["act"])


def test_each_party_keeps_its_own_row_order() -> None:
    layout = two_party_spec(active=100, aligned=100).build(DATA, seed=0)
    assert sorted(layout.ids("act").tolist()) == sorted(layout.ids("pas").tolist())
    assert layout.ids("act").tolist() != layout.ids("pas").tolist()


def test_standardisation_is_fitted_on_each_party_training_rows_only() -> None:
    layout = two_party_spec(active=150, aligned=100).build(DATA, seed=1)
    test_ids = np.sort(layout.aligned_ids())[:20]
    fed = layout.materialize(test_ids=test_ids)
    for part in fed.train.values():
        assert np.allclose(part.X.mean(axis=0), 0.0, atol=1e-5)
        assert np.allclose(part.X.std(axis=0), 1.0, atol=1e-4)
    serve = fed.serve["pas"]
    raw = DATA.X.set_index(DATA.ids).loc[serve.ids, list(serve.columns)].to_numpy()
    train_raw = DATA.X.set_index(DATA.ids).loc[fed.train["pas"].ids, list(serve.columns)].to_numpy()
    expected = (raw - train_raw.mean(axis=0)) / train_raw.std(axis=0)
    assert np.allclose(serve.X, expected, atol=1e-4)


def test_train_scope_aligned_keeps_only_aligned_rows() -> None:
    layout = two_party_spec(active=150, aligned=60, passive_only=10).build(DATA, seed=0)
    fed = layout.materialize(test_ids=np.sort(layout.aligned_ids())[:10], train_scope="aligned")
    assert fed.train["act"].n_samples == 50 and fed.train["pas"].n_samples == 50


def test_overlap_matrix_and_description() -> None:
    layout = two_party_spec(active=100, aligned=30, passive_only=5).build(DATA, seed=0)
    m = layout.overlap_matrix()
    assert m.loc["act", "pas"] == 30 and m.loc["act", "act"] == 100 and m.loc["pas", "pas"] == 35
    text = layout.describe()
    assert "act (active): 100 samples, 3 columns" in text and "overlap matrix" in text


def test_misaligned_layout_splits_the_rest_evenly_between_guests() -> None:
    spec = ScenarioSpec(
        parties=(PartySpec(name="host", role="active", columns=()),
                 PartySpec(name="g1", share=1.0), PartySpec(name="g2", share=1.0)),
        samples=SamplesSpec(layout="misaligned", active=100, aligned=0.1),
    )
    layout = spec.build(DATA, seed=0)
    assert layout.columns["host"] == () and len(layout.columns["g1"]) == 5
    m = layout.overlap_matrix()
    assert m.loc["host", "host"] == 100 and m.loc["g1", "g2"] == 10
    assert m.loc["g1", "g1"] == 55 and m.loc["g2", "g2"] == 55
    assert len(layout.aligned_ids()) == 10
    fed = layout.materialize(test_ids=np.sort(layout.aligned_ids())[:2])
    assert fed.train["host"].n_features == 0 and fed.train["host"].y is not None


def test_second_hop_chain_with_explicit_blocks() -> None:
    spec = ScenarioSpec(
        parties=(PartySpec(name="a", role="active", n_columns=3), PartySpec(name="p1", n_columns=4),
                 PartySpec(name="p2", n_columns=3)),
        samples=SamplesSpec(layout="blocks", blocks=(
            BlockSpec(parties=("p1", "p2"), rows=30), BlockSpec(parties=("p1", "a"), rows=60),
            BlockSpec(parties=("a",), rows=30),
        )),
    )
    layout = spec.build(DATA, seed=0)
    m = layout.overlap_matrix()
    assert m.loc["a", "p2"] == 0 and m.loc["p1", "p2"] == 30 and m.loc["a", "p1"] == 60
    assert len(layout.rows["p1"]) == 90 and len(layout.rows["a"]) == 90
    # aligned = shared by the active party and the parties that overlap it (p1 only)
    assert len(layout.aligned_ids()) == 60


def test_a_feature_named_in_two_parties_is_refused() -> None:
    spec = ScenarioSpec(parties=(PartySpec(name="a", role="active", columns=("f0", "f1")),
                                 PartySpec(name="b", columns=("f1", "f2")), PartySpec(name="c", columns="rest")))
    with pytest.raises(ScenarioError, match="column 'f1' is named by both 'a' and 'b'"):
        spec.build(DATA, seed=0)


def test_unknown_column_has_a_hint() -> None:
    spec = ScenarioSpec(parties=(PartySpec(name="a", role="active", columns=("f_0",)),
                                 PartySpec(name="b", columns="rest")))
    with pytest.raises(ScenarioError, match=r"columns \['f_0'\] not in the dataset \(did you mean 'f0'\?\)"):
        spec.build(DATA, seed=0)


def test_unassigned_columns_are_an_error_unless_dropped() -> None:
    parties = (PartySpec(name="a", role="active", columns=("f0",)), PartySpec(name="b", columns=("f1",)))
    with pytest.raises(ScenarioError, match="belong to no party"):
        ScenarioSpec(parties=parties).build(DATA, seed=0)
    layout = ScenarioSpec(parties=parties, unused_columns="drop").build(DATA, seed=0)
    assert layout.columns == {"a": ("f0",), "b": ("f1",)}


def test_more_aligned_rows_than_exist_is_refused() -> None:
    with pytest.raises(ScenarioError, match="asks for 150 rows but only 100 exist"):
        two_party_spec(active=100, aligned=150).build(DATA, seed=0)
    with pytest.raises(ScenarioError, match="needs 400 distinct rows"):
        ScenarioSpec(parties=two_party_spec().parties, samples=SamplesSpec(layout="blocks", blocks=(
            BlockSpec(parties=("act", "pas"), rows=200), BlockSpec(parties=("act",), rows=200)))).build(DATA, seed=0)


def test_zero_overlap_builds_but_has_no_aligned_rows() -> None:
    layout = two_party_spec(active=100, aligned=0, passive_only=50).build(DATA, seed=0)
    assert len(layout.aligned_ids()) == 0
    assert layout.overlap_matrix().loc["act", "pas"] == 0


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"aligned": 1.5}, "a float is a fraction"),
    ({"aligned": -1}, "must be non-negative"),
    ({"layout": "diagonal"}, "samples.layout must be"),
    ({"layout": "blocks"}, "needs at least one"),
])
def test_bad_sample_specs(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SamplesSpec(**kwargs)  # type: ignore[arg-type]


def test_exactly_one_active_party() -> None:
    with pytest.raises(ConfigError, match="exactly one active party"):
        ScenarioSpec(parties=(PartySpec(name="a"), PartySpec(name="b")))
    with pytest.raises(ConfigError, match="party names must be unique"):
        ScenarioSpec(parties=(PartySpec(name="a", role="active"), PartySpec(name="a")))


def test_test_ids_must_belong_to_the_active_party() -> None:
    layout = two_party_spec(active=100, aligned=20, passive_only=20).build(DATA, seed=0)
    outsider = np.setdiff1d(layout.ids("pas"), layout.ids("act"))[:1]
    with pytest.raises(ScenarioError, match="not held by the active party"):
        layout.materialize(test_ids=outsider)


def test_a_negative_block_inside_a_sweep_is_refused() -> None:
    from vflo.errors import ConfigError
    from vflo.experiments.config import parse_config

    raw = {
        "dataset": {"name": "wine"},
        "scenario": {"parties": [{"name": "a", "role": "active", "n_columns": 4}, {"name": "b", "columns": "rest"}],
                     "samples": {"layout": "blocks", "blocks": [{"name": "ab", "parties": ["a", "b"], "rows": 50},
                                                                {"name": "a", "parties": ["a"], "rows": 50}]},
                     "sweep": {"samples.blocks.ab.rows": [40, -5]}},
        "methods": [{"name": "local"}],
    }
    with pytest.raises(ConfigError, match="samples.blocks.ab.rows must be non-negative, got -5"):
        parse_config(raw)
