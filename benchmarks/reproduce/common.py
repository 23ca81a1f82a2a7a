"""What every reproduction report shares: a run's results, its provenance line, tables, writing the page."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from vflo.experiments.report import markdown_table as table

__all__ = ["fill", "load", "paired", "provenance", "table", "write_page", "write_report"]

_FIELD = re.compile(r"\{\{([\w.]+)\|([^}]+)\}\}")


def load(runs: Path, name: str) -> pd.DataFrame | None:
    """The run's results.csv with its quick flag and protocol attached, or None where it was not run."""
    path = runs / name / "results.csv"
    if not path.is_file():
        return None
    frame = pd.read_csv(path)
    meta = json.loads((runs / name / "results.json").read_text())
    frame.attrs["quick"] = meta.get("quick", False)
    frame.attrs["protocol"] = meta.get("protocol", {})
    ran = runs / f"{name}.commit"  # written beside the run by benchmarks/reproduce/queue.sh
    frame.attrs["commit"] = ran.read_text().strip() if ran.is_file() else None
    return frame


def paired(cell: pd.DataFrame, a: str, b: str, metric: str) -> tuple[float, float, str, str] | None:
    """Methods ``a`` and ``b`` in ``cell`` (results rows) by ``metric``, run by run (the same repeats): their
    means, the test ("paired t-test over n runs, p = ..."), and the verdict ("ahead of", "behind", "not clearly
    different from"); None with fewer than two common runs. The same test as ``vflo compare``."""
    import numpy as np

    from vflo.experiments.compare import ALPHA, paired_p

    runs = {m: cell[cell["method"] == m].set_index("repeat")[metric] for m in (a, b)}
    common = sorted(set(runs[a].index) & set(runs[b].index))
    if len(common) < 2:
        return None
    x, y = runs[a].loc[common].to_numpy(float), runs[b].loc[common].to_numpy(float)
    pv = paired_p(x, y)
    if np.isnan(pv) or pv >= ALPHA:
        verdict = "not clearly different from"
    else:
        verdict = "ahead of" if x.mean() > y.mean() else "behind"
    test = "no spread to test by" if np.isnan(pv) else f"paired t-test over {len(common)} runs, p = {pv:.3g}"
    return float(x.mean()), float(y.mean()), test, verdict


def provenance(frame: pd.DataFrame, name: str) -> str:
    proto = frame.attrs.get("protocol", {})
    reps = frame["repeat"].nunique()
    quick = " **(quick mode: fewer folds, repeats and epochs)**" if frame.attrs.get("quick") else ""
    ran = frame.attrs.get("commit")
    code = f", the code of commit {ran}" if ran else ", the commit of the code not recorded (run before it was)"
    return f"_Source: `runs/repro/{name}` from `configs/papers/{name}.toml`{code}; protocol {proto.get('name')}, " \
           f"{reps} repeat(s){quick}._"


def _lookup(values: Mapping[str, Any], path: str) -> Any:
    """``a.b.c`` in nested mappings; a key may itself contain dots (``pseudo_0.25``): the longest match wins."""
    node: Any = values
    parts = path.split(".")
    while parts:
        for k in range(len(parts), 0, -1):
            key = ".".join(parts[:k])
            if isinstance(node, Mapping) and key in node:
                node, parts = node[key], parts[k:]
                break
        else:
            raise KeyError(path)
    return node


def fill(text: str, values: Mapping[str, Any]) -> str:
    """Replace each ``{{path|format}}`` with the measured value at ``path`` (format ``pct``: a share in %).

    A figure that was not measured reads "**not measured**" with its path, so a page never shows a number
    no script produced."""

    def one(match: re.Match[str]) -> str:
        path, fmt = match.group(1), match.group(2)
        try:
            value = _lookup(values, path)
        except KeyError:
            return f"**not measured ({path})**"
        if fmt == "pct":
            return f"{100 * float(value):.1f}%"
        return format(float(value), fmt)

    return _FIELD.sub(one, text)


def write_report(out: Path, sections: list[str], *, preamble: Path | None = None,
                 epilogue: Path | None = None, values: Mapping[str, Any] | None = None) -> int:
    """Write the page: the hand-written preamble and epilogue (where those files exist) around the sections;
    ``{{path|format}}`` fields in them are filled from ``values`` (figures read from runs and benchmarks)."""
    lines: list[str] = []
    if preamble is not None and preamble.is_file():
        lines += [fill(preamble.read_text().rstrip(), values or {}), ""]
    lines += sections
    if epilogue is not None and epilogue.is_file():
        lines += [fill(epilogue.read_text().rstrip(), values or {}), ""]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {out}")
    return 0


def write_page(out: Path, parts: list[tuple[list[str], list[str]]]) -> int:
    """Write a reproduction page from its sections, each with its claim lines: the sections in order, then every
    claim under "What the runs say"; the preamble beside ``out`` (``NAME.preamble.md``) first."""
    sections = [line for lines, _ in parts for line in lines]
    claims = [claim for _, found in parts for claim in found]
    if claims:
        sections += ["## What the runs say", "", *(f"- {c}" for c in claims), ""]
    return write_report(out, sections, preamble=out.with_suffix(".preamble.md"))
