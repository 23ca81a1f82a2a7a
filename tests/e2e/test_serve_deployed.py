"""vflo serve as its own process with two partners deployed over gRPC and mutual TLS: one scoring session opened
at start and kept, each request's people matched with a partner's by private set intersection, scores equal to
scoring the same people in one process; the model swapped under load without a request lost or answered twice;
a partner killed while serving is left out of the next requests within the deadline; /metrics counts it all."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from benchmarks.serving import wait_ready
from tests.e2e.conftest import Federation, in_one_folder, start_federation, train_and_save, write_deploy
from tests.test_laser_vfl import TRAIN, _blocks
from vflo.comm.local_ports import free_port
from vflo.methods.base import Method
from vflo.methods.registry import get_method

pytestmark = pytest.mark.slow
WAIT = 60.0


def bearer(token_file: Path) -> dict[str, str]:
    return {"Authorization": f"Bearer {token_file.read_text().strip()}"}


def laser_federation(tmp_path: Path) -> tuple[Federation, Callable[[], Method]]:
    """The active party and two partners, each its own process, set to train LASER-VFL briefly: the federation
    and a maker of the method."""
    together, _ = _blocks()
    cls = get_method("laser_vfl")
    settings: dict[str, Any] = {"train": {**TRAIN, "max_epochs": 3}}
    return start_federation(tmp_path / "fed", together, {}, proposals=[cls(**settings)]), lambda: cls(**settings)


def start_serving(tmp_path: Path, federation: Federation, extra: str) -> tuple[subprocess.Popen[bytes], int]:
    """`vflo serve` as its own process over the models saved under tmp_path/models, with the federation's
    partners deployed, on a free port; ``extra``: the rest of its config (its [serve] keys first)."""
    deploy = write_deploy(federation.deploy, tmp_path / "deploy.toml")
    port = free_port()
    config = tmp_path / "serve.toml"
    config.write_text(f'[serve]\nmodels = "{tmp_path / "models"}"\nrows = "{federation.deploy.test_file}"\n'
                      f'deploy = "{deploy}"\nlisten = "127.0.0.1:{port}"\nbatch_wait_ms = 2\n{extra}')
    return subprocess.Popen([sys.executable, "-m", "vflo", "serve", str(config)],
                            env={**os.environ, "OMP_NUM_THREADS": "1"}), port


def test_vflo_serve_with_two_partners_swaps_under_load_and_leaves_out_a_dead_partner(tmp_path: Path) -> None:
    import httpx

    federation, laser = laser_federation(tmp_path)
    server = None
    try:
        train_and_save(federation, laser(), tmp_path / "models", "laser_vfl")
        server, port = start_serving(tmp_path, federation, 'admin_token_file = "admin.token"\n\n'
                                     '[models.laser_vfl]\nmissing = "subset"\ndeadline_ms = 3000\n')
        base = f"http://127.0.0.1:{port}"
        ids = pd.read_csv(federation.deploy.test_file, dtype={"id": str})["id"].tolist()[:20]
        url = f"{base}/v1/models/laser_vfl:predict"
        with httpx.Client(timeout=WAIT) as anyone:
            wait_ready(port, server)
            # Without the token written beside the config, nothing but the probes answers.
            refused = anyone.post(url, json={"ids": ids})
            assert refused.status_code == 401 and "serve.token_file" in refused.text
        http = httpx.Client(timeout=WAIT, headers=bearer(tmp_path / "serve.token"))
        admin = httpx.Client(timeout=WAIT, headers=bearer(tmp_path / "admin.token"))
        with http, admin:
            first = http.post(url, json={"ids": ids})
            assert first.status_code == 200, first.text
            assert {"+".join(p["scored_by"]) for p in first.json()["predictions"]} == {"a+p1+p2"}
            # The same people in one process, every part in one folder.
            saved = in_one_folder(tmp_path / "models", federation, "laser_vfl", ("p1", "p2"), tmp_path / "here")
            model_id = saved.card.model_id
            rows = {"a": federation.deploy.test_file,
                    **{p: federation.directory / f"{p}_serve.csv" for p in ("p1", "p2")}}
            everyone = saved.score(rows, missing="subset").set_index("id").loc[ids]
            got = np.array([[p["scores"][c] for c in saved.score_columns] for p in first.json()["predictions"]])
            assert np.allclose(got, everyone[saved.score_columns].to_numpy(float), atol=1e-6)

            # Swapped while four clients keep asking: every request answered once, none lost.
            answers: list[int] = []
            stop = threading.Event()

            def client(k: int) -> None:
                with httpx.Client(timeout=WAIT, headers=http.headers) as own:
                    while not stop.is_set():
                        answers.append(own.post(url, json={"ids": [ids[k]]}).status_code)

            clients = [threading.Thread(target=client, args=(k,)) for k in range(4)]
            for t in clients:
                t.start()
            time.sleep(0.5)
            assert http.put(f"{base}/v1/models/laser_vfl").status_code == 401  # a swap needs the admin token
            swapped = admin.put(f"{base}/v1/models/laser_vfl")
            time.sleep(0.5)
            stop.set()
            for t in clients:
                t.join(timeout=WAIT)
            assert swapped.status_code == 200 and swapped.json()["version"] == model_id
            assert answers and set(answers) == {200}
            metrics = http.get(f"{base}/metrics").text
            ok = next(float(line.split()[-1]) for line in metrics.splitlines()
                      if line.startswith('vflo_requests_total{model="laser_vfl",outcome="ok"}'))
            assert ok == 1 + len(answers)  # each request answered once: the server counted as many as were sent
            assert 'vflo_swaps_total{model="laser_vfl"} 1.0' in metrics

            # Hung (stopped, its connection open): one batch waits its deadline, the next ones leave it out at once
            # while it rests, and it is asked again once the rest is over.
            import signal

            from vflo.serve.live import RESTING, reserve

            federation.processes["p2"].send_signal(signal.SIGSTOP)
            try:
                started = time.monotonic()
                hung = http.post(url, json={"ids": ids[:3]})
                waited = time.monotonic() - started
                started = time.monotonic()
                resting = http.post(url, json={"ids": ids[:3]})
                assert time.monotonic() - started < 1.0 and waited >= 3.0 - reserve(3.0) - 0.05
            finally:
                federation.processes["p2"].send_signal(signal.SIGCONT)
            for reply in (hung, resting):
                assert {"+".join(p["scored_by"]) for p in reply.json()["predictions"]} == {"a+p1"}
            time.sleep(RESTING + 0.5)
            back = http.post(url, json={"ids": ids[:3]})
            assert {"+".join(p["scored_by"]) for p in back.json()["predictions"]} == {"a+p1+p2"}

            federation.processes["p2"].kill()
            federation.processes["p2"].wait(timeout=10)
            started = time.monotonic()
            after = http.post(url, json={"ids": ids})
            assert after.status_code == 200, after.text
            assert time.monotonic() - started < 3.0 + 5.0  # within the deadline, and the request's own time
            assert {"+".join(p["scored_by"]) for p in after.json()["predictions"]} == {"a+p1"}
            without = saved.score({p: rows[p] for p in ("a", "p1")}, missing="subset").set_index("id").loc[ids]
            got = np.array([[p["scores"][c] for c in saved.score_columns] for p in after.json()["predictions"]])
            assert np.allclose(got, without[saved.score_columns].to_numpy(float), atol=1e-6)
            metrics = http.get(f"{base}/metrics").text
            assert 'vflo_rows_total{model="laser_vfl",scored_by="a+p1",scored_model="laser_vfl"} 26.0' in metrics
            late = 'vflo_partner_absent_total{model="laser_vfl",partner="p2",why="DeliveryTimeoutError"} 1.0'
            assert late in metrics  # the hung batch; the killed partner's batch is counted as unreachable
            assert 'vflo_partner_absent_total{model="laser_vfl",partner="p2",why="TransportError"}' in metrics
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=10)
        federation.stop()
