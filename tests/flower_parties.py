"""Parties of a simulated split as Flower would run them: a worker per party, a deploy config for the ServerApp."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509

from tests.conftest import PARTY_SEEDS, own_sections
from vflo.comm.pki import ISSUED_FILE, revoke
from vflo.comm.tls import init_certs
from vflo.data.layout import FederatedData
from vflo.data.partydata import PartyData
from vflo.deploy import DataConfig, DeployConfig, PartyConfig, PeerConfig, PeerEntry, TLSConfig
from vflo.flower.worker import PartyWorker
from vflo.party.policy import Policy
from vflo.roles import Role


@dataclass
class FlowerParties:
    deploy: DeployConfig
    workers: list[PartyWorker]
    train: PartyData
    test: PartyData

    @property
    def addresses(self) -> list[str]:
        return [w.address for w in self.workers]

    def stop(self) -> None:
        for w in self.workers:
            w.stop()


def start_workers(directory: Path, data: FederatedData, extra_roles: dict[str, Role], *,
                  tls: bool = True, policy: tuple[str, ...] = (), proposals: Sequence[Any] = (),
                  models: bool = False) -> FlowerParties:
    """Every party but the active one as a :class:`PartyWorker` on a Unix socket in ``directory``, holding its
    rows of ``data``; the active party's deploy config (its rows are handed to the deployment directly). With
    ``models``, each keeps its saved parts in ``directory/NAME_models``, as a deployed party's ``models`` folder."""
    active = data.active
    roles: dict[str, Role] = {p.name: p.role for p in data.parties} | extra_roles
    if tls:
        init_certs(directory / "certs", list(roles))
    security = TLSConfig(dir=str(directory / "certs")) if tls else TLSConfig(insecure=True)
    in_memory = DataConfig(file="in-memory", id_column="id")
    workers = []
    for name, role in roles.items():
        if name == active:
            continue
        config = PartyConfig(name=name, role=role, data=in_memory if name in data.train else None, tls=security,
                             peers={n: PeerEntry(role=r) for n, r in roles.items() if n != name},
                             policy=Policy(methods=policy), seed=PARTY_SEEDS[name],
                             models=str(directory / f"{name}_models") if models else None,
                             methods=own_sections(proposals, role) if name in data.train else {})
        workers.append(PartyWorker(config, address=f"unix:{directory / name}.sock", data=data.train.get(name),
                                   serve=data.serve.get(name)).start())
    deploy = DeployConfig(active=PartyConfig(name=active, role="active", data=in_memory, tls=security,
                                             seed=PARTY_SEEDS[active]),
                          parties=tuple(PeerConfig(name=n, role=r) for n, r in roles.items() if n != active))
    test = PartyData(party=active, ids=data.test_ids, X=data.serve[active].subset(data.test_ids).X,
                     columns=data.serve[active].columns, y=data.test_y)
    return FlowerParties(deploy=deploy, workers=workers, train=data.train[active], test=test)


def revoke_party(certs: Path, party: str) -> None:
    """What the CA does to revoke ``party``'s certificate, in a folder `vflo certs init` made (the CA's and every
    party's files in one, so every party reads the new crl.pem at once)."""
    serial = format(x509.load_pem_x509_certificate((certs / f"{party}.pem").read_bytes()).serial_number, "x")
    # `vflo certs init` keeps no record of what it signed: the record the CA's revocation reads, written here.
    record = certs / ISSUED_FILE
    signed = json.loads(record.read_text()) if record.is_file() else []
    record.write_text(json.dumps([*signed, {"serial": serial, "party": party, "revoked": None}]))
    revoke(certs, party)
