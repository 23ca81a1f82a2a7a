"""Local, Centralized and SplitNN: against their centralised equivalents, and at the party boundary."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from tests.conftest import make_dataset, two_party_spec
from vflo.data.layout import FederatedData
from vflo.data.scenario import PartySpec, SamplesSpec, ScenarioSpec
from vflo.errors import MethodError
from vflo.federation.session import Session
from vflo.federation.simulation import build_federation, party_secret, run_method
from vflo.methods.base import Method
from vflo.methods.registry import get_method, method_names
from vflo.metrics import compute_metrics
from vflo.nn.models import mlp
from vflo.nn.train import TrainConfig, fit_module
from vflo.seeding import numpy_rng

FAST = {"lr": 1e-2, "batch_size": 32, "max_epochs": 15, "patience": 5}
TINY = {"max_epochs": 2, "patience": 0, "batch_size": 64}


def quick(name: str) -> Method:
    """Every registered method with the settings it names for a short test run (its ``quick`` tag)."""
    cls = get_method(name)
    return cls(**cls.quick)


def needs_second_hop(name: str) -> bool:
    """A method that runs only beside a party sharing no one with the active party (it says why elsewhere)."""
    return isinstance(get_method(name).layout_settings("star"), str)


def data_for(name: str, n: int = 200) -> FederatedData:
    """A scenario each method accepts, from its tags: a method made for a label-only host walks misaligned guests
    (its host holds two columns of its own here), one that needs a second hop gets one."""
    if needs_second_hop(name):
        from vflo.data.scenario import BlockSpec

        ds = make_dataset(n=n, n_features=9)
        spec = ScenarioSpec(parties=(PartySpec(name="act", role="active", share=1.0), PartySpec(name="p1", share=1.0),
                                     PartySpec(name="p2", share=1.0)),
                            samples=SamplesSpec(layout="blocks", blocks=(
                                BlockSpec(parties=("p1", "p2"), rows=n // 3),
                                BlockSpec(parties=("p1", "act"), rows=n // 3),
                                BlockSpec(parties=("act",), rows=n // 3))))
        layout = spec.build(ds, seed=0)
        return layout.materialize(test_ids=np.sort(layout.aligned_ids())[:20])
    if not get_method(name).label_only_active:
        return _split(n=n)
    ds = make_dataset(n=n, n_features=8)
    spec = ScenarioSpec(parties=(PartySpec(name="act", role="active", n_columns=2), PartySpec(name="g1", share=1.0),
                                 PartySpec(name="g2", share=1.0)), samples=SamplesSpec(layout="misaligned",
                                                                                      aligned=0.5))
    layout = spec.build(ds, seed=0)
    return layout.materialize(test_ids=np.sort(layout.aligned_ids())[:20])


def _split(n: int = 400, active_cols: int = 2, aligned: int | float = 1.0, test: int = 60, seed: int = 0,
           task: str | None = None, passive_only: int = 0) -> FederatedData:
    ds = make_dataset(n=n, n_features=8, seed=seed, task=task)
    layout = two_party_spec(active_cols=active_cols, aligned=aligned, active=n - passive_only,
                            passive_only=passive_only).build(ds, seed=seed)
    test_ids = np.sort(layout.aligned_ids())[:test] if len(layout.aligned_ids()) else np.sort(layout.ids("act"))[:test]
    return layout.materialize(test_ids=test_ids)


def test_registry_lists_every_method() -> None:
    assert {"local", "centralized", "splitnn", "apc_vfl", "apc_vfl_aligned", "ablation", "fedsvd",
            "vfedtrans", "entity_augmentation", "rap", "ldp", "single"} <= set(method_names())
    for name in method_names():
        cls = get_method(name)
        assert cls.name == name and cls.__doc__ and cls.summary


def test_local_sends_nothing_and_centralized_beats_it() -> None:
    data = _split()
    local = run_method(get_method("local")(), data, seed=0)
    central = run_method(get_method("centralized")(), data, seed=0)
    assert local.ledger.summary().bytes == 0 and central.ledger.summary().bytes == 0
    acc_local = compute_metrics(data.task, data.test_y, local.scores)["accuracy"]
    acc_central = compute_metrics(data.task, data.test_y, central.scores)["accuracy"]
    assert acc_central > acc_local + 0.1


def test_centralized_equals_a_model_on_the_joined_columns() -> None:
    from sklearn.linear_model import LogisticRegression

    data = _split()
    out = run_method(get_method("centralized")(model="logistic"), data, seed=0)
    # the same model by hand: join the parties' columns on the ID, standardise on training rows
    train = data.oracle.features(data.train["act"].ids)
    mean, std = train.mean(0), train.std(0)
    model = LogisticRegression(max_iter=5000).fit((train - mean) / std, data.train["act"].y)
    expected = model.predict_proba((data.oracle.features(data.test_ids) - mean) / std)
    assert np.allclose(out.scores, expected, atol=1e-4)


def test_centralized_needs_the_simulation_oracle() -> None:
    data = _split()
    method = get_method("centralized")()
    fed, _ = build_federation(data, method, seed=0)
    Session(fed).start(method)
    fed._oracle = None
    from vflo.errors import PartyBoundaryError

    with pytest.raises(PartyBoundaryError, match="only in simulation"):
        method.fit(fed)


def test_one_party_splitnn_equals_a_plain_mlp() -> None:
    """SplitNN with only the active party is bottom + top trained end to end: the same loss curve."""
    ds = make_dataset(n=300, n_features=6)
    spec = ScenarioSpec(parties=(PartySpec(name="solo", role="active", columns="rest"),))
    data = spec.build(ds, seed=0).materialize(test_ids=np.sort(ds.ids)[:30])
    train = TrainConfig(lr=5e-3, batch_size=16, max_epochs=12, patience=0)
    method = get_method("splitnn")(active_bottom=(16, 8), top=(8,), train=train)
    out = run_method(method, data, seed=42)
    assert out.ledger.summary().messages == 0

    party = data.train["solo"]
    order = np.argsort(party.ids)
    X, y = torch.tensor(party.X[order]), torch.tensor(party.y[order])  # type: ignore[index]
    secret = party_secret(42, "solo")  # the party's own randomness, as the harness gives it
    model = torch.nn.Sequential(
        mlp(6, (16, 8), None, generator=secret.torch_generator(42, "solo", "splitnn-bottom")),
        mlp(8, (8,), 2, generator=secret.torch_generator(42, "solo", "splitnn-top")),
    )
    hist = fit_module(model, lambda m, b: F.cross_entropy(m(b["x"]), b["y"]), {"x": X, "y": y}, config=train,
                      rng=numpy_rng(42, "solo", "splitnn-train"))  # batches: public, from the run seed
    assert np.allclose(method.history_["loss"], hist["loss"], rtol=1e-5)
    assert np.allclose(method.history_["val_loss"], hist["val_loss"], rtol=1e-5)
    with torch.no_grad():
        expected = torch.softmax(model(torch.tensor(data.serve["solo"].subset(data.test_ids).X)), 1).numpy()
    assert np.allclose(out.scores, expected, atol=1e-5)


def test_splitnn_learns_from_the_passive_party_features() -> None:
    data = _split(active_cols=1)
    method = get_method("splitnn")(train=FAST)
    out = run_method(method, data, seed=0)
    local = run_method(get_method("local")(), data, seed=0)
    acc = compute_metrics(data.task, data.test_y, out.scores)["accuracy"]
    acc_local = compute_metrics(data.task, data.test_y, local.scores)["accuracy"]
    assert acc > acc_local + 0.1
    kinds = {e.kind for e in out.ledger.entries}
    assert {"splitnn.forward", "split.backward", "splitnn.init", "split.activations", "split.finish",
            "align.plain"} <= kinds
    # two rounds per training batch: forward, then the gradients (posted: they go out with the next forward)
    forward = sum(1 for e in out.ledger.entries if e.kind == "splitnn.forward" and e.direction == "request")
    backward = sum(1 for e in out.ledger.entries if e.kind == "split.backward" and e.direction == "request")
    # plus one validation forward per epoch
    assert forward == backward + len(method.history_)


def test_splitnn_regression() -> None:
    data = _split(task="regression")
    out = run_method(get_method("splitnn")(train=FAST), data, seed=0)
    rmse = compute_metrics("regression", data.test_y, out.scores)["rmse"]
    assert rmse < np.std(data.test_y)


@pytest.mark.parametrize("name", ["local", "centralized", "single", "apc_vfl", "apc_vfl_aligned", "ablation",
                                  "fedsvd", "vfedtrans"])
def test_default_models_fit_regression_too(name: str) -> None:
    """A method's default model is the linear one for the task (ridge for regression), so `vflo compare` on a
    regression dataset runs every method, not only those configured with an MLP."""
    data = _split(task="regression")
    out = run_method(quick(name), data, seed=0)
    rmse = compute_metrics("regression", data.test_y, out.scores)["rmse"]
    assert np.isfinite(rmse) and rmse < 1.5 * np.std(data.test_y)


def test_splitnn_regression_is_invariant_to_the_target_scale() -> None:
    """Targets are standardised for training, so y * 1000 + 5000 gives the same fit, mapped back."""
    import dataclasses

    ds = make_dataset(n=300, n_features=6, task="regression")
    shifted = dataclasses.replace(ds, y=ds.y * 1000.0 + 5000.0)
    preds, rmse = [], []
    for table in (ds, shifted):
        data = two_party_spec().build(table, seed=0).materialize(test_ids=np.sort(table.ids)[:40])
        preds.append(run_method(get_method("splitnn")(train=FAST), data, seed=0).scores)
        rmse.append(compute_metrics("regression", data.test_y, preds[-1])["rmse"] / np.std(data.test_y))
    assert np.allclose(preds[1], preds[0] * 1000.0 + 5000.0, rtol=1e-4, atol=1e-2)
    assert rmse[1] < 0.5


def test_float16_payloads_halve_activation_bytes() -> None:
    data = _split()
    runs = {}
    for dtype in ("float32", "float16"):
        out = run_method(get_method("splitnn")(payload_dtype=dtype, train={**FAST, "max_epochs": 3, "patience": 0}),
                         data, seed=0)
        runs[dtype] = sum(v["reply_bytes"] for k, v in out.ledger.by_kind().items() if k == "splitnn.forward")
    assert 0.45 < runs["float16"] / runs["float32"] < 0.6


def test_splitnn_with_zero_overlap_says_so() -> None:
    data = _split(aligned=0, passive_only=100)
    with pytest.raises(MethodError, match="shares no training sample"):
        run_method(get_method("splitnn")(train=FAST), data, seed=0)


def test_collaborative_inference_needs_every_party_to_hold_the_rows() -> None:
    ds = make_dataset(n=300)
    layout = two_party_spec(active=300, aligned=150).build(ds, seed=0)
    unaligned = np.setdiff1d(layout.ids("act"), layout.aligned_ids())[:10]
    data = layout.materialize(test_ids=unaligned)
    with pytest.raises(MethodError, match="splitnn predicts collaboratively.*aligned_holdout"):
        run_method(get_method("splitnn")(train={**FAST, "max_epochs": 2}), data, seed=0)


def test_same_seed_same_numbers_and_bytes() -> None:
    data = _split()
    a = run_method(get_method("splitnn")(train=FAST), data, seed=5)
    b = run_method(get_method("splitnn")(train=FAST), data, seed=5)
    c = run_method(get_method("splitnn")(train=FAST), data, seed=6)
    assert np.array_equal(a.scores, b.scores) and not np.array_equal(a.scores, c.scores)
    assert [e.nbytes for e in a.ledger.entries] == [e.nbytes for e in b.ledger.entries]


def test_single_reads_only_rows_each_party_holds() -> None:
    """With partial overlap, a party's model is trained on its own rows, never on the oracle's other rows."""
    data = _split(n=300, aligned=120, test=30)
    asked: list[tuple[str | None, set[object]]] = []
    real = data.oracle.features

    def spy(ids: np.ndarray, party: str | None = None) -> np.ndarray:
        asked.append((party, set(np.asarray(ids).tolist())))
        return real(ids, party)

    object.__setattr__(data.oracle, "features", spy)
    out = run_method(get_method("single")(), data, seed=0)
    assert out.scores.shape == (30, 2)
    for party, ids in asked:
        assert party is not None
        assert ids <= set(data.train[party].ids.tolist()) | set(data.serve[party].ids.tolist())
    assert {party for party, _ in asked} == {"act", "pas"}
