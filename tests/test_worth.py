"""What each partner is worth: Shapley values over the partners, from one any-subset model (every subset's score
from the same model, the others absent) or by retraining per subset; leave-one-out, labelled as such."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.conftest import make_dataset
from vflo.api import fit
from vflo.data.layout import FederatedData
from vflo.data.scenario import PartySpec, ScenarioSpec
from vflo.errors import ConfigError
from vflo.methods.registry import get_method
from vflo.worth import any_subset_worth, only, retrained_worth, shapley, subsets, value, worth_of

TRAIN = {"lr": 3e-3, "batch_size": 64, "max_epochs": 8, "validation_fraction": 0.0}


def _three(seed: int = 0) -> FederatedData:
    """An active party and three partners, each with two columns of every person."""
    ds = make_dataset(n=500, n_features=8, seed=seed)
    spec = ScenarioSpec(parties=(PartySpec(name="a", role="active", n_columns=2), PartySpec(name="p1", n_columns=2),
                                 PartySpec(name="p2", n_columns=2), PartySpec(name="p3", n_columns=2)))
    layout = spec.build(ds, seed=seed)
    return layout.materialize(test_ids=np.sort(layout.aligned_ids())[:100])


def test_shapley_of_known_games() -> None:
    partners = ("x", "y", "z")
    weights = {"x": 0.5, "y": 0.2, "z": 0.0}
    additive = {s: sum(weights[p] for p in s) for s in subsets(partners)}
    assert shapley(additive, partners) == pytest.approx(weights)
    # Two partners that help only together share it equally; one that never helps gets nothing.
    pair = {s: 1.0 if {"x", "y"} <= s else 0.0 for s in subsets(partners)}
    assert shapley(pair, partners) == pytest.approx({"x": 0.5, "y": 0.5, "z": 0.0})
    assert len(subsets(partners)) == 8 and frozenset() in subsets(partners)


def test_value_is_higher_for_better_scores() -> None:
    y = np.array([0, 1, 1])
    sure, unsure = np.array([[0.9, 0.1], [0.1, 0.9], [0.2, 0.8]]), np.full((3, 2), 0.5)
    assert value("binary", y, sure) > value("binary", y, unsure) == pytest.approx(math.log(0.5))
    assert value("binary", y, sure, "accuracy") == 1.0
    assert value("regression", np.array([1.0, 2.0]), np.array([1.0, 3.0])) == -0.5
    assert value("regression", np.array([1.0, 2.0]), np.array([1.0, 3.0]), "rmse") == -math.sqrt(0.5)


def test_one_any_subset_model_values_every_subset_and_its_shapley_values_add_up() -> None:
    data = _three()
    found = any_subset_worth(get_method("laser_vfl")(train=TRAIN), data, seed=0, bootstrap=50)
    assert found.how == "any subset" and set(found.values) == set(subsets(("p1", "p2", "p3")))
    # Efficiency: the partners' values add up to what all of them add to the active party alone.
    total = found.values[frozenset({"p1", "p2", "p3"})] - found.values[frozenset()]
    assert sum(found.worth.values()) == pytest.approx(total)
    for p, (low, high) in found.interval.items():
        assert low <= high and low - 0.2 <= found.worth[p] <= high + 0.2
    # Each subset's score is the model's with the others absent: all of them, the full model's own scores.
    model = fit(get_method("laser_vfl")(train=TRAIN), data, seed=0)
    full = model.predict()
    assert np.array_equal(model.predict(partners=["p1", "p2", "p3"]), full)
    assert found.values[frozenset({"p1", "p2", "p3"})] == pytest.approx(value("binary", data.test_y, full))
    alone = model.predict(partners=[])
    assert not np.array_equal(alone, full) and found.values[frozenset()] == \
        pytest.approx(value("binary", data.test_y, alone))
    assert np.array_equal(model.predict(), full)  # the model scores with everyone again after a subset
    # Valued after training from the model already trained: the same worth, only the scoring timed.
    after = worth_of(model, bootstrap=50, seed=0)
    assert after.values == found.values and after.worth == found.worth and after.interval == found.interval
    assert after.training_seconds == 0.0 and found.training_seconds > 0.0
    with pytest.raises(ConfigError, match=r"partners \['p9'\] are not among"):
        model.predict(partners=["p9"])


def test_a_method_that_needs_every_partner_is_valued_by_retraining() -> None:
    data = _three()
    with pytest.raises(ConfigError, match="cannot value its partners from one model.*party_dropout"):
        any_subset_worth(get_method("splitnn")(train=TRAIN), data)
    model = fit(get_method("splitnn")(train=TRAIN), data, seed=0)
    with pytest.raises(ConfigError, match="cannot score with a subset of its partners"):
        model.predict(partners=["p1"])
    loo = retrained_worth(lambda: get_method("splitnn")(train=TRAIN), data, seed=0, leave_one_out=True)
    everyone = frozenset({"p1", "p2", "p3"})
    assert loo.how == "leave one out (retrained)" and set(loo.values) == {everyone, *(everyone - {p} for p in
                                                                                      ("p1", "p2", "p3"))}
    assert loo.worth == {p: pytest.approx(loo.values[everyone] - loo.values[everyone - {p}]) for p in everyone}
    # Retraining on a subset trains with the active party and those partners alone.
    part = only(data, frozenset({"p2"}))
    assert [p.name for p in part.parties] == ["a", "p2"] and set(part.train) == {"a", "p2"}


def test_vflo_worth_values_a_configs_partners(tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    from pathlib import Path

    from vflo.cli import main

    folder = Path(str(tmp_path))
    config = folder / "wine.toml"
    config.write_text('name = "w"\nseed = 0\n[dataset]\nname = "wine"\n[scenario]\nfeature_split = "sequential"\n'
                      '[[scenario.parties]]\nname = "a"\nrole = "active"\nshare = 1.0\n'
                      '[[scenario.parties]]\nname = "b"\nshare = 1.0\n[[scenario.parties]]\nname = "c"\nshare = 1.0\n'
                      '[[methods]]\nname = "laser_vfl"\ntrain = { max_epochs = 5, validation_fraction = 0.0 }\n')
    assert main(["worth", str(config), "--method", "laser_vfl", "--bootstrap", "20", "--out", str(folder)]) == 0
    said = capsys.readouterr().out
    assert "each partner's worth (any subset" in said and "95 % interval" in said
    import json

    saved = json.loads((folder / "worth.json").read_text())
    assert set(saved["worth"]) == {"b", "c"} and "(active alone)" in saved["values"]
    assert main(["worth", str(config), "--method", "nope"]) == 2


@pytest.mark.parametrize("name, settings", [
    ("secureboost", {"he": {"scheme": "plaintext"}, "n_trees": 3, "max_depth": 3}),
    ("splitnn", {"party_dropout": 0.3, "train": {"max_epochs": 3, "batch_size": 64}}),
])
def test_every_any_subset_method_is_valued_from_one_model(name: str, settings: dict[str, object]) -> None:
    data = _three()
    found = any_subset_worth(get_method(name)(**settings), data, seed=0, bootstrap=10)
    everyone = frozenset({"p1", "p2", "p3"})
    assert sum(found.worth.values()) == pytest.approx(found.values[everyone] - found.values[frozenset()])
    assert len(set(found.values.values())) > 1  # the subsets score differently: partners were left out
