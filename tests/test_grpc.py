"""gRPC transport with mutual TLS, in one process: equivalence, refusals, failures, bad input."""

from __future__ import annotations

import datetime as dt
import socket
from pathlib import Path

import numpy as np
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from tests.conftest import PARTY_SEEDS, own_sections, vertical_split
from vflo.align.engines import DEPLOYED_ALIGNMENT
from vflo.cli import main
from vflo.comm.codec import decode
from vflo.comm.grpc_transport import GrpcTransport, PartyServer, pack_frames, unpack_frames
from vflo.comm.local import LocalTransport
from vflo.comm.message import Message
from vflo.comm.tls import PartyCredentials, init_certs, issue
from vflo.data.partydata import PartyData
from vflo.deploy import (
    DataConfig,
    DeployConfig,
    Deployment,
    PartyConfig,
    PeerConfig,
    PeerEntry,
    TLSConfig,
    start_party,
)
from vflo.errors import (
    AddressInUseError,
    CodecError,
    ConfigError,
    DataError,
    DataFileError,
    ProtocolError,
    RemoteError,
    TransportError,
)
from vflo.federation.simulation import party_node, run_method
from vflo.methods.registry import get_method
from vflo.roles import PartyInfo


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("certs")
    init_certs(directory, ["act", "pas", "stranger"])
    return directory


def _split():  # type: ignore[no-untyped-def]
    return vertical_split(30)


QUICK_GRPC = {"train": {"max_epochs": 2, "patience": 0}}


def _federation(certs: Path | None):  # type: ignore[no-untyped-def]
    data = _split()
    tls = TLSConfig(insecure=True) if certs is None else TLSConfig(dir=str(certs))
    dummy = DataConfig(file="unused", id_column="id")
    # The lab's own side of the methods below, as they set it (its config's [methods.NAME]).
    own = own_sections([get_method(n)(**QUICK_GRPC) for n in ("splitnn", "apc_vfl")])
    pas = start_party(PartyConfig(name="pas", listen="127.0.0.1:0", data=dummy, tls=tls, peers={"act": PeerEntry(address="x", role="active")}, seed=PARTY_SEEDS["pas"], methods=own),  # noqa: E501
                      data=data.train["pas"], serve=data.serve["pas"])
    deploy = DeployConfig(active=PartyConfig(name="act", role="active", listen="127.0.0.1:0", data=dummy, tls=tls,
                                             seed=PARTY_SEEDS["act"]),
                          parties=(PeerConfig(name="pas", role="passive", address=pas.server.address),))
    test = PartyData(party="act", ids=data.test_ids, X=data.serve["act"].subset(data.test_ids).X,
                     columns=data.serve["act"].columns, y=data.test_y)
    dep = Deployment(deploy, train=data.train["act"], test=test)
    pas.transport.peers["act"] = dep.party.server.address
    return data, dep, pas


@pytest.mark.parametrize("secure", [True, False])
def test_grpc_gives_the_same_numbers_and_bytes_as_in_process(certs: Path, secure: bool) -> None:
    data, dep, pas = _federation(certs if secure else None)
    try:
        for name in ("splitnn", "apc_vfl"):
            kwargs = QUICK_GRPC
            over_grpc = dep.run(get_method(name)(**kwargs), seed=3)
            local = run_method(get_method(name)(**kwargs), data, seed=3, party_seeds=PARTY_SEEDS,
                               alignment=DEPLOYED_ALIGNMENT)
            assert np.array_equal(over_grpc.scores, local.scores)
            a, b = over_grpc.ledger.summary(), local.ledger.summary()
            assert (a.bytes, a.messages, a.rounds, a.align_bytes) == (b.bytes, b.messages, b.rounds, b.align_bytes)
            if name == "splitnn":  # gradients ride with the next forward in one call: its framing is counted apart
                batched = [e for e in over_grpc.ledger.entries if e.framing]
                assert batched and a.framing_bytes == 8 * len(batched) and b.framing_bytes == 0
    finally:
        dep.close()
        pas.stop()


def _server(certs: Path, allowed: set[str]) -> PartyServer:
    node = party_node(PartyInfo("pas", "passive"), peers={"act": "active"})
    return PartyServer(node, address="127.0.0.1:0", credentials=PartyCredentials.load(certs, "pas"),
                       allowed=allowed).start()


def test_a_client_from_another_ca_is_refused(certs: Path, tmp_path: Path) -> None:
    server = _server(certs, {"act"})
    try:
        init_certs(tmp_path, ["act"])  # same name, different CA
        foreign = PartyCredentials(party="act", ca=(certs / "ca.pem").read_bytes(),
                                   certificate=(tmp_path / "act.pem").read_bytes(),
                                   key=(tmp_path / "act.key").read_bytes())
        client = GrpcTransport("act", {"pas": server.address}, credentials=foreign, deadline=5, retries=0)
        with pytest.raises(TransportError, match="could not be reached"):
            client.request(Message("act", "pas", "control.teardown", 0))
        client.close()
    finally:
        server.stop()


def test_an_unknown_party_name_is_refused(certs: Path) -> None:
    server = _server(certs, {"act"})
    try:
        client = GrpcTransport("stranger", {"pas": server.address},
                               credentials=PartyCredentials.load(certs, "stranger"), deadline=5, retries=0)
        reply = client.request(Message("stranger", "pas", "control.teardown", 0))
        with pytest.raises(RemoteError, match="does not accept messages from 'stranger'"):
            reply.unwrap()
        # A stranger's frame is refused before it is decoded: even bytes that are no vflo frame at all get the
        # not-a-peer answer, not a decoding error (a stranger's 120 MB header was once parsed first).
        call = client._stub("pas")[0]
        answer = decode(call(b"\x00" * 64, timeout=5))
        assert answer.error is not None and "refused before reading the message" in answer.error.message
        # a known party's certificate cannot be used to speak as another party
        act = GrpcTransport("act", {"pas": server.address}, credentials=PartyCredentials.load(certs, "act"),
                            deadline=5, retries=0)
        assert act.request(Message("act", "pas", "control.teardown", 0)).error is None
        for c in (client, act):
            c.close()
    finally:
        server.stop()


def test_a_certificate_cannot_speak_for_another_party(certs: Path) -> None:
    server = _server(certs, {"act", "stranger"})
    try:
        spoof = GrpcTransport("stranger", {"pas": server.address}, credentials=PartyCredentials.load(certs, "act"),
                              deadline=5, retries=0)
        with pytest.raises(RemoteError, match="authenticated as \\['act'\\] sent a message as 'stranger'"):
            spoof.request(Message("stranger", "pas", "control.teardown", 0)).unwrap()
        spoof.close()
    finally:
        server.stop()


def test_posted_messages_share_one_call_and_count_as_in_process(certs: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.test_transport import Calls, Echo

    rows = PartyData(party="pas", ids=[1, 2], X=np.ones((2, 1)), columns=("v",))
    node = party_node(PartyInfo("pas", "passive"), rows, peers={"act": "active"})
    parties = (PartyInfo("act", "active"), PartyInfo("pas", "passive"))
    node.install(Echo(scale=3.0), seed=0, parties=parties)
    calls: list[str] = []
    for name in ("_call", "_call_many"):
        original = getattr(PartyServer, name)
        monkeypatch.setattr(PartyServer, name,
                            lambda self, body, ctx, _o=original, _n=name: (calls.append(_n), _o(self, body, ctx))[1])
    server = PartyServer(node, address="127.0.0.1:0", credentials=PartyCredentials.load(certs, "pas"),
                         allowed={"act"}).start()
    client = GrpcTransport("act", {"pas": server.address}, credentials=PartyCredentials.load(certs, "act"))
    try:
        for n in (2, 3):
            client.post(Message("act", "pas", "echo.scale", n, {"x": np.ones(n, np.float32)}))
        reply = client.request(Message("act", "pas", "echo.scale", 4, {"x": np.ones(4, np.float32)}))
        assert np.allclose(reply.unwrap()["y"], 3.0) and node.context is not None
        assert node.context.part(Calls).count == 3 and calls == ["_call_many"]  # three messages, one round trip
        # the ledger holds them in the order they crossed: the three requests, then the three replies
        entries = [(e.kind, e.direction, e.round, e.nbytes) for e in client.ledger.entries]
        assert [(d, r) for _, d, r, _ in entries] == [(d, r) for d in ("request", "reply") for r in (2, 3, 4)]
        # a posted message that fails is raised by the request it went out with, which is not run
        client.post(Message("act", "pas", "echo.fail", 5))
        with pytest.raises(RemoteError, match="echo.fail"):
            client.request(Message("act", "pas", "echo.scale", 6, {"x": np.ones(1, np.float32)}))
        assert node.context.part(Calls).count == 3
        # the same messages in process cross with the same bytes
        local_node = party_node(PartyInfo("pas", "passive"), rows, peers={"act": "active"})
        local_node.install(Echo(scale=3.0), seed=0, parties=parties)
        local = LocalTransport({"pas": local_node})
        for n in (2, 3):
            local.post(Message("act", "pas", "echo.scale", n, {"x": np.ones(n, np.float32)}))
        local.request(Message("act", "pas", "echo.scale", 4, {"x": np.ones(4, np.float32)}))
        assert sorted((e.kind, e.direction, e.round, e.nbytes) for e in local.ledger.entries) == sorted(entries)
        # a small size limit splits the posted messages over several calls, still in order
        small = GrpcTransport("act", {"pas": server.address}, credentials=PartyCredentials.load(certs, "act"),
                              max_message_bytes=1200)
        for n in range(3):
            small.post(Message("act", "pas", "echo.scale", 10 + n, {"x": np.ones(100, np.float32)}))
        calls.clear()
        small.flush()
        assert node.context.part(Calls).count == 6 and len(calls) == 2
        assert [e.round for e in small.ledger.entries if e.direction == "request"] == [10, 11, 12]
        small.close()
    finally:
        client.close()
        server.stop()


def test_a_request_started_early_travels_while_the_sender_computes(certs: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from tests.test_transport import Calls, Echo

    node = party_node(PartyInfo("pas", "passive"), PartyData(party="pas", ids=[1], X=np.ones((1, 1)), columns=("v",)),
                      peers={"act": "active"})
    node.install(Echo(scale=3.0), seed=0, parties=(PartyInfo("act", "active"), PartyInfo("pas", "passive")))
    release = threading.Event()
    original = PartyServer._call
    monkeypatch.setattr(PartyServer, "_call", lambda self, body, ctx: (release.wait(10), original(self, body, ctx))[1])
    server = PartyServer(node, address="127.0.0.1:0", credentials=PartyCredentials.load(certs, "pas"),
                         allowed={"act"}).start()
    client = GrpcTransport("act", {"pas": server.address}, credentials=PartyCredentials.load(certs, "act"))
    try:
        future = client.request_many_async([Message("act", "pas", "echo.scale", 1, {"x": np.ones(2, np.float32)})])
        assert not future.done()  # the party has not answered, yet the sender is free
        release.set()
        [reply] = future.result()
        assert np.allclose(reply.unwrap()["y"], 3.0)
        assert [e.direction for e in client.ledger.entries] == ["request", "reply"]
        # posted messages go with it, and one that fails is raised when the replies are read
        client.post(Message("act", "pas", "echo.fail", 2))
        failing = client.request_many_async([Message("act", "pas", "echo.scale", 3, {"x": np.ones(1, np.float32)})])
        with pytest.raises(RemoteError, match="echo.fail"):
            failing.result()
        with pytest.raises(RemoteError, match="echo.fail"):
            failing.result()  # the same error again, not a second call
        assert node.context is not None and node.context.part(Calls).count == 1
    finally:
        release.set()
        client.close()
        server.stop()


def test_a_malformed_multi_message_body_is_a_codec_error() -> None:
    frames = [b"abc", b"", b"defgh"]
    assert unpack_frames(pack_frames(frames), max_bytes=100) == frames
    for body in (b"", b"\x01\x00", pack_frames([b"abc"])[:-1], pack_frames([b"x" * 20])):
        with pytest.raises(CodecError, match="malformed multi-message body"):
            unpack_frames(body, max_bytes=10)


def test_an_unreachable_party_is_named_with_the_message_kind(certs: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = GrpcTransport("act", {"pas": f"127.0.0.1:{port}"}, credentials=PartyCredentials.load(certs, "act"),
                           deadline=5, retries=1, backoff=0.05)
    expected = r"party 'pas' at 127.0.0.1:\d+ could not be reached for 'splitnn.forward'"
    with pytest.raises(TransportError, match=expected):
        client.request(Message("act", "pas", "splitnn.forward", 1))
    client.close()


def test_an_address_already_in_use(certs: Path) -> None:
    first = _server(certs, {"act"})
    try:
        # Its own class, so a caller (scoring while a training run holds the address) can tell it apart.
        with pytest.raises(AddressInUseError, match="already in use"):
            _server_at(certs, first.address)
    finally:
        first.stop()


def _server_at(certs: Path, address: str) -> PartyServer:
    return PartyServer(party_node(PartyInfo("pas", "passive"), peers={"act": "active"}), address=address,
                       credentials=PartyCredentials.load(certs, "pas"), allowed={"act"})


def test_an_expired_certificate(tmp_path: Path) -> None:
    init_certs(tmp_path, ["act"])
    ca_key = serialization.load_pem_private_key((tmp_path / "ca.key").read_bytes(), password=None)
    ca_cert = x509.load_pem_x509_certificate((tmp_path / "ca.pem").read_bytes())
    now = dt.datetime.now(dt.UTC)
    issue(tmp_path, "old", ca_key, ca_cert, not_before=now - dt.timedelta(days=10),  # type: ignore[arg-type]
          not_after=now - dt.timedelta(days=1))
    with pytest.raises(ConfigError, match="party 'old''s certificate expired on .*vflo certs init"):
        PartyCredentials.load(tmp_path, "old")
    with pytest.raises(ConfigError, match="TLS files .* are missing"):
        PartyCredentials.load(tmp_path, "nobody")


def test_bad_party_and_deploy_configs(tmp_path: Path) -> None:
    from vflo.deploy import load_deploy_config, load_party_config

    tls = "[tls]\ninsecure = true\n"
    (tmp_path / "p.toml").write_text('name = "bank"\n[data]\nfile = "nope.csv"\nid_column = "id"\n' + tls)
    with pytest.raises(DataFileError, match="does not exist"):
        start_party(load_party_config(tmp_path / "p.toml"))
    (tmp_path / "bank.csv").write_text("pid,a\n1,2.0\n2,3.0\n")
    (tmp_path / "q.toml").write_text('name = "bank"\n[data]\nfile = "bank.csv"\nid_column = "id"\n' + tls)
    with pytest.raises(DataError, match="ID column 'id' not in the table"):
        start_party(load_party_config(tmp_path / "q.toml"))
    (tmp_path / "d.toml").write_text(
        '[active]\nname = "bank"\nrole = "active"\n[active.data]\nfile = "bank.csv"\nid_column = "pid"\n'
        '[active.tls]\ninsecure = true\n[[parties]]\nname = "bank"\nrole = "passive"\naddress = "127.0.0.1:1"\n')
    with pytest.raises(ConfigError, match="two parties share the name \\['bank'\\]"):
        load_deploy_config(tmp_path / "d.toml")
    # TLS (or an explicit insecure = true) and every peer's address are what vflo's gRPC needs: refused before any
    # file is read; over Flower neither is needed.
    no_tls = PartyConfig(name="x", data=DataConfig(file="f", id_column="i"))
    with pytest.raises(ConfigError, match="give \\[tls\\] dir"):
        start_party(no_tls)
    no_address = PartyConfig(name="x", data=DataConfig(file="f", id_column="i"), tls=TLSConfig(insecure=True),
                             peers={"a": PeerEntry(role="active")})
    with pytest.raises(ConfigError, match=r"give the address of \['a'\]"):
        start_party(no_address)


def test_a_deploy_config_without_roles_and_a_method_whose_server_is_missing(tmp_path: Path) -> None:
    """[active] is the active party and a [[parties]] entry without a role a passive one, as under [peers]; a
    method that needs a server the config lacks is refused before anything trains, not after the others ran."""
    from vflo.deploy import Deployment, load_deploy_config
    from vflo.methods.registry import get_method

    (tmp_path / "bank.csv").write_text("pid,a,y\n1,2.0,0\n2,3.0,1\n3,1.0,0\n")
    (tmp_path / "d.toml").write_text(
        '[active]\nname = "bank"\nlisten = "127.0.0.1:0"\n[active.data]\nfile = "bank.csv"\nid_column = "pid"\n'
        'label_column = "y"\n[active.tls]\ninsecure = true\n[[parties]]\nname = "shop"\naddress = "127.0.0.1:1"\n')
    deploy = load_deploy_config(tmp_path / "d.toml")
    assert deploy.active.role == "active" and [p.role for p in deploy.parties] == ["passive"]
    deployment = Deployment(deploy)
    try:
        with pytest.raises(ConfigError, match=r"rap needs \['server \(server\)'\] in the deploy config's "
                                              r"\[\[parties\]\]: add each as"):
            deployment.preflight([get_method("local")(), get_method("rap")()])  # shop (127.0.0.1:1) is never asked
    finally:
        deployment.close()


def test_each_connection_mistake_is_named(certs: Path, tmp_path: Path) -> None:
    """Another CA, TLS on one side only, another party's port and nothing listening: each says which."""
    init_certs(tmp_path / "other", ["act", "pas"])
    secure = _server(certs, {"act"})
    plain = PartyServer(party_node(PartyInfo("pas", "passive"), peers={"act": "active"}), address="127.0.0.1:0",
                        credentials=None, allowed={"act"}).start()
    own = PartyCredentials.load(certs, "act")
    cases = [
        (PartyCredentials.load(tmp_path / "other", "act"), "pas", secure.address, "not signed by this party's CA"),
        (None, "pas", secure.address, "expects TLS but this one runs with --insecure"),
        (own, "pas", plain.address, "does not speak TLS"),
        (own, "stranger", secure.address, "is not 'stranger' .*every party has its own port"),
        (own, "pas", f"127.0.0.1:{_unused_port()}", "nothing answers at"),
    ]
    try:
        for credentials, receiver, address, expected in cases:
            client = GrpcTransport("act", {receiver: address}, credentials=credentials, deadline=5, retries=0)
            with pytest.raises(TransportError, match=expected):
                client.request(Message("act", receiver, "control.teardown", 0))
            client.close()
    finally:
        secure.stop()
        plain.stop()


def _unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_deploy_guide_lists_every_config_key() -> None:
    import dataclasses
    import re

    from vflo.deploy import DataConfig, DeployConfig, PartyConfig, PeerConfig, TLSConfig

    text = (Path(__file__).resolve().parents[1] / "docs" / "deploy.md").read_text()
    reference = text[text.index("## Every key of PARTY.toml and deploy.toml"):text.index("## Alignment")]
    listed = set(re.findall(r"`(?:\[\w+\] |\[\[\w+\]\] )?(\w+)", reference))
    listed |= set(re.findall(r"`\[+(\w+)\]", reference))  # the tables themselves: [data], [tls], [[parties]]
    for cls in (PartyConfig, DataConfig, TLSConfig, PeerConfig, DeployConfig):
        missing = [f.name for f in dataclasses.fields(cls) if f.name not in listed]
        assert not missing, f"docs/deploy.md does not describe {cls.__name__} keys {missing}"


def _deployed(train_pas: PartyData, serve_pas: PartyData | None, train_act: PartyData, test: PartyData):  # type: ignore[no-untyped-def]
    tls = TLSConfig(insecure=True)
    dummy = DataConfig(file="unused", id_column="id")
    pas = start_party(PartyConfig(name="pas", listen="127.0.0.1:0", data=dummy, tls=tls, peers={"act": PeerEntry(address="x", role="active")}, seed=PARTY_SEEDS["pas"]),  # noqa: E501
                      data=train_pas, serve=serve_pas)
    deploy = DeployConfig(active=PartyConfig(name="act", role="active", listen="127.0.0.1:0", data=dummy, tls=tls,
                                             seed=PARTY_SEEDS["act"]),
                          parties=(PeerConfig(name="pas", role="passive", address=pas.server.address),
                                   PeerConfig(name="server", role="server", address="127.0.0.1:1")))
    dep = Deployment(deploy, train=train_act, test=test)
    pas.transport.peers["act"] = dep.party.server.address
    return dep, pas


def test_deployed_runs_are_checked_before_anything_trains() -> None:
    """Test rows in a training file, rows a partner lacks, no shared ID: each refused before training; a
    server no method uses (here at a dead address) is never contacted."""
    from vflo.errors import AlignmentError

    data = _split()
    act, pas, serve = data.train["act"], data.train["pas"], data.serve["pas"]
    test = PartyData(party="act", ids=data.test_ids, X=data.serve["act"].subset(data.test_ids).X,
                     columns=act.columns, y=data.test_y)
    splitnn = get_method("splitnn")(train={"max_epochs": 1})
    leaky = PartyData(party="pas", ids=np.concatenate([pas.ids, data.test_ids[:3]]),
                      X=np.vstack([pas.X, serve.subset(data.test_ids[:3]).X]), columns=pas.columns)
    own_leak = PartyData(party="act", ids=np.concatenate([act.ids, data.test_ids[:2]]), y=np.concatenate(
        [act.require_labels(), data.test_y[:2]]), X=np.vstack([act.X, test.X[:2]]), columns=act.columns)
    cases = [
        (pas, serve, own_leak, DataError, "2 test IDs are also in party 'act''s training file"),
        (leaky, serve, act, DataError, "3 test IDs are also in party 'pas''s training rows"),
        (pas, serve.subset(data.test_ids[5:]), act, AlignmentError, "splitnn scores together with 'pas', which does "
                                                                    "not hold 5 of the 30 rows"),
        (pas, None, act, AlignmentError, "has no rows to score"),
        (PartyData(party="pas", ids=pas.ids + 10_000, X=pas.X, columns=pas.columns), serve, act, AlignmentError,
         "shares no ID with"),
    ]
    for train_pas, serve_pas, train_act, error, message in cases:
        dep, party = _deployed(train_pas, serve_pas, train_act, test)
        try:
            with pytest.raises(error, match=message):
                dep.preflight([splitnn])
        finally:
            dep.close()
            party.stop()
    dep, party = _deployed(pas, serve, act, test)
    try:
        # --save and --checkpoints need a folder at every party the methods use: asked before anything trains
        # (the lab here was started with neither; a dead server no method needs is not asked).
        with pytest.raises(ConfigError, match=r"--save and --checkpoints needs a folder at every party the methods "
                                              r"use; pas: party 'pas' has no folder for model parts"):
            dep.preflight([splitnn], save=True, checkpoints=True)
        assert not dep.party.transport.ledger.entries or all(
            e.kind in ("control.ready", "align.plain") for e in dep.party.transport.ledger.entries)
        dep.preflight([splitnn])
        out = dep.run(splitnn, seed=0)  # the dead server is never contacted: splitnn needs no server
        assert out.scores.shape == (30, 2)
    finally:
        dep.close()
        party.stop()


def test_a_malformed_frame_is_answered_as_one_and_a_malformed_reply_is_named(
    certs: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests.test_codec_fuzz import header_of, with_header
    from vflo.comm.codec import decode, encode

    server = _server(certs, {"act"})
    client = GrpcTransport("act", {"pas": server.address}, credentials=PartyCredentials.load(certs, "act"),
                           deadline=5, retries=0)
    try:
        frame = encode(Message("act", "pas", "align.plain", 1, {"ids": np.arange(3), "purpose": "train"}))
        header = header_of(frame)
        header["fields"]["ids"]["shape"] = [2**62, 2**62]  # type: ignore[index]
        stub, _ = client._stub("pas")
        reply = decode(stub(with_header(frame, header), timeout=5))
        assert reply.error is not None and reply.error.type == "ProtocolError"
        assert "party 'pas' got a malformed message" in reply.error.message and "malformed shape" in reply.error.message
        # And the other way: a reply the client cannot decode names the party that sent it.
        monkeypatch.setattr(PartyServer, "_serve", lambda self, frame, context: (b"VFLO junk", True))
        with pytest.raises(ProtocolError, match="party 'pas' sent a malformed message in answer to 'control.teardown'"):
            client.request(Message("act", "pas", "control.teardown", 0))
    finally:
        client.close()
        server.stop()


def test_a_party_certificate_names_only_its_party_unless_asked(tmp_path: Path) -> None:
    from cryptography import x509

    init_certs(tmp_path / "a", ["act", "pas"])
    cert = x509.load_pem_x509_certificate((tmp_path / "a" / "pas.pem").read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [n.value for n in names] == ["pas"]  # not localhost, not 127.0.0.1
    assert main(["certs", "init", str(tmp_path / "b"), "--parties", "act,pas", "--san",
                 "pas=pas.example.org,10.0.0.5"]) == 0
    cert = x509.load_pem_x509_certificate((tmp_path / "b" / "pas.pem").read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(n.value) for n in names] == ["pas", "pas.example.org", "10.0.0.5"]
    with pytest.raises(ConfigError, match="host name every machine answers to"):
        init_certs(tmp_path / "c", ["localhost", "pas"])
    with pytest.raises(ConfigError, match="name the party 'act'"):
        init_certs(tmp_path / "d", ["act", "pas"], san={"pas": ["act"]})
    with pytest.raises(ConfigError, match="host name every machine answers to"):
        PartyConfig(name="pas", tls=TLSConfig(insecure=True),
                    peers={"localhost": PeerEntry(address="x", role="active")})


def test_a_party_keeps_its_own_record_of_what_left_it(certs: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """The lab's audit file holds a line per message that left it (its replies and its refusals), and over a run
    its totals are the ledger's for the messages the lab sent; `vflo party audit` sums it per peer and kind."""
    from dataclasses import replace

    from vflo.cli import main
    from vflo.comm.departures import read_departures, summarize

    data, dep, pas = _federation(certs)
    pas.stop()
    audit = tmp_path / "lab_audit.jsonl"
    own = own_sections([get_method("splitnn")(**QUICK_GRPC)])
    config = PartyConfig(name="pas", listen="127.0.0.1:0", data=DataConfig(file="unused", id_column="id"),
                         tls=TLSConfig(dir=str(certs)), peers={"act": PeerEntry(address="x", role="active")},
                         seed=PARTY_SEEDS["pas"], methods=own, audit_log=str(audit))
    pas = start_party(config, data=data.train["pas"], serve=data.serve["pas"])
    dep.close()
    deploy = replace(dep.deploy, parties=(PeerConfig(name="pas", role="passive", address=pas.server.address),))
    test = PartyData(party="act", ids=data.test_ids, X=data.serve["act"].subset(data.test_ids).X,
                     columns=data.serve["act"].columns, y=data.test_y)
    dep = Deployment(deploy, train=data.train["act"], test=test)
    pas.transport.peers["act"] = dep.party.server.address
    try:
        out = dep.run(get_method("splitnn")(**QUICK_GRPC), seed=3)
        stranger = GrpcTransport("stranger", {"pas": pas.server.address},  # type: ignore[union-attr]
                                 credentials=PartyCredentials.load(certs, "stranger"), deadline=5, retries=0)
        assert stranger.request(Message("stranger", "pas", "control.teardown", 0)).error is not None
        stranger.close()
    finally:
        dep.close()
        pas.stop()
    records = read_departures(audit)
    run = records[0].run
    assert run and all(r.party == "pas" for r in records)
    in_run = [r for r in records if r.run == run]
    sent = [e for e in out.ledger.entries if e.sender == "pas"]
    assert len(in_run) == len(sent) and sum(r.bytes for r in in_run) == sum(e.nbytes for e in sent)
    kinds = {r["kind"]: r for r in summarize(in_run)}
    assert kinds["splitnn.forward"]["rows"] > 0 and kinds["control.setup"]["messages"] == 1
    refused = [r for r in records if r.status == "refused"]
    assert refused and refused[-1].peer == "stranger" and "not a configured peer" in refused[-1].error
    assert main(["party", "audit", str(audit), "--run", "last"]) == 0
    table = capsys.readouterr().out
    assert "what left party pas" in table and "splitnn.forward" in table
    assert f"{sum(e.nbytes for e in sent):,}" in table
    assert main(["party", "audit", str(audit), "--run", "no-such-run"]) == 2
    assert "has no run 'no-such-run'; its runs: [" in capsys.readouterr().err
    assert main(["party", "audit", str(tmp_path / "missing.jsonl")]) == 2
    assert "a party writes it where audit_log in its config says" in capsys.readouterr().err


def test_the_coordinating_party_keeps_its_audit_file_too(tmp_path: Path) -> None:
    """deploy.toml's [active] takes a party's keys: its audit file (by default beside the config) reaches the
    party that coordinates, for training and for scoring alike."""
    from vflo.deploy import load_deploy_config

    (tmp_path / "deploy.toml").write_text('[active]\nname = "act"\nlisten = "127.0.0.1:0"\n[active.data]\n'
                                          'file = "f.csv"\nid_column = "id"\n[active.tls]\ninsecure = true\n'
                                          '[[parties]]\nname = "pas"\naddress = "127.0.0.1:1"\n')
    config = load_deploy_config(tmp_path / "deploy.toml").coordinator_config()
    assert config.audit_log == str(tmp_path / "act_audit.jsonl")
    departures = config.departures()
    assert departures is not None and departures.path == tmp_path / "act_audit.jsonl"
