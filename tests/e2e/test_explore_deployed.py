"""vflo explore across processes: the lab served as its own process over gRPC with mutual TLS, alignment by PSI,
gives the weight of evidence and information value of the same run in one process, and of a centralized
computation on the lab's own bins, to 1e-9, whether the hospital learns only how many people they share (the
default) or who (by PSI); a lab whose policy leaves explore off refuses, naming the key."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.conftest import vertical_split
from tests.e2e.conftest import Federation, spawn, wait_listening, write_deploy, write_federation
from vflo.cli import main
from vflo.explorer.run import explore
from vflo.explorer.woe import woe_iv
from vflo.party.explore import own_bins

pytestmark = pytest.mark.slow


def test_explore_over_grpc_equals_one_process_and_the_centralized_computation(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = write_federation(tmp_path, vertical_split(30), {})
    lab = files.configs["pas"]
    refused = {"pas": spawn(lab)}
    federation = Federation(deploy=files.deploy, local=files.local, processes=refused, directory=tmp_path)
    deploy = write_deploy(files.deploy, tmp_path / "deploy.toml")
    try:
        wait_listening(refused)
        assert main(["explore", "--deploy", str(deploy), "--out", str(tmp_path / "no")]) != 0
        assert "does not answer vflo explore" in capsys.readouterr().err
    finally:
        federation.stop()
    lab.write_text(lab.read_text() + "\n[policy]\nexplore = true\nexplore_bins = 8\nmin_bin_rows = 20\n"
                   "explore_answers = 2\nexplore_shared = \"ids\"\n")
    processes = {"pas": spawn(lab)}
    federation = Federation(deploy=files.deploy, local=files.local, processes=processes, directory=tmp_path)
    try:
        wait_listening(processes)
        # The default: the hospital learns how many people it shares with the lab, the lab matching blinded IDs;
        # then by the deployment's PSI, which the lab's policy allows too.
        for shared_as in ("count", "ids"):
            out = tmp_path / f"explored_{shared_as}"
            assert main(["explore", "--deploy", str(deploy), "--out", str(out), "--scheme", "ou",
                         "--shared", shared_as]) == 0
    finally:
        federation.stop()
    said = capsys.readouterr().out
    counted = json.loads((tmp_path / "explored_count" / "explore.json").read_text())
    assert counted["shared_as"] == "count" and "count only" in counted["alignment"]
    assert "who they are stays with the partner" in said
    # Aligned by private set intersection (a deployment's default): the engine that ran, or the intersection kept
    # by the first (refused) attempt, reused.
    assert json.loads((tmp_path / "explored_ids" / "explore.json").read_text())["alignment"] in \
        ("vflo", "rr22", "reused")
    active, passive = files.local.train[files.local.active], files.local.train["pas"]
    shared = np.intersect1d(active.ids, passive.ids)
    assert counted["shared"] == {"pas": len(shared)}
    local = explore(list(files.local.train.values()), scheme="plaintext", bins=8, min_bin_rows=20).table()
    for shared_as in ("count", "ids"):
        deployed = pd.read_csv(tmp_path / f"explored_{shared_as}" / "explore.csv")
        assert deployed["column"].tolist() == local["column"].tolist()
        assert np.allclose(deployed["iv"], local["iv"], rtol=0, atol=1e-9)
        # Centralized: the lab's own file and the hospital's labels, joined on the IDs they share.
        t = active.subset(shared).y
        for j, name in enumerate(passive.columns):
            codes, n_bins, _ = own_bins(passive.subset(shared).X[:, j].astype(np.float64), 8, 20)
            _, iv = woe_iv(np.bincount(codes, weights=t.astype(float), minlength=n_bins),  # type: ignore[union-attr]
                           np.bincount(codes, minlength=n_bins))
            assert abs(float(deployed.set_index("column").loc[name, "iv"]) - iv) < 1e-9, name


def test_a_deployed_partner_drops_its_weak_columns_and_trains_and_scores_without_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.e2e.conftest import train_and_save
    from vflo.methods.registry import get_method

    files = write_federation(tmp_path, vertical_split(30), {})
    lab = files.configs["pas"]
    # Its own selection: every column under IV 100 goes, that is all but its best one.
    lab.write_text(lab.read_text() + "\n[policy]\nexplore = true\nmin_bin_rows = 20\nselect_iv_below = 100.0\n")
    processes = {"pas": spawn(lab)}
    federation = Federation(deploy=files.deploy, local=files.local, processes=processes, directory=tmp_path)
    deploy = write_deploy(files.deploy, tmp_path / "deploy.toml")
    columns = files.local.train["pas"].columns
    try:
        wait_listening(processes)
        out = tmp_path / "explored"
        assert main(["explore", "--deploy", str(deploy), "--out", str(out), "--select"]) == 0
        found = json.loads((out / "explore.json").read_text())
        best = max(found["columns"], key=lambda c: c["iv"][0])["column"]
        assert sorted(found["dropped"]["pas"]) == sorted(c for c in columns if c != best)
        assert "pas dropped 2 of its columns by its own policy" in capsys.readouterr().out
        # Training after it reads the lab's one column, and the model it saves scores from its full serve file.
        quick = {"train": {"max_epochs": 2, "patience": 0, "batch_size": 64}}
        train_and_save(federation, get_method("splitnn")(**quick), tmp_path / "models", "sn")
        scores = tmp_path / "scores.csv"
        assert main(["predict", str(tmp_path / "models"), "--method", "sn", "--data", str(files.deploy.test_file),
                     "--deploy", str(deploy), "--out", str(scores)]) == 0
        assert len(pd.read_csv(scores)) == 30
    finally:
        federation.stop()
    manifest = next((tmp_path / "pas_models").rglob("manifest.json"))
    pre = json.loads(manifest.read_text())["preprocessing"]
    assert pre["columns"] == [best] and sorted(pre["dropped"]) == sorted(c for c in columns if c != best)
