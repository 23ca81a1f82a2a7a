"""docs/models.md says what each party keeps for each method: the table is each method's ``saves``, and every
method, saved, keeps exactly what its declaration lists."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import vflo
from tests.test_methods import data_for, quick
from vflo.audit import models_markdown
from vflo.comm.codec import decode
from vflo.errors import MethodError
from vflo.methods import saved
from vflo.methods.pca import PCAPart
from vflo.methods.registry import get_method, method_names
from vflo.party.node import NodeContext
from vflo.roles import PartyInfo

DOC = Path(__file__).resolve().parents[1] / "docs" / "models.md"
DEPLOYABLE = [m for m in method_names() if not get_method(m).simulation_only]


def test_the_page_is_the_declarations() -> None:
    assert models_markdown() in DOC.read_text(), \
        "regenerate the table: python -c 'from vflo.audit import models_markdown; print(models_markdown())'"
    for name in DEPLOYABLE:
        assert f"| `{name}` |" in models_markdown()


def _declared(name: str, role: str) -> tuple[set[str], set[str]]:
    """The groups ``role`` keeps for method ``name``: all of them, and those it must keep."""
    cls = get_method(name)
    declared = cls.saves.model + cls.saves.of("active") if role == "active" else \
        tuple(s for r in ((role,) if role == "passive" else ("server", "dealer")) for s in cls.saves.of(r))
    return {s.name for s in declared}, {s.name for s in declared if not s.optional}


@pytest.mark.parametrize("name", DEPLOYABLE)
def test_each_party_keeps_what_its_method_declares(name: str, tmp_path: Path) -> None:
    assert "also holds `node`" in DOC.read_text()
    folder = vflo.fit(quick(name), data_for(name), seed=0).save(tmp_path)
    kept: dict[str, set[str]] = {"active": set(), "passive": set(), "helper": set()}
    for party in (p for p in folder.iterdir() if p.is_dir()):
        role = json.loads((party / "manifest.json").read_text())["role"]
        state = decode((party / "state.vflo").read_bytes()).payload
        groups = {k.split(".")[0] for k in state}
        assert "node" in groups, f"{party.name}'s part lacks its release key"  # every part: see the page's note
        kept[role if role in ("active", "passive") else "helper"] |= groups - {"node"}
    for role, groups in kept.items():
        allowed, needed = _declared(name, role)
        assert needed <= groups <= allowed, role


def test_the_codec_refuses_what_another_method_or_version_saved() -> None:
    declared = (saved.Saved("rank", saved.INTEGER), saved.Saved("passives", saved.PARTY_NAMES),
                saved.Saved("mask", saved.ARRAY, optional=True))

    class Target:
        rank_: int
        passives_: list[str]
        mask_: np.ndarray | None

    source = Target()
    source.rank_, source.passives_, source.mask_ = 3, ["p", "q"], None
    state = saved.encode(declared, lambda _: source, model=True)
    assert set(state) == {"rank", "passives"}  # an optional value that is None is not saved
    restored = Target()
    saved.decode(declared, state, lambda _: restored, method=None, where=None, model=True)
    assert (restored.rank_, restored.passives_, restored.mask_) == (3, ["p", "q"], None)
    with pytest.raises(MethodError, match="lacks 'rank'"):
        saved.decode(declared, {"passives": state["passives"]}, lambda _: restored, method=None, where=None,
                     model=True)
    with pytest.raises(MethodError, match="saved 'rank'.*whole number is str"):
        saved.decode(declared, {**state, "rank": "3"}, lambda _: restored, method=None, where=None, model=True)
    with pytest.raises(MethodError, match="saved 'passives'.*not a string array"):
        saved.decode(declared, {**state, "passives": '["p", "q"]'}, lambda _: restored, method=None, where=None,
                     model=True)
    assert saved.unclaimed(declared, {**state, "V": np.zeros(2)}) == ["V"]
    with pytest.raises(MethodError, match="declared twice"):
        saved.Saves(model=(saved.Saved("a", saved.INTEGER), saved.Saved("a", saved.NUMBER)))


def test_a_part_of_another_method_is_refused_on_loading() -> None:
    """A party's saved part holding groups its method does not keep (another method's) is refused by name; its
    own part restores into its typed state."""
    ctx = NodeContext(info=PartyInfo("p", "passive"), data=None, serving=None, parties=(), seed=0, transport=None)
    method = get_method("pca")()
    with pytest.raises(MethodError, match="pca does not keep"):
        method.load_party_state(ctx, {"V": np.zeros((3, 2))})
    method.load_party_state(ctx, {"mean": np.zeros(3), "components": np.ones((3, 2))})
    assert np.array_equal(ctx.part(PCAPart).components, np.ones((3, 2)))
    assert set(method.party_state(ctx)) == {"mean", "components"}
