"""Summaries and the Markdown report of an experiment.

Numbers are aggregated in two steps, as APC-VFL reports them: folds are averaged
within a repeat, then mean, standard deviation and a 95% t-interval are taken over
repeats.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from vflo.experiments.runner import ExperimentResult
from vflo.metrics import higher_is_better

COMM_COLUMNS = ("comm_bytes", "comm_mb", "comm_messages", "comm_rounds", "fit_bytes", "fit_rounds", "predict_bytes",
                "predict_rounds", "align_bytes", "align_rounds", "control_bytes", "fit_seconds", "wall_seconds")


def t_halfwidth(values: Sequence[float], confidence: float = 0.95) -> float:
    """Half-width of the t-interval for the mean; NaN for fewer than two values."""
    from scipy import stats

    n = len(values)
    if n < 2:
        return float("nan")
    sd = float(np.std(values, ddof=1))
    return float(stats.t.ppf(0.5 + confidence / 2, n - 1) * sd / math.sqrt(n))


def summarize(result: ExperimentResult) -> pd.DataFrame:
    """One row per variant x method: mean, std and 95% CI half-width of every metric, means of the rest."""
    frame = pd.DataFrame(result.rows)
    if "status" in frame:
        frame = frame[frame["status"] == "ok"]
    if frame.empty:
        return frame
    metrics = [m for m in result.metrics if m in frame.columns]
    numeric = metrics + [c for c in COMM_COLUMNS if c in frame.columns]
    per_repeat = frame.groupby(["variant", "method", "repeat"], sort=False)[numeric].mean().reset_index()
    out = []
    order = list(dict.fromkeys(frame["variant"]))
    methods = list(dict.fromkeys(frame["method"]))
    for variant in order:
        for method in methods:
            sub = per_repeat[(per_repeat["variant"] == variant) & (per_repeat["method"] == method)]
            if sub.empty:
                continue
            first = frame[(frame["variant"] == variant) & (frame["method"] == method)].iloc[0]
            row: dict[str, Any] = {
                "variant": variant, "method": method, "repeats": len(sub),
                "aligned": int(first["aligned"]), "active_features": int(first["active_features"]),
                "inference": first["inference"], "simulation_only": bool(first["simulation_only"]),
            }
            for path in result.config.sweep_paths:
                row[path] = first[path]
            for m in metrics:
                values = sub[m].to_numpy(dtype=float)
                row[m] = float(np.mean(values))
                row[f"{m}_std"] = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
                row[f"{m}_ci95"] = t_halfwidth(values.tolist())
            for c in COMM_COLUMNS:
                if c in sub:
                    row[c] = float(sub[c].mean())
            out.append(row)
    return pd.DataFrame(out)


def _fmt(value: float, digits: int = 4) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def _bytes(n: float) -> str:
    if n == 0:
        return "0"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def render_markdown(result: ExperimentResult, summary: pd.DataFrame) -> str:
    cfg = result.config
    ds = result.dataset
    metric = cfg.metric
    direction = "higher is better" if higher_is_better(metric) else "lower is better"
    lines = [f"# {cfg.name}", ""]
    if cfg.description:
        lines += [cfg.description, ""]
    if ds.standin:
        lines += [
            f"> **Stand-in data.** `{ds.name}` is generated data shaped like {ds.standin_for}, which is not "
            "available here. Its numbers say nothing about the real dataset.", "",
        ]
    lines += [
        f"- Dataset: {ds.label} ({len(ds.ids)} rows x {len(ds.columns)} features, {ds.task}); {ds.source}",
        *([f"- Classes (score columns in this order): {', '.join(f'{i} = {c}' for i, c in enumerate(ds.classes))}"]
          if ds.classes else []),
        f"- Protocol: {cfg.protocol.describe()}",
        f"- Parties: {', '.join(f'{p.name} ({p.role})' for p in cfg.variants[0].spec.parties)}",
        f"- Sweep: {', '.join(cfg.sweep_paths) or 'none'} ({len(cfg.variants)} variant(s))",
        f"- Seed: {cfg.seed}; repeats: {cfg.protocol.repetitions()}{' (quick mode)' if cfg.quick else ''}",
        f"- vflo {result.environment()['vflo']}, torch {result.environment()['torch']}; started {result.started}; "
        f"took {result.seconds:.1f} s",
        "",
        f"## {metric} ({direction})",
        "",
        "Mean ± standard deviation over repeats, and the half-width of the 95% t-interval. Communication is read "
        "from the ledger of messages that crossed the transport: the method's own traffic (requests and replies, "
        "headers included); ID alignment and setup are counted apart (`align_bytes`, `control_bytes` in "
        "results.csv).",
        "",
    ]
    header = ["variant", "method", metric, "± std", "95% CI ±", "train comm", "train rounds", "scoring comm",
              "fit s", "inference"]
    body = []
    for _, r in summary.iterrows():
        name = r["method"] + (" (oracle)" if r["simulation_only"] else "")
        body.append([
            r["variant"], name, _fmt(r[metric]), _fmt(r[f"{metric}_std"]), _fmt(r[f"{metric}_ci95"]),
            _bytes(r["fit_bytes"]), f"{r['fit_rounds']:.0f}", _bytes(r["predict_bytes"]),
            f"{r['fit_seconds']:.2f}", r["inference"],
        ])
    lines += [markdown_table(header, body), ""]
    lines += _majority_section(result)
    lines += own_settings_section(result.rows)
    failures = result.failures
    if failures:
        lines += ["## Failures", "",
                  f"{len(failures)} run(s) failed; the rows above are the methods that finished. The run's exit "
                  f"code is {result.exit_code}.", "",
                  markdown_table(["variant", "repeat", "fold", "method", "error"],
                                 [[f["variant"], f["repeat"], f["fold"], f["method"],
                                   f"{f['error_type']}: {f['error']}"] for f in failures]), ""]
    others = [m for m in result.metrics if m != metric and m in summary.columns]
    if others:
        lines += ["## All metrics (means)", ""]
        lines += [markdown_table(
            ["variant", "method", *others],
            [[r["variant"], r["method"], *(_fmt(r[m]) for m in others)] for _, r in summary.iterrows()],
        ), ""]
    lines += _training_section(result)
    lines += _privacy_section(result)
    lines += _communication_section(result)
    if any(summary["simulation_only"]):
        lines += [
            "Methods marked *(oracle)* pool every party's raw features in one place. They run only in "
            "simulation and bound what any federated method could reach; they are not deployable.", "",
        ]
    lines += [
        "Files: `results.csv` (one row per variant x repeat x fold x method), `results.json` (config, rows, "
        "ledger detail, environment), plots `metric_vs_x.png` and `bytes_vs_x.png`.", "",
    ]
    return "\n".join(lines)


def own_settings_section(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Where a party ran its own side of a method other than the experiment proposed (its config's
    ``[methods.NAME]``): which values ran at which party, as each party's setup reply said (``party_settings``)."""
    seen: dict[tuple[str, str, str], None] = {}
    for row in rows:
        if row.get("status") == "ok" and row.get("party_settings"):
            for party, settings in json.loads(str(row["party_settings"])).items():
                seen[(str(row["method"]), party, json.dumps(settings, sort_keys=True))] = None
    if not seen:
        return []
    return ["## Settings a party ran as its own", "",
            "These parties ran their side of the method with their own settings (their configs' [methods.NAME]) "
            "where the experiment proposed others; every other value ran as proposed.", "",
            markdown_table(["method", "party", "its own settings"],
                           [[method, party, f"`{settings}`"] for method, party, settings in seen]), ""]


def _majority_section(result: ExperimentResult) -> list[str]:
    """Classification runs whose model scored no better than always answering the most frequent class of its
    training rows (``no_better_than_majority``, compared on the test rows)."""
    ran = pd.DataFrame([r for r in result.rows if r.get("status") == "ok" and "no_better_than_majority" in r])
    if ran.empty or not ran["no_better_than_majority"].any():
        return []
    body = []
    for (variant, method), group in ran.groupby(["variant", "method"], sort=False):
        flagged = group[group["no_better_than_majority"].astype(bool)]
        if flagged.empty:
            continue
        body.append([variant, method, f"{len(flagged)} of {len(group)}", _fmt(float(flagged["accuracy"].mean())),
                     _fmt(float(flagged["majority_accuracy"].mean())),
                     f"{int(flagged['answers_one_class'].astype(bool).sum())} of {len(flagged)}"])
    return ["## Runs no better than the majority class", "",
            "These runs ended no better than always answering one class: their accuracy on the test rows is no "
            "better than always answering the most frequent class of their training rows scores there, or they "
            "answer one class for every test row. Compared on the test rows (the models' accuracy on their own "
            "training rows is not measured). Such a model has learned nothing it can use: look at its training "
            "settings (learning rate, epochs, batch size; how its training ended is below) or at the noise a "
            "privacy setting adds.", "",
            markdown_table(["variant", "method", "runs", "accuracy", "majority class's accuracy",
                            "one class for all"], body), ""]


def _training_section(result: ExperimentResult) -> list[str]:
    """How each trained network's loop ended, as the runs report it (not as the config intended)."""
    frame = pd.DataFrame([r for r in result.rows if r.get("status") == "ok" and "epochs" in r])
    if frame.empty:
        return []
    body = []
    for (variant, method), group in frame.groupby(["variant", "method"], sort=False):
        resumed = group["resumed_after_epoch"].dropna() if "resumed_after_epoch" in group else pd.Series([])
        body.append([variant, method, f"{group['epochs'].mean():.1f}", f"{group['epochs'].max():.0f}",
                     f"{int(group['stopped_by_rule'].sum())} of {len(group)}",
                     f"{len(resumed)} (after epoch {', '.join(str(int(e)) for e in resumed)})" if len(resumed)
                     else "0"])
    return ["## How training ended", "",
            "Epochs each method's main network trained (mean and most over runs), in how many runs the stopping "
            "rule ended it (the others ran to `max_epochs`), and runs resumed from a checkpoint.", "",
            markdown_table(["variant", "method", "epochs (mean)", "epochs (max)", "stopped by rule", "resumed"], body),
            ""]


def _privacy_section(result: ExperimentResult) -> list[str]:
    """Each ε the runs report, and what it covers (the method's own statement, recorded in every row)."""
    frame = pd.DataFrame([r for r in result.rows if r.get("status") == "ok" and r.get("epsilon_scope")])
    if frame.empty:
        return []
    body = []
    for (variant, method), group in frame.groupby(["variant", "method"], sort=False):
        eps = [c for c in group.columns if c.startswith("epsilon_") and c != "epsilon_scope" and group[c].notna().any()]
        body.append([variant, method, ", ".join(f"{c[len('epsilon_'):]} {group[c].max():.3g}" for c in eps),
                     str(group["epsilon_scope"].iloc[0])])
    return ["## Differential privacy: what each ε covers", "",
            "The largest ε (at the noise's δ) over runs, per protected flow, and what the figure covers and does not, "
            "as the method states it.", "",
            markdown_table(["variant", "method", "ε", "what it covers"], body), ""]


def _communication_section(result: ExperimentResult) -> list[str]:
    """Ledger detail by message kind for the first repeat and fold of the first variant."""
    if not result.communication:
        return []
    first_variant = result.communication[0]["variant"]
    picked = [c for c in result.communication if c["variant"] == first_variant and c["repeat"] == 0 and c["fold"] == 0]
    rows = []
    for c in picked:
        for kind, v in sorted(c["by_kind"].items()):
            rows.append([c["method"], f"`{kind}`", v["messages"], _bytes(v["request_bytes"]), _bytes(v["reply_bytes"])])
    if not rows:
        return []
    return [
        f"## Communication by message kind ({first_variant}, repeat 0)", "",
        markdown_table(["method", "kind", "messages", "request bytes", "reply bytes"], rows), "",
        "`control.*` messages install and remove the method at each party; they are counted apart.", "",
    ]
