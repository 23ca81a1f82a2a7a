"""A deployed partner in front of a feature store: `vflo party serve` with its training rows and its rows to score
in a SQLite database (vflo.data.sql), trained with over gRPC and mutual TLS and then serving online scoring
(the session vflo serve opens, aligned once, asked per batch); the scores are those of the same rows from files in
one process, and the database file is unchanged."""

from __future__ import annotations

import shutil
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from tests.e2e.conftest import (
    Federation,
    in_one_folder,
    spawn,
    train_and_save,
    wait_listening,
    write_deploy,
    write_federation,
)
from tests.test_laser_vfl import TRAIN, _blocks
from vflo.methods.registry import get_method
from vflo.scoring import SavedModel
from vflo.serve.live import ServePolicy
from vflo.serve.sessions import deployed, load_live

pytestmark = pytest.mark.slow


def test_a_partner_serves_online_scoring_from_its_sqlite_store(tmp_path: Path) -> None:
    together, _ = _blocks()
    cls = get_method("laser_vfl")
    settings: dict[str, Any] = {"train": {**TRAIN, "max_epochs": 3}}
    files = write_federation(tmp_path / "fed", together, {}, proposals=[cls(**settings)])
    directory = files.directory
    # p1's rows go into its store; its files move out of its reach (kept for the check in one process).
    store, kept = directory / "store" / "p1.db", tmp_path / "p1_files"
    store.parent.mkdir()
    kept.mkdir()
    with closing(sqlite3.connect(store)) as connection:
        for purpose in ("train", "serve"):
            path = shutil.move(directory / f"p1_{purpose}.csv", kept / f"p1_{purpose}.csv")
            pd.read_csv(path, dtype={"id": str}).to_sql(f"people_{purpose}", connection, index=False)
        connection.commit()
    config = files.configs["p1"]
    lines = [line for line in config.read_text().splitlines() if not line.startswith(("file =", "serve_file ="))]
    at = lines.index("[data]") + 1
    lines[at:at] = ['sql = "sqlite:///store/p1.db"', 'table = "people_train"',
                    'serve_query = "SELECT * FROM people_serve"']
    config.write_text("\n".join(lines) + "\n")
    before = (store.read_bytes(), store.stat().st_mtime_ns)

    processes = {name: spawn(path) for name, path in files.configs.items()}
    federation = Federation(deploy=files.deploy, local=files.local, processes=processes, directory=directory)
    live = None
    try:
        wait_listening(processes)
        train_and_save(federation, cls(**settings), tmp_path / "models", "laser_vfl")
        deploy = write_deploy(federation.deploy, tmp_path / "deploy.toml")
        live = load_live({"laser_vfl": SavedModel.load(tmp_path / "models", "laser_vfl")}, "laser_vfl",
                         rows=str(federation.deploy.test_file),
                         policy=ServePolicy(missing="subset", deadline_ms=20_000), session=deployed(deploy))
        ids = pd.read_csv(federation.deploy.test_file, dtype={"id": str})["id"].tolist()[:24]
        got = live.score(ids[:12]), live.score(ids[12:])  # two batches of one session
        scored = pd.concat(got, ignore_index=True)
        assert set(scored["scored_by"]) == {"a+p1+p2"}

        saved = in_one_folder(tmp_path / "models", federation, "laser_vfl", ("p1", "p2"), tmp_path / "here")
        rows = {"a": federation.deploy.test_file, "p1": kept / "p1_serve.csv", "p2": directory / "p2_serve.csv"}
        expected = saved.score(rows, missing="subset").set_index("id").loc[ids]
        columns = saved.score_columns
        assert np.allclose(scored[columns].to_numpy(float), expected[columns].to_numpy(float), atol=1e-6)
    finally:
        if live is not None:
            live.close()
        federation.stop()
    assert (store.read_bytes(), store.stat().st_mtime_ns) == before
