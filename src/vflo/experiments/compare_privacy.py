"""The comparison's privacy axis, answered: at each ε, which method beats the floor, Local (the registered
method with ``floor``: the active party alone, which sends nothing), by a paired t-test over the repeats, and
whether any attack on what crossed beats what the attacker could infer from its own data; every figure and
sentence computed from the runs' rows (their metric, their accounts and their attack columns)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from vflo.experiments.compare import ALPHA, MIN_REPEATS, Comparison, paired
from vflo.methods.registry import floor
from vflo.metrics import higher_is_better
from vflo.privacy.columns import COLUMNS

INFINITY = "∞"


@dataclass(frozen=True)
class PrivacyCell:
    """One method at one ε (``INFINITY``: the base cell, no budget) for one kind of people scored, in one layout
    (``"star"``, the base scenario; ``"second_hop"``, where a method that needs a second hop runs)."""

    epsilon: str
    scored: str
    method: str
    runs: int
    mean: float
    std: float
    spent: float  # the largest ε any party's account reports, mean over the runs (NaN: none reported)
    verdict: str  # against Local: "ahead of", "behind", "not clearly different from", or why it was not tested
    p: float
    columns: dict[str, float]  # the attack columns' means; the *_leaks ones: the share of runs that leaked
    layout: str = "star"

    @property
    def leaks(self) -> list[str]:
        """The attacks that beat the attacker's own data in at least one run."""
        out = []
        if self.columns.get("attack_leaks", 0.0) > 0:
            out.append("feature reconstruction")
        if self.columns.get("label_leaks", 0.0) > 0:
            out.append("label inference")
        return out

    @property
    def who(self) -> str:
        """The people scored, with the layout where it is not the base scenario's."""
        return self.scored if self.layout == "star" else f"{self.scored} (second hop)"


#: Each layout's ε cells and the cell that is its ε = ∞: (layout, the ε cells' axis, the base cell's attribute).
LAYOUTS = (("star", "epsilon", "base_cell"), ("second_hop", "epsilon_hop", "base_hop_cell"))


def privacy_cells(comparison: Comparison) -> list[PrivacyCell]:
    """Every method's cell on the privacy axis and in its base cell, per layout, in order of ε (∞ first) and
    method."""
    rows = comparison.rows
    if rows.empty or "status" not in rows:
        return []
    ok = rows[rows["status"] == "ok"]
    out = []
    for layout, axis, base_attribute in LAYOUTS:
        mine = ok[ok["axis"] == axis]
        if set(mine["method"]) <= {floor()}:
            continue  # no ε cell here, or Local's alone: nothing to read against it
        base = getattr(comparison, base_attribute)
        wheres: list[tuple[str, dict[str, str]]] = [(INFINITY, {"axis": base.get("axis", ""),
                                                                "value": base.get("value", "")})]
        wheres += [(f"{float(v):g}", {"axis": axis, "value": str(v)})
                   for v in sorted(set(mine["value"]), key=float)]
        out += _cells(comparison, wheres, set(mine["method"]), layout)
    return out


def _cells(comparison: Comparison, wheres: list[tuple[str, dict[str, str]]], methods: set[str],
           layout: str) -> list[PrivacyCell]:
    rows, metric = comparison.rows, comparison.metric
    ok = rows[rows["status"] == "ok"]
    better = higher_is_better(metric)
    against = floor()
    methods_here = methods | {against}
    out = []
    for epsilon, where in wheres:
        cell = ok[(ok["axis"].astype(str) == where["axis"]) & (ok["value"].astype(str) == where["value"])]
        for (scored, method), runs in cell.groupby(["scored", "method"], sort=True):
            if method not in methods_here:
                continue  # the base cell's other methods have no ε cell to read against
            test = None if method == against else paired(rows, metric, {**where, "scored": scored}, str(method),
                                                         against)
            if test is None:
                verdict, p = ("the reference" if method == against else f"{against} did not run here"), math.nan
            elif test.runs < MIN_REPEATS:
                verdict, p = f"{test.runs} paired run(s): too few to test", test.p
            else:
                verdict, p = test.verdict(better), test.p
            spent = runs.filter(like="epsilon_account_").max(axis=1) if \
                runs.filter(like="epsilon_account_").shape[1] else pd.Series(dtype=float)
            columns = {c: float(pd.to_numeric(runs[c], errors="coerce").mean()) for c in COLUMNS if c in runs}
            values = runs[metric].to_numpy(float)
            out.append(PrivacyCell(epsilon=epsilon, scored=str(scored), method=str(method), runs=len(values),
                                   mean=float(values.mean()),
                                   std=float(np.std(values, ddof=1)) if len(values) > 1 else math.nan,
                                   spent=float(spent.mean()) if len(spent) and spent.notna().any() else math.nan,
                                   verdict=verdict, p=p, columns=columns, layout=layout))
    return out


def _f(value: float, digits: int = 3) -> str:
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


def privacy_table(comparison: Comparison, cells: list[PrivacyCell]) -> tuple[list[str], list[list[str]]]:
    """The privacy axis as one table (header, rows)."""
    against = floor()
    header = ["ε per party", "people scored", "method", comparison.metric, "± std", "runs", "ε spent (largest)",
              f"against {against} (paired t-test)", "feature R² [receiver's own]", "leaks features",
              "label AUC", "completion [own features or majority]", "leaks labels"]
    body = []
    for c in cells:
        col = c.columns
        body.append([c.epsilon, c.who, c.method, _f(c.mean), _f(c.std), str(c.runs), _f(c.spent, 2),
                     c.verdict + ("" if math.isnan(c.p) else f" (p = {c.p:.3g})"),
                     f"{_f(col.get('attack_r2', math.nan), 2)} [{_f(col.get('attack_own_r2', math.nan), 2)}]",
                     _share(col.get("attack_leaks", math.nan), c.runs), _f(col.get("label_auc", math.nan), 2),
                     f"{_f(col.get('label_completion', math.nan), 2)} "
                     f"[{_f(col.get('label_completion_own', math.nan), 2)}]",
                     _share(col.get("label_leaks", math.nan), c.runs)])
    return header, body


def _share(share: float, runs: int) -> str:
    if math.isnan(share):
        return "not measured"
    leaked = round(share * runs)
    return "no" if leaked == 0 else f"yes, {leaked} of {runs} runs"


def privacy_sentences(comparison: Comparison, cells: list[PrivacyCell]) -> list[str]:
    """One sentence per ε and kind of people scored: who beats Local, who does not, and what leaked."""
    out = []
    against = floor()
    keys = sorted({(c.layout, c.epsilon, c.scored) for c in cells},
                  key=lambda k: (k[0] != "star", k[1] != INFINITY, _num(k[1]), k[2]))
    for layout, epsilon, scored in keys:
        here = [c for c in cells if (c.layout, c.epsilon, c.scored) == (layout, epsilon, scored)
                and c.method != against]
        if not here:
            continue
        at = "Without a budget (ε = ∞)" if epsilon == INFINITY else f"At ε = {epsilon} per party"
        ahead = [c.method for c in here if c.verdict == "ahead of"]
        behind = [c.method for c in here if c.verdict == "behind"]
        level = [c.method for c in here if c.verdict == "not clearly different from"]
        parts = []
        if ahead:
            parts.append(f"{_names(ahead)} {'beats' if len(ahead) == 1 else 'beat'} {against}")
        if level:
            parts.append(f"{_names(level)} cannot be told from {against}")
        if behind:
            parts.append(f"{_names(behind)} {'is' if len(behind) == 1 else 'are'} behind {against}")
        untested = [c.method for c in here if c.method not in (*ahead, *behind, *level)]
        if untested:
            parts.append(f"{_names(untested)} not tested against {against}")
        leaking = [f"{c.method} ({', '.join(c.leaks)})" for c in here if c.leaks]
        unmeasured = all(math.isnan(c.columns.get("attack_leaks", math.nan)) for c in here)
        if unmeasured:
            leak = "the runs were not attacked"
        elif leaking:
            leak = f"an attack beats the receiver's own data against {', '.join(leaking)}"
        else:
            leak = "no attack beats the receiver's own data in any run"
        where = "" if layout == "star" else " with a second-hop party"
        out.append(f"{at}, scoring {scored} people{where} ({comparison.metric}, paired t-test at p < {ALPHA} over the "
                   f"repeats): {'; '.join(parts)}; {leak}.")
    return out


def _num(epsilon: str) -> float:
    return math.inf if epsilon == INFINITY else float(epsilon)


def _names(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def privacy_figure(comparison: Comparison, cells: list[PrivacyCell], scored: str, title: str,
                   layout: str = "star") -> Any:
    """The privacy-utility plot of one kind of people scored in one layout: each method's metric (± 1 std) at
    each ε, ∞ last, and the best feature reconstruction against what the receiver's own features give (R², 5 %
    known rows by default); a matplotlib figure, or None where no ε cell ran."""
    here = [c for c in cells if c.scored == scored and c.layout == layout]
    levels = sorted({c.epsilon for c in here}, key=_num)
    if len(levels) < 2:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from vflo.experiments.styles import method_style

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    place = {e: i for i, e in enumerate(levels)}
    methods = sorted({c.method for c in here})
    for k, method in enumerate(methods):
        mine = sorted((c for c in here if c.method == method), key=lambda c: _num(c.epsilon))
        colour, marker = method_style(method)
        xs = [place[c.epsilon] + (k - len(methods) / 2) * 0.04 for c in mine]
        left.errorbar(xs, [c.mean for c in mine], yerr=[0.0 if math.isnan(c.std) else c.std for c in mine],
                      marker=marker, color=colour, label=method, capsize=3)
        gain = [c.columns.get("attack_r2", math.nan) for c in mine]
        if not all(math.isnan(v) for v in gain):
            right.plot(xs, gain, marker=marker, color=colour, label=method)
            right.plot(xs, [c.columns.get("attack_own_r2", math.nan) for c in mine], linestyle=":", color=colour)
    for ax in (left, right):
        ax.set_xticks(range(len(levels)))
        ax.set_xticklabels(levels)
        ax.set_xlabel("ε per person at each party (δ 1e-5; ∞: no budget)")
        ax.grid(alpha=0.3)
    left.set_ylabel(comparison.metric)
    where = "" if layout == "star" else ", with a second-hop party"
    left.set_title(f"{title}\n{comparison.metric} scoring {scored} people{where}; ± 1 std over the repeats",
                   fontsize=9)
    right.axhline(0.0, color="grey", linewidth=0.8)
    right.set_ylabel("feature R² of the best reconstruction")
    right.set_title("what a receiver recovers (solid) and its own features give (dotted)", fontsize=9)
    left.legend(fontsize=8)
    fig.tight_layout()
    return fig
