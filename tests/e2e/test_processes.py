"""Every party its own process over gRPC with mutual TLS: the same results as in one process."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import make_dataset, two_party_spec
from tests.e2e.conftest import Federation, start_federation, stopped
from vflo.cli import main
from vflo.data.scenario import BlockSpec, PartySpec, SamplesSpec, ScenarioSpec
from vflo.deploy import Deployment, score_deployed
from vflo.errors import MethodError, TransportError
from vflo.federation.coordinator import AlignmentConfig
from vflo.federation.simulation import run_method
from vflo.methods.registry import get_method, method_names
from vflo.scoring import SavedModel

pytestmark = pytest.mark.slow
QUICK = {"max_epochs": 2, "patience": 0, "batch_size": 64}
SETTINGS = {"splitnn": {"train": QUICK}, "apc_vfl": {"train": QUICK}, "apc_vfl_aligned": {"train": QUICK},
            "ablation": {"train": QUICK}, "vfedtrans": {"train": QUICK},
            "entity_augmentation": {"train": {**QUICK, "validation_fraction": 0.0}},
            "rap": {"estimator": {"model": "mlp", "hidden": [16], "train": QUICK}},
            "ldp": {"estimator": {"model": "mlp", "hidden": [16], "train": QUICK}}}
CHAIN = ("vfl_asp", "vfl_asp_student")
CHAIN_TRAIN = {**QUICK, "validation_fraction": 0.0}
SETTINGS |= {m: {"train": CHAIN_TRAIN, "student_train": CHAIN_TRAIN, "embedding_train": CHAIN_TRAIN} for m in CHAIN}
DEPLOYABLE = [m for m in method_names()
              if not get_method(m).simulation_only and m != "entity_augmentation" and m not in CHAIN]


@pytest.fixture(scope="module")
def vertical(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federation]:
    ds = make_dataset(n=300, n_features=6)
    layout = two_party_spec(active=300, aligned=200).build(ds, seed=0)
    data = layout.materialize(test_ids=np.sort(layout.aligned_ids())[:40])
    yield from stopped(start_federation(tmp_path_factory.mktemp("vertical"), data,
                                        {"server": "server", "dealer": "dealer"}))


@pytest.fixture(scope="module")
def label_only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federation]:
    ds = make_dataset(n=300, n_features=6, n_classes=3)
    spec = ScenarioSpec(parties=(PartySpec(name="act", role="active", columns=()), PartySpec(name="g1", share=1.0),
                                 PartySpec(name="g2", share=1.0)),
                        samples=SamplesSpec(layout="misaligned", aligned=0.3))
    layout = spec.build(ds, seed=0)
    data = layout.materialize(test_ids=np.sort(layout.aligned_ids())[:30])
    yield from stopped(start_federation(tmp_path_factory.mktemp("label_only"), data, {}))


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federation]:
    """Active a, first hop p1 (overlaps a and p2), second hop p2 (overlaps p1 only): VFL-ASP's topology."""
    ds = make_dataset(n=400, n_features=9)
    spec = ScenarioSpec(parties=(PartySpec(name="p2", share=1.0), PartySpec(name="p1", share=1.0),
                                 PartySpec(name="a", role="active", share=1.0)),
                        samples=SamplesSpec(layout="blocks", blocks=(
                            BlockSpec(parties=("p1", "p2"), rows=120), BlockSpec(parties=("p1", "a"), rows=160),
                            BlockSpec(parties=("a",), rows=120))))
    layout = spec.build(ds, seed=0)
    data = layout.materialize(test_ids=np.sort(layout.aligned_ids())[:40])
    yield from stopped(start_federation(tmp_path_factory.mktemp("chain"), data,
                                        {"server": "server", "dealer": "dealer"}))


def _same(over_grpc, local) -> None:  # type: ignore[no-untyped-def]
    assert np.allclose(over_grpc.scores, local.scores, rtol=0, atol=1e-6)
    a, b = over_grpc.ledger.summary(), local.ledger.summary()
    assert (a.messages, a.bytes, a.rounds) == (b.messages, b.bytes, b.rounds)
    assert (a.align_bytes, a.align_rounds) == (b.align_bytes, b.align_rounds)


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
    local = run_method(get_method(name)(**SETTINGS.get(name, {})), vertical.local, seed=11)
    _same(over_grpc, local)


@pytest.mark.parametrize("name", CHAIN)
def test_second_hop_methods_give_the_same_results_over_grpc(chain: Federation, name: str, tmp_path: Path) -> None:
    over_grpc = _run_save_and_score(chain, name, 3, tmp_path)
    _same(over_grpc, run_method(get_method(name)(**SETTINGS[name]), chain.local, seed=3))


def test_entity_augmentation_over_grpc(label_only: Federation, tmp_path: Path) -> None:
    over_grpc = _run_save_and_score(label_only, "entity_augmentation", 5, tmp_path)
    _same(over_grpc, run_method(get_method("entity_augmentation")(**SETTINGS["entity_augmentation"]),
                                label_only.local, seed=5))


def test_psi_alignment_over_grpc(vertical: Federation) -> None:
    psi = AlignmentConfig(method="psi")
    deployment = Deployment(vertical.deploy)
    try:
        over_grpc = deployment.run(get_method("apc_vfl")(train=QUICK), seed=2, alignment=psi)
    finally:
        deployment.close()
    local = run_method(get_method("apc_vfl")(train=QUICK), vertical.local, seed=2, alignment=psi)
    _same(over_grpc, local)


@pytest.mark.parametrize("name", [m for m in method_names() if get_method(m).simulation_only])
def test_simulation_only_methods_cannot_be_deployed(vertical: Federation, name: str) -> None:
    deployment = Deployment(vertical.deploy)
    try:
        with pytest.raises(MethodError, match="exists only in simulation"):
            deployment.run(get_method(name)(), seed=0)
    finally:
        deployment.close()


def test_a_party_killed_mid_training_fails_the_method_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    ds = make_dataset(n=400, n_features=6)
    layout = two_party_spec(active=400, aligned=300).build(ds, seed=1)
    data = layout.materialize(test_ids=np.sort(layout.aligned_ids())[:40])
    federation = start_federation(tmp_path / "fed", data, {})
    try:
        experiment = tmp_path / "exp.toml"
        experiment.write_text('name = "killed"\n[[methods]]\nname = "splitnn"\n'
                              'train = { max_epochs = 200, patience = 0, batch_size = 8 }\n')
        deploy = tmp_path / "deploy.toml"
        d = federation.deploy
        assert d.active.data is not None
        peers = "\n".join(f'[[parties]]\nname = "{p.name}"\nrole = "{p.role}"\naddress = "{p.address}"'
                          for p in d.parties)
        deploy.write_text(
            f'test_file = "{d.test_file}"\n[active]\nname = "{d.active.name}"\nrole = "active"\n'
            f'listen = "{d.active.listen}"\ndeadline = 20.0\n[active.data]\nfile = "{d.active.data.file}"\n'
            f'id_column = "id"\nlabel_column = "label"\nstandardize = false\n[active.tls]\n'
            f'dir = "{d.active.tls.dir}"\n{peers}\n')
        killer = threading.Timer(8.0, federation.processes["pas"].kill)
        killer.start()
        out = tmp_path / "results"
        started = time.monotonic()
        code = main(["run", str(experiment), "--deploy", str(deploy), "--out", str(out)])
        elapsed = time.monotonic() - started
        killer.cancel()
        assert code == TransportError.exit_code == 4
        err = capsys.readouterr().err
        assert "party 'pas'" in err and "splitnn.forward" in err
        # the failure is recorded, whole: a results folder with the failed row and its error, nothing half-written
        import json

        results = json.loads((out / "results.json").read_text())
        assert [r["status"] for r in results["rows"]] == ["failed"] and results["failures"][0]["exit_code"] == 4
        assert "## Failures" in (out / "report.md").read_text()
        assert elapsed < 8.0 + 20.0 + 30.0  # the kill, the deadline, and start-up
    finally:
        federation.stop()
