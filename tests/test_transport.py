"""Nodes, the in-process transport and the coordinator: real bytes, no shared objects, clear failures."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from vflo.comm.ledger import Ledger
from vflo.comm.local import LocalTransport
from vflo.comm.message import INT, Message, Payload, Reply, floats
from vflo.data.partydata import PartyData
from vflo.errors import PayloadError, ProtocolError, RemoteError
from vflo.federation.coordinator import Coordinator
from vflo.federation.session import Session
from vflo.federation.simulation import party_node
from vflo.methods.base import Method, MethodConfig, handles
from vflo.methods.saved import Part
from vflo.party.node import Node, NodeContext
from vflo.roles import PartyInfo

ACTIVE, PASSIVE, RELAY = PartyInfo("a", "active"), PartyInfo("p", "passive"), PartyInfo("r", "server")


@dataclass
class Calls(Part):
    """How many echo.scale messages a party ran."""

    count: int = 0


@dataclass(frozen=True, kw_only=True)
class EchoConfig(MethodConfig):
    scale: float = 2.0


class Echo(Method):
    """A toy method: the passive party scales what it gets; the relay forwards onward."""

    name = "echo"
    Config = EchoConfig

    @handles("echo.scale", served="any time (a test protocol)", senders=("coordinator", "server"), x=floats(None))
    def scale(self, ctx: NodeContext, payload: Payload) -> Payload:
        x = payload["x"]
        assert isinstance(x, np.ndarray)
        x *= 10  # mutating the received copy must not reach the sender
        ctx.part(Calls).count += 1
        return {"y": (x / 10 * self.config.scale).astype(np.float32), "rows": ctx.require_data().n_samples}

    @handles("echo.relay", served="any time (a test protocol)", senders=("coordinator", "passive"), n=INT)
    def relay(self, ctx: NodeContext, payload: Payload) -> Payload:
        reply = ctx.send("p", "echo.scale", {"x": np.ones(int(payload["n"]), dtype=np.float32)})  # type: ignore[arg-type]
        return {"y": reply["y"]}

    @handles("echo.bounce", served="any time (a test protocol)", n=INT)
    def bounce(self, ctx: NodeContext, payload: Payload) -> Payload:
        return ctx.send("r", "echo.relay", {"n": payload["n"]})  # the relay calls back into this party

    @handles("echo.make", served="any time (a test protocol)", n=INT)
    def make(self, ctx: NodeContext, payload: Payload) -> Payload:
        return {"y": np.zeros(int(payload["n"]), dtype=np.float32)}  # type: ignore[arg-type]

    @handles("echo.fail", served="any time (a test protocol)")
    def fail(self, ctx: NodeContext, payload: Payload) -> Payload:
        raise ValueError("boom")

    def fit(self, fed: Coordinator) -> None:  # pragma: no cover - not used
        pass

    def predict(self, fed: Coordinator, ids: np.ndarray) -> np.ndarray:  # pragma: no cover - not used
        return ids


def _federation(monkeypatch: pytest.MonkeyPatch, ledger: Ledger | None = None) -> tuple[Coordinator, dict[str, Node]]:
    from vflo.methods import registry

    monkeypatch.setitem(registry._METHODS, "echo", f"{__name__}:Echo")
    own = PartyData(party="a", ids=[1, 2], X=np.zeros((2, 1)), columns=("u",), y=[0, 1])
    other = PartyData(party="p", ids=[1, 2, 3], X=np.ones((3, 2)), columns=("v", "w"))
    parties = (ACTIVE, PASSIVE, RELAY)
    nodes = {"a": party_node(ACTIVE, own, peers=parties), "p": party_node(PASSIVE, other, peers=parties),
             "r": party_node(RELAY, peers=parties)}
    transport = LocalTransport(nodes, ledger=ledger)
    fed = Coordinator(node=nodes["a"], transport=transport, parties=(ACTIVE, PASSIVE, RELAY), seed=1,
                     task="binary", n_classes=2)
    Session(fed).start(Echo(scale=3.0))
    return fed, nodes


def test_a_round_trip_counts_real_bytes_and_shares_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = Ledger()
    fed, nodes = _federation(monkeypatch, ledger)
    x = np.arange(4, dtype=np.float32)
    reply = fed.request("p", "echo.scale", {"x": x})
    assert np.allclose(reply["y"], x * 3.0) and reply["rows"] == 3
    assert x.tolist() == [0, 1, 2, 3]
    summary = ledger.summary()
    assert summary.messages == 2 and summary.rounds == 1
    assert summary.control_messages == 4  # setup to p and r, and their replies
    # the remote party received its config through the setup message, not by sharing an object
    assert nodes["p"].method is not None and nodes["p"].method is not fed._method
    assert nodes["p"].method.config == EchoConfig(scale=3.0)


def test_onward_messages_from_a_party_share_the_round(monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = Ledger()
    fed, _ = _federation(monkeypatch, ledger)
    reply = fed.request("r", "echo.relay", {"n": 3})
    assert np.allclose(reply["y"], 3.0)
    data = [e for e in ledger.entries if not e.is_control]
    assert [(e.sender, e.receiver, e.kind) for e in data] == [
        ("a", "r", "echo.relay"), ("r", "p", "echo.scale"), ("p", "r", "echo.scale"), ("r", "a", "echo.relay")]
    assert {e.round for e in data} == {1}
    assert ledger.by_party()["r"]["sent_messages"] == 2


def test_a_call_back_into_a_party_still_handling_a_message_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    # Deployed, party p would wait on itself forever; simulation must fail the same protocol loudly.
    fed, _nodes = _federation(monkeypatch)
    with pytest.raises(RemoteError, match="got 'echo.scale' from 'r' while still handling 'echo.bounce'"):
        fed.request("p", "echo.bounce", {"n": 2})
    assert np.allclose(fed.request("r", "echo.relay", {"n": 2})["y"], 3.0)  # the party is free again


def test_handler_failures_come_back_as_errors_naming_party_and_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    fed, _ = _federation(monkeypatch)
    with pytest.raises(RemoteError, match="party 'p' failed on 'echo.fail': ValueError: boom"):
        fed.request("p", "echo.fail", {})
    with pytest.raises(RemoteError, match="has no handler for 'echo.nope'"):
        fed.request("p", "echo.nope", {})
    with pytest.raises(RemoteError, match="PayloadError: message 'echo.scale': field 'x' has dtype int64"):
        fed.request("p", "echo.scale", {"x": np.arange(3)})
    with pytest.raises(RemoteError, match="holds no data"):
        fed.request("r", "echo.scale", {"x": np.ones(1, np.float32)})


def test_unknown_receiver_and_messages_to_self(monkeypatch: pytest.MonkeyPatch) -> None:
    fed, _ = _federation(monkeypatch)
    with pytest.raises(ProtocolError, match="unknown party 'q'"):
        fed.request("q", "echo.scale", {"x": np.ones(1, np.float32)})
    with pytest.raises(ProtocolError, match="cannot send 'echo.scale' to itself"):
        fed.request("a", "echo.scale", {"x": np.ones(1, np.float32)})


def test_messages_before_setup_are_refused() -> None:
    node = Node(PASSIVE, None, peers={"a": "active"})
    reply = node.handle(Message("a", "p", "echo.scale", 1, {}))
    assert reply.error is not None and "before any method was set up" in reply.error.message


def test_a_reply_over_the_size_limit_becomes_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    fed, _ = _federation(monkeypatch)
    fed.transport.max_message_bytes = 2048
    with pytest.raises(RemoteError, match="over the limit of 2048 bytes"):
        fed.request("p", "echo.make", {"n": 1000})


def test_a_node_refuses_another_party_data() -> None:
    from vflo.errors import PartyBoundaryError

    with pytest.raises(PartyBoundaryError, match="was handed data of party 'p'"):
        Node(ACTIVE, PartyData(party="p", ids=[1], X=np.zeros((1, 1)), columns=("v",)))


def test_coordinator_sees_only_its_own_data(monkeypatch: pytest.MonkeyPatch) -> None:
    from vflo.errors import PartyBoundaryError

    fed, _ = _federation(monkeypatch)
    assert fed.data.party == "a" and fed.names("passive") == ["p"]
    with pytest.raises(PartyBoundaryError, match="oracle exists only in simulation"):
        _ = fed.oracle


def test_payload_checks_run_before_the_handler(monkeypatch: pytest.MonkeyPatch) -> None:
    fed, nodes = _federation(monkeypatch)
    with pytest.raises(RemoteError) as caught:
        fed.request("p", "echo.scale", {"x": np.ones((2, 2), np.float32)})
    assert caught.value.error_type == PayloadError.__name__ and caught.value.exit_code == PayloadError.exit_code
    assert nodes["p"].context is not None and nodes["p"].context.part(Calls).count == 0


def test_posted_messages_go_out_in_order_with_the_next_request(monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = Ledger()
    fed, nodes = _federation(monkeypatch, ledger)
    fed.post("echo.scale", {"p": {"x": np.ones(2, np.float32)}})
    fed.post("echo.scale", {"p": {"x": np.ones(3, np.float32)}})
    assert not [e for e in ledger.entries if not e.is_control]  # nothing has crossed yet
    fed.request("p", "echo.scale", {"x": np.ones(4, np.float32)})
    data = [(e.kind, e.direction, e.round) for e in ledger.entries if not e.is_control]
    # each posted message is still a message with its own reply and round, delivered before the request
    assert data == [("echo.scale", d, r) for r in (1, 2, 3) for d in ("request", "reply")]
    assert nodes["p"].context is not None and nodes["p"].context.part(Calls).count == 3
    fed.post("echo.scale", {"p": {"x": np.ones(1, np.float32)}})
    fed.flush()
    assert nodes["p"].context.part(Calls).count == 4 and ledger.summary().rounds == 4


def test_a_posted_message_that_fails_is_raised_where_it_is_delivered(monkeypatch: pytest.MonkeyPatch) -> None:
    fed, nodes = _federation(monkeypatch)
    fed.post("echo.fail", {"p": {}})
    with pytest.raises(RemoteError, match="party 'p' failed on 'echo.fail': ValueError: boom"):
        fed.request("p", "echo.scale", {"x": np.ones(1, np.float32)})
    assert nodes["p"].context.part(Calls).count == 0  # type: ignore[union-attr]  # the request after it was not run
    fed.post("echo.fail", {"p": {}})
    with pytest.raises(RemoteError, match="echo.fail"):
        fed.flush()
    fed.flush()  # nothing left


def test_a_new_run_drops_what_a_failed_run_posted(monkeypatch: pytest.MonkeyPatch) -> None:
    fed, nodes = _federation(monkeypatch)
    fed.post("echo.scale", {"p": {"x": np.ones(1, np.float32)}})
    Session(fed).start(Echo(scale=3.0))  # the next run on the same transport
    fed.request("p", "echo.scale", {"x": np.ones(1, np.float32)})
    assert nodes["p"].context is not None and nodes["p"].context.part(Calls).count == 1


def test_an_exchange_started_early_is_an_exchange(monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = Ledger()
    fed, nodes = _federation(monkeypatch, ledger)
    fed.post("echo.scale", {"p": {"x": np.ones(2, np.float32)}})
    pending = fed.exchange_async("echo.scale", {"p": {"x": np.full(3, 2.0, np.float32)}})
    replies = pending.result()
    assert np.allclose(replies["p"]["y"], 6.0) and pending.result() is replies
    # the posted message went first, and each message kept its own round
    data = [(e.kind, e.direction, e.round) for e in ledger.entries if not e.is_control]
    assert data == [("echo.scale", d, r) for r in (1, 2) for d in ("request", "reply")]
    fed.exchange_async("echo.scale", {"p": {"x": np.ones(1, np.float32)}})
    fed.request("p", "echo.scale", {"x": np.ones(1, np.float32)})  # waits for the one in flight first
    assert nodes["p"].context is not None and nodes["p"].context.part(Calls).count == 4
    assert ledger.summary().rounds == 4


def test_an_error_in_an_exchange_started_early_is_not_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    fed, _ = _federation(monkeypatch)
    with pytest.raises(RemoteError, match="echo.fail"):
        fed.exchange_async("echo.fail", {"p": {}}).result()
    fed.exchange_async("echo.fail", {"p": {}})  # nobody reads its replies...
    with pytest.raises(RemoteError, match="echo.fail"):
        fed.flush()  # ...so the next use of the federation raises its error
    fed.flush()
    fed.exchange_async("echo.fail", {"p": {}})  # a run that failed before reading it...
    Session(fed).start(Echo(scale=3.0))  # ...does not fail the next one
    assert fed.request("p", "echo.scale", {"x": np.ones(1, np.float32)})["rows"] == 3


def test_a_deployed_ledger_puts_every_partys_training_first_and_keeps_replies_on_their_requests() -> None:
    from vflo.comm.ledger import Ledger
    from vflo.federation.session import training_first

    ledger = Ledger()

    def pair(sender: str, receiver: str, kind: str, round_no: int, nbytes: int) -> None:
        seq = ledger.record(round=round_no, sender=sender, receiver=receiver, kind=kind, direction="request",
                            nbytes=nbytes).seq
        ledger.record(round=round_no, sender=receiver, receiver=sender, kind=kind, direction="reply", nbytes=1,
                      reply_to=seq)

    pair("a", "p", "m.fit", 1, 10)        # the coordinator's training
    pair("a", "p", "m.predict", 2, 20)    # its scoring
    pair("a", "p", "control.ledger", 2, 5)
    remote = Ledger()
    remote_seq = remote.record(round=1, sender="p", receiver="s", kind="m.upload", direction="request", nbytes=30).seq
    remote.record(round=1, sender="s", receiver="p", kind="m.upload", direction="reply", nbytes=1, reply_to=remote_seq)
    remote_seq = remote.record(round=2, sender="p", receiver="s", kind="m.score", direction="request", nbytes=40).seq
    remote.record(round=2, sender="s", receiver="p", kind="m.score", direction="reply", nbytes=1, reply_to=remote_seq)
    start = len(ledger)
    ledger.extend(remote.entries)
    ordered, fit = training_first(ledger, 2, start, 1)
    assert fit == 4
    assert [e.kind for e in ordered.entries[:fit]] == ["m.fit", "m.fit", "m.upload", "m.upload"]
    assert ordered.summary(0, fit).bytes == 10 + 1 + 30 + 1
    for e in ordered.entries:
        assert e.seq == ordered.entries.index(e)
        if e.direction == "reply":
            request = ordered.entries[e.reply_to]
            assert (request.kind, request.direction, request.sender) == (e.kind, "request", e.receiver)
    assert ordered.summary().bytes == ledger.summary().bytes


def test_a_reply_is_read_with_types_and_a_wrong_one_names_the_party() -> None:
    payload: Payload = {"width": "3", "ids": np.arange(3), "names": np.asarray(["x"])}
    reply = Message("p", "a", "splitnn.init", 1, payload).unwrap()
    assert isinstance(reply, Reply) and reply.array("ids").tolist() == [0, 1, 2] and reply.names("names") == ["x"]
    with pytest.raises(ProtocolError, match=r"answered splitnn.init with 'width' of type str, not an integer"):
        reply.integer("width")
    with pytest.raises(ProtocolError, match=r"party 'p' answered splitnn.init without 'count'"):
        reply.integer("count")
    with pytest.raises(ProtocolError, match=r"'ids' that is not a list of names"):
        reply.names("ids")
