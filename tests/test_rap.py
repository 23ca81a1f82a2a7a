"""RAP: transforms, one round, serving, baselines, the server's attacks and distance-preserving uses."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import make_dataset
from vflo.data.datasets import Dataset
from vflo.data.layout import FederatedData
from vflo.data.partydata import PartyData
from vflo.data.scenario import PartySpec, ScenarioSpec
from vflo.dp import RowNoise
from vflo.errors import ConfigError, DataError, RemoteError, ScenarioError
from vflo.federation.simulation import run_method
from vflo.methods.rap import ClientTransform, LabelTransform, label_matrix, whiten, whitening
from vflo.methods.registry import get_method
from vflo.metrics import compute_metrics
from vflo.privacy.attacks import attack_report, known_means
from vflo.privacy.distance import distortion, kmeans_agreement, neighbour_recall

# The client's keyed noise for the pseudo feature (its secret key stands in for a party's own).
PSEUDO = RowNoise(b"pseudo-feature-key")

FAST = {"model": "mlp", "hidden": [32], "train": {"lr": 1e-2, "batch_size": 64, "max_epochs": 30, "patience": 3,
                                                  "validation_fraction": 0.125, "stop": "plateau"}}


def _rap_data(n: int = 600, clients: int = 3, task: str | None = None, owner_columns: int = 2, seed: int = 0,
              dataset: Dataset | None = None) -> FederatedData:
    ds = dataset if dataset is not None else make_dataset(n=n, n_features=8, seed=seed, task=task)
    parties = (PartySpec(name="owner", role="active", n_columns=owner_columns) if owner_columns else
               PartySpec(name="owner", role="active", columns=()),
               *(PartySpec(name=f"c{i}", n_columns=(8 - owner_columns) // clients) for i in range(clients)))
    layout = ScenarioSpec(parties=parties, unused_columns="drop").build(ds, seed=seed)
    return layout.materialize(test_ids=np.sort(layout.ids("owner"))[::5])


def test_one_round_for_training_and_bytes_are_the_projected_matrices() -> None:
    data = _rap_data()
    method = get_method("rap")(estimator=FAST)
    out = run_method(method, data, seed=0)
    fit = out.fit_summary
    # Scoring: the label owner opens a scoring session at each client (the only rows the server may then ask
    # them for), then asks the server: two rounds.
    assert fit.rounds == 1 and out.predict_summary.rounds == 2
    n = method.n_train_
    replies = [e for e in out.ledger.entries[: out.fit_entries] if e.kind == "rap.project" and e.direction == "reply"]
    assert len(replies) == 3
    for e in replies:  # each client's reply: its n x 2 float32 projection, plus a header of a few hundred bytes
        assert 0 < e.nbytes - n * 2 * 4 < 300
    assert compute_metrics(data.task, data.test_y, out.scores)["accuracy"] > 0.6


def test_rap_is_close_to_centralized_and_above_single() -> None:
    data = _rap_data(n=1500, owner_columns=2, clients=3)
    rap = compute_metrics(data.task, data.test_y, run_method(get_method("rap")(estimator=FAST), data, seed=0).scores)
    central = compute_metrics(data.task, data.test_y,
                              run_method(get_method("centralized")(**FAST), data, seed=0).scores)
    single = compute_metrics(data.task, data.test_y, run_method(get_method("single")(**FAST), data, seed=0).scores)
    assert abs(rap["accuracy"] - central["accuracy"]) < 0.05
    assert rap["accuracy"] > single["accuracy"]


def test_regression_decodes_through_the_label_projection() -> None:
    data = _rap_data(n=1200, task="regression")
    central = compute_metrics("regression", data.test_y,
                              run_method(get_method("centralized")(**FAST), data, seed=0).scores)["rmse"]
    outs = {k: run_method(get_method("rap")(estimator=FAST, label_models=k), data, seed=0) for k in ("one", "two")}
    for out in outs.values():  # one server model with two outputs, or the paper's two models
        rmse = compute_metrics("regression", data.test_y, out.scores)["rmse"]
        assert rmse < 0.5 * np.std(data.test_y) and rmse < 1.5 * central
    assert outs["one"].ledger.summary().bytes == outs["two"].ledger.summary().bytes  # the server's choice alone
    with pytest.raises(ConfigError, match="label_models = 'one' fits both .* needs several outputs"):
        run_method(get_method("rap")(estimator={"model": "RandomForestRegressor"}, label_models="one"), data, seed=0)
    # for classes there is one server target, so any classifier will do
    classes = _rap_data(n=300)
    run_method(get_method("rap")(estimator={"model": "logistic"}), classes, seed=0)


def test_the_server_whitens_what_it_received() -> None:
    rng = np.random.default_rng(0)
    Z = rng.normal(size=(2000, 4)) @ rng.normal(size=(4, 4))
    onehot = np.eye(3)[rng.integers(0, 3, size=2000)]  # its columns sum to 1: one direction has no variance
    X = np.hstack([Z, onehot]).astype(np.float32)
    fitted = whitening(X)
    W = whiten(X, fitted)
    assert W.shape == (2000, 6)  # 4 + 3 - 1 directions kept
    assert np.allclose(np.cov(W, rowvar=False), np.eye(6), atol=1e-3)
    data = _rap_data(n=600, task="binary")
    plain = run_method(get_method("rap")(estimator=FAST, whiten=False), data, seed=0)
    white = run_method(get_method("rap")(estimator=FAST, whiten_min_rows=1), data, seed=0)
    assert plain.ledger.summary().bytes == white.ledger.summary().bytes  # the server's own step: nothing crosses
    assert not np.allclose(plain.scores, white.scores)
    # too few rows per column to estimate the covariance: the server trains on what it got
    few = run_method(get_method("rap")(estimator=FAST, whiten_min_rows=10_000), data, seed=0)
    assert np.allclose(plain.scores, few.scores)
    with pytest.raises(ConfigError, match="whiten_min_rows must be at least 1"):
        get_method("rap")(whiten_min_rows=0)


def test_one_hot_blocks_are_not_whitened_unless_asked() -> None:
    import dataclasses

    ds = make_dataset(n=800, n_features=8)
    X = ds.X.copy()
    X["f0"] = (X["f0"] > 0).astype(float)  # an indicator column: its client one-hot encodes it
    data = _rap_data(dataset=dataclasses.replace(ds, X=X, categorical=("f0",)), owner_columns=0, clients=2)
    scores = [run_method(get_method("rap")(estimator=FAST, whiten_min_rows=1, **k), data, seed=0).scores
              for k in ({}, {"whiten": False}, {"whiten_one_hot": True})]
    assert np.array_equal(scores[0], scores[1])  # a client said 2 of its columns are one-hot: not whitened
    assert not np.allclose(scores[0], scores[2])
    # linearly dependent numerical columns are no reason to skip it (the SUSY stand-in has 5 of 18)
    X = ds.X.copy()
    X["f1"] = X["f2"] + X["f3"]
    data = _rap_data(dataset=dataclasses.replace(ds, X=X), owner_columns=0, clients=2)
    plain, white = (run_method(get_method("rap")(estimator=FAST, whiten_min_rows=1, whiten=w), data, seed=0).scores
                    for w in (False, True))
    assert not np.allclose(plain, white)


def test_a_client_that_sends_a_bad_one_hot_count_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ClientTransform, "one_hot_width", property(lambda self: -1))
    with pytest.raises(RemoteError, match="client 'c0' sent a one-hot column count of -1"):
        run_method(get_method("rap")(estimator=FAST), _rap_data(owner_columns=0, clients=2), seed=0)


def test_an_mlp_fits_several_regression_targets_at_once() -> None:
    from vflo.nn.estimators import EstimatorConfig, make_estimator
    from vflo.nn.train import TrainConfig

    rng = np.random.default_rng(0)
    X = rng.normal(size=(600, 3)).astype(np.float32)
    y = np.column_stack([X[:, 0] * 100 + 5, X[:, 1] * 0.01 - 2])  # very different scales: standardised apiece
    config = EstimatorConfig(model="mlp", hidden=(16,), train=TrainConfig(lr=1e-2, max_epochs=30))
    est = make_estimator(config, task="regression", n_classes=None, seed=0).fit(X, y)
    pred = est.predict_scores(X)
    assert pred.shape == (600, 2)
    for j in range(2):
        assert np.corrcoef(pred[:, j], y[:, j])[0, 1] > 0.9


def test_label_transforms_round_trip() -> None:
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, size=200)
    t = LabelTransform.fit(y, "multiclass", 3, rng)
    encoded = t.encode(y, rng)[:, 0]
    assert set(encoded.tolist()) <= set(range(6))
    for c in range(3):  # each class lands on its own two new classes, each about half the time
        assert set(encoded[y == c].tolist()) == set(t.mapping[c].tolist())  # type: ignore[index]
    onehot = np.eye(6)[encoded]
    assert np.array_equal(t.decode(onehot).argmax(1), y)
    yr = rng.normal(size=100)
    tr = LabelTransform.fit(yr, "regression", None, rng)
    assert np.allclose(tr.decode(tr.encode(yr, rng).astype(np.float64)), yr, atol=1e-4)
    with pytest.raises(DataError, match="regression task needs numerical labels"):
        LabelTransform.fit(y, "regression", None, rng)
    with pytest.raises(DataError, match="classification task needs class codes"):
        LabelTransform.fit(yr, "binary", 2, rng)


def test_the_label_matrix_is_redrawn_until_well_conditioned() -> None:
    # A badly conditioned A_Y leaves y a few per cent of both server targets (RMSE 3x worse on the WOC stand-in).
    rng = np.random.default_rng(3)
    conds = [np.linalg.cond(label_matrix(rng, 2.0)) for _ in range(200)]
    assert max(conds) <= 2.0
    unbounded = [np.linalg.cond(label_matrix(rng, np.inf)) for _ in range(200)]
    assert max(unbounded) > 2.0  # the bound is what keeps them there
    y = rng.normal(size=50)
    assert np.linalg.cond(LabelTransform.fit(y, "regression", None, rng, max_condition=1.5).A) <= 1.5
    for off in (0.5, 0.0, -1.0, float("nan")):  # 0 no longer switches the check off: a bound { max = 10 } holds
        with pytest.raises(ConfigError, match=r"label_max_condition must be at least 1 \(inf turns the check off\)"):
            get_method("rap")(label_max_condition=off)


def test_the_pseudo_label_scale() -> None:
    rng = np.random.default_rng(4)
    y = rng.normal(5.0, 2.0, size=5000)
    quarter = LabelTransform.fit(y, "regression", None, rng, pseudo_scale=0.25)
    assert quarter.pseudo is not None and np.isclose(quarter.pseudo[1], 0.25 * y.std())
    encoded = quarter.encode(y, rng).astype(np.float64)
    assert np.allclose(quarter.decode(encoded), y, atol=1e-3)  # still decoded exactly
    pseudo = (encoded @ np.linalg.inv(quarter.A))[:, 1]  # type: ignore[arg-type]
    assert 0.45 < pseudo.std() < 0.55  # 0.25 x std y
    with pytest.raises(ConfigError, match="pseudo_label_scale must be positive"):
        get_method("rap")(pseudo_label_scale=0.0)


def test_client_transform_special_cases() -> None:
    rng = np.random.default_rng(0)
    one = PartyData(party="c", ids=np.arange(50), X=rng.normal(size=(50, 1)), columns=("salary",))
    t = ClientTransform.fit(one, rng, other=False, pseudo=True)
    assert t.width == 2 and t.pseudo is not None  # a pseudo feature joins the single real one
    cat = PartyData(party="c", ids=np.arange(6), X=np.array([[0, 1.5], [1, 2.0], [2, 0.1], [0, 1], [1, 2], [2, 3]]),
                    columns=("colour", "size"), categorical=("colour",))
    tc = ClientTransform.fit(cat, rng, other=False, pseudo=True)
    assert tc.width == 4  # 3 categories one-hot + 1 numeric
    unseen = PartyData(party="c", ids=[9], X=np.array([[5, 1.0]]), columns=("colour", "size"),
                       categorical=("colour",))
    with pytest.raises(DataError, match="categories \\[5.0\\] not seen in training"):
        tc.project(unseen, PSEUDO)
    with_other = ClientTransform.fit(cat, rng, other=True, pseudo=True)
    assert with_other.width == 5 and with_other.project(unseen, PSEUDO).shape == (1, 5)
    single = PartyData(party="c", ids=np.arange(3), X=np.array([[1, 0.2], [1, 0.3], [1, 0.1]]),
                       columns=("kind", "v"), categorical=("kind",))
    with pytest.raises(DataError, match="has a single category"):
        ClientTransform.fit(single, rng, other=False, pseudo=True)
    with pytest.raises(DataError, match="not\\s+the 2 columns"):
        tc.project(PartyData(party="c", ids=[1], X=np.zeros((1, 2)), columns=("size", "colour")), PSEUDO)


def test_bad_input() -> None:
    # a client without columns is refused when the scenario is built, before any method runs ...
    ds = make_dataset(n=200, n_features=4)
    spec = ScenarioSpec(parties=(PartySpec(name="owner", role="active", n_columns=4),
                                 PartySpec(name="empty", columns=())))
    with pytest.raises(ScenarioError, match=r"passive parties \['empty'\] would hold no columns"):
        spec.build(ds, seed=0)
    # ... and RAP's client says so too if handed one anyway
    with pytest.raises(DataError, match="holds no feature column"):
        ClientTransform.fit(PartyData(party="c", ids=[1, 2], X=np.zeros((2, 0)), columns=()), np.random.default_rng(0),
                            other=False, pseudo=True)
    with pytest.raises(ConfigError, match="lr_grid values must be positive"):
        get_method("rap")(lr_grid=(0.0,))
    with pytest.raises(DataError, match="NaN or infinite"):
        PartyData(party="c", ids=[1], X=np.array([[np.inf]]), columns=("a",))


def test_learning_rate_grid_and_ldp_baseline() -> None:
    data = _rap_data()
    out = run_method(get_method("rap")(estimator=FAST, lr_grid=(0.1, 0.01)), data, seed=0)
    assert out.fit_summary.rounds == 1
    noisy = run_method(get_method("ldp")(estimator=FAST, epsilon=0.5), data, seed=0)
    clean = run_method(get_method("ldp")(estimator=FAST, epsilon=100.0), data, seed=0)
    acc = [compute_metrics(data.task, data.test_y, o.scores)["accuracy"] for o in (noisy, clean)]
    assert acc[1] > acc[0]


def test_server_attacks_and_the_pseudo_feature_defence() -> None:
    rng = np.random.default_rng(0)
    X = rng.normal(3.0, 1.0, size=(500, 4))
    data = PartyData(party="c", ids=np.arange(500), X=X, columns=tuple("abcd"))
    t = ClientTransform.fit(data, rng, other=False, pseudo=True)
    Xt = t.project(data, PSEUDO)
    report = attack_report(Xt, X, n_known=10)
    assert report["known_rows_with_collusion"] < 1e-3           # n >= F and IDs revealed: recovered
    assert report["known_rows_no_collusion"] > 0.5              # blind pairing: not recovered
    assert report["no_knowledge"] > 0.5 and report["known_means"] > 0.5
    salary = X[:, :1]
    one = PartyData(party="c", ids=np.arange(500), X=salary, columns=("salary",))
    bare = ClientTransform.fit(one, rng, other=False, pseudo=False)
    assert known_means(bare.project(one, PSEUDO), salary) < 1e-4  # the scale estimate recovers it
    defended = ClientTransform.fit(one, rng, other=False, pseudo=True)
    assert known_means(defended.project(one, PSEUDO), salary) > 0.3


def test_projections_preserve_distances_for_clustering_and_search() -> None:
    rng = np.random.default_rng(0)
    centres = rng.normal(0, 6, size=(4, 20))
    X = np.vstack([c + rng.normal(size=(100, 20)) for c in centres])
    A = rng.normal(0, 1 / np.sqrt(20), size=(20, 20))
    Xt = X @ A
    low, high = distortion(X, Xt)
    assert low > 0.5 and high < 1.6
    assert kmeans_agreement(X, Xt, k=4) > 0.95
    # within tight clusters the exact neighbours shuffle, but far more survive than by chance (10 / 399)
    assert neighbour_recall(X, Xt, k=10) > 10 * 10 / 399
