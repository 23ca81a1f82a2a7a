"""Private set intersection between two parties that are each their own process, as deployed: time and every
party's peak memory, its PSI library's side process included (benchmark, not a test).

    python -m benchmarks.psi_deployed [--rows 10000000] [--ways rr22,vflo,stream] [--out runs/bench/psi_deployed.json]
    python -m benchmarks.psi_deployed --docs runs/bench/psi_deployed.json   # the table in docs/deploy.md

Two files of ``--rows`` text IDs each (a labelled stand-in: the bank holds people 0 .. rows-1 with a label and one
column, the shop rows/2 .. 3 rows/2 - 1 with one column), kept between runs of the same size. For each way, the
shop serves (``vflo party serve shop.toml``, mutual TLS on loopback) and the bank runs ``vflo align deploy.toml
--fresh`` with that engine (``rr22``: the PSI library's; ``vflo``: vflo's own ECDH with the IDs in memory;
``stream``: ``--stream``, vflo's own ECDH a bucket at a time from disk). The time is the whole command's, from its
start to its end: loading the bank's file, the intersection and keeping its record at both parties. A thread
samples every 100 ms the resident memory of each party's process together with its children (the library's side,
the helper processes that blind IDs); each party's peak is the highest sum it saw, its file loaded included. A
fresh shop serves each way. Results are written after each way.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.marked import write_marked

MARK_BEGIN, MARK_END = "<!-- psi-deployed:begin -->", "<!-- psi-deployed:end -->"
CHUNK = 1_000_000
MESSAGE_BYTES = 1_500_000_000  # vflo's own ECDH sends every blinded point of 10M IDs in one message (320 MB)
STREAM_MB = 256
GOAL_GB = 4.0  # issue 29: PSI of 10M x 10M IDs under 4 GB per party


def write_files(folder: Path, rows: int) -> dict[str, Path]:
    """The two parties' files: text IDs, one column each, the bank's label."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    paths = {name: folder / f"{name}.parquet" for name in ("bank", "shop")}
    done = folder / "done.json"
    if done.is_file() and json.loads(done.read_text()) == {"rows": rows}:
        return paths
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for name, first in (("bank", 0), ("shop", rows // 2)):
        writer = None
        try:
            for start in range(first, first + rows, CHUNK):
                stop = min(start + CHUNK, first + rows)
                ids = np.char.add("u", np.char.zfill(np.arange(start, stop).astype(str), 10))
                columns: dict[str, Any] = {"id": pa.array(ids), "x": rng.standard_normal(stop - start)}
                if name == "bank":
                    columns["default"] = rng.integers(0, 2, stop - start)
                table = pa.table(columns)
                writer = writer or pq.ParquetWriter(paths[name], table.schema)
                writer.write_table(table)
        finally:
            if writer is not None:
                writer.close()
    done.write_text(json.dumps({"rows": rows}))
    return paths


def configs(work: Path, paths: dict[str, Path], rows: int) -> Path:
    """The shop's PARTY.toml and the bank's deploy.toml over mutual TLS on loopback, each keeping its alignments and
    taking requests as large as the IDs."""
    from vflo.comm.local_ports import free_port
    from vflo.comm.tls import init_certs

    init_certs(work / "certs", ["bank", "shop"])
    ports = {name: free_port() for name in ("bank", "shop")}
    own = f"max_message_bytes = {MESSAGE_BYTES}\n[policy]\nmax_rows = {2 * rows}\n[tls]\ndir = \"certs\"\n"
    (work / "shop.toml").write_text(
        f'name = "shop"\nrole = "passive"\nlisten = "127.0.0.1:{ports["shop"]}"\naudit_log = ""\n'
        f'alignments = "shop_alignments"\n{own}[data]\nfile = "{paths["shop"]}"\nid_column = "id"\n'
        f'[peers]\nbank = {{ address = "127.0.0.1:{ports["bank"]}", role = "active" }}\n')
    own_active = own.replace("[policy]", "[active.policy]").replace("[tls]", "[active.tls]")
    (work / "deploy.toml").write_text(
        f'[active]\nname = "bank"\nlisten = "127.0.0.1:{ports["bank"]}"\naudit_log = ""\n'
        f'alignments = "bank_alignments"\n{own_active}[active.data]\nfile = "{paths["bank"]}"\nid_column = "id"\n'
        f'label_column = "default"\n'
        f'[[parties]]\nname = "shop"\nrole = "passive"\naddress = "127.0.0.1:{ports["shop"]}"\n')
    return work / "deploy.toml"


def _tree_rss(root: int) -> tuple[int, int]:
    """Resident bytes of process ``root`` alone, and with all its descendants, now."""
    parent: dict[int, int] = {}
    rss: dict[int, int] = {}
    page = os.sysconf("SC_PAGE_SIZE")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(entry.name)], rss[int(entry.name)] = int(fields[1]), int(fields[21]) * page
    total, frontier = 0, [root]
    while frontier:
        pid = frontier.pop()
        total += rss.get(pid, 0)
        frontier += [child for child, p in parent.items() if p == pid]
    return rss.get(root, 0), total


class TreeSampler:
    """The peak, over samples every ``every`` seconds, of each named process tree's resident memory (``peaks``)
    and of its root process alone (``own``)."""

    def __init__(self, roots: dict[str, int], every: float = 0.1) -> None:
        self.roots = roots
        self.peaks = dict.fromkeys(roots, 0)
        self.own = dict.fromkeys(roots, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every,), daemon=True)
        self._thread.start()

    def _run(self, every: float) -> None:
        while not self._stop.is_set():
            for name, pid in list(self.roots.items()):
                own, tree = _tree_rss(pid)
                self.own[name], self.peaks[name] = max(self.own.get(name, 0), own), max(self.peaks.get(name, 0), tree)
            self._stop.wait(every)

    def stop(self) -> tuple[dict[str, float], dict[str, float]]:
        """Each tree's peak and its root's own, in GB."""
        self._stop.set()
        self._thread.join(timeout=10)
        return ({name: peak / 1e9 for name, peak in self.peaks.items()},
                {name: peak / 1e9 for name, peak in self.own.items()})


def _vflo() -> str:
    return str(Path(sys.executable).parent / "vflo")


def one_way(way: str, paths: dict[str, Path], rows: int, work: Path) -> dict[str, Any]:
    """The shop served afresh, the bank's ``vflo align`` for ``way``: seconds, each party's peak, the output."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    deploy = configs(work, {k: v.resolve() for k, v in paths.items()}, rows)
    log = work / "shop.log"
    with log.open("wb") as out:
        shop = subprocess.Popen([_vflo(), "party", "serve", "shop.toml"], cwd=work, stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        sampler = TreeSampler({"shop": shop.pid})
        deadline = time.monotonic() + 600
        while "listening on" not in log.read_text(errors="replace"):
            if time.monotonic() > deadline or shop.poll() is not None:
                raise RuntimeError(f"the shop did not start: {log.read_text(errors='replace')}")
            time.sleep(0.2)
        args = ["--stream", "--memory-mb", str(STREAM_MB)] if way == "stream" else ["--engine", way, "--fresh"]
        started = time.perf_counter()
        bank = subprocess.Popen([_vflo(), "align", str(deploy.resolve()), *args], cwd=work, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)
        sampler.roots["bank"] = bank.pid
        output, _ = bank.communicate(timeout=3600)
        seconds = time.perf_counter() - started
        peaks, own = sampler.stop()
    finally:
        shop.terminate()
        shop.wait(timeout=60)
    text = output.decode(errors="replace")
    if bank.returncode != 0:
        raise RuntimeError(f"vflo align ({way}) failed:\n{text}\n{log.read_text(errors='replace')[-3000:]}")
    return {"way": way, "rows": rows, "seconds": seconds, "bank_peak_gb": peaks["bank"],
            "shop_peak_gb": peaks["shop"], "bank_own_peak_gb": own["bank"], "shop_own_peak_gb": own["shop"],
            "output": text.strip().splitlines()[-3:]}


NAMES = {"rr22": "the PSI library's RR22 (`--engine rr22`)", "vflo": "vflo's own ECDH, IDs in memory (`--engine vflo`)",
         "stream": f"vflo's own ECDH from disk, a bucket at a time (`--stream --memory-mb {STREAM_MB}`)"}


def docs(path: Path, page: Path) -> None:
    results = json.loads(path.read_text())
    lines = [f"Measured by `python -m benchmarks.psi_deployed --rows {results['rows']}` on this project's machine "
             f"({results['cores']} cores): each party its own process (`vflo party serve` and `vflo align --fresh`, "
             f"mutual TLS on loopback), {results['rows']:,} text IDs each, {results['rows'] - results['rows'] // 2:,} "
             "shared. The time is the whole `vflo align` command (loading the bank's file, the intersection, keeping "
             "its record at both parties); each party's peak is the most its process and its children (the "
             "library's side, the blinding helpers) held together, sampled every 100 ms, its file loaded included. "
             "X25519 by " + results.get("x25519", "?") + ".", "",
             "| way | seconds | the bank's peak (its own process) | the shop's peak (its own process) |",
             "|---|---|---|---|"]
    for run in results["runs"]:
        lines.append(f"| {NAMES.get(run['way'], run['way'])} | {run['seconds']:.1f} | {run['bank_peak_gb']:.2f} GB "
                     f"({run['bank_own_peak_gb']:.2f} GB) | {run['shop_peak_gb']:.2f} GB "
                     f"({run['shop_own_peak_gb']:.2f} GB) |")
    peak = {r["way"]: max(r["bank_peak_gb"], r["shop_peak_gb"]) for r in results["runs"]}
    under = [w for w, gb in peak.items() if gb < GOAL_GB]
    over = [w for w, gb in peak.items() if gb >= GOAL_GB]
    lines += ["", "Under 4 GB at every party (the goal): " + (", ".join(f"`{w}` ({peak[w]:.2f} GB at most)"
                                                                      for w in under) or "none") + "."]
    if over:
        lines[-1] += (" Over it: " + ", ".join(f"`{w}` ({peak[w]:.2f} GB)" for w in over) + ". vflo's own ECDH "
                      "with the IDs in memory holds every blinded point of a side at once, in each message of "
                      f"{results['rows'] * 32 / 1e6:.0f} MB and its copies: at this size, stream it "
                      "(`vflo align --stream`).")
    write_marked(page, MARK_BEGIN, MARK_END, lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--ways", default="rr22,vflo,stream")
    parser.add_argument("--work", type=Path, default=Path("runs/bench/psi_deployed"))
    parser.add_argument("--out", type=Path, default=Path("runs/bench/psi_deployed.json"))
    parser.add_argument("--docs", type=Path, help="write this results file's table into docs/deploy.md")
    args = parser.parse_args(argv)
    if args.docs is not None:
        docs(args.docs, Path(__file__).resolve().parents[1] / "docs" / "deploy.md")
        return 0
    from vflo.align import curve

    started = time.perf_counter()
    paths = write_files(args.work / f"rows{args.rows}", args.rows)
    print(f"files ready in {time.perf_counter() - started:.0f} s", flush=True)
    results: dict[str, Any] = {"rows": args.rows, "cores": os.cpu_count(), "x25519": curve.backend(), "runs": []}
    for way in args.ways.split(","):
        results["runs"].append(one_way(way, paths, args.rows, args.work / f"run_{way}"))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1))
        print(json.dumps(results["runs"][-1]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
