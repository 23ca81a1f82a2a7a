"""Training from the parties' files at ten million rows: APC-VFL and RAP, time and peak memory per stage.

    python -m benchmarks.train_from_disk [--rows 10000000] [--methods apc_vfl,rap] [--epochs 1]
    python -m benchmarks.train_from_disk --deployed      # each party its own process: every party's peak
    python -m benchmarks.train_from_disk --docs runs/bench/train_from_disk.json runs/bench/train_from_disk_deployed.json

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
import shutil
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

    paths = {name: folder / f"{name}.parquet" for name in ("bank", "shop", "bank_serve", "shop_serve", "bank_test")}
    paths["labels"] = folder / "serve_labels.npy"
    done = folder / "done.json"
    if done.is_file() and json.loads(done.read_text()) == {"rows": rows, "seed": seed, "files": 5}:
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
    pq.write_table(table(ids, bank, bank_cols, y), paths["bank_test"])
    pq.write_table(table(ids, shop, shop_cols, None), paths["shop_serve"])
    np.save(paths["labels"], y)
    done.write_text(json.dumps({"rows": rows, "seed": seed, "files": 5}))
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
    return _result(name, epochs, len(train["bank"]), stamps, sampler, out, labels) | {"peak_gb": _own_peak_gb()}


def _own_peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9  # kB on Linux


def _result(name: str, epochs: int, rows: int, stamps: list[tuple[str, float]], sampler: Sampler, out: Any,
            labels: np.ndarray) -> dict[str, Any]:
    """A run's record: each stage's seconds and peak memory (from the stamps that end them), what was sent, and the
    scores' accuracy and AUC."""
    from vflo.metrics import compute_metrics

    metrics = compute_metrics("binary", labels, out.scores)
    return {"method": name, "rows": rows, "epochs": epochs,
            "stages": [{"stage": stage, "seconds": at - stamps[i][1], "peak_gb": sampler.peak(stamps[i][1], at)}
                       for i, (stage, at) in enumerate(stamps[1:])],
            "total_seconds": stamps[-1][1] - stamps[0][1], "bytes": out.fit_summary.bytes,
            "accuracy": metrics["accuracy"], "auc": metrics.get("roc_auc")}


def _configs(work: Path, paths: dict[str, Path], rows: int, spill: Path, epochs: int) -> Path:
    """PARTY.toml for the shop and RAP's server, and the bank's deploy.toml, over mutual TLS on loopback; every
    party's own [policy] max_rows, max_message_bytes and [spill] as in one process."""
    from vflo.comm.local_ports import free_port
    from vflo.comm.tls import init_certs

    init_certs(work / "certs", ["bank", "shop", "server"])
    ports = {name: free_port() for name in ("bank", "shop", "server")}
    # Plain alignment, as the figures in docs/deploy.md were measured: each party's config accepts it by name.
    own = (f'max_message_bytes = {MESSAGE_BYTES}\n[policy]\nalignment = "plain"\nmax_rows = {2 * rows}\n'
           '[spill]\nlimit_mb = 1024\n'
           f'folder = "{spill}"\n[tls]\ndir = "certs"\n')
    bank = f'bank = {{ address = "127.0.0.1:{ports["bank"]}", role = "active" }}\n'
    (work / "shop.toml").write_text(
        f'name = "shop"\nrole = "passive"\nlisten = "127.0.0.1:{ports["shop"]}"\naudit_log = ""\nalignments = ""\n'
        f'{own}[data]\nfile = "{paths["shop"]}"\nserve_file = "{paths["shop_serve"]}"\nid_column = "id"\n'
        f'[peers]\n{bank}server = {{ address = "127.0.0.1:{ports["server"]}", role = "server" }}\n'
        # The shop trains its own encoder by its own settings (else APC-VFL's defaults: 200 epochs of 128 rows).
        f'[methods.apc_vfl]\ntrain = {{ batch_size = 4096, max_epochs = {epochs}, patience = 0 }}\n')
    (work / "server.toml").write_text(
        f'name = "server"\nrole = "server"\nlisten = "127.0.0.1:{ports["server"]}"\naudit_log = ""\n'
        f'alignments = ""\n{own}[peers]\n{bank}shop = {{ address = "127.0.0.1:{ports["shop"]}", role = "passive" }}\n')
    own_active = own.replace("[policy]", "[active.policy]").replace("[spill]", "[active.spill]").replace(
        "[tls]", "[active.tls]")
    (work / "deploy.toml").write_text(
        f'test_file = "{paths["bank_test"]}"\n[active]\nname = "bank"\nlisten = "127.0.0.1:{ports["bank"]}"\n'
        f'audit_log = ""\nalignments = ""\n{own_active}[active.data]\nfile = "{paths["bank"]}"\nid_column = "id"\n'
        f'label_column = "default"\n'
        f'[[parties]]\nname = "shop"\nrole = "passive"\naddress = "127.0.0.1:{ports["shop"]}"\n'
        f'[[parties]]\nname = "server"\nrole = "server"\naddress = "127.0.0.1:{ports["server"]}"\n')
    return work / "deploy.toml"


def _serve(work: Path, name: str) -> subprocess.Popen[bytes]:
    """``vflo party serve NAME.toml`` under GNU time (its peak resident memory in NAME.peak, its output in
    NAME.log), once it listens."""
    vflo_bin = str(Path(sys.executable).parent / "vflo")
    log = work / f"{name}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(["/usr/bin/time", "-f", "%M", "-o", f"{name}.peak", vflo_bin, "party", "serve",
                                    f"{name}.toml"], cwd=work, stdout=out, stderr=subprocess.STDOUT,
                                   env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")})
    deadline = time.monotonic() + 120
    while "listening on" not in log.read_text(errors="replace"):
        if time.monotonic() > deadline or process.poll() is not None:
            raise RuntimeError(f"party {name} did not start: {log.read_text(errors='replace')}")
        time.sleep(0.2)
    return process


def _stop(work: Path, name: str, process: subprocess.Popen[bytes]) -> float:
    """Stop a party (the process GNU time runs) and return its peak resident memory in GB."""
    children = Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split()
    for child_pid in children:
        os.kill(int(child_pid), 15)
    process.wait(timeout=60)
    return int((work / f"{name}.peak").read_text().split()[-1]) * 1024 / 1e9


def deployed(name: str, paths: dict[str, Path], epochs: int, work: Path) -> dict[str, Any]:
    """One method with each party its own process over gRPC and mutual TLS (this process the bank): the bank's
    stages as in one process, and every party's peak resident memory."""
    from vflo.align.engines import AlignmentConfig
    from vflo.deploy import Deployment, load_deploy_config

    shutil.rmtree(work, ignore_errors=True)  # a run's certificates and configs are its own
    work.mkdir(parents=True)
    paths = {k: v.resolve() for k, v in paths.items()}  # the configs name them from their own folder
    rows = _rows(paths["bank"])
    deploy = _configs(work, paths, rows, (work / "spill").resolve(), epochs)
    served: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for partner in ["shop", "server"] if name == "rap" else ["shop"]:
            served[partner] = _serve(work, partner)
        sampler = Sampler()
        stamps: list[tuple[str, float]] = [("start", time.perf_counter())]
        deployment = Deployment(load_deploy_config(deploy))
        stamps.append(("read, encode and standardise the bank's files", time.perf_counter()))
        method = method_of(name, epochs)
        out = deployment.run(method, seed=0, alignment=AlignmentConfig(method="plain"))
        done = time.perf_counter()
        stamps += list(getattr(method, "stamps_", [])[1:])
        stamps.append(("classifier" if name == "apc_vfl" else "fit", done - out.predict_seconds))
        stamps.append(("score the 100,000 new people", done))
        sampler.stop()
    finally:
        peaks = {p: _stop(work, p, process) for p, process in served.items()}
    return _result(name, epochs, rows, stamps, sampler, out, np.load(paths["labels"])) | {
        "deployed": True, "party_peak_gb": {"bank": _own_peak_gb(), **peaks}}


def _rows(path: Path) -> int:
    import pyarrow.parquet as pq

    return int(pq.ParquetFile(path).metadata.num_rows)


def docs(paths: list[Path], page: Path) -> None:
    """Results files (in one process, deployed) as tables in ``page``, between its markers."""
    lines: list[str] = []
    for path in paths:
        results = json.loads(path.read_text())
        where = results.get("deployed", False)
        lines += [f"Measured by `python -m benchmarks.train_from_disk --rows {results['rows']} --epochs "
                  f"{results['epochs']}{' --deployed' if where else ''}` on this project's machine "
                  f"({results['machine']}): two parties' Parquet files of {results['rows']:,} people each (a "
                  f"generated stand-in: 12 columns each, text IDs), {results['rows'] // 2:,} of them shared, one "
                  f"epoch of each network on batches of 4,096, then {SERVE_ROWS:,} new people scored. "
                  + ("Each party its own process over gRPC and mutual TLS on loopback, plain alignment; a party's "
                     "peak is its process's (GNU time); the stages are the bank's, the coordinating party's. "
                     if where else
                     "Every party in one process (the in-process federation), so a party's own peak is at most the "
                     "process's. ")
                  + "Every matrix over 1 GB was kept on disk (`[spill] limit_mb = 1024`); each party's `[policy] "
                  "max_rows` was raised to its rows and `max_message_bytes` to 1 GB (RAP sends each party's rows "
                  "in one message).", ""]
        for run in results["runs"]:
            peaks = run.get("party_peak_gb")
            memory = (", ".join(f"{p} {gb:.2f} GB" for p, gb in peaks.items()) if peaks
                      else f"{run['peak_gb']:.2f} GB (the process)")
            lines += [f"**{run['method']}**: {run['total_seconds'] / 60:.1f} min in all; peak resident memory "
                      f"{memory}; {run['bytes'] / 1e9:.2f} GB sent; accuracy {run['accuracy']:.3f}"
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
    parser.add_argument("--deployed", action="store_true", help="each party its own process over gRPC and mutual "
                                                                "TLS: every party's peak memory")
    parser.add_argument("--docs", type=Path, nargs="+", help="write these results files' tables (in one process, "
                                                             "deployed) into docs/deploy.md")
    args = parser.parse_args(argv)
    if args.docs is not None:
        docs(args.docs, Path("docs/deploy.md"))
        return 0
    folder = args.work / f"rows{args.rows}"
    if args.deployed and args.out == Path("runs/bench/train_from_disk.json"):
        args.out = Path("runs/bench/train_from_disk_deployed.json")
    if args.child:
        paths = write_files(folder, args.rows, args.seed)
        result = (deployed(args.child, paths, args.epochs, args.work / f"deployed_{args.child}") if args.deployed
                  else child(args.child, paths, args.epochs, args.work / "spill"))
        (folder / f"{args.child}{'_deployed' if args.deployed else ''}.json").write_text(json.dumps(result, indent=1))
        return 0
    started = time.perf_counter()
    write_files(folder, args.rows, args.seed)
    print(f"files ready in {time.perf_counter() - started:.0f} s", flush=True)
    results: dict[str, Any] = {"rows": args.rows, "epochs": args.epochs, "machine": f"{os.cpu_count()} cores",
                               "deployed": args.deployed, "runs": []}
    for name in args.methods.split(","):
        subprocess.run([sys.executable, "-m", "benchmarks.train_from_disk", "--child", name, "--rows", str(args.rows),
                        "--epochs", str(args.epochs), "--seed", str(args.seed), "--work", str(args.work),
                        *(["--deployed"] if args.deployed else [])],
                       check=True, env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")})
        results["runs"].append(json.loads((folder / f"{name}{'_deployed' if args.deployed else ''}.json").read_text()))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1))  # partial results as each method finishes
        print(json.dumps(results["runs"][-1], indent=1), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
