"""docs/comparison.md (and the screenshot docs/comparison.png), generated from the runs of ``vflo compare`` on
the committed configs in configs/compare/ (no figure typed by hand).

    for c in breast_cancer wine digits ...; do vflo compare configs/compare/$c.toml --out runs/compare/$c; done
    python -m benchmarks.link --data-dir ../shared/datasets      # optional: time over a LAN and a WAN
    python -m benchmarks.apc_vfl_overhead --data-dir ../shared/datasets   # optional: APC-VFL against a plain loop
    python -m benchmarks.compare_docs [--runs runs/compare] [--link runs/bench/link.json] [--out docs]

Each dataset's section, and the link and overhead sections, stand behind a ``<!-- section: NAME -->`` marker and
name the commit of the code that ran them (``runs/compare/NAME.commit``, written by ``benchmarks.compare_all``). A
dataset with no run here keeps its section from the page as it stands, so the eight datasets (hours) can be re-run
a few at a time; ``python -m benchmarks.freshness`` names any section whose runs recorded no commit.
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

from benchmarks.freshness import sections
from vflo.experiments.compare import summary, which_method
from vflo.experiments.compare_report import claims as compare_claims
from vflo.experiments.compare_report import not_run

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
            ran, paused = runs / f"{name}.commit", runs / f"{name}.paused"
            out[name] = {"meta": meta, "summary": table, "rows": rows, "folder": folder,
                         "commit": ran.read_text().strip() if ran.is_file() else None,
                         "paused": float(paused.read_text()) if paused.is_file() else 0.0}
    return out


def marker(name: str) -> str:
    return f"<!-- section: {name} -->"


def kept(page: Path) -> dict[str, list[str]]:
    """The sections of the page as it stands (none where there is no page), each as lines without its marker."""
    if not page.is_file():
        return {}
    return {name: body.strip("\n").split("\n") for name, body in sections(page.read_text()).items()}


def paused_note(seconds: float) -> str:
    """A run stopped for a while (SIGSTOP, to free the machine: ``runs/compare/NAME.paused`` holds the seconds, as
    timed by whoever paused it) is timed without that while, and says so."""
    return f" (not counting about {seconds / 60:.0f} min it was paused)" if seconds > 0 else ""


def provenance(data: dict[str, Any]) -> str:
    ran = data.get("commit")
    return f"runs of the code of commit `{ran}`" if ran else "runs of code whose commit was not recorded"


def which(data: dict[str, Any]) -> pd.DataFrame:
    """vflo compare's own "which method when" rule (paired test over the repeats), on the runs' rows."""
    metric = data["meta"]["metric"]
    table = which_method(SimpleNamespace(metric=metric, rows=data["rows"]), data["summary"])  # type: ignore[arg-type]
    return table.rename(columns={metric: "score"})


def fmt(v: float, d: int = 3) -> str:
    return "-" if v is None or math.isnan(v) else f"{v:.{d}f}"


def claims(data: dict[str, Any]) -> list[str]:
    """vflo compare's own claim sentences, computed from the runs' rows by the same paired test."""
    # A comparison on the parties' own files (``own``) states no paper claims; these runs are of one dataset.
    run = SimpleNamespace(rows=data["rows"], metric=data["meta"]["metric"], own=data["meta"].get("own"))
    return compare_claims(run)  # type: ignore[arg-type]


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
                            seconds=meta["seconds"], settings=settings, test_people=int(meta.get("test_people", 0)),
                            second_hop_settings=meta.get("second_hop_settings", {}))
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


def render(data: dict[str, dict[str, Any]], image: str | None, before: dict[str, list[str]] | None = None) -> str:
    """The page: a section per dataset from its runs here, else as ``before`` held it (the page as it stood);
    ``image`` the screenshot's line, if there is one."""
    before = before or {}
    lines = ["# Which method for my data?", "",
             "Generated by `python -m benchmarks.compare_docs` from `vflo compare` runs of the configs in "
             "`configs/compare/` (nothing typed by hand). Each dataset varies one thing at a time around a base "
             "scenario: the share of the active party's people its partner also holds, the number of partners, "
             "how the columns are split, and a second-hop party (sharing people with the first partner only); "
             "and it scores people every party holds and people only the active party holds: the same held-out "
             "test people in every cell and repeat. The full tables and plots are in each run's `report.html`.", ""]
    if image:
        lines += [image, ""]
    for name in ORDER:
        if name not in data:
            if name in before:
                lines += [marker(name), *before[name], ""]
            continue
        d = data[name]
        meta = d["meta"]
        metric = meta["metric"]
        higher = metric not in ("rmse", "mae")
        label = meta["dataset"] + (" — **stand-in data, generated**" if meta.get("standin") else "")
        lines += [marker(name), f"## {label}", "",
                  f"`configs/compare/{name}.toml`, {provenance(d)}: {len(meta['rows'])} method runs in "
                  f"{(meta['seconds'] - d['paused']) / 60:.1f} min on this machine{paused_note(d['paused'])} "
                  f"({metric}; "
                  f"{'higher' if higher else 'lower'} is better); "
                  f"{meta.get('test_people', '?')} test people of each kind, the same in every cell and repeat"
                  f"{fewer(name, meta)}; ties: a paired t-test over the repeats cannot tell them from the best.", "",
                  "| varied | value | people scored | test rows | best deployable method | " + metric +
                  " | within its spread |", "|---|---|---|---|---|---|---|"]
        for _, r in which(d).iterrows():
            lines.append(f"| {r['axis']} | {r['value']} | {r['scored']} | {fmt(r['test_rows'], 0)} | {r['best']} | "
                         f"{fmt(r['score'])} | {r['ties'] or '-'} |")
        lines += ["", *(f"- {c}" for c in claims(d))]
        share = time_share(d["rows"])
        if share:
            lines.append("- Each method's share of the time: " + share + ".")
        lines.append("")
        if "scored" in d["rows"] and not (d["rows"]["scored"] == "missing").any():
            lines += ["No missing-partner cells (p_miss, absent) in this run: it predates them; `vflo compare` on "
                      f"`configs/compare/{name}.toml` now adds them.", ""]
        skipped = meta.get("skipped", {})
        if skipped:
            lines += ["Did not run:", "", "| methods | cells | why |", "|---|---|---|",
                      *(f"| {m} | {c} | {w} |" for m, c, w in not_run(skipped)), ""]
    missing = [name for name in ORDER if name not in data and name not in before]
    if missing:
        lines += ["## Not run for this page", "",
                  "No `vflo compare` results were found for "
                  + ", ".join(f"`configs/compare/{m}.toml`" for m in missing)
                  + "; run them as above and generate this page again.", ""]
    return "\n".join(lines)


def fewer(name: str, meta: dict[str, Any]) -> str:
    """Why a comparison holds out fewer test people than its config asks for, if it does."""
    from vflo.experiments.compare import load_compare

    _, settings = load_compare(tomllib.loads((ROOT / "configs" / "compare" / f"{name}.toml").read_text()))
    people = int(meta.get("test_people", settings.test_rows))
    if people >= settings.test_rows:
        return ""
    return (f" (fewer than {settings.test_rows}: each test set takes at most {settings.test_fraction:.0%} of the "
            "dataset's rows, so training keeps the rest)")


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


def ran(data: dict[str, Any]) -> str:
    """Which code a benchmark's results came from."""
    return f"the code of commit `{data['commit']}`" if data.get("commit") else "code whose commit was not recorded"


def link_section(path: Path, before: list[str] | None = None) -> list[str]:
    """Time to a model over loopback, a LAN and a WAN (benchmarks/link.py), beside in-process training; without
    its results here, the section as the page held it (``before``)."""
    if not path.is_file():
        if before:
            return [marker("link"), *before, ""]
        return [marker("link"), "## Time over a real link", "", f"No `{path.name}` from `python -m benchmarks.link`; "
                "run it and generate this page again.", ""]
    data = json.loads(path.read_text())
    links = data["links"]
    inproc = data.get("in_process", {})
    names = list(next(iter(links.values()))["methods"])
    lines = [marker("link"), "## Time over a real link", "",
             f"`python -m benchmarks.link`, {ran(data)}: Credit, APC-VFL's partition (10,000 shared rows), "
             f"{data['epochs']} epochs of every network, the passive party its own process over gRPC with mutual "
             "TLS, reached directly (loopback) or through `benchmarks/link_proxy.py`, which delays and rate-limits "
             "the bytes (this kernel has no netem). Seconds to a trained model; in brackets a *model* of that time "
             "from the ledger (loopback time + round trips x RTT + bytes / bandwidth), not a measurement.", "",
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


def overhead_section(path: Path, before: list[str] | None = None) -> list[str]:
    """APC-VFL against a plain PyTorch loop training the same four networks (benchmarks/apc_vfl_overhead.py);
    without its results here, the section as the page held it (``before``)."""
    title = [marker("overhead"), "## APC-VFL's time against a plain PyTorch loop", ""]
    if not path.is_file():
        if before:
            return [marker("overhead"), *before, ""]
        return [*title, f"No `{path.name}` from `python -m benchmarks.apc_vfl_overhead`; run it and generate this "
                "page again.", ""]
    data = json.loads(path.read_text())
    lines = [*title,
             f"`python -m benchmarks.apc_vfl_overhead`, {ran(data)}: APC-VFL as `vflo run` trains it (in-process "
             "federation, early stopping on a validation share) against a bare loop per network (`randperm` "
             "batches, Adam, the loss, the step; no validation) that trains the same four autoencoders on the same "
             f"rows for exactly the epochs vflo's run took; one PyTorch thread; median of "
             f"{len(data['results'][0]['runs'])} runs.", "",
             "| table | active rows | shared | epochs (g1 A, g1 P, g2, g3) | four networks: vflo / plain | whole fit: "
             "vflo / plain + classifier | vflo's time: steps, validation, snapshots, classifier and rest, data "
             "preparation |", "|---|---|---|---|---|---|---|"]
    for result in data["results"]:
        runs = result["runs"]
        mid = sorted(runs, key=lambda r: r["ratio_networks"])[len(runs) // 2]
        v, plain = mid["vflo"], mid["plain"]
        nets = sum(x for k, x in plain.items() if k not in ("g3_without_distillation", "classifier"))
        inside = v["inside_networks"]
        epochs = ", ".join(str(v["epochs"][k]) for k in ("g1_active", "g1_passive", "g2_joint", "g3_student"))
        lines.append(
            f"| {result['table']} | {v['n_active']} | {v['n_aligned']} | {epochs} | {v['network_seconds']:.1f} s / "
            f"{nets:.1f} s = **{result['median_ratio_networks']:.2f}x** | {v['fit_seconds']:.1f} s / "
            f"{nets + plain['classifier']:.1f} s = {result['median_ratio_fit']:.2f}x | "
            f"{inside.get('training steps', 0):.1f} s, {inside.get('validation passes', 0):.2f} s, "
            f"{inside.get('best-epoch snapshots', 0):.2f} s, {v['classifier_and_rest']:.1f} s, "
            f"{mid['prepare_seconds']:.1f} s |")
    def distillation(result: dict[str, Any]) -> float:
        costs = sorted(x["plain"]["g3_student"] - x["plain"]["g3_without_distillation"] for x in result["runs"])
        return float(costs[len(costs) // 2])

    lines += ["", "The distillation term of the student costs "
              + ", ".join(f"{r['table']}: {distillation(r):+.1f} s" for r in data["results"])
              + " in the plain loop (student with it minus without, median). APC-VFL's time is its four networks' "
              "epochs: it trains four autoencoders to convergence where SplitNN trains one network.", ""]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "compare")
    parser.add_argument("--link", type=Path, default=ROOT / "runs" / "bench" / "link.json")
    parser.add_argument("--overhead", type=Path, default=ROOT / "runs" / "bench" / "apc_vfl_overhead.json")
    parser.add_argument("--out", type=Path, default=ROOT / "docs")
    args = parser.parse_args()
    data = load(args.runs)
    if not data:
        raise SystemExit(f"no compare runs under {args.runs}")
    page = args.out / "comparison.md"
    before = kept(page)
    name, first = next(iter(data.items()))
    image = None
    if screenshot(rerender(first["folder"], name), args.out / "comparison.png"):
        image = f"![vflo compare's report for {first['meta']['dataset']}, in a browser](comparison.png)"
    elif page.is_file():  # no browser here: the screenshot stays as it was, and the line that shows it
        image = next((line for line in page.read_text().splitlines() if line.endswith("](comparison.png)")), None)
    text = render(data, image, before) + "\n".join(
        [*link_section(args.link, before.get("link")), *overhead_section(args.overhead, before.get("overhead"))])
    page.write_text(text)
    again = [n for n in ORDER if n not in data and n in before]
    print(f"wrote {page} from {len(data)} comparison(s)" + (f": {image}" if image else "")
          + (f"; kept as they stood: {', '.join(again)}" if again else ""))


if __name__ == "__main__":
    main()
