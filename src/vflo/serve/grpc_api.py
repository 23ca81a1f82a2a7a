"""``vflo serve``'s API over gRPC, beside HTTP/JSON: the same requests and answers (JSON bytes, no generated
stubs to install), the same token or client certificates, answered by the same models and micro-batches.

    /vflo.serve.v1.Predictions/Predict      {"model": NAME, "ids": [...], "features": [...]}  ->  as POST
                                            /v1/models/NAME:predict answers
    /vflo.serve.v1.Predictions/ListModels   {}  ->  as GET /v1/models answers

A client calls them with any gRPC library, e.g. in Python ``channel.unary_unary(PREDICT)(json_bytes,
metadata=[("authorization", "Bearer TOKEN")])``. A refusal is a gRPC status (INVALID_ARGUMENT, NOT_FOUND,
UNAVAILABLE, UNAUTHENTICATED) with the same text as HTTP's.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc

from vflo.errors import AddressInUseError
from vflo.serve.app import Served, ServeError
from vflo.serve.config import ServeSettings
from vflo.serve.guard import Access

logger = logging.getLogger(__name__)

SERVICE = "vflo.serve.v1.Predictions"
PREDICT = f"/{SERVICE}/Predict"
LIST_MODELS = f"/{SERVICE}/ListModels"
#: HTTP statuses of :class:`ServeError` as gRPC codes.
CODES = {404: grpc.StatusCode.NOT_FOUND, 422: grpc.StatusCode.INVALID_ARGUMENT, 503: grpc.StatusCode.UNAVAILABLE}


class PredictionService:
    """The handlers: each call's JSON read, its token checked, its answer awaited on the server's event loop."""

    def __init__(self, served: Served, loop: asyncio.AbstractEventLoop, access: Access, *, timeout: float) -> None:
        self.served, self.loop, self.timeout = served, loop, timeout
        self._token = None if access.token is None else f"Bearer {access.token}"

    def _authorized(self, context: grpc.ServicerContext) -> None:
        if self._token is None:
            return
        given = dict(context.invocation_metadata()).get("authorization", "")
        if not isinstance(given, str) or not hmac.compare_digest(given.encode(), self._token.encode()):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "this call needs the metadata 'authorization: Bearer "
                                                           "TOKEN' with serve.token_file's token")

    def predict(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        self._authorized(context)
        try:
            body = json.loads(request)
            name, ids, features = body["model"], body["ids"], body.get("features")
            if not isinstance(name, str) or not isinstance(ids, list) or not 1 <= len(ids) <= 10_000 or \
                    not all(isinstance(i, int | str) for i in ids) or \
                    (features is not None and (not isinstance(features, list) or len(features) > 10_000)):
                raise ValueError("a request names 'model' (text), 'ids' (1 to 10,000 numbers or texts) and, "
                                 "optionally, 'features' (a list of rows)")
        except (ValueError, KeyError, TypeError) as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"not a prediction request: {exc}")
        done = asyncio.run_coroutine_threadsafe(self.served.answer(name, ids, features), self.loop)
        try:
            answer = done.result(timeout=self.timeout)
        except ServeError as exc:
            context.abort(CODES.get(exc.status, grpc.StatusCode.UNKNOWN), exc.detail)
        except TimeoutError:
            done.cancel()
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, f"not answered within {self.timeout:g} s")
        return json.dumps(answer).encode()

    def list_models(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        self._authorized(context)
        return json.dumps(self.served.listing()).encode()


def start_grpc(served: Served, loop: asyncio.AbstractEventLoop, settings: ServeSettings,
               access: Access) -> Callable[[], None]:
    """The gRPC API listening on ``settings.grpc_listen`` (with the server's TLS and client certificates, where it
    has them), answered on ``loop``; returns what stops it."""
    service = PredictionService(served, loop, access, timeout=60.0)
    identity: Callable[[bytes], bytes] = lambda b: b  # noqa: E731 - the JSON bytes go through as they are
    handlers = grpc.method_handlers_generic_handler(SERVICE, {
        "Predict": grpc.unary_unary_rpc_method_handler(service.predict, identity, identity),
        "ListModels": grpc.unary_unary_rpc_method_handler(service.list_models, identity, identity)})
    server = grpc.server(ThreadPoolExecutor(max_workers=32, thread_name_prefix="vflo-serve-grpc"),
                         handlers=[handlers], maximum_concurrent_rpcs=settings.max_connections,
                         options=[("grpc.max_receive_message_length", settings.max_request_bytes)])
    if settings.certificate is not None:
        assert settings.key is not None
        pair = (Path(settings.key).read_bytes(), Path(settings.certificate).read_bytes())
        mtls = settings.auth == "mtls"
        credentials = grpc.ssl_server_credentials(
            [pair], root_certificates=Path(settings.client_ca).read_bytes() if mtls and settings.client_ca else None,
            require_client_auth=mtls)
        port = server.add_secure_port(settings.grpc_listen, credentials)
    else:
        port = server.add_insecure_port(settings.grpc_listen)
    if port == 0:
        raise AddressInUseError(f"vflo serve's gRPC API cannot listen on {settings.grpc_listen}: the port is taken "
                                "or the address is not this host's; choose another serve.grpc_listen")
    server.start()
    logger.info("vflo serve's gRPC API listening on %s", settings.grpc_listen)

    def stop() -> None:
        server.stop(grace=1.0)

    return stop


def call(channel: grpc.Channel, body: dict[str, Any], *, token: str | None = None, timeout: float = 30.0,
         method: str = PREDICT) -> dict[str, Any]:
    """One call of the API (what a Python client needs): ``body`` sent as JSON, the answer read back."""
    metadata = [("authorization", f"Bearer {token}")] if token else None
    reply = channel.unary_unary(method)(json.dumps(body).encode(), metadata=metadata, timeout=timeout)
    answer: dict[str, Any] = json.loads(reply)
    return answer
