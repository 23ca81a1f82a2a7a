"""SecureBoost with gradient-based one-side sampling (row_sampling = "goss"): each tree is the tree centralized
boosting grows on the same weighed sample, encrypted or not; only the sample's statistics are encrypted and summed;
a partner sums a node only over enough of the sample, and the label holder warns of what the sample tells."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from tests.test_secureboost import _blocks, _joined, _reference
from vflo.errors import ConfigError, ProtocolError
from vflo.federation.simulation import run_method
from vflo.methods import secureboost
from vflo.methods.registry import get_method
from vflo.trees.crypto import plain_side
from vflo.trees.goss import goss_weights
from vflo.trees.growth import HistogramAsk
from vflo.trees.lookup import ColumnsParty

SETTINGS = {"n_trees": 4, "max_depth": 3, "learning_rate": 0.3, "n_bins": 8, "min_node_rows": 1,
            "row_sampling": "goss", "top_rate": 0.2, "other_rate": 0.3}


def test_goss_keeps_the_largest_gradients_and_weighs_up_a_draw_of_the_rest() -> None:
    g = np.random.default_rng(0).normal(size=1000)
    w = goss_weights(g, top_rate=0.2, other_rate=0.1, rng=np.random.default_rng(1))
    top = np.argsort(-np.abs(g))[:200]
    assert np.all(w[top] == 1.0) and (w == 1.0).sum() == 200
    assert (w == 8.0).sum() == 100 and (w == 0).sum() == 700  # (1 - 0.2) / 0.1
    assert np.abs(g[w == 8.0]).max() <= np.abs(g[top]).min()  # the draw is from the rest
    again = goss_weights(g, top_rate=0.2, other_rate=0.1, rng=np.random.default_rng(1))
    assert np.array_equal(w, again)
    assert np.all(goss_weights(g[:5], top_rate=0.5, other_rate=0.5, rng=np.random.default_rng(1)) == 1.0)
    # With one tree per class, one sample for the round, ranked by the sum of |g| over the classes.
    gk = np.random.default_rng(2).normal(size=(1000, 3))
    wk = goss_weights(gk, top_rate=0.2, other_rate=0.1, rng=np.random.default_rng(1))
    assert np.array_equal(np.sort(np.flatnonzero(wk == 1.0)), np.sort(np.argsort(-np.abs(gk).sum(axis=1))[:200]))


def _recording(monkeypatch: pytest.MonkeyPatch) -> list[np.ndarray]:
    drawn: list[np.ndarray] = []

    def record(g: np.ndarray, **kwargs: object) -> np.ndarray:
        w = goss_weights(g, **kwargs)  # type: ignore[arg-type]
        drawn.append(w)
        return w

    monkeypatch.setattr(secureboost, "goss_weights", record)
    return drawn


def test_each_tree_is_centralized_boostings_on_the_same_weighed_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    together, _ = _blocks(n=700)
    drawn = _recording(monkeypatch)
    out = run_method(get_method("secureboost")(**SETTINGS, he={"scheme": "plaintext"}), together, seed=0)
    assert len(drawn) == 4 and all(0 < (w > 0).mean() < 1 for w in drawn)
    ids = together.train["a"].ids
    X, y = _joined(together, ids), together.train["a"].require_labels().astype(float)
    Xt = _joined(together, together.test_ids, "serve")
    expected = _reference(X, y, Xt, trees=4, depth=3, lr=0.3, lam=1.0, n_bins=8, weights=drawn)
    assert np.allclose(out.scores[:, 1], 1 / (1 + np.exp(-expected)), atol=1e-9)
    every = run_method(get_method("secureboost")(**{**SETTINGS, "row_sampling": "all"}, he={"scheme": "plaintext"}),
                       together, seed=0)
    assert not np.array_equal(every.scores, out.scores)


def test_encrypted_goss_grows_the_same_trees_and_encrypts_and_sums_the_sample_alone() -> None:
    together, _ = _blocks(n=420)
    settings = {**SETTINGS, "n_trees": 3, "min_node_rows": 5}
    plain = run_method(get_method("secureboost")(**settings, he={"scheme": "plaintext"}), together, seed=0)
    ou = run_method(get_method("secureboost")(**settings), together, seed=0)
    assert np.array_equal(plain.scores, ou.scores)
    every = run_method(get_method("secureboost")(**{**settings, "row_sampling": "all"}), together, seed=0)
    share = ou.stats["encryptions"] / every.stats["encryptions"]
    assert 0.45 <= share <= 0.55  # top 0.2 + other 0.3 of the people some partner holds
    assert ou.stats["ciphertext_additions"] < 0.7 * every.stats["ciphertext_additions"]


def test_the_label_holder_warns_that_the_sample_tells_the_partners_who_is_predicted_worst(
        caplog: pytest.LogCaptureFixture) -> None:
    together, _ = _blocks(n=420)
    with caplog.at_level(logging.WARNING, logger="vflo.methods.secureboost"):
        run_method(get_method("secureboost")(**{**SETTINGS, "n_trees": 1}, he={"scheme": "plaintext"}), together,
                   seed=0)
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "row_sampling = 'goss'" in said and "p1" in said and "p2" in said and "largest gradients" in said
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="vflo.methods.secureboost"):
        run_method(get_method("secureboost")(n_trees=1, max_depth=2, n_bins=8, he={"scheme": "plaintext"}),
                   together, seed=0)
    assert "goss" not in " ".join(r.getMessage() for r in caplog.records)


def test_a_partner_sums_a_node_only_over_enough_of_the_sample() -> None:
    X = np.random.default_rng(0).normal(size=(40, 3))
    party = ColumnsParty(X, 4, plain_side(), min_node_rows=5, shuffle=np.random.default_rng(1))
    gh = np.ones((8, 2), dtype=np.int64)
    with pytest.raises(ProtocolError, match="increasing order"):
        party.new_tree(gh, 0, picked=np.array([3, 1, 2, 5, 6, 7, 8, 9]))
    picked = np.array([0, 1, 2, 3, 4, 30, 31, 32])
    party.new_tree(gh, 1, picked=picked)
    party.histograms([HistogramAsk(0, np.arange(40))])
    # Rows 0..9 hold 5 of the sample: enough. Rows 10..19 hold none of it, and leave the rest 3.
    with pytest.raises(ProtocolError, match="sums 0 of this party's rows"):
        party.histograms([HistogramAsk(1, np.arange(10, 20), parent=0, sibling=2)])
    party.new_tree(gh, 2, picked=picked)
    party.histograms([HistogramAsk(0, np.arange(40))])
    with pytest.raises(ProtocolError, match="leaves 3 of its parent's summed rows"):
        party.histograms([HistogramAsk(1, np.arange(0, 10), parent=0, sibling=2)])


def test_a_partner_takes_the_gradients_its_training_samples_and_no_others() -> None:
    # The partners follow the proposal: a label holder that sends every person's gradients to a partner set to
    # sample (or the reverse) is refused by the partner's own check.
    method = get_method("secureboost")(**{**SETTINGS, "n_trees": 1}, he={"scheme": "plaintext"})
    with pytest.raises(ProtocolError, match="sb.sampled_gradients"):
        method._gradients(None, {})  # type: ignore[arg-type]
    plain = get_method("secureboost")(n_trees=1, he={"scheme": "plaintext"})
    with pytest.raises(ProtocolError, match="sb.gradients"):
        plain._sampled_gradients(None, {})  # type: ignore[arg-type]


@pytest.mark.parametrize("settings, fix", [
    ({"row_sampling": "sample"}, "row_sampling"), ({"row_sampling": "goss", "top_rate": 0.0}, "top_rate"),
    ({"row_sampling": "goss", "top_rate": 0.6, "other_rate": 0.5}, "less than 1")])
def test_bad_sampling_settings_are_refused_naming_the_fix(settings: dict[str, object], fix: str) -> None:
    with pytest.raises(ConfigError, match=fix):
        get_method("secureboost")(**settings)


def test_a_partner_holding_too_few_of_a_rounds_sample_sits_the_round_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """A partner holding few people often holds fewer than min_node_rows of a sample (or none): it is sent nothing
    that round, and its columns split none of the round's trees; encrypted, as in plaintext."""
    from tests.conftest import make_dataset
    from vflo.data.scenario import BlockSpec, PartySpec, SamplesSpec, ScenarioSpec

    ds = make_dataset(n=420, n_features=6, seed=3)
    spec = ScenarioSpec(
        parties=(PartySpec(name="a", role="active", n_columns=2), PartySpec(name="p1", share=1.0),
                 PartySpec(name="few", share=1.0)),
        samples=SamplesSpec(layout="blocks", test_seed=1, blocks=(
            BlockSpec(parties=("a", "p1", "few"), rows=30, test=True), BlockSpec(parties=("a", "p1", "few"), rows=8),
            BlockSpec(parties=("a", "p1"), rows=380))))
    layout = spec.build(ds, seed=3)
    data = layout.materialize(test_ids=layout.held_out("aligned"))
    sent: list[set[str]] = []
    original = secureboost._Federated.new_tree

    def spy(self: secureboost._Federated, *args: object, **kwargs: object) -> set[str]:
        out = original(self, *args, **kwargs)  # type: ignore[arg-type]
        sent.append(out)
        return out

    monkeypatch.setattr(secureboost._Federated, "new_tree", spy)
    settings = {**SETTINGS, "n_trees": 4, "min_node_rows": 5}
    ou = run_method(get_method("secureboost")(**settings), data, seed=0)
    assert any("few" not in s for s in sent) and all("p1" in s for s in sent)
    plain = run_method(get_method("secureboost")(**settings, he={"scheme": "plaintext"}), data, seed=0)
    assert np.array_equal(plain.scores, ou.scores)


def test_multiclass_rounds_share_one_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    together, _ = _blocks(n=420, n_classes=3)
    drawn = _recording(monkeypatch)
    out = run_method(get_method("secureboost")(**{**SETTINGS, "n_trees": 2}, he={"scheme": "plaintext"}), together,
                     seed=0)
    assert len(drawn) == 2 and out.stats["trees"] == 6  # one draw a round, one tree per class
