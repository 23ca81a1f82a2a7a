"""SecureBoost: the trees the protocol grows are those of centralized boosting on the same bins (encrypted or
not), it trains on every person the label holder holds and scores a person with whichever partners hold them,
and a partner sums only what a tree's nodes need."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import make_dataset
from vflo.data.layout import FederatedData
from vflo.data.scenario import BlockSpec, PartySpec, SamplesSpec, ScenarioSpec
from vflo.errors import ConfigError, ProtocolError
from vflo.federation.simulation import run_method
from vflo.methods.registry import get_method
from vflo.metrics import compute_metrics
from vflo.trees import crypto
from vflo.trees.bins import bin_codes, fit_cuts, quantile_cuts, threshold
from vflo.trees.crypto import HESettings, new_keys, plain_side
from vflo.trees.growth import Candidate, HistogramAsk, SplitAsk
from vflo.trees.lookup import ColumnsParty

SCALE = 2.0**20


def _blocks(seed: int = 0, task: str | None = None, n: int = 1400,
            n_classes: int = 2) -> tuple[FederatedData, FederatedData]:
    """An active party with 2 of 8 columns; p1 and p2 hold the rest for different, overlapping people; held-out
    people every party holds, and people only the active party holds."""
    ds = make_dataset(n=n, n_features=8, seed=seed, task=task, n_classes=n_classes)
    k = n // 14
    spec = ScenarioSpec(
        parties=(PartySpec(name="a", role="active", n_columns=2), PartySpec(name="p1", share=1.0),
                 PartySpec(name="p2", share=1.0)),
        samples=SamplesSpec(layout="blocks", test_seed=1, blocks=(
            BlockSpec(parties=("a", "p1", "p2"), rows=k, test=True), BlockSpec(parties=("a",), rows=k, test=True),
            BlockSpec(parties=("a", "p1", "p2"), rows=int(2.5 * k)), BlockSpec(parties=("a", "p1"), rows=int(2.5 * k)),
            BlockSpec(parties=("a", "p2"), rows=int(2.5 * k)), BlockSpec(parties=("a",), rows=3 * k))))
    layout = spec.build(ds, seed=seed)
    return (layout.materialize(test_ids=layout.held_out("aligned")),
            layout.materialize(test_ids=layout.held_out("active_only")))


def _joined(data: FederatedData, ids: np.ndarray, split: str = "train") -> np.ndarray:
    """Every party's columns for ``ids`` side by side, NaN where a party lacks the person (the reference's view)."""
    blocks = []
    for party in data.parties:
        rows = (data.train if split == "train" else data.serve)[party.name]
        block = np.full((len(ids), rows.n_features), np.nan)
        pos = {v: i for i, v in enumerate(rows.ids.tolist())}
        for i, person in enumerate(ids.tolist()):
            if person in pos:
                block[i] = rows.X[pos[person]]
        blocks.append(block)
    return np.hstack(blocks)


def _reference(X: np.ndarray, y: np.ndarray, Xt: np.ndarray, *, trees: int, depth: int, lr: float, lam: float,
               n_bins: int, weights: list[np.ndarray] | None = None) -> np.ndarray:
    """Centralized binary boosting on the joined columns, written out plainly: quantile bins per column over its
    present values, second-order gains with the missing values tried on both sides, sums in fixed point; with
    ``weights``, each tree's rows weighed by them (GOSS: 0 for the rows a tree is not grown on)."""
    cuts = [quantile_cuts(X[:, j], n_bins) for j in range(X.shape[1])]
    codes = np.stack([np.where(np.isnan(X[:, j]), -1, np.searchsorted(cuts[j], X[:, j], side="left"))
                      for j in range(X.shape[1])], axis=1)
    p0 = np.mean(y)
    score = np.full(len(X), np.log(p0 / (1 - p0)))
    test = np.full(len(Xt), np.log(p0 / (1 - p0)))

    def gain_of(gl: float, hl: float, g: float, h: float) -> float:
        gr, hr = g - gl, h - hl
        return 0.5 * (gl * gl / (hl + lam) + gr * gr / (hr + lam) - g * g / (h + lam))

    for t in range(trees):
        p = 1 / (1 + np.exp(-score))
        w = np.ones(len(X)) if weights is None else weights[t]
        gq, hq = np.rint((p - y) * w * SCALE).astype(np.int64), np.rint(p * (1 - p) * w * SCALE).astype(np.int64)
        nodes = [(np.arange(len(X)), np.arange(len(Xt)), 0)]
        while nodes:
            rows, trows, d = nodes.pop()
            g, h = gq[rows].sum() / SCALE, hq[rows].sum() / SCALE
            best = None
            if d < depth and len(rows) >= 2 and h >= 2.0:
                for j in range(X.shape[1]):
                    present = codes[rows, j] >= 0
                    gm = (gq[rows].sum() - gq[rows][present].sum()) / SCALE
                    hm = (hq[rows].sum() - hq[rows][present].sum()) / SCALE
                    for b in range(n_bins):
                        in_left = present & (codes[rows, j] <= b)
                        glp, hlp = gq[rows][in_left].sum() / SCALE, hq[rows][in_left].sum() / SCALE
                        for default_left, (gl, hl) in ((True, (glp + gm, hlp + hm)), (False, (glp, hlp))):
                            if hl < 1.0 or h - hl < 1.0:
                                continue
                            gain = gain_of(gl, hl, g, h)
                            if gain > 0 and (best is None or gain > best[0]):
                                best = (gain, j, b, default_left if hm > 0 else hlp >= h - hlp)
            if best is None:
                w = -g / (h + lam) * lr
                score[rows] += w
                test[trows] += w
                continue
            _, j, b, default_left = best
            cut = threshold(cuts[j], b)

            def left_of(values: np.ndarray, dl: bool = default_left, c: float = cut) -> np.ndarray:
                return np.where(np.isnan(values), dl, values <= c)

            lm, tm = left_of(X[rows, j]), left_of(Xt[trows, j])
            nodes += [(rows[~lm], trows[~tm], d + 1), (rows[lm], trows[tm], d + 1)]
    return test


def test_bins_and_thresholds() -> None:
    column = np.array([1.0, 2.0, 2.0, 3.0, np.nan, 4.0, 5.0, 6.0])
    cuts = quantile_cuts(column, 4)
    assert np.all(np.diff(cuts) > 0) and cuts.max() < 6.0
    codes = bin_codes(column[:, None], [cuts], 4)[:, 0]
    assert codes[4] == 4  # the missing value's bucket
    for b in range(len(cuts)):
        assert np.array_equal(codes[~np.isnan(column)] <= b, column[~np.isnan(column)] <= threshold(cuts, b))
    assert threshold(cuts, len(cuts)) == np.inf
    with pytest.raises(ConfigError, match="n_bins"):
        quantile_cuts(column, 1)
    assert len(fit_cuts(np.full((3, 2), np.nan), 8)[0]) == 0


def test_the_protocol_grows_the_trees_of_centralized_boosting() -> None:
    """Every party's columns joined, NaN where a party lacks a person: the same scores, to rounding."""
    together, _ = _blocks(n=700)
    settings = {"n_trees": 4, "max_depth": 3, "learning_rate": 0.3, "n_bins": 8, "min_node_rows": 1,
                "he": {"scheme": "plaintext"}}
    out = run_method(get_method("secureboost")(**settings), together, seed=0)
    ids = together.train["a"].ids
    X, y = _joined(together, ids), together.train["a"].require_labels().astype(float)
    Xt = _joined(together, together.test_ids, "serve")
    expected = _reference(X, y, Xt, trees=4, depth=3, lr=0.3, lam=1.0, n_bins=8)
    assert np.allclose(out.scores[:, 1], 1 / (1 + np.exp(-expected)), atol=1e-9)


def test_encrypted_and_plaintext_grow_the_same_trees(monkeypatch: pytest.MonkeyPatch) -> None:
    """Also with encryption, decryption and bin sums shared out among two processes each (thresholds lowered so
    they are)."""
    together, _ = _blocks(n=420)
    runs = {}
    for scheme, workers in (("plaintext", 1), ("ou", 1), ("ou", 2)):
        if workers > 1:
            monkeypatch.setattr(crypto, "PARALLEL_MIN", 10)
            monkeypatch.setattr(crypto, "PARALLEL_SUMS", 10)
            monkeypatch.setattr(crypto, "PARALLEL_ENCRYPT", 10)
        method = get_method("secureboost")(n_trees=2, max_depth=3, n_bins=8, he={"scheme": scheme},
                                           workers=workers)
        runs[scheme, workers] = (run_method(method, together, seed=0), method)
    (plain, m1), (ou, m2), (shared, _) = runs["plaintext", 1], runs["ou", 1], runs["ou", 2]
    assert np.array_equal(shared.scores, ou.scores) and shared.stats["sums_decrypted"] == ou.stats["sums_decrypted"]
    assert [t.arrays()["owner"].tolist() for t in m1.trees_] == [t.arrays()["owner"].tolist() for t in m2.trees_]
    assert all(np.array_equal(a.arrays()["value"], b.arrays()["value"]) for a, b in zip(m1.trees_, m2.trees_,
                                                                                        strict=True))
    assert np.array_equal(plain.scores, ou.scores)
    assert any(owner > 0 for t in m1.trees_ for owner in t.owner)  # partners' columns split too


def test_rows_encrypted_in_pieces_by_several_processes_are_one_array_in_order(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(crypto, "PARALLEL_ENCRYPT", 10)
    gh = np.stack([np.arange(-50, 51), np.arange(101) * 3], axis=1)
    keys = crypto.new_keys(crypto.HESettings(), workers=2)
    try:
        encrypted = keys.encrypt(gh)  # a share in this process, one in a worker, joined
        assert encrypted.shape[0] == len(gh) and np.array_equal(keys.decrypt(encrypted), gh)
        # A partner loads the joined blob as one array, and sums it as one.
        side = crypto.PublicSide("ou", keys.public_key)
        codes = (np.arange(len(gh)) % 4).reshape(-1, 1).astype(np.int8)
        sums = keys.decrypt(side.bucket_sums(side.load(keys.dump(encrypted)), np.arange(len(gh)), codes, 4))
        assert np.array_equal(sums, np.stack([gh[np.arange(len(gh)) % 4 == b].sum(axis=0) for b in range(4)]))
    finally:
        keys.close()
    with pytest.raises(ValueError, match="one-column layout"):
        crypto.join([crypto.join([]), b"\x93\x01\x02\x03"])


def test_it_trains_on_every_person_and_beats_aligned_only_and_the_label_holder_alone() -> None:
    together, alone = _blocks()
    settings = {"n_trees": 15, "max_depth": 3, "he": {"scheme": "plaintext"}}
    every = get_method("secureboost")(**settings)
    out = run_method(every, together, seed=0)
    aligned = run_method(get_method("secureboost")(**settings, aligned_only=True), together, seed=0)
    local = run_method(get_method("local")(), together, seed=0)
    acc = {k: compute_metrics("binary", together.test_y, o.scores)["accuracy"]
           for k, o in (("every", out), ("aligned", aligned), ("local", local))}
    assert every.n_train_ == together.train["a"].n_samples == 1050
    assert acc["every"] > acc["local"] + 0.05 and acc["every"] >= acc["aligned"], acc
    # People only the active party holds: scored from its splits and the partners' default branches.
    solo = run_method(get_method("secureboost")(**settings), alone, seed=0)
    assert solo.scores.shape == (100, 2) and np.allclose(solo.scores.sum(axis=1), 1.0)


def test_regression_multiclass_and_a_saved_model(tmp_path: object) -> None:
    import vflo
    from tests.test_artifacts import raw_rows

    reg, _ = _blocks(task="regression", n=700)
    out = run_method(get_method("secureboost")(n_trees=5, he={"scheme": "plaintext"}), reg, seed=0)
    assert out.scores.shape == (50,) and np.isfinite(out.scores).all()
    multi, _ = _blocks(task="multiclass", n=700)
    out = run_method(get_method("secureboost")(n_trees=3, he={"scheme": "plaintext"}), multi, seed=0)
    assert out.scores.shape[0] == 50 and np.allclose(out.scores.sum(axis=1), 1.0)
    together, _ = _blocks(n=700)
    model = vflo.fit(get_method("secureboost")(n_trees=4, he={"scheme": "plaintext"}), together, seed=0)
    expected = model.predict()
    saved = vflo.load(model.save(tmp_path).parent, "secureboost")  # type: ignore[arg-type]
    rows = raw_rows(together)
    assert np.array_equal(saved.predict(rows), expected)
    # A partner absent: its splits send everyone down their default branches, as if it held none of them.
    cols = saved.score_columns
    without = saved.score({p: rows[p] for p in ("a", "p1")}, missing="subset")
    empty = rows["p2"].subset(rows["p2"].ids[:0])
    holds_none = saved.score({**rows, "p2": empty}, missing="subset")
    assert set(without["scored_by"]) == {"a+p1"}
    assert np.array_equal(without[cols].to_numpy(), holds_none[cols].to_numpy())
    assert not np.allclose(without[cols].to_numpy(), expected)  # p2's splits mattered


def test_a_partner_sums_only_nested_nodes_of_enough_people() -> None:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 3))
    party = ColumnsParty(X, 8, plain_side(), min_node_rows=5)
    with pytest.raises(ProtocolError, match="before the tree's gradients"):
        party.histograms([HistogramAsk(0, np.arange(40))])
    gh = np.stack([rng.integers(-100, 100, 40), rng.integers(0, 100, 40)], axis=1)
    party.new_tree(gh, 0)
    whole = party.histograms([HistogramAsk(0, np.arange(40))])[0]
    assert (whole.reshape(3, 9, 2).sum(axis=1) == gh.sum(axis=0)).all()  # every column's bins hold everyone
    with pytest.raises(ProtocolError, match="has its root"):
        party.histograms([HistogramAsk(9, np.arange(10))])
    with pytest.raises(ProtocolError, match="fewer than"):  # a child of three: its sums near single rows'
        party.histograms([HistogramAsk(1, np.arange(3), 0, 2)])
    with pytest.raises(ProtocolError, match="leaves 2"):  # ... or its parent less it
        party.histograms([HistogramAsk(1, np.arange(38), 0, 2)])
    left = party.histograms([HistogramAsk(1, np.arange(20), 0, 2)])[1]
    assert party.histograms([HistogramAsk(2, None, 0, 1)]) == {}  # the grower subtracts: no sums sent
    right = party.histograms([HistogramAsk(5, np.arange(20, 40), 2, 6)])[5]  # a child of the derived node
    assert np.array_equal(left + right, whole)
    with pytest.raises(ProtocolError, match="two children"):
        party.histograms([HistogramAsk(3, np.arange(10), 0, 1)])
    with pytest.raises(ProtocolError, match="not its parent"):
        party.histograms([HistogramAsk(4, np.arange(15, 30), 1, 5)])
    record, goes_left, _ = party.splits([SplitAsk(1, Candidate(1.0, 0, 3, True))])[1]
    assert record == 0 and len(goes_left) == 20
    with pytest.raises(ProtocolError, match="never summed"):
        party.splits([SplitAsk(7, Candidate(1.0, 0, 3, True))])


def test_each_tree_splits_on_the_share_of_its_columns_the_party_drew_itself() -> None:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 6))
    gh = np.stack([rng.integers(-100, 100, 60), rng.integers(0, 100, 60)], axis=1)
    with pytest.raises(ValueError, match="own generator"):
        ColumnsParty(X, 8, plain_side(), min_node_rows=5, colsample=0.5)
    # A partner (its candidates shuffled): only the tree's columns are summed and offered, and the split the grower
    # names is recorded on the column it is, among the six.
    partner = ColumnsParty(X, 8, plain_side(), min_node_rows=5, shuffle=np.random.default_rng(1), colsample=0.5,
                           columns_rng=np.random.default_rng(2))
    drawn = []
    for tree in range(4):
        partner.new_tree(gh, tree)
        drawn.append(tuple(partner.sampled.tolist()))
        assert partner.n_sampled == 3 and list(partner.sampled) == sorted(set(partner.sampled))
        left, _, _ = partner.histograms([HistogramAsk(0, np.arange(60))])[0]
        assert len(left) <= 3 * 8
        record, _, _ = partner.splits([SplitAsk(0, Candidate(1.0, 0, 0, True, ties=((0, True),)))])[0]
        assert int(partner.table.arrays()["column"][record]) in partner.sampled
    assert len(set(drawn)) > 1  # drawn afresh per tree
    # The label holder's own columns: the tree's bin sums are those of its columns alone, in their order.
    own = ColumnsParty(X, 8, plain_side(), min_node_rows=1, colsample=0.5, columns_rng=np.random.default_rng(3))
    own.new_tree(gh, 0)
    sums = own.histograms([HistogramAsk(0, np.arange(60))])[0].reshape(3, 9, 2)
    full = ColumnsParty(X, 8, plain_side(), min_node_rows=1)
    full.new_tree(gh, 0)
    every = full.histograms([HistogramAsk(0, np.arange(60))])[0].reshape(6, 9, 2)
    assert np.array_equal(sums, every[own.sampled])
    record, _, _ = own.splits([SplitAsk(0, Candidate(1.0, 1, 3, True))])[0]
    assert int(own.table.arrays()["column"][record]) == int(own.sampled[1])


def test_a_derived_node_summed_afresh_or_by_subtraction_gives_the_same_trees(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from vflo.trees import lookup

    together, _ = _blocks(n=420)
    method = {"n_trees": 2, "max_depth": 3, "n_bins": 8}
    afresh = run_method(get_method("secureboost")(**method), together, seed=0)  # small nodes: every one afresh
    monkeypatch.setattr(lookup, "SUBTRACTION_IN_ADDITIONS", 0)  # every derived node by subtraction
    subtracted = run_method(get_method("secureboost")(**method), together, seed=0)
    assert np.array_equal(afresh.scores, subtracted.scores)
    # ... shared out among two processes, in pieces joined again.
    monkeypatch.setattr(crypto, "PARALLEL_SUBTRACT", 4)
    shared = run_method(get_method("secureboost")(**method, workers=2), together, seed=0)
    assert np.array_equal(shared.scores, subtracted.scores)
    assert afresh.stats["ciphertext_subtractions"] == 0 < subtracted.stats["ciphertext_subtractions"]
    assert afresh.stats["ciphertext_additions"] > subtracted.stats["ciphertext_additions"]


def test_column_sampling_stays_lossless_and_is_each_partys_own_draw() -> None:
    together, _ = _blocks(n=600)
    settings = {"n_trees": 4, "max_depth": 3, "n_bins": 8, "colsample": 0.5}
    plain = run_method(get_method("secureboost")(**settings, he={"scheme": "plaintext"}), together, seed=0)
    ou = run_method(get_method("secureboost")(**settings), together, seed=0)
    assert np.array_equal(plain.scores, ou.scores)  # encrypted or not, the same trees on the same draws
    every = run_method(get_method("secureboost")(**{**settings, "colsample": 1.0}, he={"scheme": "plaintext"}),
                       together, seed=0)
    assert not np.array_equal(every.scores, plain.scores)
    assert plain.stats["ciphertext_additions"] < every.stats["ciphertext_additions"]
    with pytest.raises(ConfigError, match="colsample"):
        get_method("secureboost")(colsample=0.0)


def test_keys_are_the_label_holders_own() -> None:
    with pytest.raises(ConfigError, match="below 2048"):
        HESettings(scheme="ou", key_size=1024)
    a, b = new_keys(HESettings()), new_keys(HESettings())
    assert a.public_key != b.public_key  # fresh from the OS each time, whatever the run seed
    gh = np.array([[5, 7], [-3, 2], [10, 0]], dtype=np.int64)
    sums = a.bucket_sums(a.encrypt(gh), np.arange(3), np.zeros((3, 1), dtype=np.int8), 2)
    assert a.decrypt(sums).tolist() == [[12, 9], [0, 0]]


def test_a_partner_learns_who_shares_a_node_and_active_trees_hide_the_first_trees() -> None:
    """The instance-space attack (a partner scoring people by the known labels of those it summed a node with)
    finds the labels; with ``active_trees`` the partners see no node of the first trees."""
    from vflo.privacy.evaluate import attack_run

    together, _ = _blocks(n=700)
    seen = {}
    for first in (0, 1):
        method = get_method("secureboost")(n_trees=3, max_depth=3, n_bins=8, he={"scheme": "plaintext"},
                                           active_trees=first)
        seen[first] = attack_run(method, together, seed=0, completion=(40,), decoders=())["labels"]
    assert [seen[0][p]["instance_trees"] for p in ("p1", "p2")] == [3, 3]
    assert [seen[1][p]["instance_trees"] for p in ("p1", "p2")] == [2, 2]
    assert seen[0]["p1"]["instance_first_40"] > 0.75  # the first tree's nodes sort people by their labels


def test_a_helper_process_reports_its_failure_and_ends_with_its_pipe() -> None:
    from vflo.helpers import Helper, HelperError

    helper = Helper()
    try:
        with pytest.raises(HelperError, match="no_such_call: HelperError: vflo.trees.crypto registers no helper"):
            helper.call(("vflo.trees.crypto", "no_such_call"))
        with pytest.raises(HelperError, match="sb.sum_rows: HelperError: this worker holds no evaluator"):
            helper.call(crypto.sum_rows, np.arange(3))  # nothing held yet: a clear error, not a hang
    finally:
        helper.close()
    assert helper._process.returncode == 0
