"""docs/models.md says what each party keeps for each method: checked against what every method saves."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import vflo
from tests.test_methods import data_for, quick
from vflo.comm.codec import decode
from vflo.methods.registry import get_method, method_names

DOC = Path(__file__).resolve().parents[1] / "docs" / "models.md"
DEPLOYABLE = [m for m in method_names() if not get_method(m).simulation_only]


def documented() -> dict[str, tuple[set[str], set[str], set[str]]]:
    """Per method: the groups the page lists for the active party, the passive parties, server and dealer."""
    text = DOC.read_text()
    table = text[text.index("## Per method"):text.index("## Checkpoints")]
    rows: dict[str, list[str]] = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = cells[2:]
    out = {}
    for method, cells in rows.items():
        groups = []
        for cell in cells:
            same = re.fullmatch(r"as `(\w+)`", cell)
            groups.append(same.group(1) if same else cell)
        out[method] = tuple(groups)  # type: ignore[assignment]
    resolved = {}
    for method, cells in out.items():
        resolved[method] = tuple(set(re.findall(r"`(\w+)`", out[c][i] if c in out else c))  # type: ignore[index]
                                 for i, c in enumerate(cells))
    return resolved  # type: ignore[return-value]


def test_the_page_lists_every_deployable_method() -> None:
    assert sorted(documented()) == sorted(DEPLOYABLE)


@pytest.mark.parametrize("name", DEPLOYABLE)
def test_what_the_page_says_each_party_keeps(name: str, tmp_path: Path) -> None:
    assert "also holds `node`" in DOC.read_text()
    data = data_for(name)
    folder = vflo.fit(quick(name), data, seed=0).save(tmp_path)
    kept: dict[str, set[str]] = {"active": set(), "passive": set(), "helper": set()}
    for party in (p for p in folder.iterdir() if p.is_dir()):
        role = json.loads((party / "manifest.json").read_text())["role"]
        state = decode((party / "state.vflo").read_bytes()).payload
        groups = {k.split(".")[0] for k in state}
        assert "node" in groups, f"{party.name}'s part lacks its release key"  # every part: see the page's note
        kept[role if role in ("active", "passive") else "helper"] |= groups - {"node"}
    active, passive, helper = documented()[name]
    assert kept["active"] == active, "active party"
    assert kept["passive"] == passive, "passive parties"
    assert kept["helper"] == helper, "server and dealer"
