"""vflo serve under load (benchmark, not a test): closed-loop clients at several concurrencies, each asking for
one person at a time, against a `vflo serve` process whose partners each serve their saved part as their own
process over gRPC with mutual TLS; beside each model, its floor: the same model scoring the same people one at a
time in one process, partners included, with no network, no HTTP and no batching.

    python -m benchmarks.serving [--seconds 5] [--concurrency 1 4 16 64] [--partners 1 3]
                                 [--models local splitnn laser_vfl secureboost] [--deadline-ms 500]
    python -m benchmarks.serving --report          # docs/deploy.md's section from runs/bench/serving.json

Synthetic parties, 20,000 people each: the active party (24 columns and the label) and one partner (50
columns) or three (20, 15 and 15), each partner holding three quarters of the active party's people. Models:
local (the active party alone), splitnn (every partner needed: people some partner lacks refused), laser_vfl and
secureboost (with whichever partners answer). The people asked for are those every party holds. For the any-
subset models, two more cells at concurrency 16: the first partner hung (SIGSTOP: its connection open, nothing
answered) past the deadline, and killed. Writes every cell to runs/bench/serving.json.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import math
import os
import platform
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from benchmarks.compare_all import commit
from benchmarks.pages import fill
from vflo.comm.local_ports import free_port

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "runs" / "bench" / "serving.json"
PAGE = ROOT / "docs" / "deploy.md"
BEGIN, END = "<!-- serving:begin -->", "<!-- serving:end -->"
PEOPLE = 20_000
WIDTHS = {1: [50], 3: [20, 15, 15]}
#: How each collaborative model is served: what it does with people a partner cannot score in time.
MISSING = {"splitnn": "refuse", "laser_vfl": "subset", "secureboost": "subset"}
QUICK: dict[str, Any] = {"train": {"max_epochs": 3, "patience": 0, "batch_size": 256}}
SETTINGS: dict[str, dict[str, Any]] = {"local": QUICK, "splitnn": QUICK, "secureboost": {"n_trees": 10},
                                       "laser_vfl": QUICK}


class Connection:
    """One keep-alive HTTP/1.1 connection, as light as a load generator needs (a client library's own time would
    be measured as the server's): POST a JSON body with the server's token, read the status and the body."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str, token: str) -> None:
        self.reader, self.writer, self.host, self.token = reader, writer, host, token

    @classmethod
    async def open(cls, host: str, port: int, token: str) -> Connection:
        reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer, host, token)

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        self.writer.write(f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
                          f"Authorization: Bearer {self.token}\r\n"
                          f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        length = next(int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:"))
        return status, await self.reader.readexactly(length)

    def close(self) -> None:
        self.writer.close()


async def closed_loop(port: int, path: str, people: list[str], concurrency: int, seconds: float,
                      token: str) -> dict[str, Any]:
    """``concurrency`` clients, each on its own connection (with the server's ``token``), sending its next request
    when the last is answered, for ``seconds``."""
    latencies: list[float] = []
    failures = 0
    together = 0  # predictions some partner scored with the active party (scored_by names more than it)
    said: list[bytes] = []
    connections = [await Connection.open("127.0.0.1", port, token) for _ in range(concurrency)]
    stop = time.perf_counter() + seconds

    async def client(k: int, connection: Connection) -> None:
        nonlocal failures, together
        rng = random.Random(k)
        while time.perf_counter() < stop:
            started = time.perf_counter()
            status, body = await connection.post(path, json.dumps({"ids": [rng.choice(people)]}).encode())
            if status == 200:
                latencies.append(time.perf_counter() - started)
                together += sum(len(p["scored_by"]) > 1 for p in json.loads(body)["predictions"])
            else:
                failures += 1
                said[:] = said or [body]

    began = time.perf_counter()
    await asyncio.gather(*(client(k, c) for k, c in enumerate(connections)))
    took = time.perf_counter() - began
    for c in connections:
        c.close()
    if not latencies:  # recorded, not raised: the next cells still run
        return {"concurrency": concurrency, "requests": 0, "failed": failures, "p50_ms": math.nan,
                "p95_ms": math.nan, "p99_ms": math.nan, "max_ms": math.nan, "per_second": 0.0,
                "with_partner": math.nan, "said": said[0].decode()[:300] if said else "no reply"}
    ms = np.asarray(latencies) * 1000
    return {"concurrency": concurrency, "requests": len(latencies), "failed": failures,
            "p50_ms": float(np.percentile(ms, 50)), "p95_ms": float(np.percentile(ms, 95)),
            "p99_ms": float(np.percentile(ms, 99)), "max_ms": float(ms.max()), "per_second": len(latencies) / took,
            "with_partner": together / len(latencies)}


def floor(config: Path, model: str, people: list[str], seconds: float) -> dict[str, float]:
    """The same model scoring one person at a time in this process, partners included: no network, no HTTP, no
    batching."""
    from vflo.serve.config import load_serve_config
    from vflo.serve.server import served_from

    served = served_from(load_serve_config(config))
    try:
        live = served.live[model]
        rng = random.Random(0)
        for _ in range(20):  # warm
            live.score([rng.choice(people)])
        latencies = []
        stop = time.perf_counter() + seconds
        while time.perf_counter() < stop:
            started = time.perf_counter()
            live.score([rng.choice(people)])
            latencies.append(time.perf_counter() - started)
    finally:
        served.close()
    ms = np.asarray(latencies) * 1000
    return {"requests": len(latencies), "p50_ms": float(np.percentile(ms, 50)),
            "p99_ms": float(np.percentile(ms, 99)), "per_second": len(latencies) / seconds}


def write_federation(work: Path, partners: int, *, seed: int) -> tuple[Path, dict[str, Path], list[str]]:
    """The active party's file, each partner's, and the people every party holds (sorted)."""
    from benchmarks.predict import people as columns

    rng = np.random.default_rng(seed)
    ids = rng.permutation(int(PEOPLE * 1.5))
    active_ids = ids[:PEOPLE]
    signal_ = rng.normal(size=(len(ids), 4))
    active = columns(rng, active_ids, signal_[active_ids], 24, "a", 0)
    active["label"] = (signal_[active_ids].sum(axis=1) > 0).astype(np.int64)
    active.to_csv(work / "active.csv", index=False)
    files = {}
    for k, width in enumerate(WIDTHS[partners]):
        # Three quarters of the active party's people (a different three quarters each) and some of its own.
        held = np.concatenate([rng.permutation(active_ids)[: PEOPLE * 3 // 4], ids[PEOPLE:][: PEOPLE // 4]])
        name = f"p{k + 1}"
        columns(rng, held, signal_[held], width, name, k % 4).to_csv(work / f"{name}.csv", index=False)
        files[name] = work / f"{name}.csv"
    shared = set(pd.read_csv(work / "active.csv", dtype={"id": str})["id"])
    for file in files.values():
        shared &= set(pd.read_csv(file, dtype={"id": str})["id"])
    return work / "active.csv", files, sorted(shared)


def write_configs(work: Path, names: list[str]) -> None:
    """Each partner's PARTY.toml (serving its saved part from models/, its rows from its file) and the active
    party's deploy.toml, each on a free port, with the certificates in work/certs."""
    ports = {name: free_port() for name in ["active", *names]}
    for name in names:
        (work / f"{name}.toml").write_text(
            f'name = "{name}"\nlisten = "127.0.0.1:{ports[name]}"\nmodels = "models"\n[data]\nid_column = "id"\n'
            f'serve_file = "{name}.csv"\n[tls]\ndir = "certs"\n'
            f'[peers]\nactive = {{ address = "127.0.0.1:{ports["active"]}", role = "active" }}\n')
    (work / "deploy.toml").write_text(
        f'[active]\nname = "active"\nrole = "active"\nlisten = "127.0.0.1:{ports["active"]}"\n[active.data]\n'
        'file = "active.csv"\nid_column = "id"\nlabel_column = "label"\n[active.tls]\ndir = "certs"\n' +
        "".join(f'[[parties]]\nname = "{n}"\nrole = "passive"\naddress = "127.0.0.1:{ports[n]}"\n' for n in names))


def trained(work: Path, active: Path, files: dict[str, Path], models: list[str]) -> Path:
    """The models, trained on the synthetic parties once and saved under work/models."""
    import vflo

    folder = work / "models"
    todo = [m for m in models if not (folder / m / "model.json").is_file()]
    if todo:
        parties = [vflo.PartyData.from_file(active, party="active", id_column="id", label_column="label"),
                   *(vflo.PartyData.from_file(f, party=n, id_column="id") for n, f in files.items())]
        split = vflo.hold_out(parties, test=0.1, seed=0)
        for method in todo:
            print(f"training {method} ...", flush=True)
            vflo.fit(method, split, **SETTINGS[method]).save(folder)
    return folder


class Partners:
    """Each partner as its own `vflo party serve` process, its log read on and dropped (a full pipe would stop
    it at its next line)."""

    def __init__(self, work: Path, names: list[str]) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self.processes = {n: subprocess.Popen([sys.executable, "-m", "vflo", "party", "serve", f"{n}.toml"],
                                              cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                              text=True) for n in names}
        for name, process in self.processes.items():
            assert process.stdout is not None
            until, line = time.monotonic() + 90, ""
            while "listening on" not in line:  # bounded
                if time.monotonic() > until or process.poll() is not None:
                    raise SystemExit(f"partner {name} did not start: {line}")
                line = process.stdout.readline()
            threading.Thread(target=lambda out=process.stdout: [None for _ in out], daemon=True).start()

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.terminate()
        for process in self.processes.values():
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


def serve_config(path: Path, models: Path, rows: Path, model: str, *, port: int, deadline_ms: float,
                 deploy: Path | None = None, partners: dict[str, Path] | None = None) -> Path:
    """A serve config for ``model`` and local beside it: with the deployment, or with the partners' files in
    process (the floor's)."""
    where = f'deploy = "{deploy}"\n' if deploy else ""
    given = "".join(f'{n} = "{f}"\n' for n, f in (partners or {}).items())
    served = "" if model == "local" else (f'[models.{model}]\nmissing = "{MISSING[model]}"\n'
                                          f'deadline_ms = {deadline_ms}\n')
    path.write_text(f'[serve]\nmodels = "{models}"\nrows = "{rows}"\n{where}listen = "127.0.0.1:{port}"\n'
                    f'batch_people = 64\nbatch_wait_ms = 2\nwatch_seconds = 0\n\n' +
                    (f"[partners]\n{given}\n" if given else "") + f"[models.local]\n{served}")
    return path


def token_of(config: Path) -> str:
    """The clients' token a `vflo serve` started with ``config`` wrote beside it (its default token_file)."""
    return config.with_suffix(".token").read_text().strip()


def wait_ready(port: int, server: subprocess.Popen[bytes]) -> None:
    """Until the server answers /readyz (bounded)."""
    import urllib.request

    until = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1.0) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > until or server.poll() is not None:
            raise SystemExit("vflo serve did not become ready within 120 s")
        time.sleep(0.2)


def report(what: str, rows: list[dict[str, Any]]) -> None:
    for row in rows:
        if not row["requests"]:
            print(f"{what} c={row['concurrency']:>3}: no request answered ({row['failed']} failed): {row['said']}",
                  flush=True)
            continue
        print(f"{what} c={row['concurrency']:>3}: p50 {row['p50_ms']:.2f} ms, p95 {row['p95_ms']:.2f} ms, "
              f"p99 {row['p99_ms']:.2f} ms, {row['per_second']:.0f} predictions/s ({row['failed']} failed; "
              f"{row['with_partner']:.0%} scored with a partner)", flush=True)


def run_partners(n: int, args: argparse.Namespace) -> dict[str, Any]:
    """Every model with ``n`` partners deployed, then each model's floor."""
    from vflo.comm.tls import init_certs
    from vflo.serve.live import RESTING

    work = ROOT / "runs" / "bench" / "serving" / f"partners{n}"
    work.mkdir(parents=True, exist_ok=True)
    active, files, shared = write_federation(work, n, seed=n)
    names = list(files)
    models = trained(work, active, files, args.models)
    rows = work / "active_rows.csv"
    pd.read_csv(active, dtype={"id": str}).drop(columns="label").to_csv(rows, index=False)
    if not (work / "certs" / "ca.pem").is_file():
        init_certs(work / "certs", ["active", *names])
    write_configs(work, names)
    out: dict[str, Any] = {"people": len(shared), "models": {}}
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    collaborative = [m for m in ("splitnn", "secureboost", "laser_vfl") if m in args.models]
    partners = Partners(work, names)
    try:
        for k, model in enumerate(collaborative or ["local"]):
            port = free_port()
            config = serve_config(work / f"serve_{model}.toml", models, rows, model, port=port,
                                  deadline_ms=args.deadline_ms, deploy=work / "deploy.toml")
            server = subprocess.Popen([sys.executable, "-m", "vflo", "serve", str(config)], cwd=ROOT, env=env)
            try:
                wait_ready(port, server)
                token = token_of(config)
                asked = [model] + (["local"] if k == 0 and "local" in args.models and model != "local" else [])
                for name in asked:
                    path = f"/v1/models/{name}:predict"
                    cells = [asyncio.run(closed_loop(port, path, shared, c, args.seconds, token))
                             for c in args.concurrency]
                    report(f"{n} partner(s), {name}", cells)
                    out["models"][name] = {"served": cells}
                if MISSING.get(model) == "subset":
                    first = partners.processes[names[0]]
                    path = f"/v1/models/{model}:predict"
                    first.send_signal(signal.SIGSTOP)  # hung: it holds its connection and answers nothing
                    try:
                        hung = asyncio.run(closed_loop(port, path, shared, 16, args.seconds, token))
                    finally:
                        first.send_signal(signal.SIGCONT)
                    report(f"{n} partner(s), {model}, {names[0]} hung", [hung])
                    out["models"][model]["partner_hung"] = hung
                    time.sleep(RESTING + 0.5)
                    if model == collaborative[-1]:  # the last model: the partner killed for good
                        first.kill()
                        first.wait(timeout=10)
                        killed = asyncio.run(closed_loop(port, path, shared, 16, args.seconds, token))
                        report(f"{n} partner(s), {model}, {names[0]} killed", [killed])
                        out["models"][model]["partner_killed"] = killed
            finally:
                server.terminate()
                server.wait(timeout=10)
    finally:
        partners.stop()
    for model in args.models:
        config = serve_config(work / f"floor_{model}.toml", models, rows, model, port=free_port(),
                              deadline_ms=args.deadline_ms, partners=files)
        base = floor(config, model, shared, args.seconds)
        out["models"].setdefault(model, {})["floor"] = base
        print(f"{n} partner(s), {model} floor (in process, one at a time): p50 {base['p50_ms']:.2f} ms, p99 "
              f"{base['p99_ms']:.2f} ms, {base['per_second']:.0f} predictions/s", flush=True)
    return out


def render(results: dict[str, Any]) -> str:
    """docs/deploy.md's section: what ran, a table per partner count, the goals checked, every figure from
    ``results``."""
    lines = [BEGIN, "", "Generated by `python -m benchmarks.serving --report` from the runs below. Partners on "
             "localhost, each its own process, over mutual TLS; the server and the load generator on the same "
             "machine; one person per request. The floor: the same model scoring the same people one at a time in "
             "one process, partners included, with no network, HTTP or batching. Synthetic parties (not a paper's "
             "data). × floor: predictions a second served over the floor's, one at a time in one process.", ""]
    goals = []
    for n, block in sorted(results["partners"].items(), key=lambda kv: int(kv[0])):
        lines += [f"**{n} partner{'s' if int(n) > 1 else ''}** ({block['people']:,} people held by every party): "
                  f"`{block['command'].strip()}`, run on {block['date']} at commit {block['commit']} on "
                  f"{block['machine']}, "
                  f"{block['seconds']:g} s per cell, deadline {block['deadline_ms']:g} ms.", "",
                  "| model | clients | p50 ms | p95 ms | p99 ms | predictions/s | with a partner | floor p50 ms "
                  "| floor predictions/s | × floor |", "|---|---|---|---|---|---|---|---|---|---|"]
        for model, cells in block["models"].items():
            base = cells.get("floor", {})
            rows = [(str(c["concurrency"]), c) for c in cells.get("served", [])]
            rows += [(f"16, {what.replace('_', ' ')}", cells[what]) for what in ("partner_hung", "partner_killed")
                     if what in cells]
            for label, c in rows:
                if not c["requests"]:
                    lines.append(f"| {model} | {label} | no answer ({c['failed']} failed) | | | | | | | |")
                    continue
                lines.append(f"| {model} | {label} | {c['p50_ms']:.1f} | {c['p95_ms']:.1f} | {c['p99_ms']:.1f} | "
                             f"{c['per_second']:,.0f} | {c['with_partner']:.0%} | {base.get('p50_ms', math.nan):.2f} "
                             f"| {base.get('per_second', math.nan):,.0f} | "
                             f"{c['per_second'] / base.get('per_second', math.nan):.1f} |")
        lines.append("")
        if n == "1":
            split = {c["concurrency"]: c for c in block["models"].get("splitnn", {}).get("served", [])}
            if 16 in split:
                p99 = split[16]["p99_ms"]
                goals.append(f"SplitNN with one partner, 16 clients: p99 {p99:.1f} ms "
                             f"({'within' if p99 <= 20 else 'over'} the 20 ms goal).")
            if 64 in split:
                rate = split[64]["per_second"]
                goals.append(f"64 clients: {rate:,.0f} predictions a second ({'at least' if rate >= 2000 else 'under'}"
                             " the goal of 2,000).")
        for model, cells in block["models"].items():
            hung = cells.get("partner_hung")
            if hung and hung["requests"]:
                limit = block["deadline_ms"] + 5
                goals.append(f"{model}, {n} partner{'s' if int(n) > 1 else ''}, one hung: p99 {hung['p99_ms']:.0f} ms,"
                             f" {'within' if hung['p99_ms'] <= limit else 'over'} the deadline plus 5 ms "
                             f"({limit:g} ms); the slowest {hung['max_ms']:.0f} ms; {hung['failed']} failed.")
    lines += ["Goals, from these figures: " + " ".join(goals), "", END]
    return "\n".join(lines)


def write_page(results: dict[str, Any]) -> None:
    fill(PAGE, BEGIN, END, render(results))
    print(f"wrote the serving section of {PAGE}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--partners", type=int, nargs="+", default=[1, 3], choices=sorted(WIDTHS))
    parser.add_argument("--models", nargs="+", default=["local", "splitnn", "secureboost", "laser_vfl"],
                        choices=list(SETTINGS))
    parser.add_argument("--deadline-ms", type=float, default=500.0)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--report", action="store_true", help="write docs/deploy.md's section from --out")
    args = parser.parse_args()
    if args.report:
        write_page(json.loads(args.out.read_text()))
        return
    # Partner counts run before (another command) are kept beside those run now, each with its own run's facts.
    kept = json.loads(args.out.read_text()).get("partners", {}) if args.out.is_file() else {}
    results: dict[str, Any] = {"partners": {n: b for n, b in kept.items() if "command" in b}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for n in args.partners:
        block = {"command": "python -m benchmarks.serving " + " ".join(sys.argv[1:]), "commit": commit()[:12],
                 "date": dt.date.today().isoformat(), "seconds": args.seconds, "deadline_ms": args.deadline_ms,
                 "machine": f"{os.cpu_count()} cores, {platform.machine()}"}
        results["partners"][str(n)] = {**block, **run_partners(n, args)}
        args.out.write_text(json.dumps(results, indent=1))  # partial results kept
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
