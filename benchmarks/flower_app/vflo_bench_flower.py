"""The ServerApp of benchmarks/flower.py: round trips and whole methods, timed over a Flower deployment."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from vflo.comm.message import Message
from vflo.deploy import load_deploy_config
from vflo.flower.apps import connect
from vflo.flower.transport import FlowerTransport
from vflo.methods.registry import get_method

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    config = dict(context.run_config)
    deploy = load_deploy_config(str(config["deploy"]))
    t0 = time.perf_counter()
    deployment = connect(grid, deploy)
    figures: dict[str, object] = {"connect_seconds": time.perf_counter() - t0}
    transport = deployment.party.transport
    assert isinstance(transport, FlowerTransport)
    try:
        peer = deploy.parties[0].name
        times = []
        for _ in range(int(config["calls"])):  # type: ignore[call-overload]
            t0 = time.perf_counter()
            transport.request(Message(sender=deploy.active.name, receiver=peer, kind="control.ledger", round=0))
            times.append(time.perf_counter() - t0)
        figures["round_trip_s"] = {"median": statistics.median(times), "min": min(times), "max": max(times),
                                   "calls": len(times)}
        runs = {}
        for name, settings in json.loads(str(config["methods"])).items():
            first = len(transport.flower.reply_pids)
            t0 = time.perf_counter()
            out = deployment.run(get_method(name)(**settings), seed=0)
            wall = time.perf_counter() - t0
            fit = out.fit_summary
            pids = transport.flower.reply_pids[first:]
            runs[name] = {"wall_seconds": wall, "fit_seconds": out.fit_seconds, "rounds": fit.rounds,
                          "bytes": fit.bytes, "messages": out.ledger.summary().messages,
                          "framing_bytes": out.ledger.summary().framing_bytes,
                          "flower_messages": len(pids), "clientapp_processes": len(set(pids)),
                          "epochs": out.stats.get("epochs")}
            print(name, json.dumps(runs[name]), flush=True)
        figures["methods"] = runs
    finally:
        deployment.close()
    Path(str(config["out"])).write_text(json.dumps(figures, indent=1))
