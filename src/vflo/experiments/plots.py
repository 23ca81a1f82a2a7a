"""Plots of an experiment: the headline metric and the bytes exchanged against the sweep axis."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from vflo.experiments.runner import ExperimentResult
from vflo.experiments.styles import label_ends, method_style


def _x_axis(result: ExperimentResult, summary: pd.DataFrame) -> tuple[str, list[Any], list[str]]:
    """The column to plot against, its ordered values and tick labels."""
    cfg = result.config
    path = cfg.report.x or (cfg.sweep_paths[0] if cfg.sweep_paths else None)
    if path is None:
        return "aligned", sorted(summary["aligned"].unique().tolist()), []
    values = list(dict.fromkeys(summary[path].tolist()))
    if all(isinstance(v, int | float | np.integer | np.floating) for v in values):
        return path, values, []
    labels = []
    for v in values:
        try:
            parsed = json.loads(v) if isinstance(v, str) else v
            labels.append(f"{len(parsed)} items" if isinstance(parsed, list) else str(v))
        except (json.JSONDecodeError, TypeError):
            labels.append(str(v))
    return path, values, labels


def write_plots(result: ExperimentResult, summary: pd.DataFrame, out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if summary.empty:
        return []
    metric = result.config.metric
    xcol, xvalues, xlabels = _x_axis(result, summary)
    positions = {v: i for i, v in enumerate(xvalues)} if xlabels else {v: v for v in xvalues}
    styles = {m: method_style(str(m)) for m in dict.fromkeys(summary["method"])}
    title = result.dataset.label
    if result.dataset.standin:
        title += "\nSTAND-IN DATA (generated)"
    paths = []

    oracles = {str(m) for m, sub in summary.groupby("method", sort=False) if bool(sub["simulation_only"].any())}

    def name(method: object) -> str:
        return f"{method} (oracle)" if str(method) in oracles else str(method)

    repeats = result.config.protocol.repetitions()
    fig, ax = plt.subplots(figsize=(8.5, 4.2))
    ends = []
    for method, sub in summary.groupby("method", sort=False):
        sub = sub.sort_values(xcol, key=lambda s: s.map(xvalues.index))
        xs = [positions[v] for v in sub[xcol]]
        colour, marker = styles[method]
        ax.errorbar(xs, sub[metric], yerr=sub[f"{metric}_std"], marker=marker, capsize=3, label=name(method),
                    color=colour, linestyle="--" if str(method) in oracles else "-")
        ends.append((name(method), float(xs[-1]), float(sub[metric].iloc[-1]), colour))
    paths.append(_finish(fig, ax, out_dir / "metric_vs_x.png", xcol=xcol, ylabel=metric,
                         title=f"{title}\nerror bars: ± 1 standard deviation over {repeats} repeat(s)",
                         xlabels=xlabels, ends=ends))

    from matplotlib.ticker import FuncFormatter, LogLocator

    fig, ax = plt.subplots(figsize=(8.5, 4.2))
    silent = []
    ends = []
    for method, sub in summary.groupby("method", sort=False):
        if (sub["fit_bytes"] <= 0).all():
            silent.append(name(method))
            continue
        sub = sub.sort_values(xcol, key=lambda s: s.map(xvalues.index))
        xs = [positions[v] for v in sub[xcol]]
        ax.plot(xs, sub["fit_bytes"] / 1e6, marker=styles[method][1],
                label=name(method), color=styles[method][0], linestyle="--" if str(method) in oracles else "-")
        ends.append((name(method), float(xs[-1]), float(sub["fit_bytes"].iloc[-1] / 1e6), styles[method][0]))
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g} MB"))
    note = f"\nno training messages: {', '.join(silent)}" if silent else ""
    paths.append(_finish(fig, ax, out_dir / "bytes_vs_x.png", xcol=xcol,
                         ylabel="training traffic, MB (measured; log scale)", title=title + note, xlabels=xlabels,
                         ends=ends))
    return paths


def _finish(fig: Any, ax: Any, path: Path, *, xcol: str, ylabel: str, title: str, xlabels: list[str],
            ends: list[tuple[str, float, float, str]]) -> Path:
    """Labels, ticks, grid and each line's name at its end (``ends``: name, last x and y, colour); save and
    close."""
    import matplotlib.pyplot as plt

    ax.set_xlabel(xcol)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    if xlabels:
        ax.set_xticks(range(len(xlabels)), xlabels)
    ax.grid(alpha=0.3, which="both")
    label_ends(ax, ends, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
