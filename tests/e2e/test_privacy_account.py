"""A lab served as its own process keeps its privacy account in its folder: killed and started again between
runs, it refuses the run past its default budget as it would have without the restart."""

from __future__ import annotations

import stat
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import vertical_split
from tests.e2e.conftest import restart, start_federation
from vflo.deploy import Deployment
from vflo.dp import DEFAULT_BUDGET, gdp_epsilon
from vflo.errors import RemoteError
from vflo.methods.registry import get_method

pytestmark = pytest.mark.slow

#: APC-VFL's one upload of the lab's latents, noised at σ = 2: μ = 1 a run (ε 4.4 at δ 1e-5); two runs fit in the
#: default ε = 8, a third does not.
NOISED = {"noise": {"clip": 1.0, "noise_multiplier": 2.0, "delta": 1e-5},
          "train": {"max_epochs": 2, "patience": 0, "batch_size": 64}}


def test_a_lab_restarted_between_runs_continues_its_account_and_refuses_past_its_budget(tmp_path: Path) -> None:
    assert gdp_epsilon(np.sqrt(2.0), 1e-5) < DEFAULT_BUDGET.epsilon < gdp_epsilon(np.sqrt(3.0), 1e-5)
    federation = start_federation(tmp_path, vertical_split(30), {}, proposals=[get_method("apc_vfl")(**NOISED)])
    try:
        for seed, refused in ((1, False), (2, False), (3, True)):
            deployment = Deployment(federation.deploy)
            try:
                if refused:
                    with pytest.raises(RemoteError, match="past its budget"):
                        deployment.run(get_method("apc_vfl")(**NOISED), seed=seed)
                else:
                    deployment.run(get_method("apc_vfl")(**NOISED), seed=seed)
            finally:
                deployment.close()
            # The lab's process ends between runs and starts again from its config, as an operator restarts it.
            federation.processes["pas"].terminate()
            try:
                federation.processes["pas"].wait(timeout=10)
            except subprocess.TimeoutExpired:
                federation.processes["pas"].kill()
            restart(federation, "pas")
    finally:
        federation.stop()
    account = tmp_path / "pas_privacy.jsonl"
    assert stat.S_IMODE(account.stat().st_mode) == 0o600
