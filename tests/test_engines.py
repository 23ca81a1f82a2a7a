"""The same checks over every registered alignment engine (:data:`vflo.align.engines.ENGINES`), as
tests/test_every_method.py runs over every method: a new engine is its module and one line in the registry, and
these tell whether it fits."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import make_dataset
from vflo.align import engines
from vflo.align.engine import Engine
from vflo.align.engines import ENGINES, AlignmentConfig, check_policy
from vflo.align.kept import AlignmentStore
from vflo.align.protocol import ALIGNMENT
from vflo.audit import handler_infos
from vflo.data.layout import FederatedData
from vflo.data.scenario import PartySpec, SamplesSpec, ScenarioSpec
from vflo.errors import ConfigError
from vflo.federation.session import Session
from vflo.federation.simulation import build_federation
from vflo.methods.registry import get_method
from vflo.party.handlers import HandlerSet
from vflo.party.policy import Policy

DOCS = Path(__file__).resolve().parents[1] / "docs"
NAMES = sorted(ENGINES)


def _split() -> FederatedData:
    ds = make_dataset(n=300, n_features=4)
    ds = replace(ds, ids=np.asarray([f"p{v:04d}" for v in ds.ids]))
    spec = ScenarioSpec(parties=(PartySpec(name="a", role="active", n_columns=2), PartySpec(name="b", n_columns=2)),
                        samples=SamplesSpec(active=120, aligned=70, passive_only=100), unused_columns="drop")
    return spec.build(ds, seed=5).materialize()


def test_the_registry_is_the_one_list() -> None:
    assert engines.AUTO_FALLBACK in ENGINES and engines.AUTO_LIBRARY in ENGINES
    assert "auto" not in ENGINES  # a choice among engines, not one
    assert set(engines.library_engines()) == {n for n, e in ENGINES.items() if e.library}


@pytest.mark.parametrize("name", NAMES)
def test_each_engine_declares_itself(name: str) -> None:
    engine = ENGINES[name]
    assert isinstance(engine, Engine) and engine.name == name and engine.about
    assert callable(engine.intersect) and callable(engine.unavailable)
    # Its party side is served by every node, and declared as every handled kind is (who may send it, what it
    # carries): so vflo methods --messages and the security page list it.
    assert isinstance(engine.handlers, HandlerSet) and any(engine.handlers is h for h in ALIGNMENT)
    kinds = engine.handlers.handler_table()
    assert kinds and all(kind.startswith("align.") for kind in kinds)
    assert set(kinds) <= set(handler_infos())
    # The configuration takes its name; a party's policy consents to a library engine by default and names it
    # explicitly without complaint.
    assert AlignmentConfig(method="psi", engine=name).engine == name
    assert Policy().runs_psi(name) or not engine.library
    if engine.library:
        check_policy(Policy(psi_protocols=(name,)))
        assert not Policy(psi_protocols=()).runs_psi(name)
    # The deployment guide names it.
    assert f"`{name}`" in (DOCS / "deploy.md").read_text(encoding="utf-8") or f'"{name}"' in (
        DOCS / "deploy.md").read_text(encoding="utf-8")


def test_unknown_names_are_refused_with_the_registered_ones() -> None:
    with pytest.raises(ConfigError, match="choose 'vflo', 'auto'"):
        AlignmentConfig(method="psi", engine="rr23")
    with pytest.raises(ConfigError, match=r"psi_protocols names \['rr23'\]"):
        check_policy(Policy(psi_protocols=("rr23",)))


@pytest.mark.parametrize("name", NAMES)
def test_each_engine_finds_what_numpy_finds(name: str, tmp_path: Path) -> None:
    """Every engine that can run here intersects as the reference does; one that cannot says why, and a run
    naming it is refused with that reason rather than falling back."""
    data = _split()
    method = get_method("local")()
    stores = {p: AlignmentStore(tmp_path / p, p) for p in ("a", "b")}
    config = AlignmentConfig(method="psi", engine=name, reuse=False)
    fed, _ = build_federation(data, method, seed=0, alignments=stores, alignment=config)
    Session(fed).start(method)
    ids = data.train["a"].ids
    why = ENGINES[name].unavailable(fed)
    if why:
        with pytest.raises(ConfigError, match="."):
            fed.align(ids, ["b"])
        pytest.skip(f"{name} cannot run here: {why}")
    found = fed.align(ids, ["b"])
    assert np.array_equal(found.ids, np.intersect1d(ids, data.train["b"].ids)) and len(found.ids) == 70
    assert fed.alignment_engine == name
