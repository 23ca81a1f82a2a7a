"""A newcomer's walk with the repository's example files: export a deployment, edit it, export again (refused),
serve it, train twice, score with the first training, and find the in-process numbers in the deployed run."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.e2e.conftest import STARTUP_SECONDS, drain
from tests.test_names import _free_base_port
from vflo.cli import main
from vflo.methods.registry import get_method, method_names
from vflo.shelf import list_parts

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

# Every method that deploys on a layout of an active party and one partner (the second-hop methods need a party
# that shares people with the partner alone: tests/e2e/test_processes.py runs them over gRPC).
TWO_PARTY = [m for m in method_names() if not get_method(m).simulation_only and not m.startswith("vfl_asp")]
COMPARED = ["accuracy", "f1_macro", "roc_auc", "fit_rounds", "epochs"]


def _experiment(folder: Path) -> Path:
    """configs/examples/own_files.toml with one run of every two-party method at its quick settings."""
    import tomli_w

    base = (REPO / "configs/examples/own_files.toml").read_text().split("[scenario.sweep]")[0]
    # LDP's ε is per feature value: the hospital's nine columns at ε 1 each would pass the default budget of a
    # deployed party (ε 8, which a simulated party does not keep), so it refuses: ε 0.4 each stays under it.
    methods = [{"name": m, **get_method(m).quick, **({"epsilon": 0.4} if m == "ldp" else {})} for m in TWO_PARTY]
    text = base + tomli_w.dumps({"protocol": {"name": "repeated_runs", "runs": 1, "test_fraction": 0.25,
                                              "test_from": "aligned"},
                                 "methods": methods})
    path = folder / "configs/examples/newcomer.toml"
    path.write_text(text)
    return path


def _serve(config: Path) -> tuple[subprocess.Popen[str], list[str]]:
    """``vflo party serve NAME.toml`` from the export's folder, as its printed instructions say; what it prints."""
    proc = subprocess.Popen([sys.executable, "-m", "vflo", "party", "serve", config.name], cwd=config.parent,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + STARTUP_SECONDS
    while not any("listening on" in line for line in seen):
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError(f"{config.name} did not start: {''.join(seen)}")
        seen.append(proc.stdout.readline())
    return proc, drain(proc, seen)


def test_a_newcomers_deployment_loses_nothing_and_trains_as_its_simulation(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for folder in ("configs", "examples"):
        shutil.copytree(REPO / folder, tmp_path / folder)
    experiment = _experiment(tmp_path)
    dep = tmp_path / "deployment"
    export = ["scenario", str(experiment), "--export", str(dep), "--base-port", str(_free_base_port(4))]
    assert main(export) == 0
    capsys.readouterr()
    # the newcomer edits the deploy config, then exports again: refused, with or without --overwrite; nothing lost
    edited = (dep / "deploy.toml").read_text() + "# my change\n"
    (dep / "deploy.toml").write_text(edited)
    for extra in ([], ["--overwrite"]):
        assert main(export + extra) == 2
        err = capsys.readouterr().err
        assert "deploy.toml, which vflo scenario --export did not write there or which was edited since" in err
        assert (dep / "deploy.toml").read_text() == edited
    assert not list(dep.rglob("ca.key")), "the CA's key is never written beside the party configs"

    partners = sorted(p.stem for p in dep.glob("*.toml") if p.name != "deploy.toml")
    assert "lab" in partners
    servers = [_serve(dep / f"{name}.toml") for name in partners]
    try:
        first, second = tmp_path / "models1", tmp_path / "models2"
        for out, save in ((tmp_path / "deployed1", first), (tmp_path / "deployed2", second)):
            assert main(["run", str(experiment), "--deploy", str(dep / "deploy.toml"), "--out", str(out),
                         "--save", str(save), "--no-progress"]) == 0
        capsys.readouterr()
        # both trainings' parts live side by side at the lab, and the first training still scores with it
        lab_parts = list_parts(dep / "lab_models")
        assert {p.model_id for p in lab_parts if p.label == "splitnn"} == {
            pd.read_json(first / "splitnn" / "model.json", typ="series")["model_id"],
            pd.read_json(second / "splitnn" / "model.json", typ="series")["model_id"]}
        scores = tmp_path / "scores.csv"
        assert main(["predict", str(first), "--method", "splitnn", "--deploy", str(dep / "deploy.toml"),
                     "--data", str(dep / "hospital_serve.csv"), "--out", str(scores)]) == 0
        assert len(pd.read_csv(scores)) > 0
    finally:
        for proc, _ in servers:
            proc.terminate()
        for proc, _ in servers:
            proc.wait(timeout=20)
    lab_log = "".join(servers[partners.index("lab")][1])
    # the partner's terminal says what it did, at its default verbosity
    assert "hospital set up splitnn" in lab_log and "saved its part of splitnn" in lab_log, lab_log[-2000:]

    # the deployment trains to the in-process run's numbers, method by method
    assert main(["run", str(experiment), "--out", str(tmp_path / "simulated"), "--no-progress"]) == 0
    simulated = pd.read_csv(tmp_path / "simulated/results.csv").set_index("method")
    deployed = pd.read_csv(tmp_path / "deployed1/results.csv").set_index("method")
    assert (deployed.status == "ok").all(), deployed[deployed.status != "ok"].get("error")
    assert sorted(deployed.index) == sorted(TWO_PARTY)
    columns = [c for c in COMPARED if c in deployed.columns]
    pd.testing.assert_frame_equal(deployed.loc[TWO_PARTY, columns], simulated.loc[TWO_PARTY, columns],
                                  check_exact=True)
