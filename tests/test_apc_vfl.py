"""APC-VFL, its fully aligned variant and its Ablation: one exchange, active-only inference, bad input."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import make_dataset, two_party_spec
from vflo.comm.message import Message
from vflo.data.layout import FederatedData
from vflo.data.scenario import PartySpec, SamplesSpec, ScenarioSpec
from vflo.errors import ConfigError, MethodError, RemoteError
from vflo.federation.simulation import run_method
from vflo.methods.registry import get_method
from vflo.metrics import compute_metrics

QUICK = {"max_epochs": 3, "patience": 0, "batch_size": 64}


def _data(n: int = 300, aligned: int = 150, active_cols: int = 2, seed: int = 0, test_from: str = "active",
          passive_only: int = 0) -> FederatedData:
    ds = make_dataset(n=n + passive_only, n_features=8, seed=seed)
    layout = two_party_spec(active_cols=active_cols, active=n, aligned=aligned,
                            passive_only=passive_only).build(ds, seed=seed)
    pool = layout.aligned_ids() if test_from == "aligned" else np.setdiff1d(layout.ids("act"), layout.aligned_ids())
    return layout.materialize(test_ids=np.sort(pool)[:30])


def test_exactly_one_round_and_bytes_match_the_papers_formula() -> None:
    data = _data()
    method = get_method("apc_vfl")(train=QUICK)
    out = run_method(method, data, seed=0)
    summary = out.ledger.summary()
    assert summary.rounds == 1 and summary.messages == 2
    n_aligned = method.n_aligned_
    assert n_aligned == 150
    formula = n_aligned * 256 * 4  # |D_A| x z_p x 4 bytes (Appendix E, Eq. 6)
    assert abs(summary.bytes - formula) / formula < 0.01
    assert {e.kind for e in out.ledger.entries if e.is_method} == {"apc.encode_aligned"}


def test_three_parties_still_one_round() -> None:
    ds = make_dataset(n=300, n_features=9)
    spec = ScenarioSpec(parties=(PartySpec(name="a", role="active", n_columns=3), PartySpec(name="p", n_columns=3),
                                 PartySpec(name="q", n_columns=3)), samples=SamplesSpec(aligned=100))
    layout = spec.build(ds, seed=0)
    data = layout.materialize(test_ids=np.sort(layout.ids("a"))[:20])
    method = get_method("apc_vfl")(train=QUICK)
    out = run_method(method, data, seed=0)
    assert out.ledger.summary().rounds == 1
    senders = {e.sender for e in out.ledger.entries if e.is_method and e.direction == "reply"}
    assert senders == {"p", "q"}


def test_prediction_for_samples_no_other_party_has_seen() -> None:
    data = _data(test_from="active")
    assert not data.train["pas"].contains(data.test_ids).any() and len(data.serve["pas"]) == 0
    out = run_method(get_method("apc_vfl")(train=QUICK), data, seed=0)
    assert out.scores.shape == (30, 2) and np.allclose(out.scores.sum(1), 1.0)
    predict_traffic = [e for e in out.ledger.entries if e.is_method and e.kind != "apc.encode_aligned"]
    assert predict_traffic == []


def test_float16_payload_halves_the_exchange() -> None:
    data = _data()
    b32 = run_method(get_method("apc_vfl")(train=QUICK), data, seed=0).ledger.summary().bytes
    b16 = run_method(get_method("apc_vfl")(train=QUICK, payload_dtype="float16"), data, seed=0).ledger.summary().bytes
    assert 0.49 < b16 / b32 < 0.52


def test_distillation_weight_changes_the_student() -> None:
    data = _data()
    a = run_method(get_method("apc_vfl")(train=QUICK, distill_weight=0.0), data, seed=0).scores
    b = run_method(get_method("apc_vfl")(train=QUICK, distill_weight=10.0), data, seed=0).scores
    assert not np.allclose(a, b)


def test_ablation_sends_nothing_and_matches_apc_without_distillation() -> None:
    data = _data()
    ablation = run_method(get_method("ablation")(train=QUICK), data, seed=0)
    assert ablation.ledger.summary().messages == 0
    no_distill = run_method(get_method("apc_vfl")(train=QUICK, distill_weight=0.0), data, seed=0)
    # the same student, trained on the same rows with the same seed and no distillation term
    assert np.allclose(ablation.scores, no_distill.scores, atol=1e-6)


def test_aligned_variant_scores_collaboratively() -> None:
    data = _data(test_from="aligned")
    method = get_method("apc_vfl_aligned")(train=QUICK)
    out = run_method(method, data, seed=0)
    assert method.n_train_ == method.n_aligned_ == 120
    kinds = [e.kind for e in out.ledger.entries if e.is_method and e.direction == "request"]
    assert kinds == ["apc.encode_aligned", "apc.encode_serve"]
    with pytest.raises(MethodError, match="predicts collaboratively"):
        run_method(get_method("apc_vfl_aligned")(train=QUICK), _data(test_from="active"), seed=0)


def test_apc_vfl_classifies_well_above_the_majority_class() -> None:
    ds = make_dataset(n=700, n_features=8, seed=3)
    layout = two_party_spec(active_cols=4, active=700, aligned=400).build(ds, seed=3)
    data = layout.materialize(test_ids=np.sort(layout.ids("act"))[:200])
    out = run_method(get_method("apc_vfl")(train={**QUICK, "max_epochs": 20}), data, seed=0)
    majority = max(data.test_y.mean(), 1 - data.test_y.mean())
    assert compute_metrics(data.task, data.test_y, out.scores)["accuracy"] > majority + 0.1


def test_no_message_carries_raw_features_or_labels() -> None:
    data = _data()
    seen: list[Message] = []
    run_method(get_method("apc_vfl")(train=QUICK), data, seed=0, observers=(seen.append,))
    labels = data.train["act"].y
    assert labels is not None
    for msg in seen:
        for value in msg.payload.values():
            if not isinstance(value, np.ndarray) or value.ndim == 0:
                continue
            flat = value.reshape(len(value), -1) if value.ndim > 1 else value[:, None]
            for col in flat.T:
                # no column equals the active party's labels over its rows (in any order)
                assert not (len(col) == len(labels) and np.array_equal(np.sort(col), np.sort(labels)))
            if msg.sender == "pas" and value.dtype.kind == "f":
                raw = data.train["pas"].X
                assert value.shape[1] != raw.shape[1] or not np.isclose(value[:, None, :], raw[None]).all(-1).any()


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"distill_weight": -0.1}, "distill_weight .* must be non-negative"),
    ({"distill": "huber"}, "distill = 'huber' is not allowed"),
    ({"student_encoder": (256, 128)}, "student_encoder's latent \\(128\\) must be as wide as joint_encoder's"),
    ({"classifier": {"model": "RandomForrest"}}, "model 'RandomForrest' is neither"),
    ({"passive_encoder": ()}, "needs at least one positive layer width"),
])
def test_bad_settings_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        get_method("apc_vfl")(**kwargs)


def test_an_encoder_that_does_not_fit_the_feature_count() -> None:
    with pytest.raises(ConfigError, match="party 'pas' has 6 features but its encoder's latent is only 4 wide"):
        run_method(get_method("apc_vfl")(train=QUICK, passive_encoder=(8, 4)), _data(), seed=0)
    out = run_method(get_method("apc_vfl")(train=QUICK, passive_encoder=(8, 4), overcomplete=False), _data(), seed=0)
    assert out.ledger.summary().rounds == 1


def test_a_passive_party_without_aligned_samples() -> None:
    data = _data(aligned=0, passive_only=50)
    with pytest.raises(MethodError, match="passive party 'pas' shares no aligned sample"):
        run_method(get_method("apc_vfl")(train=QUICK), data, seed=0)


def test_any_scikit_learn_classifier() -> None:
    data = _data()
    method = get_method("apc_vfl")(train=QUICK, classifier={"model": "RandomForestClassifier",
                                                              "params": {"n_estimators": 10}})
    out = run_method(method, data, seed=0)
    assert out.scores.shape == (30, 2)
    with pytest.raises((ConfigError, RemoteError), match="gives no class probabilities"):
        run_method(get_method("apc_vfl")(train=QUICK, classifier={"model": "LinearSVC"}), data, seed=0)


def test_a_large_upload_is_sent_in_pieces_with_the_same_result(monkeypatch: pytest.MonkeyPatch) -> None:
    import vflo.methods.apc_vfl as apc
    from tests.test_methods import data_for, quick
    from vflo.federation.simulation import run_method

    data = data_for("apc_vfl")
    whole = run_method(quick("apc_vfl"), data, seed=0)
    monkeypatch.setattr(apc, "UPLOAD_BYTES", 256 * 4 * 7)  # seven latent rows a message
    pieces = run_method(quick("apc_vfl"), data, seed=0)
    uploads = [e for e in pieces.ledger.entries if e.kind == "apc.encode_aligned" and e.direction == "reply"]
    assert len(uploads) > 1 and all(e.nbytes < 256 * 4 * 7 + 1000 for e in uploads)
    assert np.allclose(pieces.scores, whole.scores, atol=1e-6)
    assert pieces.fit_summary.bytes >= whole.fit_summary.bytes
