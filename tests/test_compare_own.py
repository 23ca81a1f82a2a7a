"""vflo compare on the parties' own files, --quick that answers, the answer a report opens with, a method whose
optional library is missing, and plots whose lines are named."""

from __future__ import annotations

import itertools
import logging
import sys
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from vflo.errors import ConfigError
from vflo.experiments.compare import (
    MIN_REPEATS,
    Cell,
    CompareSettings,
    Comparison,
    answer,
    applicable,
    load_compare,
    missing_library,
    summary,
    which_method,
)
from vflo.experiments.compare_own import compare_own, load_own
from vflo.experiments.compare_report import answer_section, render_html, render_markdown, write_comparison

REPO = Path(__file__).resolve().parents[1]
OWN = REPO / "configs/examples/own_files.toml"
# Methods that train in a blink on the example files: the tests check the comparison, not the methods.
TINY = {"rap": {"estimator": {"model": "logistic"}}}


def own_raw(**compare_table: Any) -> dict[str, Any]:
    """configs/examples/own_files.toml as vflo compare reads it, with a [compare] table."""
    raw = tomllib.loads(OWN.read_text())
    raw["compare"] = {"methods": ["local", "rap", "centralized"], "settings": TINY, **compare_table}
    return raw


def test_compare_on_own_files_answers_every_cell_quick_with_three_repeats(tmp_path: Path) -> None:
    from vflo.cli import main

    # The config as vflo run reads it, its files relative to its own folder, run from another folder.
    for name in ("hospital", "lab"):
        (tmp_path / f"{name}.csv").write_bytes((REPO / f"examples/data/{name}.csv").read_bytes())
    text = OWN.read_text().replace("../../examples/data/", "")
    text = text.replace('[quick]\n', '[quick]\n"compare.methods" = ["local", "rap"]\n'
                                     '"compare.settings" = { rap = { estimator = { model = "logistic" } } }\n'
                                     '"compare.dropped" = [0.5]\n')
    config = tmp_path / "own.toml"
    config.write_text(text)
    out = tmp_path / "out"
    assert main(["compare", str(config), "--quick", "--out", str(out), "--no-progress"]) == 0
    rows = pd.read_csv(out / "results.csv")
    assert (rows["status"] == "ok").all() and set(rows["repeat"]) == set(range(MIN_REPEATS))
    # Around the real overlap (100 shared; 30 of them and 25 of the hospital's own 50 held out to test): a
    # quarter of the 70 shared training people, all of them, and half the lab's columns.
    cells = rows.drop_duplicates(["axis", "value", "scored"])
    assert sorted(zip(cells["axis"], cells["value"].astype(str), strict=True)) == sorted(
        [("aligned", "0.25"), ("aligned", "1.0"), ("dropped", "0.5")] * 2)
    shared = rows[rows["scored"] == "aligned"].assign(v=rows["value"].astype(str)).groupby("v")["aligned"].first()
    assert shared["1.0"] == 70 and shared["0.25"] == round(0.25 * 70)
    assert dict(rows.groupby("scored")["n_test"].unique().apply(list)) == {"aligned": [30], "active_only": [25]}
    # Every cell names a best deployable method, or says why it cannot.
    report = (out / "report.md").read_text()
    table = report.split("## Which method when")[1].split("\n## ")[0]
    bests = [line.split(" | ")[4] for line in table.splitlines() if line.startswith("| share")]
    assert len(bests) == 6 and all(b in {"local", "rap"} or "too few" in b or "spread" in b for b in bests)
    # The answer for the files as they are comes first; axes that need one pooled table are left out, a line each.
    assert report.index("## The answer for your files as they are (100 people") < report.index("## Which method")
    assert report.count("Not varied: splits: re-splitting the columns") == 1
    assert "Not varied: without: a partner left out: with one partner (lab)" in report
    page = (out / "report.html").read_text()
    assert page.index("id='answer'") < page.index("<table") and page.index("id='answer'") < page.index("<svg")


def test_a_partner_left_out_and_columns_dropped(tmp_path: Path) -> None:
    lab = pd.read_csv(REPO / "examples/data/lab.csv", dtype={"pid": str})
    lab[["pid", "crp", "hba1c", "ldl"]].to_csv(tmp_path / "blood.csv", index=False)
    lab[["pid", "creatinine", "sodium", "potassium", "ferritin"]].iloc[10:].to_csv(tmp_path / "kidney.csv",
                                                                                   index=False)
    raw = tomllib.loads(OWN.read_text())
    raw["scenario"]["parties"] = [
        {**raw["scenario"]["parties"][0], "file": str(REPO / "examples/data/hospital.csv")},
        {"name": "blood", "file": "blood.csv", "id_column": "pid"},
        {"name": "kidney", "file": "kidney.csv", "id_column": "pid", "impute": "median"}]
    raw["compare"] = {"methods": ["local", "rap"], "settings": TINY, "aligned": [1.0], "dropped": [0.5],
                      "scored": ["aligned"], "repeats": 3, "rows": 120}
    result = compare_own(raw, base_dir=tmp_path)
    rows = result.rows
    assert (rows["status"] == "ok").all()
    assert set(rows[rows["axis"] == "without"]["value"]) == {"blood", "kidney"}
    assert set(rows[rows["axis"] == "without"]["passives"]) == {1}
    # The same test people in every cell of a repeat (those every party holds), whoever is left out.
    assert result.own is not None and rows["n_test"].nunique() == 1
    # A sample of 120 of the hospital's 150 patients: the partners keep theirs among them, and a share of the rest.
    assert result.own.people["hospital"] == 120 and set(rows["active_samples"]) == {120}
    assert result.own.people["blood"] < 120 and result.own.people["kidney"] < result.own.people["blood"]
    dropped = result.own.dropped[0.5]
    assert len(dropped["blood"]) == 2 and len(dropped["kidney"]) == 2
    assert set(dropped["kidney"]) < {"creatinine", "sodium", "potassium", "ferritin"}
    assert "without" not in result.left_out
    text = render_markdown(result, summary(result))
    assert f"0.5 (blood: {', '.join(dropped['blood'])}; kidney: {', '.join(dropped['kidney'])})" in text
    with pytest.raises(ConfigError, match="compare.splits does not apply to the parties' own files"):
        load_own({**raw, "compare": {"splits": ["importance"]}})


def test_quick_never_runs_fewer_than_three_repeats() -> None:
    from vflo.experiments.compare import cells

    # Whatever the axis lists, the base cell runs: the report answers it first.
    assert [c.value for c in cells(CompareSettings(aligned=(0.1, 1.0), scored=("aligned",)))
            if c.axis == "aligned"] == [0.1, 0.5, 1.0]
    assert load_own(tomllib.loads(OWN.read_text()), quick=True).repeats >= MIN_REPEATS
    for config in sorted((REPO / "configs/compare").glob("*.toml")):
        _, quick = load_compare(tomllib.loads(config.read_text()), quick=True)
        assert quick.repeats >= MIN_REPEATS, config.name
    with pytest.raises(ConfigError, match="at least 3 repeats"):
        load_compare({"dataset": {"name": "wine"}, "quick": {"repeats": 1}}, quick=True)
    with pytest.raises(ConfigError, match="at least 3 repeats"):
        load_own({**tomllib.loads(OWN.read_text()), "quick": {"compare.repeats": 2}}, quick=True)


def test_a_method_whose_library_is_missing_is_left_out_with_one_line(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(r.startswith("sf-heu") for r in extras["he"])  # what the line tells people to install
    monkeypatch.setitem(sys.modules, "heu", None)  # as in the README's plain install: no sf-heu
    line = missing_library("secureboost", {})
    assert line is not None and "pip install 'vflo[he]'" in line
    assert missing_library("secureboost", {"he": {"scheme": "plaintext"}}) is None
    assert missing_library("local", {}) is None
    run, skipped = applicable(CompareSettings(methods=("local", "secureboost")), "binary",
                              Cell("aligned", 0.5, "aligned", 1, "random"), unavailable={"secureboost"})
    assert set(run) == {"local"} and not skipped
    raw = own_raw(methods=["local", "secureboost"], aligned=[1.0], dropped=[], repeats=3,
                  settings={"secureboost": {"n_trees": 2, "max_depth": 2}})
    with caplog.at_level(logging.WARNING):
        result = compare_own(raw, base_dir=OWN.parent)
    said = [r for r in caplog.records if "secureboost" in r.getMessage()]
    assert len(said) == 1 and "pip install 'vflo[he]'" in said[0].getMessage()
    rows = result.rows
    assert set(rows["method"]) == {"local"} and (rows["status"] == "ok").all()
    write_comparison(result, tmp_path / "out")
    for name in ("report.md", "report.html"):
        assert (tmp_path / "out" / name).read_text().count("pip install &#x27;vflo[he]&#x27;" if name.endswith(
            "html") else "pip install 'vflo[he]'") == 1


def _rows(values: dict[str, list[float]], *, oracle: tuple[str, ...] = (),
          sent: dict[str, float] | None = None) -> pd.DataFrame:
    sent = sent or {}
    return pd.DataFrame([{"method": m, "repeat": r, "fold": 0, "accuracy": v, "status": "ok", "axis": "aligned",
                          "value": "0.5", "scored": "aligned", "fit_bytes": sent.get(m, 0.0), "passives": 1,
                          "fit_rounds": 10 if sent.get(m) else 0, "wall_seconds": 0.1, "split": "random",
                          "simulation_only": m in oracle, "inference": "active_only", "n_test": 60}
                         for m, vs in values.items() for r, v in enumerate(vs)])


def test_the_answer_is_computed_from_the_rows() -> None:
    from tests.conftest import make_dataset

    rows = _rows({"apc_vfl": [0.90, 0.80, 0.85, 0.88], "splitnn": [0.91, 0.75, 0.87, 0.80],
                  "local": [0.80, 0.71, 0.74, 0.79], "centralized": [0.99, 0.99, 0.99, 0.99]},
                 oracle=("centralized",), sent={"apc_vfl": 2e6, "splitnn": 5e5})
    comparison = Comparison(name="t", dataset=make_dataset(n=50), task="binary", metric="accuracy", rows=rows,
                            skipped={}, seconds=1.0, settings=CompareSettings())
    table = summary(comparison)
    found = answer(comparison, table, "aligned")
    assert found is not None and found.best == "apc_vfl" and found.runs == 4
    assert found.mean == pytest.approx(np.mean([0.90, 0.80, 0.85, 0.88]))
    assert found.fit_bytes == 2e6 and found.fit_rounds == 10
    assert found.runner_up is not None and found.runner_up.b == "splitnn" and found.ties == ("splitnn",)
    assert found.cheaper == ("splitnn", 5e5, 10) and found.oracle == ("centralized", 0.99)
    heading, lines = answer_section(comparison, table)
    assert heading.startswith("The answer for the base scenario") and len(lines) == 1
    apc = np.array([0.90, 0.80, 0.85, 0.88])
    assert found.mean == pytest.approx(apc.mean()) and found.std == pytest.approx(apc.std(ddof=1))
    assert lines[0].startswith(f"Scoring people every party holds: use apc_vfl: accuracy {found.mean:.3f} ± "
                               f"{apc.std(ddof=1):.3f} over 4 runs (60 test people each)")
    assert "2 MB in 10 round(s)" in lines[0] and "cannot be told from the runner-up, splitnn" in lines[0]
    assert "splitnn costs least: 0.5 MB" in lines[0]
    page = render_html(comparison, table)
    assert page.index("id='answer'") < page.index("<svg") < page.index("<table")
    text = render_markdown(comparison, table)
    assert text.index("## The answer") < text.index("## Which method when")
    # Other runs, another answer: local well ahead of everyone.
    rows.loc[rows["method"] == "local", "accuracy"] = [0.95, 0.97, 0.96, 0.99]
    again = answer(comparison, summary(comparison), "aligned")
    assert again is not None and again.best == "local" and again.runner_up is not None
    assert again.runner_up.verdict(True) == "ahead of" and not again.ties
    # Too few runs: no method named, and why.
    one = Comparison(name="t", dataset=make_dataset(n=50), task="binary", metric="accuracy",
                     rows=_rows({"apc_vfl": [0.9], "local": [0.8]}), skipped={}, seconds=1.0,
                     settings=CompareSettings())
    none = answer(one, summary(one), "aligned")
    assert none is not None and not none.best and "no spread to tell by" in none.why_none
    assert which_method(one, summary(one)).iloc[0]["best"] == none.why_none


def test_a_dozen_lines_are_each_named_at_their_end() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from vflo.experiments.styles import label_ends, method_style, text_colour
    from vflo.methods.registry import method_names

    names = method_names()[:12]
    fig, ax = plt.subplots(figsize=(9, 4.6))
    ends = []
    for k, name in enumerate(names):
        colour, marker = method_style(name)
        ys = [0.5, 0.9 + 0.001 * k]  # every line ends within a hair of the others
        ax.plot([1, 2], ys, marker=marker, color=colour)
        ends.append((name, 2.0, ys[-1], colour))
    label_ends(ax, ends)
    texts = {t.get_text(): t for t in ax.texts}
    assert set(texts) == set(names) and ax.get_legend() is None
    heights = sorted(t.xyann[1] for t in texts.values())
    gap = min(7 * 1.3 * fig.dpi / 72 / ax.bbox.height, 1 / len(names))
    assert all(b - a >= gap - 1e-9 for a, b in itertools.pairwise(heights))
    assert heights[0] >= 0.0 and heights[-1] <= 1.0
    assert all(texts[n].get_color() == text_colour(method_style(n)[0]) for n in names)
    assert text_colour("#aec7e8") != "#aec7e8" and text_colour("#1f77b4") == "#1f77b4"  # light shades darkened
    plt.close(fig)
