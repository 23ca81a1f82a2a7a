"""The attack columns a run's row gets (``[attacks]``): the best attack against the attacker's own data, and
which counts as a leak."""

from __future__ import annotations

import math

import pytest

from tests.test_methods import data_for
from vflo.errors import ConfigError
from vflo.federation.simulation import run_method
from vflo.methods.registry import get_method
from vflo.privacy.columns import COLUMNS, AttackSettings, _features, _labels, attack_columns


def _fit(r2: float) -> dict[str, float]:
    return {"r2_mean": r2}


def test_a_reconstruction_leaks_only_past_the_receivers_own_features_and_guessing_the_mean() -> None:
    settings = AttackSettings()
    key = "ridge@0.05"
    # Two flows: the one that gains most over the receiver's own features is the one reported.
    found = {"a": {key: _fit(0.6), f"own features {key}": _fit(0.5)},
             "b": {key: _fit(0.3), f"averaged {key}": _fit(0.4), f"own features {key}": _fit(-0.2)}}
    out = _features(found, settings)
    assert out["attack_r2"] == 0.4 and out["attack_own_r2"] == -0.2 and out["attack_margin"] == pytest.approx(0.4)
    assert out["attack_leaks"] == 1.0
    # Below zero, an attack does no better than guessing the known rows' mean, whatever its own features give.
    assert _features({"c": {key: _fit(-0.1), f"own features {key}": _fit(-0.5)}}, settings)["attack_leaks"] == 0.0
    assert _features({"d": {key: _fit(0.52), f"own features {key}": _fit(0.5)}}, settings)["attack_leaks"] == 0.0
    assert _features({}, settings)["attack_leaks"] == 0.0 and math.isnan(_features({}, settings)["attack_r2"])


def test_label_inference_leaks_past_chance_or_past_the_partys_own_features_and_the_majority() -> None:
    settings = AttackSettings(labels=40)
    quiet = {"p": {"norm_auc": 0.52, "direction_auc": 0.54, "completion_40": 0.70, "completion_raw_40": 0.60,
                   "majority": 0.68}}
    assert _labels(quiet, settings)["label_leaks"] == 0.0  # 0.70 is within 0.05 of always answering 0.68
    assert _labels(quiet, settings)["label_completion_own"] == 0.68
    loud = {"p": {**quiet["p"], "direction_auc": 0.9}}
    assert _labels(loud, settings)["label_leaks"] == 1.0 and _labels(loud, settings)["label_auc"] == 0.9


def test_a_run_is_attacked_from_the_messages_that_crossed() -> None:
    data = data_for("splitnn")
    seen: list = []
    split = get_method("splitnn")(train={"max_epochs": 3, "patience": 0, "batch_size": 32})
    run_method(split, data, seed=0, observers=(seen.append,))
    out = attack_columns(seen, data, AttackSettings(), seed=0)
    assert set(out) == set(COLUMNS)
    assert out["label_auc"] > 0.9 and out["label_leaks"] == 1.0  # the gradients' direction gives the labels away
    assert not math.isnan(out["attack_r2"])
    nothing = attack_columns([], data, AttackSettings(), seed=0)
    assert nothing["attack_leaks"] == 0.0 and nothing["label_leaks"] == 0.0


@pytest.mark.parametrize(("table", "named"), [({"known": 0.0}, "attacks.known"), ({"labels": 1}, "attacks.labels"),
                                              ({"decoder": "lstm"}, "attacks.decoder"),
                                              ({"max_rows": 10}, "attacks.max_rows")])
def test_bad_attack_settings_are_named(table: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        AttackSettings(**table)  # type: ignore[arg-type]
