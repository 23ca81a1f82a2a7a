"""Streaming PSI: two parties' files intersected a bucket at a time in bounded memory, each party keeping its own
rows' flags; the same people as a whole intersection, and each protocol step answered only in its turn."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.conftest import make_dataset
from vflo.align import psi, stream
from vflo.align.kept import AlignmentStore
from vflo.comm.message import Message
from vflo.data.scenario import PartySpec, SamplesSpec, ScenarioSpec
from vflo.errors import ConfigError, DataError, ProtocolError, RemoteError
from vflo.federation.coordinator import Coordinator
from vflo.federation.session import Session
from vflo.federation.simulation import build_federation
from vflo.methods.registry import get_method


def federation(root: Path, partner_file: Path | None, seen: list[Message] | None = None) -> Coordinator:
    # The parties' rows in memory do not matter here: streaming PSI reads their files.
    ds = make_dataset(n=60, n_features=4)
    spec = ScenarioSpec(parties=(PartySpec(name="a", role="active", n_columns=2), PartySpec(name="b", n_columns=2)),
                        samples=SamplesSpec(active=40, aligned=30, passive_only=20), unused_columns="drop")
    data = spec.build(ds, seed=3).materialize()
    files = {"train": stream.IdFile(partner_file, "id")} if partner_file is not None else {}
    stores = {"a": AlignmentStore(root / "a_alignments", "a"),
              "b": AlignmentStore(root / "b_alignments", "b", files=files)}
    method = get_method("local")()
    fed, _ = build_federation(data, method, seed=0, alignments=stores,
                              observers=() if seen is None else (seen.append,))
    Session(fed).start(method)
    return fed


def people(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Two lists of n text IDs, half of them shared."""
    ids = np.array([f"person-{v:09d}" for v in np.random.default_rng(seed).permutation(10**8)[: n + n // 2]])
    return ids[:n], ids[n // 2:]


def test_the_same_people_as_a_whole_intersection_and_each_party_keeps_its_own_flags(tmp_path: Path) -> None:
    mine, theirs = people(3_000)
    # IDs as text, as vflo reads files: "007" and "7" are two people; commas, quotes and line breaks survive.
    odd = np.array(["007", "7", 'a "quoted", id', "two\nlines", "é"])
    mine, theirs = np.concatenate([mine, odd]), np.concatenate([theirs, odd[[0, 2, 3, 4]], ["0007"]])
    pd.DataFrame({"x": 1.5, "id": mine}).to_csv(tmp_path / "a.csv", index=False)
    pd.DataFrame({"id": theirs, "y": 2}).to_parquet(tmp_path / "b.parquet", row_group_size=500)
    seen: list[Message] = []
    fed = federation(tmp_path, tmp_path / "b.parquet", seen)
    result = stream.stream_intersect(fed, stream.IdFile(tmp_path / "a.csv", "id"), "b",
                                     folder=tmp_path / "a_alignments", memory_mb=1)
    assert result.record.buckets == 3 and result.record.side == "asker"
    assert np.array_equal(result.shared, np.isin(mine, theirs)) and result.record.shared == 1_504
    # The partner's record: its own rows, in its file's order, flagged; neither record names the other's IDs.
    (partner_json,) = (tmp_path / "b_alignments" / "streamed").glob("a.train.*.json")
    record, flags = stream.read_record(partner_json)
    assert record.token == result.record.token and record.rows == len(theirs) and record.shared == 1_504
    assert flags is not None and np.array_equal(flags, np.isin(theirs, mine))
    table = pd.read_parquet(partner_json.with_suffix(".parquet"))
    assert list(table.columns) == ["row", "shared"] and np.array_equal(table["row"], np.arange(len(theirs)))
    assert stream.read_record(result.path)[1] is not None
    # Each bucket one message each way; the spilled buckets are gone at both parties, and no file is half-written.
    kinds = [m.kind for m in seen if m.sender == "a" and m.kind.startswith("align.")]
    assert kinds == [stream.OPEN_KIND, stream.SPLIT_KIND, *[stream.BUCKET_KIND] * 3, stream.CLOSE_KIND]
    # Each side sends every bucket as its largest: how its IDs fall into buckets does not leave it.
    for sender in ("a", "b"):
        sizes = {len(m.payload["points"]) for m in seen if m.kind == stream.BUCKET_KIND and m.sender == sender}
        assert len(sizes) == 1 and sizes.pop() > len(mine if sender == "a" else theirs) // 3, sender
    leftovers = [p.name for p in tmp_path.rglob("*") if p.name.startswith(".")]
    assert leftovers == []


def test_with_mode_active_the_partner_learns_no_flags(tmp_path: Path) -> None:
    mine, theirs = people(500)
    pd.DataFrame({"id": mine}).to_parquet(tmp_path / "a.parquet")
    pd.DataFrame({"id": theirs}).to_csv(tmp_path / "b.csv", index=False)
    fed = federation(tmp_path, tmp_path / "b.csv")
    result = stream.stream_intersect(fed, stream.IdFile(tmp_path / "a.parquet", "id"), "b", mode="active",
                                     folder=tmp_path / "a_alignments", memory_mb=1)
    assert np.array_equal(result.shared, np.isin(mine, theirs))
    (partner_json,) = (tmp_path / "b_alignments" / "streamed").glob("a.train.*.json")
    record, flags = stream.read_record(partner_json)
    assert record.shared == -1 and flags is None and record.mode == "active"
    assert json.loads(partner_json.read_text())["rows"] == len(theirs)


def test_an_intersection_larger_than_the_memory_ceiling_runs_under_it(tmp_path: Path) -> None:
    """Both parties in this process: their IDs in memory at once would take several times the ceiling; a bucket
    at a time, everything the intersection allocates stays under it (Python's and NumPy's allocations, traced)."""
    ceiling_mb = 2
    mine, theirs = people(12_000, seed=1)
    pd.DataFrame({"id": mine}).to_csv(tmp_path / "a.csv", index=False)
    pd.DataFrame({"id": theirs}).to_parquet(tmp_path / "b.parquet", row_group_size=1_000)
    fed = federation(tmp_path, tmp_path / "b.parquet")
    own = stream.IdFile(tmp_path / "a.csv", "id")

    def peak_mb(memory_mb: float) -> tuple[float, stream.StreamResult]:
        tracemalloc.start()
        try:
            result = stream.stream_intersect(fed, own, "b", folder=tmp_path / "a_alignments", memory_mb=memory_mb)
            return tracemalloc.get_traced_memory()[1] / 2**20, result
        finally:
            tracemalloc.stop()

    stream.stream_intersect(fed, own, "b", folder=tmp_path / "a_alignments", memory_mb=ceiling_mb)  # imports
    whole, one_bucket = peak_mb(10_000)
    streamed, buckets = peak_mb(ceiling_mb)
    assert one_bucket.record.buckets == 1 and whole > 2 * ceiling_mb  # the input does not fit under the ceiling
    assert buckets.record.buckets == 5 and streamed < ceiling_mb  # streamed, it runs under it
    assert np.array_equal(buckets.shared, np.isin(mine, theirs)) and np.array_equal(buckets.shared, one_bucket.shared)


def test_each_step_only_in_its_turn_and_bad_files_named(tmp_path: Path) -> None:
    mine, theirs = people(300)
    pd.DataFrame({"id": mine}).to_csv(tmp_path / "a.csv", index=False)
    pd.DataFrame({"id": theirs}).to_csv(tmp_path / "b.csv", index=False)
    fed = federation(tmp_path, tmp_path / "b.csv")
    points = psi.hash_ids(np.array(["someone"]), b"salt")
    none = np.zeros(0, dtype=bool)
    with pytest.raises(RemoteError, match="before this party's align.stream_split"):
        fed.exchange(stream.BUCKET_KIND, {"b": {"bucket": 0, "points": points, "matched": none}})
    with pytest.raises(RemoteError, match="without a streamed intersection"):
        fed.exchange(stream.CLOSE_KIND, {"b": {"token": "t", "matched": none}})
    fed.exchange(stream.OPEN_KIND, {"b": {"purpose": "train", "mode": "both"}})
    salt = np.zeros(32, dtype=np.uint8)
    fed.exchange(stream.SPLIT_KIND, {"b": {"salt": salt, "buckets": 2}})
    fed.exchange(stream.BUCKET_KIND, {"b": {"bucket": 0, "points": points, "matched": none}})
    with pytest.raises(RemoteError, match="asked twice"):
        fed.exchange(stream.BUCKET_KIND, {"b": {"bucket": 0, "points": points, "matched": none}})
    with pytest.raises(RemoteError, match="after 1 of 2 buckets"):
        fed.exchange(stream.CLOSE_KIND, {"b": {"token": "t", "matched": none}})
    assert not list((tmp_path / "b_alignments").glob(".stream-*"))  # a refused close still removes the buckets

    # The serving rows: this partner streams none, and says where they would come from.
    with pytest.raises(RemoteError, match=r"streams no 'serve' IDs.*serve_file"):
        fed.exchange(stream.OPEN_KIND, {"b": {"purpose": "serve", "mode": "both"}})
    # The asker's own file: a missing column, a row without an ID, a person twice.
    folder = tmp_path / "a_alignments"
    with pytest.raises(DataError, match="no ID column 'id'"):
        pd.DataFrame({"key": mine}).to_parquet(tmp_path / "c.parquet")
        stream.stream_intersect(fed, stream.IdFile(tmp_path / "c.parquet", "id"), "b", folder=folder)
    pd.DataFrame({"id": [*mine[:5], None]}).to_csv(tmp_path / "gaps.csv", index=False)
    with pytest.raises(DataError, match="1 rows without an ID"):
        stream.stream_intersect(fed, stream.IdFile(tmp_path / "gaps.csv", "id"), "b", folder=folder)
    pd.DataFrame({"id": [*mine[:50], mine[3]]}).to_csv(tmp_path / "twice.csv", index=False)
    with pytest.raises(DataError, match="repeats"):
        stream.stream_intersect(fed, stream.IdFile(tmp_path / "twice.csv", "id"), "b", folder=folder)
    with pytest.raises(ConfigError, match="at least 1 MB"):
        stream.stream_intersect(fed, stream.IdFile(tmp_path / "a.csv", "id"), "b", folder=folder, memory_mb=0.5)
    assert not [p for p in tmp_path.rglob(".stream-*")]  # nothing left behind by the failures
    assert ProtocolError  # the partner's refusals are protocol errors, carried back as RemoteError


def test_a_partner_with_fewer_people_than_buckets(tmp_path: Path) -> None:
    mine, _ = people(3_000)
    theirs = np.array([mine[10], "someone else"])  # the larger party's rows decide the buckets: 3 for 2 rows
    pd.DataFrame({"id": mine}).to_csv(tmp_path / "a.csv", index=False)
    pd.DataFrame({"id": theirs}).to_csv(tmp_path / "b.csv", index=False)
    fed = federation(tmp_path, tmp_path / "b.csv")
    result = stream.stream_intersect(fed, stream.IdFile(tmp_path / "a.csv", "id"), "b",
                                     folder=tmp_path / "a_alignments", memory_mb=1)
    assert result.record.buckets == 3 and np.flatnonzero(result.shared).tolist() == [10]
    with pytest.raises(ConfigError, match="give a larger --memory-mb"):
        stream.buckets_for(10**12, 1)
