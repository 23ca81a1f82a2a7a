"""A deployed party protects itself: a malicious peer with a valid certificate, over gRPC with mutual TLS, asks
for what its role does not allow; every attempt is refused, no row comes back, and the legitimate run completes."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import PARTY_SEEDS, vertical_split
from tests.e2e.conftest import Federation, start_federation, stopped
from tests.test_security import identity_masks
from vflo.comm.codec import encode
from vflo.comm.grpc_transport import GrpcTransport
from vflo.comm.message import Message
from vflo.comm.tls import PartyCredentials
from vflo.deploy import Deployment
from vflo.errors import RemoteError
from vflo.federation.simulation import run_method
from vflo.methods.registry import get_method

pytestmark = pytest.mark.slow
QUICK = {"max_epochs": 2, "patience": 0, "batch_size": 64}


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federation]:
    """Active, passive, server and dealer; the passive party agrees to run only FedSVD and SplitNN."""
    data = vertical_split(40)
    yield from stopped(start_federation(tmp_path_factory.mktemp("guarded"), data,
                                        {"server": "server", "dealer": "dealer"}, policy=("fedsvd", "splitnn")))


def impostor(federation: Federation, name: str) -> GrpcTransport:
    """A client holding party ``name``'s own certificate and key: that party, turned malicious."""
    addresses = {p.name: p.address for p in federation.deploy.parties}
    credentials = PartyCredentials.load(federation.directory / "certs", name)
    return GrpcTransport(name, addresses, credentials=credentials, deadline=30, retries=0)


def attacks(federation: Federation) -> list[tuple[str, str, dict[str, object]]]:
    """The issue's exfiltration by a malicious server, and what any peer could ask before: (sender, kind, payload)."""
    pas = federation.local.train["pas"]
    setup = {"method": "fedsvd", "config": get_method("fedsvd")().config_json(), "seed": 0, "save": False,
             "parties": json.dumps([["server", "active"], ["pas", "passive"]])}
    return [
        ("server", "control.setup", setup),
        ("server", "svd.masks", identity_masks(len(pas.ids), pas.n_features)),
        ("server", "svd.right", {"v": np.eye(pas.n_features)}),
        ("server", "svd.project", {"ids": federation.local.serve["pas"].ids}),
        ("server", "align.plain", {"ids": pas.ids, "split": "train"}),
        ("server", "svd.upload", {"selector": np.arange(len(pas.ids), dtype=np.int64)}),
        ("dealer", "control.ledger", {}),
        ("dealer", "control.teardown", {}),
        ("server", "split.activations", {"ids": pas.ids, "split": "train"}),
    ]


def test_a_malicious_server_gets_nothing_while_the_real_run_completes(guarded: Federation) -> None:
    reference = run_method(get_method("fedsvd")(), guarded.local, seed=5, party_seeds=PARTY_SEEDS)
    clients = {name: impostor(guarded, name) for name in ("server", "dealer")}
    deployment = Deployment(guarded.deploy)
    outcome: dict[str, object] = {}

    def legitimate() -> None:
        try:
            outcome["run"] = deployment.run(get_method("fedsvd")(), seed=5)
        except Exception as exc:  # reported below
            outcome["error"] = exc

    def attack(during_run: bool) -> None:
        for sender, kind, payload in attacks(guarded):
            if during_run and kind == "svd.right":
                # The server's own answer to an upload: a malicious server can always send a wrong V and spoil
                # the run (not obtain rows: V is unmasked with the party's secret Q). Sent before and after.
                continue
            message = Message(sender=sender, receiver="pas", kind=kind, round=1, payload=payload)  # type: ignore[arg-type]
            replies.append((kind, clients[sender].request(message)))

    replies: list[tuple[str, Message]] = []
    run = threading.Thread(target=legitimate)
    try:
        attack(during_run=False)
        run.start()
        while run.is_alive():
            attack(during_run=True)
        run.join()
        attack(during_run=False)
    finally:
        deployment.close()
        for client in clients.values():
            client.close()
    assert "error" not in outcome, outcome.get("error")
    assert np.allclose(outcome["run"].scores, reference.scores, rtol=0, atol=1e-6)  # type: ignore[attr-defined]
    assert len(replies) >= 2 * len(attacks(guarded))
    assert sum(r.error.type == "RefusedError" for _, r in replies) >= len(attacks(guarded))  # type: ignore[union-attr]
    for kind, reply in replies:
        assert reply.error is not None, kind  # refused; or nothing to ask of (no method set up, no such handler)
        # What came back is an error line: no array, no row, a few hundred bytes.
        assert reply.payload == {} and len(encode(reply)) < 1000, kind


def test_a_passive_party_cannot_set_up_another(tmp_path: Path) -> None:
    from tests.e2e.test_processes import chain_data

    federation = start_federation(tmp_path, chain_data(), {"server": "server", "dealer": "dealer"})
    try:
        p1 = impostor(federation, "p1")
        setup = {"method": "splitnn", "config": get_method("splitnn")().config_json(), "seed": 0, "save": False,
                 "parties": json.dumps([["p1", "active"], ["p2", "passive"]])}
        reply = p1.request(Message(sender="p1", receiver="p2", kind="control.setup", round=0, payload=setup))
        p1.close()
        assert reply.error is not None and reply.error.type == "RefusedError"
        assert "only the active party may set up a method" in reply.error.message
    finally:
        federation.stop()


def test_a_method_outside_a_partys_policy_is_refused_before_anything_runs(guarded: Federation) -> None:
    deployment = Deployment(guarded.deploy)
    try:
        with pytest.raises(RemoteError, match=r"party 'pas' does not agree to run apc_vfl: its policy allows only "
                                              r"fedsvd, splitnn"):
            deployment.run(get_method("apc_vfl")(train=QUICK), seed=0)
        out = deployment.run(get_method("splitnn")(train=QUICK), seed=0)  # within the policy: it runs
        assert len(out.scores) == len(guarded.local.test_ids)
    finally:
        deployment.close()
