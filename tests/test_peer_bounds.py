"""Bounded by peer: a client that is no peer is refused from its certificate before any of its message is read, and
each peer holds at most ``max_peer_calls`` calls and ``max_peer_bytes`` bytes of a party's server, each call's
message arriving within ``max_arrival_seconds`` (an attacker review: a certificate holder's eight 254 MiB frames
took the lab to 2.6 GB, and 200 slow calls made the coordinator wait 55 s)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from tests.test_transport import Echo
from vflo.comm.codec import decode, encode
from vflo.comm.grpc_transport import CHUNK_BYTES, PATH, SIZE_KEY, GrpcTransport, PartyServer
from vflo.comm.message import Message
from vflo.comm.tls import PartyCredentials, init_certs
from vflo.data.partydata import PartyData
from vflo.errors import ConfigError, RemoteError
from vflo.federation.simulation import party_node
from vflo.party.policy import Policy
from vflo.roles import PartyInfo

WAIT = 10.0  # the longest any step below waits for something that should be quick


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("certs")
    init_certs(directory, ["act", "other", "pas", "stranger"])
    return directory


def _server(certs: Path, policy: Policy | None = None, **kwargs: object) -> PartyServer:
    rows = PartyData(party="pas", ids=np.array([1, 2]), X=np.ones((2, 1)), columns=("v",))
    node = party_node(PartyInfo("pas", "passive"), rows, peers={"act": "active", "other": "passive"},
                      policy=Policy(max_rows=10**7))
    node.install(Echo(scale=3.0), seed=0, parties=(PartyInfo("act", "active"), PartyInfo("other", "passive"),
                                                   PartyInfo("pas", "passive")))
    return PartyServer(node, address="127.0.0.1:0", credentials=PartyCredentials.load(certs, "pas"),
                       allowed={"act", "other"}, policy=policy, **kwargs).start()  # type: ignore[arg-type]


def _channel(certs: Path, name: str, server: PartyServer) -> grpc.Channel:
    """A raw gRPC channel with ``name``'s certificate: a client that sends what it likes, as it likes."""
    own = PartyCredentials.load(certs, name)
    credentials = grpc.ssl_channel_credentials(root_certificates=own.ca, private_key=own.key,
                                               certificate_chain=own.certificate)
    return grpc.secure_channel(server.address, credentials, options=[("grpc.ssl_target_name_override", "pas"),
                                                                     ("grpc.max_send_message_length", 1 << 30)])


def _held_back(release: threading.Event, chunks: list[bytes]) -> Iterator[bytes]:
    """A request whose message is held back until ``release``: a slow client (its headers are sent at once)."""
    release.wait(WAIT)
    yield from chunks


def _echo(n: int = 4) -> Message:
    return Message("act", "pas", "echo.scale", 1, {"x": np.ones(n, np.float32)})


def _wait_for(condition: object, what: str) -> None:
    until = time.monotonic() + WAIT
    while not condition():  # type: ignore[operator]
        if time.monotonic() > until:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def test_a_stranger_is_refused_before_its_message_is_read_and_slow_strangers_delay_no_peer(certs: Path) -> None:
    server = _server(certs)
    stranger = _channel(certs, "stranger", server)
    release = threading.Event()
    client = GrpcTransport("act", {"pas": server.address}, credentials=PartyCredentials.load(certs, "act"),
                           deadline=WAIT, retries=0)
    try:
        call = stranger.stream_unary(PATH)
        # More slow calls than the server has threads: each holds back its message (and never sends it while the
        # answers are awaited). A server that read a message before checking its sender would wait on every one.
        frame = encode(Message("stranger", "pas", "echo.scale", 1, {"x": np.ones(4, np.float32)}))
        futures = [call.future(_held_back(release, [frame]), timeout=3 * WAIT) for _ in range(40)]
        for future in futures:
            answer = decode(future.result(timeout=WAIT))
            assert answer.error is not None and "refused before reading the message" in answer.error.message
        assert not release.is_set()  # every answer came before any of the messages was sent
        t0 = time.monotonic()
        assert np.allclose(client.request(_echo()).unwrap()["y"], 3.0)
        assert time.monotonic() - t0 < 2.0
        # A frame larger than a chunk from a stranger is refused the same way, without being read.
        big = call.future(_held_back(release, [b"\0" * CHUNK_BYTES] * 8), timeout=3 * WAIT,
                          metadata=((SIZE_KEY, str(8 * CHUNK_BYTES)),))
        answer = decode(big.result(timeout=WAIT))
        assert answer.error is not None and "not a configured peer" in answer.error.message
    finally:
        release.set()
        client.close()
        stranger.close()
        server.stop()


def test_each_peer_has_its_own_bound_on_calls_at_once(certs: Path) -> None:
    server = _server(certs, Policy(max_peer_calls=2, max_arrival_seconds=WAIT))
    act = _channel(certs, "act", server)
    release = threading.Event()
    client = GrpcTransport("act", {"pas": server.address}, credentials=PartyCredentials.load(certs, "act"),
                           deadline=WAIT, retries=0)
    other = GrpcTransport("other", {"pas": server.address}, credentials=PartyCredentials.load(certs, "other"),
                          deadline=WAIT, retries=0)
    try:
        call = act.stream_unary(PATH)
        slow = [call.future(_held_back(release, [encode(_echo(2))]), timeout=3 * WAIT) for _ in range(2)]
        _wait_for(lambda: server.bounds.held("act")[0] == 2, "act's two calls to be held")
        with pytest.raises(RemoteError, match=r"2 of its calls are in progress already \(policy.max_peer_calls\)"):
            client.request(_echo()).unwrap()
        # Another peer is not held up by act's calls: its message reaches the party (which answers it as it answers
        # a passive party's teardown).
        reply = other.request(Message("other", "pas", "control.teardown", 0))
        assert reply.error is not None and "refuses 'control.teardown' from 'other' (role passive)" in str(reply.error)
        release.set()
        for future in slow:
            assert decode(future.result(timeout=WAIT)).error is None
        _wait_for(lambda: server.bounds.held("act") == (0, 0), "act's calls to end")
        assert np.allclose(client.request(_echo()).unwrap()["y"], 3.0)
    finally:
        release.set()
        for c in (client, other):
            c.close()
        act.close()
        server.stop()


def test_each_peer_has_its_own_bound_on_bytes_in_flight(certs: Path) -> None:
    mib = 1 << 20
    with pytest.raises(ConfigError, match="max_peer_bytes = 1048576 is less than max_message_bytes"):
        _server(certs, Policy(max_peer_bytes=mib), max_message_bytes=2 * mib)
    server = _server(certs, Policy(max_peer_bytes=3 * mib, max_arrival_seconds=WAIT), max_message_bytes=2 * mib)
    act = _channel(certs, "act", server)
    release = threading.Event()
    try:
        call = act.stream_unary(PATH)
        frame = encode(_echo(500_000))  # 2 MB: within max_message_bytes
        first = call.future(_held_back(release, [frame]), timeout=3 * WAIT, metadata=((SIZE_KEY, str(len(frame))),))
        _wait_for(lambda: server.bounds.held("act")[1] == len(frame), "act's declared 2 MB to be held")
        second = call.future(_held_back(release, [b"\0" * 64]), timeout=3 * WAIT, metadata=((SIZE_KEY, str(2 * mib)),))
        answer = decode(second.result(timeout=WAIT))  # refused before release: unread
        assert answer.error is not None and "over 3145728 bytes (policy.max_peer_bytes" in answer.error.message
        too_big = call.future(_held_back(release, [b"\0" * 64]), timeout=3 * WAIT, metadata=((SIZE_KEY, str(3 * mib)),))
        answer = decode(too_big.result(timeout=WAIT))
        assert answer.error is not None and "more than its largest message" in answer.error.message
        # A message larger than it declared is refused as soon as it passes the size declared.
        liar = call.future(iter([b"\0" * (mib // 2)] * 3), timeout=3 * WAIT, metadata=((SIZE_KEY, "10"),))
        answer = decode(liar.result(timeout=WAIT))
        assert answer.error is not None and "sent more than the 10 bytes it declared" in answer.error.message
        release.set()
        assert np.allclose(decode(first.result(timeout=WAIT)).unwrap()["y"], 3.0)
        _wait_for(lambda: server.bounds.held("act") == (0, 0), "act's calls to end")
    finally:
        release.set()
        act.close()
        server.stop()


def test_a_call_whose_message_does_not_arrive_in_time_is_dropped(certs: Path) -> None:
    server = _server(certs, Policy(max_peer_calls=1, max_arrival_seconds=0.5))
    act = _channel(certs, "act", server)
    release = threading.Event()
    client = GrpcTransport("act", {"pas": server.address}, credentials=PartyCredentials.load(certs, "act"),
                           deadline=WAIT, retries=0)
    try:
        t0 = time.monotonic()
        late = act.stream_unary(PATH).future(_held_back(release, [encode(_echo(2))]), timeout=3 * WAIT)
        with pytest.raises(grpc.RpcError):
            late.result(timeout=WAIT)
        assert late.code() == grpc.StatusCode.CANCELLED and time.monotonic() - t0 < 3.0
        _wait_for(lambda: server.bounds.held("act") == (0, 0), "the late call's slot to be free")
        assert np.allclose(client.request(_echo()).unwrap()["y"], 3.0)  # its one slot is free again
    finally:
        release.set()
        client.close()
        act.close()
        server.stop()


def test_a_large_frame_crosses_in_chunks_and_only_so(certs: Path) -> None:
    server = _server(certs)
    client = GrpcTransport("act", {"pas": server.address}, credentials=PartyCredentials.load(certs, "act"),
                           deadline=WAIT * 3, retries=0)
    act = _channel(certs, "act", server)
    try:
        n = 3 * CHUNK_BYTES // 4 + 1000  # a frame of three chunks and a bit
        reply = client.request(Message("act", "pas", "echo.scale", 1, {"x": np.full(n, 2.0, np.float32)}))
        y = reply.unwrap()["y"]
        assert isinstance(y, np.ndarray) and y.shape == (n,) and np.allclose(y, 6.0)
        # Posted messages over a chunk in all go in one streamed CallMany.
        for r in (2, 3):
            client.post(Message("act", "pas", "echo.scale", r, {"x": np.ones(n // 2, np.float32)}))
        assert np.allclose(client.request(_echo()).unwrap()["y"], 3.0)
        # The server takes no single gRPC message over a chunk: a large frame must be streamed.
        with pytest.raises(grpc.RpcError) as caught:
            act.unary_unary(PATH)(encode(Message("act", "pas", "echo.scale", 1, {"x": np.ones(n, np.float32)})),
                                  timeout=WAIT)
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert server.bounds.held("act") == (0, 0)
    finally:
        client.close()
        act.close()
        server.stop()


def test_the_bounds_are_policy_fields() -> None:
    with pytest.raises(ConfigError, match="policy.max_peer_calls must be an integer of at least 1"):
        Policy(max_peer_calls=0)
    with pytest.raises(ConfigError, match="policy.max_peer_bytes must be an integer of at least 1048576"):
        Policy(max_peer_bytes=1000)
    with pytest.raises(ConfigError, match="policy.max_arrival_seconds must be a positive number"):
        Policy(max_arrival_seconds=0)
