"""docs/comparison.md (and the screenshot docs/comparison.png), generated from the runs of ``vflo compare`` on
the committed configs in configs/compare/ (no figure typed by hand).

    for c in breast_cancer wine digits ...; do vflo compare configs/compare/$c.toml --out runs/compare/$c; done
    python -m benchmarks.link --data-dir ../shared/datasets      # optional: time over a LAN and a WAN
    python -m benchmarks.compare_docs [--runs runs/compare] [--link runs/bench/link.json] [--out docs]
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd

from vflo.experiments.compare import summary, which_method

ROOT = Path(__file__).resolve().parents[1]
ORDER = ("breast_cancer", "wine", "digits", "diabetes", "credit", "handwritten", "mnist5000", "houseprice_standin")


def load(runs: Path) -> dict[str, dict[str, Any]]:
    out = {}
    for name in ORDER:
        folder = runs / name
        if (folder / "results.json").is_file():
            meta = json.loads((folder / "results.json").read_text())
            rows = pd.DataFrame(meta["rows"])
            # The summary is computed again from the rows, by the same code as vflo compare's report.
            table = summary(SimpleNamespace(rows=rows, metric=meta["metric"]))  # type: ignore[arg-type]
            table["value"] = table["value"].astype(str)
            out[name] = {"meta": meta, "summary": table, "rows": rows, "folder": folder}
    return out


def cell(summary: pd.DataFrame, metric: str, axis: str, value: str, scored: str, method: str) -> tuple[float, float]:
    hit = summary[(summary["axis"] == axis) & (summary["value"] == value) & (summary["scored"] == scored)
                  & (summary["method"] == method)]
    if hit.empty:
        return math.nan, math.nan
    return float(hit[metric].iloc[0]), float(hit[f"{metric}_std"].iloc[0])


def which(summary: pd.DataFrame, metric: str) -> pd.DataFrame:
    """vflo compare's own "which method when" rule, on the summary recomputed from the runs."""
    table = which_method(SimpleNamespace(metric=metric), summary)  # type: ignore[arg-type]
    return table.rename(columns={metric: "score"})


def fmt(v: float, d: int = 3) -> str:
    return "-" if v is None or math.isnan(v) else f"{v:.{d}f}"


def claims(name: str, data: dict[str, Any]) -> list[str]:
    summary, meta = data["summary"], data["meta"]
    metric = meta["metric"]
    higher = metric not in ("rmse", "mae")
    lines = []
    rounds = summary[(summary["axis"] == "aligned") & (summary["scored"] == "aligned")]
    one_shot = rounds[rounds["method"].isin(["apc_vfl", "rap"])]
    split = rounds[rounds["method"] == "splitnn"]["fit_rounds"]
    if len(one_shot) and len(split):
        names = " and ".join({"apc_vfl": "APC-VFL", "rap": "RAP"}[m] for m in sorted(one_shot["method"].unique()))
        lines.append(f"One exchange against many: {names} trained in {one_shot['fit_rounds'].max():.0f} round(s) in "
                     f"every cell, SplitNN in {split.min():.0f} to {split.max():.0f} (the seeds' communication claim "
                     "holds).")
    values = sorted(summary[summary["axis"] == "aligned"]["value"].unique(), key=float)
    small = values[0] if values else None
    if small is not None:
        apc, apc_sd = cell(summary, metric, "aligned", small, "active_only", "apc_vfl")
        local, local_sd = cell(summary, metric, "aligned", small, "active_only", "local")
        if not math.isnan(apc) and not math.isnan(local):
            gain = (apc - local) if higher else (local - apc)
            verdict = "ahead of" if gain > max(apc_sd, local_sd) else "not clearly ahead of" if gain > -max(
                apc_sd, local_sd) else "behind"
            lines.append(f"APC-VFL's claim (active-only inference helps people partners never saw): with "
                         f"{float(small):.0%} shared, scoring people only the active party holds, APC-VFL "
                         f"{fmt(apc)} ± {fmt(apc_sd)} against Local {fmt(local)} ± {fmt(local_sd)}: {verdict} Local.")
    full = values[-1] if values else None
    if full is not None:
        rap, rap_sd = cell(summary, metric, "aligned", full, "aligned", "rap")
        central, _ = cell(summary, metric, "aligned", full, "aligned", "centralized")
        if not math.isnan(rap) and not math.isnan(central):
            behind = (central < rap) if higher else (central > rap)
            caveat = (" The oracle is behind RAP here: Centralized's default model is linear (logistic or ridge "
                      "regression) and RAP's server here trains an MLP, so on this data it is no upper bound; give "
                      "it model = 'mlp' for one." if behind else "")
            lines.append(f"RAP's claim (close to the centralised model): at {float(full):.0%} shared, RAP {fmt(rap)} "
                         f"± {fmt(rap_sd)} against Centralized (oracle) {fmt(central)}.{caveat}")
        split_m, split_sd = cell(summary, metric, "aligned", full, "aligned", "splitnn")
        local_m, _ = cell(summary, metric, "aligned", full, "aligned", "local")
        if not math.isnan(split_m) and not math.isnan(local_m):
            pays = (split_m - local_m) * (1 if higher else -1) > split_sd
            lines.append(f"With everyone shared, SplitNN {fmt(split_m)} ± {fmt(split_sd)} against Local "
                         f"{fmt(local_m)}: {'federating pays' if pays else 'the partner adds little here'}.")
    return lines


def rerender(folder: Path, name: str) -> Path:
    """The run's report.html drawn again by this code's report writer, from the run's own results (no method
    runs again), so the screenshot shows the report as `vflo compare` writes it now."""
    from vflo.experiments.compare import Comparison, load_compare, summary
    from vflo.experiments.compare_report import render_html
    from vflo.experiments.config import parse_config

    raw = tomllib.loads((ROOT / "configs" / "compare" / f"{name}.toml").read_text())
    base, settings = load_compare(raw)
    probe = parse_config({**base, "scenario": {"parties": [{"name": "a", "role": "active", "share": 1.0}]},
                          "methods": [{"name": "local"}]})
    dataset = probe.load_dataset()  # the data directory as vflo finds it ($VFLO_DATA_DIR, ~/.vflo/data)
    meta = json.loads((folder / "results.json").read_text())
    comparison = Comparison(name=meta["name"], dataset=dataset, task=meta["task"],  # type: ignore[arg-type]
                            metric=meta["metric"], rows=pd.DataFrame(meta["rows"]), skipped=meta["skipped"],
                            seconds=meta["seconds"], settings=settings)
    out = folder / "report.html"
    out.write_text(render_html(comparison, summary(comparison)))
    return out


def screenshot(report: Path, out: Path) -> bool:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        return False
    subprocess.run([browser, "--headless=new", "--no-sandbox", "--disable-gpu", f"--screenshot={out}",
                    "--window-size=1100,1500", report.resolve().as_uri()], capture_output=True, timeout=120,
                   check=True)
    return out.is_file()


def render(data: dict[str, dict[str, Any]], shot: bool) -> str:
    lines = ["# Which method for my data?", "",
             "Generated by `python -m benchmarks.compare_docs` from `vflo compare` runs of the configs in "
             "`configs/compare/` (nothing typed by hand). Each dataset varies one thing at a time around a base "
             "scenario: the share of the active party's people its partner also holds, the number of partners, "
             "and how the columns are split; and it scores people every party holds and people only the active "
             "party holds. The full tables and plots are in each run's `report.html`.", ""]
    if shot:
        lines += ["![vflo compare's report for Breast Cancer, in a browser](comparison.png)", ""]
    for name, d in data.items():
        meta, summary = d["meta"], d["summary"]
        metric = meta["metric"]
        higher = metric not in ("rmse", "mae")
        label = meta["dataset"] + (" — **stand-in data, generated**" if meta.get("standin") else "")
        lines += [f"## {label}", "",
                  f"`configs/compare/{name}.toml`: {len(meta['rows'])} method runs in {meta['seconds'] / 60:.1f} min "
                  f"on this machine ({metric}; {'higher' if higher else 'lower'} is better).", "",
                  "| varied | value | people scored | test rows | best deployable method | " + metric +
                  " | within its spread |", "|---|---|---|---|---|---|---|"]
        for _, r in which(summary, metric).iterrows():
            lines.append(f"| {r['axis']} | {r['value']} | {r['scored']} | {fmt(r['test_rows'], 0)} | {r['best']} | "
                         f"{fmt(r['score'])} | {r['ties'] or '-'} |")
        lines += ["", *(f"- {c}" for c in claims(name, d))]
        share = time_share(d["rows"])
        if share:
            lines.append("- Each method's share of the time: " + share + ".")
        lines.append("")
        skipped = meta.get("skipped", {})
        if skipped:
            lines += ["Did not run: " + "; ".join(f"{k}: {v}" for k, v in sorted(skipped.items())), ""]
    missing = [name for name in ORDER if name not in data]
    if missing:
        lines += ["## Not run for this page", "",
                  "No `vflo compare` results were found for "
                  + ", ".join(f"`configs/compare/{m}.toml`" for m in missing)
                  + "; run them as above and generate this page again.", ""]
    return "\n".join(lines)


def time_share(rows: pd.DataFrame) -> str:
    """Each method's wall time summed over the comparison's runs, as a share of all of them."""
    if "wall_seconds" not in rows or rows.empty:
        return ""
    if "status" in rows:
        rows = rows[rows["status"] == "ok"]
    seconds = rows.groupby("method")["wall_seconds"].sum().sort_values(ascending=False)
    total = float(seconds.sum())
    if total <= 0:
        return ""
    return ", ".join(f"{m} {s / total:.0%} ({s:.0f} s)" for m, s in seconds.items())


def link_section(path: Path) -> list[str]:
    """Time to a model over loopback, a LAN and a WAN (benchmarks/link.py), beside in-process training."""
    if not path.is_file():
        return ["## Time over a real link", "", f"No `{path.name}` from `python -m benchmarks.link`; run it and "
                "generate this page again.", ""]
    data = json.loads(path.read_text())
    links = data["links"]
    inproc = data.get("in_process", {})
    names = list(next(iter(links.values()))["methods"])
    lines = ["## Time over a real link", "",
             f"`python -m benchmarks.link`: Credit, APC-VFL's partition (10,000 shared rows), {data['epochs']} epochs "
             "of every network, the passive party its own process over gRPC with mutual TLS, reached directly "
             "(loopback) or through `benchmarks/link_proxy.py`, which delays and rate-limits the bytes (this "
             "kernel has no netem). Seconds to a trained model; in brackets a *model* of that time from the "
             "ledger (loopback time + round trips x RTT + bytes / bandwidth), not a measurement.", "",
             "| method | rounds | MB | in process | " + " | ".join(links) + " |",
             "|---|---|---|---|" + "---|" * len(links)]
    for name in names:
        first = next(iter(links.values()))["methods"][name]
        cells = []
        for entry in links.values():
            row = entry["methods"][name]
            model = f" [{row['model_seconds']:.1f}]" if "model_seconds" in row else ""
            cells.append(f"{row['fit_seconds']:.1f}{model}")
        here = inproc.get(name, {}).get("fit_seconds")
        lines.append(f"| {name} | {first['rounds'] + first['align_rounds']} | "
                     f"{(first['bytes'] + first['align_bytes']) / 1e6:.1f} | {fmt(here, 1) if here else '-'} | "
                     + " | ".join(cells) + " |")
    lines += ["", "The ledger counts SplitNN's forward and backward as two rounds a batch, and the model charges a "
              "round trip for each; over the network the gradients travel with the next batch's request (posted "
              "messages) and that request leaves before the active party's optimizer step, so the link waits about "
              "once a batch: where the measured time is below the model, that is why.", ""]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "compare")
    parser.add_argument("--link", type=Path, default=ROOT / "runs" / "bench" / "link.json")
    parser.add_argument("--out", type=Path, default=ROOT / "docs")
    args = parser.parse_args()
    data = load(args.runs)
    if not data:
        raise SystemExit(f"no compare runs under {args.runs}")
    name, first = next(iter(data.items()))
    shot = screenshot(rerender(first["folder"], name), args.out / "comparison.png")
    (args.out / "comparison.md").write_text(render(data, shot) + "\n".join(link_section(args.link)))
    print(f"wrote {args.out / 'comparison.md'} from {len(data)} comparison(s)" + (" and a screenshot" if shot else ""))


if __name__ == "__main__":
    main()
