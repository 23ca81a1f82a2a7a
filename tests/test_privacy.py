"""Attacks and defences: each attack recovers a leaky toy message and not pure noise; each defence's noise is
calibrated to its (ε, δ) and off by default; the harness reads only the messages a party received."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import pytest

from tests.test_methods import data_for, quick
from vflo.comm.message import Message
from vflo.data.layout import FederatedData
from vflo.dp import GaussianNoise, gdp_delta, gdp_epsilon, laplace_epsilon
from vflo.errors import ConfigError
from vflo.methods.registry import get_method
from vflo.privacy.evaluate import attack_run
from vflo.privacy.identity import exposure
from vflo.privacy.label_inference import (
    direction_scores,
    either_way,
    gradient_attacks,
    model_completion,
    norm_scores,
)
from vflo.privacy.reconstruction import decode, decode_each, fit_decoder, known_rows, rows_digest
from vflo.privacy.views import Releases, activations_sent, gradients_received, representations_received


def test_feature_reconstruction_recovers_a_leaky_message_and_not_noise() -> None:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 5))
    leaky = X @ rng.normal(size=(5, 8)) + 0.01 * rng.normal(size=(400, 8))  # a linear map of the features
    assert decode(leaky, X, known=0.05, decoder="ridge", rng=rng)["r2_mean"] > 0.99
    assert decode(np.tanh(leaky / 3), X, known=0.5, decoder="mlp", rng=rng)["r2_mean"] > 0.8
    noise = rng.normal(size=(400, 8))
    for decoder in ("ridge", "mlp"):
        assert decode(noise, X, known=0.1, decoder=decoder, rng=rng)["r2_mean"] < 0.05
    blind = decode(leaky, X, known=0.0, decoder="ridge", rng=rng)
    assert blind["known_rows"] == 0 and abs(blind["r2_mean"]) < 0.05  # no knowledge: the prior mean
    with pytest.raises(ConfigError, match="decoder must be"):
        decode(leaky, X, known=0.1, decoder="magic", rng=rng)


def test_label_inference_recovers_labels_from_leaky_gradients_and_not_from_noise() -> None:
    rng = np.random.default_rng(1)
    y = (rng.random(600) < 0.2).astype(int)
    # Gradients of cross-entropy w.r.t. activations: one direction per class, larger for the rarer class.
    direction = rng.normal(size=16)
    grads = np.where(y[:, None] == 1, 1.0, -0.25) * direction + 0.05 * rng.normal(size=(600, 16))
    ids = np.arange(600)
    leaky = gradient_attacks(ids, grads, dict(enumerate(y.tolist())), rng=rng)
    assert leaky["norm_auc"] > 0.95 and leaky["direction_auc"] > 0.95
    noise = gradient_attacks(ids, rng.normal(size=(600, 16)), dict(enumerate(y.tolist())), rng=rng)
    assert abs(noise["norm_auc"] - 0.5) < 0.1 and abs(noise["direction_auc"] - 0.5) < 0.1


def test_label_scoring_reports_the_better_orientation() -> None:
    """Where the negatives get the larger gradients, norm scoring ranks them first: AUC near 0 with label 1 first,
    and the same separation, near 1, either way; an orientation-free AUC is never below 0.5."""
    rng = np.random.default_rng(4)
    y = (rng.random(500) < 0.3).astype(int)
    direction = rng.normal(size=8)
    grads = np.where(y[:, None] == 1, 0.2, -1.0) * direction + 0.02 * rng.normal(size=(500, 8))
    out = gradient_attacks(np.arange(500), grads, dict(enumerate(y.tolist())), rng=rng)
    assert out["norm_auc_positive"] < 0.05 and out["norm_auc"] > 0.95
    assert out["norm_auc"] == either_way(out["norm_auc_positive"])
    assert out["direction_auc"] == either_way(out["direction_auc_positive"]) > 0.95
    for auc in (0.0, 0.2, 0.5, 0.9, 1.0):
        assert 0.5 <= either_way(auc) == either_way(1 - auc)
    assert norm_scores(np.array([[3.0, 4.0]])).tolist() == [5.0]
    assert direction_scores(np.array([[1.0, 0.0], [0.0, 2.0], [-1.0, 0.0]]), 0).tolist() == [1.0, 0.0, -1.0]


def test_the_own_features_baseline_uses_the_attacks_decoder_and_known_rows() -> None:
    """One draw of known rows for every input: the same rows (digest and count) and the same decoder for the
    message, its releases averaged and the receiver's own features, each equal to a fit on those rows alone."""
    rng = np.random.default_rng(5)
    X = rng.normal(size=(300, 4))
    message = X @ rng.normal(size=(4, 6))
    own = X[:, :2] + 0.5 * rng.normal(size=(300, 2))  # correlated columns the receiver holds
    for decoder in ("ridge", "mlp"):
        fits = decode_each({"message": message, "own features": own}, X, known=0.1, decoder=decoder,
                           rng=np.random.default_rng(6))
        assert {f["known_digest"] for f in fits.values()} == {fits["message"]["known_digest"]}
        assert {f["known_rows"] for f in fits.values()} == {30} and {f["decoder"] for f in fits.values()} == {decoder}
        seen, rest = known_rows(300, 0.1, np.random.default_rng(6))
        assert fits["message"]["known_digest"] == rows_digest(seen)
        alone = fit_decoder(own, X, seen, rest, decoder=decoder)
        assert alone["r2_mean"] == fits["own features"]["r2_mean"]
        assert fits["message"]["r2_mean"] > fits["own features"]["r2_mean"] + 0.3
    with pytest.raises(ConfigError, match="one row per feature row"):
        decode_each({"message": message[:10]}, X, known=0.1, decoder="ridge", rng=rng)


def test_averaging_a_persons_releases_takes_the_noise_down() -> None:
    """Every person released 25 times with fresh noise: per person, the releases averaged decode far better than
    one release (noise down by 5); first, last and counts pick the right rows, people in order of first release."""
    rng = np.random.default_rng(1)
    X = rng.normal(size=(200, 3))
    clean = X @ rng.normal(size=(3, 5))
    ids = np.asarray([f"id{i}" for i in range(200)])
    order = np.concatenate([rng.permutation(200) for _ in range(25)])
    releases = Releases(ids=ids[order], values=clean[order] + 2.0 * rng.normal(size=(len(order), 5)), sender="pas",
                        receiver="act", kind="splitnn.forward")
    first, last, averaged = releases.first(), releases.last(), releases.averaged()
    assert first.ids.tolist() == ids[order[:200]].tolist() == averaged.ids.tolist() == last.ids.tolist()
    assert np.array_equal(first.values, releases.values[:200])
    last_of = {person: row for person, row in zip(releases.ids.tolist(), releases.values, strict=True)}
    assert np.array_equal(last.values, np.asarray([last_of[i] for i in last.ids.tolist()]))
    assert np.allclose(averaged.values[0], releases.values[releases.ids == averaged.ids[0]].mean(axis=0))
    assert releases.counts().tolist() == [25] * 200
    features = X[order[:200]]
    fits = decode_each({"message": first.values, "averaged": averaged.values}, features, known=0.2, decoder="ridge",
                       rng=rng)
    assert fits["averaged"]["r2_mean"] > 0.85 and fits["message"]["r2_mean"] < 0.5


def test_a_passive_partys_own_activations_are_what_it_sent_last() -> None:
    """The completion input is read from what the party itself sent: its own rows, the last release of each person
    (validation rows included), nothing another party sent."""
    def forward(party: str, subset: str, rows: list[int], value: float) -> list[Message]:
        payload = {"rows": np.asarray(rows, dtype=np.int64), "subset": subset, "training": subset == "train",
                   "keep_previous": False, "epoch": 0}
        return [Message("act", party, "splitnn.forward", 1, payload),
                Message(party, "act", "splitnn.forward", 1, {"acts": np.full((len(rows), 2), value)})]

    messages = []
    for party, ids in (("p1", [10, 11, 12, 13]), ("p2", [10, 11, 12, 13])):
        messages += [Message("act", party, "splitnn.init", 0, {"train_ids": np.asarray(ids[:3]),
                                                               "val_ids": np.asarray(ids[3:])}),
                     Message(party, "act", "splitnn.init", 0, {"width": 2})]
    for epoch in (1.0, 2.0):
        messages += forward("p1", "train", [2, 0], epoch) + forward("p2", "train", [0, 1, 2], 10 * epoch)
        messages += forward("p1", "train", [1], epoch + 0.5) + forward("p1", "val", [0], -epoch)
    sent = activations_sent(messages, "p1", "act")
    assert sent is not None and sent.counts().tolist() == [2, 2, 2, 2]
    final, first = sent.last(), sent.first()
    assert final.ids.tolist() == first.ids.tolist() == [12, 10, 11, 13]
    assert final.values[:, 0].tolist() == [2.0, 2.0, 2.5, -2.0] and first.values[:, 0].tolist() == [1.0, 1.0, 1.5, -1.0]
    assert activations_sent(messages, "act", "p1") is None


def test_model_completion_labels_from_informative_outputs_only() -> None:
    rng = np.random.default_rng(2)
    y = rng.integers(0, 2, size=500)
    informative = y[:, None] + 0.1 * rng.normal(size=(500, 4))
    assert model_completion(informative, y, known=40, rng=rng) > 0.95
    assert abs(model_completion(rng.normal(size=(500, 4)), y, known=40, rng=rng) - 0.5) < 0.1


def test_exposure_counts_only_people_the_receiver_did_not_hold() -> None:
    out = exposure(received=np.array([1, 2, 3, 9]), own=np.array([1, 2]), sender_holds=np.array([1, 3, 9, 10]))
    assert out == {"outside_people": 3.0, "exposed": 2.0, "exposed_fraction": 2 / 3, "intersection_learnt": 1.0}


def test_the_gaussian_mechanism_is_calibrated_and_clips() -> None:
    noise = GaussianNoise(clip=2.0, noise_multiplier=1.5, delta=1e-5)
    rng = np.random.default_rng(3)
    zeros = np.zeros((20000, 4))
    released = noise.release(zeros, rng)
    assert abs(released.std() - 1.5 * 2.0) < 0.03 and abs(released.mean()) < 0.03  # N(0, (σC)²)
    big = np.full((3, 4), 10.0)
    clipped = GaussianNoise(clip=2.0, noise_multiplier=1e-9).release(big, rng)
    assert np.allclose(np.linalg.norm(clipped, axis=1), 2.0)
    # The accountant (dp_accounting's PLD) against the closed form of μ-GDP: δ(ε) at the reported ε is the target δ;
    # k releases compose as μ = √k · 2/σ. The accountant's ε is an upper bound, tight to its discretisation.
    eps = noise.epsilon(releases=1)
    assert math.isclose(gdp_delta(2.0 / 1.5, eps), 1e-5, rel_tol=1e-2) and gdp_delta(2.0 / 1.5, eps) <= 1e-5
    exact = gdp_epsilon(2 * 2.0 / 1.5, 1e-5)
    assert exact <= noise.epsilon(releases=4) <= exact * (1 + 1e-4)
    assert noise.epsilon(releases=4) > eps > GaussianNoise(noise_multiplier=6.0).epsilon()
    # Checked against the conversion computed independently with scipy's normal distribution.
    from scipy.stats import norm

    e = gdp_epsilon(1.0, 1e-5)
    assert math.isclose(norm.cdf(-e + 0.5) - math.exp(e) * norm.cdf(-e - 0.5), 1e-5, rel_tol=1e-4)
    assert laplace_epsilon(0.5, 6) == 3.0
    # Little noise: ε in the hundreds, where e^ε overflowed a float before the conversion went to log space.
    assert 300 < GaussianNoise(noise_multiplier=0.5).epsilon(30) < 400
    assert GaussianNoise(noise_multiplier=0.001).epsilon(100) > 1e6
    with pytest.raises(ConfigError, match="must be positive"):
        GaussianNoise(noise_multiplier=0.0)


@pytest.mark.parametrize(("name", "setting"), [("apc_vfl", "noise"), ("rap", "noise"), ("vfl_asp", "noise"),
                                               ("splitnn", "activation_noise"), ("splitnn", "gradient_noise")])
def test_defences_are_off_by_default_and_noise_what_is_sent(name: str, setting: str) -> None:
    assert getattr(get_method(name)().config, setting) is None
    data = data_for(name)
    kinds = {"apc_vfl": "apc.encode_aligned", "rap": "rap.project", "vfl_asp": "svd.block",
             "splitnn": "split.backward" if setting == "gradient_noise" else "splitnn.forward"}
    field = {"apc.encode_aligned": "z", "rap.project": "x", "svd.block": "block", "split.backward": "grad",
             "splitnn.forward": "acts"}[kinds[name]]

    def sent(method: object) -> np.ndarray:
        seen: list[Message] = []
        from vflo.federation.simulation import run_method

        run = run_method(method, data, seed=0, observers=(seen.append,))  # type: ignore[arg-type]
        values = [m.payload[field] for m in seen if m.kind == kinds[name] and field in m.payload]
        assert values, kinds[name]
        sent.stats = run.stats  # type: ignore[attr-defined]
        return np.asarray(values[0], dtype=np.float64)

    plain = sent(quick(name))
    assert not any(k.startswith("epsilon") for k in sent.stats)  # type: ignore[attr-defined]
    import dataclasses

    config = dataclasses.replace(quick(name).config, **{setting: GaussianNoise(clip=1.0, noise_multiplier=50.0)})
    noisy = sent(get_method(name)(config))
    assert noisy.shape == plain.shape
    assert float(np.std(noisy)) > 10 * float(np.std(plain))  # dominated by N(0, 50²)
    assert any(k.startswith("epsilon") and v < 1.0 for k, v in sent.stats.items())  # type: ignore[attr-defined]


def test_gradient_noise_clips_each_examples_own_gradient_so_its_strength_matters() -> None:
    """Rows of a mean loss's gradient are 1/n of each example's own: clipped as they are, C = 1 never binds and any
    σ drowns the signal alike (Adam is blind to scale, so every σ then trains the same model). Clipped per example,
    little noise keeps the passive party's signal and much noise does not."""
    import dataclasses

    from vflo.federation.simulation import run_method

    data = data_for("splitnn")
    base = quick("splitnn").config

    def run(sigma: float | None) -> np.ndarray:
        noise = None if sigma is None else GaussianNoise(clip=1.0, noise_multiplier=sigma)
        return run_method(get_method("splitnn")(dataclasses.replace(base, gradient_noise=noise)), data,
                          seed=0).scores

    plain, little, some, much = run(None), run(0.01), run(2.0), run(8.0)
    # Clipping the 1/n rows, these two trained the same model up to Adam's ε (scores within 0.002 of each other).
    assert np.abs(some - much).mean() > 0.003
    assert np.abs(little - plain).mean() < np.abs(much - plain).mean()


def labelled(n: int = 400, seed: int = 0) -> FederatedData:
    """The passive party holds the four columns that make the label, through products (x2 x3 + x4 x5 above its
    70th percentile): its raw columns predict the label badly with a linear head, a bottom trained on the label
    well; the active party holds two columns of noise."""
    from tests.conftest import two_party_spec
    from vflo.data.datasets import Dataset

    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 6))
    score = X[:, 2] * X[:, 3] + X[:, 4] * X[:, 5]
    y = (score > np.quantile(score, 0.7)).astype(np.int64)
    ds = Dataset(name="labelled", X=pd.DataFrame(X, columns=[f"f{i}" for i in range(6)]), y=y,
                 ids=np.arange(n, dtype=np.int64), task="binary", n_classes=2, standin=False, source="test data")
    layout = two_party_spec(active_cols=2).build(ds, seed=seed)
    return layout.materialize(test_ids=np.sort(layout.aligned_ids())[:40])


def test_split_learning_leaks_labels_to_the_passive_party_and_its_final_bottom_knows_them() -> None:
    """Undefended SplitNN where the label drives the gradient: the passive party's direction scoring separates the
    classes, orientation-free AUCs are at least 0.5, and model completion on its final bottom (the last activations
    it sent) beats both its first activations and its raw features. The receiver's reconstruction sees every
    release (once per epoch; the test people scored twice), averages them, and its baseline uses the same known
    rows."""
    epochs = 4
    method = get_method("splitnn")(train={"lr": 1e-2, "batch_size": 32, "max_epochs": epochs, "patience": 0})
    result = attack_run(method, labelled(), seed=0, known=(0.0, 0.1), decoders=("ridge",), completion=(40,),
                        serve_repeats=2)
    labels = result["labels"]["pas"]
    assert labels["direction_auc"] > 0.95
    assert min(labels["norm_auc"], labels["direction_auc"]) >= 0.5
    assert labels["norm_auc"] == max(labels["norm_auc_positive"], 1 - labels["norm_auc_positive"])
    assert labels["completion_rows"] == 360  # every person it shares with the active party, validation included
    assert labels["completion_40"] > labels["completion_first_40"] + 0.05
    assert labels["completion_40"] > labels["completion_raw_40"] + 0.1
    assert result["serving"] == {"asked": 2, "answered": 2}
    training, serving = result["features"]["act <- pas: splitnn.forward"], result["features"]["act <- pas: "
                                                                                              "split.activations"]
    assert training["flow"]["releases_max"] == epochs and training["flow"]["people"] == 360
    assert serving["flow"]["releases_max"] == 2 and serving["flow"]["people"] == 40
    for flow in (training, serving):
        fits = [flow[f"{prefix}ridge@0.1"] for prefix in ("", "averaged ", "own features ")]
        assert len({f["known_digest"] for f in fits}) == 1 and len({f["known_rows"] for f in fits}) == 1
    # Nothing received about the active party's own rows, no gradients at the active party.
    assert all(not key.startswith("pas <- ") for key in result["features"]) and "act" not in result["labels"]


def test_attacks_read_only_what_the_attacker_received() -> None:
    with pytest.raises(ConfigError, match="serve_repeats must be at least 1"):
        attack_run(quick("splitnn"), data_for("splitnn"), seed=0, serve_repeats=0)
    # The views see a party's messages only: the active party received no gradients.
    messages = [Message("act", "pas", "split.backward", 1, {"grad": np.ones((2, 3))})]
    with pytest.raises(ConfigError, match="received no gradients"):
        gradients_received(messages, "act")
    assert representations_received(messages, "pas") == []


def _run(method: str, defence: str, level: float, *, flows: dict[str, tuple[float, float, float]],
         auc: float = 0.5, completion: tuple[float, float, float] = (0.7, 0.7, 0.7)) -> dict[str, object]:
    """A result of benchmarks/privacy/run.py, made up: per flow key (R² of one release, averaged, own features
    at 5 % known rows), and the passive party's label attacks."""
    features = {}
    for key, (single, averaged, own) in flows.items():
        fit = {"known_digest": "same", "known_rows": 20}
        features[key] = {"flow": {"kind": key.rpartition(": ")[2], "releases_max": 30},
                         "ridge@0.05": {**fit, "r2_mean": single}, "averaged ridge@0.05": {**fit, "r2_mean": averaged},
                         "own features ridge@0.05": {**fit, "r2_mean": own}}
    final, first, raw = completion
    labels = {"pas": {"norm_auc": auc, "direction_auc": auc, "norm_auc_positive": auc, "direction_auc_positive": auc,
                      "completion_40": final, "completion_first_40": first, "completion_raw_40": raw,
                      "majority": 0.6}}
    return {"method": method, "defence": defence, "level": level, "status": "ok", "dataset": "made_up",
            "partition": "p.toml", "metrics": {"f1_macro": 0.9}, "stats": {"epsilon_features": 3.0} if level else {},
            "features": features, "labels": labels, "identity": {}}


def test_the_reports_verdicts_follow_the_numbers_and_keep_flows_apart() -> None:
    """Every verdict in the generated report is computed with the tables' test (attack against the own-features
    baseline, with a stated margin) and prints the numbers it rests on; a defence's protected flow is reported
    apart from the flows it does not protect."""
    from benchmarks.privacy.report import R2_MARGIN, claims, defended_table, leaks_beyond_own, reconstruction

    close = _run("apc_vfl", "none", 0.0, flows={"act <- pas: apc.encode_aligned": (0.30, float("nan"), 0.28)})
    far = _run("apc_vfl", "none", 0.0, flows={"act <- pas: apc.encode_aligned": (0.30, float("nan"), 0.10)})
    assert leaks_beyond_own(reconstruction(close, "0.05")) is False and leaks_beyond_own(reconstruction(far, "0.05"))
    (holds,), (fails,) = claims({"d": [close]}), claims({"d": [far]})
    assert "the claim holds" in holds and "+0.02" in holds and f"margin of {R2_MARGIN:g}" in holds
    assert "the claim does not hold" in fails and "R² = 0.30" in fails and "0.10" in fails
    # Averaging the releases counts: the better of one release and averaged is the attack.
    averaged = _run("apc_vfl", "none", 0.0, flows={"act <- pas: apc.encode_aligned": (0.10, 0.40, 0.10)})
    assert reconstruction(averaged, "0.05").best == 0.40 and "averaged over up to 30" in claims({"d": [averaged]})[0]

    flows = {"act <- pas: splitnn.forward": (0.05, 0.20, 0.0)}
    runs = [_run("splitnn", "none", 0.0, flows={"act <- pas: splitnn.forward": (0.6, 0.7, 0.0)}, auc=1.0),
            _run("splitnn", "activation_noise", 4.0, flows=flows, auc=0.99),
            _run("splitnn", "gradient_noise", 4.0, flows={"act <- pas: splitnn.forward": (0.6, 0.7, 0.0)}, auc=0.52)]
    table = defended_table(runs)
    activation = next(r for r in table if "activation noise" in r and "| 4.0 |" in r)
    gradient = next(r for r in table if "gradient noise" in r and "| 4.0 |" in r)
    protected, unprotected = activation.split(" | ")[-2:]
    assert "feature R²" in protected and "0.05 (0.20) [0.00]" in protected and "label AUC" not in protected
    assert "label AUC" in unprotected and "0.99" in unprotected and "feature R²" not in unprotected
    protected, unprotected = gradient.split(" | ")[-2:]
    assert "label AUC" in protected and "0.52" in protected and "feature R²" not in protected
    assert "feature R²" in unprotected and "0.60 (0.70)" in unprotected

    def splitnn_claim(auc: float, completion: tuple[float, float, float]) -> str:
        return claims({"d": [_run("splitnn", "none", 0.0, flows={}, auc=auc, completion=completion)]})[0]

    assert "reveal the labels" in splitnn_claim(0.9, (0.9, 0.7, 0.7)) and "adds beyond" in splitnn_claim(
        0.9, (0.9, 0.7, 0.7))
    quiet = splitnn_claim(0.55, (0.71, 0.7, 0.7))
    assert "do not reveal" in quiet and "adds nothing" in quiet and "+0.01" in quiet


def test_the_report_shows_an_end_to_end_run_with_its_target_its_accounts_and_both_flows() -> None:
    from benchmarks.privacy.report import defended_table, scopes

    flows = {"act <- pas: splitnn.forward": (-0.1, 0.0, 0.2)}
    run = _run("splitnn", "budget", 4.0, flows=flows, auc=0.7)
    run["stats"] = {"epsilon_account_pas": 3.9, "epsilon_account_act": 4.0, "epsilon_labels": 4.0}
    run["account_scopes"] = {"pas": "features: ε covers everything the party sent"}
    row = next(r for r in defended_table([run]) if "end to end" in r)
    assert "| target ε 4 | 4.0 |" in row  # the largest party's own account
    protected, unprotected = row.split(" | ")[-2:]
    assert "feature R²" in protected and "label AUC" in protected and unprotected.strip(" |") == "-"
    assert any("splitnn, pas's own account: features: ε covers everything" in line for line in scopes([run]))


def test_the_privacy_axis_section_is_compares_own_table_and_sentences_from_the_runs(tmp_path: Any) -> None:
    import json

    from benchmarks.privacy.report import axis_section

    rows = []
    for axis, value in (("aligned", 0.5), ("epsilon", 4.0)):
        for repeat in range(3):
            for method, score in (("local", 0.90 + 0.01 * repeat), ("splitnn", 0.80 + 0.02 * repeat)):
                rows.append({"axis": axis, "value": value, "scored": "aligned", "method": method, "repeat": repeat,
                             "fold": 0, "status": "ok", "accuracy": score, "attack_r2": 0.3, "attack_own_r2": 0.1,
                             "attack_margin": 0.2, "attack_leaks": float(method == "splitnn" and axis == "aligned"),
                             "label_auc": 0.6, "label_completion": 0.7, "label_completion_own": 0.7,
                             "label_leaks": 0.0, "epsilon_account_pas": 4.0 if axis == "epsilon" else None})
    folder = tmp_path / "axis_breast"
    folder.mkdir()
    (folder / "results.json").write_text(json.dumps({"rows": rows, "metric": "accuracy", "dataset": "made_up",
                                                     "seconds": 60.0, "test_people": 57}))
    (tmp_path / "axis_breast.commit").write_text("abc123\n")
    text = "\n".join(axis_section(tmp_path))
    assert "`vflo compare configs/privacy/axis_breast.toml` (12 method runs, 1.0 min, the code of commit abc123" in text
    assert "At ε = 4 per party, scoring aligned people" in text and "splitnn is behind local" in text
    assert "an attack beats the receiver's own data against splitnn (feature reconstruction)" in text
    assert "| 4 | aligned | splitnn | 0.820 |" in text
    assert axis_section(tmp_path / "nothing") == []
