"""Flood benchmark (not a test): a certificate holder floods the lab; how much memory the lab takes, and how long
its coordinator waits for an answer meanwhile. Writes runs/bench/flood.json.

    python -m benchmarks.flood [--frames 8] [--frame-mib 254] [--slow 200] [--hold 30] [--as-peer]

Three processes on 127.0.0.1, each party with its own certificate from one CA:
1. the lab: a PartyServer for its node in a child process (its peer: the coordinator ``act``);
2. the flooder, in another: a certificate holder that is not the lab's peer (with ``--as-peer``: a peer, so that
   its per-peer bounds are what holds it) sending ``--frames`` frames of ``--frame-mib`` MiB at once, each as one
   gRPC message and again streamed in chunks, and ``--slow`` calls that send their headers and then hold their
   message back for ``--hold`` seconds;
3. this process: the coordinator, asking the lab a small question every quarter second while the flood lasts.

It reports the lab's resident memory before the flood and its peak (VmHWM, from /proc), and the coordinator's
answer times (median and slowest). The figures depend on the machine: rerun before and after a change on the same
one.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

MIB = 1 << 20


def _status(pid: int, key: str) -> int:
    """A /proc/PID/status figure in bytes (VmRSS, VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def _lab(certs: str, allowed: list[str], addresses: Any, stop: Event) -> None:
    from vflo.comm.grpc_transport import PartyServer
    from vflo.comm.tls import PartyCredentials
    from vflo.federation.simulation import party_node
    from vflo.roles import PartyInfo

    node = party_node(PartyInfo("lab", "passive"), peers={name: "active" for name in allowed})
    server = PartyServer(node, address="127.0.0.1:0", credentials=PartyCredentials.load(certs, "lab"),
                         allowed=set(allowed)).start()
    addresses.put(server.address)
    stop.wait(3600)
    server.stop(0.5)


def _held_back(hold: float, release: threading.Event, chunks: list[bytes]) -> Iterator[bytes]:
    release.wait(hold)
    yield from chunks


def _flood(certs: str, name: str, address: str, frames: int, frame_bytes: int, slow: int, hold: float,
           results: Any) -> None:
    import grpc

    from vflo.comm import grpc_transport
    from vflo.comm.tls import PartyCredentials

    own = PartyCredentials.load(certs, name)
    credentials = grpc.ssl_channel_credentials(root_certificates=own.ca, private_key=own.key,
                                               certificate_chain=own.certificate)
    channel = grpc.secure_channel(address, credentials, options=[("grpc.ssl_target_name_override", "lab"),
                                                                 ("grpc.max_send_message_length", 1 << 30),
                                                                 ("grpc.max_receive_message_length", 1 << 30)])
    unary, stream = channel.unary_unary(grpc_transport.PATH), channel.stream_unary(grpc_transport.PATH)
    chunk = getattr(grpc_transport, "CHUNK_BYTES", 4 * MIB)
    size_key = getattr(grpc_transport, "SIZE_KEY", "vflo-bytes")
    body = bytes(frame_bytes)
    release = threading.Event()
    timeout = hold + 120
    calls = [unary.future(body, timeout=timeout) for _ in range(frames)]
    pieces = [body[at : at + chunk] for at in range(0, len(body), chunk)]
    calls += [stream.future(iter(pieces), timeout=timeout, metadata=((size_key, str(len(body))),))
              for _ in range(frames)]
    del pieces
    calls += [stream.future(_held_back(hold, release, [b"\0" * 64]), timeout=timeout) for _ in range(slow)]
    outcomes: dict[str, int] = {}
    until = time.monotonic() + timeout
    for call in calls:
        try:
            call.result(timeout=max(until - time.monotonic(), 0.1))
            outcome = "answered"
        except grpc.RpcError as exc:
            outcome = exc.code().name if hasattr(exc, "code") else "error"
        except grpc.FutureTimeoutError:
            outcome = "no answer"
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    release.set()
    results.put(outcomes)
    channel.close()


def run(frames: int, frame_mib: int, slow: int, hold: float, as_peer: bool, window: float) -> dict[str, Any]:
    from vflo.comm.grpc_transport import GrpcTransport
    from vflo.comm.message import Message
    from vflo.comm.tls import PartyCredentials, init_certs

    context = mp.get_context("spawn")  # gRPC does not survive fork
    with tempfile.TemporaryDirectory() as tmp:
        certs = Path(tmp) / "certs"
        init_certs(certs, ["act", "lab", "flooder"])
        stop, addresses, results = context.Event(), context.Queue(), context.Queue()
        allowed = ["act", "flooder"] if as_peer else ["act"]
        lab = context.Process(target=_lab, args=(str(certs), allowed, addresses, stop), daemon=True)
        lab.start()
        address = addresses.get(timeout=120)
        assert lab.pid is not None
        coordinator = GrpcTransport("act", {"lab": address}, credentials=PartyCredentials.load(certs, "act"),
                                    deadline=hold + 180)
        question = Message("act", "lab", "control.teardown", 0)
        for _ in range(20):
            coordinator.request(question)
        idle = _status(lab.pid, "VmRSS")
        flooder = context.Process(target=_flood, args=(str(certs), "flooder", address, frames, frame_mib * MIB, slow,
                                                       hold, results), daemon=True)
        peak = [idle]
        sampling = threading.Event()

        def sample() -> None:  # VmHWM is the figure; the samples show the memory that stays
            while not sampling.wait(0.05):
                peak.append(_status(lab.pid, "VmRSS"))  # type: ignore[arg-type]

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        flooder.start()
        time.sleep(2.0)  # the flood under way: connections made, frames on the wire, slow calls waiting
        answers = []
        t_end = time.monotonic() + window
        while time.monotonic() < t_end or not answers:
            t0 = time.perf_counter()
            reply = coordinator.request(question)
            answers.append(time.perf_counter() - t0)
            assert reply.error is None, reply.error
            time.sleep(0.25)
        outcomes = results.get(timeout=hold + 240)
        flooder.join(30)
        time.sleep(1.0)
        after = _status(lab.pid, "VmRSS")
        hwm = _status(lab.pid, "VmHWM")
        sampling.set()
        sampler.join(5)
        coordinator.close()
        stop.set()
        lab.join(30)
        if lab.is_alive():
            lab.kill()
    return {"frames": frames, "frame_mib": frame_mib, "slow_calls": slow, "hold_s": hold, "flooder_is_peer": as_peer,
            "lab_idle_mb": idle / 1e6, "lab_peak_mb": hwm / 1e6, "lab_after_mb": after / 1e6,
            "coordinator_answer_median_s": statistics.median(answers), "coordinator_answer_max_s": max(answers),
            "coordinator_questions": len(answers), "flood_outcomes": outcomes}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=8, help="large frames, sent at once (each twice: whole and "
                                                              "streamed)")
    parser.add_argument("--frame-mib", type=int, default=254)
    parser.add_argument("--slow", type=int, default=200, help="calls that hold their message back")
    parser.add_argument("--hold", type=float, default=30.0, help="how long a slow call holds its message back (s)")
    parser.add_argument("--window", type=float, default=10.0, help="how long the coordinator keeps asking (s)")
    parser.add_argument("--as-peer", action="store_true", help="the flooder is one of the lab's peers")
    parser.add_argument("--out", type=Path, default=Path("runs/bench/flood.json"))
    args = parser.parse_args(argv)
    figures = run(args.frames, args.frame_mib, args.slow, args.hold, args.as_peer, args.window)
    print(json.dumps(figures, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
