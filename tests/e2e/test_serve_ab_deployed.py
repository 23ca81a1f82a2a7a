"""An A/B test of two collaborative models served with deployed partners: vflo serve as its own process, two
partners over gRPC and mutual TLS, each keeping both models' scoring sessions open side by side; every request
answered by the model its hash picks, scored with both partners, as that model scores the same people in one
process."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from benchmarks.serving import wait_ready
from tests.e2e.conftest import in_one_folder, train_and_save
from tests.e2e.test_serve_deployed import WAIT, bearer, laser_federation, start_serving

pytestmark = pytest.mark.slow


def test_two_collaborative_models_ab_tested_with_deployed_partners(tmp_path: Path) -> None:
    import httpx

    federation, laser = laser_federation(tmp_path)
    server = None
    try:
        train_and_save(federation, laser(), tmp_path / "models", "laser_vfl", seed=4)
        train_and_save(federation, laser(), tmp_path / "models", "laser_vfl_v2", seed=5)
        server, port = start_serving(tmp_path, federation, '\n[models.laser_vfl]\nmissing = "subset"\n'
                                     'deadline_ms = 3000\nchallenger = "laser_vfl_v2"\nchallenger_share = 0.5\n')
        ids = pd.read_csv(federation.deploy.test_file, dtype={"id": str})["id"].tolist()[:30]
        rows = {"a": federation.deploy.test_file, **{p: federation.directory / f"{p}_serve.csv" for p in ("p1", "p2")}}
        expected = {label: in_one_folder(tmp_path / "models", federation, label, ("p1", "p2"), tmp_path / label)
                    for label in ("laser_vfl", "laser_vfl_v2")}
        scored = {label: m.score(rows, missing="subset").set_index("id") for label, m in expected.items()}
        wait_ready(port, server)
        by: dict[str, int] = {}
        with httpx.Client(timeout=WAIT, headers=bearer(tmp_path / "serve.token")) as http:
            for person in ids:  # one person a request: the hash of each picks the model
                reply = http.post(f"http://127.0.0.1:{port}/v1/models/laser_vfl:predict", json={"ids": [person]})
                assert reply.status_code == 200, reply.text
                answer, label = reply.json()["predictions"][0], reply.json()["served_by"]
                by[label] = by.get(label, 0) + 1
                assert "+".join(answer["scored_by"]) == "a+p1+p2"  # with both partners, whichever model answered
                cols = expected[label].score_columns
                got = np.array([answer["scores"][c] for c in cols])
                assert np.allclose(got, scored[label].loc[person, cols].to_numpy(float), atol=1e-6), label
        assert set(by) == {"laser_vfl", "laser_vfl_v2"} and min(by.values()) >= 5, by
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=10)
        federation.stop()
