"""What every reproduction report shares: a run's results, its provenance line, tables, writing the page."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from vflo.experiments.report import markdown_table as table

__all__ = ["load", "provenance", "table", "write_report"]


def load(runs: Path, name: str) -> pd.DataFrame | None:
    """The run's results.csv with its quick flag and protocol attached, or None where it was not run."""
    path = runs / name / "results.csv"
    if not path.is_file():
        return None
    frame = pd.read_csv(path)
    meta = json.loads((runs / name / "results.json").read_text())
    frame.attrs["quick"] = meta.get("quick", False)
    frame.attrs["protocol"] = meta.get("protocol", {})
    return frame


def provenance(frame: pd.DataFrame, name: str) -> str:
    proto = frame.attrs.get("protocol", {})
    reps = frame["repeat"].nunique()
    quick = " **(quick mode: fewer folds, repeats and epochs)**" if frame.attrs.get("quick") else ""
    return f"_Source: `runs/repro/{name}` from `configs/papers/{name}.toml`; protocol {proto.get('name')}, " \
           f"{reps} repeat(s){quick}._"


def write_report(out: Path, sections: list[str], *, preamble: Path | None = None,
                 epilogue: Path | None = None) -> int:
    """Write the page: the hand-written preamble and epilogue (where those files exist) around the sections."""
    lines: list[str] = []
    if preamble is not None and preamble.is_file():
        lines += [preamble.read_text().rstrip(), ""]
    lines += sections
    if epilogue is not None and epilogue.is_file():
        lines += [epilogue.read_text().rstrip(), ""]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {out}")
    return 0
