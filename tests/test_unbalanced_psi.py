"""Unbalanced PSI by the library's ECDH-OPRF: the intersection vflo's own ECDH finds, the large side's evaluated
set prepared once and kept at the active party, prepared again when the partner's people change, and refused
where a party's policy or folders do not allow it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import make_dataset
from vflo.align import spu
from vflo.align.engines import AlignmentConfig
from vflo.align.kept import AlignmentStore
from vflo.align.plain import Aligned
from vflo.comm.message import Message
from vflo.data.layout import FederatedData
from vflo.data.scenario import PartySpec, SamplesSpec, ScenarioSpec
from vflo.errors import ConfigError, RemoteError
from vflo.federation.coordinator import Coordinator
from vflo.federation.session import Session
from vflo.federation.simulation import build_federation
from vflo.methods.registry import get_method
from vflo.party.node import Node
from vflo.party.policy import Policy

pytestmark = pytest.mark.skipif(bool(spu.missing()), reason=spu.missing() or "installed")


def unbalanced_split() -> FederatedData:
    # A small active party (80 people) against a larger partner (600), 50 of them shared; text IDs.
    ds = make_dataset(n=630, n_features=4)
    ds = replace(ds, ids=np.asarray([f"person-{v:04d}" for v in ds.ids]))
    spec = ScenarioSpec(parties=(PartySpec(name="a", role="active", n_columns=2), PartySpec(name="big", n_columns=2)),
                        samples=SamplesSpec(active=80, aligned=50, passive_only=550), unused_columns="drop")
    return spec.build(ds, seed=3).materialize()


def federation(data: FederatedData, root: Path | None, *, mode: str = "both", engine: str = "unbalanced",
               reuse: bool = False, seen: list[Message] | None = None) -> tuple[Coordinator, dict[str, Node]]:
    method = get_method("local")()
    stores = None if root is None else {p: AlignmentStore(root / p, p) for p in ("a", "big")}
    fed, nodes = build_federation(data, method, seed=0, observers=() if seen is None else (seen.append,),
                                  alignments=stores,
                                  alignment=AlignmentConfig(method="psi", mode=mode, engine=engine,  # type: ignore[arg-type]
                                                            reuse=reuse))
    Session(fed).start(method)
    return fed, nodes


def asked(seen: list[Message]) -> list[str]:
    return [m.kind for m in seen if m.kind.startswith("align.") and m.sender == "a"]


@pytest.mark.parametrize("mode", ["both", "active"])
def test_prepared_once_then_each_intersection_is_online_only(tmp_path: Path, mode: str) -> None:
    data = unbalanced_split()
    ids = data.train["a"].ids
    truth = np.intersect1d(ids, data.train["big"].ids)
    seen: list[Message] = []
    fed, nodes = federation(data, tmp_path, mode=mode, seen=seen)
    first = fed.align(ids, ["big"])
    assert np.array_equal(first.ids, truth) and len(truth) == 50 and fed.alignment_engine == "unbalanced"
    assert asked(seen) == ["align.ub_prepare", "align.engine_result", "align.ub_open", "align.engine_result"]
    partner = nodes["big"].context.part(Aligned).held
    assert np.array_equal(partner, truth) if mode == "both" else partner is None
    # The library's link bytes are in the ledger, each stage apart.
    kinds = {e.kind for e in fed.transport.ledger.entries}
    assert {"align.engine.unbalanced.offline", "align.engine.unbalanced.online"} <= kinds

    # A later run over the same folders: online only, the same people.
    seen.clear()
    fed, nodes = federation(data, tmp_path, mode=mode, seen=seen)
    again = fed.align(ids[::2], ["big"])
    assert asked(seen) == ["align.ub_open", "align.engine_result"]
    assert np.array_equal(again.ids, np.intersect1d(ids[::2], data.train["big"].ids))
    # Each party keeps its own preparation: the partner its key and its IDs, the active party what it was sent.
    assert len(list((tmp_path / "big" / "unbalanced").glob("a.train.*/prep.json"))) == 1
    assert len(list((tmp_path / "a" / "unbalanced").glob("big.train.*/prep.json"))) == 1
    assert not list((tmp_path / "a" / "unbalanced").glob(".work-*"))


def test_a_partner_whose_people_changed_prepares_again(tmp_path: Path) -> None:
    data = unbalanced_split()
    ids = data.train["a"].ids
    federation(data, tmp_path)[0].align(ids, ["big"])
    big = data.train["big"]
    changed = replace(data, train={**data.train, "big": big.subset(np.setdiff1d(big.ids, ids)[1:].tolist()
                                                                   + np.intersect1d(big.ids, ids).tolist())})
    seen: list[Message] = []
    fed, _ = federation(changed, tmp_path, seen=seen)
    found = fed.align(ids, ["big"])
    assert asked(seen) == ["align.ub_open", "align.ub_prepare", "align.engine_result", "align.ub_open",
                           "align.engine_result"]
    assert np.array_equal(found.ids, np.intersect1d(ids, changed.train["big"].ids))


def test_the_same_intersection_as_vflos_own_psi_and_kept_alignments_on_top(tmp_path: Path) -> None:
    data = unbalanced_split()
    ids = data.train["a"].ids
    own = federation(data, None, engine="vflo")[0].align(ids, ["big"])
    seen: list[Message] = []
    fed, _ = federation(data, tmp_path, reuse=True, seen=seen)
    ub = fed.align(ids, ["big"])
    assert np.array_equal(ub.ids, own.ids) and np.array_equal(ub.held["big"], own.held["big"])
    assert asked(seen)[-1] == "align.keep"


def test_refused_without_a_folder_or_the_partners_consent(tmp_path: Path) -> None:
    data = unbalanced_split()
    ids = data.train["a"].ids
    with pytest.raises(ConfigError, match="alignments folder"):
        federation(data, None)[0].align(ids, ["big"])
    fed, nodes = federation(data, tmp_path)
    nodes["big"].policy = Policy(psi_protocols=("rr22",))
    nodes["big"].context.policy = nodes["big"].policy  # type: ignore[union-attr]
    with pytest.raises(RemoteError, match="runs PSI by \\['rr22'\\] only"):
        fed.align(ids, ["big"])
