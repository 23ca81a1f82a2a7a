"""Kept alignments: an intersection each party records in its own folder and reuses while neither side's people
changed; the same alignment as a fresh one, and nothing in either file beyond what the intersection showed."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.conftest import make_dataset, two_party_spec
from vflo.align import kept
from vflo.align.engines import AlignmentConfig
from vflo.align.kept import AlignmentStore
from vflo.align.plain import Aligned
from vflo.comm.message import Message
from vflo.data.layout import FederatedData
from vflo.errors import RemoteError
from vflo.federation.coordinator import Coordinator
from vflo.federation.session import Session
from vflo.federation.simulation import build_federation, run_method
from vflo.methods.registry import get_method
from vflo.party.node import Node


def split() -> FederatedData:
    # 300 people at the active party, 200 of them at the passive party, which holds 40 of its own besides.
    layout = two_party_spec(active=300, aligned=200, passive_only=40).build(make_dataset(n=340, n_features=6), seed=0)
    return layout.materialize()


def federation(data: FederatedData, root: Path, *, mode: str = "both", keeping: tuple[str, ...] = ("act", "pas"),
               reuse: bool = True, seen: list[Message] | None = None) -> tuple[Coordinator, dict[str, Node]]:
    method = get_method("local")()
    observers = () if seen is None else (seen.append,)
    fed, nodes = build_federation(data, method, seed=0, observers=observers,
                                  alignment=AlignmentConfig(method="psi", mode=mode, reuse=reuse))  # type: ignore[arg-type]
    for name in keeping:
        nodes[name].alignments = AlignmentStore(root / name, name)
    Session(fed).start(method)
    return fed, nodes


def kinds(seen: list[Message]) -> list[str]:
    return [m.kind for m in seen if m.kind.startswith("align.") and m.sender == "act"]  # the requests


def test_a_kept_intersection_is_reused_with_the_same_result(tmp_path: Path) -> None:
    data = split()
    seen: list[Message] = []
    fed, nodes = federation(data, tmp_path, seen=seen)
    ids = data.train["act"].ids
    first = fed.align(ids, ["pas"])
    assert kinds(seen) == ["align.psi", "align.psi_result", "align.keep"]
    assert fed.alignment_engine == "vflo"
    truth = np.intersect1d(ids, data.train["pas"].ids)
    assert np.array_equal(first.ids, truth)

    # A later run (a new federation over the same folders) asks once and runs no intersection.
    seen.clear()
    fed, nodes = federation(data, tmp_path, seen=seen)
    again = fed.align(ids, ["pas"])
    assert kinds(seen) == ["align.reuse"]
    assert fed.alignment_engine == "reused"
    assert np.array_equal(again.ids, first.ids) and np.array_equal(again.held["pas"], first.held["pas"])
    assert again.widths == first.widths
    assert np.array_equal(nodes["pas"].context.part(Aligned).held, truth)


def test_each_file_holds_its_own_partys_ids_only_flagged_shared_or_not(tmp_path: Path) -> None:
    data = split()
    fed, _ = federation(data, tmp_path)
    fed.align(data.train["act"].ids, ["pas"])
    for party, peer in (("act", "pas"), ("pas", "act")):
        (manifest,) = (tmp_path / party).glob("*.json")
        record = json.loads(manifest.read_text())
        assert (record["party"], record["peer"], record["purpose"], record["mode"]) == (party, peer, "train", "both")
        table = pd.read_parquet(manifest.with_suffix(".parquet"))
        own = data.train[party].ids
        assert np.array_equal(table["id"].to_numpy(), np.sort(own))  # every own row, none of the other party's
        shared = np.isin(np.sort(own), data.train[peer].ids)
        assert np.array_equal(table["shared"].to_numpy(), shared)  # the rows outside the intersection kept, flagged
        assert record["shared"] == int(shared.sum()) == 200 and record["n_ids"] == len(own)
    tokens = {json.loads(p.read_text())["token"] for p in tmp_path.glob("*/*.json")}
    assert len(tokens) == 1
    assert not list(tmp_path.glob("*/.*"))  # no temporary file left


def test_a_subset_of_the_kept_ids_is_reused_and_narrows_the_partners_list(tmp_path: Path) -> None:
    data = split()
    fed, _ = federation(data, tmp_path)
    ids = data.train["act"].ids
    fed.align(ids, ["pas"])
    seen: list[Message] = []
    fed, nodes = federation(data, tmp_path, seen=seen)
    some = np.sort(ids)[::3]
    found = fed.align(some, ["pas"])
    assert kinds(seen) == ["align.reuse"]
    truth = np.intersect1d(some, data.train["pas"].ids)
    assert np.array_equal(found.ids, truth)
    # the partner knows exactly the shared people of the narrower set, as a fresh intersection would tell it
    assert np.array_equal(nodes["pas"].context.part(Aligned).held, truth)


def test_changed_people_at_either_side_align_afresh(tmp_path: Path) -> None:
    data = split()
    fed, _ = federation(data, tmp_path)
    ids = data.train["act"].ids
    fed.align(ids, ["pas"])

    # The partner's file changed (one person fewer): it declines, a fresh intersection runs and is kept.
    pas = data.train["pas"]
    changed = replace(data, train={**data.train, "pas": pas.subset(pas.ids[1:])})
    seen: list[Message] = []
    fed, _ = federation(changed, tmp_path, seen=seen)
    found = fed.align(ids, ["pas"])
    assert kinds(seen) == ["align.reuse", "align.psi", "align.psi_result", "align.keep"]
    assert np.array_equal(found.ids, np.intersect1d(ids, pas.ids[1:]))
    assert len(list((tmp_path / "pas").glob("*.json"))) == 2  # the old record stays; the newest is used

    # The active party asks about someone the kept intersection did not cover: a fresh one.
    seen.clear()
    fed, _ = federation(changed, tmp_path, seen=seen)
    more = np.concatenate([ids, np.setdiff1d(pas.ids, ids)[:1]])
    fed.align(more, ["pas"])
    assert kinds(seen) == ["align.psi", "align.psi_result", "align.keep"]


def test_mode_active_keeps_no_table_at_the_partner_and_sends_it_no_selector(tmp_path: Path) -> None:
    data = split()
    fed, _ = federation(data, tmp_path, mode="active")
    ids = data.train["act"].ids
    first = fed.align(ids, ["pas"])
    assert not list((tmp_path / "pas").glob("*.parquet"))
    (manifest,) = (tmp_path / "pas").glob("*.json")
    assert json.loads(manifest.read_text())["shared"] == -1
    seen: list[Message] = []
    fed, nodes = federation(data, tmp_path, mode="active", seen=seen)
    again = fed.align(ids, ["pas"])
    (reuse,) = [m for m in seen if m.kind == "align.reuse" and m.sender == "act"]
    assert len(reuse.payload["pick"]) == 0  # not even how many people are shared
    assert np.array_equal(again.ids, first.ids)
    assert nodes["pas"].context.part(Aligned).held is None


def test_a_partner_that_keeps_nothing_means_nothing_is_kept(tmp_path: Path) -> None:
    data = split()
    seen: list[Message] = []
    fed, _ = federation(data, tmp_path, keeping=("act",), seen=seen)
    fed.align(data.train["act"].ids, ["pas"])
    assert not (tmp_path / "act").exists()
    fed, _ = federation(data, tmp_path, reuse=False, seen=seen)
    seen.clear()
    fed.align(data.train["act"].ids, ["pas"])
    assert kinds(seen) == ["align.psi", "align.psi_result"]
    assert not (tmp_path / "act").exists() and not (tmp_path / "pas").exists()


def test_a_keep_for_an_intersection_the_partner_did_not_run_is_refused(tmp_path: Path) -> None:
    data = split()
    fed, _ = federation(data, tmp_path)
    with pytest.raises(RemoteError, match="did not just run"):
        fed.request("pas", kept.KEEP_KIND, {"token": "t", "purpose": "train", "mode": "both", "engine": "vflo"})
    fed.align(data.train["act"].ids, ["pas"])
    with pytest.raises(RemoteError, match="did not just run"):
        fed.request("pas", kept.KEEP_KIND, {"token": "t", "purpose": "serve", "mode": "both", "engine": "vflo"})


def test_a_record_is_whole_or_absent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = AlignmentStore(tmp_path, "act")
    record = kept.Kept(token="t", party="act", peer="pas", side="asker", purpose="train", mode="both",
                       engine="vflo", created="2026-01-01", digest="d", n_ids=2, shared=1)

    def fail(*_: object, **__: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(Path, "write_text", fail)
    with pytest.raises(OSError, match="disk full"):
        store.save(record, np.array([1, 2]), np.array([True, False]))
    assert list(tmp_path.iterdir()) == []
    assert store.records() == []


def test_a_method_trained_on_a_reused_alignment_is_the_same_model(tmp_path: Path) -> None:
    data = split()
    method = get_method("splitnn")
    fresh = run_method(method(train={"max_epochs": 2}), data, seed=0, alignment=AlignmentConfig(method="psi"))
    fed, _ = federation(data, tmp_path)
    fed.align(data.train["act"].ids, ["pas"])
    stores = {n: AlignmentStore(tmp_path / n, n) for n in ("act", "pas")}
    reused = run_method(method(train={"max_epochs": 2}), data, seed=0, alignment=AlignmentConfig(method="psi"),
                        alignments=stores)
    assert reused.psi_engine == "reused"
    assert np.allclose(fresh.scores, reused.scores)


def test_vflo_align_says_how_to_keep_alignments_when_the_active_party_keeps_none(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from vflo.cli import main

    repo = Path(__file__).resolve().parents[1]
    (tmp_path / "deploy.toml").write_text(f"""
[active]
name = "hospital"
listen = "127.0.0.1:0"
alignments = ""

[active.data]
file = "{repo / 'examples/data/hospital.csv'}"
id_column = "pid"
label_column = "outcome"
categorical = ["sex", "ward"]

[active.tls]
insecure = true

[[parties]]
name = "lab"
address = "127.0.0.1:9"
""")
    assert main(["align", str(tmp_path / "deploy.toml")]) == 2
    err = capsys.readouterr().err
    assert "keeps no alignments" in err and "alignments = 'DIR'" in err
    assert main(["align", str(tmp_path / "deploy.toml"), "--serve", str(tmp_path / "none.csv")]) == 3


def test_the_digest_is_every_tagged_id_sorted_each_on_its_line_and_membership_is_by_search() -> None:
    import hashlib

    from vflo.align import ids as id_tools
    from vflo.align.kept import members
    from vflo.data.order import sorted_ids

    for ids in (np.array([5, 3, 10, -2]), np.array(["b", "a", "é", "Z", "ab"]), np.array([7, "7", "x"], dtype=object),
                np.random.default_rng(0).permutation(3000)):
        text = "".join(f"{n}\n" for n in sorted(id_tools.tagged(ids)))
        assert id_tools.digest(ids) == hashlib.sha256(text.encode("utf-8")).hexdigest()
        assert id_tools.tagged(id_tools.canonical(ids)) == sorted(id_tools.tagged(ids))
    old = id_tools.DIGEST_BLOCK
    id_tools.DIGEST_BLOCK = 7
    try:
        ids = np.arange(100)
        assert id_tools.digest(ids) == hashlib.sha256("".join(f"{n}\n" for n in sorted(id_tools.tagged(ids)))
                                                      .encode()).hexdigest()
    finally:
        id_tools.DIGEST_BLOCK = old
    held = np.array(["c", "a", "x"])
    ids = sorted_ids(np.array(["d", "a", "c", "b"]))
    assert ids.tolist() == ["a", "b", "c", "d"] and members(ids, held).tolist() == [True, False, True, False]
    assert not members(ids, held[:0]).any()



def test_a_store_read_once_sees_a_record_written_or_removed_since(tmp_path: Path) -> None:
    from dataclasses import replace

    store = AlignmentStore(tmp_path, "act")
    first = kept.Kept(token="t1", party="act", peer="pas", side="asker", purpose="serve", mode="both",
                      engine="vflo", created="2026-01-01", digest="d", n_ids=2, shared=1)
    store.save(first, np.array([1, 2]), np.array([True, False]))
    assert [r.token for r in store.records()] == ["t1"]
    ids, shared = store.table(first)
    assert ids.tolist() == [1, 2] and shared.tolist() == [True, False]
    (tmp_path / f"{first.stem}.parquet").unlink()
    assert store.table(first)[0].tolist() == [1, 2]  # a record never changes: read once
    second = replace(first, token="t2", created="2026-01-02")
    store.save(second, np.array([3]), np.array([True]))
    assert [r.token for r in store.records()] == ["t2", "t1"]  # the folder changed: listed again
    (tmp_path / f"{second.stem}.json").unlink()
    assert [r.token for r in store.records()] == ["t1"]
