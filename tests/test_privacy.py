"""Attacks and defences: each attack recovers a leaky toy message and not pure noise; each defence's noise is
calibrated to its (ε, δ) and off by default; the harness reads only the messages a party received."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.test_methods import data_for, quick
from vflo.comm.message import Message
from vflo.dp import GaussianNoise, gdp_delta, gdp_epsilon, laplace_epsilon
from vflo.errors import ConfigError
from vflo.methods.registry import get_method
from vflo.privacy.evaluate import attack_run
from vflo.privacy.identity import exposure
from vflo.privacy.label_inference import direction_scores, gradient_attacks, model_completion, norm_scores
from vflo.privacy.reconstruction import decode
from vflo.privacy.views import gradients_received, representations_received


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
    assert norm_scores(np.array([[3.0, 4.0]])).tolist() == [5.0]
    assert direction_scores(np.array([[1.0, 0.0], [0.0, 2.0], [-1.0, 0.0]]), 0).tolist() == [1.0, 0.0, -1.0]


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
    # GDP accounting: δ(ε) at the reported ε is the target δ; k releases compose as μ = √k · 2/σ.
    eps = noise.epsilon(releases=1)
    assert math.isclose(gdp_delta(2.0 / 1.5, eps), 1e-5, rel_tol=1e-3)
    assert math.isclose(noise.epsilon(releases=4), gdp_epsilon(2 * 2.0 / 1.5, 1e-5), rel_tol=1e-9)
    assert noise.epsilon(releases=4) > eps > GaussianNoise(noise_multiplier=6.0).epsilon()
    # Checked against the conversion computed independently with scipy's normal distribution.
    from scipy.stats import norm

    e = gdp_epsilon(1.0, 1e-5)
    assert math.isclose(norm.cdf(-e + 0.5) - math.exp(e) * norm.cdf(-e - 0.5), 1e-5, rel_tol=1e-4)
    assert laplace_epsilon(0.5, 6) == 3.0
    # Little noise: ε in the hundreds, where e^ε overflowed a float before the conversion went to log space.
    assert 300 < GaussianNoise(noise_multiplier=0.5).epsilon(30) < 400
    assert GaussianNoise(noise_multiplier=0.001).epsilon(100) == math.inf
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


def test_attacks_read_only_what_the_attacker_received() -> None:
    data = data_for("splitnn")
    result = attack_run(quick("splitnn"), data, seed=0, known=(0.0, 0.1), decoders=("ridge",), completion=(10,))
    assert {"metrics", "labels", "features", "identity"} <= set(result)
    assert "pas" in result["labels"] and "act <- pas" in result["features"]
    # The views see a party's messages only: the active party received no gradients.
    messages = [Message("act", "pas", "split.backward", 1, {"grad": np.ones((2, 3))})]
    with pytest.raises(ConfigError, match="received no gradients"):
        gradients_received(messages, "act")
    assert representations_received(messages, "pas") == []
