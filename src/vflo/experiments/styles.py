"""One colour and one marker per method, the same in every plot vflo draws (a comparison's and an
experiment's), distinct for every registered method; oracles (simulation only) are drawn dashed."""

from __future__ import annotations

from typing import Any

from vflo.methods.registry import method_names

#: 20 colours that stay apart (matplotlib's tab20, dark shades first, then the light ones).
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2", "#c7c7c7",
           "#dbdb8d", "#9edae5")
MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*", "<", ">", "h", "p", "d", "8", "H", "1", "2", "3", "4", "+")


def method_style(method: str) -> tuple[str, str]:
    """(colour, marker) of a method (or of a labelled variant such as ``vfl_std``): registered methods by their
    place in the registry, so a method keeps its look across plots; other labels after them."""
    names = method_names()
    index = names.index(method) if method in names else len(names) + sum(map(ord, method)) % (
        len(COLOURS) - len(names))
    return COLOURS[index % len(COLOURS)], MARKERS[index % len(MARKERS)]


def jitter(method: str, methods: list[str], width: float = 0.15) -> float:
    """A small multiplicative offset on a log x axis, so methods at the same x do not hide each other."""
    if len(methods) < 2:
        return 1.0
    k = methods.index(method)
    return float(1.0 + width * (k / (len(methods) - 1) - 0.5))


def legend_outside(ax: Any, fontsize: int = 7) -> None:
    """The legend beside the plot, never over the data (none when nothing is labelled)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=fontsize, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, frameon=False)
