"""Partners missing in training and at scoring: the ``missing`` layout (LASER-VFL's setting) and a collaborative
method with an active-only fallback for the people its partners lack, in ``vflo run``."""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import make_dataset
from vflo.data.scenario import PartySpec, SamplesSpec, ScenarioSpec
from vflo.errors import ConfigError
from vflo.experiments.config import load_config, parse_config
from vflo.experiments.runner import run_experiment

PARTIES = (PartySpec(name="a", role="active", n_columns=2), PartySpec(name="p", count=4, share=1.0))


def _layout(**samples: object):  # type: ignore[no-untyped-def]
    spec = ScenarioSpec(parties=PARTIES, samples=SamplesSpec(layout="missing", **samples))  # type: ignore[arg-type]
    return spec.build(make_dataset(n=2000, n_features=10), seed=3)


def _holders(layout, ids: np.ndarray) -> np.ndarray:  # type: ignore[no-untyped-def]
    """How many of the four partners hold each of ``ids``."""
    return sum(np.isin(ids, layout.ids(f"p{i}")) for i in range(1, 5))


def test_each_partner_lacks_each_training_person_with_p_miss() -> None:
    layout = _layout(p_miss=0.3, test_rows=200, test_absent=0.5, test_seed=1)
    test = layout.held_out("active")
    train = np.setdiff1d(layout.ids("a"), test)
    assert len(layout.ids("a")) == 2000 and len(test) == 200
    for i in range(1, 5):
        share = 1 - np.isin(train, layout.ids(f"p{i}")).mean()
        assert abs(share - 0.3) < 0.04, share
    # Every test person lacks exactly two of the four partners, a different two from person to person.
    assert (_holders(layout, test) == 2).all()
    pairs = {tuple(bool(pid in set(layout.ids(f"p{i}"))) for i in range(1, 5)) for pid in test}
    assert len(pairs) == 6
    # The same test people and who lacks them, whatever p_miss (test_seed); the same layout for the same seed.
    again = _layout(p_miss=0.0, test_rows=200, test_absent=0.5, test_seed=1)
    assert np.array_equal(again.held_out("active"), test)
    assert all(np.array_equal(np.isin(test, again.ids(f"p{i}")), np.isin(test, layout.ids(f"p{i}")))
               for i in range(1, 5))
    assert (_holders(again, np.setdiff1d(again.ids("a"), test)) == 4).all()


def test_test_people_absent_at_random_or_none() -> None:
    everyone = _layout(test_rows=100)
    assert (_holders(everyone, everyone.held_out("active")) == 4).all()
    bernoulli = _layout(test_rows=400, test_p_miss=0.5, test_seed=2)
    counts = _holders(bernoulli, bernoulli.held_out("active"))
    assert abs(counts.mean() - 2.0) < 0.25 and {0, 4} <= set(counts.tolist())
    alone = _layout(test_rows=50, test_absent=1.0)
    assert len(alone.held_out("active_only")) == 50 and len(alone.held_out("aligned")) == 0


@pytest.mark.parametrize(("samples", "match"), [
    ({"layout": "missing", "p_miss": 1.0}, "below 1"),
    ({"layout": "missing", "p_miss": -0.1}, r"share in \[0, 1\]"),
    ({"layout": "missing", "test_absent": 0.5, "test_p_miss": 0.5}, "not both"),
    ({"layout": "missing", "test_aligned": 10}, "test_rows"),
    ({"layout": "overlap", "p_miss": 0.2}, "layout = 'missing' only"),
])
def test_bad_missing_layouts_are_refused(samples: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        SamplesSpec(**samples)  # type: ignore[arg-type]


def _parse(text: str, *, quick: bool = False):  # type: ignore[no-untyped-def]
    return parse_config(tomllib.loads(text), quick=quick)


CONFIG = """
name = "fallback"
seed = 0
[dataset]
name = "breast_cancer"
[scenario]
[[scenario.parties]]
name = "h"
role = "active"
n_columns = 6
[[scenario.parties]]
name = "p"
count = 2
share = 1.0
[scenario.samples]
layout = "missing"
p_miss = 0.3
test_rows = 100
test_absent = 0.5
[protocol]
name = "holdout"
[[methods]]
name = "local"
[[methods]]
name = "splitnn"
label = "splitnn+local"
fallback = "local"
train = { max_epochs = 3 }
[[methods]]
name = "laser_vfl"
train = { max_epochs = 3 }
"""


def test_a_collaborative_method_falls_back_on_an_active_only_one(data_dir: Path) -> None:
    config = _parse(CONFIG)
    seen: dict[str, np.ndarray] = {}
    from vflo.federation import simulation

    original = simulation.run_method

    def spy(method, data, **kwargs):  # type: ignore[no-untyped-def]
        out = original(method, data, **kwargs)
        seen[method.name] = out.scores
        seen["ids"] = data.test_ids
        seen["p1"], seen["p2"] = data.serve["p1"].contains(data.test_ids), data.serve["p2"].contains(data.test_ids)
        return out

    from vflo.experiments import runner

    runner.run_method = spy  # type: ignore[assignment]
    try:
        result = run_experiment(config, data_dir=str(data_dir))
    finally:
        runner.run_method = original  # type: ignore[assignment]
    rows = {r["method"]: r for r in result.rows}
    assert all(r["status"] == "ok" for r in result.rows), result.failures
    # Half of two partners is one: no test person is held by both, so local scores them all.
    assert rows["splitnn+local"]["fallback_rows"] == 100
    assert np.array_equal(seen["splitnn"], seen["local"])
    assert rows["splitnn+local"]["accuracy"] == rows["local"]["accuracy"]


def test_a_fallback_is_scored_with_the_partners_where_they_hold_the_person(data_dir: Path) -> None:
    config = _parse(CONFIG.replace("test_absent = 0.5", "test_p_miss = 0.3"))
    result = run_experiment(config, data_dir=str(data_dir))
    rows = {r["method"]: r for r in result.rows}
    assert 0 < rows["splitnn+local"]["fallback_rows"] < 100
    assert rows["splitnn+local"]["accuracy"] != rows["local"]["accuracy"]


@pytest.mark.parametrize(("methods", "match"), [
    ('[[methods]]\nname = "splitnn"\nfallback = "local"\n[[methods]]\nname = "local"\n', "listed before"),
    ('[[methods]]\nname = "rap"\n[[methods]]\nname = "splitnn"\nfallback = "rap"\n', "active party alone"),
    ('[[methods]]\nname = "local"\n[[methods]]\nname = "apc_vfl"\nfallback = "local"\n', "needs no fallback"),
])
def test_bad_fallbacks_are_refused(methods: str, match: str) -> None:
    head = CONFIG[: CONFIG.index("[[methods]]")]
    with pytest.raises(ConfigError, match=match):
        _parse(head + methods)


def test_the_example_config_runs_quick(data_dir: Path) -> None:
    config = load_config(Path(__file__).resolve().parents[1] / "configs/examples/missing_partners.toml",
                             quick=True)
    assert len(config.variants) == 12
    small = _parse(Path(__file__).resolve().parents[1].joinpath(
        "configs/examples/missing_partners.toml").read_text().replace(
        '"samples.test_absent" = [0.0, 0.25, 0.5, 1.0]', '"samples.test_absent" = [0.5]').replace(
        '"samples.p_miss" = [0.0, 0.1, 0.5]', '"samples.p_miss" = [0.1]'), quick=True)
    result = run_experiment(small, data_dir=str(data_dir))
    assert {r["method"] for r in result.rows} == {"local", "splitnn+local", "apc_vfl", "plugvfl", "laser_vfl"}
    assert all(r["status"] == "ok" for r in result.rows), result.failures
