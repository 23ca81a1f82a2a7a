"""A party's long-running worker behind its SuperNode: its node, data and state, reached over a local socket.

``vflo flower party PARTY.toml`` starts one. It loads the party's rows once, holds its node (policy, peers'
roles, model folder, checkpoints) for as long as it runs, and answers the ClientApp adapter's four calls:
``hello`` (which party this is, proved by signing the hub's challenge with its TLS key), ``peers`` (the
other parties' certificates and the coordinator's, each checked against its CA and revocation list),
``deliver`` (frames to handle, every one sealed: see :meth:`PartyWorker.deliver`) and ``resume`` (answers to
the onward request the last delivery returned); see :mod:`vflo.comm.relay` and :mod:`vflo.comm.seal`. It
listens only on a Unix socket or a loopback address: the SuperNode on the same host is its only client, and
the network side is Flower's.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc

from vflo.comm.grpc_transport import pack_frames, unpack_frames
from vflo.comm.hosts import is_loopback
from vflo.comm.relay import FINAL, RelayedParty
from vflo.comm.seal import Keyring, is_sealed
from vflo.comm.serving import error_frame
from vflo.comm.tls import how_to_certify
from vflo.data.partydata import PartyData
from vflo.deploy import PartyConfig, announce, build_node, credentials_for, stop_on_signal
from vflo.errors import AddressInUseError, CodecError, ConfigError, PartyBoundaryError
from vflo.flower.adapter import SERVICE, WORKER_KEY
from vflo.flower.local import stop_process

logger = logging.getLogger(__name__)
_LIMIT = 2**31 - 1


def check_local(address: str) -> str:
    """``address`` if it is a Unix socket or a loopback host:port; a worker must not be reachable from elsewhere."""
    if address.startswith("unix:"):
        return address
    if not is_loopback(address.rsplit(":", 1)[0]):
        raise ConfigError(f"a party's worker listens only locally, for its own SuperNode: got {address!r}; use "
                          "unix:PATH or 127.0.0.1:PORT")
    return address


def keyring_for(config: PartyConfig) -> Keyring | None:
    """The party's keys over Flower, from its ``[tls] dir``: a worker's prove its party, seal what it says to
    other parties and check what the coordinator seals; the coordinator's check those proofs and seal what it
    sends (None with ``insecure = true``, said loudly)."""
    if config.tls.insecure:
        logger.warning("INSECURE: party %s runs over Flower without its TLS keys: frames between parties are not "
                       "sealed and senders are taken at their word. Use this only for experiments.", config.name)
        return None
    if not config.tls.dir:
        raise ConfigError(f"party {config.name!r}: give [tls] dir: over Flower its keys seal what it says to other "
                          "parties and prove who it is (or insecure = true for an experiment). To make them, "
                          f"{how_to_certify(config.name)}")
    credentials = credentials_for(config.name, config.tls)
    assert credentials is not None
    return Keyring(credentials)


def hub_party(config: PartyConfig) -> str:
    """The party the hub speaks for: the one active peer (the coordinator, Flower's ServerApp)."""
    active = [n for n, r in config.peer_roles.items() if r == "active"]
    if config.role == "active" or len(active) != 1:
        raise ConfigError(f"party {config.name!r}: over Flower exactly one peer must have role 'active' (the party "
                          f"whose ServerApp coordinates); its config lists {active or 'none'}")
    return active[0]


def default_address(party: str) -> str:
    """A Unix socket in a folder only this user may enter."""
    folder = Path(tempfile.mkdtemp(prefix=f"vflo-{party}-"))
    folder.chmod(0o700)
    return f"unix:{folder / 'worker.sock'}"


class PartyWorker:
    """Serves one party's node to its SuperNode's ClientApp processes."""

    def __init__(self, config: PartyConfig, *, address: str | None = None, data: PartyData | None = None,
                 serve: PartyData | None = None) -> None:
        address = check_local(address or default_address(config.name))
        self.keyring = keyring_for(config)
        self.config = config
        self.node = build_node(config, data=data, serve=serve)
        self.relay = RelayedParty(self.node, allowed=set(config.peers), hub=hub_party(config), keyring=self.keyring,
                                  max_message_bytes=config.max_message_bytes, deadline=config.deadline)
        self.relay.departures = self.relay.transport.departures = config.departures()
        handler = grpc.method_handlers_generic_handler(SERVICE, {
            "hello": grpc.unary_unary_rpc_method_handler(lambda body, ctx: self.hello(body)),
            "peers": grpc.unary_unary_rpc_method_handler(lambda body, ctx: self.learn_peers(body)),
            "deliver": grpc.unary_unary_rpc_method_handler(lambda body, ctx: self.deliver(body)),
            "resume": grpc.unary_unary_rpc_method_handler(lambda body, ctx: self.relay.resume(body)),
        })
        self._server = grpc.server(ThreadPoolExecutor(max_workers=4), handlers=[handler],
                                   options=[("grpc.max_receive_message_length", _LIMIT),
                                            ("grpc.max_send_message_length", _LIMIT), ("grpc.so_reuseport", 0)])
        try:
            port = self._server.add_insecure_port(address)
        except RuntimeError as exc:
            raise AddressInUseError(f"party {config.name!r}'s worker cannot listen on {address}: {exc}") from exc
        if port == 0:
            raise AddressInUseError(f"party {config.name!r}'s worker cannot listen on {address}: in use or not valid")
        self.address = address if address.startswith("unix:") else f"{address.rsplit(':', 1)[0]}:{port}"

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def contact(self) -> str:
        """Where its SuperNode's ClientApps reach it."""
        return self.address

    def hello(self, challenge: bytes) -> bytes:
        """This party's name, with proof (its certificate and its signature of ``challenge``) when it has TLS."""
        if self.keyring is None:
            return json.dumps({"party": self.name}).encode()
        return self.keyring.prove(challenge)

    def deliver(self, body: bytes) -> bytes:
        """Frames to handle (see :meth:`RelayedParty.deliver <vflo.comm.relay.RelayedParty.deliver>`). With TLS keys
        every one must be sealed: the coordinator seals its own too, so its certificate, and the CA's revocation
        list as it is now, are checked on every frame (:meth:`Keyring.open <vflo.comm.seal.Keyring.open>`), as
        vflo's gRPC server checks its client's on every call. A plain frame could come from a coordinator whose
        certificate was revoked, or that has none: the delivery is refused before any handler runs."""
        if self.keyring is not None:
            try:
                frames = unpack_frames(body, max_bytes=self.relay.max_message_bytes)
            except CodecError:
                frames = []  # the relay answers a malformed body itself
            if any(not is_sealed(f) for f in frames):
                refusal = PartyBoundaryError(
                    f"party {self.name!r} takes only sealed frames over Flower and this one is plain: the "
                    f"coordinator {self.relay.hub!r} seals what it sends with its certificate's key, so this frame "
                    "is not its own (or it runs without its [tls] dir, or with a vflo that does not seal); refused. "
                    "Give the coordinator its [tls] dir, with a certificate the federation's CA has not revoked")
                logger.warning("party %s refused a delivery: %s", self.name, refusal)
                return FINAL + pack_frames([error_frame(self.name, refusal,
                                                        max_bytes=self.relay.max_message_bytes)])
        return self.relay.deliver(body)

    def learn_peers(self, body: bytes) -> bytes:
        """Take the federation's certificates from the hub; each must come from this party's CA, name its party and
        not be revoked, and the coordinator's own must be among them."""
        if self.keyring is None:
            return b"{}"
        try:
            certificates = {str(k): str(v).encode() for k, v in json.loads(body).items()}
            hub = self.relay.hub
            if hub not in certificates:
                raise PartyBoundaryError(f"the hub handed over no certificate of the coordinator {hub!r}, whose frames "
                                         "this party checks against it; refused")
            self.keyring.add_peers({n: pem for n, pem in certificates.items() if n in self.config.peers})
        except (ValueError, AttributeError, PartyBoundaryError) as exc:
            logger.warning("party %s refused the certificates it was handed: %s", self.name, exc)
            return json.dumps({"error": str(exc)}).encode()
        return json.dumps({"peers": sorted(self.keyring.peers)}).encode()

    def start(self) -> PartyWorker:
        self._server.start()
        if self.address.startswith("unix:"):
            Path(self.address[len("unix:"):]).chmod(0o600)
        logger.info("party %s's worker listening on %s", self.name, self.address)
        return self

    def stop(self, grace: float = 1.0) -> None:
        self._server.stop(grace).wait(grace + 1.0)
        self.relay.transport.close()


def supernode_command(args: list[str], address: str) -> list[str]:
    """``flower-supernode ARGS`` with this party's worker in its node config (``args`` start with the program)."""
    if not args:
        return []
    program = args[0]
    if program == "flower-supernode":
        # The one installed beside this Python, where vflo's ClientApp adapter can be imported.
        beside = Path(sys.executable).with_name("flower-supernode")
        program = str(beside) if beside.exists() else (shutil.which(program) or program)
    if any(a == "--node-config" or a.startswith("--node-config=") for a in args):
        raise ConfigError("leave --node-config out of the flower-supernode arguments: vflo sets it to name this "
                          f"party's worker ({WORKER_KEY})")
    return [program, *args[1:], "--node-config", f"{WORKER_KEY}='{address}'"]


def serve_flower(config: PartyConfig, *, address: str | None = None, supernode: list[str] | None = None) -> int:
    """``vflo party serve --transport flower`` (or ``vflo flower party``): this party's worker, and its SuperNode
    when ``supernode`` gives its command line; until SIGINT, SIGTERM or the SuperNode's exit."""
    worker = PartyWorker(config, address=address).start()
    stop = stop_on_signal()
    announce(config, f"worker listening on {worker.address}")
    command = supernode_command(supernode or [], worker.address)
    child = None
    if command:
        # The SuperNode starts Flower's own programs (flower-superexec, flwr-clientapp) from PATH: the ones beside
        # this Python come first, so they can import vflo's ClientApp adapter.
        path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        child = subprocess.Popen(command, env={**os.environ, "PATH": path})
        print(f"party {config.name}: started {Path(command[0]).name} (pid {child.pid})", flush=True)
    else:
        hint = f"--node-config \"{WORKER_KEY}='{worker.address}'\""
        print(f"start this party's SuperNode with: flower-supernode ... {hint}", flush=True)
    code = 0
    try:
        while not stop.wait(0.5):
            if child is not None and child.poll() is not None:
                code = child.returncode or 0
                (logger.error if code else logger.info)("party %s's SuperNode exited with code %s", config.name, code)
                break
    finally:
        if child is not None:
            stop_process(child)
        worker.stop()
    return code
