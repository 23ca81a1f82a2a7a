"""The comparison's report: report.md, and report.html, one self-contained file (tables and inline SVG plots,
no script, no network), beside results.csv / results.json."""

from __future__ import annotations

import html
import io
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from vflo.experiments.compare import (
    ALPHA,
    MIN_REPEATS,
    MIN_TEST_ROWS,
    Answer,
    CompareSettings,
    Comparison,
    answer,
    paired,
    summary,
    which_method,
)
from vflo.experiments.compare_privacy import privacy_cells, privacy_figure, privacy_sentences, privacy_table
from vflo.experiments.output import atomic_dir
from vflo.experiments.report import markdown_table
from vflo.experiments.styles import jitter, label_ends, method_style
from vflo.methods.base import Claim

AXIS_TEXT = {"aligned": "share of the active party's people the others also hold",
             "passives": "number of passive parties", "split": "how the columns are split",
             "second_hop": "people a second-hop party shares with the first hop, as a share of the active party's",
             "p_miss": "probability that a partner lacks a training person",
             "absent": "share of the partners a test person lacks",
             "without": "a partner left out",
             "dropped": "share of each partner's columns it leaves out",
             "epsilon": "ε per person at each passive party, end to end (δ 1e-5): its side calibrated to it",
             "epsilon_hop": "ε per person at each passive party, end to end, with a second-hop party (at the base "
                            "second-hop share)"}
PRIVACY_HEADING = "Which method at each privacy level"
#: How to read the privacy section, in one line.
PRIVACY_READING = (
    "Each passive party protects what it sends at ε per person, end to end (δ 1e-5; its network trained by DP-SGD "
    "and every release noised, calibrated at its setup), and the label holder randomises its labels at the same ε "
    "where a method sends what they shape. A receiver knowing a share of a sender's rows decodes the messages it got "
    "(feature R² on the other rows, beside the same decoder reading its own features); a passive party infers labels "
    "from the gradients it got (AUC, 0.5 is chance) and by model completion (beside the same head on its own "
    "features). An attack leaks when it beats the attacker's own data by the margin of [attacks].")
#: The aligned axis on the parties' own files: what is kept of the real overlap.
OWN_ALIGNED = "share of the real overlap's training people kept shared"
SCORED_TEXT = {"aligned": "people every party holds", "active_only": "people only the active party holds",
               "missing": "people some partners lack"}


def axis_text(comparison: Comparison, axis: str) -> str:
    return OWN_ALIGNED if axis == "aligned" and comparison.own is not None else AXIS_TEXT.get(axis, axis)


def _name(method: str, oracle: bool) -> str:
    return f"{method} (oracle)" if oracle else method


def _svg(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buffer = io.StringIO()
    fig.savefig(buffer, format="svg")
    plt.close(fig)
    text = buffer.getvalue()
    return text[text.index("<svg"):]  # drop the XML prologue: the SVG sits inside the HTML page


def plots(comparison: Comparison, table: pd.DataFrame) -> dict[str, str]:
    """SVG plots of the aligned-share axis: metric (both scorings), training MB and rounds (log, labelled)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    metric = comparison.metric
    title = comparison.dataset.label + (" — STAND-IN DATA (generated)" if comparison.dataset.standin else "")
    out = {}
    missing = _missing_plot(comparison, table, title)
    if missing:
        out["metric_missing"] = missing
    cells = privacy_cells(comparison)
    for layout, scored in sorted({(c.layout, c.scored) for c in cells}):
        fig = privacy_figure(comparison, cells, scored, title, layout)
        if fig is not None:
            out[f"privacy_{scored}" + ("" if layout == "star" else f"_{layout}")] = _svg(fig)
    data = table[table["axis"] == "aligned"].copy()
    if data.empty:
        return out
    data["x"] = data["value"].astype(float) * 100
    for scored in data["scored"].unique():
        # A cell scored on a handful of rows is noise (its ± 1 std can span the whole scale); the "which method
        # when" table names no method there, and the plot leaves it out by the same rule.
        cells = data[data["scored"] == scored]
        part = cells[cells["test_rows"] >= MIN_TEST_ROWS]
        if part.empty:
            continue
        fig, ax = plt.subplots(figsize=(9, 4.6))
        # Methods at the same share are nudged apart (log axis: a factor), so no marker hides another.
        ends = _errorbars(ax, part, metric, lambda x, factor: x * factor)
        ax.set_xscale("log")
        # Ticks at the shares the comparison ran (1%, 5%, ...), not at powers of ten the range may not reach.
        ax.set_xticks(sorted(part["x"].unique()))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}%"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(_aligned_label(comparison))
        ax.set_ylabel(metric)
        who = SCORED_TEXT.get(str(scored), str(scored))
        dropped = sorted(set(cells["x"]) - set(part["x"]))
        note = (f"\nleft out: {', '.join(f'{v:g}%' for v in dropped)} shared (fewer than {MIN_TEST_ROWS} test rows)"
                if dropped else "")
        ax.set_title(f"{title}\n{metric} scoring {who}; error bars ± 1 std over the repeats{note}", fontsize=9)
        ax.grid(alpha=0.3, which="both")
        label_ends(ax, ends)
        fig.tight_layout()
        out[f"metric_{scored}"] = _svg(fig)
    part = data[data["scored"] == data["scored"].iloc[0]]
    for column, label in (("fit_bytes", "training traffic, MB (measured)"), ("fit_rounds", "training rounds")):
        fig, ax = plt.subplots(figsize=(9, 4.6))
        silent = []
        names = list(dict.fromkeys(part["method"].astype(str)))
        ends = []
        for method, sub in part.groupby("method", sort=False):
            if (sub[column] <= 0).all():
                silent.append(str(method))
                continue
            sub = sub.sort_values("x")
            values = sub[column] / 1e6 if column == "fit_bytes" else sub[column]
            colour, marker = method_style(str(method))
            xs = sub["x"] * jitter(str(method), names)
            ax.plot(xs, values, marker=marker, color=colour, label=str(method))
            ends.append((str(method), float(xs.iloc[-1]), float(values.iloc[-1]), colour))
        ax.set_xscale("log")
        ax.set_yscale("log")
        # Ticks at the shares the comparison ran (1%, 5%, ...), not at powers of ten the range may not reach.
        ax.set_xticks(sorted(part["x"].unique()))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}%"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.yaxis.set_major_locator(LogLocator(base=10))
        unit = " MB" if column == "fit_bytes" else ""
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _, unit=unit: f"{v:g}{unit}"))
        ax.set_xlabel(_aligned_label(comparison))
        ax.set_ylabel(label + " (log scale)")
        ax.set_title(title + (f"\nno training messages: {', '.join(silent)}" if silent else ""), fontsize=9)
        ax.grid(alpha=0.3, which="both")
        label_ends(ax, ends)
        fig.tight_layout()
        out[column] = _svg(fig)
    return out


def _aligned_label(comparison: Comparison) -> str:
    if comparison.own is not None:
        own = comparison.own
        return (f"shared training people kept, % of the real overlap's {own.shared - own.tests['aligned']} "
                "(log scale)")
    return "people of the active party the others also hold (log scale)"


def claims(comparison: Comparison) -> list[str]:
    """The comparison's sentences about the seed papers' claims, each computed from the runs by the same paired
    test as the "which method when" table; a claim whose cells did not run is left out."""
    from vflo.metrics import higher_is_better

    rows, metric = comparison.rows, comparison.metric
    # The papers' claims are about their layouts of one dataset; on the parties' own files the shares mean
    # something else (shares of the real overlap).
    if rows.empty or "status" not in rows or comparison.own is not None:
        return []
    better = higher_is_better(metric)
    ok = rows[rows["status"] == "ok"]
    out = []
    by_rounds = ok[(ok["axis"] == "aligned") & (ok["scored"] == "aligned")].groupby("method")["fit_rounds"]
    if len(by_rounds):
        low, high = by_rounds.min(), by_rounds.max()
        once = sorted(m for m in high.index if 0 < high[m] <= 1)
        many = sorted(m for m in high.index if high[m] > 1)
        if once and many:
            out.append(f"Training rounds across the shares: {', '.join(once)} in one exchange in every cell; "
                       + ", ".join(f"{m} {low[m]:.0f}" + (f" to {high[m]:.0f}" if high[m] != low[m] else "")
                                   for m in many) + ".")

    registered = _registered_claims()
    # The claims' axes are numeric (shares); others, such as the column split's, are not read here.
    values_of = {axis: sorted({float(v) for v in ok[ok["axis"] == axis]["value"]})
                 for axis in {claim.axis for _, claim in registered}}
    for method, claim in registered:
        values = values_of[claim.axis]
        if not values:
            continue
        at = {"smallest": values[0], "largest": values[-1],
              "half": min(values, key=lambda v: abs(v - 0.5))}[claim.at]
        where = {"axis": claim.axis, "value": _value(at), "scored": claim.scored}
        test = paired(rows, metric, where, claim.method or method, claim.against)
        if test is not None:
            place = ", ".join(f"{k} = {v}" for k, v in where.items())
            out.append(f"{claim.text} ({place}): {test.sentence(metric, better)}.")
    return out


def _registered_claims() -> list[tuple[str, Claim]]:
    """Every registered method's claims, by axis in the comparison's order (shares, second hop, absent)."""
    from vflo.methods.registry import get_method, method_names

    found = [(name, c) for name in method_names() for c in get_method(name).claims]
    order = ["aligned", "second_hop", "absent"]
    return sorted(found, key=lambda item: order.index(item[1].axis))


def _value(share: float) -> str:
    """A share as the comparison's rows spell it (``0.5``, ``1.0``)."""
    return str(float(share))


def _fmt(value: Any, digits: int = 3) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:.{digits}f}"
    return str(value)


def _spread(value: Any) -> str:
    """A std over repeats: "one run, no spread" where there was one run (never "± 0.000")."""
    return "one run, no spread" if isinstance(value, float) and math.isnan(value) else _fmt(value)


def _tables(comparison: Comparison, table: pd.DataFrame) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) of every table, shared by the Markdown and the HTML report."""
    metric = comparison.metric
    out = []
    best = which_method(comparison, table)
    if not best.empty:
        out.append(("Which method when (best deployable method per cell; ties: methods a paired t-test over the "
                    f"repeats cannot tell from it, p >= {ALPHA}; a cell with fewer than {MIN_TEST_ROWS} test rows or "
                    f"{MIN_REPEATS} runs names none)",
                    ["varied", "value", "people scored", "test rows", "best", metric, "± std", "ties"],
                    [[axis_text(comparison, r["axis"]), _value_text(comparison, r["axis"], r["value"]), r["scored"],
                      f"{r['test_rows']:.0f}", r["best"], _fmt(r[metric]), _fmt(r["std"]), r["ties"] or "-"]
                     for _, r in best.iterrows()]))
    cells = privacy_cells(comparison)
    if cells:
        out.append(("At each privacy level: accuracy against Local, and what the attacks on what crossed recover",
                    *privacy_table(comparison, cells)))
    for axis in AXIS_TEXT:
        part = table[table["axis"] == axis]
        if part.empty:
            continue
        out.append((f"Varying: {axis_text(comparison, axis)}",
                    ["value", "people scored", "method", metric, "± std", "training MB", "rounds", "seconds",
                     "runs"],
                    [[_value_text(comparison, axis, r["value"]), r["scored"],
                      _name(r["method"], bool(r["simulation_only"])), _fmt(r[metric]),
                      _spread(r[f"{metric}_std"]), _fmt(r["fit_bytes"] / 1e6, 4), f"{r['fit_rounds']:.0f}",
                      _fmt(r["wall_seconds"], 2), f"{r['runs']:.0f}"] for _, r in part.iterrows()]))
    share = comparison.rows[comparison.rows.get("status", pd.Series(dtype=str)) == "ok"] \
        .groupby("method")["wall_seconds"].sum() if "status" in comparison.rows else pd.Series(dtype=float)
    if not share.empty:
        total = float(share.sum())
        out.append(("Each method's share of the time", ["method", "seconds", "share"],
                    [[m, _fmt(float(v), 1), f"{float(v) / total:.0%}"] for m, v in share.sort_values(ascending=False)
                     .items()]))
    failed = comparison.rows[comparison.rows["status"] == "failed"] if "status" in comparison.rows else pd.DataFrame()
    if not failed.empty:
        out.append(("Runs that failed", ["varied", "value", "people scored", "method", "error"],
                    [[axis_text(comparison, r["axis"]), r["value"], r["scored"], r["method"], str(r["error"])[:200]]
                     for _, r in failed.drop_duplicates(["axis", "value", "scored", "method"]).iterrows()]))
    if comparison.skipped:
        out.append(("Methods that did not run, and why", ["methods", "cells", "why"], not_run(comparison.skipped)))
    return out


def not_run(skipped: dict[str, str]) -> list[list[str]]:
    """What did not run, short: from ``{"method (cell)": why}``, one row per reason and set of cells, the methods
    it kept out of those cells together (methods, cells, why), by reason."""
    cells: dict[tuple[str, str], list[str]] = {}  # (method, why) -> its cells
    for key, why in skipped.items():
        method, _, cell = key.partition(" (")
        cells.setdefault((method, why), []).append(cell.removesuffix(")") or "every cell")
    rows: dict[tuple[str, str], list[str]] = {}  # (cells, why) -> methods
    for (method, why), where in cells.items():
        rows.setdefault(("; ".join(sorted(where)), why), []).append(method)
    return [[", ".join(sorted(methods)), where, why]
            for (where, why), methods in sorted(rows.items(), key=lambda item: (item[0][1], item[0][0]))]


def _value_text(comparison: Comparison, axis: str, value: Any) -> str:
    """A cell's value as the tables show it: a dropped share with the columns it leaves out."""
    if axis == "dropped" and comparison.own is not None:
        gone = comparison.own.dropped.get(float(value), {})
        return f"{value} (" + "; ".join(f"{q}: {', '.join(cols)}" for q, cols in gone.items() if cols) + ")"
    return str(value)


def _intro(comparison: Comparison) -> list[str]:
    if comparison.own is not None:
        return _own_intro(comparison)
    s = comparison.settings
    assert isinstance(s, CompareSettings)
    d = comparison.dataset
    return [
        f"Dataset: {d.label} ({len(d.ids)} rows, {len(d.columns)} columns, {comparison.task})"
        + (" — **stand-in data, generated**: its numbers say nothing about the real dataset" if d.standin else ""),
        f"Base scenario: the active party keeps {s.active_share:.0%} of the columns and every row"
        f"{f' (of {s.rows} sampled)' if s.rows else ''}; one passive party holds the rest of the columns for "
        f"{s.base_aligned:.0%} of those people; columns split at random. One thing varies at a time.",
        _test_line(comparison),
        f"Every cell: {s.repeats} repeat(s), each its own layout of the training people and seeds, the same for "
        f"every method; {len(comparison.rows)} method runs in {comparison.seconds / 60:.1f} min.",
        "Oracles pool every party's raw features (simulation only) and are not candidates for the best method.",
        *([f"Missing-partner cells: the active party holds every person and {s.missing_passives} partners split "
           f"the other columns; each partner lacks each training person with probability p_miss (base "
           f"{s.base_p_miss:g}) and each test person lacks a share of the partners (base {s.base_absent:g}); "
           f"SplitNN scores the people a partner lacks with Local (its fallback_rows say how many); "
           + ", ".join(f"{k} is {v['name']} with " + ", ".join(f"{a} = {b}" for a, b in v.items() if a != "name")
                       for k, v in s.missing_variants.items()) + "."]
          if (comparison.rows.get("scored", pd.Series(dtype=str)) == "missing").any() else []),
        *([f"Second-hop cells: the active party holds half of the training people; methods ran with their own "
           f"settings for that layout: {_settings_text(comparison.second_hop_settings)}."]
          if comparison.second_hop_settings else []),
    ]


def _own_intro(comparison: Comparison) -> list[str]:
    own, s = comparison.own, comparison.settings
    assert own is not None and not isinstance(s, CompareSettings)
    sample = (f"; a random {own.people[own.active]} of the active party's {own.active_rows} people (compare.rows), "
              "and the partners' people among them" if own.sample is not None else "")
    return [
        "Your own files: " + "; ".join(f"{p} ({'active, labels' if p == own.active else 'partner'}): "
                                       f"{own.files[p]}, {own.people[p]} people, {len(own.columns[p])} columns"
                                       for p in own.files) + f" ({comparison.task}){sample}.",
        f"Base cell: the files as they are: {own.shared} people every party holds (the real overlap) and "
        f"{len(own.pools['active_only'][0])} only the active party holds. One thing varies at a time around it.",
        f"Test people, held out of every party's training: {own.tests['aligned']} every party holds and "
        f"{own.tests['active_only']} only the active party holds (at most {s.test_fraction:.0%} of the active "
        "party's people and half of each kind), stratified by label; each repeat draws its own, the same in every "
        "cell of that repeat, so the spread says how much the answer moves with who is tested.",
        f"Every cell: {s.repeats} repeat(s), paired across methods; {len(comparison.rows)} method runs in "
        f"{comparison.seconds / 60:.1f} min.",
        "Oracles pool every party's raw features (possible only in this simulation, which reads every file) and "
        "are not candidates for the best method.",
    ]


def _test_line(comparison: Comparison) -> str:
    s, n = comparison.settings, comparison.test_people
    rows = s.rows or len(comparison.dataset.ids)
    fewer = (f" (fewer than {s.test_rows}: the dataset has {rows} rows and each test set takes at most "
             f"{s.test_fraction:.0%} of them)" if n < s.test_rows else "")
    return (f"Test people, held out first and the same in every cell and repeat: {n} every party holds (second-hop "
            f"cells: the active party and the first hop) and {n} only the active party holds{fewer}; the overlap "
            f"varies only among the training people. Missing-partner cells score {2 * n} held-out people, each "
            "lacking a share of the partners.")


def _settings_text(settings: dict[str, dict[str, Any]]) -> str:
    return "; ".join(f"{m}: " + ", ".join(f"{k} = {v}" for k, v in table.items()) for m, table in
                     sorted(settings.items()))


def answer_section(comparison: Comparison, table: pd.DataFrame) -> tuple[str, list[str]]:
    """The report's opening: a heading naming the user's own situation (the base cell) and, for each kind of
    people scored there, the method to use, its score and spread, its training traffic and rounds, and the
    runner-up with what the paired t-test says between them, all computed from the runs."""
    base = comparison.base_cell
    if comparison.own is not None:
        heading = f"The answer for your files as they are ({comparison.own.shared} people shared by every party)"
    else:
        heading = (f"The answer for the base scenario ({axis_text(comparison, base.get('axis', 'aligned'))} = "
                   f"{base.get('value', '?')})")
    kinds = [k for k in ("aligned", "active_only") if (comparison.rows.get("scored", pd.Series(dtype=str)) == k).any()]
    lines = [_answer_text(comparison, found) for found in (answer(comparison, table, k) for k in kinds)
             if found is not None]
    if not lines:
        lines = ["The base cell did not run in this comparison (see the failures and the cells below); add "
                 "its value to the axis to get an answer for it."]
    return heading, lines


def _answer_text(comparison: Comparison, found: Answer) -> str:
    from vflo.metrics import higher_is_better

    metric = comparison.metric
    who = f"Scoring {SCORED_TEXT.get(found.cell['scored'], found.cell['scored'])}"
    oracle = (f" For scale: {found.oracle[0]}, an oracle pooling every party's raw data (simulation only), scores "
              f"{found.oracle[1]:.3f}." if found.oracle else "")
    if found.why_none:
        return f"{who}: no method can be named: {found.why_none}.{oracle}"
    cost = ("no training messages" if found.fit_bytes <= 0 and found.fit_rounds <= 0 else
            f"training sends {found.fit_bytes / 1e6:.3g} MB in {found.fit_rounds:.0f} round(s)")
    text = (f"{who}: use {found.best}: {metric} {found.mean:.3f} ± {_spread(found.std)} over {found.runs} runs "
            f"({found.test_rows:.0f} test people each); {cost}.")
    runner = found.runner_up
    if runner is not None:
        test = (f"paired t-test over the repeats, p = {runner.p:.3g}" if not math.isnan(runner.p) else
                "the difference is the same in every repeat: no spread to test it by")
        them = f"the runner-up, {runner.b} ({metric} {runner.mean_b:.3f} ± {_spread(runner.std_b)})"
        if runner.verdict(higher_is_better(metric)) == "not clearly different from":
            text += f" It cannot be told from {them}: {test}."
        else:
            text += f" It is ahead of {them}: {test}."
    others = [t for t in found.ties if runner is None or t != runner.b]
    if others:
        text += f" Nor can it be told from {', '.join(others)}."
    if found.cheaper is not None:
        name, sent, rounds = found.cheaper
        text += (f" Of the methods it cannot be told from, {name} costs least: "
                 + ("no training messages" if sent <= 0 and rounds <= 0 else
                    f"{sent / 1e6:.3g} MB in {rounds:.0f} round(s)") + ".")
    return text + oracle


def left_out_lines(comparison: Comparison) -> list[str]:
    """One line per method left out for a missing library (how to install it) and per axis that did not run."""
    return [*comparison.unavailable.values(),
            *(f"Not varied: {axis}: {why}" for axis, why in comparison.left_out.items())]


def render_markdown(comparison: Comparison, table: pd.DataFrame) -> str:
    heading, said = answer_section(comparison, table)
    lines = [f"# {comparison.name}", "", f"## {heading}", "", *(f"- {line}" for line in said), ""]
    lines += [*(f"- {line}" for line in _intro(comparison)), ""]
    gone = left_out_lines(comparison)
    if gone:
        lines += ["## Left out", "", *(f"- {line}" for line in gone), ""]
    found = claims(comparison)
    if found:
        lines += ["## What the runs say about the papers' claims", "", *(f"- {c}" for c in found), ""]
    said = privacy_sentences(comparison, privacy_cells(comparison))
    if said:
        lines += [f"## {PRIVACY_HEADING}", "", f"- {PRIVACY_READING}", *(f"- {c}" for c in said), ""]
    for title, header, rows in _tables(comparison, table):
        lines += [f"## {title}", "", markdown_table(header, rows), ""]
    lines += ["Plots: report.html (one file, open it in any browser).", ""]
    return "\n".join(lines)


def _errorbars(ax: Any, part: pd.DataFrame, metric: str,
               nudge: Callable[[pd.Series, float], pd.Series]) -> list[tuple[str, float, float, str]]:
    """Each method's mean ± 1 std against ``x``, its x nudged by ``nudge(x, factor)`` (oracles dashed); each
    line's name and last point, for :func:`~vflo.experiments.styles.label_ends`."""
    names = list(dict.fromkeys(part["method"].astype(str)))
    ends = []
    for method, sub in part.groupby("method", sort=False):
        oracle = bool(sub["simulation_only"].iloc[0])
        sub = sub.sort_values("x")
        colour, marker = method_style(str(method))
        xs = nudge(sub["x"], jitter(str(method), names))
        ax.errorbar(xs, sub[metric], yerr=sub[f"{metric}_std"].fillna(0.0),
                    marker=marker, color=colour, capsize=3, markersize=6, alpha=0.9,
                    label=_name(str(method), oracle), linestyle="--" if oracle else "-")
        ends.append((_name(str(method), oracle), float(xs.iloc[-1]), float(sub[metric].iloc[-1]), colour))
    return ends


def _missing_plot(comparison: Comparison, table: pd.DataFrame, title: str) -> str:
    """The metric against the share of the partners each test person lacks (an SVG; "" without such cells)."""
    import matplotlib.pyplot as plt

    metric = comparison.metric
    part = table[table["axis"] == "absent"].copy()
    if part.empty:
        return ""
    part["x"] = part["value"].astype(float) * 100
    fig, ax = plt.subplots(figsize=(9, 4.6))
    # Nudged apart by a few points (linear axis; 0 % too), so no marker hides another.
    ends = _errorbars(ax, part, metric, lambda x, factor: x + (factor - 1.0) * 30)
    ax.set_xticks(sorted(part["x"].unique()))
    ax.set_xlabel("share of the partners each test person lacks, %")
    ax.set_ylabel(metric)
    s = comparison.settings
    assert isinstance(s, CompareSettings)
    ax.set_title(f"{title}\n{metric} with {s.missing_passives} partners, each lacking a training person with "
                 f"probability {s.base_p_miss:g}; error bars ± 1 std over the repeats", fontsize=9)
    ax.grid(alpha=0.3)
    label_ends(ax, ends)
    fig.tight_layout()
    return _svg(fig)


def render_html(comparison: Comparison, table: pd.DataFrame) -> str:
    esc = html.escape
    parts = ["<!DOCTYPE html>", "<html lang='en'><head><meta charset='utf-8'>",
             f"<title>{esc(comparison.name)}</title>",
             "<style>body{font-family:sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse;"
             "margin:1em 0;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}"
             "th{background:#f0f0f0}.plot{margin:1em 0}.standin{color:#a00;font-weight:bold}"
             "#answer{background:#f4f8ff;border:1px solid #9ab;padding:0.3em 1em;margin:1em 0}</style>",
             "</head><body>", f"<h1>{esc(comparison.name)}</h1>"]
    heading, said = answer_section(comparison, table)
    parts += ["<section id='answer'>", f"<h2>{esc(heading)}</h2>", "<ul>", *(f"<li>{esc(line)}</li>" for line in said),
              "</ul>", "</section>", "<ul>"]
    parts += [f"<li>{esc(line)}</li>" for line in _intro(comparison)]
    parts.append("</ul>")
    gone = left_out_lines(comparison)
    if gone:
        parts += ["<h2>Left out</h2>", "<ul>", *(f"<li>{esc(line)}</li>" for line in gone), "</ul>"]
    if comparison.dataset.standin:
        parts.append("<p class='standin'>STAND-IN DATA: generated, shaped like the real dataset.</p>")
    found = claims(comparison)
    if found:
        parts += ["<h2>What the runs say about the papers' claims</h2>", "<ul>",
                  *(f"<li>{esc(c)}</li>" for c in found), "</ul>"]
    said = privacy_sentences(comparison, privacy_cells(comparison))
    if said:
        parts += [f"<h2>{esc(PRIVACY_HEADING)}</h2>", "<ul>", f"<li>{esc(PRIVACY_READING)}</li>",
                  *(f"<li>{esc(c)}</li>" for c in said), "</ul>"]
    figures = plots(comparison, table)
    for key, title in (("metric_aligned", "Scoring people every party holds"),
                       ("metric_active_only", "Scoring people only the active party holds (new people)"),
                       ("metric_missing", "Scoring people some partners lack"),
                       ("privacy_aligned", "Privacy and utility, scoring people every party holds"),
                       ("privacy_active_only", "Privacy and utility, scoring people only the active party holds"),
                       ("privacy_aligned_second_hop", "Privacy and utility with a second-hop party, scoring people "
                                                      "the active party and the first hop hold"),
                       ("privacy_active_only_second_hop", "Privacy and utility with a second-hop party, scoring "
                                                          "people only the active party holds"),
                       ("fit_bytes", "Training traffic"), ("fit_rounds", "Training rounds")):
        if key in figures:
            parts += [f"<h2>{esc(title)}</h2>", f"<div class='plot' id='plot-{key}'>{figures[key]}</div>"]
    for title, header, rows in _tables(comparison, table):
        parts += [f"<h2>{esc(title)}</h2>", "<table>",
                  "<tr>" + "".join(f"<th>{esc(str(h))}</th>" for h in header) + "</tr>"]
        parts += ["<tr>" + "".join(f"<td>{esc(str(c))}</td>" for c in row) + "</tr>" for row in rows]
        parts.append("</table>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _own_json(comparison: Comparison) -> dict[str, Any] | None:
    """What a comparison on the parties' own files varied around (None on a dataset)."""
    own = comparison.own
    if own is None:
        return None
    return {"files": own.files, "people": own.people, "shared": own.shared, "test_people": own.tests,
            "dropped": {str(share): cols for share, cols in own.dropped.items()}}


def write_comparison(comparison: Comparison, out_dir: Path, *, overwrite: bool = False) -> Path:
    table = summary(comparison)
    with atomic_dir(out_dir, overwrite=overwrite) as tmp:
        comparison.rows.to_csv(tmp / "results.csv", index=False)
        table.to_csv(tmp / "summary.csv", index=False)
        (tmp / "results.json").write_text(json.dumps(
            {"name": comparison.name, "dataset": comparison.dataset.label, "standin": comparison.dataset.standin,
             "task": comparison.task, "metric": comparison.metric, "seconds": comparison.seconds,
             "test_people": comparison.test_people, "second_hop_settings": comparison.second_hop_settings,
             "skipped": comparison.skipped, "unavailable": comparison.unavailable, "left_out": comparison.left_out,
             "answer": answer_section(comparison, table)[1], "own_files": _own_json(comparison),
             "rows": comparison.rows.to_dict(orient="records")},
            indent=1, default=str))
        (tmp / "report.md").write_text(render_markdown(comparison, table))
        (tmp / "report.html").write_text(render_html(comparison, table))
    return out_dir
