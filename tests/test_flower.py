"""vflo over Flower: the same numbers as in one process, and a hub that can route but not read or forge.

The equivalence tests run Flower's simulation runtime (virtual SuperNodes, Ray); the rest drive the same
ClientApp adapter, workers and transport through a loopback grid in this process. A real SuperLink and
SuperNodes as processes are in tests/e2e/test_flower_deployment.py.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pandas as pd
import pytest
from flwr.app import Error
from flwr.app import Message as FlowerMessage

from tests.conftest import PARTY_SEEDS, assert_same_run, chain_data, vertical_split
from tests.flower_parties import FlowerParties, revoke_party, start_workers
from tests.test_laser_vfl import TRAIN, _blocks
from vflo.align.engines import DEPLOYED_ALIGNMENT
from vflo.comm.codec import decode, encode
from vflo.comm.grpc_transport import pack_frames, unpack_frames
from vflo.comm.message import Message
from vflo.comm.relay import FINAL, parse_outcome
from vflo.comm.seal import MAGIC, Keyring
from vflo.comm.tls import PartyCredentials
from vflo.deploy import Deployment, PartyConfig, PeerEntry, TLSConfig, score_deployed
from vflo.errors import ConfigError, DeliveryTimeoutError, PartyBoundaryError, TransportError
from vflo.federation.simulation import RunOutput, run_method
from vflo.flower.adapter import RECORD, call_worker, forward
from vflo.flower.apps import FlowerRun, flower_link, scoring_link
from vflo.flower.simulation import run_in_simulation
from vflo.flower.transport import FlowerGrid, discover
from vflo.flower.worker import PartyWorker, check_local, supernode_command
from vflo.methods.registry import get_method
from vflo.scoring import SavedModel

QUICK = {"max_epochs": 2, "patience": 0, "batch_size": 64}
CHAIN_TRAIN = {**QUICK, "validation_fraction": 0.0}
SETTINGS: dict[str, dict[str, Any]] = {
    "apc_vfl": {"train": QUICK}, "fedsvd": {}, "splitnn": {"train": QUICK},
    "rap": {"estimator": {"model": "mlp", "hidden": [16], "train": QUICK}},
    "vfl_asp": {"train": CHAIN_TRAIN, "student_train": CHAIN_TRAIN, "embedding_train": CHAIN_TRAIN},
}
VERTICAL = ("apc_vfl", "rap", "fedsvd", "splitnn")
# Each party's own side of these methods, set in its config as the experiment sets it (as an export writes it).
PROPOSALS = [get_method(n)(**s) for n, s in SETTINGS.items()]


def _runs(parties: FlowerParties, names: Iterable[str], seed: int) -> dict[str, RunOutput]:
    def job(deployment: Deployment) -> dict[str, RunOutput]:
        return {n: deployment.run(get_method(n)(**SETTINGS[n]), seed=seed) for n in names}

    return run_in_simulation(parties.deploy, parties.addresses, job, train=parties.train, test=parties.test)


@pytest.fixture(scope="module")
def vertical_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, RunOutput], Any]]:
    data = vertical_split(40)
    parties = start_workers(tmp_path_factory.mktemp("flower_vertical"), data, {"server": "server", "dealer": "dealer"},
                            proposals=PROPOSALS)
    try:
        yield _runs(parties, VERTICAL, seed=11), data
    finally:
        parties.stop()


@pytest.fixture(scope="module")
def chain_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, RunOutput], Any]]:
    data = chain_data()
    parties = start_workers(tmp_path_factory.mktemp("flower_chain"), data, {"server": "server", "dealer": "dealer"},
                            proposals=PROPOSALS)
    try:
        yield _runs(parties, ["vfl_asp"], seed=3), data
    finally:
        parties.stop()




@pytest.mark.parametrize("name", VERTICAL)
def test_a_method_gives_the_same_results_over_flower_simulation(vertical_runs: Any, name: str) -> None:
    runs, data = vertical_runs
    assert_same_run(runs[name], run_method(get_method(name)(**SETTINGS[name]), data, seed=11, party_seeds=PARTY_SEEDS,
                                           alignment=DEPLOYED_ALIGNMENT))


def test_vfl_asp_second_hop_is_relayed_sealed_and_gives_the_same_results(chain_runs: Any) -> None:
    runs, data = chain_runs
    out = runs["vfl_asp"]
    assert_same_run(out, run_method(get_method("vfl_asp")(**SETTINGS["vfl_asp"]), data, seed=3,
                                    party_seeds=PARTY_SEEDS, alignment=DEPLOYED_ALIGNMENT))
    # p1 drives p2 through the ServerApp: those frames travel sealed, and the seal is transport framing,
    # outside the frame bytes that match the in-process run.
    relayed = [e for e in out.ledger.entries if {e.sender, e.receiver} == {"p1", "p2"}]
    assert relayed and all(150 < e.framing < 260 for e in relayed)
    # The coordinator seals what it sends as well (so that every party checks its certificate); its parties'
    # answers to it go plain, in the framing of a batch at most.
    sent = [e for e in out.ledger.entries if e.sender == "a" and e.direction == "request"]
    assert sent and all(150 < e.framing < 260 + 8 for e in sent)
    answered = [e for e in out.ledger.entries if e.receiver == "a"]
    assert answered and all(e.framing in (0, 8) for e in answered)


def test_masked_svd_uploads_cross_the_hub_sealed(vertical_runs: Any) -> None:
    runs, _ = vertical_runs
    upload = [e for e in runs["fedsvd"].ledger.entries if e.sender == "pas" and e.receiver in ("server", "dealer")]
    assert upload and all(150 < e.framing < 260 for e in upload)


# -- a loopback grid: Flower's Message objects, delivered through the real ClientApp adapter -----------------


class LoopbackGrid:
    """What FlowerGrid uses of a Flower Grid, delivering each message to its worker through the adapter."""

    def __init__(self, workers: dict[int, str]) -> None:
        self.workers = workers
        self.replies: dict[str, FlowerMessage] = {}
        self.outcomes: list[bytes] = []  # every delivery's outcome, as the hub sees it
        self.delivered: list[bytes] = []  # every delivery's body, as the hub sent it
        self.silent: set[int] = set()  # SuperNodes that take messages and never answer (gone without a word)
        self._ids = itertools.count(1)

    def get_node_ids(self) -> list[int]:
        return list(self.workers)

    def push_messages(self, messages: Iterable[FlowerMessage]) -> list[str]:
        ids = []
        for m in messages:
            message_id = f"m{next(self._ids)}"
            m.metadata.__dict__["_message_id"] = message_id
            ids.append(message_id)
            if m.metadata.dst_node_id in self.silent:
                continue
            if m.content[RECORD]["op"] == "deliver":
                self.delivered.append(bytes(m.content[RECORD]["body"]))  # type: ignore[arg-type]
            try:
                reply = forward(m, self.workers[m.metadata.dst_node_id])
            except grpc.RpcError as exc:  # the worker is gone: Flower answers with the ClientApp's error
                self.replies[message_id] = FlowerMessage(Error(code=0, reason=str(exc.details())), reply_to=m)
                continue
            if m.content[RECORD]["op"] in ("deliver", "resume"):
                self.outcomes.append(bytes(reply.content[RECORD]["body"]))  # type: ignore[arg-type]
            self.replies[message_id] = reply
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[FlowerMessage]:
        return [self.replies.pop(i) for i in message_ids if i in self.replies]


@pytest.fixture(autouse=True)
def _flower_task_identity() -> Iterator[None]:
    """Flower stamps each Message with the run and node it is created in; outside a runtime, set them as one would."""
    from flwr.supercore.task_identity import TaskIdentity

    names = ("_task_id", "_run_id", "_node_id")
    saved = [getattr(TaskIdentity, n) for n in names]
    for n in names:
        setattr(TaskIdentity, n, 1)
    try:
        yield
    finally:
        for n, value in zip(names, saved, strict=True):
            setattr(TaskIdentity, n, value)


@pytest.fixture
def loopback(tmp_path: Path) -> Iterator[tuple[FlowerParties, LoopbackGrid, Path]]:
    parties = start_workers(tmp_path, chain_data(), {"server": "server", "dealer": "dealer"}, proposals=PROPOSALS)
    grid = LoopbackGrid({100 + i: a for i, a in enumerate(parties.addresses)})
    try:
        yield parties, grid, tmp_path
    finally:
        parties.stop()


def _keyring(directory: Path, party: str) -> Keyring:
    return Keyring(PartyCredentials.load(directory / "certs", party))


def test_the_loopback_grid_runs_a_relayed_method_like_flower(loopback: Any) -> None:
    parties, grid, directory = loopback
    flower = FlowerGrid(grid)  # type: ignore[arg-type]
    keyring = _keyring(directory, "a")
    nodes = discover(flower, ["p1", "p2", "server", "dealer"], keyring=keyring, timeout=5)
    deployment = Deployment(parties.deploy, train=parties.train, test=parties.test,
                            link=flower_link(flower, nodes, deadline=60, keyring=keyring))
    try:
        out = deployment.run(get_method("vfl_asp")(**SETTINGS["vfl_asp"]), seed=3)
    finally:
        deployment.close()
    assert_same_run(out, run_method(get_method("vfl_asp")(**SETTINGS["vfl_asp"]), chain_data(), seed=3,
                                    party_seeds=PARTY_SEEDS, alignment=DEPLOYED_ALIGNMENT))
    # What p1 and p2 said to each other crossed the hub only sealed: none of those frames is readable there.
    onward = [parse_outcome(b, max_bytes=1 << 30)[1:] for b in grid.outcomes if b[:1] == b"O"]
    between = [frames for receiver, frames in onward if receiver != "a"]
    assert between and all(f.startswith(MAGIC) for frames in between for f in frames)


def test_a_reply_the_hub_forged_for_another_party_is_refused(tmp_path: Path) -> None:
    from vflo.comm.relay import RelayTransport
    from vflo.comm.tls import init_certs

    init_certs(tmp_path / "certs", ["a", "p1", "p2"])
    p1 = _keyring(tmp_path, "p1")
    p1.add_peers({"p2": (tmp_path / "certs" / "p2.pem").read_bytes()})
    transport = RelayTransport("p1", hub="a", keyring=p1, deadline=5)
    outcome: list[BaseException | Message] = []

    def send() -> None:
        try:
            outcome.append(transport.request(Message(sender="p1", receiver="p2", kind="vfl_asp.x", round=1)))
        except BaseException as exc:
            outcome.append(exc)

    import threading

    thread = threading.Thread(target=send)
    thread.start()
    receiver, frames = parse_outcome(transport.outbox.get(timeout=5), max_bytes=1 << 30)[1:]
    assert receiver == "p2" and frames[0].startswith(MAGIC)
    # The hub answers in p2's name, without p2's seal.
    transport.inbox.put(pack_frames([encode(Message(sender="p2", receiver="p1", kind="vfl_asp.x", round=1))]))
    thread.join(timeout=5)
    assert isinstance(outcome[0], PartyBoundaryError) and "not sealed by it" in str(outcome[0])


def test_discover_names_the_parties_with_no_supernode(loopback: Any) -> None:
    _parties, grid, directory = loopback
    grid.workers.pop(min(grid.workers))
    with pytest.raises(TransportError, match=r"no SuperNode serves \['p2'\].*vflo flower party"):
        discover(grid, ["p2", "p1"], keyring=_keyring(directory, "a"), timeout=0.2)  # type: ignore[arg-type]


def test_a_supernode_that_cannot_prove_its_party_is_refused(loopback: Any, tmp_path_factory: Any) -> None:
    _parties, _grid, directory = loopback
    # A worker with a certificate from another CA, claiming to be p1.
    other = tmp_path_factory.mktemp("other_ca")
    from vflo.comm.tls import init_certs

    init_certs(other / "certs", ["p1", "a"])
    config = PartyConfig(name="p1", role="server", tls=TLSConfig(dir=str(other / "certs")),
                         peers={"a": PeerEntry(role="active")})
    impostor = PartyWorker(config, address=f"unix:{other / 'p1.sock'}").start()
    try:
        with pytest.raises(PartyBoundaryError, match="not issued by"):
            discover(LoopbackGrid({1: impostor.address}), ["p1"], keyring=_keyring(directory, "a"),  # type: ignore[arg-type]
                     timeout=1)
    finally:
        impostor.stop()


def _deliver(address: str, message: Message) -> Message:
    out = call_worker(address, "deliver", pack_frames([encode(message)]))
    tag, _, frames = parse_outcome(out, max_bytes=1 << 30)
    assert tag == FINAL
    return decode(frames[0])


def test_the_hub_cannot_speak_for_another_party(loopback: Any) -> None:
    parties, _grid, directory = loopback
    p1 = parties.workers[[w.name for w in parties.workers].index("p1")]
    # A plain frame is refused whoever it claims to come from: the coordinator seals its own frames too.
    for claimed in ("a", "server", "p2"):
        reply = _deliver(p1.address, Message(sender=claimed, receiver="p1", kind="control.teardown", round=0))
        assert reply.error is not None and "takes only sealed frames" in reply.error.message
    # Sealed by the coordinator, a message in another party's name is refused before any handler.
    hub = _keyring(directory, "a")
    hub.add_peers({"p1": (directory / "certs" / "p1.pem").read_bytes()})
    call_worker(p1.address, "peers", _directory(directory, ["a", "p1"]))
    forged = hub.seal(encode(Message(sender="server", receiver="p1", kind="control.teardown", round=0)), "p1")
    reply = decode(parse_outcome(call_worker(p1.address, "deliver", pack_frames([forged])), max_bytes=1 << 30)[2][0])
    assert reply.error is not None and "claiming to come from 'server'" in reply.error.message
    # A stranger is refused as over gRPC.
    stranger = hub.seal(encode(Message(sender="mallory", receiver="p1", kind="control.teardown", round=0)), "p1")
    reply = decode(parse_outcome(call_worker(p1.address, "deliver", pack_frames([stranger])),
                                 max_bytes=1 << 30)[2][0])
    assert reply.error is not None and "not a configured peer" in reply.error.message


def _directory(directory: Path, names: list[str]) -> bytes:
    """The certificates the hub hands every party (``peers``), as discover sends them."""
    return json.dumps({n: (directory / "certs" / f"{n}.pem").read_text() for n in names}).encode()


def test_the_coordinators_frames_are_sealed_and_a_revoked_coordinator_is_refused_from_its_next_frame(
    loopback: Any,
) -> None:
    parties, grid, directory = loopback
    keyring = _keyring(directory, "a")
    flower = FlowerGrid(grid)  # type: ignore[arg-type]
    nodes = discover(flower, ["p1", "p2"], keyring=keyring, timeout=5)
    deployment = Deployment(parties.deploy, train=parties.train, test=parties.test,
                            link=flower_link(flower, nodes, deadline=10, keyring=keyring))
    transport = deployment.party.transport
    try:
        teardown = Message(sender="a", receiver="p1", kind="control.teardown", round=0)
        assert transport.request(teardown).error is None
        # What the coordinator sent crossed the SuperLink sealed, as every other party's frames do.
        assert grid.delivered and all(f.startswith(MAGIC) for body in grid.delivered
                                    for f in unpack_frames(body, max_bytes=1 << 30))
        revoke_party(directory / "certs", "a")  # the CA's new list reaches the parties
        refused = transport.request(teardown)
        assert refused.error is not None and "revoked by the federation's CA" in refused.error.message
        # A party the CA revoked is refused by the coordinator too, before anything is sent to it.
        revoke_party(directory / "certs", "p2")
        with pytest.raises(TransportError, match="'p2' is refused.*revoked.*nothing was sent"):
            transport.request(Message(sender="a", receiver="p2", kind="control.teardown", round=0))
    finally:
        deployment.close()


def test_a_coordinator_without_its_keys_or_its_certificate_is_refused(loopback: Any) -> None:
    parties, grid, directory = loopback
    p1 = next(w for w in parties.workers if w.name == "p1")
    # The hub hands out every certificate but the coordinator's own: refused, whatever it sends later.
    refused = json.loads(call_worker(p1.address, "peers", _directory(directory, ["p1", "p2", "server"])))
    assert "no certificate of the coordinator 'a'" in refused["error"]
    # A coordinator that runs without its keys (say, one whose certificate was revoked) sends plain frames: every
    # party that has its own keys refuses them.
    nodes = discover(grid, ["p1"], keyring=None, timeout=5)  # type: ignore[arg-type]
    deployment = Deployment(parties.deploy, train=parties.train, test=parties.test,
                            link=flower_link(FlowerGrid(grid), nodes, deadline=10))  # type: ignore[arg-type]
    try:
        reply = deployment.party.transport.request(Message(sender="a", receiver="p1", kind="control.teardown",
                                                           round=0))
        assert reply.error is not None and "takes only sealed frames" in reply.error.message
    finally:
        deployment.close()


def test_a_sealed_frame_is_checked_against_who_sealed_it(loopback: Any) -> None:
    parties, grid, directory = loopback
    p1 = next(w for w in parties.workers if w.name == "p1")
    nodes = discover(grid, ["p1", "p2", "server", "dealer"], keyring=_keyring(directory, "a"),  # type: ignore[arg-type]
                     timeout=5)
    assert set(nodes) == {"p1", "p2", "server", "dealer"}
    server = _keyring(directory, "server")
    server.add_peers({"p1": (directory / "certs" / "p1.pem").read_bytes()})
    # The server seals a message that says it comes from p2: refused, it is the server's seal.
    forged = Message(sender="p2", receiver="p1", kind="control.teardown", round=0)
    out = call_worker(p1.address, "deliver", pack_frames([server.seal(encode(forged), "p1")]))
    frames = parse_outcome(out, max_bytes=1 << 30)[2]
    reply = decode(server.open(frames[0])[1])
    assert reply.error is not None and "sealed by 'server'" in reply.error.message
    # The same sealed frame twice: the copy is refused.
    honest = server.seal(encode(Message(sender="server", receiver="p1", kind="control.teardown", round=0)), "p1")
    call_worker(p1.address, "deliver", pack_frames([honest]))
    out = call_worker(p1.address, "deliver", pack_frames([honest]))
    reply = decode(parse_outcome(out, max_bytes=1 << 30)[2][0])
    assert reply.error is not None and "arrived twice" in reply.error.message
    # A sealed frame altered on the way does not open.
    tampered = bytearray(server.seal(encode(forged), "p1"))
    tampered[-1] ^= 1
    out = call_worker(p1.address, "deliver", pack_frames([bytes(tampered)]))
    reply = decode(parse_outcome(out, max_bytes=1 << 30)[2][0])
    assert reply.error is not None and "signature" in reply.error.message


def test_a_party_that_does_not_answer_is_absent_alone_within_the_deadline(loopback: Any) -> None:
    parties, grid, directory = loopback
    keyring = _keyring(directory, "a")
    flower = FlowerGrid(grid, deadline=0.5)  # type: ignore[arg-type]
    nodes = discover(flower, ["p1", "p2"], keyring=keyring, timeout=5)
    deployment = Deployment(parties.deploy, train=parties.train, test=parties.test,
                            link=flower_link(flower, nodes, deadline=0.5, keyring=keyring))
    try:
        grid.silent.add(nodes["p2"])  # its SuperNode takes the message and is never heard of again
        asked = [Message(sender="a", receiver=r, kind="control.teardown", round=0) for r in ("p1", "p2", "server")]
        p1, p2, server = deployment.party.transport.request_each(asked)
        assert isinstance(p1, Message) and p1.error is None
        assert isinstance(p2, DeliveryTimeoutError) and "'p2' did not answer" in str(p2)
        # The server's SuperNode was not found when the run connected: unreachable, as a gRPC peer not listening.
        assert isinstance(server, TransportError) and "no SuperNode served it" in str(server)
    finally:
        deployment.close()


LASER = {"train": {**TRAIN, "max_epochs": 2}}


def test_scoring_with_whoever_answers_over_flower_goes_on_without_a_partner_that_is_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The scoring session of `vflo predict --missing subset`, over Flower: p2's worker stops once the first batch
    is scored; the rest is scored without it, each row says who scored it, and the scores are those of the same
    pattern in one process."""
    together, _ = _blocks()
    laser = get_method("laser_vfl")
    parties = start_workers(tmp_path, together, {}, proposals=[laser(**LASER)], models=True)
    grid = LoopbackGrid({100 + i: a for i, a in enumerate(parties.addresses)})
    try:
        keyring = _keyring(tmp_path, "a")
        flower = FlowerGrid(grid)  # type: ignore[arg-type]
        nodes = discover(flower, ["p1", "p2"], keyring=keyring, timeout=5)
        deployment = Deployment(parties.deploy, train=parties.train, test=parties.test,
                                link=flower_link(flower, nodes, deadline=60, keyring=keyring))
        try:
            deployment.run(laser(**LASER), seed=4, save=(tmp_path / "models", "laser_vfl"))
        finally:
            deployment.close()
        model = SavedModel.load(tmp_path / "models", "laser_vfl")
        monkeypatch.setattr("vflo.scoring.SCORE_BATCH", 50)
        p2 = next(w for w in parties.workers if w.name == "p2")
        predict_by = laser.predict_by
        batches: list[int] = []

        def score(stop_after: int | None = None) -> pd.DataFrame:
            def then_stop(self, fed, ids):  # type: ignore[no-untyped-def]
                out = predict_by(self, fed, ids)
                batches.append(len(ids))
                if len(batches) == stop_after:
                    p2.stop()
                return out

            batches.clear()
            monkeypatch.setattr(laser, "predict_by", then_stop)
            link = scoring_link(grid, parties.deploy, model, missing="subset", deadline=5, timeout=1)  # type: ignore[arg-type]
            return score_deployed(parties.deploy, model, parties.test, missing="subset",  # type: ignore[arg-type]
                                  deadline=5, link=link)

        everyone = score()
        assert set(everyone["scored_by"]) == {"a+p1+p2"}
        frame = score(stop_after=1)
        assert batches == [50, 50]
        assert list(frame["scored_by"]) == ["a+p1+p2"] * 50 + ["a+p1"] * 50
        # p2 stays away: the next session goes on without it from the start (its worker does not answer).
        without = score()
        assert set(without["scored_by"]) == {"a+p1"}
        cols = model.score_columns
        expected = np.vstack([everyone[cols].to_numpy()[:50], without[cols].to_numpy()[50:]])
        assert np.allclose(frame[cols].to_numpy(), expected, atol=1e-6)
        assert not np.allclose(everyone[cols].to_numpy(), without[cols].to_numpy(), atol=1e-6)
    finally:
        parties.stop()


def test_a_delivery_cannot_start_while_another_waits_and_resume_needs_one(loopback: Any) -> None:
    parties, _, _ = loopback
    p1 = next(w for w in parties.workers if w.name == "p1")
    out = call_worker(p1.address, "resume", pack_frames([b"x"]))
    reply = decode(parse_outcome(out, max_bytes=1 << 30)[2][0])
    assert reply.error is not None and "waits for no onward answer" in reply.error.message
    out = call_worker(p1.address, "deliver", b"not frames")
    reply = decode(parse_outcome(out, max_bytes=1 << 30)[2][0])
    assert reply.error is not None and "malformed" in reply.error.message


def test_a_worker_listens_only_locally_and_names_the_fix() -> None:
    assert check_local("unix:/tmp/x.sock") == "unix:/tmp/x.sock"
    assert check_local("127.0.0.1:9000") == "127.0.0.1:9000"
    with pytest.raises(ConfigError, match="listens only locally.*unix:PATH or 127.0.0.1:PORT"):
        check_local("0.0.0.0:9000")


def test_a_worker_needs_tls_keys_or_says_it_runs_insecure(tmp_path: Path) -> None:
    config = PartyConfig(name="p1", role="server", peers={"a": PeerEntry(role="active")})
    with pytest.raises(ConfigError, match=r"give \[tls\] dir.*insecure = true"):
        PartyWorker(config, address=f"unix:{tmp_path / 's.sock'}")
    two_active = PartyConfig(name="p1", role="server", tls=TLSConfig(insecure=True),
                             peers={"a": PeerEntry(role="active"), "b": PeerEntry(role="active")})
    with pytest.raises(ConfigError, match="exactly one peer must have role 'active'"):
        PartyWorker(two_active, address=f"unix:{tmp_path / 's.sock'}")


def test_the_supernode_command_gets_the_worker_and_refuses_its_own_node_config() -> None:
    command = supernode_command(["flower-supernode", "--insecure", "--superlink", "127.0.0.1:9092"], "unix:/s")
    assert command[-2:] == ["--node-config", "vflo-worker='unix:/s'"]
    assert Path(command[0]).name == "flower-supernode"
    with pytest.raises(ConfigError, match="leave --node-config out"):
        supernode_command(["flower-supernode", "--node-config", "x=1"], "unix:/s")


def test_the_run_config_names_what_is_missing() -> None:
    with pytest.raises(ConfigError, match="needs 'deploy'.*--run-config"):
        FlowerRun.from_run_config({"experiment": "e.toml", "out": "o"})
    run = FlowerRun.from_run_config({"experiment": "e.toml", "deploy": "d.toml", "out": "o", "connect-timeout": 5.0})
    assert run.connect_timeout == 5.0
    # Scoring with a saved model: the rows to score instead of an experiment, and vflo predict's options.
    with pytest.raises(ConfigError, match="needs 'data'.*model="):
        FlowerRun.from_run_config({"model": "m", "deploy": "d.toml", "out": "s.csv", "experiment": ""})
    with pytest.raises(ConfigError, match="both an experiment.*and a model"):
        FlowerRun.from_run_config({"model": "m", "data": "r.csv", "deploy": "d.toml", "out": "s.csv",
                                   "experiment": "e.toml"})
    with pytest.raises(ConfigError, match="missing"):
        FlowerRun.from_run_config({"model": "m", "data": "r.csv", "deploy": "d.toml", "out": "s.csv",
                                   "missing": "some"})
    run = FlowerRun.from_run_config({"model": "m", "data": "r.csv", "deploy": "d.toml", "out": "s.csv",
                                     "missing": "subset", "deadline": 30.0})
    assert (run.missing, run.deadline) == ("subset", 30.0)


def test_insecure_parties_still_refuse_strangers_and_give_the_same_results(tmp_path: Path) -> None:
    data = vertical_split(40)
    parties = start_workers(tmp_path, data, {}, tls=False, proposals=PROPOSALS)
    grid = LoopbackGrid({7: parties.addresses[0]})
    try:
        nodes = discover(grid, ["pas"], keyring=None, timeout=5)  # type: ignore[arg-type]
        deployment = Deployment(parties.deploy, train=parties.train, test=parties.test,
                                link=flower_link(FlowerGrid(grid), nodes, deadline=60))  # type: ignore[arg-type]
        try:
            out = deployment.run(get_method("apc_vfl")(**SETTINGS["apc_vfl"]), seed=11)
        finally:
            deployment.close()
        assert_same_run(out, run_method(get_method("apc_vfl")(**SETTINGS["apc_vfl"]), data, seed=11,
                                        party_seeds=PARTY_SEEDS, alignment=DEPLOYED_ALIGNMENT))
        reply = _deliver(parties.addresses[0], Message(sender="mallory", receiver="pas", kind="control.teardown",
                                                      round=0))
        assert reply.error is not None and "not a configured peer" in reply.error.message
    finally:
        parties.stop()



def test_only_the_parties_the_methods_need_are_waited_for(tmp_path: Path) -> None:
    from vflo.flower.apps import needed_parties

    parties = start_workers(tmp_path, vertical_split(40), {"server": "server", "dealer": "dealer"})
    parties.stop()
    deploy = parties.deploy
    assert needed_parties(deploy, [get_method("apc_vfl")()]) == ["pas"]
    assert needed_parties(deploy, [get_method("rap")()]) == ["pas", "server"]
    assert needed_parties(deploy, [get_method("fedsvd")(), get_method("local")()]) == ["pas", "server", "dealer"]


def test_vflo_flower_party_refuses_a_config_without_keys_with_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    from vflo.cli import main

    config = tmp_path / "server.toml"
    config.write_text('name = "server"\nrole = "server"\n[peers]\nact = { role = "active" }\n')
    assert main(["flower", "party", str(config)]) == 2
    assert "give [tls] dir" in capsys.readouterr().err
