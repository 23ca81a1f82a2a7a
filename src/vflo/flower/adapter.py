"""The ClientApp on every party's SuperNode: each Flower message is handed to the party's worker and back.

Flower starts a fresh ClientApp process for every message it delivers in a deployment (measured with flwr
1.41: as many process IDs as messages), and only ``context.state`` is carried from one message to the next.
A vflo party keeps a model, an optimiser and a handler that may be half-way through an onward exchange, so
its state lives in a long-running worker (``vflo flower party``) and this ClientApp is a stateless adapter
that forwards the message's bytes to it over a local socket named in the SuperNode's node config.

This module imports only grpc and flwr, so a ClientApp process starts in a fraction of a second.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import grpc
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

#: Flower message type (``query.NAME``), the record in every message, and the node-config key for the worker.
QUERY = "vflo"
MESSAGE_TYPE = f"query.{QUERY}"
RECORD = "vflo"
WORKER_KEY = "vflo-worker"
#: The worker's raw-bytes methods: proof of its party, the federation's certificates, a delivery, and the
#: answers to an onward request.
SERVICE = "vflo.FlowerParty"
OPS = ("hello", "peers", "deliver", "resume")
WORKER_DEADLINE = 3600.0
_LIMIT = 2**31 - 1

WorkerOf = Callable[[Context], str]


def call_worker(address: str, op: str, body: bytes, *, timeout: float = WORKER_DEADLINE) -> bytes:
    """One call to the party's worker; only local addresses (``unix:PATH`` or a loopback host) are dialled."""
    if op not in OPS:
        raise ValueError(f"unknown vflo operation {op!r}; expected one of {OPS}")
    options = [("grpc.max_receive_message_length", _LIMIT), ("grpc.max_send_message_length", _LIMIT)]
    with grpc.insecure_channel(address, options=options) as channel:
        out: bytes = channel.unary_unary(f"/{SERVICE}/{op}")(body, timeout=timeout)
        return out


def forward(message: Message, address: str) -> Message:
    """The worker's answer to ``message``, as the reply Flower carries back to the ServerApp."""
    record = message.content[RECORD]
    out = call_worker(address, str(record["op"]), bytes(record["body"]))  # type: ignore[arg-type]  # a Flower record holds loosely typed values; read as the hub wrote them
    return Message(RecordDict({RECORD: ConfigRecord({"body": out, "pid": os.getpid()})}), reply_to=message)


def node_worker(context: Context) -> str:
    """The worker address the SuperNode was started with (``--node-config "vflo-worker='unix:...'"``)."""
    address = context.node_config.get(WORKER_KEY)
    if not isinstance(address, str) or not address:
        raise RuntimeError(f"this SuperNode has no {WORKER_KEY!r} in its node config: start it with "
                           "`vflo flower party PARTY.toml -- flower-supernode ...`, which sets it")
    return address


def make_client_app(worker_of: WorkerOf = node_worker) -> ClientApp:
    """A ClientApp that forwards every vflo message to the worker ``worker_of`` names for its node."""
    app = ClientApp()

    @app.query(QUERY)
    def _query(message: Message, context: Context) -> Message:
        return forward(message, worker_of(context))

    return app


def partition_workers(workers: dict[int, str]) -> WorkerOf:
    """For Flower's simulation runtime, whose node config holds only a partition ID: worker by partition."""

    def worker_of(context: Context) -> str:
        return workers[int(context.node_config["partition-id"])]

    return worker_of


client_app = make_client_app()
