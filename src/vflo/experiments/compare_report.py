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
    Comparison,
    paired,
    summary,
    which_method,
)
from vflo.experiments.output import atomic_dir
from vflo.experiments.report import markdown_table
from vflo.experiments.styles import jitter, legend_outside, method_style
from vflo.methods.base import Claim

AXIS_TEXT = {"aligned": "share of the active party's people the others also hold",
             "passives": "number of passive parties", "split": "how the columns are split",
             "second_hop": "people a second-hop party shares with the first hop, as a share of the active party's",
             "p_miss": "probability that a partner lacks a training person",
             "absent": "share of the partners a test person lacks"}


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
        _errorbars(ax, part, metric, lambda x, factor: x * factor)
        ax.set_xscale("log")
        # Ticks at the shares the comparison ran (1%, 5%, ...), not at powers of ten the range may not reach.
        ax.set_xticks(sorted(part["x"].unique()))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}%"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("people of the active party the others also hold (log scale)")
        ax.set_ylabel(metric)
        who = "people every party holds" if scored == "aligned" else "people only the active party holds"
        dropped = sorted(set(cells["x"]) - set(part["x"]))
        note = (f"\nleft out: {', '.join(f'{v:g}%' for v in dropped)} shared (fewer than {MIN_TEST_ROWS} test rows)"
                if dropped else "")
        ax.set_title(f"{title}\n{metric} scoring {who}; error bars ± 1 std over the repeats{note}", fontsize=9)
        ax.grid(alpha=0.3, which="both")
        legend_outside(ax)
        fig.tight_layout()
        out[f"metric_{scored}"] = _svg(fig)
    part = data[data["scored"] == data["scored"].iloc[0]]
    for column, label in (("fit_bytes", "training traffic, MB (measured)"), ("fit_rounds", "training rounds")):
        fig, ax = plt.subplots(figsize=(9, 4.6))
        silent = []
        names = list(dict.fromkeys(part["method"].astype(str)))
        for method, sub in part.groupby("method", sort=False):
            if (sub[column] <= 0).all():
                silent.append(str(method))
                continue
            sub = sub.sort_values("x")
            values = sub[column] / 1e6 if column == "fit_bytes" else sub[column]
            colour, marker = method_style(str(method))
            ax.plot(sub["x"] * jitter(str(method), names), values, marker=marker, color=colour, label=str(method))
        ax.set_xscale("log")
        ax.set_yscale("log")
        # Ticks at the shares the comparison ran (1%, 5%, ...), not at powers of ten the range may not reach.
        ax.set_xticks(sorted(part["x"].unique()))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}%"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.yaxis.set_major_locator(LogLocator(base=10))
        unit = " MB" if column == "fit_bytes" else ""
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _, unit=unit: f"{v:g}{unit}"))
        ax.set_xlabel("people of the active party the others also hold (log scale)")
        ax.set_ylabel(label + " (log scale)")
        ax.set_title(title + (f"\nno training messages: {', '.join(silent)}" if silent else ""), fontsize=9)
        ax.grid(alpha=0.3, which="both")
        legend_outside(ax)
        fig.tight_layout()
        out[column] = _svg(fig)
    return out


def claims(comparison: Comparison) -> list[str]:
    """The comparison's sentences about the seed papers' claims, each computed from the runs by the same paired
    test as the "which method when" table; a claim whose cells did not run is left out."""
    from vflo.metrics import higher_is_better

    rows, metric = comparison.rows, comparison.metric
    if rows.empty or "status" not in rows:
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
                    [[AXIS_TEXT[r["axis"]], r["value"], r["scored"], f"{r['test_rows']:.0f}", r["best"],
                      _fmt(r[metric]), _fmt(r["std"]), r["ties"] or "-"] for _, r in best.iterrows()]))
    for axis, text in AXIS_TEXT.items():
        part = table[table["axis"] == axis]
        if part.empty:
            continue
        out.append((f"Varying: {text}",
                    ["value", "people scored", "method", metric, "± std", "training MB", "rounds", "seconds",
                     "runs"],
                    [[r["value"], r["scored"], _name(r["method"], bool(r["simulation_only"])), _fmt(r[metric]),
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
                    [[AXIS_TEXT.get(r["axis"], r["axis"]), r["value"], r["scored"], r["method"], str(r["error"])[:200]]
                     for _, r in failed.drop_duplicates(["axis", "value", "scored", "method"]).iterrows()]))
    if comparison.skipped:
        out.append(("Methods that did not run, and why", ["method (people scored)", "why"],
                    [[k, v] for k, v in sorted(comparison.skipped.items())]))
    return out


def _intro(comparison: Comparison) -> list[str]:
    s = comparison.settings
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


def render_markdown(comparison: Comparison, table: pd.DataFrame) -> str:
    lines = [f"# {comparison.name}", "", *(f"- {line}" for line in _intro(comparison)), ""]
    found = claims(comparison)
    if found:
        lines += ["## What the runs say about the papers' claims", "", *(f"- {c}" for c in found), ""]
    for title, header, rows in _tables(comparison, table):
        lines += [f"## {title}", "", markdown_table(header, rows), ""]
    lines += ["Plots: report.html (one file, open it in any browser).", ""]
    return "\n".join(lines)


def _errorbars(ax: Any, part: pd.DataFrame, metric: str, nudge: Callable[[pd.Series, float], pd.Series]) -> None:
    """Each method's mean ± 1 std against ``x``, its x nudged by ``nudge(x, factor)`` (oracles dashed)."""
    names = list(dict.fromkeys(part["method"].astype(str)))
    for method, sub in part.groupby("method", sort=False):
        oracle = bool(sub["simulation_only"].iloc[0])
        sub = sub.sort_values("x")
        colour, marker = method_style(str(method))
        ax.errorbar(nudge(sub["x"], jitter(str(method), names)), sub[metric], yerr=sub[f"{metric}_std"].fillna(0.0),
                    marker=marker, color=colour, capsize=3, markersize=6, alpha=0.9,
                    label=_name(str(method), oracle), linestyle="--" if oracle else "-")


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
    _errorbars(ax, part, metric, lambda x, factor: x + (factor - 1.0) * 30)
    ax.set_xticks(sorted(part["x"].unique()))
    ax.set_xlabel("share of the partners each test person lacks, %")
    ax.set_ylabel(metric)
    s = comparison.settings
    ax.set_title(f"{title}\n{metric} with {s.missing_passives} partners, each lacking a training person with "
                 f"probability {s.base_p_miss:g}; error bars ± 1 std over the repeats", fontsize=9)
    ax.grid(alpha=0.3)
    legend_outside(ax)
    fig.tight_layout()
    return _svg(fig)


def render_html(comparison: Comparison, table: pd.DataFrame) -> str:
    esc = html.escape
    parts = ["<!DOCTYPE html>", "<html lang='en'><head><meta charset='utf-8'>",
             f"<title>{esc(comparison.name)}</title>",
             "<style>body{font-family:sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse;"
             "margin:1em 0;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}"
             "th{background:#f0f0f0}.plot{margin:1em 0}.standin{color:#a00;font-weight:bold}</style>",
             "</head><body>", f"<h1>{esc(comparison.name)}</h1>", "<ul>"]
    parts += [f"<li>{esc(line)}</li>" for line in _intro(comparison)]
    parts.append("</ul>")
    if comparison.dataset.standin:
        parts.append("<p class='standin'>STAND-IN DATA: generated, shaped like the real dataset.</p>")
    found = claims(comparison)
    if found:
        parts += ["<h2>What the runs say about the papers' claims</h2>", "<ul>",
                  *(f"<li>{esc(c)}</li>" for c in found), "</ul>"]
    figures = plots(comparison, table)
    for key, title in (("metric_aligned", "Scoring people every party holds"),
                       ("metric_active_only", "Scoring people only the active party holds (new people)"),
                       ("metric_missing", "Scoring people some partners lack"),
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


def write_comparison(comparison: Comparison, out_dir: Path, *, overwrite: bool = False) -> Path:
    table = summary(comparison)
    with atomic_dir(out_dir, overwrite=overwrite) as tmp:
        comparison.rows.to_csv(tmp / "results.csv", index=False)
        table.to_csv(tmp / "summary.csv", index=False)
        (tmp / "results.json").write_text(json.dumps(
            {"name": comparison.name, "dataset": comparison.dataset.label, "standin": comparison.dataset.standin,
             "task": comparison.task, "metric": comparison.metric, "seconds": comparison.seconds,
             "test_people": comparison.test_people, "second_hop_settings": comparison.second_hop_settings,
             "skipped": comparison.skipped, "rows": comparison.rows.to_dict(orient="records")},
            indent=1, default=str))
        (tmp / "report.md").write_text(render_markdown(comparison, table))
        (tmp / "report.html").write_text(render_html(comparison, table))
    return out_dir
