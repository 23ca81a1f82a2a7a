"""One colour and one marker per method, the same in every plot vflo draws (a comparison's and an
experiment's), distinct for every registered method; oracles (simulation only) are drawn dashed. Each line is
named at its end (:func:`label_ends`), so a dozen methods stay readable without matching colours to a legend."""

from __future__ import annotations

import math
from collections.abc import Sequence
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


def label_ends(ax: Any, ends: Sequence[tuple[str, float, float, str]], fontsize: int = 7) -> None:
    """Each line's name beside the plot, level with its last point, in its colour and joined to that point by a
    faint leader: with a dozen methods a line is found by its name, not by telling colours apart. Names whose
    points lie close are spread just far enough apart not to overlap. ``ends``: (name, x, y, colour) in data
    coordinates; call it once the axes' scales and ticks are set, before the layout is tightened."""
    ax.get_xlim(), ax.get_ylim()  # settle the autoscaled limits the transforms below read
    to_axes = ax.transAxes.inverted()
    placed = []
    for name, x, y, colour in ends:
        if not (math.isfinite(x) and math.isfinite(y)):
            continue
        placed.append((float(to_axes.transform(ax.transData.transform((x, y)))[1]), name, x, y, colour))
    if not placed:
        return
    placed.sort()
    height = ax.bbox.height or 1.0
    gap = min(fontsize * 1.3 * ax.figure.dpi / 72.0 / height, 1.0 / len(placed))
    heights = [min(max(h, 0.0), 1.0) for h, *_ in placed]
    for i in range(1, len(heights)):
        heights[i] = max(heights[i], heights[i - 1] + gap)
    over = heights[-1] - 1.0
    if over > 0:  # pushed past the top: slide back down, keeping the gaps
        heights[-1] = 1.0
        for i in range(len(heights) - 2, -1, -1):
            heights[i] = min(heights[i], heights[i + 1] - gap)
    for height_at, (_, name, x, y, colour) in zip(heights, placed, strict=True):
        ax.annotate(name, xy=(x, y), xycoords="data", xytext=(1.02, height_at), textcoords="axes fraction",
                    color=text_colour(colour), fontsize=fontsize, va="center", ha="left", annotation_clip=False,
                    arrowprops={"arrowstyle": "-", "color": colour, "lw": 0.6, "alpha": 0.5,
                                "shrinkA": 0, "shrinkB": 2})


def text_colour(colour: str) -> str:
    """``colour`` darkened, keeping its hue, where it is too light to read as text on white (tab20's light
    shades); others as they are."""
    from matplotlib.colors import to_hex, to_rgb

    r, g, b = to_rgb(colour)
    luminance = 0.2126 * r + 0.7152 * g + 0.0722 * b
    if luminance <= 0.5:
        return colour
    scale = 0.5 / luminance
    return str(to_hex((r * scale, g * scale, b * scale)))
