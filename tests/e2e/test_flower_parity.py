"""Over a real Flower deployment, what vflo's gRPC does: scoring with whoever answers (`missing = "subset"`)
when a partner is gone, and a coordinator whose certificate the CA revoked refused by every party.

One federation of SuperNodes serves every check: the model is trained over vflo's gRPC first (a Flower round
trip per batch would take minutes), each party saving its part in its own folder, and scored over Flower.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.conftest import REPO
from tests.e2e.conftest import in_one_folder, start_federation, train_and_save, write_deploy
from tests.flower_parties import revoke_party
from tests.test_laser_vfl import TRAIN, _blocks
from vflo.flower.local import LocalFlower, stop_process
from vflo.methods.registry import get_method

pytestmark = pytest.mark.slow
APP = REPO / "examples" / "flower"
SETTINGS = {"train": {**TRAIN, "max_epochs": 3}}
# The run config's keys for scoring (vflo.flower.apps.FlowerRun) with their defaults, as the app declares them.
SCORING_KEYS = {"model": '""', "method": '""', "data": '""', "missing": '"refuse"', "deadline": "0.0",
                "fallback": '""'}


def scoring_app(folder: Path) -> Path:
    """vflo's Flower app as examples/flower has it, with any scoring key its run config does not declare yet
    added (Flower refuses a run config key the app does not declare)."""
    text = (APP / "pyproject.toml").read_text()
    declared = tomllib.loads(text)["tool"]["flwr"]["app"]["config"]
    lacking = "".join(f"{k} = {v}\n" for k, v in SCORING_KEYS.items() if k not in declared)
    folder.mkdir(parents=True)
    (folder / "pyproject.toml").write_text(text.rstrip("\n") + "\n" + lacking)
    return folder


def test_over_flower_a_partner_gone_is_left_out_of_subset_scoring_and_a_revoked_coordinator_is_refused(
    tmp_path: Path,
) -> None:
    together, _ = _blocks()
    cls = get_method("laser_vfl")
    federation = start_federation(tmp_path, together, {}, proposals=[cls(**SETTINGS)])
    try:
        train_and_save(federation, cls(**SETTINGS), tmp_path / "models", "laser_vfl")
    finally:
        federation.stop()
    deploy = write_deploy(federation.deploy, tmp_path / "deploy.toml", deadline=60, addresses=False)
    test_file = str(federation.deploy.test_file)
    app = scoring_app(tmp_path / "app")
    flower = LocalFlower(tmp_path / "flower", {p: tmp_path / f"{p}.toml" for p in ("p1", "p2")}).start()
    try:
        # p2 leaves the federation (its worker and its SuperNode end): scoring with whoever answers goes on
        # without it, and says so row by row.
        stop_process(flower.processes["p2"])
        scores = tmp_path / "scores.csv"
        done = flower.run(app, {"model": str(tmp_path / "models"), "method": "laser_vfl", "data": test_file,
                                "deploy": str(deploy), "out": str(scores), "missing": "subset", "deadline": 60.0,
                                "connect-timeout": 10.0}, timeout=600)
        assert scores.is_file(), done.stdout[-4000:] + done.stderr[-3000:]
        frame = pd.read_csv(scores, dtype={"id": str})
        assert len(frame) == 100 and set(frame["scored_by"]) == {"a+p1"}
        assert "party p2 is absent" in done.stdout  # the ServerApp's log, streamed by flwr run
        # The same scores as in one process without p2: every part in one folder.
        saved = in_one_folder(tmp_path / "models", federation, "laser_vfl", ("p1",), tmp_path / "here")
        without = saved.score({"a": test_file, "p1": tmp_path / "p1_serve.csv"}, missing="subset")
        cols = saved.score_columns
        assert (frame["id"].to_numpy() == without[saved.id_column].astype(str).to_numpy()).all()
        assert np.allclose(frame[cols].to_numpy(), without[cols].to_numpy(), atol=1e-6)

        # The CA revokes the coordinator's certificate and the parties get the new list: with that certificate it
        # would be refused on its first frame (tests/test_flower.py shows it); without any keys, its frames are
        # plain, and refused as a frame from anyone else would be. p1 takes no part, and the coordinator scores
        # alone (as over gRPC, a partner that refuses it is absent).
        revoke_party(tmp_path / "certs", "a")
        keyless = tmp_path / "keyless.toml"
        keyless.write_text(re.sub(r'\[active\.tls\]\ndir = "[^"]*"', "[active.tls]\ninsecure = true",
                                  deploy.read_text()))
        assert "insecure = true" in keyless.read_text()
        out = tmp_path / "keyless.csv"
        done = flower.run(app, {"model": str(tmp_path / "models"), "method": "laser_vfl", "data": test_file,
                                "deploy": str(keyless), "out": str(out), "missing": "subset", "deadline": 60.0,
                                "connect-timeout": 10.0}, timeout=600)
        said = done.stdout[-4000:] + done.stderr[-3000:]
        assert out.is_file(), said
        assert set(pd.read_csv(out)["scored_by"]) == {"a"}, said
        assert "party p1 is absent" in said and "takes only sealed frames" in said, said
        assert "takes only sealed frames" in (flower.logs / "p1.log").read_text(errors="replace")
    finally:
        flower.stop()
