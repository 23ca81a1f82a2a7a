"""vflo explore: weight of evidence and information value from a partner's per-bin sums of encrypted labels equal
a centralized computation on the same bins; a partner releases only bins of its policy's size, and only where its
policy says so."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from vflo.cli import main
from vflo.data.partydata import PartyData
from vflo.errors import ConfigError, RemoteError
from vflo.explorer.report import page, strength, write
from vflo.explorer.run import explore
from vflo.explorer.woe import SMOOTHING, chi_merge, merged, targets, woe_iv
from vflo.party.explore import own_bins, pack, unpack
from vflo.party.policy import Policy


def _parties(n: int = 1500, seed: int = 0, task: str = "binary") -> tuple[PartyData, PartyData, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = np.array([f"P{i:05d}" for i in range(n)])
    if task == "binary":
        y: np.ndarray = (rng.random(n) < 0.3).astype(np.int64)
        signal = y.astype(float)
    elif task == "multiclass":
        y = rng.integers(0, 3, n).astype(np.int64)
        signal = y.astype(float)
    else:
        y = rng.normal(size=n)
        signal = y
    a = PartyData(party="bank", ids=ids, X=rng.normal(size=(n, 2)) + signal[:, None], columns=("a1", "a2"), y=y)
    keep = rng.random(n) < 0.8
    # b2 had gaps in the bureau's file, filled there, with its missing indicator beside it (missing_indicator).
    Xb = np.c_[rng.normal(size=n) + 0.8 * signal, rng.normal(size=n), (rng.random(n) < 0.1).astype(float),
               rng.integers(0, 3, n).astype(float)]
    b = PartyData(party="bureau", ids=ids[keep][::-1], X=Xb[keep][::-1],
                  columns=("b1", "b2", "b2=missing", "b3"))
    return a, b, keep


def _central(column: np.ndarray, t: np.ndarray, bins: int, min_rows: int) -> tuple[np.ndarray, float, np.ndarray]:
    """WOE and IV of one column on the partner's bins, computed from the raw column and targets together."""
    codes, n_bins, reported = own_bins(column, bins, min_rows)
    kept = codes >= 0
    counts = np.bincount(codes[kept], minlength=n_bins + reported)
    events = np.bincount(codes[kept], weights=t[kept].astype(float), minlength=n_bins + reported)
    woe, iv = woe_iv(events, counts)
    return woe, iv, counts


def test_woe_and_iv_by_hand() -> None:
    woe, iv = woe_iv(np.array([10, 30]), np.array([50, 50]))
    # events 10/40, 30/40; non-events 40/60, 20/60
    expected = [math.log((10 / 40) / (40 / 60)), math.log((30 / 40) / (20 / 60))]
    assert np.allclose(woe, expected, rtol=0, atol=1e-12)
    assert iv == pytest.approx((10 / 40 - 40 / 60) * expected[0] + (30 / 40 - 20 / 60) * expected[1], abs=1e-12)
    # A bin with no event gets SMOOTHING on both of its counts, not an infinite WOE.
    woe, iv = woe_iv(np.array([0, 20]), np.array([30, 30]))
    assert np.isfinite(woe).all() and woe[0] == pytest.approx(math.log((SMOOTHING / 20) / ((30 + SMOOTHING) / 40)))
    # A target with one value says nothing: IV 0.
    assert woe_iv(np.array([0, 0]), np.array([5, 5]))[1] == 0.0
    with pytest.raises(ValueError, match="between 0"):
        woe_iv(np.array([6]), np.array([5]))


def test_targets_for_each_task() -> None:
    assert targets(np.array([0, 1, 1]), "binary").values.ravel().tolist() == [False, True, True]
    many = targets(np.array([0, 2, 1, 2]), "multiclass", ("a", "b", "c"))
    assert many.values.shape == (4, 3) and many.names == ("label = a", "label = b", "label = c")
    above = targets(np.array([1.0, 2.0, 3.0, 4.0]), "regression")
    assert above.values.ravel().tolist() == [False, False, True, True] and "median" in above.names[0]
    with pytest.raises(ConfigError, match="binary, multiclass or regression"):
        targets(np.array([1]), "ranking")


def test_a_partners_bins_hold_at_least_its_minimum() -> None:
    rng = np.random.default_rng(1)
    column = np.r_[rng.normal(size=300), np.full(40, 5.0), [np.nan] * 7]
    codes, n_bins, reported = own_bins(column, 20, 30)
    counts = np.bincount(codes[codes >= 0])
    assert n_bins == len(counts) and (counts >= 30).all() and n_bins <= 20
    assert not reported and (codes[-7:] == -1).all()  # seven missing: under the minimum, withheld
    # Equal-frequency, in order: bin codes rise with the values.
    present = ~np.isnan(column)
    order = np.argsort(column[present], kind="stable")
    assert (np.diff(codes[present][order]) >= 0).all()


def test_chi_merge_merges_adjacent_bins_to_the_most_kept() -> None:
    events, counts = np.array([5, 6, 30, 31, 2]), np.array([50, 50, 50, 50, 50])
    groups = chi_merge(events, counts, 3)
    assert groups.tolist() == [0, 0, 1, 1, 2]  # like neighbours first; order kept
    assert merged(counts, groups).tolist() == [100, 100, 50] and merged(events, groups).sum() == events.sum()


def test_packed_blobs_round_trip_and_a_bad_head_is_refused() -> None:
    blobs = [b"abc", b"", b"defgh"]
    assert unpack(pack(blobs)) == blobs
    with pytest.raises(Exception, match="do not add up"):
        unpack(pack(blobs) + b"x")


@pytest.mark.parametrize(("scheme", "shared"), [("plaintext", "count"), ("ou", "count"), ("ou", "ids")])
def test_explore_equals_the_centralized_computation_on_the_same_bins(scheme: str, shared: str) -> None:
    a, b, keep = _parties()
    found = explore([a, b], scheme=scheme, bins=10, min_bin_rows=50, shared=shared)  # type: ignore[arg-type]
    assert found.shared == {"bureau": int(keep.sum())} and found.asked == len(a.ids) and found.shared_as == shared
    t = a.y[keep]  # type: ignore[index]
    rows = {name: b.subset(a.ids[keep]).X[:, j] for j, name in enumerate(b.columns)}
    assert {c.name for c in found.columns} == set(b.columns)
    for c in found.columns:
        woe, iv, counts = _central(rows[c.name], t, 10, 50)
        assert abs(c.iv[0] - iv) < 1e-9, c.name
        assert np.allclose(c.woe[:, 0], woe, rtol=0, atol=1e-9, equal_nan=True)
        assert c.counts.tolist() == counts.tolist() and (c.counts >= 50).all()
    table = found.table()
    assert table["iv"].is_monotonic_decreasing and table.iloc[0]["column"] == "b1"  # the column with the signal
    assert table.iloc[0]["rank"] == 1 and strength(float(table.iloc[0]["iv"])) in ("strong", "suspiciously strong")
    # b2's missing share is its indicator's, on the shared people; b3 had no gaps.
    share = {c.name: c.missing_share for c in found.columns}
    assert share["b2"] == pytest.approx(b.subset(a.ids[keep]).X[:, 2].mean()) and 0 < share["b2"] < 0.2
    assert share["b3"] == 0.0 and next(c for c in found.columns if c.name == "b3").distinct == 3


def test_multiclass_gives_one_iv_per_class_and_regression_one_above_the_median() -> None:
    a, b, keep = _parties(task="multiclass")
    found = explore([a, b], scheme="plaintext", bins=8, min_bin_rows=40)
    assert len(found.targets) == 3 and all(len(c.iv) == 3 for c in found.columns)
    column = b.subset(a.ids[keep]).X[:, 0]
    for k in range(3):
        _, iv, _ = _central(column, (a.y[keep] == k), 8, 40)  # type: ignore[index]
        assert abs(found.columns[0].iv[k] - iv) < 1e-9
    assert {f"iv[label = {k}]" for k in range(3)} <= set(found.table().columns)
    a, b, keep = _parties(task="regression")
    found = explore([a, b], task="regression", scheme="plaintext")
    # Above the median of every label the active party holds: one target for every partner.
    _, iv, _ = _central(b.subset(a.ids[keep]).X[:, 0], a.y[keep] > np.median(a.y), 10, 50)  # type: ignore[index, arg-type]
    assert abs(found.columns[0].iv[0] - iv) < 1e-9 and "median" in found.targets[0]
    with pytest.raises(ConfigError, match="chi-merge merges bins by one target"):
        explore(list(_parties(task="multiclass")[:2]), scheme="plaintext", binning="chimerge")


def test_chi_merge_explores_the_merged_bins() -> None:
    a, b, keep = _parties()
    found = explore([a, b], scheme="plaintext", bins=12, min_bin_rows=40, binning="chimerge", max_bins=4)
    column = b.subset(a.ids[keep]).X[:, 0]
    codes, n_bins, _ = own_bins(column, 12, 40)
    t = a.y[keep]  # type: ignore[index]
    counts = np.bincount(codes, minlength=n_bins)
    events = np.bincount(codes, weights=t.astype(float), minlength=n_bins)
    groups = chi_merge(events, counts, 4)
    _, iv = woe_iv(merged(events, groups), merged(counts, groups))
    first = next(c for c in found.columns if c.name == "b1")
    assert len(first.counts) == 4 and abs(first.iv[0] - iv) < 1e-9


def test_a_partner_answers_only_where_its_policy_says_so() -> None:
    from vflo.align.engines import AlignmentConfig
    from vflo.comm.local import LocalTransport
    from vflo.explorer.run import explore_with
    from vflo.federation.coordinator import Aligner
    from vflo.federation.simulation import party_node
    from vflo.roles import PartyInfo

    a, b, _ = _parties(n=300)
    infos = (PartyInfo("bank", "active"), PartyInfo("bureau", "passive"))
    nodes = {"bank": party_node(infos[0], a, peers=infos),
             "bureau": party_node(infos[1], b, peers=infos, policy=Policy(alignment="plain"))}
    fed = Aligner(node=nodes["bank"], transport=LocalTransport(nodes), parties=infos,
                  alignment=AlignmentConfig(method="plain"))
    with pytest.raises(RemoteError, match=r"does not answer vflo explore.*explore = true under \[policy\]"):
        explore_with(fed, a)
    with pytest.raises(ConfigError, match="policy.min_bin_rows"):
        Policy(min_bin_rows=0)
    with pytest.raises(ConfigError, match="policy.explore_bins"):
        Policy(explore_bins=200)


def test_the_report_escapes_partner_column_names(tmp_path: Path) -> None:
    a, b, _ = _parties(n=600)
    b = PartyData(party=b.party, ids=b.ids, X=b.X, columns=("<script>x</script>", "b2", "b2=missing", "b3"))
    found = explore([a, b], scheme="plaintext", bins=5, min_bin_rows=30)
    text = page(found)
    assert "<script>x" not in text and "&lt;script&gt;" in text
    written = write(found, tmp_path / "out")
    assert [p.name for p in written] == ["explore.csv", "explore.json", "explore.md", "explore.html"]
    assert not list((tmp_path / "out").glob("*.part"))


def test_vflo_explore_rehearses_a_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "breast.toml"
    config.write_text('name = "x"\nseed = 0\n[dataset]\nname = "breast_cancer"\n[scenario]\n'
                      '[[scenario.parties]]\nname = "hospital"\nrole = "active"\nshare = 1.0\n'
                      '[[scenario.parties]]\nname = "lab"\nshare = 0.6\n[[methods]]\nname = "local"\n')
    out = tmp_path / "explored"
    assert main(["explore", str(config), "--out", str(out), "--scheme", "ou", "--min-bin-rows", "20"]) == 0
    said = capsys.readouterr().out
    assert "lab:" in said and "people hospital holds are shared" in said and "IV" in said
    assert (out / "explore.html").is_file() and "lab" in (out / "explore.md").read_text()
    assert main(["explore", str(config), "--out", str(out), "--max-bins", "0"]) == 2


def test_what_the_label_holder_learns_is_measured_as_a_guess_of_a_persons_bin() -> None:
    a, b, keep = _parties()
    found = explore([a, b], scheme="plaintext", bins=10, min_bin_rows=50)
    t = a.y[keep]  # type: ignore[index]
    shared = a.ids[keep]
    for c in found.columns:
        codes, _, _ = own_bins(b.subset(shared).X[:, b.columns.index(c.name)], 10, 50)
        # The label holder's best guess from what it got: for each label, the bin with most people of that label.
        best = {label: int(np.argmax(np.bincount(codes[t == label], minlength=len(c.counts)))) for label in (0, 1)}
        right = np.mean([codes[i] == best[int(t[i])] for i in range(len(t))])
        guess, sizes = c.guessed
        assert guess == pytest.approx(right) and sizes == pytest.approx(np.bincount(codes).max() / len(codes))
    signal = next(c for c in found.columns if c.name == "b1").guessed
    noise = next(c for c in found.columns if c.name == "b2").guessed
    assert signal[0] - signal[1] > noise[0] - noise[1]  # its labels say more about a column that predicts them


def test_a_partner_answers_each_peer_only_as_often_as_its_policy_says() -> None:
    from vflo.align.engines import AlignmentConfig
    from vflo.comm.local import LocalTransport
    from vflo.explorer.run import explore_with
    from vflo.federation.coordinator import Aligner
    from vflo.federation.simulation import party_node
    from vflo.roles import PartyInfo

    a, b, _ = _parties(n=400)
    infos = (PartyInfo("bank", "active"), PartyInfo("bureau", "passive"))
    for answers in (1, 2):
        policy = Policy(alignment="plain", explore=True, min_bin_rows=20, explore_answers=answers)
        nodes = {"bank": party_node(infos[0], a, peers=infos), "bureau": party_node(infos[1], b, peers=infos,
                                                                                    policy=policy)}
        fed = Aligner(node=nodes["bank"], transport=LocalTransport(nodes), parties=infos,
                      alignment=AlignmentConfig(method="plain"))
        for _ in range(answers):
            explore_with(fed, a, he=None)
        # One more, past the policy (about one person fewer, its difference with the last would place that person).
        with pytest.raises(RemoteError, match=rf"answered 'bank'.s vflo explore {answers} time.*explore_answers"):
            explore_with(fed, a)


def test_a_partner_selects_its_own_columns_by_its_policy() -> None:
    from vflo.party.explore import selected_out

    policy = Policy(select_iv_below=0.05, select_missing_above=0.3)
    columns = ("x", "y", "z", "w")
    iv, missing = np.array([0.5, 0.01, 0.2, 0.3]), np.array([0.0, 0.0, 0.4, math.nan])
    assert selected_out(policy, columns, iv, missing) == ["y", "z"]  # a share not known drops nothing
    assert selected_out(Policy(), columns, iv, missing) == []  # the defaults select nothing
    # Never every column: its best one stays.
    assert selected_out(Policy(select_iv_below=9.0), columns, iv, missing) == ["y", "z", "w"]
    with pytest.raises(ConfigError, match="select_missing_above"):
        Policy(select_missing_above=1.5)


def test_explore_with_selection_drops_the_columns_at_their_owner_and_training_uses_the_rest() -> None:
    from vflo.explorer.run import kept

    a, b, _ = _parties()
    found = explore([a, b], scheme="plaintext", bins=10, min_bin_rows=50, select_iv_below=0.05)
    weak = sorted(c.name for c in found.columns if c.best_iv < 0.05)
    assert found.dropped == {"bureau": weak} and "b1" not in weak and weak
    assert "bureau dropped" in " ".join(__import__("vflo.explorer.report", fromlist=["x"]).summary_lines(found))
    a2, b2 = kept([a, b], found)
    assert a2.columns == a.columns and b2.columns == tuple(c for c in b.columns if c not in weak)
    assert np.array_equal(b2.X, b.X[:, [b.columns.index(c) for c in b2.columns]])


def test_a_node_drops_selected_columns_between_runs_only_and_saves_parts_that_read_without_them(
        tmp_path: Path) -> None:
    from vflo.align.engines import AlignmentConfig
    from vflo.artifacts import PartStore, Preprocessing
    from vflo.comm.local import LocalTransport
    from vflo.explorer.run import explore_with
    from vflo.federation.coordinator import Aligner
    from vflo.federation.simulation import party_node
    from vflo.roles import PartyInfo

    a, b, _ = _parties(n=400)
    infos = (PartyInfo("bank", "active"), PartyInfo("bureau", "passive"))
    policy = Policy(alignment="plain", explore=True, min_bin_rows=20, select_iv_below=9.0, explore_answers=2)
    store = PartStore(tmp_path, party="bureau", role="passive", preprocessing=Preprocessing(columns=b.columns))
    nodes = {"bank": party_node(infos[0], a, peers=infos),
             "bureau": party_node(infos[1], b, b, peers=infos, policy=policy, store=store)}
    fed = Aligner(node=nodes["bank"], transport=LocalTransport(nodes), parties=infos,
                  alignment=AlignmentConfig(method="plain"))
    found = explore_with(fed, a, he=None, select=True)
    best = max(found.columns, key=lambda c: c.best_iv).name
    assert sorted(found.dropped["bureau"]) == sorted(c for c in b.columns if c != best)
    # The parts it saves from now on read a table with every column of its file, without the dropped ones.
    assert store.preprocessing is not None and store.preprocessing.columns == (best,)
    assert store.preprocessing.dropped == tuple(c for c in b.columns if c != best)
    rows = store.preprocessing.rows(b, party="bureau")
    assert rows.columns == (best,) and np.array_equal(rows.X[:, 0], b.X[:, b.columns.index(best)])
    # Exploring again shows one column: the node holds its rows without the others.
    assert [c.name for c in explore_with(fed, a, he=None).columns] == [best]


def test_a_node_refuses_to_drop_columns_during_a_run() -> None:
    from vflo.api import fit
    from vflo.data.layout import Layout
    from vflo.party.explore import SELECT_KIND

    a, b, _ = _parties(n=300)
    data = Layout.from_parties([a, b], seed=0).materialize()
    model = fit("local", data)  # its run stays open
    with pytest.raises(RemoteError, match="drops columns only between runs"):
        model.federation.exchange(SELECT_KIND, {"bureau": {"columns": np.asarray(b.columns), "iv": np.zeros(4),
                                                           "missing": np.zeros(4)}})


def test_preprocessing_without_columns_keeps_the_standardisation_of_the_rest() -> None:
    from vflo.artifacts import Preprocessing
    from vflo.data.preprocessing import Standardizer

    pre = Preprocessing(columns=("x", "y", "z"), scaler=Standardizer(mean_=np.array([1.0, 2.0, 3.0]),
                                                                      scale_=np.array([2.0, 4.0, 8.0])))
    less = pre.without(["y"])
    assert less.columns == ("x", "z") and less.dropped == ("y",)
    assert less.scaler is not None and less.scaler.mean_.tolist() == [1.0, 3.0]
    assert less.scaler.scale_.tolist() == [2.0, 8.0]
    assert Preprocessing.from_dict(less.to_dict()).dropped == ("y",)
    rows = PartyData(party="p", ids=np.array(["a", "b"]), X=np.array([[3.0, 0.0, 11.0], [1.0, 0.0, 3.0]]),
                     columns=("x", "y", "z"))
    ready = less.rows(rows, party="p")
    assert ready.columns == ("x", "z") and np.allclose(ready.X, [[1.0, 1.0], [0.0, 0.0]])
    with pytest.raises(Exception, match="differ from those its model was trained on"):
        less.rows(rows.without(["z"]), party="p")  # a column it kept is missing: refused as before


def test_a_partner_without_columns_is_explored_as_such() -> None:
    a, b, _ = _parties(n=200)
    empty = PartyData(party="bureau", ids=b.ids, X=np.zeros((len(b.ids), 0)), columns=())
    found = explore([a, empty], scheme="plaintext", min_bin_rows=20)
    assert found.columns == [] and found.shared["bureau"] == len(b.ids) and found.table().empty


def test_vflo_explore_is_the_python_entry() -> None:
    import vflo

    assert vflo.explore is explore and "explore" in vflo.__all__
    a, b, _ = _parties(n=300)
    assert [c.name for c in vflo.explore([a, b], scheme="plaintext", min_bin_rows=20).columns] == list(b.columns)


def test_a_partner_takes_information_values_only_after_its_own_sums() -> None:
    from vflo.align.engines import AlignmentConfig
    from vflo.comm.local import LocalTransport
    from vflo.federation.coordinator import Aligner
    from vflo.federation.simulation import party_node
    from vflo.party.explore import SELECT_KIND
    from vflo.roles import PartyInfo

    a, b, _ = _parties(n=200)
    infos = (PartyInfo("bank", "active"), PartyInfo("bureau", "passive"))
    policy = Policy(alignment="plain", explore=True, select_iv_below=0.5)
    nodes = {"bank": party_node(infos[0], a, peers=infos), "bureau": party_node(infos[1], b, peers=infos,
                                                                                policy=policy)}
    fed = Aligner(node=nodes["bank"], transport=LocalTransport(nodes), parties=infos,
                  alignment=AlignmentConfig(method="plain"))
    ask = {"columns": np.asarray(b.columns), "iv": np.zeros(4), "missing": np.zeros(4)}
    with pytest.raises(RemoteError, match="has answered no vflo explore from 'bank'.*after its per-bin sums"):
        fed.exchange(SELECT_KIND, {"bureau": ask})
    with pytest.raises(RemoteError, match="one information value and one missing share for each"):
        fed.exchange(SELECT_KIND, {"bureau": {**ask, "columns": np.asarray(b.columns[:2])}})
    with pytest.raises(ConfigError, match="select_iv_below"):
        Policy(select_iv_below=-1.0)


def _nodes(a: PartyData, b: PartyData, policy: Policy) -> tuple[object, dict[str, object]]:
    from vflo.align.engines import AlignmentConfig
    from vflo.comm.local import LocalTransport
    from vflo.federation.coordinator import Aligner
    from vflo.federation.simulation import party_node
    from vflo.roles import PartyInfo

    infos = (PartyInfo("bank", "active"), PartyInfo("bureau", "passive"))
    nodes = {"bank": party_node(infos[0], a, peers=infos), "bureau": party_node(infos[1], b, peers=infos,
                                                                                policy=policy)}
    return Aligner(node=nodes["bank"], transport=LocalTransport(nodes), parties=infos,
                   alignment=AlignmentConfig(method="plain")), nodes


def test_by_default_the_label_holder_learns_how_many_it_shares_and_never_who(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from vflo.align.psi import hash_ids
    from vflo.explorer.run import explore_with

    a, b, keep = _parties(n=600)
    fed, _ = _nodes(a, b, Policy(alignment="plain", explore=True, min_bin_rows=20))
    received, sent = [], []
    real = fed.exchange  # type: ignore[attr-defined]

    def spy(kind: str, payloads: dict[str, object]) -> object:
        sent.append((kind, payloads))
        replies = real(kind, payloads)
        received.append((kind, replies))
        return replies

    monkeypatch.setattr(fed, "exchange", spy)
    found = explore_with(fed, a, he=None)  # type: ignore[arg-type]
    assert [k for k, _ in sent] == ["explore.points", "explore.blind_sums"]  # no alignment: nothing named by ID
    assert found.shared == {"bureau": int(keep.sum())} and found.shared_as == "count"
    # Nothing that came back names a person: no ID in the clear, and the partner's points are not its IDs hashed
    # (they are under its secret key), nor the label holder's own points raised once more in its order.
    theirs = received[0][1]["bureau"].array("points")  # type: ignore[index]
    salt = sent[0][1]["bureau"]["salt"].tobytes()  # type: ignore[index]
    assert not np.isin(hash_ids(b.ids, salt).view("V32").ravel(), theirs.view("V32").ravel()).any()
    for _, replies in received:
        for name in replies["bureau"]:  # type: ignore[index]
            value = replies["bureau"][name]  # type: ignore[index]
            if isinstance(value, np.ndarray) and value.dtype.kind in "UO":
                assert not np.isin(value, a.ids).any(), name
    # What the partner sent per bin is over exactly the people both hold: the centralized IV on them.
    t = a.y[keep]  # type: ignore[index]
    column = b.subset(a.ids[keep]).X[:, 0]
    assert abs(next(c for c in found.columns if c.name == "b1").iv[0] - _central(column, t, 10, 20)[1]) < 1e-9


def test_a_partner_whose_policy_keeps_who_is_shared_refuses_to_answer_over_named_people() -> None:
    from vflo.explorer.run import explore_with

    a, b, _ = _parties(n=400)
    fed, _ = _nodes(a, b, Policy(alignment="plain", explore=True, min_bin_rows=20, explore_answers=2))
    with pytest.raises(RemoteError, match=r"only how many people they share.*--shared count.*explore_shared"):
        explore_with(fed, a, he=None, shared="ids")  # type: ignore[arg-type]
    assert explore_with(fed, a, he=None).shared_as == "count"  # type: ignore[arg-type]  # the refusal took none
    with pytest.raises(ConfigError, match="policy.explore_shared"):
        Policy(explore_shared="who")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="shared is 'count'"):
        explore_with(fed, a, shared="all")  # type: ignore[arg-type]


def test_blinded_sums_come_only_after_the_points_and_over_at_least_min_bin_rows_people() -> None:
    from vflo.explorer.run import explore_with
    from vflo.party.explore import BLIND_KIND

    a, b, keep = _parties(n=400)
    fed, _ = _nodes(a, b, Policy(alignment="plain", explore=True, min_bin_rows=20, explore_answers=3))
    ask = {"double": np.zeros((len(b.ids), 32), dtype=np.uint8), "scheme": "plaintext",
           "public_key": np.zeros(1, dtype=np.uint8), "labels": np.zeros((1, 4096), dtype=np.uint8)}
    with pytest.raises(RemoteError, match="no explore.points of 'bank'.*send explore.points first"):
        fed.exchange(BLIND_KIND, {"bureau": ask})  # type: ignore[attr-defined]
    # A label holder that shares fewer people with the partner than its min_bin_rows gets no sums.
    few = a.subset(a.ids[keep][:15])
    with pytest.raises(RemoteError, match=r"shares 15 people with 'bank', fewer than its min_bin_rows \(20\)"):
        explore_with(fed, few, he=None)  # type: ignore[arg-type]


@pytest.mark.parametrize(("forge", "said"), [
    (lambda r: {**r, "counts": r["counts"] // 10}, "between 0 and its people"),
    (lambda r: {**r, "columns": r["columns"][:-1]}, "do not fit its columns and bins"),
    (lambda r: {**r, "counts": -r["counts"]}, "between 0 and its people"),
])
def test_the_label_holder_refuses_per_bin_sums_that_cannot_be_right(
        monkeypatch: pytest.MonkeyPatch, forge: object, said: str) -> None:
    import vflo.align.blind_join as partner
    from vflo.errors import DataError
    from vflo.explorer.run import explore_with

    a, b, _ = _parties(n=400)
    fed, _ = _nodes(a, b, Policy(alignment="plain", explore=True, min_bin_rows=20))
    real = partner.binned
    monkeypatch.setattr(partner, "binned", lambda *args: forge(real(*args)))  # type: ignore[operator]
    with pytest.raises(DataError, match=said):
        explore_with(fed, a, he=None)  # type: ignore[arg-type]


@pytest.mark.parametrize(("shared", "said"), [
    (10 ** 6, "says it shares 1000000 of the 400 people"),
    (30, "people in the bins of 'b1', more than the 30 it shares"),
])
def test_the_label_holder_refuses_a_shared_count_its_people_or_the_bins_do_not_fit(
        monkeypatch: pytest.MonkeyPatch, shared: int, said: str) -> None:
    import vflo.align.blind_join as partner
    from vflo.errors import DataError
    from vflo.explorer.run import explore_with

    a, b, _ = _parties(n=400)
    fed, _ = _nodes(a, b, Policy(alignment="plain", explore=True, min_bin_rows=20))
    handler = partner.BlindJoinHandlers._blind_sums
    monkeypatch.setattr(partner.BlindJoinHandlers, "_blind_sums",
                        lambda self, ctx, payload: {**handler(self, ctx, payload), "shared": shared})
    with pytest.raises(DataError, match=said):
        explore_with(fed, a, he=None)  # type: ignore[arg-type]


def test_a_config_with_select_trains_every_method_on_the_columns_each_partner_kept(tmp_path: Path) -> None:
    import json

    from vflo.experiments.config import load_config
    from vflo.experiments.runner import first_split, run_experiment
    from vflo.explorer.run import explore as explored

    config = tmp_path / "breast.toml"
    config.write_text('name = "x"\nseed = 0\n[dataset]\nname = "breast_cancer"\n[scenario]\n'
                      '[[scenario.parties]]\nname = "hospital"\nrole = "active"\nshare = 1.0\n'
                      '[[scenario.parties]]\nname = "lab"\nshare = 0.8\n'
                      '[protocol]\nname = "holdout"\nrepeats = 1\n'
                      '[select]\niv_below = 1.5\nscheme = "plaintext"\nmin_bin_rows = 20\n'
                      '[[methods]]\nname = "local"\n[[methods]]\nname = "centralized"\n'
                      '[[methods]]\nname = "splitnn"\nfallback = "local"\ntrain = { max_epochs = 2 }\n')
    loaded = load_config(config)
    raw = first_split(loaded)
    lab = raw.train["lab"]
    # What the lab drops is what exploring the run's training people gives, by the same thresholds.
    found = explored([raw.train["hospital"], lab], scheme="plaintext", min_bin_rows=20, select_iv_below=1.5)
    gone = found.dropped["lab"]
    assert gone and len(gone) < len(lab.columns)
    result = run_experiment(loaded, save=tmp_path / "models")
    assert {r["status"] for r in result.rows} == {"ok"}
    assert {r["dropped_columns"] for r in result.rows} == {f"lab: {', '.join(gone)}"}
    # The lab's saved part reads its full file without them; the pooled baseline saw the kept columns only.
    manifest = json.loads(next((tmp_path / "models").rglob("lab/**/manifest.json")).read_text())
    assert sorted(manifest["preprocessing"]["dropped"]) == sorted(gone)
    assert manifest["preprocessing"]["columns"] == [c for c in lab.columns if c not in gone]
    less = raw.without({"lab": gone})
    assert less.oracle is not None and not set(gone) & set(less.oracle.columns())
    assert less.scalers["lab"].mean_.shape == (len(lab.columns) - len(gone),)
    nothing = tmp_path / "nothing.toml"
    nothing.write_text(config.read_text().replace("iv_below = 1.5\n", ""))
    with pytest.raises(ConfigError, match=r"\[select\] drops nothing"):
        load_config(nothing)
