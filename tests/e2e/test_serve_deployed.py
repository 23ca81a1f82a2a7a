"""vflo serve with partners deployed over gRPC and mutual TLS: one scoring session opened at start and kept, each
request's people matched with a partner's by private set intersection, scores equal to scoring the same people in
one process; a partner killed while serving is left out of the next requests within the deadline, never a hung
request, and /readyz says so."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from tests.e2e.conftest import start_federation, write_deploy
from tests.test_laser_vfl import TRAIN, _blocks
from vflo.deploy import Deployment
from vflo.methods.registry import get_method
from vflo.scoring import SavedModel

pytestmark = pytest.mark.slow


def test_a_deployed_model_is_served_live_and_a_partner_that_dies_is_left_out(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from vflo.serve.app import create_app
    from vflo.serve.config import load_serve_config
    from vflo.serve.server import served_from

    together, _ = _blocks()
    cls = get_method("laser_vfl")
    settings: dict[str, Any] = {"train": {**TRAIN, "max_epochs": 3}}
    federation = start_federation(tmp_path / "fed", together, {}, proposals=[cls(**settings)])
    try:
        deployment = Deployment(federation.deploy)
        try:
            deployment.run(cls(**settings), seed=4, save=(tmp_path / "models", "laser_vfl"))
        finally:
            deployment.close()
        deploy = write_deploy(federation.deploy, tmp_path / "deploy.toml")
        config = tmp_path / "serve.toml"
        config.write_text(f'[serve]\nmodels = "{tmp_path / "models"}"\nrows = "{federation.deploy.test_file}"\n'
                          f'deploy = "{deploy}"\nbatch_wait_ms = 2\n\n[models.laser_vfl]\nmissing = "subset"\n'
                          'deadline_ms = 3000\n')
        ids = pd.read_csv(federation.deploy.test_file, dtype={"id": str})["id"].tolist()[:20]
        with TestClient(create_app(served_from(load_serve_config(config)))) as client:
            assert client.get("/readyz").status_code == 200
            first = client.post("/v1/models/laser_vfl:predict", json={"ids": ids})
            assert first.status_code == 200, first.text
            assert {"+".join(p["scored_by"]) for p in first.json()["predictions"]} == {"a+p1+p2"}
            # The same people in one process, every part in one folder.
            here = tmp_path / "here"
            shutil.copytree(tmp_path / "models", here)
            model_id = pd.read_json(here / "laser_vfl" / "model.json", typ="series")["model_id"]
            for party in ("p1", "p2"):
                shutil.copytree(federation.directory / f"{party}_models" / "laser_vfl" / model_id / party,
                                here / "laser_vfl" / party)
            saved = SavedModel.load(here, "laser_vfl")
            rows = {"a": federation.deploy.test_file,
                    **{p: federation.directory / f"{p}_serve.csv" for p in ("p1", "p2")}}
            everyone = saved.score(rows, missing="subset").set_index("id").loc[ids]
            got = np.array([[p["scores"][c] for c in saved.score_columns] for p in first.json()["predictions"]])
            assert np.allclose(got, everyone[saved.score_columns].to_numpy(float), atol=1e-6)

            federation.processes["p2"].kill()
            federation.processes["p2"].wait(timeout=10)
            started = time.monotonic()
            after = client.post("/v1/models/laser_vfl:predict", json={"ids": ids})
            assert after.status_code == 200, after.text
            assert time.monotonic() - started < 3.0 + 5.0  # within the deadline, and the request's own time
            assert {"+".join(p["scored_by"]) for p in after.json()["predictions"]} == {"a+p1"}
            without = saved.score({p: rows[p] for p in ("a", "p1")}, missing="subset").set_index("id").loc[ids]
            got = np.array([[p["scores"][c] for c in saved.score_columns] for p in after.json()["predictions"]])
            assert np.allclose(got, without[saved.score_columns].to_numpy(float), atol=1e-6)
    finally:
        federation.stop()
