"""Training from the parties' files at ten million rows: APC-VFL and RAP, time and peak memory per stage.

    python -m benchmarks.train_from_disk [--rows 10000000] [--methods apc_vfl,rap] [--epochs 1]
    python -m benchmarks.train_from_disk --docs runs/bench/train_from_disk.json

Two parties' Parquet files, generated here (a labelled stand-in, not a real dataset): the active party ("bank")
and its partner ("shop") hold ``--rows`` people each, half of them shared, 12 columns each and text IDs, plus a file
each of 100,000 new shared people to score. Each method runs in a fresh process holding both parties (the
in-process federation, plain alignment): the files are read a column at a time (:class:`vflo.data.files.ColumnFile`),
standardised in blocks, and every intermediate over 1 GB is kept on disk (:mod:`vflo.spill`). A thread samples the
process's resident memory every 20 ms; each stage's peak is the highest sample in it. Both parties share the
process, so a party's own peak is at most the process's. Results are written as each method finishes.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.marked import write_marked

MARK_BEGIN, MARK_END = "<!-- train-from-disk:begin -->", "<!-- train-from-disk:end -->"
FEATURES = 12
LATENT = 8
SERVE_ROWS = 100_000
CHUNK = 1_000_000
MESSAGE_BYTES = 1 << 30


def _rss_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Sampler:
    """The process's resident memory every ``every`` seconds, with the time of each sample."""

    def __init__(self, every: float = 0.02) -> None:
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every,), daemon=True)
        self._thread.start()

    def _run(self, every: float) -> None:
        while not self._stop.is_set():
            self.samples.append((time.perf_counter(), _rss_bytes()))
            self._stop.wait(every)

    def peak(self, start: float, stop: float) -> float:
        inside = [rss for t, rss in self.samples if start <= t <= stop]
        return max(inside, default=_rss_bytes()) / 1e9

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def _people(first: int, stop: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """People ``first`` to ``stop`` (global numbers): text IDs, the bank's and the shop's columns, labels. Each
    half of a person's latent factors shows mostly in one party's columns; the label depends on all of them."""
    rng = np.random.default_rng([seed, first])
    n = stop - first
    z = rng.standard_normal((n, LATENT))
    mix = np.random.default_rng([seed, 0xBEEF])
    w_bank = mix.standard_normal((LATENT, FEATURES)) * np.repeat([1.0, 0.2], LATENT // 2)[:, None]
    w_shop = mix.standard_normal((LATENT, FEATURES)) * np.repeat([0.2, 1.0], LATENT // 2)[:, None]
    beta = mix.standard_normal(LATENT)
    bank = (z @ w_bank + 0.5 * rng.standard_normal((n, FEATURES))).astype(np.float32)
    shop = (z @ w_shop + 0.5 * rng.standard_normal((n, FEATURES))).astype(np.float32)
    y = (np.tanh(z) @ beta + 0.5 * rng.standard_normal(n) > 0).astype(np.int64)
    ids = np.char.add("u", np.char.zfill(np.arange(first, stop).astype(str), 10))
    return ids, bank, shop, y


def write_files(folder: Path, rows: int, seed: int) -> dict[str, Path]:
    """The four files (kept between runs of the same size): the bank holds people 0 .. rows-1, the shop
    rows/2 .. 3 rows/2 - 1; the people to score are numbered from 2 rows, held by both."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    paths = {name: folder / f"{name}.parquet" for name in ("bank", "shop", "bank_serve", "shop_serve")}
    paths["labels"] = folder / "serve_labels.npy"
    done = folder / "done.json"
    if done.is_file() and json.loads(done.read_text()) == {"rows": rows, "seed": seed}:
        return paths
    folder.mkdir(parents=True, exist_ok=True)
    bank_cols = [f"b{i:02d}" for i in range(FEATURES)]
    shop_cols = [f"s{i:02d}" for i in range(FEATURES)]

    def table(ids: np.ndarray, X: np.ndarray, cols: list[str], y: np.ndarray | None) -> pa.Table:
        arrays = {"id": pa.array(ids), **{c: X[:, i] for i, c in enumerate(cols)}}
        if y is not None:
            arrays["default"] = y
        return pa.table(arrays)

    writers: dict[str, Any] = {}
    try:
        for first in range(0, rows * 3 // 2, CHUNK):
            stop = min(first + CHUNK, rows * 3 // 2)
            ids, bank, shop, y = _people(first, stop, seed)
            for name, keep, X, cols, labels in (("bank", np.arange(first, stop) < rows, bank, bank_cols, y),
                                                ("shop", np.arange(first, stop) >= rows // 2, shop, shop_cols, None)):
                if keep.any():
                    t = table(ids[keep], X[keep], cols, None if labels is None else labels[keep])
                    if name not in writers:
                        writers[name] = pq.ParquetWriter(paths[name], t.schema)
                    writers[name].write_table(t)
    finally:
        for w in writers.values():
            w.close()
    ids, bank, shop, y = _people(2 * rows, 2 * rows + SERVE_ROWS, seed)
    pq.write_table(table(ids, bank, bank_cols, None), paths["bank_serve"])
    pq.write_table(table(ids, shop, shop_cols, None), paths["shop_serve"])
    np.save(paths["labels"], y)
    done.write_text(json.dumps({"rows": rows, "seed": seed}))
    return paths


def method_of(name: str, epochs: int) -> Any:
    from vflo.methods.registry import get_method

    fast = {"batch_size": 4096, "max_epochs": epochs, "patience": 0}
    if name == "apc_vfl":
        return get_method("apc_vfl")(train=fast, classifier={"model": "mlp", "hidden": [], "train": fast})
    if name == "rap":
        return get_method("rap")(estimator={"model": "mlp", "hidden": [128], "train": {
            **fast, "validation_fraction": 0.125, "stop": "plateau", "plateau": 1e-4}})
    if name == "splitnn":
        return get_method("splitnn")(train=fast)
    raise SystemExit(f"unknown method {name!r}: apc_vfl, rap or splitnn")


def child(name: str, paths: dict[str, Path], epochs: int, spill: Path) -> dict[str, Any]:
    """One method from the files, in this process: every stage's seconds and peak resident memory."""
    from vflo.data.layout import FederatedData
    from vflo.data.partydata import PartyData
    from vflo.data.preprocessing import Standardizer
    from vflo.federation.simulation import run_method
    from vflo.metrics import compute_metrics
    from vflo.party.policy import Policy
    from vflo.roles import PartyInfo
    from vflo.spill import SpillConfig, configure

    configure(SpillConfig(limit_mb=1024, folder=str(spill)))
    sampler = Sampler()
    stamps: list[tuple[str, float]] = [("start", time.perf_counter())]

    def lap(stage: str) -> None:
        stamps.append((stage, time.perf_counter()))

    train = {"bank": PartyData.from_file(paths["bank"], party="bank", id_column="id", label_column="default"),
             "shop": PartyData.from_file(paths["shop"], party="shop", id_column="id")}
    serve = {"bank": PartyData.from_file(paths["bank_serve"], party="bank", id_column="id"),
             "shop": PartyData.from_file(paths["shop_serve"], party="shop", id_column="id")}
    lap("read and encode the files (both parties)")
    scalers = {p: Standardizer.for_party(d) for p, d in train.items()}
    train = {p: scalers[p].apply(d) for p, d in train.items()}
    serve = {p: scalers[p].apply(d) for p, d in serve.items()}
    lap("standardise (both parties)")
    labels = np.load(paths["labels"])
    data = FederatedData(parties=(PartyInfo("bank", "active"), PartyInfo("shop", "passive")), train=train,
                         serve=serve, test_ids=serve["bank"].ids, test_y=labels, task="binary", n_classes=2,
                         oracle=None, scalers=scalers)
    method = method_of(name, epochs)
    fitted: list[float] = []
    # Each party's policy takes requests as large as its rows (the default bound is 1,000,000 rows a request).
    bound = Policy(max_rows=2 * len(train["bank"]))
    policies = {"bank": bound, "shop": bound, "server": bound}  # RAP's server is a party too
    # RAP sends each party's rows in one message (285 MB at 5,000,000 shared rows): over the default 256 MB.
    out = run_method(method, data, seed=0, policies=policies, max_message_bytes=MESSAGE_BYTES,
                     on_fitted=lambda fed: fitted.append(time.perf_counter()))
    done = time.perf_counter()
    for stage, at in getattr(method, "stamps_", [])[1:]:
        stamps.append((stage, at))
    stamps.append(("classifier" if name == "apc_vfl" else "fit (projection, the one round, the server's training)"
                   if name == "rap" else "fit", fitted[0]))
    stamps.append(("score the 100,000 new people", done))
    sampler.stop()
    stages = [{"stage": stage, "seconds": at - stamps[i][1], "peak_gb": sampler.peak(stamps[i][1], at)}
              for i, (stage, at) in enumerate(stamps[1:])]
    metrics = compute_metrics("binary", labels, out.scores)
    return {"method": name, "rows": len(train["bank"]), "epochs": epochs, "stages": stages,
            "total_seconds": done - stamps[0][1],
            "peak_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9,  # kB on Linux
            "bytes": out.fit_summary.bytes, "accuracy": metrics["accuracy"], "auc": metrics.get("roc_auc")}


def docs(path: Path, page: Path) -> None:
    """The results file as tables in ``page``, between its markers."""
    results = json.loads(path.read_text())
    lines = [f"Measured by `python -m benchmarks.train_from_disk --rows {results['rows']} --epochs "
             f"{results['epochs']}` on this project's machine ({results['machine']}): two parties' Parquet files of "
             f"{results['rows']:,} people each (a generated stand-in: 12 columns each, text IDs), "
             f"{results['rows'] // 2:,} of them shared, then {SERVE_ROWS:,} new people scored. Both parties in one "
             "process, so each party's peak is at most the process's; every matrix over 1 GB was kept on disk "
             "(`[spill] limit_mb = 1024`); the parties' `[policy] max_rows` was raised to their rows and "
             "`max_message_bytes` to 1 GB (RAP sends each party's rows in one message).", ""]
    for run in results["runs"]:
        lines += [f"**{run['method']}**: {run['total_seconds'] / 60:.1f} min in all, peak resident memory "
                  f"{run['peak_gb']:.2f} GB, {run['bytes'] / 1e9:.2f} GB sent, accuracy {run['accuracy']:.3f}"
                  + (f", AUC {run['auc']:.3f}" if run.get("auc") is not None else "") + ".", "",
                  "| stage | seconds | peak memory, GB |", "|---|---|---|"]
        lines += [f"| {s['stage']} | {s['seconds']:.1f} | {s['peak_gb']:.2f} |" for s in run["stages"]]
        lines.append("")
    write_marked(page, MARK_BEGIN, MARK_END, lines[:-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--methods", default="apc_vfl,rap")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=Path("runs/bench/train_from_disk"))
    parser.add_argument("--out", type=Path, default=Path("runs/bench/train_from_disk.json"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--docs", type=Path, help="write this results file's tables into docs/deploy.md")
    args = parser.parse_args(argv)
    if args.docs is not None:
        docs(args.docs, Path("docs/deploy.md"))
        return 0
    folder = args.work / f"rows{args.rows}"
    if args.child:
        paths = write_files(folder, args.rows, args.seed)
        result = child(args.child, paths, args.epochs, args.work / "spill")
        (folder / f"{args.child}.json").write_text(json.dumps(result, indent=1))
        return 0
    started = time.perf_counter()
    write_files(folder, args.rows, args.seed)
    print(f"files ready in {time.perf_counter() - started:.0f} s", flush=True)
    results: dict[str, Any] = {"rows": args.rows, "epochs": args.epochs, "machine": f"{os.cpu_count()} cores",
                               "runs": []}
    for name in args.methods.split(","):
        subprocess.run([sys.executable, "-m", "benchmarks.train_from_disk", "--child", name, "--rows", str(args.rows),
                        "--epochs", str(args.epochs), "--seed", str(args.seed), "--work", str(args.work)],
                       check=True, env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")})
        results["runs"].append(json.loads((folder / f"{name}.json").read_text()))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1))  # partial results as each method finishes
        print(json.dumps(results["runs"][-1], indent=1), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
