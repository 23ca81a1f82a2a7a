"""Every party its own process over gRPC with mutual TLS: the same results as in one process."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import PARTY_SEEDS, assert_same_run, chain_data, make_dataset, two_party_spec, vertical_split
from tests.e2e.conftest import Federation, restart, start_federation, stopped, write_deploy
from tests.test_methods import needs_second_hop
from vflo.align import spu
from vflo.align.engines import DEPLOYED_ALIGNMENT, AlignmentConfig
from vflo.cli import main
from vflo.comm.codec import decode
from vflo.data.scenario import PartySpec, SamplesSpec, ScenarioSpec
from vflo.deploy import Deployment, score_deployed
from vflo.errors import MethodError, TransportError
from vflo.federation.simulation import run_method
from vflo.methods.base import Method
from vflo.methods.registry import get_method, method_names
from vflo.scoring import SavedModel

pytestmark = pytest.mark.slow
QUICK = {"max_epochs": 2, "patience": 0, "batch_size": 64}
# Every method with the settings it names for a short test run; the layouts its tags ask for: a second hop, a
# label-only host (such a method runs on the usual layout too: its host's columns make its own bottom).
SETTINGS = {m: dict(get_method(m).quick) for m in method_names()}
CHAIN = tuple(m for m in method_names() if needs_second_hop(m))
LABEL_ONLY = tuple(m for m in method_names() if get_method(m).label_only_active)
DEPLOYABLE = [m for m in method_names() if not get_method(m).simulation_only and m not in CHAIN]


def proposals(names: Sequence[str]) -> list[Method]:
    """The experiment's methods as these tests run them: each party's config sets its own side as they do."""
    return [get_method(n)(**SETTINGS.get(n, {})) for n in names]


@pytest.fixture(scope="module")
def vertical(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federation]:
    data = vertical_split(40)
    yield from stopped(start_federation(tmp_path_factory.mktemp("vertical"), data,
                                        {"server": "server", "dealer": "dealer"}, proposals=proposals(DEPLOYABLE)))


@pytest.fixture(scope="module")
def label_only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federation]:
    ds = make_dataset(n=300, n_features=6, n_classes=3)
    spec = ScenarioSpec(parties=(PartySpec(name="act", role="active", columns=()), PartySpec(name="g1", share=1.0),
                                 PartySpec(name="g2", share=1.0)),
                        samples=SamplesSpec(layout="misaligned", aligned=0.3))
    layout = spec.build(ds, seed=0)
    data = layout.materialize(test_ids=np.sort(layout.aligned_ids())[:30])
    yield from stopped(start_federation(tmp_path_factory.mktemp("label_only"), data, {},
                                        proposals=proposals(LABEL_ONLY)))


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federation]:
    yield from stopped(start_federation(tmp_path_factory.mktemp("chain"), chain_data(),
                                        {"server": "server", "dealer": "dealer"}, proposals=proposals(CHAIN)))




def _run_save_and_score(federation: Federation, name: str, seed: int, folder: Path):  # type: ignore[no-untyped-def]
    """Fit over gRPC with every party saving its own part, then score the test file again from the saved model,
    every party loading its part in its own process: the scores must be the in-memory model's, bit for bit."""
    deployment = Deployment(federation.deploy)
    try:
        over_grpc = deployment.run(get_method(name)(**SETTINGS.get(name, {})), seed=seed, save=(folder, name))
    finally:
        deployment.close()
    model = SavedModel.load(folder, name)
    assert federation.deploy.test_file is not None
    frame = score_deployed(federation.deploy, model, federation.deploy.test_file)
    assert np.array_equal(frame[model.score_columns].to_numpy(), over_grpc.scores.reshape(len(frame), -1))
    assert set(frame["model"]) == {name}
    return over_grpc


@pytest.mark.parametrize("name", DEPLOYABLE)
def test_every_method_gives_the_same_results_over_grpc(vertical: Federation, name: str, tmp_path: Path) -> None:
    over_grpc = _run_save_and_score(vertical, name, 11, tmp_path)
    local = run_method(get_method(name)(**SETTINGS.get(name, {})), vertical.local, seed=11, party_seeds=PARTY_SEEDS,
                       alignment=DEPLOYED_ALIGNMENT)
    assert_same_run(over_grpc, local)


@pytest.mark.parametrize("name", CHAIN)
def test_second_hop_methods_give_the_same_results_over_grpc(chain: Federation, name: str, tmp_path: Path) -> None:
    over_grpc = _run_save_and_score(chain, name, 3, tmp_path)
    assert_same_run(over_grpc, run_method(get_method(name)(**SETTINGS[name]), chain.local, seed=3,
                                          party_seeds=PARTY_SEEDS, alignment=DEPLOYED_ALIGNMENT))


@pytest.mark.parametrize("name", LABEL_ONLY)
def test_label_only_host_methods_over_grpc(label_only: Federation, name: str, tmp_path: Path) -> None:
    over_grpc = _run_save_and_score(label_only, name, 5, tmp_path)
    assert_same_run(over_grpc, run_method(get_method(name)(**SETTINGS[name]), label_only.local, seed=5,
                                          party_seeds=PARTY_SEEDS, alignment=DEPLOYED_ALIGNMENT))


def test_psi_alignment_over_grpc(vertical: Federation) -> None:
    psi = AlignmentConfig(method="psi")
    deployment = Deployment(vertical.deploy)
    try:
        over_grpc = deployment.run(get_method("apc_vfl")(train=QUICK), seed=2, alignment=psi)
    finally:
        deployment.close()
    local = run_method(get_method("apc_vfl")(train=QUICK), vertical.local, seed=2, alignment=psi,
                       party_seeds=PARTY_SEEDS)
    assert_same_run(over_grpc, local)


@pytest.mark.skipif(bool(spu.missing()), reason=spu.missing() or "installed")
def test_the_psi_librarys_rr22_over_its_own_mutual_tls_link(vertical: Federation) -> None:
    """Each party its own process: the intersection by RR22 over the library's link, TLS with the parties' own
    certificates, gives the run vflo's own ECDH gives in one process; its link's bytes are in the ledger."""
    deployment = Deployment(vertical.deploy)
    rr22 = AlignmentConfig(method="psi", engine="rr22")
    try:
        # The checks before anything trains intersect by RR22 too, before any method is set up.
        deployment.preflight([get_method("apc_vfl")(train=QUICK)], alignment=rr22)
        over_grpc = deployment.run(get_method("apc_vfl")(train=QUICK), seed=2, alignment=rr22)
    finally:
        deployment.close()
    local = run_method(get_method("apc_vfl")(train=QUICK), vertical.local, seed=2,
                       alignment=AlignmentConfig(method="psi"), party_seeds=PARTY_SEEDS)
    assert np.array_equal(over_grpc.scores, local.scores)
    assert (over_grpc.psi_engine, local.psi_engine) == ("rr22", "vflo")
    linked = [e for e in over_grpc.ledger.entries if e.kind == "align.engine.rr22"]
    passives = [p for p in vertical.local.parties if p.role == "passive"]
    assert len(linked) == 2 * len(passives) and all(e.nbytes > 0 for e in linked)


@pytest.mark.parametrize("name", [m for m in method_names() if get_method(m).simulation_only])
def test_simulation_only_methods_cannot_be_deployed(vertical: Federation, name: str) -> None:
    deployment = Deployment(vertical.deploy)
    try:
        with pytest.raises(MethodError, match="exists only in simulation"):
            deployment.run(get_method(name)(), seed=0)
    finally:
        deployment.close()


def splitnn_deployment(tmp_path: Path, seed: int, train: str) -> tuple[Federation, Path, Path]:
    """Two party processes, a SplitNN experiment with ``train`` settings, and the active party's deploy config."""
    ds = make_dataset(n=400, n_features=6)
    layout = two_party_spec(active=400, aligned=300).build(ds, seed=seed)
    data = layout.materialize(test_ids=np.sort(layout.aligned_ids())[:40])
    federation = start_federation(tmp_path / "fed", data, {})
    experiment = tmp_path / "exp.toml"
    experiment.write_text(f'name = "killed"\n[[methods]]\nname = "splitnn"\ntrain = {{ {train} }}\n')
    return federation, experiment, write_deploy(federation.deploy, tmp_path / "deploy.toml")


def test_a_party_killed_mid_training_fails_the_method_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    from vflo.methods import splitnn

    federation, experiment, deploy = splitnn_deployment(tmp_path, 1, "max_epochs = 200, patience = 0, batch_size = 8")
    # Killed at the active party's 40th training step: mid-training however slow the start-up was.
    step = splitnn._SplitTrainer.train_step
    steps = [0]

    def counting(self: splitnn._SplitTrainer, batch: np.ndarray, upcoming: np.ndarray | None) -> float:
        steps[0] += 1
        if steps[0] == 40:
            federation.processes["pas"].kill()
        return step(self, batch, upcoming)

    monkeypatch.setattr(splitnn._SplitTrainer, "train_step", counting)
    try:
        out = tmp_path / "results"
        started = time.monotonic()
        code = main(["run", str(experiment), "--deploy", str(deploy), "--out", str(out)])
        elapsed = time.monotonic() - started
        assert code == TransportError.exit_code == 4
        err = capsys.readouterr().err
        assert "party 'pas'" in err and "splitnn.forward" in err
        # the failure is recorded, whole: a results folder with the failed row and its error, nothing half-written
        import json

        results = json.loads((out / "results.json").read_text())
        assert [r["status"] for r in results["rows"]] == ["failed"] and results["failures"][0]["exit_code"] == 4
        assert "## Failures" in (out / "report.md").read_text()
        assert steps[0] >= 40 and elapsed < 20.0 + 60.0  # the deadline, start-up and 40 steps
    finally:
        federation.stop()


def test_a_run_resumed_after_a_party_was_killed_ends_with_the_uninterrupted_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """Kill the passive party mid-run, start it again, resume: the same model as a run never interrupted."""
    import json

    federation, experiment, deploy = splitnn_deployment(
        tmp_path, 2, "max_epochs = 60, patience = 100, batch_size = 8, checkpoint_every = 5")
    try:
        run = ["run", str(experiment), "--deploy", str(deploy), "--no-progress"]
        assert main([*run, "--out", str(tmp_path / "plain"), "--save", str(tmp_path / "plain_model")]) == 0
        plain = json.loads((tmp_path / "plain" / "results.json").read_text())["rows"][0]

        # Kill the passive party once it holds its third checkpoint (after epoch 15 of 60).
        mine, theirs = tmp_path / "checkpoints", federation.directory / "pas_checkpoints"

        def kill_after_third_checkpoint() -> None:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                if len(list(theirs.glob("*/epoch-*/pas/manifest.json"))) >= 3:
                    federation.processes["pas"].kill()
                    return
                time.sleep(0.01)

        killer = threading.Thread(target=kill_after_third_checkpoint)
        killer.start()
        code = main([*run, "--out", str(tmp_path / "killed"), "--checkpoints", str(mine)])
        killer.join()
        assert code == TransportError.exit_code
        assert "party 'pas'" in capsys.readouterr().err
        held = sorted(p.parent.parent.name for p in theirs.glob("*/epoch-*/pas/manifest.json"))
        assert len(held) >= 3 and held[-1] != "epoch-00059"  # killed before the end
        # Each party kept only its own checkpoints, in its own folder.
        assert {p.name for p in mine.glob("*/epoch-*/*") if not p.name.startswith(".")} == {"act"}
        assert {p.name for p in theirs.glob("*/epoch-*/*") if not p.name.startswith(".")} == {"pas"}

        restart(federation, "pas")
        assert main([*run, "--out", str(tmp_path / "resumed"), "--checkpoints", str(mine), "--resume",
                     "--save", str(tmp_path / "resumed_model")]) == 0
        results = json.loads((tmp_path / "resumed" / "results.json").read_text())
        resumed = results["rows"][0]
        assert resumed["resumed_after_epoch"] >= 15
        # Its ledger holds only what came after the restart: marked so, with the traffic before and the total
        # (the run never interrupted sent no checkpoint messages, and the epochs after the last checkpoint were
        # sent twice: the totals are close, not equal).
        assert resumed["fit_traffic_scope"].startswith("after the restart only")
        assert resumed["fit_bytes_total"] == resumed["fit_bytes"] + resumed["before_resume_bytes"]
        assert resumed["fit_bytes_total"] == pytest.approx(plain["fit_bytes"], rel=0.1)
        assert "MB before it" in (tmp_path / "resumed" / "report.md").read_text()
        # As complete as a simulated run's: the config, the environment, the ledger by kind, the labels.
        assert results["config"]["name"] and results["environment"]["vflo"] and results["started"]
        assert "splitnn.forward" in results["communication"][0]["by_kind"]
        assert results["labels"]["task"] == "binary" and "positive" in results["labels"]
        for metric in ("accuracy", "f1_macro", "epochs"):
            assert resumed[metric] == plain[metric], metric
        assert resumed["fit_rounds"] < plain["fit_rounds"]
        # The same model to the last bit: the active party's bottom and top (the top was trained on the
        # passive party's activations, so its weights differ if the passive party's network did).
        states = [decode((tmp_path / f / "splitnn" / "act" / "state.vflo").read_bytes()).payload
                  for f in ("plain_model", "resumed_model")]
        assert states[0].keys() == states[1].keys()
        for key, value in states[0].items():
            assert np.array_equal(value, states[1][key]) if isinstance(value, np.ndarray) else value == states[1][key]
    finally:
        federation.stop()
