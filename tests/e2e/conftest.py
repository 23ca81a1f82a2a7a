"""Start real party processes on 127.0.0.1 for end-to-end tests; always stop them."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tests.conftest import PARTY_SEEDS
from vflo.comm.local_ports import free_port
from vflo.comm.tls import init_certs
from vflo.data.layout import FederatedData
from vflo.data.partydata import PartyData
from vflo.deploy import (
    DataConfig,
    DeployConfig,
    PartyConfig,
    PeerConfig,
    TLSConfig,
    load_party_data,
    own_settings_toml,
)
from vflo.methods.base import Method
from vflo.scoring import SavedModel

STARTUP_SECONDS = 90




@dataclass
class Federation:
    """Party processes, the deploy config for the active party, and the same data for a local run."""

    deploy: DeployConfig
    local: FederatedData
    processes: dict[str, subprocess.Popen[str]]
    directory: Path

    def stop(self) -> None:
        for proc in self.processes.values():
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 10
        for proc in self.processes.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)


def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    return str(v)


def write_party_toml(path: Path, fields: dict[str, object], data: dict[str, object] | None, tls_dir: Path,
                     peers: dict[str, tuple[str, str]], policy: tuple[str, ...] = (),
                     proposals: Sequence[Method] = ()) -> None:
    """A party's config; ``peers``: each peer's address and the role this party knows it by; ``proposals``: the
    methods (with their configs) whose own side this party's ``[methods.NAME]`` sets as they do, as an export
    writes it."""
    lines = [f"{k} = {_toml_value(v)}" for k, v in fields.items()]
    if policy:
        lines += ["[policy]", f"methods = [{', '.join(_toml_value(m) for m in policy)}]"]
    lines += own_settings_toml(proposals, str(fields["role"]))  # type: ignore[arg-type]
    if data is not None:
        lines += ["[data]", *(f"{k} = {_toml_value(v)}" for k, v in data.items())]
    lines += ["[tls]", f'dir = "{tls_dir}"', "[peers]",
              *(f'{k} = {{ address = "{a}", role = "{r}" }}' for k, (a, r) in peers.items())]
    path.write_text("\n".join(lines) + "\n")


def spawn(config: Path) -> subprocess.Popen[str]:
    """``vflo party serve CONFIG`` in its own process."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    return subprocess.Popen([sys.executable, "-m", "vflo", "party", "serve", str(config)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)


def drain(proc: subprocess.Popen[str], seen: list[str] | None = None) -> list[str]:
    """Read what ``proc`` prints from now on, in a thread, into a list (returned): a serving party talks at INFO, and
    a pipe nobody reads would block it once full."""
    import threading

    lines: list[str] = [] if seen is None else seen
    stream = proc.stdout
    assert stream is not None

    def read() -> None:
        for line in stream:
            lines.append(line)

    threading.Thread(target=read, daemon=True).start()
    return lines


def wait_listening(processes: dict[str, subprocess.Popen[str]]) -> None:
    deadline = time.monotonic() + STARTUP_SECONDS
    for name, proc in processes.items():
        assert proc.stdout is not None
        line = ""
        while "listening on" not in line:
            if time.monotonic() > deadline or proc.poll() is not None:
                rest = proc.stdout.read() if proc.poll() is not None else ""
                raise RuntimeError(f"party {name} did not start: {line!r}{rest}")
            line = proc.stdout.readline()


def restart(federation: Federation, name: str) -> None:
    """Start a party again from its config after it was killed (same address, same folders)."""
    federation.processes[name] = spawn(federation.directory / f"{name}.toml")
    wait_listening({name: federation.processes[name]})


@dataclass
class FederationFiles:
    """What each party of a simulated split brings to a deployment, written out, and the same data read back."""

    deploy: DeployConfig
    local: FederatedData
    configs: dict[str, Path]
    directory: Path


def write_federation(directory: Path, data: FederatedData, extra_roles: dict[str, str],
                     policy: tuple[str, ...] = (), proposals: Sequence[Method] = ()) -> FederationFiles:
    """Each party's files, certificates and config (every party but the active one: NAME.toml; the active
    party: a deploy config), with a free loopback port each; with ``policy``, every such party agrees to run
    only those methods."""
    active = data.active
    names = {p.name: p.role for p in data.parties} | extra_roles
    init_certs(directory / "certs", list(names))
    addresses = {n: f"127.0.0.1:{free_port()}" for n in names}
    files: dict[str, DataConfig] = {}
    for name, train in data.train.items():
        train_path = directory / f"{name}_train.csv"
        train.to_frame(id_column="id", label_column="label").to_csv(train_path, index=False)
        serve_path = directory / f"{name}_serve.csv"
        data.serve[name].to_frame(id_column="id").to_csv(serve_path, index=False)
        files[name] = DataConfig(file=str(train_path), id_column="id",
                                 label_column="label" if name == active else None, serve_file=str(serve_path),
                                 standardize=False)
    test = PartyData(party=active, ids=data.test_ids, X=data.serve[active].subset(data.test_ids).X,
                     columns=data.serve[active].columns, y=data.test_y)
    test_path = directory / f"{active}_test.csv"
    test.to_frame(id_column="id", label_column="label").to_csv(test_path, index=False)
    configs: dict[str, Path] = {}
    for name, role in names.items():
        if name == active:
            continue
        cfg = directory / f"{name}.toml"
        data_fields = None
        if name in files:
            f = files[name]
            data_fields = {"file": f.file, "id_column": f.id_column, "serve_file": f.serve_file, "standardize": False}
        # Each party's own model and checkpoint folders: parts it saves after training and loads to score.
        write_party_toml(cfg, {"name": name, "role": role, "listen": addresses[name], "seed": PARTY_SEEDS[name],
                               "models": str(directory / f"{name}_models"),
                               "checkpoints": str(directory / f"{name}_checkpoints")}, data_fields,
                         directory / "certs", {n: (a, names[n]) for n, a in addresses.items() if n != name},
                         policy=policy, proposals=proposals)
        configs[name] = cfg
    deploy = DeployConfig(
        active=PartyConfig(name=active, role="active", listen=addresses[active], data=files[active],
                           tls=TLSConfig(dir=str(directory / "certs")), deadline=120.0, seed=PARTY_SEEDS[active]),
        parties=tuple(PeerConfig(name=n, role=r, address=addresses[n]) for n, r in names.items()  # type: ignore[arg-type]
                      if n != active),
        test_file=str(test_path),
    )
    # The local run reads the very same files, so both sides see identical numbers.
    local_train, local_serve = {}, {}
    for name in data.train:
        tables = load_party_data(name, files[name])
        local_train[name], local_serve[name] = tables.train, tables.serve
    # Files are read with their IDs as text, on both sides.
    local = FederatedData(parties=data.parties, train=local_train, serve=local_serve,  # type: ignore[arg-type]
                          test_ids=data.test_ids.astype(str), test_y=data.test_y, task=data.task,
                          n_classes=data.n_classes,
                          oracle=data.oracle)
    return FederationFiles(deploy=deploy, local=local, configs=configs, directory=directory)


def start_federation(directory: Path, data: FederatedData, extra_roles: dict[str, str],
                     policy: tuple[str, ...] = (), proposals: Sequence[Method] = ()) -> Federation:
    """Write each party's files, start every non-active party as `vflo party serve`, wait until they listen;
    with ``policy``, every such party agrees to run only those methods; each sets its own side of the
    ``proposals`` as they do."""
    files = write_federation(directory, data, extra_roles, policy, proposals)
    processes: dict[str, subprocess.Popen[str]] = {}
    try:
        for name, cfg in files.configs.items():
            processes[name] = spawn(cfg)
        wait_listening(processes)
    except BaseException:
        Federation(deploy=None, local=data, processes=processes, directory=directory).stop()  # type: ignore[arg-type]
        raise
    return Federation(deploy=files.deploy, local=files.local, processes=processes, directory=directory)


def write_deploy(d: DeployConfig, path: Path, deadline: float = 20.0, *, addresses: bool = True) -> Path:
    """The active party's deploy config, as a user would write it (over Flower, without addresses)."""
    assert d.active.data is not None
    peers = "\n".join(f'[[parties]]\nname = "{p.name}"\nrole = "{p.role}"'
                      + (f'\naddress = "{p.address}"' if addresses else "") for p in d.parties)
    path.write_text(
        f'test_file = "{d.test_file}"\n[active]\nname = "{d.active.name}"\nrole = "active"\n'
        f'listen = "{d.active.listen}"\ndeadline = {deadline}\nseed = {PARTY_SEEDS[d.active.name]}\n'
        f'[active.data]\nfile = "{d.active.data.file}"\n'
        f'id_column = "id"\nlabel_column = "label"\nstandardize = false\n[active.tls]\n'
        f'dir = "{d.active.tls.dir}"\n{peers}\n')
    return path


def train_and_save(federation: Federation, method: Method, models: Path, label: str, *, seed: int = 4) -> None:
    """Train ``method`` over the running federation and save it: the active party's part under ``models``, each
    partner's in its own models folder."""
    from vflo.deploy import Deployment

    deployment = Deployment(federation.deploy)
    try:
        deployment.run(method, seed=seed, save=(models, label))
    finally:
        deployment.close()


def in_one_folder(models: Path, federation: Federation, label: str, partners: Sequence[str],
                  folder: Path) -> SavedModel:
    """The saved model ``label`` with every partner's part (kept under the training's model ID) copied beside the
    active party's into ``folder``: what scoring in one process loads."""
    import shutil

    from vflo.artifacts import ModelCard

    shutil.copytree(models, folder)
    model_id = ModelCard.read(folder / label).model_id
    for party in partners:
        shutil.copytree(federation.directory / f"{party}_models" / label / model_id / party, folder / label / party)
    return SavedModel.load(folder, label)


def stopped(federation: Federation) -> Iterator[Federation]:
    try:
        yield federation
    finally:
        federation.stop()


__all__ = ["Federation", "FederationFiles", "free_port", "in_one_folder", "np", "restart", "start_federation",
           "stopped", "train_and_save", "write_deploy", "write_federation"]
