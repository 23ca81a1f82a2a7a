"""Every registered transport under one contract, as `test_every_method.py` does for methods and `test_engines.py`
for alignment engines: its parties hosted here with mutual TLS, its coordinator beside them, and the same checks.

- a method with posted messages (SplitNN) and one whose parties send onward to another (RAP, through its server)
  give the numbers, messages, bytes and rounds of the same run in one process;
- alignment finds what ``numpy.intersect1d`` finds;
- a party's refusal comes back as its error, a party nobody deployed is named, and a party that stopped is absent
  alone: the others still answer;
- the registry, `vflo transports` and `vflo party serve --transport` know it, and a new transport is one module and
  one line (``tests/inproc_transport.py``, added here as its line would add it).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests import inproc_transport
from tests.conftest import PARTY_SEEDS, assert_same_run, own_sections, vertical_split
from vflo import transports
from vflo.align.engines import DEPLOYED_ALIGNMENT
from vflo.cli import main
from vflo.comm.local_ports import free_port
from vflo.comm.message import Message
from vflo.comm.tls import init_certs
from vflo.deploy import DataConfig, DeployConfig, Deployment, PartyConfig, PeerConfig, PeerEntry, TLSConfig
from vflo.deploy.kind import TransportKind
from vflo.errors import ConfigError, TransportError, VfloError
from vflo.federation.coordinator import Aligner
from vflo.federation.simulation import run_method
from vflo.methods.registry import get_method
from vflo.party.node import READY

QUICK = {"max_epochs": 2, "patience": 0, "batch_size": 64}
SETTINGS: dict[str, dict[str, Any]] = {
    "splitnn": {"train": QUICK},
    "rap": {"estimator": {"model": "mlp", "hidden": [16], "train": QUICK}},
}
SEED = 5
# The registered transports, and the one this module adds as a new transport's registry line would.
KINDS: dict[str, TransportKind] = {**transports.TRANSPORTS, inproc_transport.TRANSPORT.name: inproc_transport.TRANSPORT}


def _contract(kind: TransportKind, directory: Path) -> dict[str, Any]:
    """Host every party but the active one over ``kind``, coordinate beside them, and gather what each check needs."""
    data = vertical_split(30)
    roles = {"act": "active", "pas": "passive", "server": "server"}
    init_certs(directory / "certs", list(roles))
    tls = TLSConfig(dir=str(directory / "certs"))
    in_memory = DataConfig(file="in-memory", id_column="id")
    # Where each party listens, for a transport whose parties dial each other (RAP's passive party sends to its server).
    at = {name: f"127.0.0.1:{free_port()}" for name in roles}
    proposals = [get_method(n)(**s) for n, s in SETTINGS.items()]
    hosted = {}
    for name, role in roles.items():
        if role == "active":
            continue
        config = PartyConfig(
            name=name, role=role, listen=at[name], data=in_memory if name in data.train else None, tls=tls,
            peers={n: PeerEntry(address=at[n], role=r) for n, r in roles.items() if n != name},  # type: ignore[arg-type]
            seed=PARTY_SEEDS[name], methods=own_sections(proposals, role) if name in data.train else {},
            transport={"kind": kind.name})
        hosted[name] = kind.host(config, kind.settings({}, where=name), data=data.train.get(name),
                                 serve=data.serve.get(name))
    deploy = DeployConfig(
        active=PartyConfig(name="act", role="active", listen=at["act"], data=in_memory, tls=tls, deadline=20.0,
                           seed=PARTY_SEEDS["act"], transport={"kind": kind.name}),
        parties=tuple(PeerConfig(name=n, role=r) for n, r in roles.items() if r != "active"))  # type: ignore[arg-type]
    test = dataclasses.replace(data.serve["act"].subset(data.test_ids), y=data.test_y)

    def job(deploy: DeployConfig, link: Any) -> dict[str, Any]:
        deployment = Deployment(deploy, train=data.train["act"], test=test, link=link)
        out: dict[str, Any] = {}
        try:
            out["runs"] = {n: deployment.run(get_method(n)(**SETTINGS[n]), seed=SEED) for n in SETTINGS}
            aligner = Aligner(node=deployment.party.node, transport=deployment.party.transport,
                              parties=deployment.data_parties, alignment=DEPLOYED_ALIGNMENT)
            asked = np.sort(data.train["act"].ids)
            out["aligned"] = (aligner.align(asked, ["pas"]).ids, np.intersect1d(asked, data.train["pas"].ids))
            transport = deployment.party.transport
            out["refusal"] = transport.request(Message("act", "server", READY, 0,
                                                       payload={"save": True, "checkpoints": False}))
            try:
                transport.request(Message("act", "nobody", READY, 0, payload={"save": False, "checkpoints": False}))
            except VfloError as exc:
                out["stranger"] = exc
            hosted["server"].stop()
            began = time.monotonic()
            out["absent"] = transport.request_each([
                Message("act", "server", READY, 0, payload={"save": False, "checkpoints": False}),
                Message("act", "pas", READY, 0, payload={"save": False, "checkpoints": False})])
            out["absent_seconds"] = time.monotonic() - began
        finally:
            deployment.close()
        return out

    try:
        out = kind.coordinate(deploy, job, contacts={n: h.contact for n, h in hosted.items()})
    finally:
        for h in hosted.values():
            h.stop()
    out["data"] = data
    return out


@pytest.fixture(scope="module", params=list(KINDS))
def contract(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any]]:
    kind = KINDS[request.param]
    if kind.unavailable():
        pytest.skip(f"{kind.name}: {kind.unavailable()}")
    yield kind.name, _contract(kind, tmp_path_factory.mktemp(f"transport_{kind.name}"))


@pytest.mark.parametrize("method", list(SETTINGS))
def test_a_method_gives_the_same_run_as_in_one_process(contract: tuple[str, Any], method: str) -> None:
    _, out = contract
    local = run_method(get_method(method)(**SETTINGS[method]), out["data"], seed=SEED, party_seeds=PARTY_SEEDS,
                       alignment=DEPLOYED_ALIGNMENT)
    assert_same_run(out["runs"][method], local)


def test_alignment_finds_what_numpy_finds(contract: tuple[str, Any]) -> None:
    found, expected = contract[1]["aligned"]
    assert np.array_equal(np.sort(found), expected) and len(expected)


def test_a_refusal_is_the_partys_own_error_and_a_stranger_is_named(contract: tuple[str, Any]) -> None:
    _, out = contract
    refusal = out["refusal"]
    assert refusal.sender == "server" and refusal.error is not None and "folder" in refusal.error.message
    assert "nobody" in str(out["stranger"])


def test_a_party_that_stopped_is_absent_alone(contract: tuple[str, Any]) -> None:
    _, out = contract
    gone, there = out["absent"]
    assert isinstance(gone, TransportError) and "server" in str(gone)
    assert isinstance(there, Message) and there.sender == "pas" and there.error is None
    assert out["absent_seconds"] < 20.0  # within the coordinator's deadline


def test_each_transport_is_declared_whole() -> None:
    for name, kind in KINDS.items():
        assert kind.name == name and kind.about
        assert dataclasses.is_dataclass(kind.options) and kind.options.__dataclass_params__.frozen  # type: ignore[attr-defined]
        with pytest.raises(ConfigError, match="no_such_key"):
            kind.settings({"no_such_key": 1}, where=name)
    assert next(iter(transports.TRANSPORTS)) == transports.DEFAULT


def test_a_party_config_chooses_its_transport_and_a_wrong_one_is_named(tmp_path: Path) -> None:
    base = PartyConfig(name="pas", tls=TLSConfig(insecure=True), data=DataConfig(file="x.csv", id_column="id"))
    assert transports.of(base)[0].name == "grpc"
    flower, options = transports.of(dataclasses.replace(base, transport={"kind": "flower", "worker": "unix:/w"}))
    assert flower.name == "flower" and options.worker == "unix:/w"
    with pytest.raises(ConfigError, match="unknown transport 'flowr'.*did you mean.*flower"):
        transports.of(dataclasses.replace(base, transport={"kind": "flowr"}))
    with pytest.raises(ConfigError, match="workr"):
        transports.of(dataclasses.replace(base, transport={"kind": "flower", "workr": "unix:/w"}))
    with pytest.raises(ConfigError, match="--transport asks for 'grpc'"):
        transports.of(dataclasses.replace(base, transport={"kind": "flower", "worker": "unix:/w"}), kind="grpc")


def _party_file(tmp_path: Path, transport: str = "") -> Path:
    (tmp_path / "pas.csv").write_text("id,x\n1,0.5\n2,1.5\n")
    path = tmp_path / "pas.toml"
    path.write_text(f'name = "pas"\n[data]\nfile = "pas.csv"\nid_column = "id"\n[tls]\ninsecure = true\n'
                    f'[peers]\nact = {{ address = "127.0.0.1:1", role = "active" }}\n{transport}')
    return path


def test_a_new_transport_is_one_module_and_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """With its line in the registry, the command line lists it and serves a party over it."""
    monkeypatch.setitem(transports.TRANSPORTS, "inproc", inproc_transport.TRANSPORT)
    assert main(["transports"]) == 0
    assert "inproc" in capsys.readouterr().out
    # Its own serve runs (this one refuses: it hosts parties only beside the coordinator).
    assert main(["party", "serve", str(_party_file(tmp_path)), "--transport", "inproc"]) == 2
    assert "the inproc transport hosts a party only beside its coordinator" in capsys.readouterr().err


def test_serve_names_an_unknown_transport_and_grpc_takes_nothing_after_the_dashes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _party_file(tmp_path)
    assert main(["party", "serve", str(config), "--transport", "carrier-pigeon"]) == 2
    assert "unknown transport 'carrier-pigeon'" in capsys.readouterr().err
    assert main(["party", "serve", str(config), "--", "flower-supernode"]) == 2
    assert "over gRPC `vflo party serve` takes nothing after --" in capsys.readouterr().err


def test_deployed_commands_over_flower_say_how_its_coordinator_starts(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("flwr")
    (tmp_path / "act.csv").write_text("id,x,y\n1,0.5,0\n2,1.5,1\n")
    deploy = tmp_path / "deploy.toml"
    deploy.write_text('[active]\nname = "act"\n[active.data]\nfile = "act.csv"\nid_column = "id"\nlabel_column = "y"\n'
                      '[active.tls]\ninsecure = true\n[active.transport]\nkind = "flower"\n'
                      '[[parties]]\nname = "pas"\n')
    assert main(["align", str(deploy)]) == 2
    err = capsys.readouterr().err
    assert "over Flower the coordinator is a ServerApp" in err and "flwr run" in err
