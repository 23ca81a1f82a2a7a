"""Private set intersection: the same intersection as the ground truth, and what each side learns."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

from tests.conftest import make_dataset, vertical_split
from vflo.align import psi
from vflo.align.engines import AlignmentConfig
from vflo.align.plain import Aligned
from vflo.align.psi import blind, hash_ids, new_key
from vflo.comm.message import Message
from vflo.data.scenario import PartySpec, SamplesSpec, ScenarioSpec
from vflo.errors import DataError, RemoteError
from vflo.federation.session import Session
from vflo.federation.simulation import build_federation, run_method
from vflo.methods.registry import get_method

PSI = AlignmentConfig(method="psi")


def test_blinding_commutes_and_hides_the_ids() -> None:
    ids = np.arange(50)
    points = hash_ids(ids, b"s" * 32)
    a, b = new_key(), new_key()
    ab, ba = blind(blind(points, a), b), blind(blind(points, b), a)
    assert np.array_equal(ab, ba)
    assert not np.array_equal(blind(points, a), blind(points, b))
    other_salt = hash_ids(ids, b"t" * 32)
    assert not np.array_equal(points, other_salt)
    assert not np.array_equal(hash_ids(np.array(["7"]), b"s" * 32), hash_ids(np.array([7]), b"s" * 32))


def test_blinding_in_worker_processes_gives_the_same_points() -> None:
    points = hash_ids(np.arange(300), b"x" * 32)
    key = new_key()

    old = psi.PARALLEL_FROM
    psi.PARALLEL_FROM = 100
    try:
        assert np.array_equal(blind(points, key, workers=2), blind(points, key, workers=1))
    finally:
        psi.PARALLEL_FROM = old


def test_duplicate_ids_are_refused() -> None:
    with pytest.raises(DataError, match="unique IDs"):
        hash_ids(np.array([1, 2, 2]), b"s" * 32)


@pytest.mark.parametrize("n_passive", [1, 2])
def test_psi_finds_the_scenarios_ground_truth(n_passive: int) -> None:
    ds = make_dataset(n=400, n_features=6)
    parties = (PartySpec(name="a", role="active", n_columns=2),
               *(PartySpec(name=f"p{i}", n_columns=4 // n_passive) for i in range(n_passive)))
    layout = ScenarioSpec(parties=parties, samples=SamplesSpec(active=300, aligned=120, passive_only=30),
                          unused_columns="drop").build(ds, seed=4)
    data = layout.materialize()
    method = get_method("local")()
    seen: list[Message] = []
    fed, nodes = build_federation(data, method, seed=0, alignment=PSI, observers=(seen.append,))
    Session(fed).start(method)
    alignment = fed.align(data.train["a"].ids, [f"p{i}" for i in range(n_passive)])
    assert np.array_equal(alignment.ids, np.sort(layout.aligned_ids()))
    # with mode 'both' each passive party now knows the shared IDs, in the same (sorted) order
    for i in range(n_passive):
        assert np.array_equal(nodes[f"p{i}"].context.part(Aligned).held, alignment.ids)
    # no raw ID crosses: only 32-byte points, a salt and a mask
    for msg in seen:
        if msg.kind.startswith("align."):
            assert "ids" not in msg.payload
    summary = fed.transport.ledger.summary()
    assert summary.align_rounds == 2 and summary.bytes == 0


def test_methods_run_on_psi_alignment() -> None:
    data = vertical_split(30)
    for name, kwargs in [("apc_vfl", {"train": {"max_epochs": 2}}), ("splitnn", {"train": {"max_epochs": 2}})]:
        seen: dict[str, list[Message]] = {"plain": [], "psi": []}
        plain = run_method(get_method(name)(**kwargs), data, seed=0, observers=(seen["plain"].append,))
        private = run_method(get_method(name)(**kwargs), data, seed=0, alignment=PSI, observers=(seen["psi"].append,))
        assert np.allclose(plain.scores, private.scores)
        # The method's messages carry the same payloads either way. (Their frames may differ by a few bytes: the
        # header names each message's round in text, and aligning by PSI takes one more round than in the clear.)
        method = {k: sorted((m.kind, m.sender, _digest(m.payload)) for m in v
                            if not m.kind.startswith(("align.", "control."))) for k, v in seen.items()}
        assert method["plain"] == method["psi"] and method["plain"]
        assert plain.ledger.summary().messages == private.ledger.summary().messages


def _digest(payload: Mapping[str, Any]) -> str:
    """A payload's fields and values, as one comparable string."""
    return repr(sorted((k, v.tobytes().hex() if isinstance(v, np.ndarray) else repr(v)) for k, v in payload.items()))


def test_active_only_mode_keeps_the_intersection_from_the_passive_party() -> None:
    data = vertical_split(30)
    active_only = AlignmentConfig(method="psi", mode="active")
    with pytest.raises(RemoteError, match="does not know which rows are aligned.*mode = 'both'"):
        run_method(get_method("apc_vfl")(train={"max_epochs": 2}), data, seed=0, alignment=active_only)
    out = run_method(get_method("splitnn")(train={"max_epochs": 2}), data, seed=0, alignment=active_only)
    assert out.ledger.summary().align_rounds == 1


def test_hashing_and_blinding_in_workers_equals_the_serial_path() -> None:
    ids = np.array([f"p{i}" for i in range(500)])
    key, salt = psi.new_key(), b"q" * 32
    serial = blind(hash_ids(ids, salt), key, workers=1)
    with psi.Blinder(key, size=psi.PARALLEL_FROM, workers=2) as blinder:
        assert blinder.workers == 2
        parallel = blinder.ids(ids, salt)()
    assert np.array_equal(parallel, serial)
    # matching compares whole 32-byte points
    assert psi.matches(serial[[3, 7]], serial).all() and not psi.matches(serial[:1], serial[1:]).any()


def test_two_jobs_of_one_step_share_the_helpers_whichever_is_collected_first() -> None:
    ids = np.array([f"p{i}" for i in range(400)])
    key, salt = psi.new_key(), b"r" * 32
    points = hash_ids(np.arange(300), b"x" * 32)
    with psi.Blinder(key, size=psi.PARALLEL_FROM, workers=2) as blinder:
        own, double = blinder.ids(ids, salt), blinder.points(points)
        second, first = double(), own()  # the later job collected first, as psi.handle does
    assert np.array_equal(first, blind(hash_ids(ids, salt), key, workers=1))
    assert np.array_equal(second, blind(points, key, workers=1))


def test_matching_points_by_their_first_bytes_equals_comparing_whole_rows() -> None:
    rng = np.random.default_rng(3)
    pool = rng.integers(0, 256, (5000, 32), dtype=np.uint8)
    queries = np.concatenate([pool[rng.choice(5000, 1500, replace=False)], rng.integers(0, 256, (2000, 32), np.uint8)])
    near = pool[:50].copy()
    near[:, 31] ^= 1  # the same first 8 bytes, another point
    queries = np.concatenate([queries, near])[rng.permutation(len(queries) + 50)]
    rows = np.dtype((np.void, 32))
    whole = np.isin(queries.view(rows).ravel(), pool.view(rows).ravel())
    assert np.array_equal(psi.matches(queries, pool), whole) and whole.sum() == 1500
    repeated = pool.copy()
    repeated[1, :8] = repeated[0, :8]  # two keys alike: the rows themselves are compared
    assert np.array_equal(psi.matches(queries, repeated), np.isin(queries.view(rows).ravel(),
                                                                   repeated.view(rows).ravel()))
    assert psi.matches(queries[:0], pool).shape == (0,) and not psi.matches(queries, pool[:0]).any()

