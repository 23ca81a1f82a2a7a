"""A real Flower deployment on this machine: SuperLink, a SuperNode per party, `flwr run` of vflo's app.

The results `flwr run` writes are those of the same methods in one process on the same files: the same
scores and the same communication, counted from every party's own ledger.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.conftest import PARTY_SEEDS, REPO, vertical_split
from tests.e2e.conftest import write_deploy, write_federation
from vflo.federation.simulation import run_method
from vflo.flower.local import LocalFlower
from vflo.methods.registry import get_method
from vflo.metrics import compute_metrics

pytestmark = pytest.mark.slow
APP = REPO / "examples" / "flower"


def test_flwr_run_of_vflos_app_gives_the_in_process_results_and_refuses_what_a_party_did_not_agree_to(
    tmp_path: Path,
) -> None:
    files = write_federation(tmp_path, vertical_split(40), {"server": "server", "dealer": "dealer"},
                             policy=("apc_vfl", "rap"),
                             proposals=[get_method("apc_vfl")(train={"max_epochs": 2, "patience": 0,
                                                                     "batch_size": 64})])
    deploy = write_deploy(files.deploy, tmp_path / "deploy.toml", deadline=300, addresses=False)
    experiment = tmp_path / "experiment.toml"
    experiment.write_text(
        'name = "over_flower"\nseed = 4\n'
        '[[methods]]\nname = "apc_vfl"\ntrain = { max_epochs = 2, patience = 0, batch_size = 64 }\n'
        '[[methods]]\nname = "fedsvd"\n')
    flower = LocalFlower(tmp_path, files.configs).start()
    try:
        done = flower.run(APP, {"experiment": str(experiment), "deploy": str(deploy), "out": str(tmp_path / "out")},
                          timeout=900)
    finally:
        flower.stop()
    logs = {p.stem: p.read_text(errors="replace") for p in (tmp_path / "logs").glob("*.log")}
    said = done.stdout[-4000:] + done.stderr[-3000:]
    assert done.returncode == 0 and (tmp_path / "out" / "results.json").is_file(), said
    rows = {r["method"]: r for r in json.loads((tmp_path / "out" / "results.json").read_text())["rows"]}
    # The lab agreed to APC-VFL and RAP only: FedSVD is refused there, before anything trains, and said so. (RAP
    # runs over Flower in tests/e2e/test_flower_docs.py; each method here costs Flower's polling per message.)
    assert rows["fedsvd"]["status"] == "failed" and "does not agree to run fedsvd" in rows["fedsvd"]["error"]
    from vflo.experiments.config import load_deployment_experiment

    loaded = load_deployment_experiment(experiment)
    entries = {e.label: e for e in loaded.methods}
    for name in ("apc_vfl",):
        row = rows[name]
        assert row["status"] == "ok", row
        local = run_method(entries[name].instantiate(), files.local, seed=_seed(experiment), party_seeds=PARTY_SEEDS,
                           alignment=loaded.alignment)
        metrics = compute_metrics(files.local.task, files.local.test_y, local.scores)
        assert row["accuracy"] == pytest.approx(metrics["accuracy"], abs=0)
        summary = local.ledger.summary()
        assert (row["comm_bytes"], row["comm_messages"], row["comm_rounds"]) == (
            summary.bytes, summary.messages, summary.rounds)
        if row.get("psi_engine") == "reused":
            # The checks before training intersected by PSI and each party kept it: the run reused that, cheaper
            # than the fresh intersection of the run in one process.
            assert 0 < row["align_bytes"] < summary.align_bytes
        else:
            assert row["align_bytes"] == summary.align_bytes
    assert (tmp_path / "out" / "report.md").read_text().startswith("# over_flower (deployed)")
    assert "worker listening on unix:" in logs["pas"]
    results = pd.read_csv(tmp_path / "out" / "results.csv")
    assert set(results["method"]) == {"apc_vfl", "fedsvd"}
    assert np.isfinite(results.loc[results["status"] == "ok", "accuracy"]).all()


def _seed(experiment: Path) -> int:
    from vflo.experiments.config import load_deployment_experiment
    from vflo.seeding import derive_seed

    return derive_seed(load_deployment_experiment(experiment).seed, "method", 0, 0)
