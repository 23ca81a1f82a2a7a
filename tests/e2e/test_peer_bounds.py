"""Bounded by peer, in a real `vflo party serve` process: its config's [policy] bounds reach its server, a
certificate holder that is no peer is refused before its frames are read (the lab's memory stays where it was),
and the coordinator's calls are answered meanwhile."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests.e2e.conftest import spawn, wait_listening, write_party_toml
from vflo.comm.codec import decode, encode
from vflo.comm.grpc_transport import CHUNK_BYTES, PATH, SIZE_KEY, GrpcTransport
from vflo.comm.local_ports import free_port
from vflo.comm.message import Message
from vflo.comm.tls import PartyCredentials, init_certs
from vflo.errors import RemoteError

pytestmark = pytest.mark.slow
WAIT = 20.0


def _rss(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def _channel(certs: Path, name: str, address: str) -> grpc.Channel:
    own = PartyCredentials.load(certs, name)
    credentials = grpc.ssl_channel_credentials(root_certificates=own.ca, private_key=own.key,
                                               certificate_chain=own.certificate)
    return grpc.secure_channel(address, credentials, options=[("grpc.ssl_target_name_override", "lab"),
                                                              ("grpc.max_send_message_length", 1 << 30)])


def _held_back(release: threading.Event, chunks: list[bytes]) -> Iterator[bytes]:
    release.wait(WAIT)
    yield from chunks


def test_a_served_party_keeps_its_bounds_per_peer(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    init_certs(certs, ["act", "lab", "stranger"])
    (tmp_path / "lab.csv").write_text("id,v\n1,0.5\n2,1.5\n")
    address = f"127.0.0.1:{free_port()}"
    config = tmp_path / "lab.toml"
    write_party_toml(config, {"name": "lab", "role": "passive", "listen": address},
                     {"file": str(tmp_path / "lab.csv"), "id_column": "id"}, certs, {"act": ("127.0.0.1:1", "active")})
    with config.open("a") as out:
        out.write("[policy]\nmax_peer_calls = 1\nmax_arrival_seconds = 8.0\n")
    lab = spawn(config)
    release = threading.Event()
    act = _channel(certs, "act", address)
    stranger = _channel(certs, "stranger", address)
    coordinator = GrpcTransport("act", {"lab": address}, credentials=PartyCredentials.load(certs, "act"),
                                deadline=WAIT, retries=0)
    question = Message("act", "lab", "control.teardown", 0)
    try:
        wait_listening({"lab": lab})
        assert coordinator.request(question).error is None
        idle = _rss(lab.pid, "VmRSS")
        # A stranger's large frames (streamed, their size declared) and slow calls: refused unread, at once.
        frame = b"\0" * (16 * CHUNK_BYTES)
        pieces = [frame[at : at + CHUNK_BYTES] for at in range(0, len(frame), CHUNK_BYTES)]
        call = stranger.stream_unary(PATH)
        flood = [call.future(iter(pieces), timeout=WAIT, metadata=((SIZE_KEY, str(len(frame))),)) for _ in range(4)]
        flood += [call.future(_held_back(release, [b"\0" * 64]), timeout=3 * WAIT) for _ in range(40)]
        for future in flood:
            answer = decode(future.result(timeout=WAIT))
            assert answer.error is not None and "not a configured peer" in answer.error.message
        t0 = time.monotonic()
        assert coordinator.request(question).error is None
        assert time.monotonic() - t0 < 2.0
        assert _rss(lab.pid, "VmHWM") < idle + 64 * (1 << 20)  # none of the 256 MiB it was sent was taken in
        # The config's max_peer_calls = 1: while one of act's calls waits for its message, the next is refused.
        # The held call and the coordinator's race to the lab: where the coordinator's arrives first the held one is
        # the call refused, so it is placed again until it is the one in progress (bounded).
        held: grpc.Future | None = None
        until = time.monotonic() + WAIT
        while True:
            if held is None or held.done():
                held = act.stream_unary(PATH).future(_held_back(release, [encode(question)]), timeout=3 * WAIT)
                time.sleep(0.05)
            reply = coordinator.request(question)
            if reply.error is not None or time.monotonic() > until:
                break
            time.sleep(0.05)
        with pytest.raises(RemoteError, match=r"1 of its calls are in progress already \(policy.max_peer_calls\)"):
            reply.unwrap()
        release.set()
        assert held is not None and decode(held.result(timeout=WAIT)).error is None
        assert coordinator.request(question).error is None
    finally:
        release.set()
        coordinator.close()
        act.close()
        stranger.close()
        lab.terminate()
        try:
            lab.wait(timeout=10)
        except Exception:
            lab.kill()
            lab.wait(timeout=5)
