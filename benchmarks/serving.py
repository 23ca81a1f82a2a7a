"""vflo serve under load (benchmark, not a test): closed-loop clients at several concurrencies, each asking for
one person at a time, against a `vflo serve` process; beside it, the floor: the same model scoring the same
people one by one in this process, with no HTTP and no batching.

    python -m benchmarks.serving [--seconds 5] [--concurrency 1 4 16 64] [--out runs/bench/serving.json]

The models are the own-files example's (configs/examples/own_files.toml, trained with --quick and saved once
under runs/bench/serving/); the partners are in the server's process (a simulation: [partners]). Writes p50, p95
and p99 latency and predictions per second per model and concurrency, and the floor's, to --out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
HOSPITAL, LAB = ROOT / "examples/data/hospital.csv", ROOT / "examples/data/lab.csv"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def saved_models(folder: Path) -> Path:
    models = folder / "models"
    if not (models / "splitnn" / "model.json").is_file():
        subprocess.run([sys.executable, "-m", "vflo", "run", str(ROOT / "configs/examples/own_files.toml"), "--quick",
                        "--out", str(folder / "results"), "--save", str(models), "--overwrite", "-q"],
                       check=True, cwd=ROOT)
    return models


def shared_people() -> list[str]:
    lab = set(pd.read_csv(LAB, dtype={"pid": str})["pid"])
    return [p for p in pd.read_csv(HOSPITAL, dtype={"pid": str})["pid"] if p in lab]


class Connection:
    """One keep-alive HTTP/1.1 connection, as light as a load generator needs (a client library's own time would
    be measured as the server's): POST a JSON body, read the status and the body."""

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
                      token: str) -> dict[str, float]:
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
                "p95_ms": math.nan, "p99_ms": math.nan, "per_second": 0.0, "with_partner": math.nan,
                "said": said[0].decode()[:300] if said else "no reply"}
    ms = np.asarray(latencies) * 1000
    return {"concurrency": concurrency, "requests": len(latencies), "failed": failures,
            "p50_ms": float(np.percentile(ms, 50)), "p95_ms": float(np.percentile(ms, 95)),
            "p99_ms": float(np.percentile(ms, 99)), "per_second": len(latencies) / took,
            "with_partner": together / len(latencies)}


def floor(config: Path, model: str, people: list[str], seconds: float) -> dict[str, float]:
    """The same model scoring one person at a time in this process: no HTTP, no batching."""
    from vflo.serve.config import load_serve_config
    from vflo.serve.server import served_from

    served = served_from(load_serve_config(config))
    try:
        live = served.live[model]
        rng = random.Random(0)
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


def deployed(seconds: float, concurrency: list[int], deadline_ms: float) -> dict[str, Any]:
    """SplitNN (refusing people the partner lacks) and LASER-VFL (scoring with whoever answers) on synthetic
    parties (the active party 24 columns, the partner 50; 20,000 people each, half shared), the partner serving its
    saved part as its own process over gRPC with mutual TLS; then LASER-VFL with the partner hung (SIGSTOP) past
    the deadline. Beside each, its floor: the same model, partner in this process, one person at a time."""
    import signal

    import vflo
    from benchmarks.predict import write_pair, write_parties
    from vflo.comm.tls import init_certs

    work = ROOT / "runs" / "bench" / "serving_deployed"
    work.mkdir(parents=True, exist_ok=True)
    active, passive = write_parties(work, 20_000, seed=2)
    quick = {"train": {"max_epochs": 3, "patience": 0, "batch_size": 256}}
    models = work / "models"
    if not (models / "laser_vfl" / "model.json").is_file():
        a = vflo.PartyData.from_file(active, party="active", id_column="id", label_column="label")
        b = vflo.PartyData.from_file(passive, party="passive", id_column="id")
        for method in ("splitnn", "laser_vfl"):
            vflo.fit(method, vflo.hold_out([a, b], test=0.1, seed=0), **quick).save(models)
    rows = work / "active_rows.csv"
    pd.read_csv(active, dtype={"id": str}).drop(columns="label").to_csv(rows, index=False)
    mine, theirs = (set(pd.read_csv(f, dtype={"id": str})["id"]) for f in (active, passive))
    shared = sorted(mine & theirs)
    if not (work / "certs" / "ca.pem").is_file():
        init_certs(work / "certs", ["active", "passive"])
    write_pair(work, "passive.csv")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    partner = subprocess.Popen([sys.executable, "-m", "vflo", "party", "serve", "passive.toml"], cwd=work, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out: dict[str, Any] = {"partners": 1, "people": len(shared), "deadline_ms": deadline_ms}
    try:
        assert partner.stdout is not None
        until = time.monotonic() + 90
        line = ""
        while "listening on" not in line:  # bounded
            if time.monotonic() > until or partner.poll() is not None:
                raise SystemExit(f"the partner did not start: {line}")
            line = partner.stdout.readline()
        # Its log read on and dropped: a full pipe would stop the partner at its next line.
        threading.Thread(target=lambda: [None for _ in partner.stdout], daemon=True).start()  # type: ignore[union-attr]
        for method, missing in (("splitnn", "refuse"), ("laser_vfl", "subset")):
            port = free_port()
            config = work / f"serve_{method}.toml"
            config.write_text(f'[serve]\nmodels = "{models}"\nrows = "{rows}"\ndeploy = "{work / "deploy.toml"}"\n'
                              f'listen = "127.0.0.1:{port}"\nbatch_people = 64\nbatch_wait_ms = 2\n\n'
                              f'[models.{method}]\nmissing = "{missing}"\ndeadline_ms = {deadline_ms}\n')
            server = subprocess.Popen([sys.executable, "-m", "vflo", "serve", str(config)], cwd=ROOT, env=env)
            try:
                wait_ready(port, server)
                path = f"/v1/models/{method}:predict"
                served = [asyncio.run(closed_loop(port, path, shared, c, seconds, token_of(config)))
                          for c in concurrency]
                report(method, served)
                out[method] = {"served": served}
                if missing == "subset":
                    partner.send_signal(signal.SIGSTOP)  # hung: it holds the connection and answers nothing
                    try:
                        hung = asyncio.run(closed_loop(port, path, shared, 16, seconds, token_of(config)))
                    finally:
                        partner.send_signal(signal.SIGCONT)
                    report(f"{method}, partner hung", [hung])
                    out[method]["partner_hung"] = hung
            finally:
                server.terminate()
                server.wait(timeout=10)
    finally:
        partner.terminate()
        try:
            partner.wait(timeout=10)
        except subprocess.TimeoutExpired:
            partner.kill()
            partner.wait(timeout=10)
    for method, missing in (("splitnn", "refuse"), ("laser_vfl", "subset")):
        config = work / f"floor_{method}.toml"
        config.write_text(f'[serve]\nmodels = "{models}"\nrows = "{rows}"\n\n[partners]\npassive = "{passive}"\n\n'
                          f'[models.{method}]\nmissing = "{missing}"\n')
        out[method]["floor"] = base = floor(config, method, shared, seconds)
        print(f"{method} floor (in process, one at a time): p50 {base['p50_ms']:.2f} ms, p99 {base['p99_ms']:.2f} ms, "
              f"{base['per_second']:.0f} predictions/s", flush=True)
    return out


def wait_ready(port: int, server: subprocess.Popen[bytes]) -> None:
    """Until the server answers /readyz (bounded)."""
    import urllib.request

    until = time.monotonic() + 90
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1.0) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > until or server.poll() is not None:
            raise SystemExit("vflo serve did not become ready within 90 s")
        time.sleep(0.2)


def token_of(config: Path) -> str:
    """The clients' token a `vflo serve` started with ``config`` wrote beside it (its default token_file)."""
    return config.with_suffix(".token").read_text().strip()


def report(what: str, rows: list[dict[str, Any]]) -> None:
    for row in rows:
        if not row["requests"]:
            print(f"{what} c={row['concurrency']:>3}: no request answered ({row['failed']} failed): {row['said']}",
                  flush=True)
            continue
        print(f"{what} c={row['concurrency']:>3}: p50 {row['p50_ms']:.2f} ms, p95 {row['p95_ms']:.2f} ms, "
              f"p99 {row['p99_ms']:.2f} ms, {row['per_second']:.0f} predictions/s ({row['failed']} failed; "
              f"{row['with_partner']:.0%} scored with a partner)",
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--models", nargs="+", default=["local", "splitnn"])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench" / "serving.json")
    parser.add_argument("--deployed", action="store_true",
                        help="also a partner as its own process over mutual TLS (and hung past the deadline)")
    parser.add_argument("--deadline-ms", type=float, default=500.0)
    args = parser.parse_args()
    folder = ROOT / "runs" / "bench" / "serving"
    folder.mkdir(parents=True, exist_ok=True)
    models = saved_models(folder)
    port = free_port()
    config = folder / "serve.toml"
    config.write_text(f'[serve]\nmodels = "{models}"\nrows = "{HOSPITAL}"\nlisten = "127.0.0.1:{port}"\n'
                      f'batch_people = 64\nbatch_wait_ms = 2\n\n[partners]\nlab = "{LAB}"\n\n' +
                      "".join(f"[models.{m}]\n" for m in args.models))
    people = shared_people()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    server = subprocess.Popen([sys.executable, "-m", "vflo", "serve", str(config)], cwd=ROOT, env=env)
    results: dict[str, Any] = {"seconds": args.seconds, "machine": os.cpu_count(), "models": {}}
    try:
        wait_ready(port, server)
        for model in args.models:
            path = f"/v1/models/{model}:predict"
            rows = [asyncio.run(closed_loop(port, path, people, c, args.seconds, token_of(config)))
                    for c in args.concurrency]
            results["models"][model] = {"served": rows}
            report(model, rows)
    finally:
        server.terminate()
        server.wait(timeout=10)
    for model in args.models:
        results["models"][model]["floor"] = base = floor(config, model, people, args.seconds)
        print(f"{model} floor (in process, one at a time): p50 {base['p50_ms']:.2f} ms, p99 {base['p99_ms']:.2f} ms, "
              f"{base['per_second']:.0f} predictions/s", flush=True)
    if args.deployed:
        results["deployed"] = deployed(args.seconds, args.concurrency, args.deadline_ms)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
