"""A lab whose config says only `[privacy] epsilon = 4`, served as its own process: the run calibrates its side to
that budget, trains, and reports ε ≤ 4 at the lab; a method it cannot cover (Entity Augmentation's guest), and a
run past what is left of its budget, are refused at setup with the figures, before anything trains."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import vertical_split
from tests.e2e.conftest import Federation, spawn, wait_listening, write_federation
from vflo.cli import main
from vflo.deploy import Deployment
from vflo.dp import SCOPE_END_TO_END
from vflo.errors import RemoteError
from vflo.methods.registry import get_method

pytestmark = pytest.mark.slow

QUICK = {"train": {"max_epochs": 2, "patience": 0, "batch_size": 64}}


def test_a_lab_with_only_a_target_epsilon_trains_within_it_and_refuses_past_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = write_federation(tmp_path, vertical_split(30), {})
    lab = files.configs["pas"]
    assert "[privacy]" not in lab.read_text()
    lab.write_text(lab.read_text() + "\n[privacy]\nepsilon = 4.0\n")  # and nothing else
    processes = {"pas": spawn(lab)}
    federation = Federation(deploy=files.deploy, local=files.local, processes=processes, directory=tmp_path)
    try:
        wait_listening(processes)
        deployment = Deployment(files.deploy)
        try:
            out = deployment.run(get_method("apc_vfl")(**QUICK), seed=1)
            assert 3.9 < out.stats["epsilon_account_pas"] <= 4.0
            assert out.account_scopes["pas"] == SCOPE_END_TO_END
            assert {"noise", "dp_sgd"} <= set(out.party_settings["pas"])
            with pytest.raises(RemoteError, match=r"entity_augmentation's passive side sends every one of its IDs to "
                                                  r"the host in the clear \(ids = 'clear'\).*ids = 'blinded'"):
                deployment.run(get_method("entity_augmentation")(**QUICK), seed=1)
            with pytest.raises(RemoteError, match=r"refuses apc_vfl at setup: even with the most noise.*budget ε = 4 "
                                                  r"at δ = 1e-05 \((4|3\.9\d) spent before it"):
                deployment.run(get_method("apc_vfl")(**QUICK), seed=2)
        finally:
            deployment.close()
    finally:
        federation.stop()
    # The lab's own audit shows its account: every person it released, at most ε 4.
    capsys.readouterr()
    assert main(["party", "audit", str(tmp_path / "pas_audit.jsonl")]) == 0
    shown = capsys.readouterr().out
    assert "privacy account of party pas" in shown
    figures = [float(line.split("│")[1]) for line in shown.splitlines() if line.count("│") == 3
               and line.split("│")[1].strip().replace(".", "", 1).isdigit()]
    assert figures and 3.9 < max(figures) <= 4.0
